"""What the oracle scripts share for writing fixtures: the arguments of a script that runs `onepass synth`, a file's
sha256 and the head of a manifest (they pin the checkpoints and fixtures and say what made them), JSON in the compact
form the server writes, the JSON-lines and manifest files, and the float32 transformers model of a checkpoint."""
import argparse
import hashlib
import json
import os
import platform


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


def write_jsonl(path, rows):
    """One JSON value per line, non-ASCII text kept."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_manifest(path, manifest, **dump_args):
    """`manifest` as indented JSON and a final newline (`dump_args`: more json.dump arguments)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, **dump_args)
        f.write("\n")


def onepass_parser(out, **parser_args):
    """An argument parser with --onepass (the binary whose `synth` writes the checkpoints) and --out (default `out`);
    `parser_args` go to argparse.ArgumentParser."""
    ap = argparse.ArgumentParser(**parser_args)
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--out", default=out)
    return ap


def manifest_head(script, **fields):
    """A manifest's first fields: the command that regenerates the fixtures, the Python version, then `fields`."""
    return {
        "command": f"python tools/oracle/{script} --onepass target/release/onepass",
        "python": platform.python_version(),
        **fields,
    }


def load_float32(dir_):
    """transformers' model of the checkpoint folder `dir_` in float32 with eager attention, in eval mode
    (Qwen3_5ForConditionalGeneration for the composite form, Qwen3_5ForCausalLM otherwise), and its config.json."""
    import torch
    import transformers

    cfg = json.load(open(os.path.join(dir_, "config.json")))
    if cfg["model_type"] == "qwen3_5":
        cls = transformers.Qwen3_5ForConditionalGeneration
    else:
        cls = transformers.Qwen3_5ForCausalLM
    model = cls.from_pretrained(dir_, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model, cfg
