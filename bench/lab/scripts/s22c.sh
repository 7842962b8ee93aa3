#!/usr/bin/env bash
# Session 22 run C: the tests at 99 KB after the PlansFit fix (the expectation follows the effective limit), and
# racecheck at 99 KB with cuBLAS's own kernels (nvjet: racecheck's known false reports) left out of the count.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== tests limit=101376: $(EXL3_SMEM_LIMIT=101376 /tmp/r1/exl3_cuda_tests 2>&1 | grep -E '^\[ *(FAILED|PASSED) |Failure' | head -8 | tr '\n' ' ')"
EXL3_SMEM_LIMIT=101376 timeout 300 compute-sanitizer --tool racecheck /tmp/r1/exl3_cuda_tests --gtest_filter='*RaggedShapes*' > /tmp/rc.log 2>&1
echo "== racecheck: $(grep -cE 'hazard' /tmp/rc.log) hazard lines, $(grep -E 'hazard' /tmp/rc.log | grep -vc nvjet) outside cuBLAS"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" /tmp/rc.log | head; grep hazard /tmp/rc.log | grep -v nvjet | head -5
