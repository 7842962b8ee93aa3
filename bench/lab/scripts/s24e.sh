#!/usr/bin/env bash
# Session 24 run E: the draft's warm-up with a prompt-shaped forward as well (run D's one-token warm-up left the first
# catch-up at ~116 ms): the catch-up rounds' distribution again, and the first prompt's time of a bf16 model (does
# its first cuBLAS GEMM cost the same?).
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== generator tests: $(/tmp/r1/exl3_cuda_generator_tests 2>&1 | grep -E '^\[ *(FAILED|PASSED) ' | tr '\n' ' ')"
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'prompt|speculative|draft rounds|decode steps|catch-up' | sed 's/.*prompt/prompt/' | tr '\n' ' '; echo; }
for r in 1 2; do
  for a in "" "--ngram" "--draft-model $D"; do echo "[$a] round $r: $(run -m $M $a)"; done
done
for r in 1 2; do echo "tiny-draft bf16 alone, round $r: $(run -m $D)"; done
