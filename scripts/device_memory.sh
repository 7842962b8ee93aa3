#!/usr/bin/env bash
# Issue 46 on the GPU machine: the memory plan, a Llama-3-70B-shaped EXL3 model within --gpu-memory 23, offload.
# PARTS (comma-separated, default tests,fit):
#   tests    the CUDA memory tests (exl3_cuda_memory_tests: the embedding table on the host, chunked steps, streamed and
#            CPU-run layers, MoE blocks on the CPU, refusals, the load within its plan) and, when carried,
#            exl3_cuda_tests (the model tests: CUDA against the CPU);
#   fit      a random Llama-3-70B-shaped EXL3 model at BITS bpw (default 2.25; a mix of K = 2 and 3 per tensor), head
#            4 bits (tools/bench/make_random_model.py on the GPU, timed; reused when already made), its plan
#            (exl3 inspect --memory --gpu-memory 23 -c 16384 --kv-bits 4), and exl3 bench within --gpu-memory 23
#            with the KV cache the plan gives (4-bit KV, decode at 512 and 16k tokens of context, prefill 512 and
#            2048), each figure beside its roofline, with the nvidia-smi peak beside the plan's total;
#   offload  the same model with 10 % (8) and 30 % (24) of its layers offloaded: streamed over PCIe (beside the
#            measured pinned upload bandwidth) and run by the CPU threads.
# One bitrate per call: the 70B random model is ~20 GB to make and write. Calls, one each (about 5-8 minutes):
#   BITS=2.25 PARTS=tests,fit   BITS=2.25 PARTS=offload   BITS=2.5 PARTS=fit
# Carried (git-ignored): $P/bins.tar.xz from `bash scripts/pack_device.sh build/release exl3 exl3_cuda_memory_tests
# exl3_cuda_tests` then moved to $P (default .device/m46), and libcpp-httplib beside it.
# Usage (device tool): BITS=2.25 PARTS=tests,fit bash scripts/device_memory.sh [P=.device/m46]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/m46
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
BITS=${BITS:-2.25}
PARTS=${PARTS:-tests,fit}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/tmp/b46; mkdir -p $B
[ -x $B/exl3 ] || xz -dc "$P/bins.tar.xz" | tar xf - -C $B
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
has() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }

# Runs "$@" while sampling the GPU's used memory every 100 ms; prints the peak (MiB) after it.
peak() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > /tmp/smi.log 2>/dev/null &
  local smi=$!
  "$@"; local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "exit $rc; nvidia-smi peak $(sort -n /tmp/smi.log | tail -1) MiB"
}

if has tests; then
  for t in exl3_cuda_memory_tests exl3_cuda_tests; do
    [ -x $B/$t ] || continue
    echo "== $t"
    timeout 300 $B/$t > /tmp/$t.log 2>&1; echo "exit $?"
    cat /tmp/$t.log >> "$OUT/tests.log"
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests|against one step|on the CPU, worst|MoE blocks on the CPU|within 2 GiB" /tmp/$t.log | head -30
  done
fi

M=/tmp/models/l70-$BITS
if has fit || has offload; then
  if [ ! -f $M/config.json ]; then
    rm -rf /tmp/models/l70-*  # one at a time: the disk holds ~60 GB
    echo "== making a random Llama-3-70B-shaped model at $BITS bpw, head 4 bits"
    start=$(date +%s)
    python3 tools/bench/make_random_model.py --shape llama3-70b --exl3-bits $BITS --head-bits 4 --out $M 2>&1 | tail -2
    echo "made in $(( $(date +%s) - start )) s, $(du -sh $M | cut -f1)"
  fi
fi

if has fit; then
  # The bench's context: 16384 cached + 32 generated + 1 + 64 spare (exl3 bench sizes it so). The largest step
  # buffers with which a 16k cache fits: 512 tokens, else 256, else 128 (a 2.5 bpw 70B is tight).
  for step in 512 256 128; do
    echo "== the plan: exl3 inspect --memory --gpu-memory 23 -c 16481 --kv-bits 4 --max-step-tokens $step"
    $B/exl3 inspect --memory $M --gpu-memory 23 -c 16481 --kv-bits 4 --max-step-tokens $step > /tmp/plan.txt 2>&1
    rc=$?; cat /tmp/plan.txt | tee -a "$OUT/plan_$BITS.txt"
    [ $rc = 0 ] && break
  done
  echo "== exl3 bench within --gpu-memory 23, 4-bit KV, steps of $step tokens, the cache the plan gives"
  peak timeout 420 $B/exl3 bench -m $M -d cuda --gpu-memory 23 --kv-bits 4 --max-step-tokens $step -p 512,2048 -b 1 \
    -c 512,16384 -g 32 -r 2 > /tmp/bench_fit.log 2>&1
  cat /tmp/bench_fit.log >> "$OUT/bench_$BITS.log"
  grep -E "fits:|total |GiB of the device in use|memory plan:|ceilings|^\| [0-9]+ \||rror|refus" /tmp/bench_fit.log | head -30
fi

if has offload; then
  for n in 8 24; do
    echo "== offload $n of 80 layers, streamed"
    peak timeout 240 $B/exl3 bench -m $M -d cuda --gpu-memory 23 --kv-bits 4 --offload-layers $n -p 512 -b 1 -c 512 \
      -g 16 -r 1 > /tmp/bench_off.log 2>&1
    cat /tmp/bench_off.log >> "$OUT/bench_$BITS.log"
    grep -E "memory plan:|offload ceiling|GiB of the device in use|^\| [0-9]+ \||rror" /tmp/bench_off.log | head -12
  done
  for n in 8 24; do
    echo "== offload $n of 80 layers, run by the CPU ($(nproc) threads)"
    peak timeout 240 $B/exl3 bench -m $M -d cuda --gpu-memory 23 --kv-bits 4 --offload-layers $n --offload-mode cpu \
      -p 16 -b 1 -c 64 -g 4 -r 1 > /tmp/bench_cpu.log 2>&1
    cat /tmp/bench_cpu.log >> "$OUT/bench_$BITS.log"
    grep -E "memory plan:|GiB of the device in use|^\| [0-9]+ \||rror" /tmp/bench_cpu.log | head -12
  done
fi
