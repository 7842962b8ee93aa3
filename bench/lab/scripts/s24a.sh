#!/usr/bin/env bash
# Session 24 run A: bench/lab/cuda_wgmma_lab.cu (nvcc -O3 -std=c++20 -arch=sm_90a -Isrc; carried in .device/lab, or
# built on the device when not carried) -- the decode's instruction ceiling with synchronous IMMA, without any mma,
# and with the products as the register A operand of wgmma; then the SASS of the wgmma variants.
set -uo pipefail
B=.device/lab/wgmma_lab
[ -x $B ] || { B=/tmp/wgmma_lab; nvcc -O3 -std=c++20 -arch=sm_90a -Isrc -o $B bench/lab/cuda_wgmma_lab.cu || exit 1; }
$B
cuobjdump -sass $B > /tmp/all.sass 2>/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; cp /tmp/all.sass "$OUT/wgmma_lab.sass"
bash scripts/device_sass.sh $B "wg_labILi3ELi2ELi1ELi3E" "wg_labILi6ELi1ELi1ELi3E" "wg_labILi4ELi1ELi1ELi3E"
