"""Random System One requests through decider-ai 1.10.0's model-free code: golden files for requests nobody wrote.

    python tools/oracle/decider_fuzz.py --seed 1 --count 200 --out tests/fixtures/systemone/fuzz
    cargo test --release -p onepass-decide --test fixtures fuzz          # the committed seed
    python tools/oracle/decider_fuzz.py --seed 7 --count 5000 --out /tmp/fz7
    ONEPASS_SYSTEMONE_FUZZ=/tmp/fz7 cargo test --release -p onepass-decide --test fixtures fuzz

Writes render.jsonl and assemble.jsonl in decider_fixtures.py's format (the same HTTP reproduction, `prepare`,
temperatures and assembly; one set of random f32 probabilities per answered request), and left-out.jsonl. The
requests come from a seeded grammar that mixes the shapes the contract's traps come from: unicode text (combining
marks, CJK, emoji, controls, any scalar value, the chat template's special tokens), JSON states of every type,
question specs with fields present, absent, null or of the wrong type, options that look like numbers, levels,
booleans or each other, the independent / isolated-levels switches, and one body in five edited byte-wise (JSON
syntax errors, BOMs, truncation). Left out: a body whose parsed strings hold a lone surrogate (Python keeps it, a
Rust String cannot: onepass answers 400, docs/systemone.md), and a request the reference answers with an exception
other than its ValueError (its 500s), which go to left-out.jsonl: onepass answers those with a 422 naming the question.
"""
import argparse, json, os, random, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decider_fixtures as F  # noqa: E402

WORDS = ["order", "refund", "the", "a", "billing", "charged", "twice", "late", "happy", "angry", "ok", "yes", "no",
         "none", "None of the above", "n/a", "true", "false", "True", "null", "NaN", "Infinity", "other", "maybe"]
