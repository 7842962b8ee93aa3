#!/usr/bin/env bash
# Session 23 run C: why a CUDA draft model's proposals are slow (run B: tiny-target EXL3 with tiny-draft proposing 4
# tokens, 606 tok/s against 4,679 plain) -- the Generator's timing of decode steps only, with graphs and without
# (EXL3_NO_GRAPHS=1), the model as its own draft, and the draft on the CPU.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|generator\]' | sed 's/.*generated/generated/' | tr '\n' ' '; }
echo "tiny-draft alone: $(run -m $D)"
echo "target plain: $(run -m $M)"
echo "target n-gram: $(run -m $M --ngram)"
for g in 1 4; do echo "target draft $g: $(run -m $M --draft-model $D --draft-tokens $g)"; done
echo "target draft 4, no graphs: $(EXL3_NO_GRAPHS=1 run -m $M --draft-model $D --draft-tokens 4)"
echo "target plain, no graphs: $(EXL3_NO_GRAPHS=1 run -m $M)"
echo "target, itself as draft 4: $(run -m $M --draft-model $M --draft-tokens 4)"
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader
