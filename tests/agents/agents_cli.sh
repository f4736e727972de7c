#!/usr/bin/env bash
# The real agent CLIs against `cairn serve` (issue 16): Claude Code (Anthropic messages), Codex
# (Responses, a custom provider with wire_api = "responses") and OpenCode (an OpenAI-compatible
# provider and the Anthropic provider), unmodified, from npm (scripts/bootstrap.sh agents puts
# them in .deps/agents). The server runs the scripted fake backend: asked to read a file, it
# answers with a tool call in each agent's own tool (Read / exec_command / read); the agent runs
# the tool on a file in a temp folder and sends the result back; the fake answers from it only
# when the file's secret (random per run) is in the prompt. The test checks each link of that
# loop: the tool call reached the agent, the tool's output (the file's text, which only the
# agent could read) came back in the next prompt, and the agent printed the final answer.
# Claude Code runs twice with -p (JSON, stream-JSON) and once interactively: its TUI on a
# pseudo-terminal (tests/agents/claude_tui.py) gets the prompt typed in, shows the Read and the
# answer, and quits on /exit.
# Then a prompt over a small model's context: each agent shows the overflow error it knows.
#
#   make test-agents     (not part of make test: the three CLIs are ~1 GB)
# Exits 77 (skipped) when the CLIs are not installed.
set -u
cd "${CAIRN_SRC:-.}"
CAIRN_SRC_ABS=$PWD
BIN_DIR="${CAIRN_AGENTS_BIN:-$PWD/.deps/agents/node_modules/.bin}"
for c in claude codex opencode; do
    if [ ! -x "$BIN_DIR/$c" ]; then
        echo "skip: $BIN_DIR/$c missing (run scripts/bootstrap.sh agents)"
        exit 77
    fi
done
source tests/integration/lib/serve_lib.sh

W="$SERVE_TMP/work"
mkdir -p "$W" "$SERVE_TMP/home"
SECRET="PELICAN-$RANDOM$RANDOM"
printf 'The secret word is %s.\n' "$SECRET" > "$W/notes.txt"
PROMPTS="$SERVE_TMP/prompts.txt"
KEY="agent-key-$RANDOM"
# The replies of a reasoning model (the fake template opens <think> when thinking is on, as
# Claude Code asks): a thought, then the tool call or the answer.
cat > "$SERVE_TMP/agents.json" <<JSON
{"models":[{"id":"fake","context_length":200000},{"id":"small","context_length":2000}],
 "replies":[{"match":"$SECRET","text":"Found it.</think>\\n\\nThe file says the secret word is $SECRET."},
            {"match":"CC-TASK","text":"I will read it.</think>\\n\\n<tool_call>\\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"$W/notes.txt\"}}\\n</tool_call>"},
            {"match":"CX-TASK","text":"<tool_call>\\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"cat notes.txt\"}}\\n</tool_call>"},
            {"match":"OC-TASK","text":"<tool_call>\\n{\"name\": \"read\", \"arguments\": {\"filePath\": \"$W/notes.txt\"}}\\n</tool_call>"}],
 "default":"ok","chunk_bytes":8,"prompt_log":"$PROMPTS"}
JSON
start_server agents --fake-backend "$SERVE_TMP/agents.json" --api-key "$KEY"
URL="http://127.0.0.1:$PORT_agents"
export HOME="$SERVE_TMP/home" XDG_CONFIG_HOME="$SERVE_TMP/home/.config" XDG_DATA_HOME="$SERVE_TMP/home/.local/share"
export XDG_CACHE_HOME="$SERVE_TMP/home/.cache" DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 NO_COLOR=1

n_prompts() { grep -c '^=== end of prompt ===$' "$PROMPTS" 2>/dev/null || echo 0; }
# loop_checks NAME TASK FROM: the prompts sent since FROM include the task and, after it, the
# file's text (the tool's output)
loop_checks() {
    local all
    all=$(awk -v from="$3" 'BEGIN{n=0} /^=== end of prompt ===$/{n++; next} n>=from' "$PROMPTS")
    check_has "$1: the task reached the server" "$all" "$2"
    check_has "$1: the tool's output (the file) came back in a prompt" "$all" "The secret word is $SECRET."
}
field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const o=JSON.parse(d);const f=new Function("o","return "+process.argv[1]);const v=f(o);process.stdout.write(typeof v==="string"?v:JSON.stringify(v))})' "$1"; }

