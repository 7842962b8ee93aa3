#!/usr/bin/env bash
# Issue 46 on the GPU machine, in one call of under ten minutes: the CUDA memory tests, the merged MoE / gpt-oss CUDA
# tests, a Llama-3-70B-shaped EXL3 model within --gpu-memory 23 at 2.25 and 2.5 bpw, and offload 10 % / 30 %.
# PARTS (comma-separated, default tests,fit,offload):
#   tests    the CUDA memory tests (exl3_cuda_memory_tests: the embedding table on the host, chunked steps, streamed and
#            CPU-run layers, MoE blocks on the CPU, refusals, the load within its plan, a resident, a streamed and a
#            CPU-run model's steps within theirs; with a random EXL3 Qwen3-MoE,
#            made here, for the grouped kernels beside offload: streamed MoE layers, one MoE block on the CPU beside
#            grouped ones, its load within its plan) and exl3_cuda_tests filtered by CUDA_FILTER (default: the model
#            tests, CUDA against the CPU with every weight through the placer -- the golden families' MatchCpu, the
#            MoE golden models, gpt_oss and gpt_oss_mxfp4 among them; a random EXL3 gpt-oss made here, its biased
#            experts and clamped SwiGLU on the grouped kernels, CudaModel.Exl3GptOssMatchesCpu, and host-routed in a
#            long prefill (main's 512+ token steps), CudaModel.Exl3GptOssLongPrefillMatchesCpu, beside the Qwen3-MoE's
#            Exl3ExpertsLongPrefillMatchesCpu; the clamped SwiGLU's ops against the CPU reference:
#            FamilyOps.SwigluClampMul, MoeLayer.MatchesCpuBiasesAndActivations), and exl3_gpu_quantizer_tests'
#            CalibForwardCuda (the converter's calibration forward on the GPU, its layers uploaded through an
#            OwnPlacer: tiny-draft and the golden gpt-oss, whose experts' biases and clamped SwiGLU it now runs);
#   fit      for each bit rate in BITS (default 2.25,2.5): a random Llama-3-70B-shaped EXL3 model, a mix of K = 2 and
#            3 per tensor, head 4 bits (tools/bench/make_random_model.py on the GPU, timed; reused when already made;
#            the disk holds one at a time), its plan (exl3 inspect --memory --gpu-memory 23 -c 16481 --kv-bits 4), and
#            exl3 bench within --gpu-memory 23 with the KV cache the plan gives (4-bit KV, decode at 512 and 16k tokens
#            of context, prefill 512 and 2048), each figure beside its roofline, the nvidia-smi peak beside the plan's
#            total. A bit rate starts only while FIT_MIN seconds (default 150) of the call's LIMIT are left;
#   offload  the model on the disk (the last bit rate's) with 10 % (8) and 30 % (24) of its layers offloaded: streamed
#            over PCIe (beside the measured pinned upload bandwidth) and run by the CPU threads.
# Every step's timeout is cut to what is left of LIMIT seconds (default 550); a step with less than 30 s left is
# skipped and says so (the last parts first: the offload runs, then the second bit rate).
# Carried (git-ignored): $P/bins.tar.xz from `bash scripts/pack_device.sh build/release exl3 exl3_cuda_memory_tests
# exl3_cuda_tests exl3_gpu_quantizer_tests` (it writes .device/r1, the default P), libcpp-httplib beside it.
# Usage (device tool, timeout_s 600): bash scripts/device_memory.sh [P=.device/r1]
#   (PARTS=offload BITS=2.5 etc. for a part alone)
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/r1
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
BITS=${BITS:-2.25,2.5}
PARTS=${PARTS:-tests,fit,offload}
LIMIT=${LIMIT:-550}
FIT_MIN=${FIT_MIN:-150}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/tmp/b46; mkdir -p $B
[ -x $B/exl3 ] || xz -dc "$P/bins.tar.xz" | tar xf - -C $B
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
has() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
GPT_OSS_OPS="*FamilyOps.SwigluClampMul*:*MoeLayer.MatchesCpuBiasesAndActivations*"
SUMMARY="(moe-tiny|gpt-oss-tiny|gpt_oss[a-z0-9_]*): (prefill|routed)|against one step|on the CPU, worst|MoE block|within 2 GiB|prefill worst|routed experts"
BENCH_LINES="memory plan:|GiB of the device in use|^\| [0-9]+ \||rror|skipped|nvidia-smi peak"

# The smaller of $1 and the seconds left of LIMIT (less 10 for the summary); 0 when under 30 are left.
budget() {
  local left=$((LIMIT - SECONDS - 10))
  [ $left -lt 30 ] && { echo 0; return; }
  echo $(( left < $1 ? left : $1 ))
}
# Runs "$@" under `timeout $1` cut to the budget, or says it was skipped.
run_for() {
  local t; t=$(budget "$1"); shift
  [ "$t" = 0 ] && { echo "skipped (no time left of ${LIMIT} s): $*"; return 124; }
  timeout "$t" "$@"
}

# Runs "$@" while sampling the GPU's used memory every 100 ms; prints the peak (MiB) after it.
peak() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > /tmp/smi.log 2>/dev/null &
  local smi=$!
  "$@"; local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "exit $rc; nvidia-smi peak $(sort -n /tmp/smi.log | tail -1) MiB"
}

