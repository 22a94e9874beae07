"""The options that cpu_forward.py and generate.py share: the model, the onepass binary, the prompt lengths, the decode
length and the repetitions."""
import argparse


def forward_parser(lens):
    """An argument parser with --model, --onepass, --lens (comma-separated; default `lens`), --decode and --reps. A
    benchmark adds its own options to it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--lens", default=lens)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    return ap
