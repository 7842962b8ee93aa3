#!/usr/bin/env bash
# On the GPU machine: where one decode step's time goes. Nsight Compute times the kernels of the last timed decode
# step of a short `exl3 bench` run (the bench marks that step with the NVTX range exl3_bench_last_step; serialised,
# so each kernel's own duration), summed by name beside the step time the same bench measures without the profiler.
# Usage: EXL3_BIN=... MODEL=... [BATCH=1] bash scripts/device_step_profile.sh
# (Session 6 profiled every kernel of the run instead: BATCH=32 on the EXL3 8B model then ran past 10 minutes. With
# the NVTX filter only one step's kernels are replayed: BATCH=32 took ~30 s in session 8, docs/kernels/exl3.md note 24.)
# CTX (default 512): tokens cached per sequence before the timed steps.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
X=${EXL3_BIN:-build-dev/tools/exl3/exl3}
M=${MODEL:-/tmp/models/llama3-8b}
args=(bench -m "$M" -d cuda -p 16 -b "${BATCH:-1}" -c "${CTX:-512}" -g 4 -r 1)
"$X" "${args[@]}" 2>&1 | grep -E "^\| ${BATCH:-1} \|" || true  # the step time without the profiler
ncu --nvtx --nvtx-include "exl3_bench_last_step/" --metrics gpu__time_duration.sum --csv --print-units base \
  "$X" "${args[@]}" > "$OUT/ncu_step.csv" 2> "$OUT/ncu_step.err"
python3 - "$OUT/ncu_step.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
ks = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")) / 1000.0)
      for r in rows if r["Metric Name"] == "gpu__time_duration.sum"]
print(f"{len(ks)} kernels profiled")
# Only the marked step was profiled; without the NVTX filter, from the last embed kernel to the end.
embeds = [i for i, (n, _) in enumerate(ks) if "embed_kernel" in n]
step = ks[embeds[-1]:] if embeds else ks
tot = collections.OrderedDict()
for n, t in step:
    key = n.split("(")[0][:100]
    c, s = tot.get(key, (0, 0.0))
    tot[key] = (c + 1, s + t)
print(f"last step: {len(step)} kernels, {sum(t for _, t in step):.1f} us of kernel time")
for k, (c, s) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"{s:9.1f} us  {c:4d} x {s / c:7.2f} us  {k}")
PY
