#!/usr/bin/env bash
# Session 26 run B: bench/lab/cuda_decode_lab.cu variants 18 / 19 -- the K = 4 extraction's four half-word states by
# IDP.2A on the IMAD pipe, for 3INST (variant 12, ALU-bound: a LOP3 a weight besides the extraction) and for the
# MUL1 digit mix (variant 17) -- then the SASS of 12 and 18.
set -uo pipefail
B=.device/lab/decode_lab
[ -x $B ] || { B=/tmp/decode_lab; nvcc -O3 -std=c++20 -arch=sm_90 -Isrc -o $B bench/lab/cuda_decode_lab.cu || exit 1; }
$B | head -28
bash scripts/device_sass.sh $B "decode_labILi20ELi3E" "decode_labILi12ELi3E" "decode_labILi18ELi3E"
