#!/usr/bin/env python3
"""Summarises an Nsight Compute SASS source page (ncu --page source --print-source sass --csv): instruction mix
by opcode (share of warp instructions executed, share of stall samples) and the stall reasons.
Usage: python3 tools/cuda/sass-summary.py sass.csv (docs/benchmarks/history/cuda-systemone-2026-11-30.md, eighth measurement)."""
import csv, collections, sys
lines = open(sys.argv[1]).read().splitlines()
i = [k for k, l in enumerate(lines) if l.startswith('"Address"')][0]
rows = list(csv.reader(lines[i:]))
h = rows[0]; ix = {k: h.index(k) for k in h}
data = [r for r in rows[1:] if len(r) == len(h)]
def f(x):
    try: return float(x.replace(',', ''))
    except ValueError: return 0.0
S = 'Warp Stall Sampling (All Samples)'
tot_s = sum(f(r[ix[S]]) for r in data); tot_i = sum(f(r[ix['Instructions Executed']]) for r in data)
print(f"{len(data)} SASS lines, {tot_i:.0f} warp instructions executed, {tot_s:.0f} stall samples")
byop, bys = collections.Counter(), collections.Counter()
for r in data:
    w = r[ix['Source']].split()
    op = (w[1] if w and w[0].startswith('@') and len(w) > 1 else (w[0] if w else '?')).split('.')[0]
    byop[op] += f(r[ix['Instructions Executed']]); bys[op] += f(r[ix[S]])
print("opcode      instructions  stall samples")
for op, c in byop.most_common(20):
    print(f"{op:10s} {c / tot_i * 100:12.1f}% {bys[op] / tot_s * 100:13.1f}%")
agg = collections.Counter()
for r in data:
    for k in h:
        if k.startswith('stall_') and 'Not' not in k: agg[k] += f(r[ix[k]])
print("stall reasons (share of samples):", ", ".join(f"{k[6:]} {v / tot_s * 100:.1f}%" for k, v in agg.most_common(10)))
