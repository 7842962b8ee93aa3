#!/usr/bin/env bash
# Session 23 run E: a CUDA draft round split into the host's enqueue and its wait, round 0 (the catch-up after the
# main model's step) against later rounds: tiny-draft proposing for tiny-target EXL3, and tiny-draft for itself.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|generator\]' | sed 's/.*generated/generated/' | tr '\n' ' '; echo; }
echo "target, draft 4: $(run -m $M --draft-model $D --draft-tokens 4)"
echo "target, draft 4, 1 thread: $(run -m $M --draft-model $D --draft-tokens 4 -t 1)"
echo "draft, itself 4: $(run -m $D --draft-model $D --draft-tokens 4)"
echo "target, itself 4: $(run -m $M --draft-model $M --draft-tokens 4)"
echo "draft, target as draft 4: $(run -m $D --draft-model $M --draft-tokens 4)"
