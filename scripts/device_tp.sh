#!/usr/bin/env bash
# Tensor parallelism (issue 47, docs/tensor-parallel.md) on the GPU machine, binaries built on the Debian machine
# (sm_90). Pack them first (here):
#   bash scripts/pack_device.sh build/release exl3 exl3_cuda_tests exl3_cuda_tp_tests bench_cuda_tp
#   tar cf - -C ../shared models/tiny-target-exl3-4.0bpw | xz -T2 > .device/r1/models.tar.xz    # optional (12 MB)
# (the tests' tiny EXL3 model, tiny-target-cut, comes from the committed extract: no need to carry it)
# and carry .device/r1 (git-ignored).
#
# STEP=one (one GPU, ~3 min, at most ~6.5 by its timeouts): every model's path is the sharded one now --
#   1. exl3_cuda_tp_tests: one rank equals the plain CUDA executor bit for bit (logits and device argmax), two and
#      three ranks on the one GPU (peer copies) match one rank, sliced EXL3 weights, experts, soft caps; EXL3
#      experts over two ranks (split: the grouped kernels; whole: the host-routed path) on a random Qwen3-MoE, and
#      its 600-token prefill (the host-routed prefill on each rank);
#   2. exl3_cuda_tests CudaModel.*: the models on CUDA against the CPU, through the sharded path;
#   3. "costs no speed": bench_cuda_tp paths on a random-trellis Llama-3-8B EXL3 4.0 bpw -- the plain executor
#      against the one-rank sharded one, prefill 2048 and decode batch 1 / 32 (ratio printed).
# On a machine of 2+ GPUs, in this order on the same warm machine (each under the 10-minute limit):
#   STEP=tests      exl3_cuda_tp_tests with NCCL (GpusOverNcclMatchOneGpu: logits, decode graphs, greedy up to
#                   near-ties), and the all-reduces of a Llama-3-70B step (bench_cuda_tp allreduce N 8192 80)
#   STEP=model      a random-trellis Llama-3-70B EXL3 4.0 bpw (head 6 bpw) in /tmp/tp/llama3-70b (~37 GB, ~4 min)
#   STEP=bench1     exl3 bench on one GPU: prefill 2048, decode batch 1 and 32 at a 512-token context
#   STEP=benchN     the same with --tensor-parallel N (N = GPUS, default all), and the speedups against bench1
#                   beside the issue's targets (decode >= 1.6x, prefill >= 1.8x on 2 GPUs)
# NCCL comes from the nvidia-nccl-cu13 Python package (its lib folder goes on LD_LIBRARY_PATH); NVLink multicast
# stays off (NCCL_NVLS_ENABLE=0; the engine sets it too).
# Usage (device tool): STEP=one bash scripts/device_tp.sh [P=.device/r1]
set -uo pipefail
P=.device/r1
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
STEP=${STEP:-one}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/tp
B=/tmp/tp/bin
t0=$(date +%s); el() { echo "[$(($(date +%s) - t0)) s]"; }
mkdir -p $B && xz -dc "$P/bins.tar.xz" | tar xf - -C $B
# The tests read tests/models through the source folder they were built in: link it to this checkout if it differs.
src=$(cat "$P/source_dir" 2>/dev/null)
if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
# The committed tiny-target-cut extract (its EXL3 model: sliced EXL3 over ranks) where the tests look for it.
bd=$(cat "$P/build_dir" 2>/dev/null)
if [ -n "$bd" ] && [ ! -d "$bd/tests/shared_extract/tiny-target-cut" ]; then
  mkdir -p "$bd/tests/shared_extract" && tar xJf tests/fixtures/shared_extract/tiny-target-cut.tar.xz -C "$bd/tests/shared_extract"
fi
if [ -f "$P/models.tar.xz" ] && [ ! -d /tmp/shared/models ]; then
  mkdir -p /tmp/shared && xz -dc "$P/models.tar.xz" | tar xf - -C /tmp/shared
