#!/usr/bin/env bash
# Session 25 run A: structured output (json_schema) on the H200. The CUDA generator tests (GeneratorCuda.JsonModeOnTheGpu
# now runs two schema jobs beside the JSON-mode ones: greedy identical with the first draw on the GPU or on the host),
# then what a schema costs on a large vocabulary: the random Llama-3-8B-shaped EXL3 4.0 bpw model with the Llama 3.1
# tokenizer (128k tokens), whose random weights make nearly every draw a redraw over the whole vocabulary (the worst
# case), beside plain decoding and JSON mode.
set -uo pipefail
mkdir -p /tmp/r1 /tmp/models && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
/tmp/r1/exl3_cuda_generator_tests 2>&1 | grep -E "job|OK|FAILED|PASSED|Failure|Expected|Which" | head -60
python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1
tail -1 /tmp/mk.log
cp .device/tok/tokenizer.json .device/tok/tokenizer_config.json /tmp/models/l8b/
cat > /tmp/schema.json <<'J'
{"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "height": {"type": "integer"},
 "lit": {"type": "boolean"}, "color": {"enum": ["red", "white", "green"]},
 "rooms": {"type": "array", "items": {"type": "object", "properties": {"floor": {"type": "integer"},
   "use": {"type": "string"}}, "required": ["floor", "use"]}}},
 "required": ["name", "height", "lit", "color", "rooms"], "additionalProperties": false}
J
P="Describe the old lighthouse."
for r in 1 2; do
  for a in "--ignore-eos" "--json" "--json-schema /tmp/schema.json" "--json-schema /tmp/schema.json --temperature 0.8 --seed 1"; do
    echo "l8b [$a] round $r: $(/tmp/r1/exl3 run -m /tmp/models/l8b --device cuda -p "$P" -n 64 $a 2>&1 >/dev/null | grep -E 'generated' | sed 's/.*generated/generated/')"
  done
done
/tmp/r1/exl3 run -m /tmp/models/l8b --device cuda -p "$P" -n 64 --json-schema /tmp/schema.json 2>/dev/null | head -c 600; echo
