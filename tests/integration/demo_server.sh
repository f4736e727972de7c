#!/usr/bin/env bash
# The bundled demo model through `cairn serve`, as `make run` starts it: it answers a question
# it was trained on, follows generation_config.json (do_sample false: greedy when the request
# gives no temperature), calls an offered tool as an OpenAI tool_calls entry (also a tool whose
# name and argument it never saw in training), answers from a tool result, and reuses the cached
# prefix of a resent long prompt.
set -uo pipefail
. "$(dirname "$0")/lib/serve_lib.sh"
model=$CAIRN_SRC/models/demo
start_server demo --model "$model" --threads 2
base="http://127.0.0.1:$PORT_demo"

chat() { # chat JSON-BODY -> response body
    curl -s --max-time 120 "$base/v1/chat/completions" -H 'Content-Type: application/json' -d "$1"
}
field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const o=JSON.parse(d);const f=new Function("o","return "+process.argv[1]);const v=f(o);process.stdout.write(typeof v==="string"?v:JSON.stringify(v))})' "$1"; }

q='{"model":"demo","messages":[{"role":"user","content":"What is the capital of Japan?"}]}'
a1=$(chat "$q" | field 'o.choices[0].message.content')
a2=$(chat "$q" | field 'o.choices[0].message.content')
a0=$(chat '{"model":"demo","temperature":0,"messages":[{"role":"user","content":"What is the capital of Japan?"}]}' | field 'o.choices[0].message.content')
check_has "answer" "$a1" "Tokyo"
check_eq "generation_config do_sample=false makes the default greedy" "$a1" "$a2"
check_eq "default equals temperature 0" "$a1" "$a0"
a=$(chat '{"model":"demo","messages":[{"role":"user","content":"What is 12 + 44?"}]}' | field 'o.choices[0].message.content')
check_has "arithmetic" "$a" "= 56."

tools='[{"type":"function","function":{"name":"get_weather","description":"Get the current weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
r=$(chat "{\"model\":\"demo\",\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"What's the weather in Paris?\"}]}")
check_eq "tool call finish_reason" "$(echo "$r" | field 'o.choices[0].finish_reason')" "tool_calls"
check_eq "tool call name" "$(echo "$r" | field 'o.choices[0].message.tool_calls[0].function.name')" "get_weather"
check_eq "tool call arguments" "$(echo "$r" | field 'JSON.parse(o.choices[0].message.tool_calls[0].function.arguments).city')" "Paris"
check_eq "no markup leaks into content" "$(echo "$r" | field 'String(o.choices[0].message.content).includes("tool_call")')" "false"

# A tool named and shaped unlike any in training: the call copies the offered name and argument.
other='[{"type":"function","function":{"name":"lookup_weather","description":"Weather for a place","parameters":{"type":"object","properties":{"location":{"type":"string","description":"City name"}},"required":["location"]}}}]'
r=$(chat "{\"model\":\"demo\",\"tools\":$other,\"messages\":[{\"role\":\"user\",\"content\":\"Is it raining in Rome?\"}]}")
check_eq "unseen tool: name" "$(echo "$r" | field 'o.choices[0].message.tool_calls[0].function.name')" "lookup_weather"
check_eq "unseen tool: argument" "$(echo "$r" | field 'JSON.parse(o.choices[0].message.tool_calls[0].function.arguments).location')" "Rome"

# The tool's result comes back in a tool message; the answer uses it.
res='{\"city\": \"Tokyo\", \"temperature_c\": 17, \"condition\": \"rainy\"}'
r=$(chat "{\"model\":\"demo\",\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"What's the weather in Tokyo?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Tokyo\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"$res\"}]}")
a=$(echo "$r" | field 'o.choices[0].message.content')
check_has "answer from the tool result: condition" "$a" "rainy"
check_has "answer from the tool result: temperature" "$a" "17 degrees"

# A long system prompt spans several KV blocks; the resend reuses them.
sys=$(printf 'You are a helpful assistant for a small town library. %.0s' $(seq 1 20))
body="{\"model\":\"demo\",\"max_tokens\":8,\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"Who are you?\"}]}"
chat "$body" >/dev/null
r=$(chat "$body")
pt=$(echo "$r" | field 'o.usage.prompt_tokens')
ct=$(echo "$r" | field 'o.usage.prompt_tokens_details.cached_tokens')
check "resend is served from the prefix cache (cached $ct of $pt, block 64)" test "$ct" -ge $((pt - 64)) -a "$ct" -gt 0

stop_server demo
finish demo_server
