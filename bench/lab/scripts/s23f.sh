#!/usr/bin/env bash
# Session 23 run F: run E found a CUDA draft model's catch-up round slow on the host (2.35 ms enqueue against 88 us
# for later rounds, tiny-draft proposing for tiny-target EXL3); the host's time in CudaModel::forward by phase
# (EXL3_FORWARD_TIMING=1) tells where.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_FORWARD_TIMING=1 EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|speculative|generator\]|cuda forward' | sed 's/.*generated/generated/'; echo; }
echo "== target, draft 4"; run -m $M --draft-model $D --draft-tokens 4
echo "== draft, itself 4"; run -m $D --draft-model $D --draft-tokens 4