if has tests; then
  if [ ! -f /tmp/models/moe-tiny/config.json ]; then
    python3 tools/bench/make_random_model.py --shape qwen3-moe-tiny --exl3-bits 4 --head-bits 6 \
      --out /tmp/models/moe-tiny > /tmp/moe_tiny.log 2>&1 || tail -3 /tmp/moe_tiny.log
  fi
  [ -f /tmp/models/moe-tiny/config.json ] && export EXL3_TEST_EXL3_MOE=/tmp/models/moe-tiny
  if [ ! -f /tmp/models/gpt-oss-tiny/config.json ]; then
    python3 tools/bench/make_random_model.py --shape gpt-oss-tiny --exl3-bits 4 --head-bits 6 \
      --out /tmp/models/gpt-oss-tiny > /tmp/gpt_oss_tiny.log 2>&1 || tail -3 /tmp/gpt_oss_tiny.log
  fi
  [ -f /tmp/models/gpt-oss-tiny/config.json ] && export EXL3_TEST_EXL3_GPT_OSS=/tmp/models/gpt-oss-tiny
  for t in exl3_cuda_memory_tests exl3_cuda_tests exl3_gpu_quantizer_tests; do
    [ -x $B/$t ] || continue
    filter='*'
    [ $t = exl3_cuda_tests ] && filter=${CUDA_FILTER:-CudaModel.*:*CudaFamilies.MatchCpu*:*CudaExperts.*:$GPT_OSS_OPS}
    [ $t = exl3_gpu_quantizer_tests ] && filter='*CalibForwardCuda*'
    echo "== $t ($filter)"
    run_for 150 $B/$t --gtest_filter="$filter" > /tmp/$t.log 2>&1; echo "exit $?"
    cat /tmp/$t.log >> "$OUT/tests.log"
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests|$SUMMARY" /tmp/$t.log | head -30
    # The calibration forward: each model's worst Hessian and state errors against the CPU.
    awk '/Hessian rel. error/ { m = $1; e = $(NF - 2) + 0; st = $NF; sub(/\)/, "", st); st += 0;
           if (e > he[m]) he[m] = e; if (st > se[m]) se[m] = st }
         END { for (m in he) printf "  calibration forward %s: worst Hessian %.2e, worst state %.2e\n", m, he[m], se[m] }' \
      /tmp/$t.log
  done
fi

# The model of one bit rate in $M (made when missing; one at a time on the disk).
make_70b() {
  M=/tmp/models/l70-$1
  [ -f $M/config.json ] && return 0
  rm -rf /tmp/models/l70-*
  echo "== making a random Llama-3-70B-shaped model at $1 bpw, head 4 bits"
  local start=$(date +%s)
  run_for 240 python3 tools/bench/make_random_model.py --shape llama3-70b --exl3-bits $1 --head-bits 4 --out $M 2>&1 \
    | tail -2
  echo "made in $(( $(date +%s) - start )) s, $(du -sh $M | cut -f1)"
  [ -f $M/config.json ]
}

if has fit; then
  for bits in ${BITS//,/ }; do
    left=$((LIMIT - SECONDS))
    if [ $left -lt $FIT_MIN ]; then
      echo "== $bits bpw: skipped, $left s of $LIMIT left (FIT_MIN $FIT_MIN)"
      continue
    fi
    make_70b $bits || { echo "no model at $bits bpw"; continue; }
    # The bench's context: 16384 cached + 32 generated + 1 + 64 spare (exl3 bench sizes it so). The largest step
    # buffers with which a 16k cache fits: 512 tokens, else 256, else 128 (a 2.5 bpw 70B is tight).
    for step in 512 256 128; do
      echo "== $bits bpw, the plan: exl3 inspect --memory --gpu-memory 23 -c 16481 --kv-bits 4 --max-step-tokens $step"
      $B/exl3 inspect --memory $M --gpu-memory 23 -c 16481 --kv-bits 4 --max-step-tokens $step > /tmp/plan.txt 2>&1
      rc=$?; cat /tmp/plan.txt | tee -a "$OUT/plan_$bits.txt"
      [ $rc = 0 ] && break
    done
    echo "== $bits bpw: exl3 bench within --gpu-memory 23, 4-bit KV, steps of $step tokens, the cache the plan gives"
    peak run_for 200 $B/exl3 bench -m $M -d cuda --gpu-memory 23 --kv-bits 4 --max-step-tokens $step -p 512,2048 \
      -b 1 -c 512,16384 -g 32 -r 2 > /tmp/bench_fit.log 2>&1
    cat /tmp/bench_fit.log >> "$OUT/bench_$bits.log"
    grep -E "fits:|total |ceilings|refus|$BENCH_LINES" /tmp/bench_fit.log | head -30
  done
fi

if has offload; then
  M=$(ls -d /tmp/models/l70-*/config.json 2>/dev/null | head -1); M=${M%/config.json}
  if [ -z "$M" ]; then bits=${BITS%%,*}; make_70b $bits || exit 1; else bits=${M##*/l70-}; fi
  for n in 8 24; do
    echo "== $bits bpw, offload $n of 80 layers, streamed"
    peak run_for 150 $B/exl3 bench -m $M -d cuda --gpu-memory 23 --kv-bits 4 --offload-layers $n -p 512 -b 1 -c 512 \
      -g 16 -r 1 > /tmp/bench_off.log 2>&1
    cat /tmp/bench_off.log >> "$OUT/bench_$bits.log"
    grep -E "offload ceiling|$BENCH_LINES" /tmp/bench_off.log | head -12
  done
  for n in 8 24; do
    echo "== $bits bpw, offload $n of 80 layers, run by the CPU ($(nproc) threads)"
    peak run_for 150 $B/exl3 bench -m $M -d cuda --gpu-memory 23 --kv-bits 4 --offload-layers $n --offload-mode cpu \
      -p 16 -b 1 -c 64 -g 4 -r 1 > /tmp/bench_cpu.log 2>&1
    cat /tmp/bench_cpu.log >> "$OUT/bench_$bits.log"
    grep -E "$BENCH_LINES" /tmp/bench_cpu.log | head -12
  done
fi
echo "== done in $SECONDS s"
