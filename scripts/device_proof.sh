#!/usr/bin/env bash
# The restructure's proof on the GPU machine, from binaries built on the Debian machine (sm_90) and carried:
#   1. every CUDA test binary of the new build (with the shared models that were carried; the rest skip);
#   2. `exl3 convert --device cuda` of tests/models/tiny-draft by the new build and by a build of the commit before
#      the change, compared byte for byte;
#   3. `exl3 bench` (batch 1 / 8 / 32) and the generator's jobs (1 / 32) on a random Llama-3-8B-shaped EXL3 4.0 bpw
#      model, the two builds interleaved, two rounds each;
#   4. when both builds carry them: bench_cuda_exl3's anchor table (base, then new), and the machine code and
#      resources of every kernel of the library compared function by function (cuobjdump on exl3_cuda_tests,
#      bench/lab/scripts/sass_compare.py).
# Carried (git-ignored): $P/bins.tar.xz with new/ and base/ (exl3 and the test binaries), $P/models.tar.xz (a folder
# laid out like ../shared: models/...), and the libcpp-httplib .so the exl3 binary links.
# Usage (device tool): bash scripts/device_proof.sh [P=.device/p1] [--no-bench] [--no-tests]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/p1; bench=1; tests=1
for a in "$@"; do
  case "$a" in
    P=*) P=${a#P=} ;;
    --no-bench) bench=0 ;;
    --no-tests) tests=0 ;;
  esac
done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/b /tmp/shared && xz -dc "$P/bins.tar.xz" | tar xf - -C /tmp/b
[ -f "$P/models.tar.xz" ] && xz -dc "$P/models.tar.xz" | tar xf - -C /tmp/shared
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=/tmp/shared
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
ls /tmp/b/* /tmp/shared/models 2>/dev/null | tr '\n' ' '; echo
if [ -x /tmp/b/base/exl3_cuda_tests ] && command -v cuobjdump > /dev/null; then
  (for v in base new; do
     cuobjdump --dump-sass /tmp/b/$v/exl3_cuda_tests > /tmp/sass_$v.txt 2>/dev/null
     cuobjdump --dump-resource-usage /tmp/b/$v/exl3_cuda_tests > /tmp/res_$v.txt 2>/dev/null
   done
   python3 bench/lab/scripts/sass_compare.py /tmp/sass_base.txt /tmp/sass_new.txt > /tmp/sass.txt 2>&1
   python3 bench/lab/scripts/sass_compare.py --res /tmp/res_base.txt /tmp/res_new.txt > /tmp/res.txt 2>&1) &
  sass=$!
fi
if [ "$bench" = 1 ]; then
  (python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b4 \
     > /tmp/model.log 2>&1 || { echo "random model failed"; tail -5 /tmp/model.log; }) &
fi
if [ "$tests" = 1 ]; then
  for t in exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests exl3_cuda_prefix_cache_tests \
           exl3_cuda_sampler_tests; do
    [ -x /tmp/b/new/$t ] || continue
    echo "== $t"
    timeout 300 /tmp/b/new/$t > /tmp/$t.log 2>&1; echo "exit $?"
    cat /tmp/$t.log >> "$OUT/tests.log"
    grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests' /tmp/$t.log | head -20
  done
  echo "== convert, base against new (--device cuda, tiny-draft, 3.5 bpw)"
  for v in base new; do
    rm -rf /tmp/cv_$v
    timeout 200 /tmp/b/$v/exl3 convert -i tests/models/tiny-draft -o /tmp/cv_$v -b 3.5 --calibration-rows 4 \
      --calibration-cols 64 --device cuda --no-progress >> "$OUT/convert.log" 2>&1 || { echo "$v failed"; tail -3 "$OUT/convert.log"; }
  done
  for f in model.safetensors config.json quantization_config.json; do
    cmp -s /tmp/cv_base/$f /tmp/cv_new/$f && echo "$f: identical ($(stat -c %s /tmp/cv_new/$f) bytes)" || echo "$f: DIFFERS"
  done
fi
if [ "$bench" = 1 ]; then
  wait
  for round in 1 2; do
    for v in base new; do
      echo "== round $round, $v: exl3 bench -p 16 -b 1,8,32 -c 512 -g 128"
      timeout 120 /tmp/b/$v/exl3 bench -m /tmp/models/l8b4 -d cuda -p 16 -b 1,8,32 -c 512 -g 128 > /tmp/bench.log 2>&1
      cat /tmp/bench.log >> "$OUT/bench.log"
      grep -E '^\| (1|8|32) \| 512' /tmp/bench.log
      echo "== round $round, $v: exl3 bench --jobs 1,32"
      timeout 180 /tmp/b/$v/exl3 bench -m /tmp/models/l8b4 -d cuda --jobs 1,32 > /tmp/jobs.log 2>&1
      cat /tmp/jobs.log >> "$OUT/bench.log"
      grep -E '^\| (1|32) \| ' /tmp/jobs.log | cut -d'|' -f2,4,5,9,10,11
    done
  done
fi
if [ "$bench" = 1 ] && [ -x /tmp/b/base/bench_cuda_exl3 ] && [ -x /tmp/b/new/bench_cuda_exl3 ]; then
  echo "== bench_cuda_exl3 anchor table, us a call: base -> new"
  for v in base new; do timeout 100 /tmp/b/$v/bench_cuda_exl3 > /tmp/table_$v.txt 2>&1; cat /tmp/table_$v.txt >> "$OUT/bench.log"; done
  python3 - <<'PY'
import re
def cells(path):
    rows = {}
    for l in open(path, errors='replace'):
        if l.startswith('| ') and ' us,' in l:
            parts = [p.strip() for p in l.strip().strip('|').split('|')]
            rows[parts[0].split(' ')[0]] = [float(p.split(' us')[0]) if ' us' in p else None for p in parts[1:]]
    return rows
b, n = cells('/tmp/table_base.txt'), cells('/tmp/table_new.txt')
worst = 0.0
for shape, vals in b.items():
    out = []
    for i, x in enumerate(vals):
        y = n.get(shape, [None] * len(vals))[i]
        if x is None or y is None: out.append('-'); continue
        worst = max(worst, (y - x) / x)
        out.append(f'{x:.1f}->{y:.1f}')
    print(f'{shape:12s} ' + ' '.join(out))
print(f'largest (new - base) / base over the cells: {100 * worst:+.1f} %')
PY
fi
if [ -n "${sass:-}" ]; then
  wait $sass
  echo "== machine code of every library kernel, base against new"
  tail -4 /tmp/res.txt; tail -6 /tmp/sass.txt
  cat /tmp/res.txt /tmp/sass.txt > "$OUT/sass.log"
fi
