#!/usr/bin/env bash
# Session 27 run B: the ring's depth for K = 5-8, built. d4 = main now: the 1-16-row kernels keep >= 4 stages (K5-K8
# had 2-3 at 32 KB) and request only the 32 KB ring's stages before the grid-dependency wait, the rest once the
# activations have landed (EXL3_PRE_DEFER). Against r1 (the build before), m4 (>= 4 stages, whole ring before the
# wait; run A) and d6 (d4 with >= 6 stages, i.e. K4 too). The EXL3 CUDA tests on d4, the MUL1 anchor table (K4-K8),
# end to end on random Llama-3-8B EXL3 models at 4.0 / 5.0 / 6.0 bpw (6-bit head), three rounds.
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
(for b in 4 5 6; do python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits $b --head-bits 6 \
   --out /tmp/models/l8b$b > /tmp/m$b.log 2>&1 || echo "model $b failed"; done) &
echo "== tests (d4)"
/tmp/b/d4/exl3_cuda_tests 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -20
echo "== MUL1 anchor table (K4-K8)"
for v in r1 m4 d4 d6; do echo "-- $v"; timeout 60 /tmp/b/$v/bench_cuda_exl3 --codebook mul1 --ks 4,5,6,8 2>&1 | tail -8; done
wait
echo "== end to end"
for round in 1 2 3; do
  for m in l8b4 l8b5 l8b6; do
    for v in r1 d4 d6; do
      echo "-- $m $v"; timeout 40 /tmp/b/$v/exl3 bench -m /tmp/models/$m -d cuda -p 16 -b 1,8 -c 512 -g 64 2>&1 | tail -2
    done
  done
done