PIECES = ["é", "e\u0301", "A\u030a", "ß", "ﬁ", "İ", "中文", "一二三", "नमस्ते", "ع", "\u0663", "\u0e51", "😀", "👍🏽", "☕",
          "\u2028", "\u00a0", "\u3000", "\t", "\n", "\r\n", "\u0000", "\u007f", "\u200b", "\ufeff", "<|im_start|>",
          "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "\\", "\"", "'", "{", "}", "[", "]", ":", ",", "#",
          "$99.99", "A-104", "1.", "2:", " - ", "...", "  ", "\ud7ff", "\U0001f9ea"]


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def text(self, lo=0, hi=12):
        parts = []
        for _ in range(self.r.randint(lo, hi)):
            x = self.r.random()
            if x < 0.55:
                parts.append(self.pick(WORDS))
            elif x < 0.8:
                parts.append(self.pick(PIECES))
            elif x < 0.88:
                parts.append(str(self.r.randint(-20, 300)))
            elif x < 0.96:
                parts.append("".join(chr(self.r.randint(0x20, 0x2fff)) for _ in range(self.r.randint(1, 4))))
            else:  # any scalar value: controls, private use, unassigned, astral planes
                parts.append("".join(chr(self.r.choice([self.r.randint(0, 0xd7ff), self.r.randint(0xe000, 0x10ffff)]))
                                     for _ in range(self.r.randint(1, 6))))
        sep = self.pick([" ", " ", " ", "", "\n", ", "])
        return sep.join(parts)

    def number(self):
        return self.pick([0, 1, -1, 7, 10, 255, 256, 12345678901234567890, 0.0, -0.0, 0.5, 1.0, 1e16, 1e-05, 1.5e-07,
                          2.675, 0.1, 3.14159, -2.5, 1e300, self.r.randint(-10 ** 6, 10 ** 6), self.r.random() * 100])

    def value(self, depth=0):
        x = self.r.random()
        if depth > 2 or x < 0.35:
            return self.text(0, 6)
        if x < 0.5:
            return self.number()
        if x < 0.6:
            return self.pick([True, False, None])
        if x < 0.8:
            return [self.value(depth + 1) for _ in range(self.r.randint(0, 11))]
        return {self.key(): self.value(depth + 1) for _ in range(self.r.randint(0, 6))}

    def key(self):
        return self.pick(["text", "ticket", "n", "_index", "", " ", "a", "id", "中文", "k\u0301", "1", "true"]) \
            if self.r.random() < 0.5 else self.text(1, 3)

    def state(self):
        x = self.r.random()
        if x < 0.3:
            return self.text(0, 40)
        if x < 0.4:
            return self.pick([None, True, 0, 1.5, [], {}, ""])
        return {self.key(): self.value() for _ in range(self.r.randint(1, 6))}

    def option(self, kind):
        x = self.r.random()
        if kind == "score" and x < 0.4:
            lvl = self.pick([str(self.r.randint(-3, 12)), "\u0663", " 2 ", "1_0", "+.5", "5.", "-inf", "nan", "1e1"]
                            + ["x"] * (self.r.random() < 0.1))
            return f"{lvl}{self.pick([':', ' :', ': ', ''])}{self.text(0, 3)}"
        if x < 0.7:
            return self.text(1, 4)
        if x < 0.85:
            return self.pick(WORDS)
        return self.value(2)

    def criteria(self, kind):
        x = self.r.random()
        y = self.r.random()
        n = self.pick([2, 2, 3, 3, 4, 5, 7, 9, 10, 11, 12, 26, 27]) if y < 0.96 \
            else self.pick([0, 1]) if y < 0.98 else self.pick([254, 255, 256])
        if kind == "score" and self.r.random() < 0.9:
            n = min(n, self.r.randint(2, 10))
        if kind == "noul":
            if x < 0.4:
                return None
            d = {}
            for k in self.r.sample(["true", "false", "TRUE", "yes", "x"], self.r.randint(0, 3)):
                d[k] = self.pick([self.text(0, 5), None, "", 0, {"x": 1}])
            return d if x < 0.98 else [self.text(1, 2)]
        if x < 0.5:
            return [self.option(kind) for _ in range(n)]
        if kind == "score" and x < 0.98:
            keys = [str(v) for v in self.r.sample(range(-3, 13), min(n, 16))]
            for i in range(len(keys)):
                if self.r.random() < 0.15:
                    keys[i] = self.pick([" 2 ", "\u0663", "+.5", "5.", "1_0", "-inf", "nan", "1e1", "٣", "x"])
            return {k: self.pick([self.text(0, 6), None, "", 0]) for k in keys}
        if x < 0.98:
            return {str(self.option(kind)) if self.r.random() < 0.8 else self.key(): self.pick(
                [self.text(0, 6), None, "", 0, False, [], {"a": 1}, 1e16]) for _ in range(n)}
        return self.pick(["ab", None, 5, True])

    def question(self):
        q = {}
        kind = self.pick(["choice", "choice", "score", "noul"])
        t = self.r.random()
        if t < 0.97:
            if kind != "choice" or t < 0.5:
                q["type"] = {"choice": "choice", "score": "score", "noul": self.pick(["noul", "bool"])}[kind]
        else:
            q["type"] = self.pick(["nope", None, "Choice", ["a"], "score "])
        i = self.r.random()
        if i < 0.9:
            q["instructions"] = self.text(1, 10) + self.pick(["?", "", ".", ":"])
        elif i < 0.95:
            q["instructions"] = self.pick(["", None, 0, {"ask": [1]}, False])
        elif i < 0.97:
            q["question"] = self.text(1, 6)
        if self.r.random() < 0.97:
            q["criteria"] = self.criteria(kind)
        elif self.r.random() < 0.5:
            q["options"] = [self.option(kind) for _ in range(self.r.randint(0, 4))]
        if kind == "score" and self.r.random() < 0.3:
            q["isolated"] = self.pick([False, True, "false", None, 0, 1])
        if self.r.random() < 0.05:
            q[self.key()] = self.value(1)
        items = list(q.items())
        self.r.shuffle(items)
        return dict(items)

    def request(self):
        qs = {}
        for _ in range(self.r.choice([1, 1, 2, 2, 3, 4, 6])):
            qs[self.pick(["q", "team", "mood", "refund", ""]) if self.r.random() < 0.3 else self.text(1, 2)] = \
                self.question() if self.r.random() < 0.995 else self.pick(["text", [1], 5])
        body = {"state": self.state(), "questions": qs}
        x = self.r.random()
        if x < 0.3:
            body["independent"] = self.pick([False, True, "false", "YES", 0, 1, "no"])
        if self.r.random() < 0.1:
            body["model"] = self.pick([None, "m", "decider-1.10"])
        items = list(body.items())
        self.r.shuffle(items)
        text = json.dumps(dict(items), ensure_ascii=self.r.random() < 0.2)
        if self.r.random() < 0.2:
            text = self.mutate(text)
        return text, self.r.random() < 0.5

    def mutate(self, text):
        """One to three byte-level edits of a body: what a broken client sends (JSON syntax errors, wrong types)."""
        for _ in range(self.r.randint(1, 3)):
            if not text:
                break
            i = self.r.randrange(len(text))
            op = self.r.random()
            if op < 0.3:
                text = text[:i] + text[i + 1:]
            elif op < 0.6:
                text = text[:i] + self.pick(list('{}[]",:\\0123456789eE.+- tfnul') + ["NaN", "Infinity", "\\u", "\t",
                                                                                         "\u00e9", "\U0001f600"]) + text[i:]
            elif op < 0.7:
                text = text[:i]
            elif op < 0.85:
                j = min(len(text), i + self.r.randint(1, 20))
                text = text[:j] + text[i:j] + text[j:]
            else:
                text = self.pick(["[", "{", " ", "\ufeff", "\n"]) + text if op < 0.92 else text + self.pick(["}", " x", "\n", ","])
        return text


