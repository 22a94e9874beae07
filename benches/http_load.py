"""A saturating concurrent load through `onepass serve` (the HTTP path of issue #4's saturation figure).

Starts `onepass serve` on a free port (or uses --url), then for each concurrency level keeps that many requests in
flight for --seconds (each client thread sends the body again as soon as its answer arrives), and prints one line per
level: requests, errors, p50/p95 latency, requests/s and decisions/s (decisions per request: the body's scoring rows,
given by --decisions; bench-systemone prints them). Standard library only (threads + http.client), so it runs on the
GPU machine as is. Example, on the GPU machine:

    onepass synth --preset qwen3.5-0.8b --out /tmp/q08 --tokenizer <tokenizer>; onepass bench-systemone --model /tmp/q08 --write-requests /tmp/req
    python3 benches/http_load.py --onepass onepass --model /tmp/q08 --body /tmp/req/workload1.json --decisions 7 \
        --concurrency 1,8,32,64 --seconds 10 -- --device cuda

Arguments after `--` go to `onepass serve`. Prints a JSON object last (one line).
"""
import argparse, http.client, json, re, subprocess, sys, threading, time, urllib.parse

from percentile import pct  # benches/percentile.py: nearest rank, as onepass


def client(host, port, body, stop, lat, errs, lock):
    conn = http.client.HTTPConnection(host, port, timeout=120)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/v1/systemone", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            ok = r.status == 200 and data.startswith(b"{")
        except Exception:
            ok = False
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=120)
        dt = time.perf_counter() - t0
        with lock:
            (lat if ok else errs).append(dt)
    conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running server (else --onepass and --model start one)")
    ap.add_argument("--onepass", default="onepass")
    ap.add_argument("--model")
    ap.add_argument("--body", required=True)
    ap.add_argument("--decisions", type=int, default=1)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    body = open(a.body, "rb").read()
    proc = None
    url = a.url
    if not url:
        if not a.model:
            sys.exit("--model (or --url) is needed")
        proc = subprocess.Popen([a.onepass, "serve", "--model", a.model, "--port", "0", "--quiet", *a.serve_args],
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            sys.stderr.write(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        if not url:
            sys.exit("onepass serve did not start")
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    u = urllib.parse.urlparse(url)
    rows = []
    try:
        for c in [int(x) for x in a.concurrency.split(",")]:
            # Warm-up: every thread once (graphs, tuning, allocations), then the timed window.
            for window in (min(2.0, a.seconds), a.seconds):
                stop, lock, lat, errs = threading.Event(), threading.Lock(), [], []
                ts = [threading.Thread(target=client, args=(u.hostname, u.port, body, stop, lat, errs, lock))
                      for _ in range(c)]
                t0 = time.perf_counter()
                for t in ts:
                    t.start()
                time.sleep(window)
                stop.set()
                for t in ts:
                    t.join()
                wall = time.perf_counter() - t0
            n = len(lat)
            row = {"concurrency": c, "requests": n, "errors": len(errs), "p50_ms": pct(lat, 0.5) * 1e3,
                   "p95_ms": pct(lat, 0.95) * 1e3, "requests_per_s": n / wall,
                   "decisions_per_s": n * a.decisions / wall}
            rows.append(row)
            print(f"{c:>4} in flight: {n:>6} requests, {len(errs)} errors, p50 {row['p50_ms']:8.2f} ms, "
                  f"p95 {row['p95_ms']:8.2f} ms, {row['requests_per_s']:8.1f} req/s, "
                  f"{row['decisions_per_s']:9.1f} decisions/s", file=sys.stderr)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps({"url": url, "body": a.body, "decisions_per_request": a.decisions, "levels": rows}))


if __name__ == "__main__":
    main()
