// Soak client (tests/reliability/soak.sh runs it): STREAMS concurrent loops against one cairn
// serve for SECONDS, each request drawn from a fixed mix: good streaming and whole requests
// (greedy, checked against the reference answer of their prompt), streams cut by the client
// after the first bytes, and malformed requests (bad JSON, wrong types, a body over the server's
// limit) that must get their 400 / 413. Prints one JSON line of counts; exit 1 when a good
// request failed or a malformed one got anything but its error.
//   node soak_client.mjs BASE_URL SECONDS STREAMS HUGE_BYTES
const [base, secs, streams, hugeBytes] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5]];
const prompts = ['What is the capital of Japan?', 'What is 12 + 44?', 'Say hello.', 'What is the capital of France?',
                 'Name a colour.', 'What is 7 + 5?', 'Tell me a fact about the sea.', 'What day comes after Monday?'];
const req = (content, extra) => JSON.stringify({model: 'demo', temperature: 0, max_tokens: 20,
                                                messages: [{role: 'user', content}], ...extra});
const post = (body, signal) => fetch(`${base}/v1/chat/completions`, {method: 'POST', body, signal,
                                     headers: {'Content-Type': 'application/json'}});
const counts = {good: 0, good_failed: 0, stream: 0, whole: 0, cut: 0, bad_json: 0, wrong_type: 0, huge: 0,
                malformed_wrong_answer: 0, statuses: {}};
const failures = [];
const note = (what) => { if (failures.length < 20) failures.push(what); };

async function streamText(res) {
  const dec = new TextDecoder();
  let buf = '', text = '', done = false;
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, {stream: true});
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const d = line.slice(6);
        if (d === '[DONE]') { done = true; continue; }
        const o = JSON.parse(d);
        if (o.error) throw new Error('stream error: ' + JSON.stringify(o.error));
        text += o.choices?.[0]?.delta?.content ?? '';
      }
    }
  }
  if (!done) throw new Error('stream ended without [DONE]');
  return text;
}

const ref = [];
for (const p of prompts) {
  const r = await post(req(p));
  const o = await r.json();
  if (r.status !== 200) { console.log(JSON.stringify({error: 'reference failed', status: r.status, o})); process.exit(1); }
  ref.push(o.choices[0].message.content);
}

async function good(k, stream) {
  counts.good++;
  counts[stream ? 'stream' : 'whole']++;
  try {
    const r = await post(req(prompts[k], stream ? {stream: true} : {}));
    if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
    const text = stream ? await streamText(r) : (await r.json()).choices[0].message.content;
    if (text !== ref[k]) throw new Error(`prompt ${k}: [${text}] != reference [${ref[k]}]`);
  } catch (e) {
    counts.good_failed++;
    note(String(e.message || e));
  }
}

async function cut(k) {
  counts.cut++;
  const ac = new AbortController();
  try {
    const r = await post(req(prompts[k], {stream: true, max_tokens: 200}), ac.signal);
    const it = r.body[Symbol.asyncIterator]();
    await it.next(); // the first bytes, then the client goes away mid-stream
    ac.abort();
  } catch (e) { if (e.name !== 'AbortError') note('cut: ' + e.message); }
}

async function malformed(kind, body, want) {
  counts[kind]++;
  try {
    const r = await post(body);
    const t = await r.text();
    counts.statuses[r.status] = (counts.statuses[r.status] || 0) + 1;
    if (r.status !== want) { counts.malformed_wrong_answer++; note(`${kind}: status ${r.status} (want ${want}): ${t.slice(0, 200)}`); }
  } catch (e) {
    // the server may close a connection whose body is over the limit before reading it all
    if (kind === 'huge') counts.statuses.closed = (counts.statuses.closed || 0) + 1;
    else { counts.malformed_wrong_answer++; note(`${kind}: ${e.message}`); }
  }
}

const huge = req('x'.repeat(hugeBytes));
const wrong = [req('hi', {temperature: 'hot'}), JSON.stringify({model: 'demo', messages: 'hi'}),
               req('hi', {max_tokens: -5}), JSON.stringify({model: 7, messages: [{role: 'user', content: 'x'}]}),
               req('hi', {stop: [1, 2]})];
const deadline = Date.now() + secs * 1000;
let n = 0;
async function loop(id) {
  while (Date.now() < deadline) {
    const i = n++, k = i % prompts.length, roll = (i * 37 + id) % 20;
    if (roll < 11) await good(k, true);
    else if (roll < 13) await good(k, false);
    else if (roll < 15) await cut(k);
    else if (roll < 16) await malformed('bad_json', '{"model": "demo", "messages": [', 400);
    else if (roll < 19) await malformed('wrong_type', wrong[i % wrong.length], 400);
    else await malformed('huge', huge, 413);
  }
}
await Promise.all(Array.from({length: streams}, (_, id) => loop(id)));
console.log(JSON.stringify({...counts, failures}));
process.exit(counts.good_failed || counts.malformed_wrong_answer ? 1 : 0);
