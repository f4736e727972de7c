#!/usr/bin/env python3
"""The official OpenAI (and, when installed, Anthropic) Python SDKs against a running cairn
server, for machines without Node.js (the GPU machine): a greedy chat completion twice (the
same text, usage counted), the same request streamed (its text equal to the non-streamed one),
and a Responses call; an Anthropic message when the anthropic package is there.
usage: sdk_check.py BASE_URL API_KEY MODEL   (exit 0 ok, 1 a failure, 77 no openai package)"""
import sys

try:
    import openai
except ImportError:
    print("sdk_check.py: SKIPPED (no openai package)")
    sys.exit(77)

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
fails = 0


def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += 0 if ok else 1


c = openai.OpenAI(base_url=base + "/v1", api_key=key)
msgs = [{"role": "user", "content": "Tell me about the sea."}]
r1 = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=16)
r2 = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=16)
t1 = r1.choices[0].message.content or ""
check(len(t1) > 0 and r1.usage.completion_tokens == 16, f"openai chat: {r1.usage.completion_tokens} tokens")
check(t1 == (r2.choices[0].message.content or ""), "openai chat: greedy repeatable")
parts = []
for ev in c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=16, stream=True):
    if ev.choices and ev.choices[0].delta.content:
        parts.append(ev.choices[0].delta.content)
check("".join(parts) == t1, "openai chat stream: same text as non-streamed")
resp = c.responses.create(model=model, input="Tell me about the sea.", temperature=0, max_output_tokens=16)
check(len(resp.output_text) > 0, "openai responses: text")
try:
    import anthropic
    a = anthropic.Anthropic(base_url=base, api_key=key)
    m = a.messages.create(model=model, max_tokens=16, temperature=0, messages=msgs)
    check(m.usage.output_tokens == 16 and len(m.content[0].text) > 0, "anthropic messages")
except ImportError:
    print("anthropic: SKIPPED (no anthropic package)")
print(f"sdk_check.py: openai {openai.__version__}, {fails} failed")
sys.exit(1 if fails else 0)
