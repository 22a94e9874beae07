#!/usr/bin/env python3
"""Logits fixtures from transformers for onepass's synthetic checkpoints.

For each preset, `onepass synth` writes the checkpoint (deterministic: the same bytes on every
machine), transformers loads it in float32 (Qwen3_5ForCausalLM, or Qwen3_5ForConditionalGeneration
for the composite form) and computes logits at every position of several token sequences. The
result goes to tests/fixtures/logits/<preset>.safetensors (tensors `ids.<L>` [L] and
`logits.<L>` [L, V], float32) plus manifest.json (versions, command, checkpoint sha256).

Usage (from the repository root, with the venv of tools/oracle/requirements.txt):
    cargo build --release -p onepass
    python tools/oracle/model_fixtures.py --onepass target/release/onepass
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import load_float32, manifest_head, onepass_parser, sha256  # noqa: E402

PRESETS = ["tiny-gva", "tiny-attn-first", "tiny-composite", "tiny-bf16"]
LENGTHS = [1, 5, 64, 65, 130, 700]
SEED = 20261130


def main():
    args = onepass_parser("tests/fixtures/logits").parse_args()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    manifest = manifest_head(
        "model_fixtures.py",
        torch=torch.__version__,
        transformers=transformers.__version__,
        numpy=np.__version__,
        lengths=LENGTHS,
        seed=SEED,
        presets={},
    )
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            d = os.path.join(tmp, preset)
            subprocess.run([args.onepass, "synth", "--preset", preset, "--out", d], check=True)
            model, cfg = load_float32(d)
            vocab = (cfg.get("text_config") or cfg)["vocab_size"]
            rng = np.random.default_rng(SEED + PRESETS.index(preset))
            tensors = {}
            for length in LENGTHS:
                ids = rng.integers(0, vocab, size=length, dtype=np.int64)
                with torch.no_grad():
                    out = model(input_ids=torch.from_numpy(ids)[None, :], use_cache=False)
                logits = out.logits[0].float().numpy()
                assert logits.shape == (length, vocab), logits.shape
                tensors[f"ids.{length}"] = ids.astype(np.float32)
                tensors[f"logits.{length}"] = np.ascontiguousarray(logits, dtype=np.float32)
            path = os.path.join(args.out, f"{preset}.safetensors")
            save_file(tensors, path)
            manifest["presets"][preset] = {
                "model_safetensors_sha256": sha256(os.path.join(d, "model.safetensors")),
                "config": cfg,
                "fixture_sha256": sha256(path),
            }
            print(f"{preset}: wrote {path}", file=sys.stderr)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
