#!/usr/bin/env bash
# Session 23 run J: the ~1.3 ms host stall at a CUDA draft model's first launch after the main model's step (runs
# E-G: tiny-draft after tiny-target EXL3; graphs only -- eager steps do not show it): is it the main model's cluster
# launches (EXL3_CLUSTER=0) or its dual-grid kernels (EXL3_DUAL=0)?
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|draft rounds' | sed 's/.*generated/generated/' | tr '\n' ' '; echo; }
echo "default: $(run -m $M --draft-model $D --draft-tokens 4)"
echo "EXL3_CLUSTER=0: $(EXL3_CLUSTER=0 run -m $M --draft-model $D --draft-tokens 4)"
echo "EXL3_DUAL=0: $(EXL3_DUAL=0 run -m $M --draft-model $D --draft-tokens 4)"
echo "both: $(EXL3_CLUSTER=0 EXL3_DUAL=0 run -m $M --draft-model $D --draft-tokens 4)"
echo "plain, EXL3_CLUSTER=0: $(EXL3_CLUSTER=0 run -m $M)"
