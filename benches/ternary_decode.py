#!/usr/bin/env python3
"""Decode of a ternary pack against this machine's memory read bandwidth, measured in the same run.

For each GGUF file given (e.g. the 27B-shape random packs written by `onepass synth --preset qwen3.5-27b
--format pq2_0|ptq1_0 --out FILE`), repeated --rounds times, alternating: the memory read bandwidth
(`examples/mem_read`, a parallel xor-reduce over 1 GiB), then `onepass bench --device cpu` on the file
(prefill of --prompt-len ids, --decode greedy tokens with full-vocabulary logits each). Bytes per decoded
token are the file's tensor bytes less the embedding table (a decode step reads one of its rows); GB/s is
that times decode tok/s, and the share is of the bandwidth measured just before, in the same round.
The best round (highest decode tok/s) of each file is reported.

    cargo build --release -p onepass -p onepass-kernels --example mem_read
    python3 benches/ternary_decode.py /tmp/27b.pq2_0.gguf /tmp/27b.ptq1_0.gguf

Standard library only.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

# GGUF metadata value types: fixed sizes (string = 8, array = 9 are read specially).
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tensor_bytes(path):
    """{name: bytes} of a GGUF file's tensors, from the gaps between their offsets."""
    with open(path, "rb") as f:
        magic, version = struct.unpack("<4sI", f.read(8))
        if magic != b"GGUF" or version not in (2, 3):
            sys.exit(f"{path}: not a GGUF v2/v3 file")
        n_tensors, n_kv = struct.unpack("<QQ", f.read(16))

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def skip(ty):
            if ty == 8:
                string()
            elif ty == 9:
                (ety,) = struct.unpack("<I", f.read(4))
                (n,) = struct.unpack("<Q", f.read(8))
                if ety in FIXED:
                    f.seek(n * FIXED[ety], 1)
                else:
                    for _ in range(n):
                        skip(ety)
            else:
                f.seek(FIXED[ty], 1)

        align = 32
        for _ in range(n_kv):
            key = string()
            (ty,) = struct.unpack("<I", f.read(4))
            if key == "general.alignment":
                (align,) = struct.unpack("<I", f.read(4))
            else:
                skip(ty)
        infos = []
        for _ in range(n_tensors):
            name = string()
            (nd,) = struct.unpack("<I", f.read(4))
            f.seek(8 * nd + 4, 1)
            (off,) = struct.unpack("<Q", f.read(8))
            infos.append((off, name))
        data = (f.tell() + align - 1) // align * align
    end = os.path.getsize(path) - data
    infos.sort()
    return {name: (infos[i + 1][0] if i + 1 < len(infos) else end) - off for i, (off, name) in enumerate(infos)}


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--mem-read", default="target/release/examples/mem_read")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    best = {}
    for r in range(a.rounds):
        for path in a.files:
            bw = run([a.mem_read, "1024"], env)["read_gbs"]
            ob = run([a.onepass, "bench", "--model", path, "--prompt-lens", str(a.prompt_len),
                      "--decode", str(a.decode), "--reps", "1", "--device", "cpu"], env)
            sizes = tensor_bytes(path)
            per_token = sum(sizes.values()) - sizes.get("token_embd.weight", 0)
            tok_s = ob["decode"]["tokens_per_s"]
            row = {"file": os.path.basename(path), "round": r, "read_gbs": bw, "bytes_per_token": per_token,
                   "decode_tok_s": tok_s, "decode_gbs": per_token * tok_s / 1e9,
                   "prefill_tok_s": ob["prefill"][0]["tokens_per_s"], "peak_rss": ob["peak_rss_bytes"],
                   "file_bytes": os.path.getsize(path)}
            row["share"] = row["decode_gbs"] / bw
            print(json.dumps(row), file=sys.stderr)
            if path not in best or tok_s > best[path]["decode_tok_s"]:
                best[path] = row
    print(f"threads {a.threads}; prompt {a.prompt_len} ids, decode {a.decode} tokens; best of {a.rounds} rounds\n")
    print("| file | GB read per token | memory read GB/s (same round) | decode tok/s | decode GB/s | % of read | prefill tok/s | peak RSS / file |")
    print("|---|---|---|---|---|---|---|---|")
    for path in a.files:
        b = best[path]
        print(f"| {b['file']} ({b['file_bytes'] / 1e9:.2f} GB) | {b['bytes_per_token'] / 1e9:.2f} | {b['read_gbs']:.1f} | "
              f"{b['decode_tok_s']:.3f} | {b['decode_gbs']:.1f} | {100 * b['share']:.0f}% | {b['prefill_tok_s']:.2f} | "
              f"{b['peak_rss'] / b['file_bytes']:.2f}x |")


if __name__ == "__main__":
    main()
