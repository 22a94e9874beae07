#!/usr/bin/env python3
"""The decider-ai / onepass side-by-side of issue #4 from result files of one device session.

    python3 benches/side_by_side.py --decider decider-server.json [--decider decider-library.json] \
        --onepass bench.jsonl [--onepass more.jsonl ...] [--markdown]

--decider: JSON written by benches/systemone_gpu_decider.py (benches/gpu-decider.sh). --onepass: JSON lines written
by `onepass bench-systemone` (one line per run; the device string names the precision and kernels). Prints p50 per
workload, the p50 ratio of the first decider file to each run, and decisions/s at each saturation level (decider-ai:
requests in flight through its server's batcher; onepass: requests per engine call). A run stopped early (partial)
is compared on the workloads it has. Both sides must come from the same device session for the ratios to mean
anything (decider-ai's third workload varied by 50% between sessions; docs/benchmarks/cuda-systemone.md).
"""
import argparse
import json
import sys


def rows_of(workloads, level):
    """(unique tokens, p50, p95, {saturation level: decisions/s}) per workload; `level` names the saturation key."""
    return [
        (w["unique_tokens"], w["p50_ms"], w["p95_ms"],
         {s[level]: s["decisions_per_s"] for s in w.get("saturating") or []})
        for w in workloads
    ]


def decider_rows(path):
    d = json.load(open(path))
    label = d.get("label", path) + ("" if d.get("complete", True) else " (stopped early: partial)")
    return label, rows_of(d["workloads"], "requests_in_flight")


def onepass_runs(path):
    runs = []
    for line in open(path):
        if line.strip():
            d = json.loads(line)
            runs.append((f"onepass {d.get('device', '?')}", rows_of(d["workloads"], "requests_per_call")))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decider", action="append", default=[], help="decider-ai result JSON (the first is the base)")
    ap.add_argument("--onepass", action="append", default=[], help="onepass bench-systemone JSON lines")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    a = ap.parse_args()
    runs = [decider_rows(p) for p in a.decider]
    for p in a.onepass:
        runs.extend(onepass_runs(p))
    if not runs:
        sys.exit("nothing to compare: give --decider and/or --onepass files")
    base = runs[0][1] if a.decider else None
    tokens = [r[0] for r in max((rows for _, rows in runs), key=len)]
    for label, rows in runs:
        if [r[0] for r in rows] != tokens[: len(rows)]:
            sys.exit(f"{label}: workloads of {[r[0] for r in rows]} unique tokens, not {tokens}: not the same work")
    levels = sorted({k for _, rows in runs for r in rows for k in r[3]})
    if a.markdown:
        head = "| engine | " + " | ".join(f"{t:,} tokens p50 ms" for t in tokens)
        head += " | ratio (decider-ai / this) |" if base else " |"
        print(head)
        print("|" + " --- |" * (len(tokens) + 1 + (1 if base else 0)))
        for label, rows in runs:
            cells = " | ".join([f"{r[1]:.2f}" for r in rows] + ["-"] * (len(tokens) - len(rows)))
            ratio = " / ".join(f"{b[1] / r[1]:.2f}x" for b, r in zip(base, rows)) if base else ""
            print(f"| {label} | {cells} |" + (f" {ratio} |" if base else ""))
        print()
        print("| engine | " + " | ".join(f"{t:,} tokens, decisions/s at " + " / ".join(map(str, levels)) for t in tokens) + " |")
        print("|" + " --- |" * (len(tokens) + 1))
        for label, rows in runs:
            sat = [" / ".join(f"{r[3][k]:,.0f}" if k in r[3] else "-" for k in levels) for r in rows]
            print(f"| {label} | " + " | ".join(sat + ["-"] * (len(tokens) - len(rows))) + " |")
        return
    for label, rows in runs:
        print(label)
        for r, b in zip(rows, base or [None] * len(rows)):  # a partial run: its workloads only
            ratio = f"   decider-ai / this {b[1] / r[1]:.2f}x" if b else ""
            sat = "  ".join(f"{k}: {r[3][k]:,.0f}/s" for k in levels if k in r[3])
            print(f"  {r[0]:>6,} tokens  p50 {r[1]:8.2f} ms  p95 {r[2]:8.2f} ms{ratio}   saturation {sat}")


if __name__ == "__main__":
    main()
