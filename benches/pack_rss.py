"""Resident memory of a model file against its size: runs `onepass logits --device cpu --last` on each file (one
forward over a few tokens, which reads every matrix once) and prints the file size, the child's peak resident set
and their ratio. The embedding table is read only at the rows of the given ids, so a ternary pack's peak resident
set is the file less most of that table, plus the program.

    target/release/onepass synth --preset 2b --format ptq1_0 --out /tmp/2b-ptq1_0.gguf
    python3 benches/pack_rss.py /tmp/2b-ptq1_0.gguf /tmp/2b-pq2_0.gguf [--onepass target/release/onepass]

Standard library only; Linux or macOS (getrusage of the child).
"""
import argparse, os, resource, subprocess, sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--ids", default="1,2,3,4,5,6,7,8")
    a = ap.parse_args()
    for f in a.files:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        r = subprocess.run([a.onepass, "logits", "--model", f, "--ids", a.ids, "--last", "--device", "cpu"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"{f}: onepass logits failed: {r.stderr.strip()}")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if peak <= before:
            print(f"{f}: peak below an earlier run's; run one file per call for its own figure", file=sys.stderr)
        peak_b = peak * (1 if sys.platform == "darwin" else 1024)  # ru_maxrss: bytes on macOS, KiB on Linux
        size = os.path.getsize(f)
        print(f"{f}: file {size / 1e6:.1f} MB, peak RSS {peak_b / 1e6:.1f} MB, {peak_b / size:.3f}x the file")


if __name__ == "__main__":
    main()
