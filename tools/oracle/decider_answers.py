"""System One answer fixtures: decider-ai 1.10.0 on CPU (float32) over two synthetic checkpoints.

    cargo build --release -p onepass
    python tools/oracle/decider_answers.py [--tokenizer testdata/qwen3_5-tokenizer] \
        [--out tests/fixtures/systemone/answers] [--onepass target/release/onepass]

For each checkpoint in CHECKPOINTS: `onepass synth --preset P --tokenizer T` writes the weights into a temp folder, the
script adds its decider_config.json (with "neutralize_none": false, so the library answers exactly as /v1/systemone,
decider-contract R1.11.1) and runs `Decider(dir, device="cpu").system_one(state, questions, independent=...)` on every
request of REQUESTS (decider-contract §7). It writes <preset>.jsonl: one line per request with the body text, the
reference response (compact JSON, as the server writes it) and the raw float32 probabilities per slot that the library
handed to `assemble`; and manifest.json: per preset the decider_config.json text and the sha256 of model.safetensors
(crates/decide/tests/answers.rs regenerates the checkpoint and checks the hash before comparing).

    python tools/oracle/decider_answers.py --fuzz 3 200 --out /tmp/ans3
    ONEPASS_ANSWER_FIXTURES=/tmp/ans3 cargo test --release -p onepass-decide --test answers

--fuzz SEED COUNT: COUNT random requests (the grammar of decider_fuzz.py, keeping those the reference answers: no
byte edits, no error answers, states under 3,000 characters, rows within the checkpoints' 4,096 positions) instead of REQUESTS, in the same format, so the answer
tests (and the GPU's, crates/cuda-engine/tests/answers.rs) read them from ONEPASS_ANSWER_FIXTURES.
"""
import argparse, json, os, platform, subprocess, sys, tempfile, warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import compact, sha256, write_jsonl, write_manifest  # noqa: E402

warnings.filterwarnings("ignore")

CHECKPOINTS = {
    # text form, tied embeddings; scalar temperature, isolated Score levels on.
    "tiny-qwen-vocab": {"version": "t1", "temperature": 1.3, "isolated_levels": True, "neutralize_none": False},
    # composite form, untied lm_head; temperature by options count, numeric version, isolated levels off.
    "tiny-qwen-vocab-composite": {"version": 2.5, "temperature_by_options": {"a": 2.0, "b": -0.3, "min": 0.5},
                                  "isolated_levels": False, "neutralize_none": False},
}

LOREM = ("The quarterly review covered shipping delays, a new supplier in Porto, two open support tickets and the "
         "migration of the billing service. Customers in the north region reported slower responses after the update; "
         "the team rolled back one change and scheduled a follow-up. ")


def long_state():
    events = [{"t": f"2026-09-{d:02d}T10:{d:02d}:00Z", "kind": ["login", "purchase", "refund", "ticket"][d % 4],
               "amount": round(d * 3.75, 2), "note": ["ok", "late", None, "vip", "Größe ✓"][d % 5]} for d in range(1, 19)]
    return {"customer": {"id": 4412, "name": "Ana Sousa", "tier": "gold", "tags": ["eu", "b2b"]}, "events": events,
            "summary": LOREM}


COLORS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple", "pink", "brown", "grey", "cyan",
          "magenta", "olive", "navy", "teal", "maroon", "silver", "gold", "beige", "coral", "indigo", "ivory", "khaki",
          "lavender", "lime", "mint", "ochre", "peach", "plum", "rust", "salmon", "sand", "sapphire", "scarlet", "sepia",
          "tan", "turquoise", "violet", "wine"]

