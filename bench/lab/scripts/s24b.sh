#!/usr/bin/env bash
# Session 24 run B: is the CUDA draft model's launch stall (session 23, runs E-K) a local-memory resize? The same
# speculative run with the driver told to keep local memory at its largest size (EXL3_LMEM_MAX=1:
# cudaSetDeviceFlags(cudaDeviceLmemResizeToMax) before the context is active) or with a larger stack limit
# (EXL3_STACK), against the default -- knobs of that run's build in CudaContext::create, not kept (no effect);
# then which of our kernels use a stack (cuobjdump -res-usage).
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
P="The old lighthouse keeper climbed the stairs every night. He"
M=.device/models/tiny-target-exl3-4.0bpw
D=tests/models/tiny-draft
run() { EXL3_GENERATOR_TIMING=1 /tmp/r1/exl3 run --device cuda -p "$P" -n 256 --ignore-eos "$@" 2>&1 >/dev/null | grep -E 'lab:|generated|draft rounds|decode steps' | sed 's/.*generated/generated/' | tr '\n' ' '; echo; }
for r in 1 2; do
echo "plain: $(run -m $M)"
echo "default: $(run -m $M --draft-model $D --draft-tokens 4)"
echo "lmem max: $(EXL3_LMEM_MAX=1 run -m $M --draft-model $D --draft-tokens 4)"
echo "stack 8192: $(EXL3_STACK=8192 run -m $M --draft-model $D --draft-tokens 4)"
done
cuobjdump -res-usage /tmp/r1/exl3 2>/dev/null | grep -B1 -E 'STACK:[1-9]' | grep -oE 'Function [^:]+:|STACK:[0-9]+|LOCAL:[0-9]+' | paste - - - | sort -t: -k3 -n | tail -15
for l in /usr/local/cuda/lib64/libcublasLt.so.13 /usr/local/cuda/lib64/libcublas.so.13; do
  [ -f $l ] && echo "$l kernels with a stack: $(cuobjdump -res-usage $l 2>/dev/null | grep -cE 'STACK:[1-9]')"
done
