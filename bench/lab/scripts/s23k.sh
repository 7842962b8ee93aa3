#!/usr/bin/env bash
# Session 23 run K: the draft's stall with the draft model run without CUDA graphs (eager launches; the main model
# keeps its graphs): EXL3_LAB_DRAFT_NO_GRAPHS=1, a lab switch of that run's build (set EXL3_NO_GRAPHS=1 while the draft loaded; not kept).
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|draft rounds|decode steps' | sed 's/.*generated/generated/' | tr '\n' ' '; echo; }
for r in 1 2; do
echo "graphs: $(run -m $M --draft-model $D --draft-tokens 4)"
echo "draft eager: $(EXL3_LAB_DRAFT_NO_GRAPHS=1 run -m $M --draft-model $D --draft-tokens 4)"
done
echo "draft eager, 1 token: $(EXL3_LAB_DRAFT_NO_GRAPHS=1 run -m $M --draft-model $D --draft-tokens 1)"