# ---- Claude Code: -p with JSON output (bearer token), stream-JSON (x-api-key) ----
cd "$W"
from=$(n_prompts)
out=$(ANTHROPIC_BASE_URL="$URL" ANTHROPIC_AUTH_TOKEN="$KEY" ANTHROPIC_MODEL=fake timeout 180 \
      "$BIN_DIR/claude" -p "CC-TASK: read notes.txt and tell me the secret word" --output-format json \
      --allowedTools Read 2>"$SERVE_TMP/claude1.err")
check_eq "claude json: no error" "$(echo "$out" | field 'o.is_error')" "false"
check_has "claude json: final answer" "$(echo "$out" | field 'o.result')" "the secret word is $SECRET"
loop_checks "claude json" "CC-TASK" "$from"

from=$(n_prompts)
out=$(ANTHROPIC_BASE_URL="$URL" ANTHROPIC_API_KEY="$KEY" timeout 180 \
      "$BIN_DIR/claude" -p "CC-TASK: read notes.txt, then the secret word" --model fake --output-format stream-json \
      --verbose --allowedTools Read 2>"$SERVE_TMP/claude2.err")
check_has "claude stream-json: the Read tool call" "$out" '"type":"tool_use"'
check_has "claude stream-json: Read of the file" "$out" "\"file_path\":\"$W/notes.txt\""
check_has "claude stream-json: the tool result" "$out" "The secret word is $SECRET."
last=$(echo "$out" | grep '"type":"result"' | tail -1)
check_has "claude stream-json: final answer" "$last" "the secret word is $SECRET"
check_has "claude stream-json: success" "$last" '"is_error":false'
loop_checks "claude stream-json" "CC-TASK" "$from"

out=$(ANTHROPIC_BASE_URL="$URL" ANTHROPIC_AUTH_TOKEN="$KEY" timeout 180 \
      "$BIN_DIR/claude" -p "CC-TASK: read notes.txt" --model small --output-format json 2>>"$SERVE_TMP/claude1.err")
check_eq "claude overflow: an error" "$(echo "$out" | field 'o.is_error')" "true"
check_has "claude overflow: understood as a too-long prompt" "$(echo "$out" | field 'o.result')" "Prompt is too long"

