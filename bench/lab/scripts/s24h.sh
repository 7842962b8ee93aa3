#!/usr/bin/env bash
# Session 24 run H: the two decode labs after their timing moved into bench/lab/lab_timer.cuh (same figures expected as
# run A and the session-10 table).
set -uo pipefail
.device/lab/wgmma_lab | head -12
.device/lab/bench_cuda_decode_lab | grep -E '^(0 |14 |17 )'
