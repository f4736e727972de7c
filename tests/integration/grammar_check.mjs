// Constrained decoding through a running `cairn serve` (random-weight models, real tokenizers),
// checked by ajv (JSON Schema) and the official openai / @anthropic-ai/sdk clients.
// usage: node grammar_check.mjs BASE_URL API_KEY NODE_MODULES SCHEMAS_JSON MODEL[:STRIDE][,...]
// For each model, every STRIDE-th schema (default 1: all) of SCHEMAS_JSON is asked for with
// response_format json_schema,
// cycling greedy / sampled and whole / streamed; the content must parse and validate. Then
// forced tool calls (OpenAI required + named, Anthropic any + tool, streamed and not), Responses
// text.format, the cairn regex / GBNF extension, and 400s for unsupported keywords.
import { createRequire } from 'module';
import { readFileSync } from 'fs';
import path from 'path';

const [base, key, nm, schemasPath, modelsCsv] = process.argv.slice(2);
const require = createRequire(path.resolve(nm) + '/');
const Ajv = require('ajv').default;
const addFormats = require('ajv-formats');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

const ajv = new Ajv({ strict: false, allErrors: false });
(addFormats.default || addFormats)(ajv);
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
function validates(desc, schema, text) {
  let v;
  try { v = JSON.parse(text); } catch (e) { check(desc + ': parses', false, text); return; }
  const ok = ajv.validate(schema, v);
  check(desc + ': validates', ok, { text, errors: ajv.errors });
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
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }] });
  const tc = r.choices[0].message.tool_calls;
  check(model + ' required: a tool call', tc && tc.length === 1 && r.choices[0].finish_reason === 'tool_calls', r.choices[0]);
  if (tc && tc.length) validates(model + ' required: arguments', toolSchema[tc[0].function.name], tc[0].function.arguments);
  // OpenAI: named, streamed, sampled
  const s = await oa.chat.completions.create({ model, max_tokens: MAX, temperature: 1, seed: 7, stream: true, tools,
    tool_choice: { type: 'function', function: { name: 'search' } }, messages: [{ role: 'user', content: 'Find cats.' }] });
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
  const m = await an.messages.create({ model, max_tokens: MAX, temperature: 1, tools: atools, tool_choice: { type: 'any' },
    messages: [{ role: 'user', content: 'Weather in Oslo?' }] });
  const tu = m.content.filter(b => b.type === 'tool_use');
  check(model + ' anthropic any: tool_use', tu.length === 1 && m.stop_reason === 'tool_use', m);
  if (tu.length) check(model + ' anthropic any: input validates', ajv.validate(toolSchema[tu[0].name], tu[0].input), { input: tu[0].input, errors: ajv.errors });
  // Anthropic: named tool, streamed, greedy
  const ms = await an.messages.create({ model, max_tokens: MAX, temperature: 0, stream: true, tools: atools,
    tool_choice: { type: 'tool', name: 'get_weather' }, messages: [{ role: 'user', content: 'Weather?' }] });
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
  try {
    await an.messages.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'x' }],
      tools: [{ name: 't', input_schema: { type: 'object', properties: { a: { type: 'string', contentEncoding: 'base64' } } } }],
      tool_choice: { type: 'any' } });
    check(model + ' anthropic 400', false);
  } catch (e) {
    check(model + ' anthropic 400', e.status === 400 && /contentEncoding/.test(e.message) && e.error?.error?.type === 'invalid_request_error', e.message);
  }
}

async function main() {
  for (const spec of models) {
    const [model, strideText] = spec.split(':');
    const stride = Number(strideText || 1);
    const jobs = schemas.map((s, i) => async () => {
      if (i % stride) return;
      const mode = i % 4;
      const { text, finish } = await chatContent(model, s.schema, mode, i);
      const desc = `${model} ${s.name} (${mode & 1 ? 'sampled' : 'greedy'}, ${mode & 2 ? 'stream' : 'whole'})`;
      if (s.unbounded && finish === 'length') { check(desc + ': cut output is a JSON prefix', jsonPrefixOk(text), text); return; }
      check(desc + ': finished', finish === 'stop', finish);
      validates(desc, s.schema, text);
    });
    await pool(jobs, 8);
    await toolChecks(model);
    await otherChecks(model);
  }
  console.log(`grammar_check: ${pass} passed, ${fail} failed`);
  process.exit(fail || pass === 0 ? 1 : 0);
}
main().catch(e => { console.error(e); process.exit(1); });
