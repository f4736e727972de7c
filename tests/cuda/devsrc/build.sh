#!/usr/bin/env bash
# The device side of tests/cuda/devsrc/pack.sh (run from the repository root: bash DEST/build.sh).
# The GPU image has nvcc and gcc but not the -dev headers: the branch's changed files
# (src.tar.xz) are laid over the tree, jansson/xxhash headers (inc.tar.xz) unpacked beside the
# build, base/hash.c taken prebuilt (it alone needs OpenSSL's headers); cmds.txt's compile commands
# run 16 at a time; the link makes one multicall binary DEST/cairn, DEST/test_cuda_ops a link to
# it (argv[0] picks the op test). About a minute on the H200 machine's 16 cores.
set -u
S=$PWD
D=$(cd "$(dirname "$0")" && pwd)
BD=/tmp/bd
rm -rf $BD && mkdir -p $BD/o $BD/inc $BD/c
python3 - "$S" "$D" "$BD" <<'PY'
import sys, tarfile
s, d, bd = sys.argv[1:]
tarfile.open(d + '/src.tar.xz', 'r:xz').extractall(s)
tarfile.open(d + '/inc.tar.xz', 'r:xz').extractall(bd + '/inc')
for i, l in enumerate(open(d + '/cmds.txt').read().splitlines()):
    open('%s/c/%03d.sh' % (bd, i), 'w').write(l.replace('@SRC@', s).replace('@BD@', bd) + '\n')
PY
ls $BD/c/*.sh | xargs -P 16 -n 1 bash -c 'bash "$0" > "$0.log" 2>&1 || echo "compile failed: $0: $(head -c 600 $0.log)"'
gcc -O2 -c $D/multi.c -o $BD/o/multi.o && gcc -O2 -c $D/stubs.c -o $BD/o/stubs.o
lib() { # the library's path (the image has the .so.N, not the -dev .so links)
    local p
    p=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }')
    [ -n "$p" ] || p=$(ls /usr/lib/x86_64-linux-gnu/$1 /usr/lib64/$1 /lib/x86_64-linux-gnu/$1 2>/dev/null | head -1)
    echo "${p:-$1}"
}
CUDART=$(ls /usr/local/cuda/lib64/libcudart_static.a /usr/local/cuda/lib/libcudart_static.a /usr/local/cuda/targets/x86_64-linux/lib/libcudart_static.a 2>/dev/null | head -1)
ar rcs $BD/libcore.a $(ls $BD/o/*.o | grep -v '/o/\(cu_\|cli_\|tst_\|multi\|stubs\)') $D/hash.c.o
ar rcs $BD/libcu.a $BD/o/cu_*.o
gcc -O2 $BD/o/multi.o $BD/o/stubs.o $BD/o/cli_*.o $BD/o/tst_*.o -o $D/cairn $BD/libcore.a \
    "$(lib libjansson.so.4)" "$(lib libxxhash.so.0)" "$(lib libcrypto.so.3)" -lm $BD/libcu.a "$CUDART" \
    -ldl -lrt -lpthread -lstdc++ -lm 2> $BD/link.err || { echo "link failed:"; head -c 2000 $BD/link.err; }
ln -sf cairn $D/test_cuda_ops
ls -la $D/cairn 2>&1
