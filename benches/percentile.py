"""The percentile every bench script reports, shared so that their p50/p95 mean the same thing.

Nearest rank, exactly as `onepass bench-systemone` computes it (crates/cli/src/device.rs `pct`):
sorted(xs)[(n - 1) * q rounded half away from zero] (Python's round() would round half to even); NaN for no samples.
"""
import math


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return math.nan
    return xs[math.floor((len(xs) - 1) * q + 0.5)]
