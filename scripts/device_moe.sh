#!/usr/bin/env bash
# Mixtures of experts on the GPU machine in one go (issue 42, docs/kernels/moe.md), from binaries built here for sm_90
# and carried:
#   bash scripts/pack_device.sh build/release exl3 exl3_cuda_tests exl3_cuda_generator_tests bench_cuda_moe
#   (-> .device/r1/bins.tar.xz and the libcpp-httplib the exl3 binary links; carry .device/r1)
# Steps:
#   1. random models (tools/bench/make_random_model.py): qwen3-moe-tiny at EXL3 4 bits for the tests first; then, in
#      the background, the Qwen3-30B-A3B shape at 4.0 bpw and the Mixtral-8x7B shape at 3.0 bpw (6-bit heads);
#   2. the CUDA MoE tests: the grouped layer and the routing sort against the CPU (MoeLayer*, MoeRouteSort*; the
#      decode step's routing by warps against the block's bit for bit: MoeRouteSort.Warps*), the
#      routing kernel (FamilyOps.Moe*), the golden MoE families (CudaExperts*: dense experts, the host-routed path),
#      the EXL3 MoE model (CudaModel.Exl3Experts*: against the CPU, graph replay = eager), the batch-invariant
#      generator on it; compute-sanitizer memcheck on the layer tests;
#   3. bench_cuda_moe (once the models are written: nothing else on the GPU): one layer at both shapes, 1 to 2048
#      tokens, each plan variant, beside its ideal; at 1 and 8 tokens the launches one at a time from the router on:
#      the routing by moe_route_sort's block, by moe_route_warps (the default), and the weighted sum in the down stage;
#   4. exl3 bench on both models: prefill 2048, decode batch 1 and 32 at context 512, beside the roofline and the ideal
#      step.
# Prints a compact summary (full logs in $OUT). About 8 minutes; SKIP_MIXTRAL=1 leaves out the second model;
# QUICK=1 runs only the MoE layer tests (with memcheck) and bench_cuda_moe at 1, 8 and 32 tokens (~2 minutes;
# BENCH_TOKENS=1,2,4,6,8 other sizes, for QUICK and DECODE: e.g. where the rotation kernel starts to pay).
# DECODE=1 (~7 minutes) proves a decode-step change before and after in one call: the MoE layer, routing and model
# tests (the tiny EXL3 MoE against the CPU, graph replay = eager, the batch-invariant generator, its experts over
# tensor-parallel ranks where exl3_cuda_tp_tests is packed), memcheck on the layer's kernels, bench_cuda_moe at 1, 8
# and 32 tokens (DECODE_MEMCHECK: the gtest filter memcheck runs, default the layer's and the routing's tests), then
# `exl3 bench -p 2048 -b 1,32 -c 512 -g 64` on the Qwen3-30B-A3B shape by $B/base/exl3 (a build of an earlier
# commit, packed with BASE=...: see pack_device.sh) and by this build, interleaved, ROUNDS times (default 1;
# DECODE_BATCHES other batches, e.g. 1,2,4,8,32; DECODE_VARIANTS the builds in their order, default "base new": more
# packed by pack_device.sh's VARIANTS). Packed:
#   BASE=<earlier exl3> bash scripts/pack_device.sh build/release exl3 exl3_cuda_tests exl3_cuda_generator_tests \
#     exl3_cuda_tp_tests bench_cuda_moe
# PROFILE=1 (~3 minutes): where the model's decode step goes, no tests: the Qwen3-30B-A3B shape, bench_cuda_moe at
# BENCH_TOKENS (default 1,2,3,4,6,8,16,32: the plan variants, and each launch of a layer up to 32 tokens), then Nsight
# Compute on the last timed step of `exl3 bench` at batch 1 and 32 (scripts/device_step_profile.sh: each kernel's own
# time, summed by name) and its first layer's two stage kernels at batch 32 in detail (speed of light, occupancy,
# launch, warp states, scheduler: what bounds exl3_moe_kernel there).
# PROFILE=detail (~1.5 minutes): only the stage kernels in detail (and the memory workload) at PROFILE_DETAIL_BATCHES
# (default 32 1). Both profiles first write the K4 MUL1 8-row stage kernel's SASS to $OUT (cuobjdump) and print its
# opcode counts: the instructions a tile (docs/kernels/moe.md, fourteenth session).
# TESTS_ONLY=1: DECODE=1's tests and memcheck on the layer's kernels, nothing else (~1.5 minutes).
# PROFILE=1 DECODE=1 (or PROFILE=detail DECODE=1): both in one call (the models made once); DECODE_MEMCHECK=none skips
# memcheck.
# Usage (device tool): bash scripts/device_moe.sh [P=.device/r1]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/r1
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
B=/tmp/b
mkdir -p $B && xz -dc "$P/bins.tar.xz" | tar xf - -C $B
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# compute-sanitizer memcheck on the layer and routing tests (where the tool is installed); $1: the tests, $2: seconds.
memcheck() {
  command -v compute-sanitizer > /dev/null || return 0
  timeout "${2:-180}" compute-sanitizer --tool memcheck --error-exitcode 9 $B/exl3_cuda_tests --gtest_filter="$1" \
    > /tmp/sanitizer.log 2>&1
  echo "== $(el) compute-sanitizer memcheck exit $? ($(grep -E 'ERROR SUMMARY' /tmp/sanitizer.log | tail -1))"
  grep -E "Invalid|out of bounds|at 0x" /tmp/sanitizer.log | head -8
  cp /tmp/sanitizer.log "$OUT/"
}
LAYER_MEMCHECK='Act/MoeLayer.WritesWithoutAccumulating/bf16:Act/MoeLayer.InvariantRowsAndGraphReplay/bf16:MoeRouteSort*'