REQUESTS = [
    ("choice_2_list", {"state": "The user asked for a refund twice.", "questions": {
        "q": {"type": "choice", "instructions": "What does the user want?", "criteria": ["refund", "upgrade"]}}}),
    ("choice_3_map", {"state": {"msg": "I can't log in since yesterday", "plan": "pro"}, "questions": {
        "topic": {"instructions": "Topic of the message", "criteria": {
            "billing": "payments, invoices, refunds", "access": "login, passwords, accounts", "other": None}}}}),
    ("choice_10", {"state": "Favourite colour survey: the answer was written in a hurry.", "questions": {
        "c": {"type": "choice", "instructions": "Which colour?", "criteria": COLORS[:10]}}}),
    ("choice_11_wide", {"state": "Favourite colour survey: the answer was written in a hurry.", "questions": {
        "c": {"type": "choice", "instructions": "Which colour?", "criteria": COLORS[:11]}}}),
    ("choice_40_wide", {"state": {"text": "The car was painted a dark shade last spring."}, "questions": {
        "c": {"type": "choice", "question": "Which colour is the car?", "options": COLORS[:40]}}}),
    ("choice_desc_wide", {"state": "Ticket #88: printer jams on page two.", "questions": {
        "d": {"instructions": "Which department?", "criteria": {f"dept{i}": f"handles issue class {i}" if i % 3 else ""
                                                               for i in range(14)}}}}),
    ("score_list_5", {"state": "The delivery arrived three days late and the box was damaged.", "questions": {
        "s": {"type": "score", "instructions": "How satisfied is the customer?",
              "criteria": ["furious", "unhappy", "neutral", "happy", "delighted"]}}}),
    ("score_legend_map", {"state": {"review": "Decent food, slow service, would maybe return."}, "questions": {
        "s": {"type": "score", "instructions": "Rating", "criteria": {"10": "excellent", "2": "poor", "1": "awful",
                                                                       "5": "fine"}}}}),
    ("score_numbered_levels", {"state": "Server CPU at 97% for an hour.", "questions": {
        "sev": {"type": "score", "instructions": "Severity", "criteria": ["0: none", "1: minor", " 2 : major",
                                                                          "3:critical"]}}}),
    ("score_not_isolated", {"state": "Server CPU at 97% for an hour.", "questions": {
        "sev": {"type": "score", "instructions": "Severity", "isolated": False,
                "criteria": ["none", "minor", "major", "critical"]}}}),
    ("score_10_levels", {"state": "On a scale the patient described the pain as sharp but bearable.", "questions": {
        "p": {"type": "score", "instructions": "Pain level", "criteria": [f"level {i}" for i in range(10)]}}}),
    ("noul_plain", {"state": "Please cancel my subscription effective today.", "questions": {
        "n": {"type": "noul", "instructions": "Does the user want to cancel?"}}}),
    ("noul_criteria", {"state": "Please cancel my subscription effective today.", "questions": {
        "n": {"type": "noul", "instructions": "Churn risk", "criteria": {"true": "the user is leaving",
                                                                         "false": "the user stays"}}}}),
    ("noul_no_instructions", {"state": {"email": "Your invoice is attached."}, "questions": {
        "n": {"type": "noul", "criteria": {"true": "the message contains an invoice"}}}}),
    ("bool_alias", {"state": "It is raining in Lisbon.", "questions": {
        "b": {"type": "bool", "instructions": "Is it raining?"}}}),
    ("packed_3", {"state": "Order 1182: two lamps, paid by card, shipped to Berlin.", "independent": False, "questions": {
        "pay": {"instructions": "Payment method", "criteria": ["card", "cash", "transfer"]},
        "intl": {"type": "noul", "instructions": "Shipped abroad?"},
        "size": {"type": "score", "instructions": "Order size", "criteria": ["small", "medium", "large"]}}}),
    ("packed_wide", {"state": "Color of the kite: unclear from the photo.", "independent": False, "questions": {
        "c": {"instructions": "Kite colour", "criteria": COLORS[:12]},
        "ok": {"type": "noul", "instructions": "Is the photo usable?"}}}),
    ("unicode", {"state": {"nachricht": "Grüße aus Köln 🌧️ — 天气很好, спасибо!", "emoji": "👍🏽"}, "questions": {
        "lang": {"instructions": "Welche Sprache überwiegt?", "criteria": ["Deutsch", "中文", "Русский", "English"]},
        "mood": {"type": "noul", "instructions": "Ist die Stimmung positiv? 😊"}}}),
    ("long_state_mix", {"state": long_state(), "questions": {
        "tier": {"instructions": "Customer tier", "criteria": ["bronze", "silver", "gold", "platinum"]},
        "risk": {"type": "score", "instructions": "Churn risk", "criteria": ["low", "medium", "high"]},
        "refund": {"type": "noul", "instructions": "Was there a refund?"},
        "kind": {"instructions": "Most frequent event kind", "criteria": ["login", "purchase", "refund", "ticket"]},
        "colour": {"instructions": "Brand colour", "criteria": COLORS[:20]}}}),
    ("long_text_state", {"state": LOREM * 6, "questions": {
        "topic": {"instructions": "Main topic", "criteria": {"logistics": "shipping and suppliers",
                                                            "software": "services and updates", "people": None}},
        "urgent": {"type": "noul", "instructions": "Is anything urgent?"}}}),
    ("null_state", {"state": None, "questions": {
        "q": {"instructions": "Anything?", "criteria": ["yes", "no", "maybe"]}}}),
    ("number_state", {"state": 42.5, "questions": {
        "q": {"type": "score", "instructions": "How big?", "criteria": ["tiny", "big"]}}}),
    ("none_of_the_above", {"state": "The form lists a fax number only.", "questions": {
        "q": {"instructions": "Contact channel", "criteria": ["email", "phone", "None of the above", "n/a"]}}}),
    ("many_questions", {"state": {"ticket": "App crashes on start after update 3.2 on Android 14.", "votes": 17},
                        "questions": {
        f"q{i}": ({"type": "noul", "instructions": f"Check {i}: is this about crashes?"} if i % 3 == 0 else
                  {"type": "score", "instructions": f"Check {i}: severity", "criteria": ["low", "mid", "high"]}
                  if i % 3 == 1 else
                  {"instructions": f"Check {i}: platform", "criteria": ["android", "ios", "web"]})
        for i in range(7)}}),
    ("array_state_indices", {"state": [{"k": i, "v": COLORS[i]} for i in range(9)] + ["tail"], "questions": {
        "q": {"instructions": "Which colour has k=3?", "criteria": COLORS[:5]}}}),
]


