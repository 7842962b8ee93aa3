#!/usr/bin/env bash
# A short check of one change on the GPU machine, in one call, each part optional (PARTS, comma-separated):
#   tests   the CUDA test binaries with the filters in TESTS ("BIN:FILTER;BIN:FILTER"), their output printed whole
#           when they fail (the device tool brings back only a few files);
#   moe     a random Qwen3-30B-A3B-shaped EXL3 4.0 bpw model (6-bit head) and `exl3 bench -p 2048 -b 1,32 -c 512`;
#   proof   a random Llama-3-8B-shaped EXL3 4.0 bpw model and `exl3 bench -p 512,2048 -b 1,8,32 -c 512 -g 128` and
#           `--jobs 1,32` by this build and by $P/base/exl3 (a build of an earlier commit), interleaved: the speed
#           before and after a change on the same card (ROUNDS=N repeats them; NEW_ARGS="--opt ..." adds a run of
#           this build with those options);
#   1b      `bash scripts/device_convert.sh 1b` (a Llama-3.2-1B conversion, timed by stage);
#   spec    a random Qwen3.5-27B-shaped EXL3 4.0 bpw model (a hybrid) and `exl3 bench --check-rows 1,2,5`: speculative
#           decoding's check steps, whose tentative tokens each take a snapshot of the recurrent state (a rejection
#           restores one), beside the one-token decode step that recomputing instead would add.
# Carried: $P/bins.tar.xz (pack_device.sh: exl3 and the test binaries; base/exl3 inside it or in $P/base.tar.xz).
# Usage (device tool): PARTS=tests,moe,proof,1b TESTS="exl3_cuda_tests:Act/FamilyOps.*" bash scripts/device_check.sh [P=.device/r1]
set -uo pipefail
export PYTHONUNBUFFERED=1
P=.device/r1
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; esac; done
PARTS=${PARTS:-tests}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
has() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
B=/tmp/bins; . scripts/device_unpack.sh
[ -f "$P/base.tar.xz" ] && mkdir -p "$B/base" && xz -dc "$P/base.tar.xz" | tar xf - -C "$B/base"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

if has tests; then
  IFS=';' read -ra runs <<< "${TESTS:-}"
  for r in "${runs[@]}"; do
    bin=${r%%:*}; filter=${r#*:}
    echo "== $(el) $bin --gtest_filter='$filter'"
    timeout 180 "$B/$bin" --gtest_filter="$filter" > /tmp/t.log 2>&1; rc=$?
    echo "exit $rc"
    if [ $rc = 0 ]; then
      grep -E "^\[  (PASSED|SKIPPED) |tiles/s|worst|within" /tmp/t.log | head -30
    else
      grep -v "^\[exl3 info\]  " /tmp/t.log | tail -60
    fi
  done
fi
if has moe; then
  echo "== $(el) Qwen3-30B-A3B shape, EXL3 4.0 bpw"
  python3 tools/bench/make_random_model.py --shape qwen3-30b-a3b --exl3-bits 4 --head-bits 6 --out /tmp/models/moe \
    > /tmp/m.log 2>&1 || tail -3 /tmp/m.log
  timeout 150 "$B/exl3" bench -m /tmp/models/moe -d cuda -p 2048 -b 1,32 -c 512 -g 64 > /tmp/b.log 2>&1; echo "exit $?"
  grep -E "^memory plan|^\| [0-9]+ \||rror" /tmp/b.log
  rm -rf /tmp/models/moe
fi
if has proof; then
  echo "== $(el) Llama-3-8B shape, EXL3 4.0 bpw"
  python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b \
    > /tmp/m.log 2>&1 || tail -3 /tmp/m.log
  # ROUNDS rounds of base, new and (with NEW_ARGS) new with those options, interleaved.
  for round in $(seq "${ROUNDS:-1}"); do
  for v in base new ${NEW_ARGS:+new+}; do
    x="$B/exl3"; [ $v = base ] && x="$B/base/exl3"
    a=(); [ $v = new+ ] && read -ra a <<< "$NEW_ARGS"
    [ -x "$x" ] || continue
    echo "== $(el) $v ${a[*]}: exl3 bench -p 512,2048 -b 1,8,32 -c 512 -g 128"
    timeout 120 "$x" bench -m /tmp/models/l8b -d cuda -p 512,2048 -b 1,8,32 -c 512 -g 128 "${a[@]}" > /tmp/b.log 2>&1
    echo "exit $?"; grep -E "^memory plan|^\| [0-9]+ \|" /tmp/b.log
    echo "== $(el) $v ${a[*]}: exl3 bench --jobs 1,32"
    timeout 150 "$x" bench -m /tmp/models/l8b -d cuda --jobs 1,32 "${a[@]}" > /tmp/j.log 2>&1
    echo "exit $?"; grep -E "^\| (1|32) \| " /tmp/j.log
  done
  done
fi
if has spec; then
  echo "== $(el) Qwen3.5-27B shape, EXL3 4.0 bpw: check steps"
  python3 tools/bench/make_random_model.py --shape qwen3.5-27b --exl3-bits 4 --head-bits 6 --out /tmp/models/q35 \
    > /tmp/m.log 2>&1 || tail -3 /tmp/m.log
  timeout 150 "$B/exl3" bench -m /tmp/models/q35 -d cuda -p 16 -b 1 -c 512 -g 32 --check-rows 1,2,5 > /tmp/b.log 2>&1
  echo "exit $?"; grep -E "^memory plan|^\| [0-9]+ \||check|rror" /tmp/b.log | head -20
  rm -rf /tmp/models/q35
fi
if has 1b; then
  echo "== $(el) Llama-3.2-1B conversion"
  bash scripts/device_convert.sh 1b P="$P" 2>&1 | tail -8
fi
echo "== $(el) done"
