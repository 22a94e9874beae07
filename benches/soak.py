"""Soak `onepass serve`: many clients sending a mix of valid, invalid and oversized bodies for minutes.

Starts `onepass serve` on a free port, answers each valid body once alone (the reference answers), then runs
--clients threads for --minutes, each picking a body at random (seeded) and sending it again as soon as its answer
arrives. Every answer's status must be the one its body expects; every valid answer must be byte-equal to its
answer alone. Samples the server's RSS every second. Prints requests/s, p50/p99 latency, answers by status,
unexpected statuses and mismatches, RSS after the first minute, peak and final, and one JSON line last.

    target/release/onepass synth --preset tiny-qwen-vocab --tokenizer testdata/qwen3_5-tokenizer --out /tmp/qs
    python3 benches/soak.py --onepass target/release/onepass --model /tmp/qs --minutes 10

Arguments after `--` go to `onepass serve`. Standard library only; Linux (/proc) for RSS.
"""
import gzip, http.client, json, random, re, sys, threading, time

from percentile import pct  # benches/percentile.py: nearest rank, as onepass
from serve_proc import serve_parser, start_serve  # benches/serve_proc.py

QUESTIONS = {
    "topic": {"type": "choice", "instructions": "What is the ticket about?", "criteria": ["billing", "shipping", "login"]},
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "severity": {"type": "score", "instructions": "How severe?", "criteria": ["minor", "moderate", "major"]},
}


def bodies():
    """(name, path, body bytes, headers, expected status). Valid ones expect 200 and get compared byte for byte."""
    out = []
    for i in range(6):
        state = {"ticket": f"Order {i}: my card was charged {i + 2} times", "items": list(range(i * 5))}
        b = json.dumps({"state": state, "questions": QUESTIONS}).encode()
        out.append((f"valid{i}", "/v1/systemone", b, {}, 200))
    out.append(("valid_gzip", "/v1/systemone", gzip.compress(out[0][2]), {"Content-Encoding": "gzip"}, 200))
    dec = {"context": "The parcel arrived broken.", "schema": {"What happened?": {"type": "choice", "options": ["damage", "delay"]}, "Refund?": {"type": "bool"}}}
    out.append(("valid_decide", "/decide", json.dumps(dec).encode(), {}, 200))
    big = json.dumps({"state": [0] * 200_000, "questions": {"q": QUESTIONS["urgent"]}}).encode()
    out.append(("valid_huge_state", "/v1/systemone", big, {}, 200))
    out.append(("invalid_json", "/v1/systemone", b"{\"state\":", {}, 422))
    out.append(("invalid_schema", "/v1/systemone", b"{\"state\":1,\"questions\":{\"q\":{\"type\":\"nope\"}}}", {}, 422))
    out.append(("invalid_nan", "/v1/systemone", b"{\"state\":1,\"questions\":{},\"independent\":NaN}", {}, 422))
    out.append(("invalid_decide", "/decide", b"{\"context\":5}", {}, 422))
    many = {f"q{i}": QUESTIONS["topic"] for i in range(1100)}
    out.append(("oversized_rows", "/v1/systemone", json.dumps({"state": 1, "questions": many}).encode(), {}, 413))
    out.append(("oversized_values", "/v1/systemone", b"[" + b"0," * 2_000_001 + b"0]", {}, 413))
    return out


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def post(conn, path, body, headers):
    h = {"Content-Type": "application/json", **headers}
    conn.request("POST", path, body, h)
    r = conn.getresponse()
    return r.status, r.read()


def main():
    ap = serve_parser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    srv, port = start_serve(a.onepass, a.model, a.serve_args)
    work = bodies()
    alone = {}
    for name, path, body, headers, want in work:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        st, data = post(c, path, body, headers)
        c.close()
        if st != want:
            sys.exit(f"{name}: status {st} alone, expected {want}: {data[:200]!r}")
        alone[name] = data
    print(f"soak: {len(work)} bodies answered alone as expected; {a.clients} clients for {a.minutes} min", flush=True)
    stop = threading.Event()
    lock = threading.Lock()
    lat, by_status, unexpected, mismatch, failures = [], {}, [], [], []

    def client(k):
        rng = random.Random(a.seed * 1000 + k)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while not stop.is_set():
            name, path, body, headers, want = work[rng.randrange(len(work))]
            t0 = time.perf_counter()
            try:
                st, data = post(conn, path, body, headers)
            except Exception as e:  # a dropped connection is a failure, counted
                with lock:
                    failures.append(f"{name}: {type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                continue
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                by_status[st] = by_status.get(st, 0) + 1
                if st != want and not (st == 503 and want == 200):
                    unexpected.append(f"{name}: {st}")
                if st == 200 and data != alone[name]:
                    mismatch.append(name)
            if st == 413 or st >= 500:
                conn.close()  # the server may close after an unread body
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        conn.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(a.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    rss = []
    while time.time() - t0 < a.minutes * 60:
        time.sleep(1)
        rss.append((time.time() - t0, rss_mib(srv.pid)))
    stop.set()
    for t in threads:
        t.join(timeout=300)
    secs = time.time() - t0
    time.sleep(2)
    final = rss_mib(srv.pid)
    srv.terminate()
    srv.wait(timeout=60)
    after_1min = [m for s, m in rss if s >= 60] or [m for _, m in rss]
    n = len(lat)
    res = {
        "clients": a.clients, "seconds": round(secs, 1), "requests": n, "requests_per_s": round(n / secs, 1),
        "p50_ms": round(pct(lat, 0.50) * 1e3, 1) if lat else None, "p99_ms": round(pct(lat, 0.99) * 1e3, 1) if lat else None,
        "by_status": dict(sorted(by_status.items())), "unexpected_statuses": len(unexpected),
        "connection_failures": len(failures), "mismatched_valid_answers": len(mismatch),
        "rss_mib_first_minute_max": round(max(m for s, m in rss if s < 60), 1) if rss else None,
        "rss_mib_after_first_minute_min_max": [round(min(after_1min), 1), round(max(after_1min), 1)],
        "rss_mib_peak": round(max(m for _, m in rss), 1), "rss_mib_final": round(final, 1),
    }
    for k, v in res.items():
        print(f"  {k}: {v}")
    for x in (unexpected[:5] + failures[:5]):
        print("  e.g.", x)
    print(json.dumps(res))
    sys.exit(1 if unexpected or mismatch or failures else 0)


if __name__ == "__main__":
    main()
