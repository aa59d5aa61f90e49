#!/usr/bin/env python3
"""Compare a minfer node dump with an lldump tensor dump of the same position, node by node.

usage: cmpdump.py LLAMA_DUMP_DIR MINFER_DUMP_DIR   (needs numpy)

Prints, per minfer node (in execution order), the matching llama.cpp tensor, how many values
differ in their bits and the largest difference, then the first node that differs.
"""
import os
import sys

import numpy as np


def index(d):
    return [l.rstrip('\n').split('\t') for l in open(os.path.join(d, 'index.tsv'))]


def main(ll, mf):
    lrows, mrows = index(ll), index(mf)
    lnames = [r[0] for r in lrows]

    def llname(m):
        base, _, L = m.rpartition('-')
        if m == 'token_embd':
            return 'embd'
        if m in ('result_norm', 'result_output'):
            return m
        proj = {'attn_q': 'Qcur', 'attn_k': 'Kcur', 'attn_v': 'Vcur'}
        if base in proj:  # the projection, after its bias add when there is one
            c = [r[0] for r in lrows if r[0].split('#')[0] == f'{proj[base]}-{L}' and r[1] in ('MUL_MAT', 'ADD')]
            return c[-1] if c else None
        if base in ('Qcur_normed', 'Kcur_normed'):
            return m
        if base in ('Qcur_normed_rope', 'Kcur_normed_rope', 'attn_q_rope', 'attn_k_rope'):
            k = 'Qcur' if ('Q' in base or 'q_' in base) else 'Kcur'
            c = [r[0] for r in lrows if r[0].split('#')[0] == f'{k}-{L}' and r[1] == 'ROPE']
            return c[-1] if c else None
        if base == 'attn':
            return f'kqv_out-{L}'
        if base == 'attn_output':
            c = [r[0] for r in lrows if r[1] == 'MUL_MAT' and len(r) > 5 and r[5] == f'kqv_out-{L}']
            return c[0] if c else None
        if base == 'mul':
            return f'ffn_swiglu-{L}'
        if base == 'ffn_down':
            return f'ffn_out-{L}'
        return m if m in lnames else None

    first = None
    for r in mrows:
        m = r[0]
        if r[1] in ('kv_store', 'kv_load'):
            continue
        l = llname(m)
        if l is None or l not in lnames:
            print(f'{m:28s} -> (no llama.cpp tensor)')
            continue
        a = np.fromfile(os.path.join(mf, m + '.f32'), dtype=np.float32)
        b = np.fromfile(os.path.join(ll, l + '.f32'), dtype=np.float32)
        if a.shape != b.shape:
            print(f'{m:28s} -> {l:28s} shape {a.shape} vs {b.shape}')
            continue
        nd = int((a.view(np.uint32) != b.view(np.uint32)).sum())
        d = np.abs(a.astype(np.float64) - b)
        i = int(np.argmax(d))
        print(f'{m:28s} -> {l:28s} ndiff {nd:6d}/{a.size} max {d.max():.3g} at {i} ({a[i]!r} vs {b[i]!r})')
        if nd and first is None:
            first = m
    print('first differing:', first)


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
