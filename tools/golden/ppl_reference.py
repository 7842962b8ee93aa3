#!/usr/bin/env python3
"""Perplexity reference figures from HF transformers, under exactly the protocol of `exl3 ppl` (src/runtime/ppl.h).

Protocol:
  1. The file's bytes, decoded as UTF-8 with no newline translation, are tokenized once without special tokens
     (tokenizer(text, add_special_tokens=False): special-token strings in the text become their ids).
     max_tokens > 0 keeps the first max_tokens tokens.
  2. Windows of ctx text tokens start every stride tokens (0, S, 2S, ...); the last window is the first one that
     reaches the end of the stream.
  3. When the tokenizer adds BOS to encoded text (tokenizer("a") starts with bos_token_id and is longer than
     tokenizer("a", add_special_tokens=False)), BOS is prepended to every window and the window's first text token
     is scored from it. Otherwise the first position of a window is context only.
  4. Each window scores the tokens that no earlier window scored: [max(end of previous window, begin + lead), end),
     lead = 0 with BOS, 1 without.
  5. NLL = -log_softmax(logits)[target], from fp32 logits in float64; perplexity = exp(mean NLL).

The model runs in float32 on the CPU with eager attention, so that the figures are deterministic.

Usage (on the machine with torch + transformers; see the docstring of tools/golden/run_on_device.sh for carrying):
  ppl_reference.py --model DIR --text FILE --case CTX:STRIDE:MAX_TOKENS[:nobos] [--case ...] --out FILE.json
  ppl_reference.py --self-test      (the window plan only; needs no torch)
"""
import argparse
import json
import math
import os
import struct
import sys
import time

PROTOCOL = ("exl3 ppl v1: text tokenized once without special tokens; windows of ctx text tokens every stride "
            "tokens; BOS prepended to every window when the tokenizer adds BOS; each window scores the tokens no "
            "earlier window scored; NLL from fp32 logits in float64; perplexity = exp(mean NLL)")


def plan_windows(n_tokens, ctx, stride, bos):
    """[(begin, end, score_from)], as plan_perplexity_windows in src/runtime/ppl.cpp."""
    if ctx < 1:
        raise ValueError("ctx must be >= 1")
    stride = stride or ctx
    if not 1 <= stride <= ctx:
        raise ValueError("stride must be in [1, ctx]")
    plan = []
    if n_tokens <= 0:
        return plan
    lead = 0 if bos else 1
    scored_end = 0
    begin = 0
    while True:
        end = min(begin + ctx, n_tokens)
        start = max(scored_end, begin + lead)
        if start < end:
            plan.append((begin, end, start))
        scored_end = end
        if end == n_tokens:
            return plan
        begin += stride


def ids_fnv1a(ids):
    """FNV-1a (64-bit) over the ids as little-endian int32: lets a test tell a tokenization mismatch apart."""
    h = 0xCBF29CE484222325
    for b in struct.pack(f"<{len(ids)}i", *ids):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def self_test():
    assert plan_windows(0, 4, 4, True) == []
    assert plan_windows(10, 4, 4, True) == [(0, 4, 0), (4, 8, 4), (8, 10, 8)]
    assert plan_windows(10, 4, 4, False) == [(0, 4, 1), (4, 8, 5), (8, 10, 9)]
    assert plan_windows(10, 4, 2, True) == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    assert plan_windows(9, 4, 4, False) == [(0, 4, 1), (4, 8, 5)]  # the lone last token has no context
    assert plan_windows(1, 4, 4, False) == []
    assert sum(e - s for _, e, s in plan_windows(1000, 64, 48, True)) == 1000
    assert ids_fnv1a([]) == "cbf29ce484222325"
    print("self-test ok")


def run_case(model, tok, ids_all, ctx, stride, max_tokens, use_bos_flag, torch):
    ids = ids_all[:max_tokens] if max_tokens > 0 else ids_all
    with_special = tok("a")["input_ids"]
    without = tok("a", add_special_tokens=False)["input_ids"]
    bos_id = tok.bos_token_id
    adds_bos = bos_id is not None and len(with_special) > len(without) and with_special[0] == bos_id
    bos = adds_bos and use_bos_flag
    plan = plan_windows(len(ids), ctx, stride, bos)
    lead_pad = 1 if bos else 0
    nll_sum = 0.0
    scored = 0
    t0 = time.time()
    with torch.no_grad():
        for begin, end, start in plan:
            window = ([bos_id] if bos else []) + ids[begin:end]
            logits = model(torch.tensor([window])).logits[0].float()  # [len, vocab]
            logp = torch.log_softmax(logits.double(), dim=-1)
            # text token k sits at window index k - begin + lead_pad and is predicted by the row before it
            rows = torch.arange(start - begin + lead_pad - 1, end - begin + lead_pad - 1)
            targets = torch.tensor(window)[rows + 1]
            nll = -logp[rows, targets]
            nll_sum += float(nll.sum())
            scored += int(rows.numel())
    mean = nll_sum / scored
    return {"ctx": ctx, "stride": stride or ctx, "max_tokens": max_tokens, "bos": bos, "text_tokens": len(ids),
            "ids_fnv1a": ids_fnv1a(ids), "tokens": scored, "windows": len(plan), "nll": mean,
            "perplexity": math.exp(mean), "seconds": time.time() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--text")
    ap.add_argument("--case", action="append", default=[], help="CTX:STRIDE:MAX_TOKENS[:nobos]")
    ap.add_argument("--out")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    self_test()
    if a.self_test:
        return
    if not (a.model and a.text and a.case and a.out):
        ap.error("--model, --text, --case and --out are needed")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(min(16, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with open(a.text, encoding="utf-8", newline="") as f:  # newline="": the bytes as they are, as exl3 reads them
        text = f.read()
    t0 = time.time()
    ids_all = tok(text, add_special_tokens=False)["input_ids"]
    print(f"{a.text}: {len(text.encode('utf-8'))} bytes, {len(ids_all)} tokens ({time.time() - t0:.2f} s)", flush=True)

    result = {"protocol": PROTOCOL, "model": os.path.basename(os.path.normpath(a.model)),
              "file": os.path.basename(a.text), "file_bytes": len(text.encode("utf-8")),
              "reference": {"transformers": transformers.__version__, "torch": torch.__version__,
                            "dtype": "float32", "device": "cpu", "attn_implementation": "eager"},
              "cases": []}
    for spec in a.case:
        parts = spec.split(":")
        ctx, stride, max_tokens = int(parts[0]), int(parts[1]), int(parts[2])
        use_bos = not (len(parts) > 3 and parts[3] == "nobos")
        try:
            case = run_case(model, tok, ids_all, ctx, stride, max_tokens, use_bos, torch)
        except Exception as e:  # keep the other cases: one device run has to bring back all it can
            print(f"case {spec}: FAILED: {e!r}", flush=True)
            continue
        result["cases"].append(case)
        print(json.dumps(case), flush=True)
        with open(a.out, "w") as f:  # after every case, so that a run cut short still leaves what it measured
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
