"""Golden answers for onepass-server's POST /decide, from decider-ai 1.10.0's FastAPI app (decider.serve).

The reference app runs under Starlette's TestClient without its lifespan: `eng` is a stand-in holding the real
tokenizer (testdata/qwen3_5-tokenizer, via transformers), and the batcher queue is replaced by a function that
records the row and returns fixed probabilities: slot k with n options gets p_j = float32(w_j / sum(w)),
w_j = 1 + ((5 j + 3 k) % 7) (crates/server/tests/decide_route.rs computes the same numbers). Everything else
(pydantic validation, _check_schema, neutralisation, prompt building, _format_decide, JSONResponse) is the reference's.

Run (fastapi 0.165.0, starlette 1.10.0, pydantic 2.14.4, Python 3.11.7, decider-ai 1.10.0 + transformers importable):
    python crates/server/tests/oracle/decide_route.py > crates/server/tests/fixtures/decide_route.jsonl
    python crates/server/tests/oracle/decide_route.py --chat > crates/server/tests/fixtures/decide_route_chat.jsonl

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
for body in BODIES:
    SEEN.clear()
    r = client.post("/decide", content=body, headers={"content-type": "application/json"})
    print(json.dumps({"body": body.decode("utf-8"), "status": r.status_code, "content_type": r.headers.get("content-type"),
                      "response": r.content.decode("utf-8"), "row": SEEN.get("row")}, ensure_ascii=False))
