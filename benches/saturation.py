"""Saturation of `onepass serve`: POST /v1/systemone from 1, 8, 32 and 64 concurrent clients with requests of mixed
sizes, for a fixed time per level; per level requests/s, decisions/s, p50/p99 latency, tokens/s and the share of the
bf16 tensor-core bound of the work.

Requests: generated here, deterministic (--seed), of three sizes in turn (a state of about 60, 350 and 1,500 words;
2 to 12 questions, choices of 3 to 8 options and yes/no questions, one scoring row each: decisions = questions). Every
request's state is unique (a serial number opens it), so the server's prefix-state cache never answers from an earlier
request: the work is what each request computes.

The bound. The projections are the model's FLOPs: 2 x P multiply-adds per token, P the weights of every 2-D projection
matrix (the safetensors headers of --model: every 2-D `*.weight` but the embedding and the LM head; the label readout,
attention scores, the gated delta rule and the norms add a few percent and are not counted). A request's tokens are
its `usage.input_tokens` (the shared prefix once plus each row's own tokens: what the one-forward tree runs), so the
achieved rate is 2 P x tokens/s and the bound is the GPU's dense bf16 tensor-core peak (--peak-tflops, default
989.4: an H200 SXM's 1,979 TFLOP/s with sparsity, halved); "% of bound" = achieved / peak, and the bound in
decisions/s is peak / (2 P x tokens per decision). Split precision multiplies the input projections twice (both bf16
planes): its own tensor-core work is higher than the work counted here.

Standard library only, so it runs on the GPU machine as is (tools/cuda/saturation-run.sh). Example:

    python3 benches/saturation.py --onepass target/release/onepass --model /tmp/q08 --seconds 10 -- --device cuda

Arguments after `--` go to `onepass serve`. Prints one line per level on stderr and a JSON object last on stdout.
"""
import argparse, http.client, json, os, random, struct, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from percentile import pct  # noqa: E402  nearest rank, as onepass
from serve_proc import start_serve  # noqa: E402

WORDS = ("the parcel order arrived late damaged customer refund replace repair warehouse shipment invoice payment "
         "account support ticket reply urgent delay carrier tracking label address return policy warranty screen "
         "battery charger cable box manual receipt credit card bank transfer error missing item wrong size colour "
         "model review rating complaint request manager escalation call email chat weekend holiday schedule").split()
SIZES = (60, 350, 1500)  # state words of the three request sizes


def body(i, rng, scale=1.0):
    """Request `i`: its size class is i % 3 (`scale` times its words); → (JSON bytes, decisions)."""
    words = max(1, round(SIZES[i % len(SIZES)] * scale))
    state = f"Case {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))
    questions = {}
    for q in range(rng.randint(2, 12)):
        if rng.random() < 0.3:
            questions[f"q{q}"] = {"type": "noul", "instructions": f"Is the {rng.choice(WORDS)} the main issue?"}
        else:
            opts = {f"{rng.choice(WORDS)} {k}": f"the case is about {rng.choice(WORDS)}" for k in range(rng.randint(3, 8))}
            questions[f"q{q}"] = {"type": "choice", "instructions": f"What best describes the {rng.choice(WORDS)}?",
                                  "criteria": opts}
    return json.dumps({"state": state, "questions": questions}).encode(), len(questions)