# The CUDA MoE tests ($1: the filter, $2: seconds), their summary printed, the log kept.
moe_tests() {
  echo "== $(el) CUDA MoE tests"
  timeout "$2" $B/exl3_cuda_tests --gtest_filter="$1" > /tmp/moe_tests.log 2>&1
  echo "exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \]|Failure|Expected|Which is|error" /tmp/moe_tests.log | head -40
  grep -E "(golden/[a-z0-9_]+|moe-tiny|exl3_all_experts_[a-z0-9_]+): (prefill|routed)" /tmp/moe_tests.log | head -20
  cat /tmp/moe_tests.log >> "$OUT/tests.log"
}
# Another test binary ($1, where packed) with a filter ($2).
bin_tests() {
  [ -x "$B/$1" ] || { echo "$1 not packed"; return 0; }
  timeout 120 "$B/$1" --gtest_filter="$2" > /tmp/bin_tests.log 2>&1
  echo "$1 exit $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \]|Failure" /tmp/bin_tests.log | head -10
  cat /tmp/bin_tests.log >> "$OUT/tests.log"
}
gen_tests() { bin_tests exl3_cuda_generator_tests 'GeneratorCuda.BatchInvariant*'; }
# The tests' outcome once more, printed last (the device tool keeps only the output's tail and a few files of $OUT).
test_summary() {
  [ -f "$OUT/tests.log" ] || return 0
  echo "== tests: $(grep -c '^\[       OK \]' "$OUT/tests.log") OK, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log") failed"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Za-z]" "$OUT/tests.log" | head -20
}
# bench_cuda_moe ($@: its options).
bench_layer() {
  echo "== $(el) bench_cuda_moe $*"
  timeout "${BENCH_SECONDS:-150}" $B/bench_cuda_moe "$@" > /tmp/bench_moe.log 2>&1
  echo "exit $?"; grep -E "^MoE|^[a-z0-9-]+: |^\| [0-9]|^launches|^  [a-z]" /tmp/bench_moe.log | head -260
  cp /tmp/bench_moe.log "$OUT/"
}
tiny_model() {
  python3 tools/bench/make_random_model.py --shape qwen3-moe-tiny --exl3-bits 4 --head-bits 6 --out /tmp/moe-tiny \
    > /tmp/moe_tiny.log 2>&1 && export EXL3_TEST_EXL3_MOE=/tmp/moe-tiny || tail -3 /tmp/moe_tiny.log
}
# The bench models in the background ($1: 1 for Mixtral-8x7B too); `wait $models` for them.
bench_models() {
  if [ -d /tmp/models/qwen3 ]; then (:) & models=$!; return; fi  # made already (PROFILE=1 DECODE=1)
  (python3 tools/bench/make_random_model.py --shape qwen3-30b-a3b --exl3-bits 4 --head-bits 6 --out /tmp/models/qwen3 \
     > /tmp/model_qwen3.log 2>&1 || { echo "qwen3-30b-a3b model failed"; tail -3 /tmp/model_qwen3.log; }
   if [ "$1" = 1 ]; then
     python3 tools/bench/make_random_model.py --shape mixtral-8x7b --exl3-bits 3 --head-bits 6 --out /tmp/models/mixtral \
       > /tmp/model_mixtral.log 2>&1 || { echo "mixtral-8x7b model failed"; tail -3 /tmp/model_mixtral.log; }
   fi) > /tmp/models.log 2>&1 &
  models=$!
}

