#!/usr/bin/env bash
# logit_bias over HTTP on the bundled demo model (issue 19, bug 1: the bias pointed into the
# request parsed on the HTTP thread's stack, read later by engine_submit on the API worker).
# ASan's stack-use-after-return detection is on, so a dangling bias fails the server at once.
# The token ids come from `cairn tokenize` on the model's own tokenizer, the unbiased answer from
# the same server: a +100 bias makes greedy decoding repeat that token, a -100 bias on the first
# token of the unbiased answer makes the answer start differently.
set -u
cd "${CAIRN_SRC:-.}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_stack_use_after_return=1"
source tests/integration/lib/serve_lib.sh
model=$CAIRN_SRC/models/demo
start_server lb --model "$model" --threads 2
base="http://127.0.0.1:$PORT_lb"
field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const o=JSON.parse(d);const f=new Function("o","return "+process.argv[1]);const v=f(o);process.stdout.write(typeof v==="string"?v:JSON.stringify(v))})' "$1"; }
ids() { printf '{"text":"%s","add_special_tokens":false}\n' "$1" | "$CAIRN_BIN" tokenize "$model" | field 'o.ids.join(",")'; }

tok=$(ids " Tokyo")
check "' Tokyo' is one token" test -n "$tok" -a "${tok/,/}" = "$tok"
q='"messages":[{"role":"user","content":"Name a fruit."}]'
r=$(curl -s --max-time 120 "$base/v1/chat/completions" -d "{\"model\":\"demo\",\"temperature\":0,\"max_tokens\":3,\"logit_bias\":{\"$tok\":100},$q}")
check_eq "+100 bias: greedy repeats the token" "$(echo "$r" | field 'o.choices[0].message.content')" " Tokyo Tokyo Tokyo"
r=$(curl -s -N --max-time 120 "$base/v1/chat/completions" -d "{\"model\":\"demo\",\"stream\":true,\"temperature\":0,\"max_tokens\":3,\"logit_bias\":{\"$tok\":100},$q}")
check_has "+100 bias, streamed" "$(echo "$r" | grep -o '"content":"[^"]*"' | tr -d '\n')" '"content":" Tokyo""content":" Tokyo""content":" Tokyo"'

plain=$(curl -s --max-time 120 "$base/v1/completions" -d '{"model":"demo","temperature":0,"max_tokens":4,"prompt":"The capital of Japan is","logprobs":1}')
first=$(echo "$plain" | field 'o.choices[0].logprobs.tokens[0]')
first_id=$(ids "$first")
check "unbiased answer has a first token" test -n "$first_id" -a "${first_id/,/}" = "$first_id"
biased=$(curl -s --max-time 120 "$base/v1/completions" -d "{\"model\":\"demo\",\"temperature\":0,\"max_tokens\":4,\"prompt\":\"The capital of Japan is\",\"logprobs\":1,\"logit_bias\":{\"$first_id\":-100}}")
b_first=$(echo "$biased" | field 'o.choices[0].logprobs.tokens[0]')
check "-100 bias: the banned first token [$first] is not chosen (got [$b_first])" test "$b_first" != "$first"

stop_server lb
finish logit_bias
