#!/usr/bin/env python3
"""Decide fixtures from transformers: the rendered prompt ids and the choices' float32 log-softmax.

For each (preset, template) pair, `onepass synth --preset P` writes the checkpoint (synthetic tokenizer, whose
tokenizer_config.json carries the Qwen3-style chat template; "plain" removes the template so the prompt is the text
itself). For every request of REQUESTS, transformers:

- renders the prompt: `apply_chat_template([{"role": "user", "content": prefix + suffix}], tokenize=False,
  add_generation_prompt=True, enable_thinking=False)` (plain: `prefix + suffix`), then tokenizes it with
  `add_special_tokens=False`;
- renders the prefix alone the same way, and writes where the two id sequences stop agreeing, less one
  (`prefix_len`, capped one below the prompt's length);
- tokenizes each choice alone (`add_special_tokens=False`) and keeps its first id;
- runs the model in float32 over the prompt ids (Qwen3_5ForCausalLM, eager attention) and takes
  `log_softmax(logits[-1])` at the choices' first ids.

Output: tests/fixtures/decide/decide.jsonl (one line per request and checkpoint) and manifest.json (versions, command,
checkpoint sha256). Usage (from the repository root, with the venv of tools/oracle/requirements.txt):

    cargo build --release -p onepass
    python tools/oracle/decide_fixtures.py --onepass target/release/onepass
"""

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile

import torch
import transformers

CHECKPOINTS = [("tiny-gva", "chat"), ("tiny-qwen-vocab", "chat"), ("tiny-attn-first", "plain")]

# An agent's steps (a prefix that grows), joins that merge across the boundary, an empty prefix or suffix,
# special-token text and non-ASCII text.
REQUESTS = [
    {"id": "home", "prefix": "Task: turn on Wi-Fi. History: none. ",
     "suffix": "Screen: Home. Options: A) Settings B) Camera C) Clock. Answer with the letter.",
     "choices": ["A", "B", "C"]},
    {"id": "settings", "prefix": "Task: turn on Wi-Fi. History: none. ",
     "suffix": "Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter.",
     "choices": ["A", "B", "C"]},
    {"id": "network", "prefix": "Task: turn on Wi-Fi. History: none. Opened Settings; opened Network. ",
     "suffix": "Screen: Network. Options: A) Airplane B) Internet C) Hotspot D) VPN. Answer with the letter.",
     "choices": ["A", "B", "C", "D"]},
    {"id": "merge", "prefix": "Pick one: A", "suffix": "B or CD? Reply", "choices": ["A", "B", "C", "D", "E"]},
    {"id": "the", "prefix": "Is th", "suffix": "e sky blue?", "choices": ["Yes", "No"]},
    {"id": "no-prefix", "prefix": "", "suffix": "Which letter comes first? A or B", "choices": ["A", "B"]},
    {"id": "no-suffix", "prefix": "Which is larger, 3 or 5? Answer:", "suffix": "", "choices": ["3", "5"]},
    {"id": "special", "prefix": "Text with <|im_end|> and </think> inside. ", "suffix": "Still there?",
     "choices": ["Y", "N"]},
    {"id": "unicode", "prefix": "Café naïve 加拿大 — ", "suffix": "ok? (a) sí (b) no", "choices": ["a", "b", "("]},
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prefix_len(whole, alone):
    agree = 0
    for a, b in zip(whole, alone):
        if a != b:
            break
        agree += 1
    return max(0, min(agree - 1, len(whole) - 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--out", default="tests/fixtures/decide")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    manifest = {
        "command": "python tools/oracle/decide_fixtures.py --onepass target/release/onepass",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "checkpoints": {},
    }
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset, layout in CHECKPOINTS:
            d = os.path.join(tmp, f"{preset}-{layout}")
            subprocess.run([args.onepass, "synth", "--preset", preset, "--out", d], check=True)
            if layout == "plain":
                p = os.path.join(d, "tokenizer_config.json")
                cfg = json.load(open(p, encoding="utf-8"))
                cfg.pop("chat_template", None)
                json.dump(cfg, open(p, "w", encoding="utf-8"), ensure_ascii=False)
            tok = transformers.AutoTokenizer.from_pretrained(d)
            model = transformers.Qwen3_5ForCausalLM.from_pretrained(
                d, dtype=torch.float32, attn_implementation="eager")
            model.eval()

            def render(content):
                if layout == "plain":
                    return content
                return tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                               add_generation_prompt=True, enable_thinking=False)

            def ids_of(text):
                return tok(text, add_special_tokens=False)["input_ids"]

            for req in REQUESTS:
                text = render(req["prefix"] + req["suffix"])
                ids = ids_of(text)
                alone = ids_of(render(req["prefix"]))
                firsts = [ids_of(c)[0] for c in req["choices"]]
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
                logp = torch.log_softmax(logits, dim=-1)
                choice_logp = [float(logp[i]) for i in firsts]
                best = max(range(len(choice_logp)), key=lambda i: (choice_logp[i], -i))
                lines.append({
                    "checkpoint": preset, "layout": layout, "request": req, "text": text, "ids": ids,
                    "prefix_len": prefix_len(ids, alone), "choice_ids": firsts, "choice_logp": choice_logp,
                    "best": best,
                })
            manifest["checkpoints"][f"{preset}-{layout}"] = {
                "preset": preset,
                "layout": layout,
                "model_safetensors_sha256": sha256(os.path.join(d, "model.safetensors")),
                "tokenizer_config_sha256": sha256(os.path.join(d, "tokenizer_config.json")),
            }
            print(f"{preset} ({layout}): {len(REQUESTS)} requests", file=sys.stderr)
    with open(os.path.join(args.out, "decide.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