PROFILE=${PROFILE:-0}
if [ "$PROFILE" = 1 ] || [ "$PROFILE" = detail ]; then  # the step's time, kernel by kernel (see the header)
  echo "== $(el) Qwen3-30B-A3B shape"
  bench_models 0; wait $models; cat /tmp/models.log
  [ "$PROFILE" = detail ] ||
    BENCH_SECONDS=300 bench_layer --shape qwen3-30b-a3b --tokens "${BENCH_TOKENS:-1,2,3,4,6,8,16,32}"
  # The K4 MUL1 8-row stage kernel's SASS (the Qwen3-30B-A3B build): its opcodes counted, the listing kept.
  if command -v cuobjdump > /dev/null; then
    cuobjdump -sass -fun '_ZN4exl34cuda5exl3k15exl3_moe_kernelILi4ELi2ELi1EEEvNS1_11MoeMmParamsE' $B/exl3 \
      > "$OUT/sass_moe_k4_mul1_bt1.txt" 2>&1
    echo "== $(el) SASS of exl3_moe_kernel<4, 2, 1>: $(grep -cE '^ +/\*[0-9a-f]{4}\*/' "$OUT/sass_moe_k4_mul1_bt1.txt") instructions"
    grep -E '^ +/\*[0-9a-f]{4}\*/' "$OUT/sass_moe_k4_mul1_bt1.txt" | sed -E 's/^ +\/\*[0-9a-f]+\*\/ +(@!?U?P[0-9T] +)?//' |
      awk '{ split($1, o, "."); n[o[1]]++ } END { for (k in n) printf "%s %d\n", k, n[k] }' | sort -k2 -nr | head -30 | tr '\n' ' '
    echo
  fi
  if command -v ncu > /dev/null; then
    steps="1 32"; [ "$PROFILE" = detail ] && steps=""
    for b in $steps; do
      echo "== $(el) the last step's kernels, batch $b (Nsight Compute, serialised)"
      OUT="$OUT/b$b" EXL3_BIN=$B/exl3 MODEL=/tmp/models/qwen3 BATCH=$b timeout 240 bash scripts/device_step_profile.sh |
        head -40
    done
    keys="exl3_moe_kernel|Duration|Throughput|Occupancy|Registers|Shared Memory|Block Size|Grid Size|Waves|[Ss]tall"
    keys="$keys|Issued|Eligible|Active Warps|Warp Cycles|Limit|[Bb]ank|Shared|L1|L2|DRAM"
    for b in ${PROFILE_DETAIL_BATCHES:-32 1}; do
      echo "== $(el) the first layer's stage kernels at batch $b in detail"
      timeout 200 ncu --nvtx --nvtx-include "exl3_bench_last_step/" -k regex:exl3_moe_kernel --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        $B/exl3 bench -m /tmp/models/qwen3 -d cuda -p 16 -b $b -c 512 -g 4 -r 1 \
        > "$OUT/ncu_moe_b$b.txt" 2>&1
      echo "exit $?"
      grep -vE "^==PROF==|^\| |^$" "$OUT/ncu_moe_b$b.txt" | grep -E "$keys" | head -90
    done
  else
    echo "no ncu on this machine"
  fi
  echo "== $(el) profile done"
  [ "${DECODE:-0}" = 1 ] || exit 0
fi

if [ "${QUICK:-0}" = 1 ]; then  # the layer's kernels only: tests, memcheck, the one-layer bench at decode sizes
  moe_tests '*MoeLayer*:MoeRouteSort*:*FamilyOps.Moe*' 300
  memcheck "$LAYER_MEMCHECK"
  bench_layer --shape qwen3-30b-a3b --tokens "${BENCH_TOKENS:-1,8,32}"
  test_summary; echo "== $(el) done"
  exit 0
fi

# TRACE=1 (with DECODE=1, where a build with -DEXL3_STEP_TRACE=ON packed bench/lab/step_trace_lab by pack_device.sh's
# LABS): the timeline of one decode step at TRACE_BATCHES (default 1,32), context 512, on the Qwen3-30B-A3B shape:
# each launch's share of the step on its critical path (tools/bench/step_trace.py; docs/kernels/exl3.md note 44).
trace_step() {
  [ "${TRACE:-0}" = 1 ] && [ -x $B/labs/step_trace_lab ] || return 0
  echo "== $(el) step timeline, batches ${TRACE_BATCHES:-1,32}"
  # The records stay here (tens of MB); the summaries go to $OUT (the device tool returns a few files only).
  timeout 120 $B/labs/step_trace_lab /tmp/models/qwen3 /tmp/st "${TRACE_BATCHES:-1,32}" 512 16 || return 0
  for b in $(echo "${TRACE_BATCHES:-1,32}" | tr , ' '); do
    python3 tools/bench/step_trace.py "/tmp/st.b$b.c512" --src src/backend/cuda > "$OUT/st_b$b.txt" 2>&1
    echo "-- batch $b"; head -60 "$OUT/st_b$b.txt"
  done
}

