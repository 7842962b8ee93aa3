#!/usr/bin/env bash
# Session 26 run C: 3INST / MCG in the 1-16-row kernel with one LOP3 a weight (both halves in one mma register against
# duplicated activations) and the half-word states by IDP.2A. Two calls (the binaries do not fit one carry):
#   s26c.sh before   .device/before: main before the change (bench_cuda_exl3, exl3)
#   s26c.sh r1       .device/r1: after (+ exl3_cuda_tests, run first)
# Each: the anchor table for 3INST and MCG (MUL1 after), then a random Llama-3-8B 3INST model (4.0 bpw, 6-bit head)
# end to end, two rounds.
set -uo pipefail
d=$1
mkdir -p /tmp/$d && xz -dc .device/$d/bins.tar.xz | tar xf - -C /tmp/$d
export LD_LIBRARY_PATH=$PWD/.device/$d:${LD_LIBRARY_PATH:-}
if [ -x /tmp/$d/exl3_cuda_tests ]; then
  echo "== tests"
  /tmp/$d/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -40
  /tmp/$d/exl3_cuda_tests --gtest_filter='Exl3Cuda.ThreeInstAndMcgMatchCpuForEveryK' 2>&1 | grep 'max err' |
    sort -k17 -g | tail -3
fi
python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --codebook 3inst \
  --out /tmp/models/l8b3 > /tmp/model.log 2>&1 || { echo "model failed"; tail -5 /tmp/model.log; }
echo "== anchor table ($d)"
for cb in 3inst mcg; do echo "-- $cb"; /tmp/$d/bench_cuda_exl3 --codebook $cb 2>&1 | tail -11; done
[ $d = r1 ] && { echo "-- mul1"; /tmp/$d/bench_cuda_exl3 --codebook mul1 2>&1 | tail -11; }
echo "== end to end, 3INST ($d)"
for round in 1 2; do /tmp/$d/exl3 bench -m /tmp/models/l8b3 -d cuda -p 16 -b 1,8 -c 512 -g 128 2>&1 | tail -6; done
