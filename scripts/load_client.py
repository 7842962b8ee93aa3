#!/usr/bin/env python3
"""Load test for an OpenAI-compatible server (exl3 serve, or any other), Python standard library only.

N concurrent clients (threads), each sending R streaming requests one after another, to /v1/chat/completions (a
user prompt of about W words, as tests/server/load_bench.mjs does) or /v1/completions (the same words, or with
--prompt-tokens a list of that many token ids, so that the prompt length is exact whatever the tokenizer). Every
response is checked as it streams: HTTP 200 with text/event-stream, every event `data: {json}` (comments allowed),
one id and object type throughout, the role first (chat), deltas, exactly one finish_reason with no output after
it, one usage chunk (stream_options.include_usage) after it whose totals add up, then `data: [DONE]` and the end of
the stream. Any malformed response makes the exit status 1.

Measured per request: time to first token (TTFT: the first chunk carrying output; when none carries text, the first
chunk with a choice, which exl3 sends with the first token's update), total latency, completion tokens (from the
usage chunk, not estimated from text), and decode speed after the first token. Printed: requests ok/failed,
completion tok/s over the wall time, TTFT and latency p50/p90/p99, per-request decode tok/s p50, and GET /health
after the run (exl3 reports the jobs it still holds: they must drain to 0).

  python3 scripts/load_client.py --url http://127.0.0.1:8000 --clients 64 --requests 4 --max-tokens 256 \\
      --ignore-eos [--endpoint completions --prompt-tokens 512] [--json]
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly pack their boxes of liquor "
         "and every river runs to the sea under a pale moon").split(" ")


def prompt_text(words, seed):
    """About `words` words, different per request so that no cache answers it whole (as load_bench.mjs)."""
    out = [f"Request {seed}: continue this story."]
    out += [WORDS[(seed * 7 + i * 13) % len(WORDS)] for i in range(words)]
    return " ".join(out)


def prompt_ids(n, seed, lo, hi):
    rng = random.Random(seed)
    return [rng.randrange(lo, hi) for _ in range(n)]


class Malformed(Exception):
    """The response breaks the streaming protocol (as opposed to a refused or failed request)."""


class StreamError(Exception):
    """The server reported an error inside the stream (a failed generation, well-formed)."""


def percentile(values, p):
    """Linear interpolation between closest ranks (load_bench.mjs's definition); None for no values."""
    s = sorted(values)
    if not s:
        return None
    rank = p / 100 * (len(s) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def stats(values):
    return {"p10": percentile(values, 10), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values) if values else None}


class Client:
    def __init__(self, o):
        self.o = o
        u = urllib.parse.urlsplit(o.url)
        if u.scheme not in ("http", "") or not u.hostname:
            raise SystemExit(f"load_client: --url must be http://HOST:PORT, got '{o.url}'")
        self.host, self.port = u.hostname, u.port or 80
        self.base = u.path.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]

    def headers(self):
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.o.api_key:
            h["Authorization"] = f"Bearer {self.o.api_key}"
        return h

    def get_json(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            c.request("GET", self.base + path, headers=self.headers())
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:200]!r}")
            return json.loads(body)
        finally:
            c.close()

    def body(self, seed):
        o = self.o
        b = {"model": o.model, "max_tokens": o.max_tokens, "temperature": o.temperature, "seed": seed,
             "stream": True, "stream_options": {"include_usage": True}}
        if o.ignore_eos:
            b["ignore_eos"] = True
        if o.endpoint == "chat":
            b["messages"] = [{"role": "user", "content": prompt_text(o.prompt_words, seed)}]
        elif o.prompt_tokens:
            b["prompt"] = prompt_ids(o.prompt_tokens, seed, o.id_low, o.id_high)
        else:
            b["prompt"] = prompt_text(o.prompt_words, seed)
        return b

    def one(self, seed):
        """One streaming request: a dict with ok, and ttft/total (s), completion/prompt tokens, or error/malformed."""
        o = self.o
        chat = o.endpoint == "chat"
        path = self.base + ("/v1/chat/completions" if chat else "/v1/completions")
        t0 = time.perf_counter()
        c = http.client.HTTPConnection(self.host, self.port, timeout=o.timeout)
        try:
            c.request("POST", path, body=json.dumps(self.body(seed)), headers=self.headers())
            r = c.getresponse()
            if r.status != 200:
                return {"ok": False, "error": f"HTTP {r.status}: {r.read()[:200].decode('utf-8', 'replace')}"}
            ctype = r.getheader("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise Malformed(f"Content-Type '{ctype}', not text/event-stream")
            st = {"id": None, "role": False, "finish": None, "usage": None, "done": False, "first_output": None,
                  "first_choice": None, "chunks": 0}
            buf = b""
            while True:
                data = r.read1(65536)
                if not data:
                    break
                now = time.perf_counter()
                buf += data
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    self.event(event.decode("utf-8"), st, chat, now - t0)
            total = time.perf_counter() - t0
            if buf.strip():
                raise Malformed(f"the stream ends inside an event: {buf[:120]!r}")
            if not st["done"]:
                raise Malformed("the stream ended without data: [DONE]")
            if st["finish"] is None:
                raise Malformed("no finish_reason")
            if st["usage"] is None:
                raise Malformed("no usage chunk (stream_options.include_usage)")
            u = st["usage"]
            if o.ignore_eos and st["finish"] == "length" and u["completion_tokens"] != o.max_tokens:
                raise Malformed(f"finish_reason 'length' with ignore_eos after {u['completion_tokens']} tokens, "
                                f"not max_tokens {o.max_tokens}")
            if u["completion_tokens"] > o.max_tokens:
                raise Malformed(f"{u['completion_tokens']} completion tokens, more than max_tokens {o.max_tokens}")
            ttft = st["first_output"] if st["first_output"] is not None else st["first_choice"]
            return {"ok": True, "ttft": ttft if ttft is not None else total, "total": total,
                    "completion": u["completion_tokens"], "prompt": u["prompt_tokens"], "finish": st["finish"],
                    "chunks": st["chunks"], "text_chunks": st["first_output"] is not None}
        except Malformed as e:
            return {"ok": False, "malformed": True, "error": f"malformed: {e}"}
        except StreamError as e:
            return {"ok": False, "error": str(e)}
        except (OSError, http.client.HTTPException) as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        finally:
            c.close()

    def event(self, event, st, chat, t):
        """Checks one SSE event against what came before it; records times into st."""
        for line in event.split("\n"):
            if line == "" or line.startswith(":"):
                continue  # comments (keep-alive)
            if not line.startswith("data: "):
                raise Malformed(f"an event line that is not 'data: ': {line[:120]!r}")
            payload = line[6:]
            if st["done"]:
                raise Malformed(f"data after [DONE]: {payload[:120]!r}")
            if payload == "[DONE]":
                if st["usage"] is None:
                    raise Malformed("[DONE] before the usage chunk")
                st["done"] = True
                continue
            try:
                j = json.loads(payload)
            except ValueError:
                raise Malformed(f"not JSON: {payload[:120]!r}") from None
            if "error" in j:
                raise StreamError(f"error in the stream: {json.dumps(j['error'])[:200]}")
            st["chunks"] += 1
            want = "chat.completion.chunk" if chat else "text_completion"
            if j.get("object") != want:
                raise Malformed(f"object '{j.get('object')}', expected '{want}'")
            if st["id"] is None:
                st["id"] = j.get("id")
                if not isinstance(st["id"], str) or not st["id"]:
                    raise Malformed("a chunk without an id")
            elif j.get("id") != st["id"]:
                raise Malformed(f"id changed from {st['id']} to {j.get('id')}")
            choices = j.get("choices")
            if not isinstance(choices, list):
                raise Malformed("a chunk without a choices list")
            if st["usage"] is not None:
                raise Malformed("a chunk after the usage chunk")
            if j.get("usage") is not None:
                u = j["usage"]
                if choices:
                    raise Malformed("the usage chunk has choices")
                if st["finish"] is None:
                    raise Malformed("the usage chunk comes before the finish_reason")
                for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                    if not isinstance(u.get(k), int) or u[k] < 0:
                        raise Malformed(f"usage.{k} is {u.get(k)!r}")
                if u["prompt_tokens"] + u["completion_tokens"] != u["total_tokens"]:
                    raise Malformed(f"usage does not add up: {u}")
                st["usage"] = u
                continue
            if not choices:
                raise Malformed("a chunk with no choices and no usage")
            for ch in choices:
                if ch.get("index") != 0:
                    raise Malformed(f"choice index {ch.get('index')} (one choice was asked for)")
                if st["first_choice"] is None:
                    st["first_choice"] = t
                if st["finish"] is not None:
                    raise Malformed("a choice after the finish_reason")
                if chat:
                    d = ch.get("delta")
                    if not isinstance(d, dict):
                        raise Malformed("a chat chunk without a delta")
                    if "role" in d:
                        if st["role"] or d["role"] != "assistant":
                            raise Malformed(f"role {d['role']!r} (a second role, or not 'assistant')")
                        st["role"] = True
                    elif not st["role"]:
                        raise Malformed("the first delta carries no role")
                    out = d.get("content") or d.get("tool_calls")
                else:
                    if not isinstance(ch.get("text"), str):
                        raise Malformed("a completion chunk without text")
                    out = ch["text"]
                if out and st["first_output"] is None:
                    st["first_output"] = t
                fr = ch.get("finish_reason")
                if fr is not None:
                    if fr not in ("stop", "length", "tool_calls", "content_filter"):
                        raise Malformed(f"finish_reason {fr!r}")
                    st["finish"] = fr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (with or without /v1)")
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients")
    ap.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--prompt-words", type=int, default=64, help="a prompt of about this many words")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="completions: a prompt of this many random token ids instead of words")
    ap.add_argument("--id-low", type=int, default=256, help="--prompt-tokens draws ids from [id-low, id-high)")
    ap.add_argument("--id-high", type=int, default=8000)
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--ignore-eos", action="store_true", help="every request generates exactly --max-tokens")
    ap.add_argument("--warmup", type=int, default=1, help="requests sent one at a time first, not counted")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a request may stay silent")
    ap.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    o = ap.parse_args()
    if o.clients < 1 or o.requests < 1 or o.max_tokens < 1:
        ap.error("--clients, --requests and --max-tokens must be >= 1")
    if o.prompt_tokens and o.endpoint != "completions":
        ap.error("--prompt-tokens needs --endpoint completions (chat prompts are text)")
    if not 0 <= o.id_low < o.id_high:
        ap.error("--id-low must be below --id-high")
    cl = Client(o)
    if not o.model:
        try:
            o.model = cl.get_json("/v1/models")["data"][0]["id"]
        except (OSError, RuntimeError, ValueError, KeyError, IndexError) as e:
            print(f"load_client: cannot list models at {o.url}/v1/models: {e}", file=sys.stderr)
            return 1
    for i in range(o.warmup):
        w = cl.one(1_000_000 + i)
        if not w["ok"]:
            print(f"load_client: the warm-up request failed: {w['error']}", file=sys.stderr)
            return 1
    prompt = (f"{o.prompt_tokens}-token" if o.prompt_tokens else f"~{o.prompt_words}-word")
    print(f"load_client: {o.clients} clients x {o.requests} streaming requests to /v1/"
          f"{'chat/completions' if o.endpoint == 'chat' else 'completions'}, max_tokens {o.max_tokens}"
          f"{' (ignore_eos)' if o.ignore_eos else ''}, {prompt} prompts, model '{o.model}' at {o.url}", flush=True)

    results = [None] * (o.clients * o.requests)
    start = threading.Barrier(o.clients + 1)

    def client(k):
        start.wait()
        for r in range(o.requests):
            i = k * o.requests + r
            results[i] = cl.one(i)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(o.clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    malformed = [r for r in failed if r.get("malformed")]
    completion = sum(r["completion"] for r in ok)
    prompt_tokens = sum(r["prompt"] for r in ok)
    ttft = stats([1e3 * r["ttft"] for r in ok])
    total = stats([1e3 * r["total"] for r in ok])
    # One request's speed while decoding: tokens after the first over the time after the first.
    decode = stats([(r["completion"] - 1) / (r["total"] - r["ttft"]) for r in ok
                    if r["completion"] > 1 and r["total"] > r["ttft"]])
    no_text = sum(1 for r in ok if not r["text_chunks"])

    health, jobs_left = None, None
    deadline = time.time() + 5  # finished jobs leave the server's queue as their streams close
    while True:
        try:
            health = cl.get_json("/health")
        except (OSError, RuntimeError, ValueError) as e:
            health = {"error": str(e)}
            break
        jobs_left = health.get("jobs")
        if not jobs_left or time.time() > deadline:
            break
        time.sleep(0.1)

    def f(x, d=1):
        return "n/a" if x is None else f"{x:.{d}f}"

    print(f"requests      {len(ok)} ok, {len(failed)} failed ({len(malformed)} malformed), in {wall:.2f} s")
    print(f"tokens        {completion} generated, {prompt_tokens} prompt")
    print(f"throughput    {f(completion / wall)} generated tok/s, {f(prompt_tokens / wall)} prompt tok/s, "
          f"{f(len(ok) / wall, 2)} requests/s")
    print(f"decode/req    p50 {f(decode['p50'])} tok/s, p10 {f(decode['p10'])} tok/s (one request's speed after its "
          f"first token)")
    print(f"TTFT ms       p50 {f(ttft['p50'])}  p90 {f(ttft['p90'])}  p99 {f(ttft['p99'])}  max {f(ttft['max'])}")
    print(f"latency ms    p50 {f(total['p50'])}  p90 {f(total['p90'])}  p99 {f(total['p99'])}  max {f(total['max'])}")
    if no_text:
        print(f"note          {no_text} ok responses carried no text: their TTFT is the first chunk with a choice")
    print(f"health after  {json.dumps(health)}")
    if failed:
        kinds = {}
        for r in failed:
            kinds[r["error"]] = kinds.get(r["error"], 0) + 1
        for e, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"failed        {n} x {e}")
    healthy = isinstance(health, dict) and health.get("status") == "ok" and not jobs_left
    if not healthy:
        print("load_client: the server is not healthy after the run, or still holds jobs", file=sys.stderr)
    if o.json:
        print(json.dumps({"clients": o.clients, "requests": len(results), "ok": len(ok), "failed": len(failed),
                          "malformed": len(malformed), "endpoint": o.endpoint, "max_tokens": o.max_tokens,
                          "wall_s": wall, "completion_tokens": completion, "prompt_tokens": prompt_tokens,
                          "gen_tok_s": completion / wall, "ttft_ms": ttft, "total_ms": total, "decode_tok_s": decode,
                          "health": health}))
    return 0 if not failed and healthy else 1


if __name__ == "__main__":
    sys.exit(main())
