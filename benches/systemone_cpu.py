"""System One on the CPU: onepass (shared prefix on and off) side by side with decider-ai 1.10.0, same checkpoint, same
request, same run.

    cargo build --release -p onepass
    python benches/systemone_cpu.py [--rounds 3] [--reps 3] [--whole-reps 1] [--decider-reps 1] [--work DIR]

Checkpoint: `onepass synth --preset qwen3.5-0.8b --tokenizer testdata/qwen3_5-tokenizer` (the Qwen3.5-0.8B shape, bf16,
random weights; written once into --work) plus decider_config.json {"isolated_levels": true, "neutralize_none": false,
"version": "bench"}. Request: a JSON state of 224 tokens ("Context:\\n" + state) and 5 questions (two Choice, one
11-option Choice, one noul, one Score with 3 isolated levels) = 7 rows. onepass runs `onepass systemone --repeat N`
(model loaded once, load excluded; the first run of each process is a warm-up and is dropped); decider-ai runs
`Decider(dir, device="cpu").system_one` in this process after one warm-up. The engines take turns in --rounds rounds,
so that load from other processes on a shared machine falls on all of them alike. Prints one JSON object (also written to
--work/systemone_cpu.json) and a table with p50/p95 latency, requests/s and the ratios.
"""
import argparse, json, os, platform, statistics, subprocess, sys, time, warnings

from percentile import pct  # benches/percentile.py: nearest rank, as onepass

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_TOKENS = 224


def state_of(n_events):
    ev = [{"t": f"2026-09-{1 + d % 28:02d}", "kind": ["login", "purchase", "refund", "ticket"][d % 4],
           "amount": round(d * 7.25, 2)} for d in range(n_events)]
    return {"customer": {"name": "Ana Sousa", "tier": "gold", "region": "north"}, "events": ev,
            "note": "Asked twice about the late parcel and the refund."}


QUESTIONS = {
    "intent": {"instructions": "What does the customer want now?", "criteria": ["refund", "upgrade", "information", "cancel"]},
    "tier": {"instructions": "Customer tier", "criteria": {"bronze": None, "silver": None, "gold": "top tier"}},
    "kind": {"instructions": "Most frequent event kind", "criteria": ["login", "purchase", "refund", "ticket", "visit",
                                                                     "call", "chat", "email", "return", "review", "other"]},
    "vip": {"type": "noul", "instructions": "Should this go to the VIP desk?"},
    "risk": {"type": "score", "instructions": "Churn risk", "criteria": ["low", "medium", "high"]},
}


