#!/usr/bin/env bash
# Session 23 run L: the CUDA generator tests with the graphs-against-eager speculative test extended to the bf16
# tiny-draft (several-row steps through cuBLAS, captured).
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
/tmp/r1/exl3_cuda_generator_tests 2>&1 | grep -E "^\[ *(FAILED|PASSED|OK) |Failure|Expected|Which is" | head -20
