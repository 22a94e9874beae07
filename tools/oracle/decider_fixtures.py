"""Golden files for onepass-decide from decider-ai 1.10.0's model-free functions (the reference).

    python tools/oracle/decider_fixtures.py [--tokenizer testdata/qwen3_5-tokenizer] [--out tests/fixtures/systemone]
    python tools/oracle/decider_fixtures.py unicode-tables > crates/decide/src/pyjson/unicode.rs

Writes render.jsonl (request -> rows, slots, nopts, types, per-slot temperatures, usage, or the error answer),
assemble.jsonl (request + synthetic f32 probabilities -> the exact response bytes), invalid.jsonl (HTTP-level
validation: json_invalid, pydantic S1Req, render errors) and pyjson.jsonl (json.loads/dumps, float repr, round, float()).
The HTTP layer is reproduced as FastAPI does it (json.loads -> S1Req.model_validate -> serve.prepare), without fastapi.
"""
import argparse, base64, json, math, os, random, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import compact  # noqa: E402


def unicode_tables():
    import re, unicodedata

    def ranges(pred):
        out, start = [], None
        for c in range(0x110000):
            ok = pred(c)
            if ok and start is None:
                start = c
            if not ok and start is not None:
                out.append((start, c - 1)); start = None
        if start is not None:
            out.append((start, 0x10FFFF))
        return out

    sp = ranges(lambda c: chr(c).isspace())
    nprint = ranges(lambda c: not chr(c).isprintable())
    zeros = [c for c in range(0x110000) if chr(c).isdecimal() and unicodedata.decimal(chr(c)) == 0]
    assert sum(1 for c in range(0x110000) if chr(c).isdecimal()) == 10 * len(zeros)
    assert all(bool(re.match(r"\d", chr(c))) == chr(c).isdecimal() for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert all(bool(re.match(r"\s", chr(c))) == chr(c).isspace() for c in range(0x110000) if not 0xD800 <= c < 0xE000)

    def fmt(name, rs):
        s = f"pub(crate) const {name}: &[(u32, u32)] = &[\n"
        for i in range(0, len(rs), 6):
            s += "    " + " ".join(f"(0x{a:X}, 0x{b:X})," for a, b in rs[i:i + 6]) + "\n"
        return s + "];\n"
    print("//! Unicode tables generated from CPython", sys.version.split()[0], "(unicodedata", unicodedata.unidata_version + ")")
    print("//! by `python tools/oracle/decider_fixtures.py unicode-tables`. Do not edit by hand.\n")
    print("/// Ranges where `str.isspace()` (and `re` `\\s`) is true.")
    print(fmt("SPACE", sp))
    print("/// Ranges where `str.isprintable()` is false (repr escapes these).")
    print(fmt("NOT_PRINTABLE", nprint))
    print("/// First code point (digit zero) of every run of ten decimal digits (`str.isdecimal()`, `re` `\\d`).")
    print("pub(crate) const DIGIT_ZEROS: &[u32] = &[\n    " + " ".join(f"0x{c:X}," for c in zeros) + "\n];")


# ---- the HTTP layer as FastAPI runs it ---------------------------------------------------------------------------
from pydantic import BaseModel, ValidationError


class S1Req(BaseModel):          # decider/serve.py:479-485
    state: object
    questions: dict
    model: str | None = None
    independent: bool = True
    layout: str | None = None
    assets: dict | None = None


def http_error(status, content):
    try:
        return {"status": status, "body": compact(content)}
    except ValueError:
        return {"status": 500, "body": "Internal Server Error"}


def parse_http(text):
    """-> (S1Req, None) or (None, error answer)."""
    if text == "":
        return None, http_error(422, {"detail": [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]})
    try:
        body = json.loads(text.encode("utf-8"))
    except json.JSONDecodeError as e:
        return None, http_error(422, {"detail": [{"type": "json_invalid", "loc": ["body", e.pos], "msg": "JSON decode error",
                                                   "input": {}, "ctx": {"error": e.msg}}]})
    except Exception:
        return None, http_error(400, {"detail": "There was an error parsing the body"})
    try:
        return S1Req.model_validate(body), None
    except ValidationError as e:
        errs = []
        for er in e.errors(include_url=False):
            d = {"type": er["type"], "loc": ["body", *er["loc"]], "msg": er["msg"], "input": er["input"]}
            if "ctx" in er:
                d["ctx"] = er["ctx"]
            errs.append(d)
        return None, http_error(422, {"detail": errs})


def prepare(tok, r, isolated, cfg):
    """decider/serve.py prepare() + the temperatures of temperature.for_items; raises ValueError like the reference."""
    from decider import systemone as S1
    from decider.prompt_fast import build_rows
    ctx = S1.render_state(r.state)
    rqs = {k: S1.render_question(v) for k, v in r.questions.items()}
    flat, index = S1.plan_rows(rqs, isolated and r.independent)
    pairs = [(q["question"], list(q["options"])) for q in flat]
    rows = [[p] for p in pairs] if r.independent else [pairs]
    items, ctx_len = build_rows(tok, ctx, rows, max_ctx_tokens=cfg.get("max_state_tokens", 32768))
    types = S1.row_types(rqs, index)
    for it, ts in zip(items, [[t] for t in types] if r.independent else [types]):
        it["types"] = ts
    return rqs, index, items, ctx_len


TEMP_CONFIGS = {
    "scalar": {"temperature": 1.3},
    "by_type": {"temperature": 1.1, "temperature_by_type": {"choice": 1.48, "noul": 2.22, "score": 1.38}},
    "by_options": {"temperature_by_options": {"a": 10.12, "b": -1.63, "min": 0.05}},
}


def slot_temps(cfg, items):
    from decider import temperature as TT
    (T, m), _ = TT.from_config(cfg)
    t = TT.for_items(T, m, items)
    return TT.slot_temperatures(t if isinstance(t, list) else [t] * len(items), items) if items else []


# ---- requests -----------------------------------------------------------------------------------------------------
def requests():
    """(name, body text, isolated_levels). Every §9 trap of decider-contract.md appears at least once."""
    R = []

    def add(name, body, iso=False, raw=False):
        R.append((name, body if raw else json.dumps(body, ensure_ascii=False), iso))

    ticket = {"ticket": {"text": "I was charged twice for order A-104."}, "n": 1.0}
    worked = {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "charges", "returns": None}},
              "refund": {"type": "noul", "instructions": "Refund owed?"},
              "mood": {"type": "score", "instructions": "Mood", "criteria": ["calm", "2: furious"]},
              "wide": {"type": "choice", "instructions": "Pick", "criteria": [f"o{i}" for i in range(11)]}}
    add("worked_example_iso", {"state": ticket, "questions": worked}, iso=True)
    add("worked_example_list", {"state": ticket, "questions": worked}, iso=False)
    add("worked_example_packed", {"state": ticket, "questions": worked, "independent": False}, iso=True)
    add("packed_string_false", {"state": "s", "questions": worked, "independent": "false"}, iso=True)
    add("packed_single", {"state": "s", "questions": {"a": worked["team"]}, "independent": False})
    for n in (2, 9, 10, 11, 12, 26, 27, 254, 255):
        add(f"choice_{n}_options", {"state": {"k": "v"}, "questions": {"q": {"instructions": "Pick one.", "criteria": [f"opt {i}" for i in range(n)]}}})
    add("choice_10_vs_11_punct", {"state": "x", "questions": {
        "a": {"instructions": "p?", "criteria": {f"n{i}.": "ends with dot." for i in range(10)}},
        "b": {"instructions": "p?", "criteria": {f"n{i}.": "ends with dot." for i in range(11)}}}})
    add("choice_map_descriptions", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": {
        "a": 0, "b": False, "c": [], "d": {}, "e": "", "f": None, "g": {"x": [1, 2.5]}, "h": 1e16, "i": "text"}}}})
    add("choice_list_py_str", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": [
        "x", 1, 1.0, 1e16, True, False, None, [1, 2], {"a": 1}, "x", {"k": "it's"}, 1.5e-7]}}})
    add("choice_options_fallback", {"state": "s", "questions": {"q": {"question": "via question key", "options": ["a", "b"]}}})
    add("criteria_null_no_fallback", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": None, "options": ["a", "b"]}}})
    add("instructions_null", {"state": "s", "questions": {"q": {"instructions": None, "criteria": ["a", "b"]}}})
    add("instructions_json", {"state": "s", "questions": {"q": {"instructions": {"ask": ["x", 1]}, "criteria": ["a", "b"]},
                                                            "r": {"instructions": 0, "criteria": ["a", "b"]},
                                                            "t": {"instructions": False, "criteria": ["a", "b"]}}})
    add("score_list", {"state": "s", "questions": {"q": {"type": "score", "instructions": "rate", "criteria": ["low", None, "", 3, {"a": 1}]}}}, iso=False)
    add("score_list_iso", {"state": "s", "questions": {"q": {"type": "score", "instructions": "rate", "criteria": ["0: low", " 1 :mid", "\u00a02 :\u3000high", "\u0663: arabic", "-4: neg", "x 5: no"]}}}, iso=True)
    add("score_legend_map", {"state": "s", "questions": {"q": {"type": "score", "instructions": "rate", "criteria": {
        "10": "ten", "2": "two", " 3 ": "three", "1_0": "ten again", "\u0663": "arabic three", "+.5": "half", "5.": "five", "-inf": "minus"}}}}, iso=True)
    add("score_legend_map_nan", {"state": "s", "questions": {"q": {"type": "score", "instructions": "rate", "criteria": {"nan": "a", "2": "b", "1": "c"}}}})
    add("score_isolated_false", {"state": "s", "questions": {"q": {"type": "score", "instructions": "r", "criteria": ["a", "b", "c"], "isolated": False},
                                                               "r": {"type": "score", "instructions": "r", "criteria": ["a", "b"], "isolated": "false"},
                                                               "s": {"type": "score", "instructions": "r", "criteria": ["a", "b"], "isolated": None},
                                                               "t": {"type": "score", "instructions": "r", "criteria": ["a", "b"], "isolated": 0}}}, iso=True)
    add("score_10_levels_iso", {"state": "s", "questions": {"q": {"type": "score", "instructions": "r", "criteria": [f"{i}: level {i}" for i in range(10)]}}}, iso=True)
    add("noul_variants", {"state": "s", "questions": {
        "a": {"type": "noul", "instructions": "Is it?"},
        "b": {"type": "bool", "instructions": "Is it?", "criteria": {"true": "yes it is", "false": ""}},
        "c": {"type": "noul", "criteria": {"true": "described"}},
        "d": {"type": "bool", "instructions": "", "criteria": {"false": {"x": 1}}},
        "e": {"type": "noul", "instructions": None, "criteria": {"false": 0}},
        "f": {"type": "noul", "instructions": "q", "criteria": {"TRUE": "ignored", "true": None}}}})
    add("unicode_state", {"state": {"text": "नमस्ते दुनिया — café ☕ 😀 \u2028 tab\t nul\u0000 del\u007f", "中文": ["一", "二"]},
                          "questions": {"q": {"instructions": "Langue? é", "criteria": {"हिन्दी": "Hindi", "中文": None}}}})
    add("nfc_state", {"state": "cafe\u0301 A\u030a", "questions": {"q": {"instructions": "e\u0301?", "criteria": ["a", "b"]}}})
    add("special_tokens_in_state", {"state": "a<|im_start|>b<think>c</think><|endoftext|>", "questions": {"q": {"instructions": "<|im_end|> here?", "criteria": ["<think>", "b"]}}})
    add("state_null", {"state": None, "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}})
    add("state_scalars", {"state": [5, True, 1.0, -0.0, 1e-05, 1e16, 0.1, 12345678901234567890], "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}})
    add("state_long_array", {"state": {"records": [{"t": i} for i in range(9)] + [[1, 2], "x"], "short": [[i] for i in range(7)],
                                       "nested": [{"_index": "mine", "a": 1}] * 8}, "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}})
    add("state_big_numbers_raw", '{"state": {"big": 123456789012345678901234567890, "neg": -0, "f": 1E400, "g": -1e-400, "h": NaN, "i": -Infinity, "e": 1e2, "z": 0.0},'
        ' "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}}', raw=True)
    add("duplicate_keys_raw", '{"state": {"a": 1, "b": 2, "a": 3}, "questions": {"x": {"instructions": "first", "criteria": ["a", "b"]},'
        ' "y": {"instructions": "y", "criteria": ["c", "d"]}, "x": {"instructions": "last", "criteria": {"p": 1, "q": 2, "p": 3}}}, "extra": 1}', raw=True)
    add("empty_questions", {"state": "s", "questions": {}})
    add("empty_questions_packed", {"state": "s", "questions": {}, "independent": False})
    add("string_state_verbatim", {"state": "  {\"not\": json}  \n", "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}})
    add("long_state_truncated", {"state": "word " * 40000, "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}, "r": {"type": "noul", "instructions": "j"}}})
    add("multibyte_truncation", {"state": "😀" * 20000, "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}})
    add("independent_coercions", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}, "r": {"instructions": "i", "criteria": ["c", "d"]}}, "independent": 0})
    add("independent_yes", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": ["a", "b"]}}, "independent": "YES", "model": "m", "layout": None})
    add("packed_wide_and_narrow", {"state": {"k": [1, 2, 3]}, "independent": False, "questions": {
        "a": {"instructions": "A?", "criteria": [f"w{i}" for i in range(30)]},
        "b": {"type": "bool", "instructions": "B?"},
        "c": {"type": "score", "instructions": "C?", "criteria": {"1": "one", "0": "zero"}}}}, iso=True)
    add("identical_rows_usage", {"state": "s", "questions": {"a": {"instructions": "i", "criteria": ["a", "b"]}, "b": {"instructions": "i", "criteria": ["a", "b"]}}})
    add("option_newlines", {"state": "s", "questions": {"q": {"instructions": "line1\nline2", "criteria": {"a\nb": "c\n", "d": "e\r\n"}}}})
    add("options_with_digits", {"state": "Order #12345 costs $99.99", "questions": {"q": {"instructions": "Amount?", "criteria": [str(i * 11) for i in range(12)]}}})
    add("whitespace_options", {"state": " ", "questions": {"q": {"instructions": " ", "criteria": ["  ", "\t", "x  "]}}})
    add("neutralize_not_applied", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": ["None of the above", "n/a", "none"]}}})
    # errors from render_question (first failing question wins)
    add("err_no_instructions", {"state": "s", "questions": {"q": {"criteria": ["a", "b"]}}})
    add("err_empty_instructions", {"state": "s", "questions": {"q": {"instructions": "", "criteria": ["a", "b"]}}})
    add("err_type_before_instructions", {"state": "s", "questions": {"q": {"type": "nope"}}})
    add("err_unknown_type", {"state": "s", "questions": {"q": {"type": "nope", "instructions": "i"}}})
    add("err_unknown_type_quote", {"state": "s", "questions": {"q": {"type": "it's\n", "instructions": "i"}}})
    add("err_unknown_type_null", {"state": "s", "questions": {"q": {"type": None, "instructions": "i"}}})
    add("err_unknown_type_list", {"state": "s", "questions": {"q": {"type": ["a", 1, None, {"k": True}], "instructions": "i"}}})
    add("err_choice_one", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": ["a", "a"]}}})
    add("err_choice_256", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": [str(i) for i in range(256)]}}})
    add("err_choice_string", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": "ab"}}})
    add("err_choice_empty_map", {"state": "s", "questions": {"q": {"instructions": "i", "criteria": {}}}})
    add("err_score_one", {"state": "s", "questions": {"q": {"type": "score", "instructions": "i", "criteria": ["a"]}}})
    add("err_score_11", {"state": "s", "questions": {"q": {"type": "score", "instructions": "i", "criteria": list("abcdefghijk")}}})
    add("err_score_bad_key", {"state": "s", "questions": {"q": {"type": "score", "instructions": "i", "criteria": {"1": "a", "abc": "b", "x'y": "c"}}}})
    add("err_score_bad_key_quote", {"state": "s", "questions": {"q": {"type": "score", "instructions": "i", "criteria": {"it's": "b"}}}})
    add("err_score_key_underscores", {"state": "s", "questions": {"q": {"type": "score", "instructions": "i", "criteria": {"1__0": "b", "2": "c"}}}})
    add("err_noul_criteria_list", {"state": "s", "questions": {"q": {"type": "noul", "instructions": "i", "criteria": ["a"]}}})
    add("err_noul_no_description", {"state": "s", "questions": {"q": {"type": "noul", "criteria": {"true": "", "false": None}}}})
    add("err_noul_no_instr_list", {"state": "s", "questions": {"q": {"type": "bool", "criteria": False}}})
    add("err_first_failing", {"state": "s", "questions": {"ok": {"instructions": "i", "criteria": ["a", "b"]},
                                                            "bad1": {"type": "score", "instructions": "i", "criteria": []},
                                                            "bad2": {"instructions": ""}}})
    add("err_spec_not_object", {"state": "s", "questions": {"q": "text"}})
    add("err_spec_list", {"state": "s", "questions": {"ok": {"instructions": "i", "criteria": ["a", "b"]}, "q": [1]}})
    return R


def invalid_bodies():
    return [
        ("empty_body", ""), ("not_json", "hello"), ("truncated", '{"state": "s", "questions": {'),
        ("trailing_comma", '{"state": "s", "questions": {},}'), ("bad_escape", '{"state": "\\x"}'),
        ("control_char", '{"state": "a\tb"}'), ("unterminated", '{"state": "abc'), ("extra_data", '{"state": 1} x'),
        ("missing_colon", '{"state" 1}'), ("unicode_offset", '{"state": "é😀", "questions": x}'),
        ("bad_u_escape", '{"state": "\\u12G4"}'), ("leading_zero", '{"state": 01}'), ("minus_only", '{"state": -}'),
        ("top_list", "[]"), ("top_number", "5"), ("top_null", "null"), ("top_string", '"x"'),
        ("missing_state", '{"questions": {}}'), ("missing_both", "{}"),
        ("questions_list", '{"state": 1, "questions": []}'), ("questions_null", '{"state": 1, "questions": null}'),
        ("independent_bad_str", '{"state": 1, "questions": {}, "independent": "maybe"}'),
        ("independent_two", '{"state": 1, "questions": {}, "independent": 2}'),
        ("independent_half", '{"state": 1, "questions": {}, "independent": 0.5}'),
        ("independent_null", '{"state": 1, "questions": {}, "independent": null}'),
        ("independent_padded", '{"state": 1, "questions": {}, "independent": " no "}'),
        ("model_int", '{"state": 1, "questions": {}, "model": 5}'),
        ("many_errors", '{"questions": [], "model": 5, "layout": [], "assets": "a", "independent": []}'),
        ("missing_state_nan_echo", '{"questions": {}, "x": NaN}'),
        ("big_int_too_long", '{"state": ' + "9" * 4301 + ', "questions": {}}'),
    ]


def pyjson_cases():
    texts = ['{"a": 1, "b": 2, "a": 3}', "[1.0, 100.0, -0.0, 0.0001, 1e-05, 1.5e-07, 1000000000000000.0, 1e16, 1.2345678901234567e19, 5e-324, 0.30000000000000004]",
             "[Infinity, -Infinity, NaN, 1E400, -0, 12345678901234567890, 1e2, 2.5E-3]",
             '"\\u0000\\u001f\\b\\f\\n\\r\\t\\"\\\\/\\u007f\\u2028\\u00e9\\ud83d\\ude00"', '{"k": {"": [], "x": {}}}', "[1.7976931348623157e308, 2.2250738585072014e-308, 4.9e-324, 123456789.123456789]"]
    out = []
    for t in texts:
        v = json.loads(t)
        out.append({"kind": "dumps", "text": t, "dumps": json.dumps(v, ensure_ascii=False), "str": str(v)})
    rng = random.Random(7)
    floats = [0.5, 0.125, 0.375, 2.675, 0.12345, 0.00005, 0.99995, 1e-9, 0.33335, 0.00015, 0.25, 123.455, 1e22, 5e-324, -0.00004, -0.00005]
    floats += [rng.random() for _ in range(60)] + [rng.random() * 10 ** rng.randint(-8, 8) for _ in range(60)]
    floats += [float(np.float32(rng.random())) for _ in range(40)]
    for x in floats:
        out.append({"kind": "round", "x": repr(x), "repr": repr(x), "r2": repr(round(x, 2)), "r4": repr(round(x, 4))})
    for s in ["1", " 2.5 ", "\u30003\u00a0", "+4", ".5", "5.", "1e2", "1E-2", "1_0", "1_000.000_1", "\u0663", "-inf", "InFiNiTy", "nan", "1e400",
              "abc", "", " ", "1__0", "_1", "1_", "1_.5", "1e", ".", "0x10", "1 2", "in_f", "it's", "\u0663\u0664.\u0665", "\x1c7\x1f", "١_٢", "1e1_0", "\u2007", "x\ny", "\u00b2"]:
        try:
            out.append({"kind": "float", "s": s, "ok": repr(float(s))})
        except ValueError as e:
            out.append({"kind": "float", "s": s, "error": str(e)})
    from decider.systemone import strip_level_number
    for s in ["2: somewhat", "\u00a02 :\u3000x", "\u0663: a", "-12:", "x 2: y", "2 x", "-: y", " 7 : seven : more", "10:ten", "\u0e51\u0e52: thai"]:
        out.append({"kind": "strip", "s": s, "out": strip_level_number(s)})
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "unicode-tables":
        return unicode_tables()
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="testdata/qwen3_5-tokenizer")
    ap.add_argument("--out", default="tests/fixtures/systemone")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    from decider import systemone as S1
    from decider.prompt import label_table
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    assert type(tok).__name__ == "Qwen3_5Tokenizer", type(tok).__name__
    _, lab_ids, open_ids = label_table(tok)
    os.makedirs(a.out, exist_ok=True)

    render_out, assemble_out = [], []
    nrng = np.random.default_rng(1234)
    for name, text, iso in requests():
        case = {"name": name, "body": text, "isolated_levels": iso}
        r, err = parse_http(text)
        if err is None:
            try:
                rqs, index, items, ctx_len = prepare(tok, r, iso, {})
            except ValueError as e:
                err = http_error(422, {"detail": str(e)})
            except AttributeError:
                err = {"status": 500, "body": "Internal Server Error", "divergence": "spec_not_object"}
        if err is not None:
            case["error"] = err
            render_out.append(case); continue
        case["rows"] = [{"ids": it["ids"], "slots": it["slots"], "nopts": it["nopts"], "types": it["types"]} for it in items]
        case["input_tokens"] = S1.unique_tokens(items)
        case["temperatures"] = {k: slot_temps(cfg, items) for k, cfg in TEMP_CONFIGS.items()}
        render_out.append(case)
        # assembly: two synthetic probability sets per request (f32 values, as the engines hand them over)
        if len(text) < 20000:
            for variant in range(2):
                probs = []
                for it in items:
                    for n in it["nopts"]:
                        kind = (variant * 7 + len(probs)) % 6
                        if kind == 0:
                            p = nrng.dirichlet(np.ones(n))
                        elif kind == 1:
                            p = np.full(n, 1.0 / n)                     # ties
                        elif kind == 2:
                            p = np.zeros(n); p[n - 1] = 1.0             # one-hot, zeros
                        elif kind == 3:
                            p = nrng.dirichlet(np.ones(n) * 0.05)       # peaked
                        elif kind == 4:
                            p = np.zeros(n)                             # all zero (degenerate)
                        else:
                            p = np.array([0.12345, 0.00005] + [0.5] * (n - 2))[:n]   # rounding boundaries, unnormalised
                        probs.append([float(x) for x in np.asarray(p, dtype=np.float32)])
                answers = S1.assemble(rqs, index, probs)
                resp = {"model": "decider-1.10", "answers": answers, "usage": {"input_tokens": S1.unique_tokens(items), "output_tokens": 0}}
                assemble_out.append({"name": f"{name}#{variant}", "body": text, "isolated_levels": iso, "probs": probs,
                                     "response": compact(resp)})
    inv = []
    for name, text in invalid_bodies():
        r, err = parse_http(text)
        assert err is not None, name
        inv.append({"name": name, "request": text, "status": err["status"], "response": err["body"]})
    for path, rows in (("render.jsonl", render_out), ("assemble.jsonl", assemble_out), ("invalid.jsonl", inv), ("pyjson.jsonl", pyjson_cases())):
        with open(os.path.join(a.out, path), "w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(a.out, "labels.json"), "w") as f:
        json.dump({"ids": lab_ids, "open_ids": open_ids}, f)
    print(f"render {len(render_out)}  assemble {len(assemble_out)}  invalid {len(inv)}  pyjson {len(pyjson_cases())}", file=sys.stderr)


if __name__ == "__main__":
    main()
