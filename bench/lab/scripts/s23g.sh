#!/usr/bin/env bash
# Session 23 run G: is the draft's slow catch-up launch (run F: ~1.3 ms in cudaGraphLaunch, tiny-draft after
# tiny-target EXL3's step) waiting for GPU work? A cudaDeviceSynchronize before it (EXL3_LAB_DRAFT_SYNC, a cudaDeviceSynchronize before round 0 in a lab build not kept) says.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'generated|generator\]' | sed 's/.*generated/generated/'; echo; }
echo "== target, draft 4"; run -m $M --draft-model $D --draft-tokens 4
echo "== target, draft 4, sync"; EXL3_LAB_DRAFT_SYNC, a cudaDeviceSynchronize before round 0 in a lab build not kept=1 run -m $M --draft-model $D --draft-tokens 4
echo "== target, draft 4, lazy loading off"; CUDA_MODULE_LOADING=EAGER run -m $M --draft-model $D --draft-tokens 4
