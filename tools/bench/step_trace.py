#!/usr/bin/env python3
"""Where a decode step's time goes, from a step timeline (kernel lab, src/backend/cuda/step_trace.h).

A build with -DEXL3_STEP_TRACE=ON records, for every block of every kernel that waits on the kernel before it
(programmatic dependent launch), the global timer before and after the wait. A launch's first release is when the
launch before it has completed, so the releases order the chain: a launch's share of the step is the time from its
first release to the next launch's first release (its critical path, hop included), whatever overlapped it.

Usage (a tree configured with -DEXL3_STEP_TRACE=ON builds bench/lab/step_trace_lab, which records the last of a few
decode steps at each batch; scripts/device_moe.sh TRACE=1 runs it on the GPU machine):
       step_trace_lab MODEL /tmp/st 1,32 512
       python3 tools/bench/step_trace.py /tmp/st.b1.c512 [--src src/backend/cuda] [--layer N]
"""
import argparse
import array
import bisect
import os
import re
import statistics
import sys


def fnv(name):
    h = 2166136261
    for c in name.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return h


def call_sites(src):
    """(file hash, line) -> 'function (file:line)' for every wait in the sources, the function found by the
    nearest __global__ or top-level __device__ definition above it."""
    sites = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith((".cu", ".cuh")):
                continue
            lines = open(os.path.join(root, f), encoding="utf-8").read().split("\n")
            kernel = "?"
            for i, line in enumerate(lines, 1):
                if "__global__" in line or line.startswith("__device__"):
                    # the name: the first identifier followed by '(' on this or the next lines
                    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", " ".join(lines[i - 1:i + 3]))
                    m = re.search(r"__(?:global|device)__[^(]*?(\w+)\s*\(", text)
                    if m:
                        kernel = m.group(1)
                if "EXL3_GRID_DEPENDENCY_WAIT()" in line or "EXL3_PDL_PROLOGUE()" in line:
                    sites[(fnv(f), i)] = f"{kernel} ({f}:{i})"
    return sites


