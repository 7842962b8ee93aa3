#!/usr/bin/env bash
# A lab variant of the EXL3 kernels without a second build tree: compiles the CUDA files of src/backend/cuda/exl3/
# (the fused kernels of each K, the rotation and decode kernels) with the build's own nvcc lines plus extra -D flags
# (the lab macros the library never sets: EXL3_RING_BYTES, EXL3_PRE_DEFER, exl3_layout.h), puts the objects into a
# copy of libexl3_cuda.a and relinks exl3, bench_cuda_exl3 and exl3_cuda_tests with the build's link lines
# (build.ninja).
# Usage: bash bench/lab/scripts/relink_variant.sh BUILD_DIR OUT_DIR -DFLAG=VALUE ...
#   e.g. bash bench/lab/scripts/relink_variant.sh build-90 /tmp/var/r48 -DEXL3_RING_BYTES=49152
#   PREBUILT=dir: use the objects in that folder (named as the build names them) instead of compiling.
set -euo pipefail
build=$(realpath "$1"); out=$2; shift 2
mkdir -p "$out"; out=$(realpath "$out")
cd "$build"
cp src/backend/cuda/libexl3_cuda.a "$out/"
python3 - "$build" <<'PY' > "$out/commands.txt"
import json, sys
for c in json.load(open(sys.argv[1] + '/compile_commands.json')):
    if '/backend/cuda/exl3/' in c['file'] and c['file'].endswith('.cu'):
        print(c['command'])
PY
while IFS= read -r cmd; do
  obj=$(sed -E 's/.* -o ([^ ]+).*/\1/' <<< "$cmd")
  name=$(basename "$obj")
  if [ -n "${PREBUILT:-}" ]; then cp "$PREBUILT/$name" "$out/$name"
  else set -f; $(sed -E "s# -o [^ ]+# -o $out/$name#" <<< "$cmd") "$@"; set +f; fi
  (cd "$out" && ar r libexl3_cuda.a "$name")
done < "$out/commands.txt"
for t in tools/exl3/exl3 bench/bench_cuda_exl3 tests/cuda/exl3_cuda_tests; do
  n=$(grep -n "^build $t[ :]" build.ninja | head -1 | cut -d: -f1)
  objs=$(sed -n "${n}p" build.ninja | sed -E 's/^build [^:]*: [A-Za-z0-9_]+ //; s/ \|.*//')
  libs=$(sed -n "$((n + 1)),$((n + 6))p" build.ninja | grep '^  LINK_LIBRARIES = ' | sed 's/^  LINK_LIBRARIES = //' |
         sed "s#src/backend/cuda/libexl3_cuda.a#$out/libexl3_cuda.a#g")
  # shellcheck disable=SC2086
  g++ -O3 -DNDEBUG $objs -o "$out/$(basename "$t")" -L/usr/local/cuda/targets/x86_64-linux/lib $libs
done
ls -la "$out"
