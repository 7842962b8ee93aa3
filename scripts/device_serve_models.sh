#!/usr/bin/env bash
# On the GPU machine: exl3 serve's model management on CUDA. Two models under --models-dir are loaded, used and
# unloaded in turn (POST /v1/model/load, /unload, and --model-switch by a request's `model`), with a reply in flight
# across each switch; the GPU memory in use (nvidia-smi) is read after every unload and must come back to where it
# was before the first load (the model, its KV cache and CUDA graphs freed; nothing leaks across cycles). Python's
# standard library drives it (the machine has no node). Prints one line per step and a verdict; exits 1 on a failure.
#
#   EXL3_BIN=bins/exl3 bash scripts/device_serve_models.sh
#
# Environment: EXL3_BIN (required); MODEL_A, MODEL_B [tiny-target, tiny-draft from $EXL3_SHARED_DIR, ../shared or
# .device]; CYCLES [4]; DEVICE [cuda]; SLACK_MIB, the memory a cycle may leave behind [64].
set -uo pipefail
: "${EXL3_BIN:?set EXL3_BIN to the exl3 program}"
here=$(cd "$(dirname "$0")" && pwd)
shared=""
for d in "${EXL3_SHARED_DIR:-/nonexistent}" "$here/../../shared" "$here/../.device"; do
  if [ -f "$d/models/tiny-target/config.json" ]; then shared=$d; break; fi
done
MODEL_A=${MODEL_A:-$shared/models/tiny-target}
MODEL_B=${MODEL_B:-$shared/models/tiny-draft}
for m in "$MODEL_A" "$MODEL_B"; do
  [ -f "$m/config.json" ] || { echo "device_serve_models: $m has no config.json (set MODEL_A / MODEL_B)" >&2; exit 2; }
done
work=$(mktemp -d /tmp/exl3-models.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/models"
ln -s "$(cd "$MODEL_A" && pwd)" "$work/models/a"
ln -s "$(cd "$MODEL_B" && pwd)" "$work/models/b"

CYCLES=${CYCLES:-4} DEVICE=${DEVICE:-cuda} SLACK_MIB=${SLACK_MIB:-64} EXL3_BIN=$EXL3_BIN MODELS=$work/models \
python3 - <<'EOF'
import json, os, subprocess, sys, threading, time, urllib.request

exl3, models = os.environ["EXL3_BIN"], os.environ["MODELS"]
cycles, slack = int(os.environ["CYCLES"]), int(os.environ["SLACK_MIB"])
ADMIN = {"x-admin-key": "admin"}

def gpu_mib():  # 0 on a machine without nvidia-smi (DEVICE=cpu: a dry run of the script)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError):
        return 0

def call(path, body, headers={}, timeout=600):  # POST
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

failures = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok: failures.append(what)

baseline = gpu_mib()
proc = subprocess.Popen([exl3, "serve", "--models-dir", models, "--device", os.environ["DEVICE"], "--port", "0",
                         "--admin-key", "admin", "--model-switch", "-c", "2048"],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
line = proc.stdout.readline()
base = line.split("listening on ")[1].split(" ")[0]
print(f"server {base}; GPU memory before any model: {baseline} MiB", flush=True)

def chat(model, max_tokens=16, ignore_eos=False):
    return call("/v1/chat/completions", {"model": model, "max_tokens": max_tokens, "ignore_eos": ignore_eos,
                "messages": [{"role": "user", "content": "Say hello."}]})

after = []
for c in range(cycles):
    for name in ("a", "b"):
        s, text = call("/v1/model/load", {"name": name}, ADMIN)
        check(s == 200 and '"finished"' in text, f"cycle {c}: load {name}")
        s, text = chat(name)
        check(s == 200, f"cycle {c}: chat on {name}")
    # A reply in flight across a switch by request: it finishes whole, and the switched-to model answers.
    result = {}
    t = threading.Thread(target=lambda: result.update(r=chat("b", 400, True)))
    t.start(); time.sleep(0.3)
    s, text = chat("a")
    t.join()
    inflight = json.loads(result["r"][1])
    check(s == 200 and json.loads(text)["model"] == "a", f"cycle {c}: switch to a by request")
    check(result["r"][0] == 200 and inflight["usage"]["completion_tokens"] == 400,
          f"cycle {c}: the reply in flight on b finished whole ({inflight.get('usage')})")
    s, _ = call("/v1/model/unload", {}, ADMIN)
    check(s == 200, f"cycle {c}: unload")
    time.sleep(1)
    after.append(gpu_mib())
    print(f"     GPU memory after unload {c}: {after[-1]} MiB", flush=True)

check(max(after) - baseline <= slack, f"memory comes back: {after} MiB vs {baseline} MiB before (slack {slack})")
check(after[-1] - after[0] <= slack, "no growth across cycles")
proc.terminate()
check(proc.wait(timeout=60) == 0, "the server exits cleanly")
print("device_serve_models: " + ("all passed" if not failures else f"{len(failures)} failed"))
sys.exit(1 if failures else 0)
EOF