def projection_params(model):
    """Weights of the 2-D projection matrices in the safetensors files of `model` (not the embedding or LM head)."""
    total = 0
    files = [f for f in os.listdir(model) if f.endswith(".safetensors")]
    if not files:
        return None
    for f in files:
        with open(os.path.join(model, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            shape = t.get("shape", []) if isinstance(t, dict) else []
            if (name.endswith(".weight") and len(shape) == 2 and "embed_tokens" not in name
                    and "lm_head" not in name):
                total += shape[0] * shape[1]
    return total


class Feed:
    """The requests, each sent once, made as the clients ask (one seeded generator: the same sequence every run)."""

    def __init__(self, seed, scale):
        self.rng, self.i, self.scale, self.lock = random.Random(seed), 0, scale, threading.Lock()

    def next(self):
        with self.lock:
            i = self.i
            self.i += 1
            return body(i, self.rng, self.scale)


def client(host, port, feed, stop, out, lock):
    conn = http.client.HTTPConnection(host, port, timeout=300)
    while not stop.is_set():
        data, decisions = feed.next()
        t0 = time.perf_counter()
        ok, tokens = False, 0
        try:
            conn.request("POST", "/v1/systemone", data, {"Content-Type": "application/json"})
            r = conn.getresponse()
            resp = r.read()
            if r.status == 200:
                v = json.loads(resp)
                ok = len(v.get("answers", {})) == decisions
                tokens = v.get("usage", {}).get("input_tokens", 0)
        except Exception:
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=300)
        dt = time.perf_counter() - t0
        with lock:
            out.append((ok, dt, decisions, tokens, t0 + dt))
    conn.close()


def level(host, port, feed, clients, seconds):
    """`clients` threads for `seconds`; → the requests answered in the window (those that ended inside it)."""
    stop, lock, out = threading.Event(), threading.Lock(), []
    ts = [threading.Thread(target=client, args=(host, port, feed, stop, out, lock)) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(seconds)
    t1 = time.perf_counter()
    stop.set()
    for t in ts:
        t.join()
    return [r for r in out if r[4] <= t1], t1 - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--model", required=True, help="checkpoint folder (also read for the FLOPs per token)")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--seconds", type=float, default=10.0, help="timed seconds per level")
    ap.add_argument("--warmup", type=float, default=3.0, help="untimed seconds before each level")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="state words times this (small models, short runs)")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 tensor-core peak of the GPU")
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    ap.add_argument("serve_args", nargs="*", help="after --: arguments of onepass serve")
    a = ap.parse_args()
    params = projection_params(a.model)
    flops_per_token = 2 * params if params else None
    srv, port = start_serve(a.onepass, a.model, a.serve_args)
    feed = Feed(a.seed, a.scale)
    rows = []
    try:
        for c in [int(x) for x in a.concurrency.split(",")]:
            if a.warmup > 0:
                level("127.0.0.1", port, feed, c, a.warmup)
            done, wall = level("127.0.0.1", port, feed, c, a.seconds)
            good = [r for r in done if r[0]]
            lat = [r[1] for r in good]
            dec = sum(r[2] for r in good)
            tok = sum(r[3] for r in good)
            row = {"concurrency": c, "requests": len(good), "errors": len(done) - len(good), "seconds": wall,
                   "requests_per_s": len(good) / wall, "decisions_per_s": dec / wall, "tokens_per_s": tok / wall,
                   "p50_ms": pct(lat, 0.5) * 1e3 if lat else None, "p99_ms": pct(lat, 0.99) * 1e3 if lat else None,
                   "tokens_per_decision": tok / dec if dec else None}
            line = (f"{c:>3} clients: {len(good):>6} requests ({row['errors']} errors), {row['requests_per_s']:8.1f} req/s, "
                    f"{row['decisions_per_s']:9.1f} decisions/s, p50 {row['p50_ms'] or 0:8.2f} ms, "
                    f"p99 {row['p99_ms'] or 0:8.2f} ms, {row['tokens_per_s']:9.0f} tokens/s")
            if flops_per_token and dec:
                achieved = flops_per_token * tok / wall / 1e12
                row["tflops"] = achieved
                row["bound_decisions_per_s"] = a.peak_tflops * 1e12 / (flops_per_token * tok / dec)
                row["pct_of_bound"] = 100 * achieved / a.peak_tflops
                line += (f", {achieved:7.2f} TFLOP/s = {row['pct_of_bound']:5.2f}% of the bf16 bound "
                         f"({row['bound_decisions_per_s']:.0f} decisions/s)")
            print(line, file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    print(json.dumps({"label": a.label, "model": a.model, "serve_args": a.serve_args,
                      "projection_params": params, "flops_per_token": flops_per_token,
                      "peak_tflops": a.peak_tflops, "sizes_words": [round(w * a.scale) for w in SIZES], "levels": rows}))


if __name__ == "__main__":
    main()
