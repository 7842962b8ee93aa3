#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on single cells of the EXL3 kernel table (issue 6 lab work), plus the SASS of
# the fused kernel, so each kernel variant's stall reasons and instruction mix are on file.
# Usage: BENCH=path/to/bench_cuda_exl3 bash scripts/device_profile.sh [SHAPE_INDEX K [CODEBOOK]] ...
#   e.g. bash scripts/device_profile.sh 6 4 mul1 2 4 3inst   (shape indices: bench/cuda_exl3_bench.cpp)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bench=${BENCH:-build-dev/bench/bench_cuda_exl3}
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(6 4 mul1)
i=0
while [ $i -lt ${#args[@]} ]; do
  shape=${args[$i]}; k=${args[$((i + 1))]}; cb=mul1
  if [ $((i + 2)) -lt ${#args[@]} ] && ! [[ ${args[$((i + 2))]} =~ ^[0-9]+$ ]]; then cb=${args[$((i + 2))]}; i=$((i + 3)); else i=$((i + 2)); fi
  tag="s${shape}k${k}${cb}"
  echo "== ncu shape $shape K$k $cb"
  ncu --set full --kernel-name regex:exl3_fused --launch-skip 20 --launch-count 1 \
    "$bench" --only "$shape" "$k" --codebook "$cb" > "$OUT/ncu-$tag.txt" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Issued Ipc|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|DRAM Throughput|Memory Throughput|Stall|Waves Per SM|Block Limit|One or More" \
    "$OUT/ncu-$tag.txt" | head -40
done
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$bench" > "$OUT/bench.sass" 2>/dev/null
  echo "SASS: $(wc -l < "$OUT/bench.sass") lines in bench.sass"
fi
