#!/usr/bin/env bash
# The hybrid models (issue 45: Qwen3-Next, Qwen3.5, Qwen3.5-MoE and the two Qwen3.5 multimodal wrappers) on the GPU
# machine in one short call:
#   1. their random-weight golden models and logits from transformers (tools/golden/make_golden.py; the reference runs
#      in float32 on the CPU), put where the tests read them (tests/models/golden, tests/fixtures/golden) and packed
#      into $OUT/golden_hybrid.tgz to commit (untar it at the repository root);
#   2. where the binaries were carried: the CPU golden tests of the hybrids (exl3_golden_tests Hybrid/PendingModels) and
#      exl3 convert of each at 4.0 bpw (exl3_convert_tests FamilyConvert Hybrid, HybridConvert), with a summary.
# Carried (git-ignored, optional): $P/bins.tar.xz holding exl3_golden_tests and exl3_convert_tests built here, e.g.
#   bash scripts/pack_device.sh build/release exl3_golden_tests exl3_convert_tests   (-> .device/r1)
# Without them step 2 is left out: the golden tests then run here on the committed fixtures (they need no GPU).
# Usage (device tool): bash scripts/device_hybrid.sh [P=.device/r1]   (about 2 minutes; the tests 2-4 more)
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/r1
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
VARIANTS=qwen3_next,qwen3_5_text,qwen3_5_moe_text,qwen3_5_wrapped,qwen3_5_moe_wrapped
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
for m in fla causal_conv1d; do python3 -c "import $m" 2>/dev/null && echo "($m is installed: make_golden points the modules at transformers' torch code)"; done

echo "== golden models from transformers: $VARIANTS"
rm -rf /tmp/gh
timeout 400 python3 tools/golden/make_golden.py --only random --variants "$VARIANTS" --out /tmp/gh 2>&1 \
  | grep -v "Writing model shards\|Loading weights" | tail -80
mkdir -p tests/models/golden tests/fixtures/golden
for d in /tmp/gh/models/*; do
  [ -d "$d" ] || continue
  rm -rf "tests/models/golden/$(basename "$d")"; cp -r "$d" tests/models/golden/
done
cp /tmp/gh/golden/*.safetensors tests/fixtures/golden/ 2>/dev/null
tar czf "$OUT/golden_hybrid.tgz" $(for v in ${VARIANTS//,/ }; do
  [ -d tests/models/golden/$v ] && echo tests/models/golden/$v
  [ -f tests/fixtures/golden/$v.safetensors ] && echo tests/fixtures/golden/$v.safetensors
done)
ls -la "$OUT/golden_hybrid.tgz"; du -sh tests/models/golden/qwen3_* 2>/dev/null

if [ -f "$P/bins.tar.xz" ]; then
  mkdir -p /tmp/b && xz -dc "$P/bins.tar.xz" | tar xf - -C /tmp/b
  export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
  bin() { [ -x /tmp/b/$1 ] && echo /tmp/b/$1 || { [ -x /tmp/b/new/$1 ] && echo /tmp/b/new/$1; }; }
  if g=$(bin exl3_golden_tests); then
    echo "== CPU golden tests of the hybrids"
    timeout 300 "$g" --gtest_filter='Hybrid/*' > /tmp/golden_hybrid.log 2>&1; echo "exit $?"
    grep -E "worst relative|^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|Expected|Which is|actual" \
      /tmp/golden_hybrid.log | head -60
    cp /tmp/golden_hybrid.log "$OUT/"
  fi
  if c=$(bin exl3_convert_tests); then
    echo "== exl3 convert of the hybrids (4.0 bpw)"
    timeout 400 "$c" --gtest_filter='Hybrid/FamilyConvert.*:*HybridConvert*:HybridCalibForward.*' \
      > /tmp/convert_hybrid.log 2>&1; echo "exit $?"
    grep -E "bpw|^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure" /tmp/convert_hybrid.log | head -40
    cp /tmp/convert_hybrid.log "$OUT/"
  fi
fi
