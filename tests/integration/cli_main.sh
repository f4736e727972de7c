#!/usr/bin/env bash
# cairn's top level: --version/-V print what `cairn version` prints (exit 0); --help/-h list
# every command of the dispatch table (exit 0); no command or an unknown one: usage on stderr,
# exit 2.
set -euo pipefail
bin=${CAIRN_BIN:?}; src=${CAIRN_SRC:-.}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

want=$("$bin" version)
[[ "$want" == cairn\ * ]]
[ "$("$bin" --version)" = "$want" ]
[ "$("$bin" -V)" = "$want" ]

"$bin" --help > "$work/help.txt"
"$bin" -h | cmp - "$work/help.txt"
# every command named in main.c's table is listed
n=0
while read -r name; do
    grep -q "^  $name " "$work/help.txt" || { echo "--help lacks $name"; exit 1; }
    n=$((n + 1))
done < <(sed -n 's/^    {"\([a-z-]*\)", ".*/\1/p' "$src/src/cli/main.c")
[ "$n" -ge 8 ]

set +e
"$bin" > "$work/out.txt" 2> "$work/err.txt"; rc=$?
[ "$rc" = 2 ] && [ ! -s "$work/out.txt" ] && grep -q "usage: cairn" "$work/err.txt" || exit 1
"$bin" --no-such-flag 2> "$work/err.txt"; rc=$?
[ "$rc" = 2 ] && grep -q "unknown command '--no-such-flag'" "$work/err.txt" || exit 1
set -e
echo "cli_main: ok ($n commands)"
