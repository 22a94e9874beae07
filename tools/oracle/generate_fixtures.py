#!/usr/bin/env python3
"""Greedy generation fixtures: transformers `generate(do_sample=False)` in float32 on synthetic checkpoints.

For each preset in PRESETS, `onepass synth --preset P --tokenizer T` writes the checkpoint (deterministic bytes), the
ChatML template below goes next to it as chat_template.jinja, and transformers loads it in float32 (eager attention)
and generates MAX_NEW tokens greedily for every case: raw prompts (tokenized as transformers does, no special
tokens added) and chat messages (`apply_chat_template(..., add_generation_prompt=True)`). Generation stops early only
at the end-of-sequence ids onepass uses for the same folder (config.json's eos_token_id and the tokenizer's
eos_token), passed to `generate` explicitly so both sides stop on the same ids.

Writes tests/fixtures/generate/greedy.jsonl (one case per line: preset, name, prompt or messages, prompt_ids,
tokens) and manifest.json (versions, command, chat template, checkpoint sha256, eos ids).

Usage (from the repository root, with the venv of tools/oracle/requirements.txt and testdata from
tools/setup-testdata.sh):
    cargo build --release -p onepass
    python tools/oracle/generate_fixtures.py --onepass target/release/onepass
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import load_float32, manifest_head, onepass_parser, sha256  # noqa: E402

PRESETS = ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"]
MAX_NEW = 40
# ChatML with the <think> handling of Qwen3-style templates (enable_thinking=false opens an empty think block).
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
CASES = [
    ("prompt-short", {"prompt": "The capital of France is"}),
    ("prompt-code", {"prompt": "def fibonacci(n):\n    "}),
    ("prompt-long", {"prompt": "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 3}),
    ("chat-one", {"messages": [{"role": "user", "content": "Say hello."}]}),
    (
        "chat-turns",
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another one?"},
            ]
        },
    ),
]


def main():
    ap = onepass_parser("tests/fixtures/generate")
    ap.add_argument("--tokenizer", default="testdata/qwen3_5-tokenizer")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    manifest = manifest_head(
        "generate_fixtures.py",
        torch=torch.__version__,
        transformers=transformers.__version__,
        max_new_tokens=MAX_NEW,
        chat_template=CHATML,
        presets={},
    )
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            d = os.path.join(tmp, preset)
            subprocess.run([a.onepass, "synth", "--preset", preset, "--out", d, "--tokenizer", a.tokenizer], check=True)
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(CHATML)
            model, cfg = load_float32(d)
            tok = transformers.AutoTokenizer.from_pretrained(d)
            eos = set()
            for c in (cfg, cfg.get("text_config") or {}):
                e = c.get("eos_token_id")
                if isinstance(e, int):
                    eos.add(e)
                elif isinstance(e, list):
                    eos.update(e)
            if tok.eos_token_id is not None:
                eos.add(tok.eos_token_id)
            eos = sorted(eos)
            manifest["presets"][preset] = {
                "model_safetensors_sha256": sha256(os.path.join(d, "model.safetensors")),
                "eos_token_id": eos,
            }
            for name, case in CASES:
                if "prompt" in case:
                    ids = tok(case["prompt"], add_special_tokens=False)["input_ids"]
                else:
                    ids = tok.apply_chat_template(case["messages"], tokenize=True, add_generation_prompt=True)
                    if isinstance(ids, dict) or hasattr(ids, "keys"):
                        ids = ids["input_ids"]
                x = torch.tensor([list(ids)], dtype=torch.long)
                with torch.no_grad():
                    out = model.generate(
                        x,
                        attention_mask=torch.ones_like(x),
                        do_sample=False,
                        max_new_tokens=MAX_NEW,
                        eos_token_id=eos,
                        pad_token_id=eos[0],
                    )
                new = out[0, x.shape[1]:].tolist()
                lines.append({"preset": preset, "name": name, **case, "prompt_ids": list(ids), "tokens": new})
                print(f"{preset} {name}: {len(ids)} prompt ids, {len(new)} new")
    with open(os.path.join(a.out, "greedy.jsonl"), "w") as f:
        for l in lines:
            f.write(json.dumps(l, ensure_ascii=False) + "\n")
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