def has_lone_surrogate(v):
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, list):
        return any(has_lone_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(x) for k, x in v.items())
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="testdata/qwen3_5-tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=300)
    a = ap.parse_args()
    from transformers import AutoTokenizer
    from decider import systemone as S1
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    assert type(tok).__name__ == "Qwen3_5Tokenizer", type(tok).__name__
    os.makedirs(a.out, exist_ok=True)
    gen = Gen(a.seed)
    nrng = np.random.default_rng(a.seed)
    render_out, assemble_out, left_out, skipped, errors = [], [], [], {}, 0
    while len(render_out) < a.count:
        text, iso = gen.request()
        name = f"fuzz{a.seed}_{len(render_out)}"
        case = {"name": name, "body": text, "isolated_levels": iso}
        r, err = F.parse_http(text)
        if err is None and has_lone_surrogate(json.loads(text.encode("utf-8"))):
            # Python keeps \ud800 in a str, a Rust String cannot: onepass answers 400 (docs/systemone.md)
            skipped["lone surrogate"] = skipped.get("lone surrogate", 0) + 1
            continue
        if err is None:
            try:
                rqs, index, items, _ = F.prepare(tok, r, iso, {})
            except ValueError as e:
                err = F.http_error(422, {"detail": str(e)})
            except Exception as e:  # the reference's 500s: covered by hand (divergence), left out here
                skipped[type(e).__name__] = skipped.get(type(e).__name__, 0) + 1
                left_out.append({"name": name, "body": text, "isolated_levels": iso,
                                 "exception": f"{type(e).__name__}: {e}"})
                continue
        if err is not None:
            errors += 1
            case["error"] = err
            render_out.append(case)
            continue
        case["rows"] = [{"ids": it["ids"], "slots": it["slots"], "nopts": it["nopts"], "types": it["types"]}
                        for it in items]
        case["input_tokens"] = S1.unique_tokens(items)
        case["temperatures"] = {k: F.slot_temps(cfg, items) for k, cfg in F.TEMP_CONFIGS.items()}
        render_out.append(case)
        probs = []
        for it in items:
            for n in it["nopts"]:
                k = nrng.integers(4)
                p = nrng.dirichlet(np.ones(n) * (1.0 if k < 2 else 0.05)) if k < 3 else np.full(n, 1.0 / n)
                probs.append([float(x) for x in np.asarray(p, dtype=np.float32)])
        resp = {"model": "decider-1.10", "answers": S1.assemble(rqs, index, probs),
                "usage": {"input_tokens": S1.unique_tokens(items), "output_tokens": 0}}
        assemble_out.append({"name": name, "body": text, "isolated_levels": iso, "probs": probs,
                             "response": F.compact(resp)})
    for path, rows in (("render.jsonl", render_out), ("assemble.jsonl", assemble_out), ("left-out.jsonl", left_out)):
        with open(os.path.join(a.out, path), "w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"seed {a.seed}: render {len(render_out)} ({errors} error answers)  assemble {len(assemble_out)}  "
          f"left out (reference 500s) {skipped}", file=sys.stderr)


if __name__ == "__main__":
    main()
