#!/usr/bin/env python3
"""Dev-only differential check (needs jinja2; not run by ctest): renders random conversations
through `cairn render-template` and through jinja2 configured as transformers does, for the
real templates in tokenizers/ and the realistic ones in gen_lang_cases.py, and reports any
difference (output bytes, or one failing and the other not).
usage: diff_conversations.py CAIRN_BIN [N_CONVERSATIONS] [SEED]"""
import copy, json, os, random, subprocess, sys, tempfile
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = os.path.dirname(os.path.abspath(__file__))
cairn = sys.argv[1]
n_conv = int(sys.argv[2]) if len(sys.argv) > 2 else 50
rnd = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(m):
    raise jinja2.exceptions.TemplateError(m)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

g = {}
src = open(os.path.join(here, "gen_lang_cases.py")).read()
exec(compile(src.split("\nout = []")[0], "gen_lang_cases.py", "exec"), g)
templates = dict(g["TEMPLATES"])
for name in sorted(os.listdir(os.path.join(here, "tokenizers"))):
    cfg = json.load(open(os.path.join(here, "tokenizers", name, "tokenizer_config.json")))
    if isinstance(cfg.get("chat_template"), str):
        templates[name] = cfg["chat_template"]

texts = ["Hi", "", " padded \n", "multi\nline\n\n", "<think>\nreason\n</think>\n\nanswer", 'é😀 "q" \\ \t',
         "</think>x", "<tool_response>r</tool_response>", '{"a": 1}', "a" * 50]
tools = [{"type": "function", "function": {"name": "get", "description": "G", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}}]

def msg(role):
    m = {"role": role, "content": rnd.choice(texts + ([None] if role == "assistant" else []))}
    if role == "assistant" and rnd.random() < 0.4:
        m["tool_calls"] = [{"type": "function", "function": {"name": rnd.choice(["get", "search"]),
                            "arguments": rnd.choice([{"q": "x", "n": 2}, '{"q": "y"}', {}])}}
                           for _ in range(rnd.randint(1, 2))]
    if role == "assistant" and rnd.random() < 0.3:
        m["reasoning_content"] = rnd.choice(["think", ""])
    if role == "tool" and rnd.random() < 0.5:
        m["name"] = "get"
    return m

bad = total = errors = 0
with tempfile.TemporaryDirectory() as tmp:
    dirs = {}
    for name, text in templates.items():
        d = os.path.join(tmp, name)
        os.mkdir(d)
        with open(os.path.join(d, "chat_template.jinja"), "w") as f:
            f.write(text)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)
        dirs[name] = d
    for _ in range(n_conv):
        roles = (["system"] if rnd.random() < 0.5 else []) + [
            rnd.choice(["user", "assistant", "user", "assistant", "tool"]) for _ in range(rnd.randint(0, 6))]
        msgs = [msg(r) for r in roles]
        req = {"messages": msgs, "tools": tools if rnd.random() < 0.5 else None,
               "add_generation_prompt": rnd.random() < 0.5, "kwargs": {}}
        if rnd.random() < 0.3:
            req["kwargs"]["enable_thinking"] = rnd.random() < 0.5
        ctx = {"messages": msgs, "tools": req["tools"], "documents": None,
               "add_generation_prompt": req["add_generation_prompt"], "bos_token": "<s>", "eos_token": "</s>",
               **req["kwargs"]}
        for name, text in templates.items():
            total += 1
            try:
                exp, eerr = env.from_string(text).render(**copy.deepcopy(ctx)), None
            except Exception as e:
                exp, eerr = None, "%s: %s" % (type(e).__name__, e)
                errors += 1
            p = subprocess.run([cairn, "render-template", dirs[name]], input=json.dumps(req).encode(),
                               capture_output=True)
            same = (p.returncode == 0 and exp is not None and p.stdout == exp.encode()) or \
                   (p.returncode == 3 and exp is None)
            if not same:
                bad += 1
                if bad <= 5:
                    print("DIFF", name, json.dumps(req)[:300], "\n  jinja2:", repr(exp)[:300], eerr,
                          "\n  cairn: ", p.returncode, p.stdout[:300], p.stderr[:200])
print("diff_conversations: %d differences in %d renders (%d jinja2 errors)" % (bad, total, errors))
sys.exit(1 if bad else 0)
