#!/usr/bin/env bash
# Session 24 run C: the draft model's catch-up round -- its enqueue time round by round (a lab print of this build:
# min / median / p90 / max and the first rounds) and each model's graph captures (EXL3_FORWARD_TIMING=1), with graphs
# and without (EXL3_NO_GRAPHS=1), to tell one-off graph captures from a stall every round.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 EXL3_FORWARD_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" "$@" --ignore-eos 2>&1 >/dev/null | grep -E 'generated|draft rounds|decode steps|catch-up|cuda forward' | sed 's/.*generated/generated/'; echo; }
echo "== graphs, 256 tokens"; run -m $M --draft-model $D --draft-tokens 4 -n 256
echo "== graphs, 1024 tokens"; run -m $M --draft-model $D --draft-tokens 4 -n 1024
echo "== no graphs, 256 tokens"; EXL3_NO_GRAPHS=1 run -m $M --draft-model $D --draft-tokens 4 -n 256
echo "== self-draft (EXL3 for EXL3), graphs"; run -m $M --draft-model $M --draft-tokens 4 -n 256
