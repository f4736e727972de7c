#!/usr/bin/env bash
# Pack what a device call needs, small enough to travel beside the working tree (the tree is
# ~61 MB of the device tool's 64 MiB: a carry of ~1.5 MB is what fits).
#   tests/cuda/devpack.sh BUILD_DIR DEST NAME...    e.g. build-dev .devcarry-x cairn test_cuda_ops
# Each BUILD_DIR/NAME is stripped and xz'ed into DEST/NAME.xz; the shared libraries the GPU image
# lacks (libmicrohttpd, libutf8proc) go to DEST/lib. DEST must be ignored by git (.git/info/exclude
# has /.devcarry*/) and named in the call's carry. On the device: tests/cuda/devunpack.sh DEST.
# A small build: cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DCAIRN_CUDA_TESTS=ON \
#   -DCAIRN_CUDA_GENCODE=-gencode=arch=compute_90,code=sm_90 -DCAIRN_CUDA_LINEINFO=OFF
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: devpack.sh BUILD_DIR DEST NAME..." >&2; exit 2; }
build=$1 dest=$2
shift 2
mkdir -p "$dest/lib"
for n in "$@"; do
    strip -o "$dest/$n" "$build/$n"
    xz -9e -f "$dest/$n"
done
for l in libmicrohttpd.so.12 libutf8proc.so.2; do
    cp -L "/usr/lib/x86_64-linux-gnu/$l" "$dest/lib/$l"
done
du -cb "$dest"/*.xz "$dest"/lib/* | tail -1