fi
[ -d /tmp/shared/models ] && export EXL3_SHARED_DIR=/tmp/shared
nccl=$(python3 -c "import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=${nccl:+$nccl:}$PWD/$P:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
nvidia-smi --query-gpu=index,name,memory.free --format=csv,noheader
echo "NCCL: ${nccl:-not found (peer copies)}; GPUs: $GPUS; step: $STEP"
ARGS=${BENCH_ARGS:-"-p 2048 -b 1,32 -c 512 -g 128"}

run_test() {  # binary, filter, timeout
  echo "== $1 ${2:+--gtest_filter=$2}"
  timeout "${3:-300}" $B/$1 ${2:+--gtest_filter=$2} > /tmp/tp/$1.log 2>&1; echo "exit $?"
  cat /tmp/tp/$1.log >> "$OUT/tests.log"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|worst relative|greedy parts|tensor parallel:" /tmp/tp/$1.log \
    | head -60
}

case "$STEP" in
one)
  # The bench's 8B model is made in the background (GPU, ~1 min) while the tests run.
  if [ ! -d /tmp/tp/llama3-8b ]; then
    (python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/tp/llama3-8b \
      > /tmp/tp/model8b.log 2>&1 || echo "random model failed" >> /tmp/tp/model8b.log) &
  fi
  # EXL3 experts wide enough (256 columns) that two ranks' slices lie on the 128-blocks: the grouped MoE kernels
  # under tensor parallelism (CudaTensorParallel.Exl3ExpertsOverRanksOnOneGpu; device_moe.sh runs CudaModel's own).
  moe=
  python3 tools/bench/make_random_model.py --shape qwen3-moe-tiny --exl3-bits 4 --head-bits 6 \
    --set moe_intermediate_size=256 --out /tmp/tp/moe-tp > /tmp/tp/moe.log 2>&1 \
    && moe=/tmp/tp/moe-tp || tail -3 /tmp/tp/moe.log
  echo "$(el) models"
  EXL3_TEST_EXL3_MOE=$moe run_test exl3_cuda_tp_tests "" 120
  echo "$(el)"
  EXL3_TEST_EXL3_MOE= run_test exl3_cuda_tests "CudaModel.*" 120
  echo "$(el)"
  wait
  grep "failed" /tmp/tp/model8b.log && tail -3 /tmp/tp/model8b.log
  echo "== bench_cuda_tp paths (Llama-3-8B EXL3 4.0 bpw, random trellis)"
  timeout 120 $B/bench_cuda_tp paths /tmp/tp/llama3-8b 1 32 2>&1 | grep -v "^\[exl3 info\]" | tee -a "$OUT/bench.log"
  echo "$(el) done"
  ;;
tests)
  run_test exl3_cuda_tp_tests "" 400
  for n in 2 4 8; do
    [ "$n" -le "$GPUS" ] || continue
    echo "== bench_cuda_tp allreduce $n 8192 80 (Llama-3-70B: hidden 8192, 80 layers)"
    timeout 120 $B/bench_cuda_tp allreduce $n 8192 80 2>&1 | tee -a "$OUT/bench.log"
  done
  ;;
model)
  python3 tools/bench/make_random_model.py --shape llama3-70b --exl3-bits 4 --head-bits 6 --out /tmp/tp/llama3-70b \
    2>&1 | tail -2
  du -sh /tmp/tp/llama3-70b
  ;;
bench1 | benchN)
  [ -d /tmp/tp/llama3-70b ] || { echo "run STEP=model first (on this machine)"; exit 1; }
  n=1; [ "$STEP" = benchN ] && n=$GPUS
  echo "== exl3 bench $ARGS --tensor-parallel $n (Llama-3-70B EXL3 4.0 bpw)"
  timeout 560 $B/exl3 bench -m /tmp/tp/llama3-70b -d cuda $ARGS --tensor-parallel $n --json \
    > /tmp/tp/bench_tp$n.json 2> /tmp/tp/bench_tp$n.err; echo "exit $?"
  grep -E "tensor parallel|error|Error" /tmp/tp/bench_tp$n.err | head -5
  cp /tmp/tp/bench_tp$n.json "$OUT/"
  python3 - "$n" <<'EOF'
import json, os, sys
n = int(sys.argv[1])
def load(k):
    p = f"/tmp/tp/bench_tp{k}.json"
    return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None
cur, one = load(n), load(1)
if not cur:
    sys.exit("no bench output")
print(f"device {cur['device']}, bandwidth {cur['bandwidth_gb_s']:.0f} GB/s ({cur['bandwidth_source']})")
for r in cur["prefill"]:
    base = next((b for b in (one or {}).get("prefill", []) if b["tokens"] == r["tokens"]), None)
    sp = f", {r['tok_s'] / base['tok_s']:.2f}x one GPU (target >= 1.8x on 2)" if base and n > 1 else ""
    print(f"prefill {r['tokens']}: {r['tok_s']:.0f} tok/s, roofline {r.get('roofline_tok_s', 0):.0f}{sp}")
for r in cur["decode"]:
    base = next((b for b in (one or {}).get("decode", []) if b["batch"] == r["batch"]), None)
    sp = f", {r['tok_s'] / base['tok_s']:.2f}x one GPU" if base and n > 1 else ""
    tgt = " (target >= 1.6x on 2)" if sp and r["batch"] == 1 else ""
    print(f"decode batch {r['batch']} at {r['context']}: {r['ms_per_step']:.2f} ms/step, {r['tok_s']:.1f} tok/s, "
          f"roofline {r['roofline_tok_s']:.1f} ({100 * r['tok_s'] / r['roofline_tok_s']:.0f} %){sp}{tgt}")
EOF
  ;;
*) echo "STEP: one, tests, model, bench1 or benchN"; exit 2 ;;
esac
