// Drives a running `cairn serve` with the official openai and @anthropic-ai/sdk clients.
// usage: node sdk_check.cjs BASE_URL API_KEY MODEL MODE   (MODE: fake | real)
// fake: exact texts of the scripted fake backend; real: shapes only (a random-weight model
// writes arbitrary text).
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');
const [base, key, model, mode] = process.argv.slice(2);
const fake = mode === 'fake';
const MT = fake ? 64 : 8; // the fake's replies fit in 64 tokens
let pass = 0, fail = 0;
function check(desc, cond, extra) {
  if (cond) pass++;
  else { fail++; console.error('FAIL: ' + desc + (extra !== undefined ? ' ' + JSON.stringify(extra).slice(0, 500) : '')); }
}
const oa = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0 });
const an = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const atools = [{ name: 'get_weather', description: 'weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];

async function main() {
  // OpenAI chat, whole
  const r = await oa.chat.completions.create({ model, messages: [{ role: 'user', content: 'Say hello' }], max_tokens: MT, temperature: 0 });
  check('chat object', r.object === 'chat.completion', r);
  check('chat content string', typeof r.choices[0].message.content === 'string', r);
  if (fake) check('chat text', r.choices[0].message.content === 'Hello from the fake model!', r);
  check('chat usage', r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0 &&
        r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, r.usage);
  check('chat cached tokens field', typeof r.usage.prompt_tokens_details.cached_tokens === 'number', r.usage);
  check('chat finish', ['stop', 'length'].includes(r.choices[0].finish_reason), r);

  // OpenAI chat, streamed, with usage
  const s = await oa.chat.completions.create({ model, messages: [{ role: 'user', content: 'Say hello' }], max_tokens: MT, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null, n = 0, role = null;
  for await (const c of s) {
    n++;
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    if (c.choices[0].delta.role) role = c.choices[0].delta.role;
    text += c.choices[0].delta.content || '';
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  check('stream role', role === 'assistant');
  check('stream chunks', n >= 3, n);
  if (fake) check('stream text', text === 'Hello from the fake model!', text);
  else check('stream text = whole text (greedy)', text === r.choices[0].message.content, [text, r.choices[0].message.content]);
  check('stream usage', usage && usage.completion_tokens > 0, usage);
  check('stream finish', finish === 'stop' || finish === 'length', finish);

  // tools
  if (fake) {
    const t = await oa.chat.completions.create({ model, messages: [{ role: 'user', content: 'weather in Paris?' }], tools });
    const m = t.choices[0].message;
    check('tool finish', t.choices[0].finish_reason === 'tool_calls', t);
    check('tool call', m.tool_calls && m.tool_calls[0].function.name === 'get_weather' &&
          JSON.parse(m.tool_calls[0].function.arguments).city === 'Paris', m);
    check('reasoning_content', m.reasoning_content === 'plan', m);
    check('no markup in content', m.content === null, m);
    // stream helper assembles tool calls from deltas
    const st = oa.chat.completions.stream({ model, messages: [{ role: 'user', content: 'weather in Paris?' }], tools });
    const fin = await st.finalChatCompletion();
    const fm = fin.choices[0].message;
    check('stream tool call', fm.tool_calls && fm.tool_calls[0].function.name === 'get_weather', fm);
    // the tool result goes back through the template
    const t2 = await oa.chat.completions.create({ model, tools, messages: [
      { role: 'user', content: 'weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: m.tool_calls },
      { role: 'tool', tool_call_id: m.tool_calls[0].id, content: 'sunny, 21C' }] });
    check('after tool result', t2.choices[0].message.content === 'It is sunny in Paris.', t2.choices[0].message);
  } else {
    const t = await oa.chat.completions.create({ model, messages: [{ role: 'user', content: 'weather in Paris?' }], tools, max_tokens: MT });
    check('tools accepted', t.choices.length === 1, t);
  }

  // legacy completions
  const c = await oa.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  check('completions text', typeof c.choices[0].text === 'string' && c.usage.completion_tokens > 0, c);

  // Responses API
  const rr = await oa.responses.create({ model, input: 'Say hello', max_output_tokens: MT, instructions: 'be brief' });
  check('responses status', rr.status === 'completed' || rr.status === 'incomplete', rr);
  if (fake) check('responses output_text', rr.output_text === 'Hello from the fake model!', rr.output_text);
  check('responses usage', rr.usage && rr.usage.output_tokens > 0, rr.usage);
  const rs = await oa.responses.create({ model, input: 'Say hello', max_output_tokens: MT, stream: true });
  let rtext = '', types = [];
  for await (const e of rs) {
    types.push(e.type);
    if (e.type === 'response.output_text.delta') rtext += e.delta;
  }
  check('responses stream created first', types[0] === 'response.created', types);
  check('responses stream end', ['response.completed', 'response.incomplete'].includes(types[types.length - 1]), types);
  if (fake) check('responses stream text', rtext === 'Hello from the fake model!', rtext);
  if (fake) {
    const rf = await oa.responses.create({ model, input: 'weather in Paris?', tools: [{ type: 'function', name: 'get_weather',
      parameters: atools[0].input_schema }] });
    const fc = rf.output.find((o) => o.type === 'function_call');
    check('responses function_call', fc && fc.name === 'get_weather' && JSON.parse(fc.arguments).city === 'Paris', rf.output);
  }

  // OpenAI errors
  try { await oa.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }); check('404 thrown', false); }
  catch (e) { check('404 NotFoundError', e instanceof OpenAI.NotFoundError && e.status === 404, e.message); }
  try { await oa.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }); check('400 thrown', false); }
  catch (e) { check('400 BadRequestError', e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature', [e.message, e.param]); }
  try { await new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong', maxRetries: 0 }).models.list(); check('401 thrown', false); }
  catch (e) { check('401 AuthenticationError', e instanceof OpenAI.AuthenticationError && e.status === 401, e.message); }
  const models = await oa.models.list();
  check('models.list', models.data.some((m) => m.id === model), models.data);

  // Anthropic messages, whole
  const m1 = await an.messages.create({ model, max_tokens: MT, messages: [{ role: 'user', content: 'Say hello' }] });
  check('anthropic type', m1.type === 'message' && m1.role === 'assistant', m1);
  check('anthropic text block', m1.content[0] && m1.content[0].type === 'text', m1.content);
  if (fake) check('anthropic text', m1.content[0].text === 'Hello from the fake model!', m1.content);
  check('anthropic stop_reason', ['end_turn', 'max_tokens'].includes(m1.stop_reason), m1.stop_reason);
  check('anthropic usage', m1.usage.input_tokens >= 0 && m1.usage.output_tokens > 0 && typeof m1.usage.cache_read_input_tokens === 'number', m1.usage);
  // streamed
  const ms = an.messages.stream({ model, max_tokens: MT, messages: [{ role: 'user', content: 'Say hello' }] });
  let atext = '';
  ms.on('text', (t) => { atext += t; });
  const mf = await ms.finalMessage();
  if (fake) check('anthropic stream text', atext === 'Hello from the fake model!', atext);
  check('anthropic stream final', mf.content.length >= 1 && mf.usage.output_tokens > 0, mf);
  if (fake) {
    const mt = await an.messages.stream({ model, max_tokens: 200, tools: atools, thinking: { type: 'enabled', budget_tokens: 100 },
      messages: [{ role: 'user', content: 'weather in Paris?' }] }).finalMessage();
    const tu = mt.content.find((b) => b.type === 'tool_use');
    check('anthropic tool_use', tu && tu.name === 'get_weather' && tu.input.city === 'Paris', mt.content);
    check('anthropic thinking block', mt.content[0].type === 'thinking' && mt.content[0].thinking === 'plan', mt.content);
    check('anthropic stop tool_use', mt.stop_reason === 'tool_use', mt.stop_reason);
    const m2 = await an.messages.create({ model, max_tokens: 50, tools: atools, messages: [
      { role: 'user', content: 'weather in Paris?' },
      { role: 'assistant', content: mt.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'sunny, 21C' }] }] });
    check('anthropic after tool_result', m2.content[0].text === 'It is sunny in Paris.', m2.content);
  }
  const ct = await an.messages.countTokens({ model, messages: [{ role: 'user', content: 'Say hello' }] });
  check('count_tokens', ct.input_tokens > 0, ct);
  try { await an.messages.create({ model: 'no-such-model', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }); check('a404 thrown', false); }
  catch (e) { check('anthropic NotFoundError', e instanceof Anthropic.NotFoundError && e.status === 404, e.message); }
  try { await an.messages.create({ model, max_tokens: 'x', messages: [{ role: 'user', content: 'x' }] }); check('a400 thrown', false); }
  catch (e) { check('anthropic BadRequestError', e instanceof Anthropic.BadRequestError && e.status === 400, e.message); }

  console.log(`sdk_check ${mode}: ${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}
main().catch((e) => { console.error('FAIL: exception', e); process.exit(1); });
