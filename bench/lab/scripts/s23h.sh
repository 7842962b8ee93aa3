#!/usr/bin/env bash
# Session 23 run H: the final binaries -- every CUDA test binary; tiny-target EXL3 with plain / n-gram / draft-model
# decoding (two rounds each; the Generator's timing); the random Llama-3-8B-shaped EXL3 model: bench batch 1 / 8 with
# the check step (`--check-rows 1,2,3,5,9`).
set -uo pipefail
mkdir -p /tmp/r1 /tmp/models && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1) &
for t in exl3_cuda_tests exl3_cuda_prefix_cache_tests exl3_cuda_kv_quant_tests exl3_cuda_sampler_tests exl3_cuda_generator_tests; do
  echo "== $t: $(/tmp/r1/$t 2>&1 | grep -E '^\[ *(FAILED|PASSED) |^\[  FAILED' | tr '\n' ' ')"
done
/tmp/r1/exl3_cuda_generator_tests --gtest_filter='*Speculative*' 2>&1 | grep -E "^  [a-zA-Z].*(jobs|differ|identical|proposed)"
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|decode steps' | sed 's/.*generated/generated/' | tr '\n' ' '; }
for r in 1 2; do
  echo "tiny-target EXL3 plain, round $r: $(run -m $M)"
  echo "tiny-target EXL3 --ngram, round $r: $(run -m $M --ngram)"
  echo "tiny-target EXL3 --draft-model tiny-draft, round $r: $(run -m $M --draft-model $D)"
done
wait; tail -1 /tmp/mk.log
/tmp/r1/exl3 bench -m /tmp/models/l8b -d cuda -p 16 -b 1,8 -c 512 -g 64 --check-rows 1,2,3,5,9 2>&1 | grep -E "^\| [0-9]+ \| 512 \||rror"
