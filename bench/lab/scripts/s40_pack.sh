#!/usr/bin/env bash
# Packs what bench/lab/scripts/s40a.sh runs on the H200 into .device/k1 (git-ignored): the restructured build's CUDA
# test binaries, exl3 and benches (new/), the build before the change's bench_cuda_exl3 and exl3_cuda_tests (base/),
# the libcpp-httplib the exl3 binary links, the scripts, and the tiny EXL3 model the model tests load.
# Usage: bash bench/lab/scripts/s40_pack.sh NEW_BUILD_DIR BASE_BUILD_DIR
set -euo pipefail
new=$1 base=$2
tmp=$(mktemp -d)
mkdir -p "$tmp/new" "$tmp/base" .device/k1/shared/models
for t in exl3 exl3_cuda_tests exl3_cuda_prefix_cache_tests exl3_cuda_kv_quant_tests exl3_cuda_sampler_tests \
         exl3_cuda_generator_tests exl3_viterbi_cuda_tests bench_cuda_exl3 bench_cuda_attention; do
  cp "$(find "$new" -name "$t" -type f -perm -u+x | head -1)" "$tmp/new/"
done
for t in bench_cuda_exl3 exl3_cuda_tests; do cp "$(find "$base" -name "$t" -type f -perm -u+x | head -1)" "$tmp/base/"; done
(cd "$tmp" && tar cf - new base) | xz -T1 --lzma2=preset=6,dict=192MiB > .device/k1/bins.tar.xz
lib=$(ldconfig -p | awk '/libcpp-httplib.so.0.11 /{print $NF; exit}')
[ -n "$lib" ] && cp "$lib" .device/k1/
cp -r ../shared/models/tiny-target-exl3-4.0bpw .device/k1/shared/models/
cp bench/lab/scripts/s40a.sh bench/lab/scripts/sass_compare.py bench/lab/scripts/ptxas_compare.py .device/k1/
rm -rf "$tmp"
du -sh .device/k1/*