def summary(secs):
    return {"runs": len(secs), "p50_s": pct(secs, 0.5), "p95_s": pct(secs, 0.95), "mean_s": statistics.fmean(secs),
            "requests_per_s": 1.0 / statistics.fmean(secs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/onepass-bench")
    ap.add_argument("--onepass", default=os.path.join(ROOT, "target/release/onepass"))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every engine")
    ap.add_argument("--reps", type=int, default=3, help="onepass runs with the shared prefix per round")
    ap.add_argument("--whole-reps", type=int, default=1, help="onepass runs with whole rows per round")
    ap.add_argument("--decider-reps", type=int, default=1, help="decider-ai runs per round")
    a = ap.parse_args()

    model = os.path.join(a.work, "qwen3.5-0.8b")
    if not os.path.isfile(os.path.join(model, "model.safetensors")):
        subprocess.run([a.onepass, "synth", "--preset", "qwen3.5-0.8b", "--out", model, "--tokenizer",
                        os.path.join(ROOT, "testdata/qwen3_5-tokenizer")], check=True)
    with open(os.path.join(model, "decider_config.json"), "w") as f:
        json.dump({"isolated_levels": True, "neutralize_none": False, "version": "bench"}, f)

    # The state whose "Context:\n" + state is exactly STATE_TOKENS tokens (the rows' common prefix).
    def plan(req):
        """The request's file, its `onepass render` plan, and the length of the rows' common prefix."""
        path = os.path.join(a.work, "request.json")
        with open(path, "w") as f:
            json.dump(req, f)
        out = subprocess.run([a.onepass, "render", "--model", model, path], check=True, capture_output=True, text=True)
        p = json.loads(out.stdout)
        ids = [row["ids"] for row in p["rows"]]
        lcp = 0
        while all(len(x) > lcp and x[lcp] == ids[0][lcp] for x in ids):
            lcp += 1
        return path, p, lcp

    req = None
    for n in range(1, 40):
        r = {"state": state_of(n), "questions": QUESTIONS}
        path, p, lcp = plan(r)
        if lcp >= STATE_TOKENS:
            break
        req, req_path, req_plan, req_lcp = r, path, p, lcp
    # Pad the note to hit STATE_TOKENS exactly (a word is usually one token).
    for extra in range(0, 80):
        r = json.loads(json.dumps(req))
        r["state"]["note"] += " ok" * extra
        path, p, lcp = plan(r)
        if lcp >= STATE_TOKENS:
            req, req_path, req_plan, req_lcp = r, path, p, lcp
            break
    rows = req_plan["rows"]
    shape = {"state_tokens": req_lcp, "questions": len(QUESTIONS), "rows": len(rows),
             "row_tokens": [len(r["ids"]) for r in rows], "usage_input_tokens": req_plan["usage"]["input_tokens"]}
    print("request:", json.dumps(shape), file=sys.stderr)

    import torch
    from decider.infer import Decider
    from importlib.metadata import version
    threads = torch.get_num_threads()
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    dec = Decider(model, device="cpu")
    dec_load = time.perf_counter() - t0
    dec.system_one(req["state"], req["questions"])  # warm-up

    # Interleaved rounds, so that load from other processes on a shared machine hits every engine alike.
    engines = [("onepass shared prefix", a.reps, []), ("onepass whole rows", a.whole_reps, ["--no-shared-prefix"])]
    engines = [e for e in engines if e[1] > 0]  # --whole-reps 0 leaves whole rows out
    secs = {name: [] for name, _, _ in engines} | {"decider-ai": []}
    loads = {}
    answers = {}
    for rnd in range(a.rounds):
        for name, reps, flags in engines:
            out = subprocess.run([a.onepass, "systemone", "--model", model, "--repeat", str(reps + 1), *flags, req_path],
                                 check=True, capture_output=True, text=True)
            timing = json.loads(out.stderr.strip().splitlines()[-1])
            secs[name] += timing["seconds"][1:]  # the first run of a process is a warm-up
            loads[name] = timing["load_s"]
            answers[name] = json.loads(out.stdout)
        for _ in range(a.decider_reps):
            t = time.perf_counter()
            ref = dec.system_one(req["state"], req["questions"])
            secs["decider-ai"].append(time.perf_counter() - t)
        print(f"round {rnd + 1}:", json.dumps({k: [round(x, 3) for x in v] for k, v in secs.items()}), file=sys.stderr)
    loads["decider-ai"] = dec_load
    results = {k: summary(v) | {"load_s": loads[k]} for k, v in secs.items()}

    def max_diff(x, y):
        if isinstance(x, dict):
            return max([max_diff(x[k], y[k]) for k in x] or [0.0])
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return abs(x - y)
        return 0.0 if x == y else float("inf")

    base = results["decider-ai"]["requests_per_s"]
    report = {
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_start": load_start,
                    "load_avg_1m_at_end": os.getloadavg()[0], "platform": platform.platform(),
                    "torch_threads": threads},
        "versions": {"decider-ai": version("decider-ai"), "torch": torch.__version__},
        "checkpoint": "onepass synth --preset qwen3.5-0.8b (bf16, random weights)",
        "request": shape,
        "results": results,
        "ratio_requests_per_s_vs_decider": {k: v["requests_per_s"] / base for k, v in results.items() if k != "decider-ai"},
        "max_answer_diff_vs_decider": {k: max_diff(ref["answers"], v["answers"]) for k, v in answers.items()},
    }
    with open(os.path.join(a.work, "systemone_cpu.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    print(f"\n{'engine':<24}{'p50 s':>9}{'p95 s':>9}{'req/s':>9}{'vs decider':>12}")
    for k, v in results.items():
        print(f"{k:<24}{v['p50_s']:>9.3f}{v['p95_s']:>9.3f}{v['requests_per_s']:>9.3f}{v['requests_per_s'] / base:>11.2f}x")


if __name__ == "__main__":
    main()
