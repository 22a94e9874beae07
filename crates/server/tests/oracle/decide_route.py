"""Golden answers for onepass-server's POST /decide, from decider-ai 1.10.0's FastAPI app (decider.serve).

The reference app runs under Starlette's TestClient without its lifespan: `eng` is a stand-in holding the real
tokenizer (testdata/qwen3_5-tokenizer, via transformers), and the batcher queue is replaced by a function that
records the row and returns fixed probabilities: slot k with n options gets p_j = float32(w_j / sum(w)),
w_j = 1 + ((5 j + 3 k) % 7) (crates/server/tests/decide_route.rs computes the same numbers). Everything else
(pydantic validation, _check_schema, neutralisation, prompt building, _format_decide, JSONResponse) is the reference's.

Run (fastapi 0.165.0, starlette 1.10.0, pydantic 2.14.4, Python 3.11.7, decider-ai 1.10.0 + transformers importable):
    python crates/server/tests/oracle/decide_route.py > crates/server/tests/fixtures/decide_route.jsonl
    python crates/server/tests/oracle/decide_route.py --chat > crates/server/tests/fixtures/decide_route_chat.jsonl

--fuzz SEED COUNT: COUNT random bodies instead (the grammar of tools/oracle/decider_fuzz.py: unicode text, every JSON
type, schemas with fields present, absent, null or of the wrong type, one body in five edited byte-wise); the
reference's 500s and bodies holding a lone surrogate (a documented divergence) are left out. Committed: --fuzz 1 150 > crates/server/tests/fixtures/decide_route_fuzz.jsonl.
Checked with another file: ONEPASS_DECIDE_FUZZ=FILE cargo test --release -p onepass-server --test decide_route fuzz.

--chat: the chat layout (serve.CHAT = prompt.chat_template(tok), as start-up sets it for a model whose
decider_config.json says "layout": "chat"), with tests/fixtures/systemone/layouts/templates/qwen3_style.jinja installed
as the tokenizer's chat_template, over the bodies that reach the model (the 1536-id context cap included).
"""
import json, os, sys, types
import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer
import decider.serve as S

ROOT = os.path.join(os.path.dirname(__file__), "../../../..")
S.eng = types.SimpleNamespace(tok=AutoTokenizer.from_pretrained(os.path.join(ROOT, "testdata/qwen3_5-tokenizer")))
SEEN = {}


def probs(k, n):
    w = [1 + ((5 * j + 3 * k) % 7) for j in range(n)]
    s = sum(w)
    return torch.tensor([x / s for x in w], dtype=torch.float32)


async def queued(items):
    it = items[0]
    SEEN["row"] = {"ids": it["ids"], "slots": it["slots"], "nopts": it["nopts"], "types": it["types"]}
    return [[probs(k, n) for k, n in enumerate(it["nopts"])]]


