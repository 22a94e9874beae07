#!/usr/bin/env python3
"""Generation throughput: `onepass session` against transformers `generate`, same checkpoint, same run, on the CPU
or on a CUDA GPU (`--device cuda`).

    cargo build --release -p onepass
    target/release/onepass synth --preset qwen3.5-0.8b --tokenizer testdata/qwen3_5-tokenizer --out /tmp/g08
    python benches/generate.py --model /tmp/g08 [--lens 128,512] [--decode 32] [--reps 2] [--device cpu|cuda]

Both engines get the same prompt text (made to tokenize to exactly N ids; both sides' prompt ids are counted and must
agree) and generate greedily: onepass through its generation path (`onepass session`, one {"cmd": "generate"} line per
run: chunked prefill, full-vocabulary logits per step, sampling, incremental detokenizing), transformers through
`model.generate(do_sample=False)` with `min_new_tokens` = `max_new_tokens`. onepass runs first, then transformers
(never at the same time).

- prefill tok/s: onepass `n_prompt / prefill_ms`; transformers N / the time of `generate(max_new_tokens=1)` (the
  prefill and one sampling step).
- decode tok/s: onepass `decode_tok_s` (decode forwards per second of their wall time); transformers
  (D - 1) / (time of D new tokens - time of 1).

The best of `--reps` runs each. transformers loads the weights in `--hf-dtype` (default: float32 on the CPU, its fastest
CPU path, where onepass keeps bf16 weights and computes in f32; bfloat16 on CUDA, where onepass runs its default GPU
precision). On CUDA both sides get one untimed warm-up run per prompt length first (kernel compilation, graph
capture, the allocator's pools), and transformers' times end with `torch.cuda.synchronize()`. Prints a markdown table.
"""

import json
import os
import platform
import subprocess
import sys
import time

import torch
import transformers

from forward_args import forward_parser  # benches/forward_args.py

SENTENCE = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the distant hills. "


def prompt_of(tok, n):
    text = SENTENCE * (n // 8 + 2)
    ids = tok(text, add_special_tokens=False)["input_ids"][:n]
    text = tok.decode(ids)
    got = tok(text, add_special_tokens=False)["input_ids"]
    assert len(got) == n, (len(got), n)
    return text


def onepass(binary, model, prompts, decode, reps, device):
    lines = []
    for n, text in prompts:
        if device == "cuda":
            lines.append(json.dumps({"cmd": "generate", "id": f"warm/{n}", "prompt": text, "max_tokens": decode,
                                     "temperature": 0}))
        for r in range(reps):
            lines.append(json.dumps({"cmd": "generate", "id": f"{n}/{r}", "prompt": text, "max_tokens": decode,
                                     "temperature": 0}))
    out = subprocess.run([binary, "session", "--model", model, "--device", device], input="\n".join(lines) + "\n",
                         check=True, capture_output=True, text=True)
    print(out.stderr.strip(), file=sys.stderr)
    res = {}
    for line in out.stdout.splitlines():
        v = json.loads(line)
        if "error" in v:
            sys.exit(f"onepass: {v}")
        if v["id"].startswith("warm/"):
            continue
        n = int(v["id"].split("/")[0])
        best = res.setdefault(n, {"n_prompt": v["n_prompt"], "prefill": 0.0, "decode": 0.0, "n_generated": 0})
        best["prefill"] = max(best["prefill"], v["n_prompt"] / (v["prefill_ms"] / 1e3))
        best["decode"] = max(best["decode"], v["decode_tok_s"])
        best["n_generated"] = v["n_generated"]
        best["tokens"] = v["tokens"]
        print(f"onepass {n}: prefill {v['n_prompt'] / (v['prefill_ms'] / 1e3):.1f} tok/s, decode "
              f"{v['decode_tok_s']:.2f} tok/s ({v['n_generated']} tokens)", file=sys.stderr)
    return res


def hf(model_dir, tok, prompts, decode, reps, dtype, device):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cls = transformers.Qwen3_5ForConditionalGeneration if cfg["model_type"] == "qwen3_5" else \
        transformers.Qwen3_5ForCausalLM
    model = cls.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    model.eval()
    res = {}

    def run(x, k):
        return model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=k,
                              min_new_tokens=k, pad_token_id=0)

    def timed(x, k):
        t0 = time.perf_counter()
        run(x, k)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    with torch.no_grad():
        for n, text in prompts:
            x = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=device)
            if device == "cuda":
                out = run(x, decode)
                res.setdefault("tokens", {})[n] = out[0, x.shape[1]:].tolist()
            t1 = min(timed(x, 1) for _ in range(reps))
            td = min(timed(x, decode) for _ in range(reps))
            res[n] = {"n_prompt": x.shape[1], "prefill": n / t1, "decode": (decode - 1) / max(td - t1, 1e-9),
                      "tokens": res.get("tokens", {}).get(n)}
            print(f"transformers {n}: prefill {n / t1:.1f} tok/s, decode {res[n]['decode']:.2f} tok/s",
                  file=sys.stderr)
    return res, torch.get_num_threads()


def main():
    ap = forward_parser("128,512")
    ap.add_argument("--hf-dtype", help="transformers' weight dtype (default: float32 on cpu, bfloat16 on cuda)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--no-peer", action="store_true", help="onepass alone (no transformers side)")
    a = ap.parse_args()
    a.hf_dtype = a.hf_dtype or ("bfloat16" if a.device == "cuda" else "float32")
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    prompts = [(n, prompt_of(tok, n)) for n in map(int, a.lens.split(","))]
    op = onepass(a.onepass, a.model, prompts, a.decode, a.reps, a.device)
    if a.no_peer:
        for n, _ in prompts:
            print(f"| prefill {n} | {op[n]['prefill']:.1f} |\n| decode {a.decode} after {n} | {op[n]['decode']:.2f} |")
        return
    tr, threads = hf(a.model, tok, prompts, a.decode, a.reps, a.hf_dtype, a.device)
    gpu = f", {torch.cuda.get_device_name()}" if a.device == "cuda" else ""
    print(f"\n{a.model} on {a.device}{gpu}: torch {torch.__version__} ({threads} threads), transformers {transformers.__version__} "
          f"({a.hf_dtype}), Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"| work | onepass tok/s | transformers {a.hf_dtype} tok/s | ratio |")
    print("|---|---|---|---|")
    for n, _ in prompts:
        o, t = op[n], tr[n]
        assert o["n_prompt"] == t["n_prompt"] == n, (o, t)
        print(f"| prefill {n} | {o['prefill']:.1f} | {t['prefill']:.1f} | {o['prefill'] / t['prefill']:.2f}x |")
        print(f"| decode {a.decode} after {n} | {o['decode']:.2f} | {t['decode']:.2f} | "
              f"{o['decode'] / t['decode']:.2f}x |")
    for n, _ in prompts:
        a_, b_ = op[n].get("tokens") or [], tr[n].get("tokens") or []
        if b_:
            same = next((i for i, (p, q) in enumerate(zip(a_, b_)) if p != q), min(len(a_), len(b_)))
            print(f"greedy tokens after {n}: the first {same} of {len(a_)} equal transformers' {a.hf_dtype} ones")


if __name__ == "__main__":
    main()
