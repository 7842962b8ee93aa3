#!/usr/bin/env bash
# Packs binaries built here for scripts/device_dense.sh on the GPU machine: .device/r1/bins.tar.xz (+ the
# libcpp-httplib the exl3 binary links, which the GPU machine lacks).
# Usage: [BASE=path/to/an/earlier/exl3] bash scripts/pack_device.sh [BUILD_DIR (default build-90)] [TARGET ...]
#   default targets: exl3 and every CUDA test binary; e.g. add bench_cuda_gemv bench_cuda_attention
#   BASE: packed as base/exl3 in the same archive (a build of an earlier commit, for before/after runs such as
#   device_moe.sh's DECODE=1 and device_check.sh's proof; most of it compresses against this build's exl3)
#   LABS="path ...": lab programs, packed under labs/ (e.g. a trace build's step_trace_lab: device_moe.sh TRACE=1)
#   VARIANTS="name=path ...": more builds of exl3, each packed as name/exl3 (device_moe.sh's DECODE_VARIANTS)
set -euo pipefail
build=${1:-build-90}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(exl3 exl3_cuda_tests exl3_cuda_prefix_cache_tests exl3_cuda_kv_quant_tests
                                     exl3_cuda_sampler_tests exl3_cuda_generator_tests)
ninja -C "$build" "${targets[@]}" > /dev/null
tmp=$(mktemp -d)
for t in "${targets[@]}"; do cp "$(find "$build" -name "$t" -type f -perm -u+x | head -1)" "$tmp/"; done
if [ -n "${BASE:-}" ]; then mkdir -p "$tmp/base" && cp "$BASE" "$tmp/base/exl3"; fi
for l in ${LABS:-}; do mkdir -p "$tmp/labs" && cp "$l" "$tmp/labs/"; done
for v in ${VARIANTS:-}; do mkdir -p "$tmp/${v%%=*}" && cp "${v#*=}" "$tmp/${v%%=*}/exl3"; done
mkdir -p .device/r1
(cd "$tmp" && tar cf - -- *) | xz -T1 --lzma2=preset=6,dict=192MiB > .device/r1/bins.tar.xz
# The source folder the tests were built in (they read tests/models through it; device_tp.sh links it there).
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" > .device/r1/source_dir
# The build folder (the tests read the committed fixture extracts under its tests/shared_extract).
realpath "$build" > .device/r1/build_dir
lib=$(ldconfig -p | awk '/libcpp-httplib.so.0.11 /{print $NF; exit}')
[ -n "$lib" ] && cp "$lib" .device/r1/
rm -rf "$tmp"
du -sh .device/r1/*
