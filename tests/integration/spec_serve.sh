#!/usr/bin/env bash
# Speculative decoding through `cairn serve --speculative ngram` on the demo model: greedy text
# with prompt lookup equals the text of the same request with the per-request extension
# "speculative": "off" (chat and completions), and of a server with speculation off; drafts were
# made and some accepted (/api/status, /metrics, the request's usage.cairn_speculative); a bad
# flag or field is refused, and so is --speculative mtp on a model without an MTP head. The
# demo model's own MTP head (dense qwen3): greedy text with --speculative mtp equals it off, on
# copy-and-edit prompts where its drafts are accepted and rejected.
set -uo pipefail
. "$(dirname "$0")/lib/serve_lib.sh"
model=$CAIRN_SRC/models/demo

out=$("$CAIRN_BIN" serve --model "$model" --speculative eagle 2>&1)
check_eq "bad --speculative exits 2" "$?" "2"
check_has "bad --speculative says why" "$out" "off, ngram, mtp or auto"
# without its MTP head (config.json not asking for one; the weights stay): refused at load
nohead=$(mktemp -d)
for f in "$model"/*; do ln -s "$f" "$nohead/"; done
rm "$nohead/config.json"
grep -v num_nextn_predict_layers "$model/config.json" > "$nohead/config.json"
out=$("$CAIRN_BIN" serve --model "$nohead" --speculative mtp --preload --port 0 2>&1)
check "--speculative mtp without a head fails" [ "$?" -ne 0 ]
check_has "--speculative mtp without a head says why" "$out" "needs a model with an MTP head (mtp.* weights)"
rm -rf "$nohead"

# a fixed step cost: which steps draft must not depend on how loaded the machine is
start_server spec --model "$model" --threads 2 --speculative ngram --spec-cost-slope 0.05
start_server plain --model "$model" --threads 2
field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const o=JSON.parse(d);const f=new Function("o","return "+process.argv[1]);const v=f(o);process.stdout.write(typeof v==="string"?v:JSON.stringify(v))})' "$1"; }
post() { # post PORT PATH JSON-BODY
    curl -s --max-time 300 "http://127.0.0.1:$1$2" -H 'Content-Type: application/json' -d "$3"
}
# templated stories re-use their phrases: prompt lookup finds them
for subject in "a brave knight" "a cat named Luna"; do
    q="{\"model\":\"demo\",\"temperature\":0,\"max_tokens\":120,\"messages\":[{\"role\":\"user\",\"content\":\"Write a long story about $subject.\"}]"
    on=$(post "$PORT_spec" /v1/chat/completions "$q}" | field 'o.choices[0].message.content')
    off=$(post "$PORT_spec" /v1/chat/completions "$q,\"speculative\":\"off\"}" | field 'o.choices[0].message.content')
    ref=$(post "$PORT_plain" /v1/chat/completions "$q}" | field 'o.choices[0].message.content')
    check "story about $subject is long" [ ${#ref} -gt 200 ]
    check_eq "chat, $subject: speculation on = per-request off" "$on" "$off"
    check_eq "chat, $subject: speculation on = server without it" "$on" "$ref"
done
q='{"model":"demo","temperature":0,"max_tokens":60,"prompt":"Once upon a time, there was a brave knight who lived in a noisy city. Once upon a time, there was a brave"'
full=$(post "$PORT_spec" /v1/completions "$q}")
on=$(echo "$full" | field 'o.choices[0].text')
ref=$(post "$PORT_plain" /v1/completions "$q}" | field 'o.choices[0].text')
check_eq "completions: speculation on = off" "$on" "$ref"
# usage extension: the request's own drafted / accepted counts
u_d=$(echo "$full" | field 'o.usage.cairn_speculative.drafted')
u_a=$(echo "$full" | field 'o.usage.cairn_speculative.accepted')
check "usage counts the request's drafts ($u_a of $u_d)" [ "${u_d:-0}" -gt 0 -a "${u_a:-0}" -le "${u_d:-0}" ]
check_eq "plain server's usage has no speculative field" \
    "$(post "$PORT_plain" /v1/completions "$q}" | field 'o.usage.cairn_speculative === undefined')" "true"

st=$(curl -s "http://127.0.0.1:$PORT_spec/api/status")
drafted=$(echo "$st" | field 'o.models[0].speculative.drafted')
accepted=$(echo "$st" | field 'o.models[0].speculative.accepted')
check "drafts were made ($drafted)" [ "${drafted:-0}" -gt 0 ]
check "some were accepted ($accepted of $drafted)" [ "${accepted:-0}" -gt 0 ]
check_eq "plain server drafts nothing" "$(curl -s "http://127.0.0.1:$PORT_plain/api/status" | field 'o.models[0].speculative.drafted')" "0"
check_has "metrics count drafts" "$(curl -s "http://127.0.0.1:$PORT_spec/metrics")" "cairn_spec_accepted_tokens_total{model=\"demo\"} $accepted"

# under a grammar (response_format json_object): the same text with speculation on and off,
# and drafts verified (the ones the grammar rejects are cut before verification)
q='{"model":"demo","temperature":0,"max_tokens":80,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"Here is a config file:\n\n```json\n{\n  \"name\": \"web\",\n  \"port\": 8080\n}\n```\n\nChange the port to 9090. Show the full file."}]'
on=$(post "$PORT_spec" /v1/chat/completions "$q}")
off=$(post "$PORT_spec" /v1/chat/completions "$q,\"speculative\":\"off\"}" | field 'o.choices[0].message.content')
check_eq "json_object: speculation on = off" "$(echo "$on" | field 'o.choices[0].message.content')" "$off"
check "json_object: drafts were verified ($(echo "$on" | field 'JSON.stringify(o.usage.cairn_speculative)'))" \
    [ "$(echo "$on" | field 'o.usage.cairn_speculative ? o.usage.cairn_speculative.drafted : 0')" -gt 0 ]

r=$(post "$PORT_spec" /v1/chat/completions '{"model":"demo","messages":[{"role":"user","content":"hi"}],"speculative":"fast"}')
check_eq "bad speculative field: 400 param" "$(echo "$r" | field 'o.error.param')" "speculative"

stop_server spec

# the MTP head: greedy text with it equals the server without speculation
start_server mtp --model "$model" --threads 2 --speculative mtp --spec-cost-slope 0.05 --spec-draft-cost 0.02
for q in '"messages":[{"role":"user","content":"Rewrite this story with the fox replaced by an owl:\n\nOnce upon a time, there was a fox who lived by the sea. The fox loved to sing songs to the birds. One day, the fox found a mysterious map under a rock. In the end, the fox returned home happy and tired. The end."}]' \
         '"messages":[{"role":"user","content":"Write a long story about a brave knight."}]'; do
    body="{\"model\":\"demo\",\"temperature\":0,\"max_tokens\":100,$q}"
    on=$(post "$PORT_mtp" /v1/chat/completions "$body")
    ref=$(post "$PORT_plain" /v1/chat/completions "$body" | field 'o.choices[0].message.content')
    check "MTP reply is long" [ ${#ref} -gt 100 ]
    check_eq "chat with the MTP head = server without speculation" "$(echo "$on" | field 'o.choices[0].message.content')" "$ref"
    check "the head drafted ($(echo "$on" | field 'JSON.stringify(o.usage.cairn_speculative)'))" \
        [ "$(echo "$on" | field 'o.usage.cairn_speculative.drafted')" -gt 0 ]
done
check "some MTP drafts were accepted" [ "$(curl -s "http://127.0.0.1:$PORT_mtp/api/status" | field 'o.models[0].speculative.accepted')" -gt 0 ]
stop_server mtp
stop_server plain
finish spec_serve
