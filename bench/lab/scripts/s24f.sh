#!/usr/bin/env bash
# Session 24 run F: the final build (the draft's warm-up made best effort): every CUDA test binary carried, and the
# speculative runs of run E once more.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
for t in exl3_cuda_generator_tests exl3_cuda_tests; do
  echo "== $t: $(/tmp/r1/$t 2>&1 | grep -E '^\[ *(FAILED|PASSED) ' | tr '\n' ' ')"
done
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'prompt|speculative|catch-up' | sed 's/.*prompt/prompt/' | tr '\n' ' '; echo; }
for r in 1 2; do
  for a in "" "--ngram" "--draft-model $D"; do echo "[$a] round $r: $(run -m $M $a)"; done
done