def load(path):
    raw = array.array("Q")
    with open(path, "rb") as fh:
        raw.frombytes(fh.read())
    n = min(raw[0], (len(raw) - 1) // 4)  # a file cut short keeps its whole records
    recs = []
    for i in range(n):
        t0, t1, w2, w3 = raw[1 + 4 * i:5 + 4 * i]
        recs.append((t1, t0, w2 >> 32, (w2 >> 16) & 0xFFFF, w2 & 0xFFFF, w3 >> 48, (w3 >> 24) & 0xFFFFFF,
                     w3 & 0xFFFFFF))
    recs.sort()
    return recs


def launches(recs, sites):
    out = []
    cur = None
    ends = []
    for t1, t0, fid, line, sm, threads, grid, block in recs:
        if line & 0x8000:  # a block's end (EXL3_STEP_TRACE_END): attached below
            ends.append((t1, grid, threads))
            continue
        key = (fid, line, grid, threads)
        if cur is None or cur["key"] != key or block in cur["blocks"]:
            cur = {"key": key, "name": sites.get((fid, line), f"{fid:08x}:{line}"), "grid": grid,
                   "threads": threads, "blocks": set(), "t0": [], "t1": []}
            out.append(cur)
        cur["blocks"].add(block)
        cur["t0"].append(t0)
        cur["t1"].append(t1)
    # A block ends before the next launch is released: it belongs to the last launch released before it.
    firsts = [l["t1"][0] for l in out]
    for t, grid, threads in ends:
        i = bisect.bisect_right(firsts, t) - 1
        if i >= 0 and out[i]["grid"] == grid and out[i]["threads"] == threads:
            out[i]["end"] = max(out[i].get("end", 0), t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "../../src/backend/cuda"))
    ap.add_argument("--layer", type=int, default=-1, help="print this layer's launches (default: the middle one)")
    a = ap.parse_args()
    sites = call_sites(a.src)
    recs = load(a.trace)
    ls = launches(recs, sites)
    starts = [i for i, l in enumerate(ls) if l["name"].startswith("embed_kernel")]
    if not starts:
        sys.exit(f"{len(recs)} records, {len(ls)} launches, no step")
    if len(starts) < 3:
        # One recorded step (step_trace_lab): from its embedding to its last launch (whose own share is not known).
        steps = [ls[starts[-1]:]]
    else:
        # Whole steps only (the last may be cut by the buffer's capacity); the first timed step is skipped.
        steps = [ls[starts[i]:starts[i + 1] + 1] for i in range(1, len(starts) - 1)]
    one = len(starts) < 3
    print(f"{len(recs)} records, {len(ls)} launches, {len(steps)} whole steps of {len(steps[0]) - 1} launches"
          + (" (one step: the last launch's share is not known and not counted)" if one else ""))
    lens = [(s[-1]["t1"][0] - s[0]["t1"][0]) / 1e3 for s in steps]
    span = "embed release to the last launch's release" if one else "embed release to the next embed release"
    print(f"step ({span}): median {statistics.median(lens):.1f} us, "
          f"min {min(lens):.1f}, max {max(lens):.1f}")

    # Per launch position: its share (first release to the next launch's first release), median over steps.
    n = len(steps[0]) - 1
    if any(len(s) - 1 != n for s in steps):
        print("warning: steps differ in launch count; using the steps like the first")
        steps = [s for s in steps if len(s) - 1 == n]
    rows = []
    for i in range(n):
        share = statistics.median((s[i + 1]["t1"][0] - s[i]["t1"][0]) / 1e3 for s in steps)
        spread = statistics.median((max(s[i]["t1"]) - s[i]["t1"][0]) / 1e3 for s in steps)
        early = statistics.median(statistics.median(t1 - t0 for t0, t1 in zip(s[i]["t0"], s[i]["t1"])) / 1e3
                                  for s in steps)
        l = steps[0][i]
        # With end records: release -> the last block's end (run), and that end -> the next release (handoff).
        runs = [(s[i]["end"] - s[i]["t1"][0]) / 1e3 for s in steps if "end" in s[i]]
        hand = [(s[i + 1]["t1"][0] - s[i]["end"]) / 1e3 for s in steps if "end" in s[i]]
        run = statistics.median(runs) if runs else None
        handoff = statistics.median(hand) if hand else None
        rows.append((l["name"], l["grid"], l["threads"], len(l["blocks"]), share, spread, early, run, handoff))

    by = {}
    for name, grid, threads, nb, share, *_ in rows:
        k = (name, grid, threads)
        c, t = by.get(k, (0, 0.0))
        by[k] = (c + 1, t + share)
    total = sum(r[4] for r in rows)
    print(f"\nsum of shares {total:.1f} us; by kernel and grid (launches a step, us a step, us a launch, % of step):")
    for (name, grid, threads), (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t:8.1f} us  {c:4d} x {t / c:6.2f}  {100 * t / total:5.1f} %  {name} grid {grid} x {threads}")

    # One layer's chain: from three launches before one attention launch to three before the next.
    att = [r[0:3] for r in rows if "attention_kernel.cuh" in r[0]]
    if not att:
        return
    marks = [max(0, i - 3) for i, r in enumerate(rows) if r[0:3] == att[0]]
    li = a.layer if a.layer >= 0 else len(marks) // 2
    if li + 1 < len(marks):
        lo, hi = marks[li], marks[li + 1]
        print(f"\nlayer {li} (launches {lo}..{hi - 1}): share = first release to the next launch's first release; "
              f"spread = last release - first; wait = median block's time in the wait; run = first release to the "
              f"last block's end, handoff = that end to the next release (kernels with EXL3_STEP_TRACE_END)")
        print("  share     spread   wait     run      handoff  blocks  kernel")
        f = lambda v: f"{v:7.2f}" if v is not None else "      -"
        for name, grid, threads, nb, share, spread, early, run, handoff in rows[lo:hi]:
            print(f"  {share:7.2f}  {spread:7.2f}  {early:7.2f}  {f(run)}  {f(handoff)}  {nb:5d}x{threads:<4d} {name}")
        print(f"  {sum(r[4] for r in rows[lo:hi]):7.2f}  (the layer)")


if __name__ == "__main__":
    main()
