#!/usr/bin/env python3
"""qwen35 GGUF model fixtures written by llama.cpp's own writer (PyPI `gguf`), with transformers logits.

For each preset, `onepass synth` writes the synthetic checkpoint (deterministic bytes). This script
then, independently of onepass's Rust converter:

1. converts it to F16, BF16 and Q8_0 GGUF files with gguf-py's GGUFWriter and gguf-py's own
   quantisers, applying llama.cpp's qwen35 conversion conventions in numpy (norm gains stored as
   w + 1 except linear_attn.norm, ssm_a = -exp(A_log), dt_bias -> ssm_dt.bias, the squeezed conv,
   the grouped-to-tiled value-head reorder of attn_qkv's V rows, attn_gate, ssm_alpha, ssm_beta,
   ssm_a, ssm_dt, the conv's V channels and ssm_out's input columns; 1-D tensors, norms and the
   conv in F32; tokenizer.ggml.* from tokenizer.json / tokenizer_config.json);
2. records transformers float32 logits of the checkpoint at every position of fixed token ids.

Outputs (tests/fixtures/gguf/qwen35/): <preset>.<type>.gguf, <preset>.logits.safetensors (tensors
`ids.<L>` [L] as float32, `logits.<L>` [L, V] of the checkpoint, and `logits.<type>.<L>` of the
same model with every matrix replaced by what that file stores, decoded by gguf-py: the reference
for loading the file), manifest.json (command, versions, sha256s).
-exp(A_log) is computed in float64 and rounded to float32 once (the converter uses torch's float32
exp; the f64 route is correctly rounded, so the file does not depend on a libm).

Usage, from the repository root, with the venv of tools/oracle/requirements.txt plus
tools/oracle/requirements-gguf.txt:
    cargo build --release -p onepass
    python tools/oracle/gguf_model_fixtures.py --onepass target/release/onepass
"""

import argparse
import json
import os
import subprocess
import sys
import shutil
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_fixtures import token_table  # noqa: E402
from oracle_io import manifest_head, onepass_parser, sha256  # noqa: E402

PRESETS = ["tiny-gva"]
TYPES = {"f16": (QT.F16, 1), "bf16": (QT.BF16, 32), "q8_0": (QT.Q8_0, 7)}
LENGTHS = [1, 9, 70]
SEED = 20261201


