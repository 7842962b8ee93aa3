#!/usr/bin/env bash
# Session 24 run K: what JSON mode costs on a large vocabulary -- the random Llama-3-8B-shaped EXL3 4.0 bpw model
# with the Llama 3.1 tokenizer (128k tokens). Random weights make almost every first draw one the grammar refuses,
# so nearly every token is a redraw over the whole vocabulary: the worst case. Plain decoding beside it.
set -uo pipefail
mkdir -p /tmp/r1 /tmp/models && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1
tail -1 /tmp/mk.log
cp .device/tok/tokenizer.json .device/tok/tokenizer_config.json /tmp/models/l8b/
P="Describe the old lighthouse."
for r in 1 2; do
  for a in "--ignore-eos" "--json" "--json --temperature 0.8 --seed 1"; do
    echo "l8b [$a] round $r: $(/tmp/r1/exl3 run -m /tmp/models/l8b --device cuda -p "$P" -n 64 $a 2>&1 >/dev/null | grep -E 'generated' | sed 's/.*generated/generated/')"
  done
done
/tmp/r1/exl3 run -m /tmp/models/l8b --device cuda -p "$P" -n 48 --json 2>/dev/null | head -c 600; echo