S._queued = queued
client = TestClient(S.app, raise_server_exceptions=False)
LONG = "word " * 2000
BODIES = [
    b'{"context":"x","schema":null}',
    b'{"context":"x"}',
    b'{"schema":{}}',
    b'{"schema":{"q":{"type":"bool"}},"extra":1}',
    b'[1]',
    b'"text"',
    b'{"context":5,"schema":{}}',
    b'{"context":null}',
    b'{"context":"x","schema":{}}',
    b'{"context":"x","schema":[]}',
    b'{"context":"x","schema":"abc"}',
    b'{"context":"x","schema_":{"a":1}}',
    b'{"context":"x","schema":{"a":1}}',
    b'{"context":"x","schema":{"a":[1]}}',
    b'{"context":"x","schema":{"it\'s":null}}',
    b'{"context":"x","schema":{"a":{"type":"choice","options":"ab"}}}',
    b'{"context":"x","schema":{"a":{"type":"choice","options":[]}}}',
    b'{"context":"x","schema":{"a":{"type":"choice","options":["a",1]}}}',
    b'{"context":"x","schema":{"a":{"type":"choice"}}}',
    b'{"context":"x","schema":{"a":{"options":["a","b"]},"b":{"type":"nope"}}}',
    b'{"context":"x","schema":{"a":{"type":null}}}',
    b'{"context":"x","schema":{"a":{"type":"scale"}}}',
    b'{"context":"x","schema":{"a":{"type":"scale","legend":{}}}}',
    b'{"context":"x","schema":{"a":{"type":"scale","legend":"abc"}}}',
    b'{"context":"x","schema":{"a":{"type":"scale","legend":[1,NaN]}}}',
    b'{"context":"x","schema":{"a":{"type":"scale","legend":{"abc":"x"}}}}',
    b'{"context":"x","schema":{"a":{"type":"scale","legend":{"inf":"x"}}}}',
    b'{"context":"x","schema":{"a":{"type":"scale","legend":{"1e400":"x"}}}}',
    b'{bad',
    b'',
    b'{"context":"x","schema":{"a":{"type":"bool"}},',
    b'{"context":"The cat sat.","schema":{"Is it a cat?":{"type":"bool"}}}',
    b'{"context":"The cat sat.","schema":{"Is it a cat?":{"type":"bool","options":["x","y","z"]}}}',
    b'{"context":"The cat sat.","schema":{"Animal?":{"type":"choice","options":["cat","dog","None of the above"]},"Calm?":{"type":"scale","legend":{"10":"calm","2":"angry"}},"b":{"type":"bool"}}}',
    b'{"context":"","schema":{"Which?":{"options":{"red":"warm","blue":null,"n/a":1}}}}',
    b'{"context":"x","schema":{"Which?":{"type":"choice","options":["none","N/A ","none of these","not listed here","other"]}}}',
    b'{"context":"x","schema":{"Only?":{"type":"choice","options":["single"]}}}',
    b'{"context":"x","schema":{"Level?":{"type":"scale","legend":["low",2,null,{"a":1},[1.5,true],1e16]}}}',
    b'{"context":"x","schema":{"Level?":{"type":"scale","legend":{"1.5":"a","-1":"b"," 3 ":"c","0":"d","-0.0":"e","1_0":"f"}}}}',
    b'{"context":"x","schema":{"Level?":{"type":"scale","legend":["one"]}}}',
    b'{"context":"x","schema":{"Wide?":{"type":"choice","options":["o0","o1","o2","o3","o4","o5","o6","o7","o8","o9","o10","o11","None of the above"]}}}',
    b'{"context":"caf\\u00e9 \xe2\x98\x95 \\n\\"quoted\\"","schema":{"\xc3\xa9t\xc3\xa9 ?":{"type":"bool"},"b":{"type":"choice","options":["\xe2\x98\x95","tea"]}}}',
    json.dumps({"context": LONG, "schema": {"Long?": {"type": "bool"}, "Two?": {"type": "choice", "options": ["a", "b", "c"]}}}).encode(),
    b'{"context":"x","schema":{"a":{"type":"bool"}},"schema_":{"b":{"type":"bool"}}}',
    b'{"schema_":{"b":{"type":"bool"}},"context":"x","schema":{"a":{"type":"bool"}}}',
    b'{"context":"x","schema":{"dup":{"type":"bool"},"dup":{"type":"choice","options":["p","q"]}}}',
]
if "--chat" in sys.argv:
    import shutil, tempfile
    from decider.prompt import chat_template
    d = tempfile.mkdtemp()
    src = os.path.join(ROOT, "testdata/qwen3_5-tokenizer")
    shutil.copy(os.path.join(src, "tokenizer.json"), d)
    cfg = json.load(open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8"))
    cfg["chat_template"] = open(os.path.join(ROOT, "tests/fixtures/systemone/layouts/templates/qwen3_style.jinja"),
                                encoding="utf-8").read()
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))
    S.eng = types.SimpleNamespace(tok=AutoTokenizer.from_pretrained(d))
    S.CHAT = chat_template(S.eng.tok)
    S.LAYOUT = "chat"
    LONG2 = "The parcel was late again and the customer asked for a refund. " * 300
    BODIES = [b for b in BODIES if b.startswith(b'{"context":"The cat') or b.startswith(b'{"context":"caf')
              or b.startswith(b'{"context":""') or b'"Wide?"' in b or b'"Level?"' in b or b'"Long?"' in b
              or b'"Which?"' in b] + [
        json.dumps({"context": LONG2, "schema": {"Refund?": {"type": "bool"},
                                                 "Mood?": {"type": "scale", "legend": {"1": "calm", "5": "angry"}}}}).encode(),
        json.dumps({"context": "x" * 9000, "schema": {"Short?": {"type": "choice", "options": ["a", "b"]}}}).encode(),
    ]



