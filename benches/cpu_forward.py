#!/usr/bin/env python3
"""CPU prefill and decode throughput: onepass vs transformers float32, same checkpoint, same run.

    cargo build --release -p onepass
    target/release/onepass synth --preset qwen3.5-0.8b --out /tmp/q08
    python benches/cpu_forward.py --model /tmp/q08 [--lens 128,512,2048] [--decode 32]

Both engines see the same prompt ids (the formula of `onepass bench`), prefill with only the last
position's logits, then decode greedily with full-vocabulary logits per step. onepass runs first,
then transformers (never at the same time). Prints a markdown table with ratios.
"""

import json
import os
import subprocess
import sys
import time

import torch
import transformers

from forward_args import forward_parser  # benches/forward_args.py


def onepass(binary, model, lens, decode, reps):
    out = subprocess.run(
        [binary, "bench", "--model", model, "--prompt-lens", ",".join(map(str, lens)), "--decode", str(decode),
         "--reps", str(reps)],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def hf(model_dir, lens, decode, reps, vocab):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ids_all = [((i * 2654435761 + 12345) % vocab) for i in range(max(lens))]
    res = {"prefill": [], "threads": torch.get_num_threads()}
    with torch.no_grad():
        for n in lens:
            best = float("inf")
            for _ in range(reps):
                ids = torch.tensor([ids_all[:n]])
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
                best = min(best, time.perf_counter() - t0)
            res["prefill"].append({"tokens": n, "seconds": best, "tokens_per_s": n / best})
            print(f"transformers prefill {n}: {n / best:.1f} tok/s", file=sys.stderr)
        first = lens[0]
        out = model(input_ids=torch.tensor([ids_all[:first]]), use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        nxt = out.logits[0, -1].argmax().item()
        t0 = time.perf_counter()
        for _ in range(decode):
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            nxt = out.logits[0, -1].argmax().item()
        secs = time.perf_counter() - t0
        res["decode"] = {"tokens": decode, "seconds": secs, "tokens_per_s": decode / secs}
    res["peak_rss_bytes"] = peak_rss()
    return res


def main():
    ap = forward_parser("128,512,2048")
    a = ap.parse_args()
    lens = [int(x) for x in a.lens.split(",")]
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    vocab = (cfg.get("text_config") or cfg)["vocab_size"]
    op = onepass(a.onepass, a.model, lens, a.decode, a.reps)
    tr = hf(a.model, lens, a.decode, a.reps, vocab)
    print(f"onepass threads {op['threads']}, torch threads {tr['threads']}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print("| work | onepass tok/s | transformers f32 tok/s | ratio |")
    print("|---|---|---|---|")
    for o, t in zip(op["prefill"], tr["prefill"]):
        print(f"| prefill {o['tokens']} | {o['tokens_per_s']:.1f} | {t['tokens_per_s']:.1f} | "
              f"{o['tokens_per_s'] / t['tokens_per_s']:.2f}x |")
    o, t = op["decode"], tr["decode"]
    print(f"| decode {o['tokens']} (after {lens[0]}) | {o['tokens_per_s']:.2f} | {t['tokens_per_s']:.2f} | "
          f"{o['tokens_per_s'] / t['tokens_per_s']:.2f}x |")
    gb = 1 << 30
    print(f"\nonepass: weights {op['weight_bytes'] / gb:.3f} GiB, files {op['file_bytes'] / gb:.3f} GiB, "
          f"peak RSS {op['peak_rss_bytes'] / gb:.3f} GiB "
          f"({op['peak_rss_bytes'] / op['file_bytes']:.2f}x the files); "
          f"transformers peak RSS {tr['peak_rss_bytes'] / gb:.3f} GiB")


if __name__ == "__main__":
    main()
