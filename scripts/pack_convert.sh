#!/usr/bin/env bash
# Packs what scripts/device_convert.sh carries into .device/c43 (git-ignored), each set under the 64 MiB a call
# carries:
#   speed    exl3 and the converter's CUDA test binaries (modes tests, 1b, 8b, 70b; SPEED_TESTS="..." picks them, "" none);
#   quality  exl3 and tiny-target, the reference's 4.0 bpw file and the data texts from ../shared (ablate, table).
# Usage: bash scripts/pack_convert.sh speed|quality [BUILD_DIR (default build/release)]
set -euo pipefail
set_=${1:?speed or quality}; build=${2:-build/release}
shared=${EXL3_SHARED_DIR:-../shared}
out=.device/c43; rm -rf "$out"; mkdir -p "$out"
targets=(exl3)
[ "$set_" = speed ] && targets+=(${SPEED_TESTS-exl3_gpu_quantizer_tests exl3_viterbi_cuda_tests exl3_convert_tests})
cmake --build "$build" -j2 --target "${targets[@]}" > /dev/null
tmp=$(mktemp -d)
for t in "${targets[@]}"; do cp "$(find "$build" -name "$t" -type f -perm -u+x | head -1)" "$tmp/"; strip "$tmp/$t"; done
(cd "$tmp" && tar cf - -- *) | xz -T1 -6 > "$out/bins.tar.xz"
rm -rf "$tmp"
lib=$(ldconfig -p | awk '/libcpp-httplib.so.0.11 /{print $NF; exit}')
[ -n "$lib" ] && cp "$lib" "$out/"
if [ "$set_" = quality ]; then
  tar cf - -C "$shared" models/tiny-target models/tiny-target-exl3-4.0bpw data/eval.txt data/wikitext-2-test.txt \
    data/calibration.txt | xz -T1 -6 > "$out/shared.tar.xz"
fi
du -sh "$out"/*
du -shc "$out" | tail -1
