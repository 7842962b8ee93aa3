#!/usr/bin/env bash
# The families on the shared decoder, on the GPU machine in one go (binaries built on the Debian machine, sm_90):
#   1. golden models and logits from transformers for the families named in FAMILIES (tools/golden/make_golden.py),
#      put where the tests read them and packed into $OUT/golden.tgz to commit;
#   2. the CPU golden tests of every family (exl3_golden_tests, Families/*);
#   3. the CUDA test binaries carried (ops and family ops, attention with soft-capping, every family's model on
#      CUDA against the CPU), with tiny-target where it was carried;
#   4. with BENCH=1: speed at real shapes, random EXL3 weights at 4.0 bpw (tools/bench/make_random_model.py):
#      batch-1 decode and a 2048-token prefill, each beside its roofline, for Llama-3-8B and the families' shapes.
# Carried (git-ignored): $P/bins.tar.xz (new/), optionally $P/models.tar.xz (models/tiny-target laid out like
# ../shared) and $P/tinydraft.tar.xz (tests/models/tiny-draft, when it was left out of the tree to fit the call),
# libcpp-httplib.
# With MOE=1 random-trellis EXL3 models are made first: a Qwen3-MoE (qwen3-moe-tiny) for CudaModel.Exl3Experts* and
# a gpt-oss (gpt-oss-tiny: biased experts, the clamped SwiGLU on the grouped kernels) for CudaModel.Exl3GptOssMatchesCpu.
# GOLDEN picks the CPU golden tests (default Families/*:GptOss/*); CUDA_FILTER the tests of the CUDA binaries
# (default all); BENCH_ARGS the bench's flags.
# gpt-oss (issue 42): FAMILIES=gpt_oss,gpt_oss_mxfp4 makes both fixtures (transformers' bf16 experts, and the Hub's
# MXFP4 blocks dequantized by transformers), runs GptOss/* golden, the attention sink cases (PagedAttention sink_*),
# its CUDA tests (CudaExperts/*gpt_oss*, FamilyOps.SwigluClampMul) and FamilyConvert GptOss/* (exl3_convert_tests).
# Usage (device tool): [FAMILIES=a,b] [BENCH=1] [SHAPES="..."] [MOE=1] bash scripts/device_families.sh [P=.device/p3]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/p3
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/b /tmp/shared && xz -dc "$P/bins.tar.xz" | tar xf - -C /tmp/b
[ -f "$P/models.tar.xz" ] && xz -dc "$P/models.tar.xz" | tar xf - -C /tmp/shared
if [ -f "$P/tinydraft.tar.xz" ] && [ ! -f tests/models/tiny-draft/config.json ]; then
  xz -dc "$P/tinydraft.tar.xz" | tar xf -
fi
ls tests/models/tiny-draft | head -3
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=/tmp/shared
nvidia-smi --query-gpu=name --format=csv,noheader
SHAPES=${SHAPES:-"llama3-8b gemma3-12b mistral-small-24b phi4-14b"}
if [ "${BENCH:-0}" = 1 ]; then  # the random models in the background, on the GPU, while the tests run
  (for s in $SHAPES; do
     python3 tools/bench/make_random_model.py --shape $s --exl3-bits 4 --head-bits 6 --out /tmp/models/$s \
       > /tmp/model_$s.log 2>&1 || { echo "random model $s failed"; tail -3 /tmp/model_$s.log; }
   done) > /tmp/models.log 2>&1 &
  models=$!
fi
if [ -n "${FAMILIES:-}" ]; then
  echo "== golden models from transformers: $FAMILIES"
  timeout 300 python3 tools/golden/make_golden.py --only random --variants "$FAMILIES" --out /tmp/g 2>&1 \
    | grep -v "Writing model shards\|Loading weights" | tail -40
  mkdir -p tests/models/golden tests/fixtures/golden
  for d in /tmp/g/models/*; do rm -rf "tests/models/golden/$(basename "$d")"; cp -r "$d" tests/models/golden/; done
  cp /tmp/g/golden/*.safetensors tests/fixtures/golden/ 2>/dev/null
  (cd /tmp/g && tar czf "$OUT/golden.tgz" models golden)
fi
echo "== CPU golden tests of the families"
timeout 180 /tmp/b/new/exl3_golden_tests --gtest_filter="${GOLDEN:-Families/*:GptOss/*}" > /tmp/golden.log 2>&1; echo "exit $?"
grep -E "worst relative|^\[  (PASSED|FAILED) |^\[  FAILED  \]" /tmp/golden.log; cat /tmp/golden.log >> "$OUT/tests.log"
if [ "${MOE:-0}" = 1 ]; then
  python3 tools/bench/make_random_model.py --shape qwen3-moe-tiny --exl3-bits 4 --head-bits 6 --out /tmp/moe-tiny \
    > /tmp/moe_tiny.log 2>&1 && export EXL3_TEST_EXL3_MOE=/tmp/moe-tiny || tail -3 /tmp/moe_tiny.log
  python3 tools/bench/make_random_model.py --shape gpt-oss-tiny --exl3-bits 4 --head-bits 6 --out /tmp/gpt-oss-tiny \
    > /tmp/gpt_oss_tiny.log 2>&1 && export EXL3_TEST_EXL3_GPT_OSS=/tmp/gpt-oss-tiny || tail -3 /tmp/gpt_oss_tiny.log
fi
echo "== CUDA tests"
for t in exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests exl3_cuda_prefix_cache_tests \
         exl3_cuda_sampler_tests exl3_viterbi_cuda_tests exl3_convert_tests; do
  [ -x /tmp/b/new/$t ] || continue
  echo "== $t"
  timeout 300 /tmp/b/new/$t --gtest_filter="${CUDA_FILTER:-*}" > /tmp/$t.log 2>&1; echo "exit $?"
  cat /tmp/$t.log >> "$OUT/tests.log"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests" /tmp/$t.log | head -30
  grep -E "(golden/[a-z0-9_]+|all_experts_[a-z0-9_]+|moe-tiny|gpt-oss-tiny): (prefill|routed)|CUDA greedy|they part|bpw \((cuda|cpu) encoder|\[attn\] (cap|sink)_|invariant inv_sink|gpt-oss|GptOss" /tmp/$t.log | head -80
done
if [ "${BENCH:-0}" = 1 ]; then
  wait $models; cat /tmp/models.log
  for s in $SHAPES; do
    [ -d /tmp/models/$s ] || continue
    args=${BENCH_ARGS:-"-p 2048 -b 1 -c 512 -g 128"}
    echo "== $s: exl3 bench $args"
    timeout 300 /tmp/b/new/exl3 bench -m /tmp/models/$s -d cuda $args > /tmp/bench_$s.log 2>&1
    echo "exit $?"; cat /tmp/bench_$s.log >> "$OUT/bench.log"
    grep -E "^\| [0-9]+ \||ceiling|error|Error" /tmp/bench_$s.log | head -12
    rm -rf /tmp/models/$s  # disk
  done
fi
