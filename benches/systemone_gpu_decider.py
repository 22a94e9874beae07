"""decider-ai 1.10.0 on CUDA, on the same checkpoint and requests as `onepass bench-systemone` (the side-by-side of
issue #4). Not yet run (device time); written to be run on the GPU machine:

    onepass synth --preset qwen3.5-0.8b --tokenizer testdata/qwen3_5-tokenizer --out /tmp/q08
    echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > /tmp/q08/decider_config.json
    onepass bench-systemone --model /tmp/q08 --write-requests /tmp/q08-req       # workload1..3.json
    python3 benches/systemone_gpu_decider.py --model /tmp/q08 --requests /tmp/q08-req [--reps 30]

decider-ai and flash-linear-attention travel as wheels (device README, "wheels"). Each request body is answered with
`Decider(dir, device="cuda").system_one(state, questions, independent=...)` after 3 warm-ups; prints p50/p95 ms,
requests/s and decisions/s per workload as one JSON object, in the same shape as `onepass bench-systemone`.
"""
import argparse, glob, json, os, statistics, time


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True, help="folder of workload*.json (onepass bench-systemone --write-requests)")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()

    import torch
    from decider import Decider  # decider-ai 1.10.0

    d = Decider(a.model, device="cuda")
    out = []
    for path in sorted(glob.glob(os.path.join(a.requests, "workload*.json"))):
        with open(path) as f:
            body = json.load(f)
        call = lambda: d.system_one(body["state"], body["questions"], independent=body.get("independent", True))
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        secs = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            secs.append(time.perf_counter() - t0)
        mean = statistics.fmean(secs)
        decisions = len(body["questions"])
        row = {"workload": os.path.basename(path), "p50_ms": pct(secs, 0.5) * 1e3, "p95_ms": pct(secs, 0.95) * 1e3,
               "requests_per_s": 1 / mean, "decisions_per_s": decisions / mean}
        print(f"{row['workload']:<16} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  "
              f"{row['requests_per_s']:7.1f} req/s", flush=True)
        out.append(row)
    print(json.dumps({"engine": "decider-ai", "device": torch.cuda.get_device_name(0), "workloads": out}))


if __name__ == "__main__":
    main()
