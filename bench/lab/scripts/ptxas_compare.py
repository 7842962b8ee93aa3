#!/usr/bin/env python3
"""Compares `nvcc -Xptxas -v` reports of two builds kernel by kernel: registers, barriers, static shared memory,
stack frame, spill stores and loads. Kernels are matched by demangled names without namespaces (c++filt), so that
kernels moved between namespaces or translation units are compared with themselves.
Usage: ptxas_compare.py BASE.log[,..] NEW.log[,..] [name-filter]   (the logs of the compiles, ptxas lines included)
"""
import re
import subprocess
import sys

STRIP = [r'_INTERNAL_[0-9a-f]+_\d+_\w+?_[0-9a-f]+::', r'\(anonymous namespace\)::', r'exl3::cuda::exl3k::',
         r'exl3::cuda::attn::', r'exl3::cuda::']


def parse(paths):
    res, name = {}, None
    for p in paths:
        for line in open(p, errors='replace'):
            m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
            if m:
                name = m.group(1)
                res[name] = {}
                continue
            if name is None:
                continue
            m = re.search(r'(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads', line)
            if m:
                res[name].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
            m = re.search(r'Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?', line)
            if m:
                res[name].update(regs=int(m.group(1)), bars=int(m.group(2) or 0), smem=int(m.group(3) or 0))
                name = None
    return res


def demangled(d):
    names = list(d)
    out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')
    res = {}
    for n, s in zip(names, out):
        for p in STRIP:
            s = re.sub(p, '', s)
        res[s] = d[n]
    return res


def main():
    a = demangled(parse(sys.argv[1].split(',')))
    b = demangled(parse(sys.argv[2].split(',')))
    flt = sys.argv[3] if len(sys.argv) > 3 else ''
    ka, kb = {k for k in a if flt in k}, {k for k in b if flt in k}
    same = 0
    for k in sorted(ka & kb):
        if a[k] == b[k]:
            same += 1
        else:
            print('DIFF', k, a[k], '->', b[k])
    for k in sorted(ka - kb):
        print('ONLY BASE', k)
    for k in sorted(kb - ka):
        print('ONLY NEW', k)
    regs = sorted({v.get('regs') for k, v in b.items() if k in kb})
    spills = sum(v.get('spill_st', 0) + v.get('spill_ld', 0) for k, v in b.items() if k in kb)
    print(f'ptxas -v: {same} of {len(ka & kb)} kernels the same registers / barriers / smem / stack / spills, '
          f'{len(ka - kb)} only in base, {len(kb - ka)} only in new (new: registers {regs[0] if regs else "-"}..'
          f'{regs[-1] if regs else "-"}, spill bytes {spills})')


main()
