#!/usr/bin/env bash
# Session 29 run C: every CUDA test binary of this session's build on the H200 (the checkout was recovered, so this
# proves main's kernels as built here), with the reference implementation's tiny EXL3 model carried for the model
# tests (the bf16 tiny-target and the tokenizers are not carried: the tests that need them skip).
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r2/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r2:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device/shared
for t in exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests exl3_cuda_prefix_cache_tests \
         exl3_cuda_sampler_tests; do
  echo "== $t"
  timeout 200 /tmp/b/f/$t 2>&1 | grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|tests ran' | head -20
done
