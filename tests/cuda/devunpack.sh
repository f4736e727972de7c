#!/usr/bin/env bash
# The device side of devpack.sh: unpack DEST/*.xz in place (xz, or Python's lzma where the image
# has no xz) and make them executable. Then: export LD_LIBRARY_PATH=$PWD/DEST/lib:$LD_LIBRARY_PATH
#   tests/cuda/devunpack.sh DEST
set -euo pipefail
dest=${1:?usage: devunpack.sh DEST}
for z in "$dest"/*.xz; do
    [ -f "$z" ] || continue
    out=${z%.xz}
    if command -v xz >/dev/null; then
        xz -dc "$z" > "$out"
    else
        python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$z" "$out"
    fi
    chmod +x "$out"
done
