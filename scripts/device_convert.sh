#!/usr/bin/env bash
# `exl3 convert` at real sizes on the GPU machine (issue 43), from binaries built here (sm_90) and carried:
#   tests  the converter's CUDA tests: the GPU quantizer's kernels and quantize() against the CPU (exl3_gpu_quantizer_tests,
#          with the calibration forward on CudaOps against the CPU one), the Viterbi kernel (exl3_viterbi_cuda_tests,
#          its throughput line), and the CPU conversion tests with a GPU present (exl3_convert_tests);
#   1b     a random-weight Llama-3.2-1B (tools/bench/make_random_model.py --shape llama3-1b, bf16) converted at 4.0 bpw
#          with defaults (--device cuda), wall time, the stage breakdown and peak memory `exl3 convert` prints, and
#          `exl3 inspect` of the output (loadable);
#   8b     the same for Llama-3-8B (--shape llama3-8b);
#   8b-est Llama-3-8B's first 2 and 4 layers, the whole extrapolated as for 70b (when a full run would not fit a call);
#   ablate tiny-target converted on the GPU at 2.0 and 3.0 bpw with each of the recipe's steps left out (--recipe) and
#          with larger calibrations, perplexity on eval.txt (the tuning text; CUDA engine);
#   table  tiny-target at 2.0 2.5 3.0 3.5 4.0 5.0 bpw (TABLE_BITS="2.0 3.0": some of them) with the defaults, perplexity on eval.txt and on wikitext-2 test
#          (held out, ctx 512 as the issue measures), beside bf16 and the reference's own 4.0 bpw file;
#   seeds  tiny-target at SEED_BITS (default 3.0 4.0) with the defaults under each of SEEDS (default 1 2 3: --seed
#          draws the calibration text, the sign vectors and the sensitivity sample), eval.txt and wikitext-2 test,
#          and each bitrate's mean: one file's held-out figure at 3-4 bpw is a draw (docs/conversion.md); SEED_ARGS
#          adds flags to each of these conversions (e.g. --calibration-rows 512);
#   real   tiny-target at REAL_BITS (default 2.0 3.0) calibrated on calibration.txt, 1024x512 (real text, the
#          reference's token count), eval.txt and wikitext-2 test
#   calib  tiny-target at 2.0 bpw (3.0 with the defaults only) with the default calibration's sizes (sampled
#          16x256, the first size; 64x512; 128x512, today's default; 256x512; the default with damping 0.1) and calibration.txt
#          at 256x512 and 1024x512 (real text; the latter the reference's token count), perplexity on eval.txt (tuning)
#          and wikitext-2 test (held out);
#   70b    Llama-3-70B's first 2 and 4 layers (--shape llama3-70b --layers N, full-size embedding and head): a layer's
#          time is the difference over two layers, and 80 layers are extrapolated as T(2) + 78 x that -- an
#          extrapolation, said so in the output;
#   70b-24 Llama-3-70B's first 2 layers with the full-size head under --gpu-memory 24 (the peak is the head's);
# CONVERT_ARGS adds flags to every random-model conversion.
# Carried (git-ignored), by scripts/pack_convert.sh: $P/bins.tar.xz (exl3, and for `tests` the three test
# binaries), libcpp-httplib, and for `ablate` / `table` / `calib` $P/shared.tar.xz (models/tiny-target,
# models/tiny-target-exl3-4.0bpw, data/*.txt, laid out like ../shared). Keep a call under 64 MiB: pack_convert.sh
# speed (binaries) or pack_convert.sh quality (exl3 and the models).
# Expected device time: tests ~2 min; 1b ~2 min (model ~20 s, convert <= 90 s); 8b ~8 min (model ~1 min, convert
# <= 8 min: run it alone, timeout_s 600); 70b ~8 min (models ~1.5 min, two converts); 70b-24 ~4 min.
# ablate ~9 min, table ~2 min (H100, 2026-12-06: ~12 s a row with its two perplexities), seeds ~1.5 min, calib ~7 min (each conversion of tiny-target some 10-40 s on the H200, each perplexity
# a few s).
# Usage (device tool): bash scripts/device_convert.sh MODE... [P=.device/c43] [BITS=4.0]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/c43
modes=()
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; BITS=*) BITS=${a#BITS=} ;; *) modes+=("$a") ;; esac; done
BITS=${BITS:-4.0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/tmp/b; mkdir -p "$B" && xz -dc "$P/bins.tar.xz" | tar xf - -C "$B"
S=/tmp/shared; [ -f "$P/shared.tar.xz" ] && mkdir -p "$S" && xz -dc "$P/shared.tar.xz" | tar xf - -C "$S"
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
# The tests find tests/models where they were built: point that path at this checkout.
for d in /work/wt/h43 /work/wt/c43 /work/main; do [ -e "$d" ] || { mkdir -p "$(dirname "$d")" && ln -s "$PWD" "$d"; }; done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
free -g | head -2

# A crash's backtrace (core/crash_trace.h), when the log holds one.
crash() { sed -n '/^\*\*\* exl3: /,/^\*\*\*$/p' "$1" | head -50; }

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

convert() {  # convert SHAPE LAYERS -> converts /tmp/m-SHAPE-LAYERS, prints the breakdown
  local shape=$1 layers=$2 src=/tmp/m-$1-$2 dst=/tmp/q-$1-$2
  if [ ! -f "$src/config.json" ]; then
    local t0=$(date +%s.%N)
    python3 tools/bench/make_random_model.py --shape "$shape" ${layers:+--layers $layers} --out "$src" \
      > "$OUT/make-$shape-$layers.log" 2>&1 || { echo "random model $shape failed"; tail -5 "$OUT/make-$shape-$layers.log"; return 1; }
    echo "made $shape ${layers:+($layers layers) }in $(since "$t0") s: $(du -sh "$src" | cut -f1)"
  fi
  rm -rf "$dst"
  # The whole device's memory in use, every 250 ms (the process's CUDA context and every allocator included).
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$OUT/smi-$shape-$layers.log" 2>/dev/null &
  local smi=$!
  local t0=$(date +%s.%N)
  "$B/exl3" convert -i "$src" -o "$dst" -b "$BITS" --device cuda --no-progress ${CONVERT_ARGS:-} \
    > "$OUT/convert-$shape-$layers.log" 2>&1
  local rc=$? wall
  wall=$(since "$t0")
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "nvidia-smi: at most $(sort -n "$OUT/smi-$shape-$layers.log" | tail -1) MiB of device memory in use (sampled every 250 ms)"
  echo "== $shape${layers:+ ($layers layers)} at $BITS bpw${CONVERT_ARGS:+ ($CONVERT_ARGS)}: exit $rc, wall ${wall} s"
  grep -E "^stages:|^peak memory:|^converted" "$OUT/convert-$shape-$layers.log"
  [ $rc = 0 ] || { tail -5 "$OUT/convert-$shape-$layers.log"; crash "$OUT/convert-$shape-$layers.log"; }
  [ $rc = 0 ] && "$B/exl3" inspect "$dst" 2>&1 | head -4
  [ $rc = 0 ] && echo "output: $(cd "$dst" && ls *.safetensors* | tr "\n" " ")"
  echo "$wall" > "$OUT/wall-$shape-$layers"
  rm -rf "$dst"
  return $rc
}

estimate() {  # estimate SHAPE LAYERS -> its first 2 and 4 layers converted, the whole model extrapolated
  local shape=$1 n=$2
  convert "$shape" 2 && convert "$shape" 4
  if [ -f "$OUT/wall-$shape-2" ] && [ -f "$OUT/wall-$shape-4" ]; then
    t2=$(cat "$OUT/wall-$shape-2"); t4=$(cat "$OUT/wall-$shape-4")
    awk -v a="$t2" -v b="$t4" -v n="$n" -v s="$shape" 'BEGIN { printf "%s EXTRAPOLATED (not measured): a layer %.1f s; %d " \
      "layers ~ %.1f min (the 2-layer run'"'"'s fixed costs -- calibration text, embedding, head -- plus %d more layers)\n", \
      s, (b - a) / 2, n, (a + (n - 2) * (b - a) / 2) / 60, n - 2 }'
  fi
}

ppl() {  # ppl MODEL TEXT -> perplexity (CUDA engine, ctx 512)
  "$B/exl3" ppl -m "$1" -f "$2" --device cuda --ctx 512 --json 2>/dev/null | grep -oE '"perplexity": *[0-9.]+' | grep -oE '[0-9.]+$'
}
tiny() {  # tiny NAME BPW [convert flags] -> one table row: eval (and wikitext with WIKI=1)
  local name=$1 bpw=$2 dst=/tmp/tt; shift 2
  local log="$OUT/tiny-$(echo "$name" | tr -c 'A-Za-z0-9.\n' '-')-$bpw.log"
  rm -rf "$dst"
  local t0=$(date +%s.%N)
  "$B/exl3" convert -i "$S/models/tiny-target" -o "$dst" -b "$bpw" --device cuda --no-progress "$@" > "$log" 2>&1 \
    || { echo "| $name | $bpw | failed: $(tail -1 "$log") |"; return; }
  local wall=$(since "$t0")
  echo "| $name | $bpw | $(ppl "$dst" "$S/data/eval.txt") | ${WIKI:+$(ppl "$dst" "$S/data/wikitext-2-test.txt") | }$wall s |"
}

for m in "${modes[@]}"; do
  case "$m" in
    tests)
      for t in ${TESTS:-exl3_gpu_quantizer_tests exl3_viterbi_cuda_tests exl3_convert_tests}; do
        [ -x "$B/$t" ] || { echo "$t not carried"; continue; }
        echo "== $t"
        timeout 300 "$B/$t" > "$OUT/$t.log" 2>&1; rc=$?; echo "exit $rc"
        grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|proxy CPU|tiles/s|rel. error|log-probability" "$OUT/$t.log" | head -40
        [ $rc = 0 ] || { grep -E "^\[ RUN      \]" "$OUT/$t.log" | tail -1; crash "$OUT/$t.log"; }
      done ;;
    1b) convert llama3-1b "" ;;
    8b) convert llama3-8b "" ;;
    70b) estimate llama3-70b 80 ;;
    70b-24) CONVERT_ARGS="--gpu-memory 24 ${CONVERT_ARGS:-}" convert llama3-70b 2 ;;
    8b-est) estimate llama3-8b 32 ;;
    ablate)
      echo "| tiny-target | bpw | eval.txt | convert |"
      echo "| bf16 | 16 | $(ppl "$S/models/tiny-target" "$S/data/eval.txt") | |"
      for b in 2.0 3.0; do
        tiny default "$b"
        tiny "recipe none (before issue 43)" "$b" --recipe none
        tiny "no refit" "$b" --recipe in-scales,scale-search
        tiny "no in-scales" "$b" --recipe scale-search,refit
        tiny "no scale search" "$b" --recipe in-scales,refit
        tiny "calibration 64x512" "$b" --calibration-rows 64 --calibration-cols 512
        tiny "calibration 256x512" "$b" --calibration-rows 256 --calibration-cols 512
        tiny "calibration.txt 64x512" "$b" --calibration "$S/data/calibration.txt" --calibration-rows 64 --calibration-cols 512
        tiny "damping 0.1" "$b" --damping 0.1
        tiny "calibration 256x512, damping 0.1" "$b" --calibration-rows 256 --calibration-cols 512 --damping 0.1
      done ;;
    calib)
      echo "| tiny-target | bpw | eval.txt | wikitext-2 test | convert |"
      echo "| bf16 | 16 | $(ppl "$S/models/tiny-target" "$S/data/eval.txt") | $(ppl "$S/models/tiny-target" "$S/data/wikitext-2-test.txt") | |"
      WIKI=1 tiny "default (sampled 128x512)" 3.0
      WIKI=1 tiny "default (sampled 128x512)" 2.0
      WIKI=1 tiny "sampled 16x256" 2.0 --calibration-rows 16 --calibration-cols 256
      WIKI=1 tiny "sampled 64x512" 2.0 --calibration-rows 64 --calibration-cols 512
      WIKI=1 tiny "sampled 256x512" 2.0 --calibration-rows 256 --calibration-cols 512
      WIKI=1 tiny "default, damping 0.1" 2.0 --damping 0.1
      WIKI=1 tiny "calibration.txt 256x512" 2.0 --calibration "$S/data/calibration.txt" --calibration-rows 256 --calibration-cols 512
      WIKI=1 tiny "calibration.txt 1024x512" 2.0 --calibration "$S/data/calibration.txt" --calibration-rows 1024 --calibration-cols 512 ;;
    table)
      echo "| tiny-target | bpw | eval.txt | wikitext-2 test | convert |"
      for ref in tiny-target tiny-target-exl3-4.0bpw; do
        echo "| $ref | | $(ppl "$S/models/$ref" "$S/data/eval.txt") | $(ppl "$S/models/$ref" "$S/data/wikitext-2-test.txt") | |"
      done
      for b in ${TABLE_BITS:-2.0 2.5 3.0 3.5 4.0 5.0}; do WIKI=1 tiny "exl3 convert" "$b"; done ;;
    seeds)
      echo "| tiny-target${SEED_ARGS:+ ($SEED_ARGS)} | bpw | eval.txt | wikitext-2 test | convert |"
      for b in ${SEED_BITS:-3.0 4.0}; do
        for sd in ${SEEDS:-1 2 3}; do WIKI=1 tiny "seed $sd" "$b" --seed "$sd" ${SEED_ARGS:-}; done
      done | tee "$OUT/seeds.md"
      awk -F'|' '/^\| seed /{ b = $3; e[b] += $4; w[b] += $5; n[b]++ }
        END { for (b in n) printf "| mean of %d seeds |%s| %.4f | %.4f | |\n", n[b], b, e[b] / n[b], w[b] / n[b] }' \
        "$OUT/seeds.md" | sort -t'|' -k3 ;;
    real)
      for b in ${REAL_BITS:-2.0 3.0}; do
        WIKI=1 tiny "calibration.txt 1024x512" "$b" --calibration "$S/data/calibration.txt" --calibration-rows 1024 --calibration-cols 512
      done ;;
    *) echo "unknown mode $m (tests, 1b, 8b, 8b-est, 70b, 70b-24, ablate, table, seeds, real, calib)" ;;
  esac
done
