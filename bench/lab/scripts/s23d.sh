#!/usr/bin/env bash
# Session 23 run D: the check step of the bf16 tiny-draft and the EXL3 tiny-target (`exl3 bench --check-rows`),
# with captured graphs and without -- is a two-row step of a bf16 model slow (run C: a CUDA draft round of tiny-draft
# cost ~1 ms where its plain step costs 124 us)?
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
for m in tests/models/tiny-draft .device/models/tiny-target-exl3-4.0bpw; do for g in 0 1; do
  echo "== $m no_graphs=$g"
  EXL3_NO_GRAPHS=$g /tmp/r1/exl3 bench -m $m -d cuda -p 16 -b 1 -c 64 -g 64 --check-rows 1,2,3,5 2>&1 | grep -E "^\| 1 \| 64 \||rror"
done; done
P="The old lighthouse keeper climbed the stairs every night. He"
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|generator\]' | sed 's/.*generated/generated/' | tr '\n' ' '; }
echo "tiny-draft, itself as draft 1: $(run -m tests/models/tiny-draft --draft-model tests/models/tiny-draft --draft-tokens 1)"
echo "tiny-draft, itself as draft 1, no graphs: $(EXL3_NO_GRAPHS=1 run -m tests/models/tiny-draft --draft-model tests/models/tiny-draft --draft-tokens 1)"
