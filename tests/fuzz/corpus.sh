#!/usr/bin/env bash
# The fuzz corpus lives packed, one tests/fuzz/corpus/NAME.tar.gz per target: thousands of small
# files each cost their own overhead wherever the tree is copied (the device tool counts it
# against its 64 MiB), and a packed archive is built byte-reproducibly so an unchanged corpus
# repacks to the same bytes (sorted names, fixed owner and mtime, gzip -n).
#
#   corpus.sh unpack NAME DIR   extract NAME's inputs into DIR (created; nothing if no archive)
#   corpus.sh pack NAME DIR     replace NAME's archive with DIR's files (flat: inputs only)
#   corpus.sh merge NAME BIN DIR...  libFuzzer -merge=1 of the archive and DIR(s) (BIN = the
#                               fuzz target), keeping the inputs that add coverage, then pack
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir_of() { echo "$here/corpus/$1.tar.gz"; }

unpack()
{
    local name=$1 dest=$2 archive
    archive=$(dir_of "$name")
    mkdir -p "$dest"
    [ -f "$archive" ] || return 0
    tar xzf "$archive" -C "$dest"
}

pack()
{
    local name=$1 src=$2 archive tmp
    archive=$(dir_of "$name")
    tmp=$archive.tmp.$$
    (cd "$src" && find . -maxdepth 1 -type f -printf '%P\n' | LC_ALL=C sort) |
        tar czf - -C "$src" --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=0644 \
            --no-recursion -T - | gzip -dc | gzip -9n > "$tmp"
    mv "$tmp" "$archive"
    echo "$archive: $(tar tzf "$archive" | wc -l) inputs, $(stat -c %s "$archive") bytes"
}

merge()
{
    local name=$1 bin=$2 work
    shift 2
    work=$(mktemp -d); trap 'rm -rf "$work"' RETURN
    unpack "$name" "$work/old"
    mkdir -p "$work/merged"
    "$bin" -merge=1 "$work/merged" "$work/old" "$@" 2>&1 | tail -2
    pack "$name" "$work/merged"
}

case "${1:-}" in
unpack) [ $# -eq 3 ] || { echo "usage: corpus.sh unpack NAME DIR" >&2; exit 2; }; unpack "$2" "$3" ;;
pack) [ $# -eq 3 ] || { echo "usage: corpus.sh pack NAME DIR" >&2; exit 2; }; pack "$2" "$3" ;;
merge) [ $# -ge 4 ] || { echo "usage: corpus.sh merge NAME BIN DIR..." >&2; exit 2; }; merge "$2" "$3" "${@:4}" ;;
*) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
