#!/usr/bin/env bash
# Session 23 run B: after the draft model's greedy picks moved to the GPU (only the ids come back) -- the CUDA
# generator tests again; tiny-target EXL3 with plain / n-gram / draft-model decoding with the Generator's timing
# (EXL3_GENERATOR_TIMING=1: where a step's time goes), draft tokens 1 / 2 / 4; tiny-draft alone (its own step);
# the random Llama-3-8B-shaped EXL3 model's check step (`exl3 bench --check-rows`: R tokens a sequence).
set -uo pipefail
mkdir -p /tmp/r1 /tmp/models && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1) &
echo "== generator tests"
/tmp/r1/exl3_cuda_generator_tests 2>&1 | grep -E "^\[ *(FAILED|PASSED) |Failure|Expected|Which is|^  [a-zA-Z].*(jobs|differ|identical|proposed)" | head -30
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|generator\]' | sed 's/.*generated/generated/' | tr '\n' ' '; }
echo "tiny-draft alone: $(run -m tests/models/tiny-draft)"
for a in "" "--ngram" "--draft-model tests/models/tiny-draft --draft-tokens 1" "--draft-model tests/models/tiny-draft --draft-tokens 2" "--draft-model tests/models/tiny-draft"; do
  echo "tiny-target EXL3 [$a]: $(run -m $M $a)"
done
wait; tail -1 /tmp/mk.log
for r in 1 2; do
  /tmp/r1/exl3 bench -m /tmp/models/l8b -d cuda -p 16 -b 1,8 -c 512 -g 64 --check-rows 1,2,3,5,9 2>&1 | grep -E "^\| [0-9]+ \| 512 \||rror"
done
