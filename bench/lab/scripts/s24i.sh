#!/usr/bin/env bash
# Session 24 runs I and L: JSON mode on the H200 -- the CUDA generator tests (JsonModeOnTheGpu: greedy JSON jobs
# identical with the first draw on the GPU or on the host, seeded ones objects or their start), `exl3 run --json` on
# the EXL3 tiny-target, and with PY=1 the Python module's tests with the model on CUDA.
set -uo pipefail
mkdir -p /tmp/r1 /tmp/py && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== JSON mode test:"
/tmp/r1/exl3_cuda_generator_tests --gtest_filter='*Json*' 2>&1 | grep -E '^\[ *(FAILED|PASSED|OK) |Failure|Expected|Which is|JSON job' | cut -c1-200 | head -40
for t in exl3_cuda_generator_tests; do
  echo "== $t: $(/tmp/r1/$t 2>&1 | grep -E '^\[ *(FAILED|PASSED) ' | tr '\n' ' ')"
done
M=.device/models/tiny-target-exl3-4.0bpw
for a in "" "--temperature 0.8 --seed 3"; do
  echo "== exl3 run --json $a:"
  /tmp/r1/exl3 run -m $M --device cuda -p "A lighthouse, as JSON:" -n 200 --json $a 2>&1 | tail -3 | cut -c1-400
done
if [ -f .device/py/py.tar.xz ] && [ "${PY:-0}" = 1 ]; then
  tar xJf .device/py/py.tar.xz -C /tmp/py
  PYTHONPATH=/tmp/py EXL3_TEST_DEVICE=cuda python3 tests/python/test_exl3.py 2>&1 | tail -4
fi
