#!/usr/bin/env bash
# Convert tiny-target to EXL3 at several bitrates (default calibration: text sampled from the model) and measure each
# one's perplexity on eval.txt. CPU and CUDA conversions give byte-identical files; the GPU is much faster.
# Usage: EXL3=path/to/exl3 DEVICE=cpu|cuda SRC=../shared/models/tiny-target EVAL=../shared/data/eval.txt \
#        bash scripts/convert_sweep.sh [BPW ...]      (rows go to stdout and $OUT/sweep.md as each one finishes)
set -uo pipefail
OUT=${OUT:-/tmp/sweep}; mkdir -p "$OUT"
x=${EXL3:-build/release/tools/exl3/exl3}
dev=${DEVICE:-cpu}
src=${SRC:-../shared/models/tiny-target}
eval_txt=${EVAL:-../shared/data/eval.txt}
work=${WORK:-/tmp/sweep-models}; mkdir -p "$work"
bits=${*:-"4.0 2.0 3.0 5.0 6.0 2.5 3.5"}
ppl() { $x ppl -m "$1" -f "$eval_txt" --device "$dev" --json 2>/dev/null | grep -oE '"perplexity": *[0-9.]+' | grep -oE '[0-9.]+$'; }
echo "| model | convert time ($dev) | achieved bpw | ppl on eval.txt ($dev) |" | tee "$OUT/sweep.md"
echo "|---|---|---|---|" | tee -a "$OUT/sweep.md"
[ -n "${SKIP_BF16:-}" ] || echo "| bf16 | | | $(ppl "$src") |" | tee -a "$OUT/sweep.md"
for b in $bits; do
  o=$work/tt-$b; rm -rf "$o"
  s=$(date +%s)
  line=$($x convert -i "$src" -o "$o" -b "$b" --device "$dev" --no-progress 2>"$OUT/convert-$b.log" | tail -1)
  e=$(( $(date +%s) - s ))
  got=$(echo "$line" | grep -oE "[0-9.]+ bpw" || echo "failed")
  echo "| ours $b bpw | $e s | $got | $( [ -d "$o" ] && ppl "$o" ) |" | tee -a "$OUT/sweep.md"
done
