#!/usr/bin/env python3
"""Decisions of an agent over a growing prefix, with the kept prefix state on and off, side by side in one run.

    cargo build --release -p onepass
    target/release/onepass synth --preset qwen3.5-0.8b --out /tmp/q08      # the synthetic tokenizer + chat template
    python3 benches/decide_prefix.py --onepass target/release/onepass --model /tmp/q08 [--steps 6] [--rounds 2]

The reference's agent shape: a task and instructions, then a history that grows by one line per step (the prefix, so
each step's prefix extends the one before),
and per step a screen with 3-5 lettered options (the suffix). Each round runs every step in one `onepass session
--decide` per mode (`--decide-prefix-cache on`, then `off`; the two never run at the same time) and the figures of
the fastest round are kept. Prints, per step: the prompt's ids, the ids restored (`n_reused`), the ids prefilled, the
decision's time (prefill_ms + store_ms) in each mode, and the ratio. With the state kept, a step restores the prefix
of the step before and prefills only what is new, so its time should follow the ids it prefills, not the prompt's.
Standard library only; prints a markdown table, then one JSON line.
"""
import argparse
import json
import subprocess
import sys

TASK = ("You operate a phone for the user, one tap at a time. Each step shows the screen and its options; answer "
        "with the letter of the option that moves the task forward, and nothing else. Never open an app the task "
        "does not need, never change a setting the task does not name, and go back when a screen leads nowhere. "
        "Task: turn on Wi-Fi and connect to the network called Office, then return to the home screen. ")
STEPS = [
    ("Home", ["Settings", "Camera", "Clock", "Phone"], "Opened Settings."),
    ("Settings", ["Network and internet", "Display", "Battery"], "Opened Network and internet."),
    ("Network and internet", ["Airplane mode", "Internet", "Hotspot", "VPN", "Data saver"], "Opened Internet."),
    ("Internet", ["Wi-Fi is off: turn on", "Mobile data", "Back"], "Turned Wi-Fi on."),
    ("Wi-Fi networks", ["Cafe", "Office", "Guest", "Add network"], "Chose Office."),
    ("Office: connected", ["Forget", "Share", "Home"], "Went home."),
    ("Home", ["Settings", "Camera", "Clock"], "Done."),
    ("Done", ["Finish", "Start over", "Help"], ""),
]


def requests(n):
    history = []
    out = []
    for k, (screen, options, did) in enumerate(STEPS[:n]):
        letters = "ABCDE"[: len(options)]
        prefix = TASK + "History:\n" + "".join(f"{h}\n" for h in history)
        suffix = f"Screen: {screen}. Options: " + " ".join(f"{l}) {o}" for l, o in zip(letters, options)) + \
            ". Answer with the letter."
        out.append({"cmd": "decide", "id": k + 1, "prefix": prefix, "suffix": suffix, "choices": list(letters)})
        history.append(f"Step {k + 1}: on {screen}, {did}")
    return out


def run(onepass, model, mode, reqs, extra):
    p = subprocess.run([onepass, "session", "--model", model, "--decide", "--decide-prefix-cache", mode, *extra],
                       input="".join(json.dumps(r) + "\n" for r in reqs), capture_output=True, text=True, check=True)
    answers = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    for a in answers:
        if "error" in a:
            raise SystemExit(f"{mode}: {a}")
    return answers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="more `onepass session` arguments (after --)")
    a = ap.parse_args()
    reqs = requests(a.steps)
    best = {}
    for _ in range(a.rounds):
        for mode in ("on", "off"):
            answers = run(a.onepass, a.model, mode, reqs, a.extra)
            t = [x["prefill_ms"] + x["store_ms"] for x in answers]
            if mode not in best or sum(t) < sum(best[mode][1]):
                best[mode] = (answers, t)
    on, t_on = best["on"]
    off, t_off = best["off"]
    print("| step | prompt ids | reused | prefilled | kept: ms | whole: ms | whole / kept | kept: ms per prefilled id "
          "| same answer |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for k, (x, y) in enumerate(zip(on, off)):
        fresh = x["n_tokens"] - x["n_reused"]
        same = x["best"] == y["best"]
        rows.append({"step": k + 1, "n_tokens": x["n_tokens"], "n_reused": x["n_reused"], "prefilled": fresh,
                     "kept_ms": t_on[k], "store_ms": x["store_ms"], "whole_ms": t_off[k], "same_best": same,
                     "max_dlogp": max(abs(p - q) for p, q in zip(x["choice_logp"], y["choice_logp"])),
                     "prefix_state_mib": x["prefix_state_mib"]})
        print(f"| {k + 1} | {x['n_tokens']} | {x['n_reused']} | {fresh} | {t_on[k]:.1f} | {t_off[k]:.1f} | "
              f"{t_off[k] / t_on[k]:.2f} | {t_on[k] / fresh:.2f} | {'yes' if same else 'no'} |")
    tot_on, tot_off = sum(t_on), sum(t_off)
    print(f"\nall steps: kept {tot_on:.0f} ms, whole {tot_off:.0f} ms ({tot_off / tot_on:.2f}x); "
          f"prefix state {on[-1]['prefix_state_mib']:.1f} MiB; max |Δ logp| kept vs whole "
          f"{max(r['max_dlogp'] for r in rows):.1e}")
    print(json.dumps({"steps": rows, "kept_ms": tot_on, "whole_ms": tot_off}))


if __name__ == "__main__":
    sys.exit(main())
