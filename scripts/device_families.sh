#!/usr/bin/env bash
# The families on the shared decoder, on the GPU machine in one go (binaries built on the Debian machine, sm_90):
#   1. golden models and logits from transformers for the new families (tools/golden/make_golden.py), put where the
#      tests read them (tests/models/golden, tests/fixtures/golden) and packed into $OUT/golden.tgz to commit;
#   2. the CPU golden tests of those families against them (exl3_golden_tests, Families/*);
#   3. CUDA against the CPU on them (exl3_cuda_tests, Golden/CudaFamilies.*), the embedding's scale op, and every
#      other CUDA test binary with the bf16 tiny-target carried (the tests that need it skip elsewhere).
# Carried (git-ignored): $P/bins.tar.xz (new/), $P/models.tar.xz (models/tiny-target laid out like ../shared),
# $P/tinydraft.tar.xz (tests/models/tiny-draft, when it was left out of the tree to fit the call), libcpp-httplib.
# Usage (device tool): bash scripts/device_families.sh [P=.device/p3]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/p3
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/b /tmp/shared && xz -dc "$P/bins.tar.xz" | tar xf - -C /tmp/b
[ -f "$P/models.tar.xz" ] && xz -dc "$P/models.tar.xz" | tar xf - -C /tmp/shared
[ -f "$P/tinydraft.tar.xz" ] && [ ! -d tests/models/tiny-draft ] && xz -dc "$P/tinydraft.tar.xz" | tar xf -
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=/tmp/shared
nvidia-smi --query-gpu=name --format=csv,noheader
families=phi3_fused,mistral3_text,seed_oss_bias,smollm3_nope,granite_mult,gemma2_softcap,gemma3_text,gemma3_wrapped
families=$families,glm4_post,olmo2_post,olmo3_sliding,exaone4_hybrid,ernie45_gptj,cohere_parallel,cohere2_sliding
echo "== golden models from transformers"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
timeout 300 python3 tools/golden/make_golden.py --only random --variants $families --out /tmp/g 2>&1 | tail -40
mkdir -p tests/models/golden tests/fixtures/golden
for d in /tmp/g/models/*; do rm -rf "tests/models/golden/$(basename "$d")"; cp -r "$d" tests/models/golden/; done
cp /tmp/g/golden/*.safetensors tests/fixtures/golden/ 2>/dev/null
(cd /tmp/g && tar czf "$OUT/golden.tgz" models golden)
python3 - <<'PY'
import json, os
from safetensors import safe_open
for name in ("mistral3_text", "phi3_fused", "gemma3_wrapped", "glm4_post"):
    d = f"tests/models/golden/{name}"
    if not os.path.isdir(d): print(name, "missing"); continue
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    keys = []
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as s: keys += list(s.keys())
    print(name, len(keys), "tensors, e.g.", sorted(keys)[:3], sorted(keys)[-2:])
PY
python3 - "$OUT" <<'PY' 2>&1 | tail -3
import inspect, os, sys, importlib
out = os.path.join(sys.argv[1], "hf_src"); os.makedirs(out, exist_ok=True)
for fam in ("gemma2", "gemma3", "glm4", "olmo2", "olmo3", "exaone4", "ernie4_5", "cohere", "cohere2"):
    try:
        m = importlib.import_module(f"transformers.models.{fam}.modeling_{fam}")
        c = importlib.import_module(f"transformers.models.{fam}.configuration_{fam}")
        with open(os.path.join(out, fam + ".py"), "w") as f:
            f.write(inspect.getsource(m) + "\n# ---- config\n" + inspect.getsource(c))
    except Exception as e:
        print(fam, "source:", e)
print("hf sources in", out)
PY
echo "== CPU golden tests of the families"
timeout 120 /tmp/b/new/exl3_golden_tests --gtest_filter='Families/*' > /tmp/golden.log 2>&1; echo "exit $?"
grep -E "worst relative|^\[  (PASSED|FAILED) |^\[  FAILED  \]" /tmp/golden.log; cat /tmp/golden.log >> "$OUT/tests.log"
echo "== CUDA tests"
for t in exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests exl3_cuda_prefix_cache_tests \
         exl3_cuda_sampler_tests exl3_viterbi_cuda_tests; do
  [ -x /tmp/b/new/$t ] || continue
  echo "== $t"
  timeout 300 /tmp/b/new/$t > /tmp/$t.log 2>&1; echo "exit $?"
  cat /tmp/$t.log >> "$OUT/tests.log"
  grep -E "CudaFamilies|^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests" /tmp/$t.log | grep -v "RUN\|OK \]" | head -24
  grep -E "golden/[a-z0-9_]+: prefill" /tmp/$t.log | head -8
done
