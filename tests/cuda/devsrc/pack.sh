#!/usr/bin/env bash
# A device call's carry of SOURCES rather than binaries, for when the working tree leaves the carry
# little room (the device tool counts tree + carry against 64 MiB; cairn + test_cuda_ops stripped
# and xz'ed are ~1.9 MB, this is ~150 KB). The GPU image has nvcc, gcc and the runtime libraries
# but not the -dev headers of jansson/xxhash/OpenSSL, so the carry holds:
#   src.tar.xz  the files that differ from BASE (laid over main's tree there: a branch's work);
#   inc.tar.xz  jansson.h, jansson_config.h, xxhash.h;   hash.c.o  base/hash.c prebuilt (OpenSSL);
#   cmds.txt    the compile commands (CMake's compile_commands.json) of what cairn bench,
#               check-logits, synth-model and test_cuda_ops link, with @SRC@/@BD@ for the paths;
#   decode_ab.sh  the decode work's call (bash DEST/decode_ab.sh);
#   build.sh, multi.c, stubs.c  the device side: compile 16 at a time, link ONE multicall binary
#               DEST/cairn (DEST/test_cuda_ops links to it; serve, generate, tokenize stubbed out).
# usage: tests/cuda/devsrc/pack.sh BASE DEST   (BASE: the ref the device's tree is at, e.g. main;
#        DEST: an ignored folder of the calling checkout, e.g. /work/main/.devcarry-x, named in carry)
# Needs the build folder $B (default build-dev: CAIRN_CUDA_TESTS=ON, sm_90 alone, targets cairn and
# test_cuda_ops built) for the objects the link takes; it is reconfigured with compile commands on.
# On the device: bash DEST/build.sh (from the repository root), then run DEST/cairn, DEST/test_cuda_ops.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: pack.sh BASE DEST" >&2; exit 2; }
base=$1 dest=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
B=$(cd "${B:-$root/build-dev}" && pwd)
cmake -S "$root" -B "$B" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > /dev/null
cmake --build "$B" --target cairn test_cuda_ops -j2 > /dev/null
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the core objects the device binary's link takes (a link map of the same link, here)
cc -c "$here/multi.c" -o "$tmp/multi.o"
cc -c "$here/stubs.c" -o "$tmp/stubs.o"
objcopy --redefine-sym main=cairn_main "$B/CMakeFiles/cairn.dir/src/cli/main.c.o" "$tmp/main.o"
objcopy --redefine-sym main=test_cuda_ops_main "$B/CMakeFiles/test_cuda_ops.dir/tests/cuda/test_cuda_ops.c.o" "$tmp/tops.o"
cli="cli_device cmd_bench cmd_check_logits cmd_synth_model cmd_version"
cliobj=$(for c in $cli; do echo "$B/CMakeFiles/cairn.dir/src/cli/$c.c.o"; done)
cc "$tmp/multi.o" "$tmp/main.o" "$tmp/tops.o" "$tmp/stubs.o" $cliobj -o "$tmp/a.out" -Wl,-Map,"$tmp/map" \
    "$B/libcairn_core.a" -ljansson -lpcre2-8 -lxxhash -lcrypto -lm "$B/libcairn_cuda_kernels.a" \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm
grep -o 'libcairn_core.a([^)]*)' "$tmp/map" | sed 's/.*(//; s/)//' | sort -u > "$tmp/members"
python3 - "$B/compile_commands.json" "$tmp/members" "$root" "$cli" > "$dest/cmds.txt" <<'PY'
import json, os, shlex, sys
cc, members, root, cli = json.load(open(sys.argv[1])), set(open(sys.argv[2]).read().split()), sys.argv[3], sys.argv[4].split()
cli = {c + '.c' for c in cli} | {'main.c'}
out = []
for e in cc:
    f = e['file']; base = os.path.basename(f)
    if f.endswith('.cu'): pre = 'cu_'
    elif '/src/cli/' in f and base in cli: pre = 'cli_'
    elif f.endswith('tests/cuda/test_cuda_ops.c'): pre = 'tst_'
    elif '/src/cli/' not in f and '/tests/' not in f and base + '.o' in members and base != 'hash.c': pre = ''
    else: continue
    a, o, i = shlex.split(e['command']), [], 0
    while i < len(a):
        if a[i] == '-o': o += ['-o', '@BD@/o/' + pre + base + '.o']; i += 2; continue
        if a[i] in ('-g', '-Werror', '-Werror=all-warnings') or a[i].startswith('-ccbin'): i += 1; continue
        if a[i] == '--options-file': o += ['-I@SRC@/src']; i += 2; continue
        if a[i] == '-isystem' and 'p11-kit' in a[i + 1]: i += 2; continue
        o.append(a[i].replace(root, '@SRC@')); i += 1
    if o[0].endswith('nvcc'): o[0] = 'nvcc'
    else: o[0:1] = ['gcc', '-I@BD@/inc']
    if base == 'main.c' and pre == 'cli_': o.insert(1, '-Dmain=cairn_main')
    if pre == 'tst_': o.insert(1, '-Dmain=test_cuda_ops_main')
    out.append((0 if 'cuda_gemv' in f else 1 if 'cuda_moe' in f else 2 if pre == 'cu_' else 3, ' '.join(map(shlex.quote, o))))
print('\n'.join(l for _, l in sorted(out)))
PY
(cd "$root" && git diff --name-only --diff-filter=d "$base" -- src tests/cuda | xargs tar -cf - | xz -9e) > "$dest/src.tar.xz"
tar -chf - -C /usr/include jansson.h jansson_config.h xxhash.h | xz -9e > "$dest/inc.tar.xz"
strip --strip-debug -o "$dest/hash.c.o" "$B/CMakeFiles/cairn_core.dir/src/base/hash.c.o"
cp "$here/build.sh" "$here/multi.c" "$here/stubs.c" "$here/decode_ab.sh" "$dest/"
du -cb "$dest"/* | tail -1
