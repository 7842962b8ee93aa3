#!/usr/bin/env bash
# On the GPU machine: start `exl3 serve` on a model, wait for /health, drive it with scripts/load_client.py (Python
# standard library only: the machine has no node), save the results under $OUT, and stop the server cleanly.
#
#   EXL3_BIN=build-dev/tools/exl3/exl3 MODEL=/tmp/models/llama3-8b-exl3-4.0 bash scripts/device_serve.sh
#
# Environment (defaults in brackets):
#   EXL3_BIN      the exl3 program (required)      MODEL        the model directory (required)
#   OUT           where results go [/tmp/out]      DEVICE       --device of exl3 serve [cuda]
#   CLIENTS       concurrent clients; a list ("1 8 64") runs each in turn on the same server [64]
#   REQUESTS      requests per client [4]          MAX_TOKENS   max_tokens per request (ignore_eos) [256]
#   ENDPOINT      chat | completions [chat]        PROMPT_WORDS chat prompt of about this many words [64]
#   PROMPT_TOKENS completions: a prompt of this many random token ids (exact length) [0: words]
#   MAX_BATCH     jobs decoded together [largest CLIENTS]
#   MAX_BATCH_TOKENS  tokens per forward pass [MAX_BATCH + 2048]
#   SERVE_ARGS    more exl3 serve options (e.g. "-c 8192")
#   TOKENIZER_DIR where tokenizer.json / tokenizer_config.json come from when MODEL has none
#                 [$EXL3_SHARED_DIR, ../shared or .device: tokenizers/llama-3.1]
# exl3 serve needs a tokenizer (tools/bench/make_random_model.py writes none): for such a model the script serves a
# directory of links to MODEL's files plus the tokenizer of TOKENIZER_DIR (the Llama 3 one: its 128,256 ids match
# the llama3-8b shape, and its tokenizer_config.json carries a chat template). Random weights mean nonsense text and
# no natural end, so every request sets ignore_eos and generates exactly MAX_TOKENS.
set -uo pipefail
: "${EXL3_BIN:?set EXL3_BIN to the exl3 program}"
: "${MODEL:?set MODEL to the model directory}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
CLIENTS=${CLIENTS:-64}
REQUESTS=${REQUESTS:-4}
MAX_TOKENS=${MAX_TOKENS:-256}
ENDPOINT=${ENDPOINT:-chat}
PROMPT_WORDS=${PROMPT_WORDS:-64}
PROMPT_TOKENS=${PROMPT_TOKENS:-0}
max_clients=0
for c in $CLIENTS; do [ "$c" -gt "$max_clients" ] && max_clients=$c; done
MAX_BATCH=${MAX_BATCH:-$max_clients}
MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-$((MAX_BATCH + 2048))}
here=$(cd "$(dirname "$0")" && pwd)

[ -x "$EXL3_BIN" ] || { echo "device_serve: $EXL3_BIN is not an executable" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "device_serve: $MODEL has no config.json" >&2; exit 2; }
work=$(mktemp -d /tmp/exl3-serve.XXXXXX)
dir=$MODEL
if [ ! -f "$MODEL/tokenizer.json" ]; then
  tok=${TOKENIZER_DIR:-}
  if [ -z "$tok" ]; then
    for d in "${EXL3_SHARED_DIR:-/nonexistent}" "$here/../../shared" "$here/../.device"; do
      if [ -f "$d/tokenizers/llama-3.1/tokenizer.json" ]; then tok=$d/tokenizers/llama-3.1; break; fi
    done
  fi
  if [ -z "$tok" ] || [ ! -f "$tok/tokenizer.json" ]; then
    echo "device_serve: $MODEL has no tokenizer.json and no TOKENIZER_DIR was found: set TOKENIZER_DIR to a directory" \
         "with tokenizer.json and tokenizer_config.json (ids below the model's vocab_size; a chat template for chat)" >&2
    exit 2
  fi
  dir=$work/model
  mkdir -p "$dir"
  for f in "$MODEL"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$dir/"; done
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$tok/$f" ] && ln -sf "$(cd "$tok" && pwd)/$f" "$dir/$f"
  done
  echo "device_serve: $MODEL has no tokenizer: serving it with the tokenizer of $tok"
fi

: > "$work/serve.out"
# shellcheck disable=SC2086  # SERVE_ARGS is a list of options
"$EXL3_BIN" serve -m "$dir" --model-name "$(basename "$MODEL")" --device "$DEVICE" --port 0 --max-batch "$MAX_BATCH" \
  --max-batch-tokens "$MAX_BATCH_TOKENS" --max-queue $((max_clients + 16)) ${SERVE_ARGS:-} \
  > "$work/serve.out" 2> "$OUT/serve.log" &
pid=$!
# shellcheck disable=SC2317  # run by the EXIT trap
stop() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then echo "device_serve: the server did not stop in 30 s: killing it" >&2; kill -KILL "$pid"; fi
  fi
  wait "$pid" 2>/dev/null; echo "device_serve: server exit status $?"
  rm -rf "$work"
}
trap stop EXIT

# The port is on the server's one stdout line once the model is loaded; then /health must answer.
url=
t0=$(date +%s)
while [ -z "$url" ]; do
  kill -0 "$pid" 2>/dev/null || { echo "device_serve: the server exited during start-up:" >&2; tail -20 "$OUT/serve.log" >&2; exit 1; }
  [ $(( $(date +%s) - t0 )) -gt 600 ] && { echo "device_serve: no listening line after 600 s" >&2; exit 1; }
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$work/serve.out")
  [ -n "$url" ] || sleep 1
done
python3 - "$url" <<'EOF' || exit 1
import json, sys, time, urllib.request
for _ in range(60):
    try:
        with urllib.request.urlopen(sys.argv[1] + "/health", timeout=5) as r:
            print("device_serve: /health", json.load(r)); sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit("device_serve: /health did not answer")
EOF
echo "device_serve: $url up after $(( $(date +%s) - t0 )) s (model $MODEL, max-batch $MAX_BATCH, max-batch-tokens $MAX_BATCH_TOKENS)"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true

status=0
prompt=(--prompt-words "$PROMPT_WORDS")
[ "$PROMPT_TOKENS" -gt 0 ] && prompt=(--prompt-tokens "$PROMPT_TOKENS")
for c in $CLIENTS; do
  echo "== $c clients x $REQUESTS requests, max_tokens $MAX_TOKENS, $ENDPOINT"
  python3 "$here/load_client.py" --url "$url" --clients "$c" --requests "$REQUESTS" --max-tokens "$MAX_TOKENS" \
    --ignore-eos --endpoint "$ENDPOINT" "${prompt[@]}" --json 2>&1 | tee "$OUT/load_client_$c.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && { echo "device_serve: load_client exit status $rc" >&2; status=$rc; }
done
exit "$status"