def fuzz_requests(seed, count, tokenizer):
    """Random requests the reference answers (decider_fuzz.py's grammar; the HTTP layer's checks and render decide)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decider_fixtures as F
    from decider_fuzz import Gen, has_lone_surrogate
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer)
    g, out, tries = Gen(seed), [], 0
    while len(out) < count:
        tries += 1
        text, _ = g.request()
        r, err = F.parse_http(text)
        if err is not None or len(json.dumps(r.state, ensure_ascii=False)) > 3000 or not r.questions:
            continue
        body = json.loads(text.encode("utf-8"))
        if has_lone_surrogate(body) or "state" not in body:
            continue
        try:
            rows = [it["ids"] for iso in (False, True) for it in F.prepare(tok, r, iso, {})[2]]
        except Exception:
            continue
        if max(map(len, rows), default=0) > 4096:  # the synthetic checkpoints' positions (a 413 in onepass)
            continue
        req = {"state": r.state, "questions": r.questions, "independent": r.independent}
        out.append((f"fuzz{seed}_{len(out)}", req))
    print(f"fuzz seed {seed}: {count} requests from {tries} drawn", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="testdata/qwen3_5-tokenizer")
    ap.add_argument("--out", default="tests/fixtures/systemone/answers")
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--fuzz", nargs=2, type=int, metavar=("SEED", "COUNT"))
    a = ap.parse_args()

    import torch, transformers, tokenizers
    import decider.systemone as s1
    from decider.infer import Decider
    from importlib.metadata import version

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    captured = {}
    orig_assemble = s1.assemble

    def spy(rqs, index, flatp):  # the float32 probabilities system_one assembles, per slot in row order
        captured["probs"] = [list(map(float, p)) for p in flatp]
        return orig_assemble(rqs, index, flatp)

    s1.assemble = spy
    os.makedirs(a.out, exist_ok=True)
    manifest = {"versions": {"python": platform.python_version(), "decider-ai": version("decider-ai"),
                             "torch": torch.__version__, "transformers": transformers.__version__,
                             "tokenizers": tokenizers.__version__},
                "tokenizer_json_sha256": sha256(os.path.join(a.tokenizer, "tokenizer.json")), "presets": {}}
    for preset, cfg in CHECKPOINTS.items():
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([a.onepass, "synth", "--preset", preset, "--out", d, "--tokenizer", a.tokenizer], check=True)
            cfg_text = json.dumps(cfg)
            with open(os.path.join(d, "decider_config.json"), "w") as f:
                f.write(cfg_text)
            dec = Decider(d, device="cpu")
            lines = []
            for name, req in (fuzz_requests(a.fuzz[0], a.fuzz[1], a.tokenizer) if a.fuzz else REQUESTS):
                body = json.dumps(req, ensure_ascii=False)
                r = json.loads(body)
                captured.clear()
                resp = dec.system_one(r["state"], r["questions"], independent=r.get("independent", True))
                lines.append({"name": name, "body": body, "response": compact(resp), "probs": captured["probs"]})
                print(preset, name, "slots", len(captured["probs"]), file=sys.stderr)
            manifest["presets"][preset] = {"model_safetensors_sha256": sha256(os.path.join(d, "model.safetensors")),
                                           "decider_config": cfg_text, "requests": len(lines)}
        write_jsonl(os.path.join(a.out, f"{preset}.jsonl"), lines)
    write_manifest(os.path.join(a.out, "manifest.json"), manifest, ensure_ascii=False)


if __name__ == "__main__":
    main()
