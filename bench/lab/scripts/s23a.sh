#!/usr/bin/env bash
# Session 23 run A: speculative decoding on the H200 -- the CUDA generator tests (speculative greedy against plain,
# GPU against host sampling of the proposals' rows, captured uniform steps against eager ones), every other CUDA
# test binary (the graph key changed), then speed: tiny-target EXL3 with plain / n-gram / draft-model decoding, and
# the random Llama-3-8B-shaped EXL3 model (the bench's batch 1 / 8 as a regression check; `exl3 run` with and
# without n-gram proposals on a repeating prompt).
set -uo pipefail
mkdir -p /tmp/r1 /tmp/models && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1) &
echo "== generator tests"
/tmp/r1/exl3_cuda_generator_tests 2>&1 | grep -E "^\[ *(FAILED|PASSED|OK) |Failure|Expected|Which is|^  [a-zA-Z].*(jobs|differ|identical|proposed)" | head -60
for t in exl3_cuda_tests exl3_cuda_prefix_cache_tests exl3_cuda_kv_quant_tests exl3_cuda_sampler_tests; do
  echo "== $t: $(/tmp/r1/$t 2>&1 | grep -E '^\[ *(FAILED|PASSED) ' | tr '\n' ' ')"
done
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
for a in "" "--ngram" "--draft-model tests/models/tiny-draft"; do for r in 1 2; do
  echo "tiny-target EXL3 [$a] round $r: $(/tmp/r1/exl3 run -m $M --device cuda -p "$P" -n 256 --ignore-eos $a 2>&1 >/dev/null | grep -E 'generated|speculative' | sed 's/.*generated/generated/' | tr '\n' ' ')"
done; done
wait; tail -1 /tmp/mk.log
for r in 1 2; do
  echo "l8b bench round $r: $(/tmp/r1/exl3 bench -m /tmp/models/l8b -d cuda -p 16 -b 1,8 -c 512 -g 64 2>&1 | grep -E "^\| [0-9]+ \||rror" | cut -d'|' -f2,3,4 | tr '\n' ' ')"
done
T=$(python3 -c "print(','.join(str(1000 + (i * 7) % 11) for i in range(64)))")
for a in "" "--ngram" "--ngram --draft-tokens 8"; do for r in 1 2; do
  echo "l8b run [$a] round $r: $(/tmp/r1/exl3 run -m /tmp/models/l8b --device cuda --tokens $T -n 256 --ignore-eos --ids $a 2>&1 >/dev/null | grep -E 'generated|speculative' | sed 's/.*generated/generated/' | tr '\n' ' ')"
done; done