if [ "${TESTS_ONLY:-0}" = 1 ]; then  # DECODE=1's tests and memcheck alone (~1.5 minutes; no bench models)
  tiny_model
  moe_tests '*MoeLayer*:MoeRouteSort*:*FamilyOps.Moe*:CudaModel.Exl3Experts*:*OpsFixture.Gemv*' 240
  gen_tests
  bin_tests exl3_cuda_tp_tests 'CudaTensorParallel.Exl3Experts*'
  memcheck "$LAYER_MEMCHECK" 150
  test_summary; echo "== $(el) done"
  exit 0
fi

if [ "${DECODE:-0}" = 1 ]; then  # a decode change, before and after (see the header)
  echo "== $(el) random models (tiny for the tests; Qwen3-30B-A3B shape in the background)"
  tiny_model
  bench_models 0
  moe_tests '*MoeLayer*:MoeRouteSort*:*FamilyOps.Moe*:CudaModel.Exl3Experts*:*OpsFixture.Gemv*' 240
  gen_tests
  bin_tests exl3_cuda_tp_tests 'CudaTensorParallel.Exl3Experts*'
  [ "${DECODE_MEMCHECK:-}" = none ] ||
    memcheck "${DECODE_MEMCHECK:-Act/MoeLayer.WritesWithoutAccumulating/bf16:MoeRouteSort*}" 210
  wait $models; echo "== $(el) models done"; cat /tmp/models.log
  [ "${PROFILE:-0}" = 1 ] || bench_layer --shape qwen3-30b-a3b --tokens "${BENCH_TOKENS:-1,8,32}"
  if [ -d /tmp/models/qwen3 ]; then
    rm -f /tmp/rounds.txt  # this call's rounds only
    for v in $(for i in $(seq "${ROUNDS:-1}"); do echo ${DECODE_VARIANTS:-base new}; done); do
      x="$B/exl3"; [ $v != new ] && x="$B/$v/exl3"
      [ -x "$x" ] || { echo "no $x"; continue; }
      echo "== $(el) $v: exl3 bench -p 2048 -b ${DECODE_BATCHES:-1,32} -c 512 -g 64"
      timeout 150 "$x" bench -m /tmp/models/qwen3 -d cuda -p 2048 -b "${DECODE_BATCHES:-1,32}" -c 512 -g 64 > /tmp/b.log 2>&1
      echo "exit $?"; cat /tmp/b.log >> "$OUT/bench.log"
      grep -E "^memory plan|^ideal step|^\| [0-9]+ \||rror" /tmp/b.log
      # decode rows (8 columns: batch, context, ms, tok/s, ...) and prefill rows (5: tokens, time, tok/s, ...)
      awk -v v="$v" -F'|' 'NF == 10 && $2 ~ /^ *[0-9]+ *$/ { print v, "decode", $2 + 0, $5 + 0 }
        NF == 7 && $2 ~ /^ *[0-9]+ *$/ { print v, "prefill", $2 + 0, $4 + 0 }' /tmp/b.log >> /tmp/rounds.txt
    done
    # Each build's mean over the rounds, in the order of DECODE_VARIANTS.
    echo "== $(el) tok/s, mean of ${ROUNDS:-1} round(s)"
    awk '{ k = $1 " " $2 " " $3; if (!(k in n)) order[++m] = k; s[k] += $4; n[k]++ }
      END { for (i = 1; i <= m; ++i) { k = order[i]; printf "%s: %.1f\n", k, s[k] / n[k] } }' /tmp/rounds.txt
    trace_step
  fi
  test_summary; echo "== $(el) done"
  exit 0
fi

echo "== $(el) random models"
tiny_model
bench_models "$([ "${SKIP_MIXTRAL:-0}" = 1 ] && echo 0 || echo 1)"
moe_tests '*MoeLayer*:MoeRouteSort*:*FamilyOps.Moe*:*CudaExperts*:CudaModel.Exl3Experts*' 300
gen_tests
memcheck "$LAYER_MEMCHECK"

wait $models; echo "== $(el) models done"; cat /tmp/models.log
bench_layer --tokens 1,8,32,256,2048

for m in qwen3 mixtral; do
  [ -d /tmp/models/$m ] || continue
  args="-p 256,512,2048 -b 1,32 -c 512 -g 64"
  echo "== $(el) $m: exl3 bench $args"
  timeout 240 $B/exl3 bench -m /tmp/models/$m -d cuda $args > /tmp/bench_$m.log 2>&1
  echo "exit $?"; cat /tmp/bench_$m.log >> "$OUT/bench.log"
  grep -E "^experts:|^ideal step|^\| [0-9]+ \||error|Error" /tmp/bench_$m.log | head -12
  rm -rf /tmp/models/$m  # disk
done
test_summary; echo "== $(el) done"
