#!/usr/bin/env python3
"""Write the GGUF test fixtures of tests/fixtures/gguf/ with llama.cpp's own writer (PyPI `gguf`).

    python3 -m venv /tmp/gg && /tmp/gg/bin/pip install -r tools/oracle/requirements-gguf.txt
    /tmp/gg/bin/python tools/oracle/gguf_fixtures.py tests/fixtures/gguf

Files (all small; see tests/fixtures/gguf/README.md):

- all_types.gguf: every metadata value type (u8..i64, f32, f64, bool, string, typed and nested
  arrays), `general.alignment` 64, and F32 / F16 / BF16 / Q8_0 tensors (Q8_0 and BF16 quantised by
  gguf-py's own quant code); all_types_v2.gguf is the same file with the version field set to 2
  (versions 2 and 3 have the same little-endian layout; gguf-py writes 3 only).
- ternary.gguf: PQ2_0 (type 142) and PTQ1_0 (type 143) tensors packed here from known ternary
  weights by the numpy code below, written from the block layout in the packing contract, plus
  `prism.hadamard.*` metadata with sign widths 1024 and 2048. gguf-py 0.19 has no entry for the
  two ids, so their block sizes are added to its size table before writing.
- expected.json: the values a reader must decode (tensor values as f32, via gguf-py's dequantiser
  for F16/BF16/Q8_0 and this script's ternary decoder), and Hadamard test vectors computed in
  float64 (R·x and the embedding inverse).

`--tokenizer TOKENIZER_JSON OUT.gguf` instead writes the tokenizer.ggml.* metadata of a
tokenizer.json the way llama.cpp's converter does (for a byte-level BPE vocabulary): ids without
a token become `[PAD<id>]` of type UNUSED up to --vocab-size, added tokens are CONTROL when special
and USER_DEFINED otherwise, merges are "left right" strings.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

PQ2_0 = 142
PTQ1_0 = 143
BLOCK = 128
# gguf-py 0.19 predates PrismML's types: teach its size table the two block layouts.
gguf.constants.GGML_QUANT_SIZES[PQ2_0] = (BLOCK, 34)
gguf.constants.GGML_QUANT_SIZES[PTQ1_0] = (BLOCK, 28)


def f16_bytes(d):
    return np.float16(d).tobytes()


# ---- ternary packing, from the contract's block layout --------------------------------------------

def blocks(codes, scales):
    """codes: [N, K]; scales: [N, K/128] -> (the 128 codes, the scale) of each block, row by row."""
    n, k = codes.shape
    for r in range(n):
        for b in range(k // BLOCK):
            yield codes[r, b * BLOCK:(b + 1) * BLOCK], scales[r, b]


def pack_pq2_0(codes, scales):
    """codes: [N, K] in {0,1,2,3}; scales: [N, K/128] -> bytes, one 34-byte block per 128."""
    out = bytearray()
    for c, d in blocks(codes, scales):
        out += f16_bytes(d)
        for j in range(0, BLOCK, 4):
            out.append(int(c[j]) | int(c[j + 1]) << 2 | int(c[j + 2]) << 4 | int(c[j + 3]) << 6)
    return bytes(out)


def trit_byte(trits):
    """Trits, first most significant, padded to five with zeros, rounded up to a byte."""
    q = 0
    for t in trits:
        q = q * 3 + int(t)
    for _ in range(5 - len(trits)):
        q *= 3
    return (q * 256 + 242) // 243


def pack_ptq1_0(codes, scales):
    """codes: [N, K] in {0,1,2}; one 28-byte block per 128: qs[24], qh[2], f16 d last."""
    out = bytearray()
    for c, d in blocks(codes, scales):
        qs = [trit_byte([c[16 * t + m] for t in range(5)]) for m in range(16)]
        qs += [trit_byte([c[80 + 8 * t + m] for t in range(5)]) for m in range(8)]
        qh = [trit_byte([c[120 + 2 * t + h] for t in range(4)]) for h in range(2)]
        out += bytes(qs) + bytes(qh) + f16_bytes(d)
    return bytes(out)


def ternary_expected(codes, scales):
    """What a decoder must produce, compactly: value (code - 1) * scale of its block."""
    return {
        "shape": list(codes.shape),
        "codes": "".join(str(int(c)) for c in codes.ravel()),
        "scales": scales.astype(np.float16).astype(np.float32).ravel().tolist(),
    }


def add_raw(w, name, data, ggml_type, ne):
    """A tensor of already-packed bytes; ne is ggml order (innermost first)."""
    shape = list(reversed(ne))
    arr = np.frombuffer(data, dtype=np.uint8).copy()
    w.add_tensor_info(name, shape, np.dtype(np.float32), arr.nbytes, raw_dtype=ggml_type)
    w.tensors[-1][name].tensor = arr


def write(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- fixtures ------------------------------------------------------------------------------------

def all_types(out, expected):
    path = out / "all_types.gguf"
    w = gguf.GGUFWriter(str(path), arch="testarch")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", -2.25e300)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.string", "héllo, wörld ✓")
    w.add_key_value("t.arr.u8", [1, 2, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr.i8", [-1, 0, 127], VT.ARRAY, sub_type=VT.INT8)
    w.add_key_value("t.arr.u16", [1, 65535], VT.ARRAY, sub_type=VT.UINT16)
    w.add_key_value("t.arr.i16", [-32768, 7], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("t.arr.u32", [0, 4294967295], VT.ARRAY, sub_type=VT.UINT32)
    w.add_array("t.arr.i32", [-5, 6, -7])
    w.add_key_value("t.arr.u64", [2**64 - 1], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr.i64", [-(2**63)], VT.ARRAY, sub_type=VT.INT64)
    w.add_array("t.arr.f32", [0.5, -1.0])
    w.add_key_value("t.arr.f64", [0.1, 1e-300], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.arr.bool", [True, False, True])
    w.add_array("t.arr.string", ["a", "", "ünï"])
    w.add_array("t.arr.nested", [[1, 2], [3]])
    w.add_array("t.arr.nested_strings", [["x", "y"], ["z"]])

    rng = np.random.default_rng(18)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((2, 4)).astype(np.float16)
    bf = rng.standard_normal((2, 8)).astype(np.float32)
    q8 = (rng.standard_normal((2, 64)) * 3).astype(np.float32)
    w.add_tensor("f32.weight", f32)
    w.add_tensor("f16.weight", f16)
    bf_q = gguf.quants.quantize(bf, QT.BF16)
    w.add_tensor("bf16.weight", bf_q, raw_dtype=QT.BF16)
    q8_q = gguf.quants.quantize(q8, QT.Q8_0)
    w.add_tensor("q8_0.weight", q8_q, raw_dtype=QT.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    expected["all_types"] = {
        "f32.weight": {"shape": [3, 5], "values": f32.ravel().tolist()},
        "f16.weight": {"shape": [2, 4], "values": f16.astype(np.float32).ravel().tolist()},
        "bf16.weight": {
            "shape": [2, 8],
            "values": gguf.quants.dequantize(bf_q, QT.BF16).astype(np.float32).ravel().tolist(),
        },
        "q8_0.weight": {
            "shape": [2, 64],
            "values": gguf.quants.dequantize(q8_q, QT.Q8_0).astype(np.float32).ravel().tolist(),
        },
    }
    data = bytearray(path.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    (out / "all_types_v2.gguf").write_bytes(bytes(data))


def fwht(x):
    """Natural-order (Sylvester) Walsh-Hadamard transform along the last axis, unnormalised."""
    x = np.array(x, dtype=np.float64)
    n = x.shape[-1]
    h = 1
    while h < n:
        x = x.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = x[..., 0, :].copy(), x[..., 1, :].copy()
        x[..., 0, :], x[..., 1, :] = a + b, a - b
        x = x.reshape(*x.shape[:-3], n)
        h *= 2
    return x


def rotate(x, signs, block=1024):
    """R·x: signs, then a FWHT per 1024-block, divided by 32."""
    y = np.asarray(x, dtype=np.float64) * signs
    return (fwht(y.reshape(-1, block)) / np.sqrt(block)).reshape(-1)


def unrotate_embedding(z, signs, block=1024):
    """Rᵀ·z = S·(H·z / 32): transform first, then signs."""
    z = np.asarray(z, dtype=np.float64)
    return (fwht(z.reshape(-1, block)) / np.sqrt(block)).reshape(-1) * signs


def ternary(out, expected):
    rng = np.random.default_rng(143)
    path = out / "ternary.gguf"
    w = gguf.GGUFWriter(str(path), arch="qwen35")
    widths = [1024, 2048]
    signs = {k: rng.choice([-1, 1], size=k) for k in widths}

    # up: PQ2_0 [3 rows, K=1024] with some code 3; the same weights without code 3 as PTQ1_0.
    up_codes = rng.integers(0, 3, size=(3, 1024))
    up_codes_pq = up_codes.copy()
    up_codes_pq[0, [5, 77, 128, 1000]] = 3
    up_scales = rng.uniform(0.004, 0.03, size=(3, 8))
    down_codes = rng.integers(0, 3, size=(2, 2048))
    down_scales = rng.uniform(0.004, 0.03, size=(2, 16))
    embd_codes = rng.integers(0, 3, size=(4, 1024))
    embd_scales = rng.uniform(0.004, 0.03, size=(4, 8))

    add_raw(w, "token_embd.weight", pack_pq2_0(embd_codes, embd_scales), PQ2_0, [1024, 4])
    add_raw(w, "blk.0.ffn_up.weight", pack_pq2_0(up_codes_pq, up_scales), PQ2_0, [1024, 3])
    add_raw(w, "blk.0.ffn_up_t1.weight", pack_ptq1_0(up_codes, up_scales), PTQ1_0, [1024, 3])
    add_raw(w, "blk.0.ffn_down.weight", pack_ptq1_0(down_codes, down_scales), PTQ1_0, [2048, 2])
    w.add_tensor("output_norm.weight", rng.standard_normal(1024).astype(np.float32))

    w.add_uint32("prism.hadamard.version", 1)
    w.add_uint32("prism.hadamard.block_size", 1024)
    w.add_string("prism.hadamard.transform", "normalized-sylvester-walsh-hadamard")
    w.add_string("prism.hadamard.axis", "input-last-dimension")
    w.add_string("prism.hadamard.sign_mode", "explicit")
    w.add_key_value("prism.hadamard.sign_widths", widths, VT.ARRAY, sub_type=VT.UINT32)
    w.add_key_value(
        "prism.hadamard.sign_values",
        [int(v) for k in widths for v in signs[k]],
        VT.ARRAY,
        sub_type=VT.INT8,
    )
    w.add_array(
        "prism.hadamard.weight_names",
        ["blk.0.ffn_up.weight", "blk.0.ffn_up_t1.weight", "blk.0.ffn_down.weight"],
    )
    w.add_array("prism.hadamard.inverse_weight_names", ["token_embd.weight"])
    w.add_bool("prism.hadamard.gdn_v_grouped", True)
    write(w)

    # Small-integer inputs keep the vectors short and every result exact in f32 (sums of
    # integers over 32): stored as 32·R·x, integers.
    x2048 = rng.integers(-9, 10, size=2048)
    z1024 = rng.integers(-9, 10, size=1024)
    expected["ternary"] = {
        "token_embd.weight": ternary_expected(embd_codes, embd_scales),
        "blk.0.ffn_up.weight": ternary_expected(up_codes_pq, up_scales),
        "blk.0.ffn_up_t1.weight": ternary_expected(up_codes, up_scales),
        "blk.0.ffn_down.weight": ternary_expected(down_codes, down_scales),
    }
    expected["hadamard"] = {
        "x2048": x2048.tolist(),
        "rx2048_times_32": np.rint(rotate(x2048, signs[2048]) * 32).astype(int).tolist(),
        "z1024": z1024.tolist(),
        "inverse1024_times_32": np.rint(unrotate_embedding(z1024, signs[1024]) * 32).astype(int).tolist(),
    }


# ---- tokenizer metadata, as llama.cpp's converter writes it --------------------------------------

def token_table(by_id, control, vocab_size):
    """The GGUF token list and token types of ids 0..vocab_size: `by_id` maps an id to its text, `control` maps an
    added token's id to whether it is a control token (else user-defined); an id without a token is `[PAD<id>]`,
    unused."""
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in control:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if control[i] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def tokenizer_gguf(tokenizer_json, config_json, out_path, vocab_size, pre):
    tok = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    cfg = json.loads(Path(config_json).read_text(encoding="utf-8")) if config_json else {}
    model = tok["model"]
    by_id = {i: t for t, i in model["vocab"].items()}
    control = {}
    for a in tok["added_tokens"]:
        by_id[a["id"]] = a["content"]
        control[a["id"]] = a["special"]
    vocab_size = max(vocab_size or 0, max(by_id) + 1)
    tokens, types = token_table(by_id, control, vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    def token_id(key):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is None:
            return None
        return tokens.index(v)

    w = gguf.GGUFWriter(str(out_path), arch="qwen35")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = token_id("eos_token")
    pad = token_id("pad_token")
    bos = token_id("bos_token")
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if pad is not None:
        w.add_pad_token_id(pad)
    if cfg.get("chat_template"):
        w.add_chat_template(cfg["chat_template"])
    write(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="fixture folder, or the output .gguf with --tokenizer")
    ap.add_argument("--tokenizer", help="write tokenizer metadata from this tokenizer.json instead")
    ap.add_argument("--config", help="tokenizer_config.json for eos/pad ids and the chat template")
    ap.add_argument("--vocab-size", type=int, default=0, help="pad the token list to this many ids")
    ap.add_argument("--pre", default="qwen35", help="tokenizer.ggml.pre")
    args = ap.parse_args()
    if args.tokenizer:
        tokenizer_gguf(args.tokenizer, args.config, Path(args.out), args.vocab_size, args.pre)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version
    expected = {"generator": "tools/oracle/gguf_fixtures.py",
                "gguf": version("gguf"), "numpy": np.__version__}
    all_types(out, expected)
    ternary(out, expected)
    (out / "expected.json").write_text(json.dumps(expected, indent=None) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
