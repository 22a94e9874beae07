#!/usr/bin/env python3
"""System One with the server's prefix-state LRU on and off, side by side in one run: what a kept context saves.

    cargo build --release -p onepass
    target/release/onepass synth --preset qwen3.5-0.8b --dtype bf16 --tokenizer testdata/qwen3_5-tokenizer --out /tmp/q08
    python3 benches/systemone_prefix_cache.py --onepass target/release/onepass --model /tmp/q08 [--events 60] [--rounds 2]

One `onepass serve` per mode (`--prefix-cache-mb 1024`, then `0`; never both at once), in --rounds rounds (the fastest
round of each figure is kept). Each round posts to `/v1/systemone`, in order: a request (a JSON state of --events
events, 5 questions, 7 rows), the same request again, and the same state with other questions. With the LRU on, the
first is a miss (its context, `"Context:\\n"` + state, is computed and kept), the next two are hits (only the rows after
the context run). Prints the context's ids, a markdown table of client-side latency per request and mode with the
ratio, the LRU's hits/misses/bytes from /metrics, whether the answers of the two modes are equal, and one JSON line.
Standard library only.
"""
import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_proc import start_serve  # noqa: E402

QUESTIONS = {
    "intent": {"instructions": "What does the customer want now?", "criteria": ["refund", "upgrade", "information", "cancel"]},
    "tier": {"instructions": "Customer tier", "criteria": {"bronze": None, "silver": None, "gold": "top tier"}},
    "vip": {"type": "noul", "instructions": "Should this go to the VIP desk?"},
    "risk": {"type": "score", "instructions": "Churn risk", "criteria": ["low", "medium", "high"]},
    "late": {"type": "noul", "instructions": "Was a parcel late?"},
}
OTHER = {
    "channel": {"instructions": "Where should the answer go?", "criteria": ["email", "phone", "chat"]},
    "refund": {"type": "noul", "instructions": "Is a refund owed?"},
    "mood": {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "annoyed", "angry"]},
}


def state_of(n):
    ev = [{"t": f"2026-09-{1 + d % 28:02d}", "kind": ["login", "purchase", "refund", "ticket"][d % 4],
           "amount": round(d * 7.25, 2)} for d in range(n)]
    return {"customer": {"name": "Ana Sousa", "tier": "gold", "region": "north"}, "events": ev,
            "note": "Asked twice about the late parcel and the refund."}


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = r.read()
    return (time.perf_counter() - t) * 1e3, out


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        text = r.read().decode()
    want = ["onepass_prefix_cache_hits_total", "onepass_prefix_cache_misses_total", "onepass_prefix_cache_bytes"]
    return {n: int(line.split()[1]) for line in text.splitlines() for n in want if line.startswith(n + " ")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--model", required=True)
    ap.add_argument("--events", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    state = state_of(a.events)
    reqs = [("first", {"state": state, "questions": QUESTIONS}),
            ("same request again", {"state": state, "questions": QUESTIONS}),
            ("same state, other questions", {"state": state, "questions": OTHER})]
    modes = [("on", ["--prefix-cache-mb", "1024"]), ("off", ["--prefix-cache-mb", "0"])]
    best = {m: [float("inf")] * len(reqs) for m, _ in modes}
    answers, lru = {}, {}
    for _ in range(a.rounds):
        for mode, args in modes:
            srv, port = start_serve(a.onepass, a.model, args)
            try:
                # Warm-up on another state (not the one measured), so the first request pays no first-call costs.
                post(port, "/v1/systemone", {"state": state_of(3), "questions": QUESTIONS})
                got = []
                for i, (_, body) in enumerate(reqs):
                    ms, out = post(port, "/v1/systemone", body)
                    best[mode][i] = min(best[mode][i], ms)
                    got.append(json.loads(out))
                answers[mode] = got
                lru[mode] = metrics(port)
            finally:
                srv.terminate()
                srv.wait()
    print("| request | LRU on, ms | LRU off, ms | on / off |")
    print("|---|---:|---:|---:|")
    for i, (name, _) in enumerate(reqs):
        on, off = best["on"][i], best["off"][i]
        print(f"| {name} | {on:.0f} | {off:.0f} | {on / off:.2f} |")
    same = [answers["on"][i]["answers"] == answers["off"][i]["answers"] for i in range(len(reqs))]
    print(f"\nLRU on: {lru['on']}; answers equal to the LRU off: {same}")
    print(json.dumps({"events": a.events, "rounds": a.rounds, "ms": best, "lru": lru, "answers_equal": same,
                      "usage": answers["on"][0].get("usage")}))


if __name__ == "__main__":
    main()
