"""Manual check with the official TypeSafe SDK (pip install "typesafe-sdk[zstd]==0.7.5") against a running server:
    onepass serve --model DIR --port 18731 --api-key sk-test &
    TYPESAFE_BASE_URL=http://127.0.0.1:18731 TYPESAFE_API_KEY=sk-test python crates/server/tests/oracle/sdk_probe.py
The first request is over 1024 bytes, so the SDK sends it zstd-compressed."""
import logging, json
from typesafe_sdk import TypeSafeClient, Choice, Noul
c = TypeSafeClient()
state = {"ticket": "My card was charged twice for one order. " * 40, "tier": "gold"}
r = c.system_one(state, {"topic": Choice(instructions="What is the ticket about?", criteria={"billing": "payments", "shipping": None, "login": None}),
                         "urgent": Noul(instructions="Is it urgent?")})
print("SYSTEMONE", r.raw_http_response.status_code, r.request_id, r.raw_http_response.text[:300])
print("MODELS", c.models.list() if hasattr(c.models, "list") else c.models)
small = c.system_one("short text", {"q": {"type": "noul", "instructions": "ok?"}})
print("SMALL", small.raw_http_response.text)