def swap_head_blocks(x, axis, outer, inner, d):
    """Along axis, heads of d values laid out [outer][inner] -> [inner][outer]."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [outer, inner, d] + shape[axis + 1:])
    x = np.swapaxes(x, axis, axis + 1)
    return np.ascontiguousarray(x).reshape(shape)


def tiled(x, axis, hk, hv, d):
    """Grouped value-head order [k0: v0 v1][k1: v0 v1] -> tiled [v0: k0 k1][v1: k0 k1] along axis."""
    return swap_head_blocks(x, axis, hk, hv // hk, d)


def grouped(x, axis, hk, hv, d):
    """The inverse of tiled()."""
    return swap_head_blocks(x, axis, hv // hk, hk, d)


def looks_special(t):
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>"))
            or (t.startswith("<unused") and t.endswith(">")))


def add_tokenizer(w, d, cfg, vocab_size):
    tok = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    tcfg_path = os.path.join(d, "tokenizer_config.json")
    tcfg = json.load(open(tcfg_path, encoding="utf-8")) if os.path.exists(tcfg_path) else {}
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        added[a["id"]] = a.get("special", False)
    control = {i: special or looks_special(by_id[i]) for i, special in added.items()}
    tokens, types = token_table(by_id, control, vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    for typ, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        v = tcfg.get(f"{typ}_token")
        if isinstance(v, dict):
            v = v.get("content")
        tid = tokens.index(v) if isinstance(v, str) and v in tokens else None
        if tid is None:
            c = cfg.get(f"{typ}_token_id", (cfg.get("text_config") or {}).get(f"{typ}_token_id"))
            tid = c if isinstance(c, int) and c < vocab_size else None
        if tid is not None:
            add(tid)
    for typ, add in (("bos", w.add_add_bos_token), ("eos", w.add_add_eos_token)):
        if isinstance(tcfg.get(f"add_{typ}_token"), bool):
            add(tcfg[f"add_{typ}_token"])
    template = tcfg.get("chat_template")
    if template is None and os.path.exists(os.path.join(d, "chat_template.jinja")):
        template = open(os.path.join(d, "chat_template.jinja"), encoding="utf-8").read()
    if template is not None:
        w.add_chat_template(template)


def convert(d, name, out_path, qtype, ftype):
    """Writes the GGUF file; returns the checkpoint's tensors with every matrix replaced by what the
    file stores, decoded (gguf-py's dequantiser) and put back in Hugging Face order."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    t = cfg.get("text_config", cfg)
    base = "model.language_model." if cfg["model_type"] == "qwen3_5" else "model."
    st = load_file(os.path.join(d, "model.safetensors"))
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv = t["linear_key_head_dim"], t["linear_value_head_dim"]
    reorder = hv != hk
    layers = t["layer_types"]
    interval = layers.index("full_attention") + 1
    assert all((k == "full_attention") == ((i + 1) % interval == 0) for i, k in enumerate(layers))

    w = gguf.GGUFWriter(out_path, arch="qwen35")
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(len(layers))
    w.add_context_length(t["max_position_embeddings"])
    w.add_embedding_length(t["hidden_size"])
    w.add_feed_forward_length(t["intermediate_size"])
    w.add_head_count(t["num_attention_heads"])
    w.add_head_count_kv(t["num_key_value_heads"])
    rope = t.get("rope_parameters", {})
    w.add_rope_freq_base(rope.get("rope_theta", t.get("rope_theta")))
    w.add_layer_norm_rms_eps(t["rms_norm_eps"])
    w.add_key_length(t["head_dim"])
    w.add_value_length(t["head_dim"])
    w.add_file_type(ftype)
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    w.add_rope_dimension_sections([int(s) for s in sections + [0] * (4 - len(sections))])
    w.add_ssm_conv_kernel(t["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(hk)
    w.add_ssm_time_step_rank(hv)
    w.add_ssm_inner_size(dv * hv)
    w.add_full_attention_interval(interval)
    w.add_rope_dimension_count(int(t["head_dim"] * rope.get("partial_rotary_factor", 0.25)))
    add_tokenizer(w, d, cfg, t["vocab_size"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    stored = dict(st)

    def put(gname, arr, force_f32=False, hf=None, undo=lambda x: x):
        arr = np.ascontiguousarray(np.squeeze(arr).astype(np.float32))
        if arr.ndim <= 1 or force_f32 or gname.endswith("_norm.weight") or not gname.endswith(".weight"):
            w.add_tensor(gname, arr)
            return
        q = qtype
        try:
            data = gguf.quants.quantize(arr, q)
        except gguf.QuantError:
            q = QT.F16
            data = gguf.quants.quantize(arr, q)
        w.add_tensor(gname, data, raw_dtype=q)
        if hf is not None:
            back = gguf.quants.dequantize(data, q).astype(np.float32).reshape(arr.shape)
            stored[hf] = np.ascontiguousarray(undo(back)).reshape(st[hf].shape)

    def v_rows(x, head_dim, keep=0):
        if not reorder:
            return x
        return np.concatenate([x[:keep], tiled(x[keep:], 0, hk, hv, head_dim)], axis=0)

    def un_rows(x, head_dim, keep=0):
        if not reorder:
            return x
        return np.concatenate([x[:keep], grouped(x[keep:], 0, hk, hv, head_dim)], axis=0)

    put("token_embd.weight", st[base + "embed_tokens.weight"], hf=base + "embed_tokens.weight")
    for i, kind in enumerate(layers):
        p, b = f"{base}layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", st[p + "input_layernorm.weight"] + 1)
        if kind == "linear_attention":
            q = p + "linear_attn."
            put(b + "attn_qkv.weight", v_rows(st[q + "in_proj_qkv.weight"], dv, 2 * hk * dk),
                hf=q + "in_proj_qkv.weight", undo=lambda x: un_rows(x, dv, 2 * hk * dk))
            put(b + "attn_gate.weight", v_rows(st[q + "in_proj_z.weight"], dv),
                hf=q + "in_proj_z.weight", undo=lambda x: un_rows(x, dv))
            put(b + "ssm_alpha.weight", v_rows(st[q + "in_proj_a.weight"], 1),
                hf=q + "in_proj_a.weight", undo=lambda x: un_rows(x, 1))
            put(b + "ssm_beta.weight", v_rows(st[q + "in_proj_b.weight"], 1),
                hf=q + "in_proj_b.weight", undo=lambda x: un_rows(x, 1))
            conv = np.squeeze(st[q + "conv1d.weight"], axis=1)
            put(b + "ssm_conv1d.weight", v_rows(conv, dv, 2 * hk * dk), force_f32=True)
            a = (-np.exp(st[q + "A_log"].astype(np.float64))).astype(np.float32)
            put(b + "ssm_a", v_rows(a, 1))
            put(b + "ssm_dt.bias", v_rows(st[q + "dt_bias"], 1))
            put(b + "ssm_norm.weight", st[q + "norm.weight"])
            out = st[q + "out_proj.weight"]
            put(b + "ssm_out.weight", tiled(out, 1, hk, hv, dv) if reorder else out, hf=q + "out_proj.weight",
                undo=lambda x: grouped(x, 1, hk, hv, dv) if reorder else x)
        else:
            q = p + "self_attn."
            put(b + "attn_q.weight", st[q + "q_proj.weight"], hf=q + "q_proj.weight")
            put(b + "attn_k.weight", st[q + "k_proj.weight"], hf=q + "k_proj.weight")
            put(b + "attn_v.weight", st[q + "v_proj.weight"], hf=q + "v_proj.weight")
            put(b + "attn_output.weight", st[q + "o_proj.weight"], hf=q + "o_proj.weight")
            put(b + "attn_q_norm.weight", st[q + "q_norm.weight"] + 1)
            put(b + "attn_k_norm.weight", st[q + "k_norm.weight"] + 1)
        put(b + "post_attention_norm.weight", st[p + "post_attention_layernorm.weight"] + 1)
        put(b + "ffn_gate.weight", st[p + "mlp.gate_proj.weight"], hf=p + "mlp.gate_proj.weight")
        put(b + "ffn_up.weight", st[p + "mlp.up_proj.weight"], hf=p + "mlp.up_proj.weight")
        put(b + "ffn_down.weight", st[p + "mlp.down_proj.weight"], hf=p + "mlp.down_proj.weight")
    put("output_norm.weight", st[base + "norm.weight"] + 1)
    if not t.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)):
        put("output.weight", st["lm_head.weight"], hf="lm_head.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def logits(d, vocab, seed):
    rng = np.random.default_rng(seed)
    import torch
    import transformers
    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = (transformers.Qwen3_5ForConditionalGeneration if cfg["model_type"] == "qwen3_5"
           else transformers.Qwen3_5ForCausalLM)
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tensors = {}
    for length in LENGTHS:
        ids = rng.integers(0, vocab, size=length, dtype=np.int64)
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids)[None, :], use_cache=False)
        tensors[f"ids.{length}"] = ids.astype(np.float32)
        tensors[f"logits.{length}"] = np.ascontiguousarray(out.logits[0].float().numpy(), dtype=np.float32)
    return tensors, {"torch": torch.__version__, "transformers": transformers.__version__}


def main():
    ap = onepass_parser(
        "tests/fixtures/gguf/qwen35", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--no-logits", action="store_true", help="only the GGUF files (no torch needed)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from importlib.metadata import version
    manifest = manifest_head(
        "gguf_model_fixtures.py", gguf=version("gguf"), numpy=np.__version__, lengths=LENGTHS, seed=SEED, presets={}
    )
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            d = os.path.join(tmp, preset)
            subprocess.run([args.onepass, "synth", "--preset", preset, "--out", d], check=True)
            entry = {"model_safetensors_sha256": sha256(os.path.join(d, "model.safetensors")), "files": {}}
            cfg = json.load(open(os.path.join(d, "config.json")))
            vocab = (cfg.get("text_config") or cfg)["vocab_size"]
            tensors = {}
            for tname, (qt, ft) in TYPES.items():
                path = os.path.join(args.out, f"{preset}.{tname}.gguf")
                stored = convert(d, preset, path, qt, ft)
                entry["files"][os.path.basename(path)] = sha256(path)
                print(f"{preset}: wrote {path}", file=sys.stderr)
                if not args.no_logits:
                    # The same model with the file's rounding: the reference for loading the file.
                    dq = os.path.join(tmp, f"{preset}-{tname}")
                    shutil.copytree(d, dq)
                    save_file(stored, os.path.join(dq, "model.safetensors"), metadata={"format": "pt"})
                    t, _ = logits(dq, vocab, SEED)
                    tensors.update({k.replace("logits.", f"logits.{tname}."): v
                                    for k, v in t.items() if k.startswith("logits.")})
            if not args.no_logits:
                t, versions = logits(d, vocab, SEED)
                tensors.update(t)
                manifest.update(versions)
                path = os.path.join(args.out, f"{preset}.logits.safetensors")
                save_file(tensors, path)
                entry["files"][os.path.basename(path)] = sha256(path)
            manifest["presets"][preset] = entry
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
