#!/usr/bin/env bash
# Session 26 run A: bench/lab/cuda_wgmma_lab.cu with the int8-activation dp4a variants (the dot product on the integer
# pipe, no mma: IMAD + IDP4A a weight) beside the digit kernel's mix (two IMMA a tile); then their SASS.
set -uo pipefail
B=.device/lab/wgmma_lab
[ -x $B ] || { B=/tmp/wgmma_lab; nvcc -O3 -std=c++20 -arch=sm_90a -Isrc -o $B bench/lab/cuda_wgmma_lab.cu || exit 1; }
$B
bash scripts/device_sass.sh $B "wg_labILi9ELi1ELi1ELi3E" "wg_labILi0ELi1ELi1ELi3E"
