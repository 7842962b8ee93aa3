#!/usr/bin/env bash
# Session 24 run D: the draft model warmed up when the Generator is created (its one-off first-forward costs out of
# the first decode step): the CUDA generator tests, then tiny-target EXL3 plain / n-gram / draft model, two rounds,
# with the generator's timing (catch-up rounds' distribution), and with --cache-tokens passed to the draft.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== generator tests"
/tmp/r1/exl3_cuda_generator_tests 2>&1 | grep -E "^\[ *(FAILED|PASSED|OK) |Failure|Expected|Which is" | head -30
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|draft rounds|decode steps|catch-up' | sed 's/.*generated/generated/' | tr '\n' ' '; echo; }
for r in 1 2; do
  for a in "" "--ngram" "--draft-model $D"; do echo "[$a] round $r: $(run -m $M $a)"; done
done
echo "[--draft-model, --cache-tokens 4096 -c 2048]: $(run -m $M --draft-model $D --cache-tokens 4096 -c 2048)"
