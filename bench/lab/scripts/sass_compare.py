#!/usr/bin/env python3
"""Compares the machine code of two `cuobjdump --dump-sass` listings function by function.

Functions are matched by their demangled names (c++filt) with namespaces and anonymous-namespace tags removed, so
that a kernel moved between namespaces or translation units is compared with itself. Instructions are compared
without addresses and encodings, branch labels renumbered in order. Prints a line per kernel that differs (and how
many of its instructions do) and a summary.
Usage: sass_compare.py BASE.sass NEW.sass
       sass_compare.py --res BASE.txt NEW.txt   (cuobjdump --dump-resource-usage: registers, stack, shared, local)
"""
import re
import subprocess
import sys

STRIP = [r'_INTERNAL_[0-9a-f]+_\d+_\w+?_[0-9a-f]+::', r'\(anonymous namespace\)::', r'exl3::cuda::exl3k::',
         r'exl3::cuda::attn::', r'exl3::cuda::']


def functions(path):
    funcs, name, body = {}, None, []
    for line in open(path, errors='replace'):
        m = re.match(r'\s*Function : (\S+)', line)
        if m:
            if name:
                funcs.setdefault(name, body)
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*', line)
        if m:
            body.append(m.group(1).rstrip(' ;'))
        elif re.match(r'\s*\.L_x_\d+:', line):
            body.append(line.strip())
    if name:
        funcs.setdefault(name, body)
    return funcs


def demangle(names):
    try:
        out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')
    except OSError:
        out = list(names)
    res = {}
    for n, d in zip(names, out):
        for s in STRIP:
            d = re.sub(s, '', d)
        res[n] = d
    return res


def normalise(body):
    labels = {}

    def lab(m):
        labels.setdefault(m.group(0), f'L{len(labels)}')
        return labels[m.group(0)]

    return [re.sub(r'\.L_x_\d+', lab, i) for i in body]


def resources(path):
    res, name = {}, None
    for line in open(path, errors='replace'):
        m = re.match(r'\s*Function (\S+):', line)
        if m:
            name = m.group(1)
            continue
        if name and 'REG:' in line:
            res[name] = [' '.join(t for t in line.split() if not t.startswith('CONSTANT'))]
            name = None
    return res


def main():
    if sys.argv[1] == '--res':
        a, b = resources(sys.argv[2]), resources(sys.argv[3])
        da, db = demangle(list(a)), demangle(list(b))
        na, nb = {da[k]: v for k, v in a.items()}, {db[k]: v for k, v in b.items()}
        same = 0
        for k in sorted(set(na) & set(nb)):
            if na[k] == nb[k]:
                same += 1
            else:
                print('DIFF', k, na[k][0], '->', nb[k][0])
        print(f'resources: {same} of {len(set(na) & set(nb))} functions the same (registers, stack, shared, local), '
              f'{len(set(na) - set(nb))} only in base, {len(set(nb) - set(na))} only in new')
        return
    a, b = functions(sys.argv[1]), functions(sys.argv[2])
    da, db = demangle(list(a)), demangle(list(b))
    na = {da[k]: normalise(v) for k, v in a.items()}
    nb = {db[k]: normalise(v) for k, v in b.items()}
    same, diff = 0, []
    for k in sorted(set(na) & set(nb)):
        if na[k] == nb[k]:
            same += 1
        else:
            n = sum(x != y for x, y in zip(na[k], nb[k])) + abs(len(na[k]) - len(nb[k]))
            diff.append((k, n, len(na[k]), len(nb[k])))
    for k, n, la, lb in diff:
        print(f'DIFF {n} of {la} / {lb} instructions: {k}')
    only_a, only_b = sorted(set(na) - set(nb)), sorted(set(nb) - set(na))
    for k in only_a:
        print('ONLY BASE', k)
    for k in only_b:
        print('ONLY NEW', k)
    print(f'sass: {same} functions identical, {len(diff)} differ, {len(only_a)} only in base, {len(only_b)} only in new')


main()