# ---- Claude Code interactive: its TUI on a pseudo-terminal (tests/agents/claude_tui.py) ----
# Onboarding and the folder's trust dialog are marked done in its config, as after a first run.
python3 - "$HOME/.claude.json" "$W" <<'PY'
import json, os, sys
p, w = sys.argv[1], sys.argv[2]
c = json.load(open(p)) if os.path.exists(p) else {}
c.update({"hasCompletedOnboarding": True, "theme": "dark"})
c.setdefault("projects", {}).setdefault(w, {}).update({"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True})
json.dump(c, open(p, "w"))
PY
from=$(n_prompts)
tui=$(ANTHROPIC_BASE_URL="$URL" ANTHROPIC_AUTH_TOKEN="$KEY" ANTHROPIC_MODEL=fake ANTHROPIC_SMALL_FAST_MODEL=fake       TERM=xterm-256color timeout 200 python3 "$CAIRN_SRC_ABS/tests/agents/claude_tui.py"       --prompt "CC-TASK: read notes.txt and tell me the secret word" --expect "The file says the secret word is $SECRET"       --raw "$SERVE_TMP/claude-tui.raw" -- "$BIN_DIR/claude" --allowedTools Read)
sq=$(printf '%s' "$tui" | tr -d ' \t\r\n')
check_has "claude tui: the input box came up" "$tui" "READY=1"
check_has "claude tui: the Read tool ran on the file" "$sq" "read1file"
check_has "claude tui: the file named on screen" "$sq" "notes.txt"
check_has "claude tui: final answer on screen" "$sq" "Thefilesaysthesecretwordis$SECRET."
check_has "claude tui: answered before the timeout" "$tui" "ANSWERED=1"
check_has "claude tui: /exit quits" "$tui" "EXIT=0"
check_has "claude tui: its goodbye (the session to resume)" "$sq" "Resumethissessionwith"
loop_checks "claude tui" "CC-TASK" "$from"

# ---- Codex: exec with a custom Responses provider ----
mkdir -p "$HOME/.codex"
cat > "$HOME/.codex/config.toml" <<TOML
model = "fake"
model_provider = "cairn"
[model_providers.cairn]
name = "cairn"
base_url = "$URL/v1"
wire_api = "responses"
env_key = "CAIRN_TEST_KEY"
TOML
from=$(n_prompts)
out=$(CODEX_HOME="$HOME/.codex" CAIRN_TEST_KEY="$KEY" timeout 180 "$BIN_DIR/codex" exec --skip-git-repo-check \
      --dangerously-bypass-approvals-and-sandbox "CX-TASK: read notes.txt and tell me the secret word" 2>&1)
check_has "codex: ran the command" "$out" "cat notes.txt"
check_has "codex: final answer" "$(echo "$out" | tail -3)" "the secret word is $SECRET"
loop_checks "codex" "CX-TASK" "$from"
out=$(CODEX_HOME="$HOME/.codex" CAIRN_TEST_KEY="$KEY" timeout 180 "$BIN_DIR/codex" exec --skip-git-repo-check \
      --dangerously-bypass-approvals-and-sandbox -m small "CX-TASK: read notes.txt" 2>&1)
check_has "codex overflow: understood as the context window" "$out" "ran out of room in the model's context window"

# ---- OpenCode: OpenAI-compatible provider, then the Anthropic provider ----
cat > "$W/opencode.json" <<JSONC
{"\$schema": "https://opencode.ai/config.json", "autoupdate": false, "share": "disabled",
 "provider": {
  "cairn": {"npm": "@ai-sdk/openai-compatible", "name": "cairn",
            "options": {"baseURL": "$URL/v1", "apiKey": "$KEY"},
            "models": {"fake": {"name": "fake", "limit": {"context": 200000, "output": 4096}},
                       "small": {"name": "small", "limit": {"context": 2000, "output": 512}}}},
  "cairn-anthropic": {"npm": "@ai-sdk/anthropic", "name": "cairn (Anthropic API)",
            "options": {"baseURL": "$URL/v1", "apiKey": "$KEY"},
            "models": {"fake": {"name": "fake", "limit": {"context": 200000, "output": 4096}},
                       "small": {"name": "small", "limit": {"context": 2000, "output": 512}}}}}}
JSONC
for prov in cairn cairn-anthropic; do
    from=$(n_prompts)
    out=$(timeout 300 "$BIN_DIR/opencode" run --model "$prov/fake" "OC-TASK: read notes.txt and tell me the secret word" 2>&1)
    check_has "opencode $prov: the read tool ran" "$out" "notes.txt"
    check_has "opencode $prov: final answer" "$out" "the secret word is $SECRET"
    loop_checks "opencode $prov" "OC-TASK" "$from"
done
out=$(timeout 300 "$BIN_DIR/opencode" run --model cairn/small "OC-TASK: read notes.txt" 2>&1)
check_has "opencode overflow (OpenAI provider): the context-length error" "$out" "maximum context length is 2000 tokens"
out=$(timeout 300 "$BIN_DIR/opencode" run --model cairn-anthropic/small "OC-TASK: read notes.txt" 2>&1)
check_has "opencode overflow (Anthropic provider): the too-long error" "$out" "prompt is too long"

# every request of the agents was answered without a server error
check "no 5xx in the access log" bash -c "! grep -E 'status=5[0-9][0-9]' '$SERVE_TMP/agents.log'"
cd - >/dev/null
stop_server agents
finish agents_cli
