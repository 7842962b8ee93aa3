#!/usr/bin/env bash
# On the GPU machine: the SASS of selected kernels of a binary (cuobjdump), one file per kernel, with an instruction
# mix of the hottest loop (opcode counts between the first backward branch target and its branch).
# Usage: bash scripts/device_sass.sh BINARY NAME_REGEX...   e.g. exl3_fused_kernelILi4ELi2ELi1E
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bin=$1; shift
cuobjdump -sass "$bin" > /tmp/all.sass 2>/dev/null || { echo "cuobjdump failed"; exit 1; }
for re in "$@"; do
  f="$OUT/sass-$(echo "$re" | tr -c 'A-Za-z0-9_' '_' | cut -c1-60).txt"
  awk -v re="$re" '/Function : /{p = ($0 ~ re)} p' /tmp/all.sass > "$f"
  echo "== $re: $(grep -c '/\*[0-9a-f]*\*/' "$f") instructions"
  # opcode histogram of the largest loop: lines between a label target of a backward BRA and that BRA
  python3 - "$f" <<'PY'
import re, sys, collections
lines = open(sys.argv[1]).read().splitlines()
ins = []
for l in lines:
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m: ins.append((int(m.group(1), 16), m.group(2)))
best = None
for i, (addr, text) in enumerate(ins):
    m = re.search(r'BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))', text)
    t = re.search(r'0x([0-9a-f]+)', text.split('BRA')[-1]) if 'BRA' in text else None
    if t:
        tgt = int(t.group(1), 16)
        if tgt < addr:
            body = [x for x in ins if tgt <= x[0] <= addr]
            if best is None or len(body) > len(best): best = body
if best:
    c = collections.Counter(re.sub(r'^@!?U?P\d\s+', '', t).split()[0].split('.')[0] for _, t in best)
    print(f"largest loop: {len(best)} instructions:", ", ".join(f"{k} {v}" for k, v in c.most_common()))
PY
done
