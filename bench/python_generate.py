"""Generation speed through the Python module (exl3.Generator), to set beside `exl3 bench`: the same engine, so the
Python layer's cost is the difference.

    PYTHONPATH=build/release/python python3 bench/python_generate.py -m MODEL [--device cuda] [-b 1,8] [-g 256]

Per batch size: B greedy jobs of a 16-token prompt, each generating G tokens (ignore_eos), submitted together;
prints ms a step (wall time / G) and generated tokens per second, after one warm-up run.
"""

import argparse
import time

import exl3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-b", "--batch", default="1")
    ap.add_argument("-g", "--gen", type=int, default=256)
    ap.add_argument("-c", "--context", type=int, default=1024)
    a = ap.parse_args()
    batches = [int(x) for x in a.batch.split(",")]
    cache = max(batches) * ((16 + a.gen) // 64 + 2) * 64  # every job's prompt and output at once, in whole pages
    model = exl3.Model(a.model, device=a.device, context_length=a.context, cache_tokens=max(cache, a.context))
    gen = exl3.Generator(model, max_active_jobs=max(batches), max_batch_tokens=max(256, 2 * max(batches)))
    print(f"{model!r}")
    print("| batch | ms a step | generated tok/s |")
    print("|---|---|---|")
    for b in batches:
        prompts = [[(7 * i + 13 * j) % 1000 + 10 for i in range(16)] for j in range(b)]
        for run in range(2):  # the first is a warm-up (CUDA graphs, allocations)
            t0 = time.perf_counter()
            out = gen.generate(prompts, max_new_tokens=a.gen, ignore_eos=True)
            dt = time.perf_counter() - t0
        assert all(len(c.tokens) == a.gen for c in out)
        print(f"| {b} | {dt / a.gen * 1e3:.3f} | {b * a.gen / dt:.0f} |")


if __name__ == "__main__":
    main()
