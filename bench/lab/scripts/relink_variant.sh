#!/usr/bin/env bash
# A lab variant of the EXL3 matmul without a second build tree: compiles src/backend/cuda/exl3/exl3_matmul.cu with the
# build's own nvcc line plus extra -D flags, puts the object into a copy of libexl3_cuda.a and relinks exl3,
# bench_cuda_exl3 and exl3_cuda_tests with the build's link lines (build.ninja).
# Usage: bash bench/lab/scripts/relink_variant.sh BUILD_DIR OUT_DIR -DFLAG=VALUE ...
#   e.g. bash bench/lab/scripts/relink_variant.sh build-90 /tmp/var/p4 -DEXL3_PAIR_DEEP=1
#   PREBUILT=file.o: use that object instead of compiling (flags ignored).
set -euo pipefail
build=$(realpath "$1"); out=$2; shift 2
mkdir -p "$out"; out=$(realpath "$out")
cd "$build"
cmd=$(python3 - "$build" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1] + '/compile_commands.json')):
    if c['file'].endswith('exl3/exl3_matmul.cu'):
        print(c['command'])
PY
)
obj=$(sed -E 's/.* -o ([^ ]+).*/\1/' <<< "$cmd")
if [ -n "${PREBUILT:-}" ]; then cp "$PREBUILT" "$out/variant.o"
else set -f; $(sed -E "s# -o [^ ]+# -o $out/variant.o#" <<< "$cmd") "$@"; set +f; fi
cp src/backend/cuda/libexl3_cuda.a "$out/"
(cd "$out" && cp variant.o "$(basename "$obj")" && ar r libexl3_cuda.a "$(basename "$obj")")
for t in tools/exl3/exl3 bench/bench_cuda_exl3 tests/cuda/exl3_cuda_tests; do
  n=$(grep -n "^build $t[ :]" build.ninja | head -1 | cut -d: -f1)
  objs=$(sed -n "${n}p" build.ninja | sed -E 's/^build [^:]*: [A-Za-z0-9_]+ //; s/ \|.*//')
  libs=$(sed -n "$((n + 1)),$((n + 6))p" build.ninja | grep '^  LINK_LIBRARIES = ' | sed 's/^  LINK_LIBRARIES = //' |
         sed "s#src/backend/cuda/libexl3_cuda.a#$out/libexl3_cuda.a#g")
  # shellcheck disable=SC2086
  g++ -O3 -DNDEBUG $objs -o "$out/$(basename "$t")" -L/usr/local/cuda/targets/x86_64-linux/lib $libs
done
ls -la "$out"
