"""Where a System One request's time goes through `onepass serve`, one request at a time: the client's round trip
(Python http.client, keep-alive, loopback), the server's own time from the request head to the response, and the
time inside engine `score` calls, the last two from the server's /metrics counters
(onepass_request_duration_seconds, onepass_engine_seconds_total) read before and after each workload. The server's
time beyond the engine call is parsing, rendering, tokenizing and planning the body, the hand-off to the batching
thread and back, answer assembly and HTTP; the client's beyond the server's is the client and the connection.

    onepass serve --model M --port 8795 &            # any device
    onepass bench-systemone --model M --write-requests /tmp/req
    python3 benches/http_split.py --port 8795 --requests /tmp/req [--n 300]

Standard library only; prints one line per workload (each workload twice, in turn).
"""
import argparse, http.client, re, time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--requests", required=True, help="folder of workload1.json .. workload3.json")
    ap.add_argument("--n", type=int, default=300, help="requests per workload and round")
    a = ap.parse_args()
    c = http.client.HTTPConnection("127.0.0.1", a.port)

    def metrics():
        c.request("GET", "/metrics")
        t = c.getresponse().read().decode()
        eng = float(re.search(r"^onepass_engine_seconds_total (\S+)", t, re.M).group(1))
        s = re.search(r'^onepass_request_duration_seconds_sum\{route="/v1/systemone"\} (\S+)', t, re.M)
        n = re.search(r'^onepass_request_duration_seconds_count\{route="/v1/systemone"\} (\S+)', t, re.M)
        return eng, float(s.group(1)) if s else 0.0, float(n.group(1)) if n else 0.0

    def post(body):
        c.request("POST", "/v1/systemone", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit(f"HTTP {r.status}: {data[:200]!r}")

    for w in [1, 2, 3, 1, 2, 3]:
        with open(f"{a.requests}/workload{w}.json", "rb") as f:
            body = f.read()
        for _ in range(10):
            post(body)
        e0, s0, n0 = metrics()
        ts = []
        for _ in range(a.n):
            t0 = time.perf_counter()
            post(body)
            ts.append(time.perf_counter() - t0)
        e1, s1, n1 = metrics()
        k = n1 - n0
        ts.sort()
        print(f"workload{w} ({len(body)} B body): client p50 {ts[len(ts) // 2] * 1e3:.3f} ms, mean "
              f"{sum(ts) / len(ts) * 1e3:.3f}; server head to response, mean {(s1 - s0) / k * 1e3:.3f} ms; "
              f"engine calls, mean {(e1 - e0) / k * 1e3:.3f} ms (n = {k:.0f})", flush=True)


if __name__ == "__main__":
    main()
