#!/usr/bin/env bash
# Every CUDA test binary on the GPU machine in one call (the proof that CUDA still passes after a change), from
# binaries built here for sm_90 and carried:
#   bash scripts/pack_device.sh build/release exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests \
#     exl3_cuda_prefix_cache_tests exl3_cuda_sampler_tests exl3_cuda_hybrid_tests exl3_cuda_memory_tests \
#     exl3_cuda_tp_tests exl3_gpu_quantizer_tests exl3_viterbi_cuda_tests exl3_convert_tests
# The golden fixtures (36 random-weight models and their transformers logits, ~45 MB) do not fit a call beside the
# binaries: they are made again there by tools/golden/make_golden.py (transformers 5.17, fixed seeds), compared with the
# committed files where those were carried, and put where the tests read them. Random-trellis EXL3 MoE models
# (qwen3-moe-tiny, gpt-oss-tiny) are made for the CudaModel.Exl3* tests. Prints each binary's verdict and failures;
# full logs in $OUT. About 6 minutes.
# Usage (device tool, timeout_s 600): bash scripts/device_all_tests.sh [P=.device/r1] [FILTER=gtest-filter]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/r1
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; FILTER=*) FILTER=${a#FILTER=} ;; esac; done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

echo "== $(el) golden fixtures from transformers (make_golden.py --only random)"
timeout 240 python3 tools/golden/make_golden.py --only random --out /tmp/g > "$OUT/golden.log" 2>&1 || tail -5 "$OUT/golden.log"
same=0; differ=0; new=0
mkdir -p tests/models/golden tests/fixtures/golden
for d in /tmp/g/models/*; do
  n=$(basename "$d")
  if [ -f "tests/models/golden/$n/model.safetensors" ]; then
    if cmp -s "$d/model.safetensors" "tests/models/golden/$n/model.safetensors"; then same=$((same + 1)); else differ=$((differ + 1)); echo "  $n: weights differ from the committed ones"; fi
  else
    new=$((new + 1))
  fi
  rm -rf "tests/models/golden/$n"; cp -r "$d" tests/models/golden/
done
cp /tmp/g/golden/*.safetensors tests/fixtures/golden/ 2>/dev/null
echo "  $(ls /tmp/g/models | wc -l) models: $same as committed, $differ differ, $new not carried (made here)"

B=/tmp/bins; . scripts/device_unpack.sh

echo "== $(el) random EXL3 MoE models"
python3 tools/bench/make_random_model.py --shape qwen3-moe-tiny --exl3-bits 4 --head-bits 6 --out /tmp/moe-tiny \
  > /tmp/moe_tiny.log 2>&1 && export EXL3_TEST_EXL3_MOE=/tmp/moe-tiny || tail -3 /tmp/moe_tiny.log
python3 tools/bench/make_random_model.py --shape gpt-oss-tiny --exl3-bits 4 --head-bits 6 --out /tmp/gpt-oss-tiny \
  > /tmp/gpt_oss_tiny.log 2>&1 && export EXL3_TEST_EXL3_GPT_OSS=/tmp/gpt-oss-tiny || tail -3 /tmp/gpt_oss_tiny.log

for t in exl3_cuda_tests exl3_cuda_hybrid_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests \
         exl3_cuda_prefix_cache_tests exl3_cuda_sampler_tests exl3_cuda_memory_tests exl3_cuda_tp_tests \
         exl3_gpu_quantizer_tests exl3_viterbi_cuda_tests exl3_convert_tests; do
  [ -x "$B/$t" ] || continue
  left=$((570 - ($(date +%s) - t0)))
  [ $left -lt 20 ] && { echo "== $t: skipped, no time left"; continue; }
  echo "== $(el) $t"
  timeout $(( left < 240 ? left : 240 )) "$B/$t" --gtest_filter="${FILTER:-*}" > "$OUT/$t.log" 2>&1; echo "exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ test" "$OUT/$t.log" \
    | grep -v "^\[  FAILED  \] .*, listed below" | head -30
done
echo "== done in $(el)"