def fuzz_bodies(seed, count):
    """Random /decide bodies: (context, schema) of every shape the route validates."""
    sys.path.insert(0, os.path.join(ROOT, "tools/oracle"))
    from decider_fuzz import Gen, has_lone_surrogate
    g = Gen(seed)
    r = g.r

    def field():
        f = {}
        t = r.random()
        kind = g.pick(["choice", "bool", "scale"])
        if t < 0.85:
            if kind != "choice" or t < 0.5:
                f["type"] = kind
        else:
            f["type"] = g.pick(["nope", None, 1, "Bool", ["choice"]])
        n = g.pick([2, 2, 3, 3, 4, 5, 7, 10, 11, 12, 26]) if r.random() < 0.95 else g.pick([0, 1, 254, 255, 256])
        if kind == "choice" and r.random() < 0.95:
            opts = [g.option("choice") if r.random() < 0.7 else g.pick(["none", "N/A ", "None of the above", "other",
                                                                       "not listed", "n/a", "yes", "no"])
                    for _ in range(n)]
            f["options"] = opts if r.random() < 0.6 else {str(o): g.pick([g.text(0, 4), None, 1, ""]) for o in opts}
            if r.random() < 0.03:
                f["options"] = g.pick(["ab", None, 5, [1, 2]])
        if kind == "scale" and r.random() < 0.95:
            m = min(n, r.randint(2, 10))
            if r.random() < 0.5:
                f["legend"] = [g.text(0, 4) if r.random() < 0.9 else g.value(2) for _ in range(m)]
            else:
                keys = [str(v) for v in r.sample(range(-3, 13), min(m, 16))]
                keys = [k if r.random() < 0.85 else g.pick([" 2 ", "1.5", "-0.0", "1_0", "inf", "nan", "x", "1e400"])
                        for k in keys]
                f["legend"] = {k: g.text(0, 4) for k in keys}
        if kind == "bool" and r.random() < 0.1:
            f["options"] = [g.text(1, 2) for _ in range(r.randint(0, 3))]
        if r.random() < 0.05:
            f[g.key()] = g.value(1)
        return f

    out = []
    while len(out) < count:
        schema = {}
        for _ in range(r.choice([0, 1, 1, 2, 2, 3, 5])):
            q = g.text(1, 8) + g.pick(["?", "", ":"]) if r.random() < 0.95 else g.pick(["", " ", "q"])
            schema[q] = field() if r.random() < 0.97 else g.value(1)
        body = {"context": g.text(0, 60) if r.random() < 0.9 else g.pick([None, 5, "", "word " * 1700, ["x"]]),
                "schema": schema}
        if r.random() < 0.05:
            body["schema_"] = body.pop("schema")
        if r.random() < 0.05:
            body[g.key()] = g.value(1)
        if r.random() < 0.04:
            body.pop("context")
        text = json.dumps(body, ensure_ascii=r.random() < 0.2)
        if r.random() < 0.2:
            text = g.mutate(text)
        try:  # a lone surrogate: onepass answers 400 whatever follows (docs/systemone.md, "Divergences")
            if has_lone_surrogate(json.loads(text.encode("utf-8"))):
                continue
        except ValueError:
            pass
        out.append(text.encode("utf-8"))
    return out


if "--fuzz" in sys.argv:
    i = sys.argv.index("--fuzz")
    BODIES = fuzz_bodies(int(sys.argv[i + 1]), int(sys.argv[i + 2]))
for body in BODIES:
    SEEN.clear()
    r = client.post("/decide", content=body, headers={"content-type": "application/json"})
    if "--fuzz" in sys.argv and r.status_code == 500:
        print(f"left out (reference 500): {body[:200]!r}", file=sys.stderr)
        continue
    print(json.dumps({"body": body.decode("utf-8"), "status": r.status_code, "content_type": r.headers.get("content-type"),
                      "response": r.content.decode("utf-8"), "row": SEEN.get("row")}, ensure_ascii=False))
