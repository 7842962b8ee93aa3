#!/usr/bin/env bash
# Issue 40 run A (the restructure of the EXL3 and attention kernels into files, the lab switches out of the library):
# on the H200, (1) every CUDA test binary of the restructured build, with the reference implementation's tiny EXL3
# model carried for the model tests; (2) bench_cuda_exl3's anchor table and --asymptote (K4) of the build before the
# change (1f29d98, base/) and of the restructured one (new/), interleaved, two rounds each; (3) the machine code of
# every kernel of the library in both builds' exl3_cuda_tests (cuobjdump --dump-sass, --dump-resource-usage), function
# by function, names without namespaces.
# Carried: .device/k1 (bins.tar.xz: new/ and base/ binaries; the libcpp-httplib the exl3 binary links;
# shared/models/tiny-target-exl3-4.0bpw). Prints a compact table last; full logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=${S40_DIR:-$PWD/.device/k1}  # where the carried folder landed
# A short run (a lease nearly spent): S40_ROUNDS=1 S40_ASYM=0 S40_TESTS_S=80 S40_OTHER_S=8 S40_TABLE_S=40
rounds=${S40_ROUNDS:-2} asym=${S40_ASYM:-1}
mkdir -p /tmp/b && xz -dc "$D/bins.tar.xz" | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$D:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$D/shared
# The tests find the repository's files (tests/models/tiny-draft) at the path they were built in.
[ -e /work/wt-kernel ] || { mkdir -p /work && ln -s "$PWD" /work/wt-kernel; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

# (3, on the CPU beside the rest) machine code and resources of every kernel of the library: exl3_cuda_tests links
# all of them
(for v in base new; do
   cuobjdump --dump-sass /tmp/b/$v/exl3_cuda_tests > "/tmp/sass_$v.txt" 2>/dev/null
   cuobjdump --dump-resource-usage /tmp/b/$v/exl3_cuda_tests > "/tmp/res_$v.txt" 2>/dev/null
 done
 python3 "$D/sass_compare.py" /tmp/sass_base.txt /tmp/sass_new.txt > "$OUT/sass.txt" 2>&1
 python3 "$D/sass_compare.py" --res /tmp/res_base.txt /tmp/res_new.txt > "$OUT/res.txt" 2>&1) &
cpu=$!

# (2) bench, interleaved
for r in $(seq 1 "$rounds"); do
  for v in base new; do
    timeout "${S40_TABLE_S:-75}" /tmp/b/$v/bench_cuda_exl3 > "$OUT/table_${v}_$r.txt" 2>&1
    [ "$asym" = 1 ] && timeout 40 /tmp/b/$v/bench_cuda_exl3 --asymptote --ks 4 > "$OUT/asym_${v}_$r.txt" 2>&1
  done
done
# (1) tests
: > "$OUT/tests.txt"
for t in exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_kv_quant_tests exl3_cuda_prefix_cache_tests \
         exl3_cuda_sampler_tests exl3_viterbi_cuda_tests; do
  lim=${S40_OTHER_S:-60}; [ $t = exl3_cuda_tests ] && lim=${S40_TESTS_S:-170}
  timeout $lim /tmp/b/new/$t > "$OUT/$t.log" 2>&1
  rc=$?
  echo "$t rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$OUT/$t.log" | tr '\n' ' ')" >> "$OUT/tests.txt"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/$t.log" | head -5 >> "$OUT/tests.txt"
done

wait $cpu

python3 - "$OUT" <<'PY'
import re, sys, os
out = sys.argv[1]
def cells(path):
    rows = {}
    if not os.path.exists(path): return rows
    for l in open(path):
        if l.startswith('| ') and ' us,' in l:
            parts = [p.strip() for p in l.strip().strip('|').split('|')]
            rows[parts[0].split(' ')[0]] = [float(p.split(' us')[0]) if ' us' in p else None for p in parts[1:]]
    return rows
print('\n== anchor table, us a call (K2 K3 K4 K5 K6 K8 | K4 b8): base r1 / r2 -> new r1 / r2')
t = {(v, r): cells(f'{out}/table_{v}_{r}.txt') for v in ('base', 'new') for r in (1, 2)}
for v in ('base', 'new'):
    if not t[(v, 2)]: t[(v, 2)] = t[(v, 1)]  # one round only
worst = 0.0
for shape in t[('base', 1)]:
    cols = []
    for i in range(len(t[('base', 1)][shape])):
        vals = [t[(v, r)].get(shape, [None] * 9)[i] for v in ('base', 'new') for r in (1, 2)]
        if None in vals: cols.append('-'); continue
        b, n = min(vals[:2]), min(vals[2:])
        worst = max(worst, abs(n - b) / b)
        cols.append(f'{vals[0]:.1f}/{vals[1]:.1f}->{vals[2]:.1f}/{vals[3]:.1f}')
    print(f'{shape:12s} ' + ' '.join(cols))
print(f'largest |best new - best base| / best base over the cells: {100 * worst:.1f} %')
print('== asymptote K4 (fixed us, marginal w/clk/SM): ' + ' '.join(
    f'{v}{r}: ' + (' '.join(re.findall(r'\| ([0-9.]+ us) \| ([0-9.]+) \|', open(f'{out}/asym_{v}_{r}.txt').read())[0])
                   if os.path.exists(f'{out}/asym_{v}_{r}.txt') and re.search(r'\| ([0-9.]+ us) \| ([0-9.]+) \|', open(f'{out}/asym_{v}_{r}.txt').read()) else '?')
    for r in (1, 2) for v in ('base', 'new')))
print('== tests'); print(open(f'{out}/tests.txt').read().strip())
print('== resources'); print(open(f'{out}/res.txt').read().strip()[-1200:])
print('== sass'); print(open(f'{out}/sass.txt').read().strip()[-1500:])
PY
# Everything under $OUT in one archive (the device returns at most 8 files).
(cd "$OUT" && tar czf /tmp/s40a_logs.tgz -- * && rm -rf -- ./* && mv /tmp/s40a_logs.tgz .)
