#!/usr/bin/env python3
"""onepass next to llama.cpp on the CPU, on the same GGUF files: next-token parity and prefill /
decode tok/s, side by side in one run.

For each shape (default: the synthetic qwen3.5-0.8b and qwen3.5-2b presets, bf16), this writes the
checkpoint with `onepass synth`, converts it with `onepass convert` to F16 and Q8_0 GGUF, then per
file:
- llama.cpp (npm node-llama-cpp, its prebuilt CPU binaries; benches/llamacpp_cpu.mjs): the
  next-token distribution after fixed ids (controlledEvaluate with probabilities), prefill of
  --prompt-len ids and --decode greedy tokens, best of --reps;
- onepass on the same file (`onepass logits` / `onepass bench --model FILE.gguf`). If this onepass
  cannot load GGUF files, it runs on the safetensors folder the file was converted from (the same
  weights before rounding to F16 / Q8_0), and the report says so.

With --alternate N the timings run N times, llama.cpp then onepass in turn, and each engine's best
prefill and best decode are reported, every alternation's figures listed under the table: a shared
host's speed swings by tens of percent from one minute to the next, and the best of several turns is
what each engine does when it has the machine.

Parity: max |p_onepass - p_llama| over the vocabulary, the total variation distance, and whether
the top token agrees. Stdlib only (plus the two engines).

    (cd /some/dir && npm i -E node-llama-cpp@3.21.1)
    cargo build --release -p onepass
    python3 benches/llamacpp_cpu.py --node-modules /some/dir/node_modules --work /tmp/lc \
        --out docs/benchmarks/llamacpp-cpu.md
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IDS = [9707, 11, 1879, 0, 576, 220, 17, 151, 3841, 13, 248000, 30, 1000, 77, 5, 2048, 40000]


def run(cmd, env=None, capture=True):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=capture, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, time.time() - t0


def softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def onepass_can_load_gguf(onepass, path):
    p = subprocess.run([onepass, "logits", "--model", path, "--ids", "1", "--last", "--device", "cpu"],
                       capture_output=True, text=True)
    return p.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--node-modules", required=True, help="node_modules holding node-llama-cpp")
    ap.add_argument("--work", required=True, help="folder for the checkpoints and GGUF files")
    ap.add_argument("--shapes", default="qwen3.5-0.8b,qwen3.5-2b")
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--alternate", type=int, default=1,
                    help="time the two engines this many times, one after the other in turn, and keep each one's "
                         "best prefill and best decode (on a shared host the speed swings from minute to minute)")
    ap.add_argument("--out", help="write the markdown report here (else stdout)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    env = dict(os.environ, NODE_PATH=args.node_modules, RAYON_NUM_THREADS=str(args.threads))
    rows, notes = [], []
    for shape in args.shapes.split(","):
        folder = os.path.join(args.work, shape)
        if not os.path.exists(os.path.join(folder, "model.safetensors")):
            run([args.onepass, "synth", "--preset", shape, "--out", folder], capture=False)
        for ty in args.types.split(","):
            gguf = os.path.join(args.work, f"{shape}.{ty}.gguf")
            if not os.path.exists(gguf):
                run([args.onepass, "convert", "--model", folder, "--out", gguf, "--type", ty], capture=False)
            def llamacpp():
                out, _ = run(["node", os.path.join(HERE, "llamacpp_cpu.mjs"), "--model", gguf,
                              "--ids", ",".join(map(str, IDS)), "--prompt-len", str(args.prompt_len),
                              "--decode", str(args.decode), "--threads", str(args.threads),
                              "--reps", str(args.reps)], env=env)
                return json.loads(out)

            lc = llamacpp()
            target = gguf if onepass_can_load_gguf(args.onepass, gguf) else folder
            if target == folder:
                notes.append(f"{shape} {ty}: onepass ran on the safetensors folder (this build cannot load GGUF files)")
            out, _ = run([args.onepass, "logits", "--model", target, "--ids", ",".join(map(str, IDS)),
                          "--last", "--device", "cpu"], env=env)
            p1 = softmax(json.loads(out)["logits"][-1])
            p2 = [0.0] * len(p1)
            for tok, p in lc["probs"].items():
                p2[int(tok)] = p
            max_abs = max(abs(a - b) for a, b in zip(p1, p2))
            tv = 0.5 * sum(abs(a - b) for a, b in zip(p1, p2))
            top1 = p1.index(max(p1)) == p2.index(max(p2))
            def onepass():
                out, _ = run([args.onepass, "bench", "--model", target, "--prompt-lens", str(args.prompt_len),
                              "--decode", str(args.decode), "--reps", str(args.reps), "--device", "cpu"], env=env)
                ob = json.loads(out)
                return ob["prefill"][0]["tokens_per_s"], ob["decode"]["tokens_per_s"]

            # Timings: llama.cpp's run above, then onepass, then in turn again.
            lc_runs = [(lc["prefill"]["tokens_per_s"], lc["decode"]["tokens_per_s"])]
            op_runs = [onepass()]
            for _ in range(args.alternate - 1):
                later = llamacpp()
                lc_runs.append((later["prefill"]["tokens_per_s"], later["decode"]["tokens_per_s"]))
                op_runs.append(onepass())
            if args.alternate > 1:
                notes.append(f"{shape} {ty}, every alternation (prefill / decode tok/s): llama.cpp "
                             + ", ".join(f"{p:.1f} / {d:.2f}" for p, d in lc_runs) + "; onepass "
                             + ", ".join(f"{p:.1f} / {d:.2f}" for p, d in op_runs))
            rows.append({
                "shape": shape, "type": ty, "onepass_on": "gguf" if target == gguf else "folder",
                "max_abs_p": max_abs, "tv": tv, "top1": top1, "probs_entries": lc["probs_entries"],
                "lc_prefill": max(p for p, _ in lc_runs), "lc_decode": max(d for _, d in lc_runs),
                "op_prefill": max(p for p, _ in op_runs), "op_decode": max(d for _, d in op_runs),
                "file_bytes": os.path.getsize(gguf),
            })
            print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [
        "| shape | file | onepass on | max abs Δp | total variation | top-1 | llama.cpp prefill tok/s | onepass prefill tok/s | llama.cpp decode tok/s | onepass decode tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['type'].upper()} ({r['file_bytes'] / 1e9:.2f} GB) | {r['onepass_on']} | {r['max_abs_p']:.2e} | "
            f"{r['tv']:.2e} | {'same' if r['top1'] else 'DIFFERENT'} | {r['lc_prefill']:.1f} | {r['op_prefill']:.1f} | "
            f"{r['lc_decode']:.2f} | {r['op_decode']:.2f} |")
    cmd = " ".join(["python3", "benches/llamacpp_cpu.py"] + sys.argv[1:])
    report = "\n".join([
        f"Command: `{cmd}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, threads {args.threads}; prompt {args.prompt_len} ids, "
        f"decode {args.decode} greedy tokens, best of {args.reps}"
        + (f" in each of {args.alternate} alternations, each engine's best prefill and best decode kept"
           if args.alternate > 1 else "")
        + "; llama.cpp through node-llama-cpp "
        f"{lc['node_llama_cpp'] if rows else '?'} (prebuilt CPU binaries).",
        "",
        *lines,
        "",
        *[f"- {n}" for n in notes],
        "",
    ])
    if args.out:
        with open(args.out, "a") as f:
            f.write(report)
    print(report)


if __name__ == "__main__":
    main()
