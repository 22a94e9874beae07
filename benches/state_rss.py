"""Memory for one hostile state: a `/v1/systemone` body whose state is an array of a million zeros (2.0 MB).

Starts `onepass serve` on a free port, reads its RSS when idle, posts the body --repeat times one after another, and
after each prints the status, the time, the RSS 2 s later and the peak RSS so far (sampled every 20 ms). A server
that renders the whole state before cutting it, or keeps the memory afterwards, shows it here.

    target/release/onepass synth --preset tiny-qwen-vocab --tokenizer testdata/qwen3_5-tokenizer --out /tmp/qs
    python3 benches/state_rss.py --model /tmp/qs -- --max-state-tokens 2048

Arguments after `--` go to `onepass serve`. Standard library only; Linux (/proc) for RSS.
"""
import http.client, json, threading, time

from serve_proc import serve_parser, start_serve  # benches/serve_proc.py


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = serve_parser()
    ap.add_argument("--zeros", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with open("examples/ticket.json") as f:
        questions = json.load(f)["questions"]
    body = b'{"state":[' + b",".join([b"0"] * a.zeros) + b'],"questions":' + json.dumps(questions).encode() + b"}"
    srv, port = start_serve(a.onepass, a.model, a.serve_args)
    while True:  # the port is bound before the model loads: wait for /health
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    print(f"body {len(body) / 1e6:.1f} MB; idle RSS {rss_mib(srv.pid):.0f} MiB")
    peak = [0.0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(srv.pid))
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    for k in range(a.repeat):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t = time.monotonic()
        c.request("POST", "/v1/systemone", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        dt = time.monotonic() - t
        time.sleep(2)
        print(f"run {k + 1}: {r.status} in {dt:.2f} s; RSS 2 s after {rss_mib(srv.pid):.0f} MiB; "
              f"peak so far {peak[0]:.0f} MiB")
    done.set()
    srv.terminate()
    srv.wait()


if __name__ == "__main__":
    main()
