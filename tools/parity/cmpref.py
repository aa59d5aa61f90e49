#!/usr/bin/env python3
"""Check lldump against a reference file: every step's top-20 logits of one record.

usage: cmpref.py LLDUMP MODEL REFERENCE.jsonl RECORD_INDEX   (needs numpy)

The reference prints logits with 4 decimals, so a faithful build differs by at most 5e-5.
"""
import json
import subprocess
import sys
import tempfile

import numpy as np


def main(lldump, model, jl, ri):
    r = [json.loads(l) for l in open(jl) if l.strip()][ri]
    steps = len(r['top20_per_step'])
    ids = (r['prompt_ids'] + r['generated_ids'])[:len(r['prompt_ids']) + steps - 1]
    frm = len(r['prompt_ids']) - 1
    with tempfile.NamedTemporaryFile(suffix='.f32') as out:
        subprocess.run([lldump, '-m', model, '--ids', ','.join(map(str, ids)), '--from', str(frm),
                        '--top', '1', '--logits-out', out.name], check=True, stdout=subprocess.DEVNULL)
        L = np.fromfile(out.name, dtype=np.float32).reshape(steps, -1)
    worst = max(abs(float(L[s, i]) - v) for s, top in enumerate(r['top20_per_step']) for i, v in top)
    print(f'record {ri}: {steps} steps, max |diff| {worst:.6f}')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
