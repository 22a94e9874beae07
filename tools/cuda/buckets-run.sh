#!/usr/bin/env bash
# The shape buckets' device run (docs/cuda.md, "Shape buckets"): their GPU tests, then bench-systemone of one build
# with (the command line's default) and without (--gpu-no-shape-buckets) shape buckets, interleaved, requests new to
# the engine included (--unseen, and the host / GPU split of 10 more for workload 1). Carry .devcarry with
# new-pack.tar.gz (crates/cuda/gpu-pack.sh with ONLY as below, renamed). Logs and summary as
# tools/cuda/old-new-run.sh's, in $OUT. About 4 minutes on an H100 (2026-12-07: 219 s). PACKS adds builds, e.g.
# PACKS="older=old plain=new buckets=new" with an older build's .devcarry/old-pack.tar.gz (its onepass binary alone
# is enough; the tests run from the last pack's); a build from before buckets were the default takes them with
# BENCH_ARGS_older=--gpu-shape-buckets.
#   ONLY="forward cuda_answers cuda_batch_invariance generate sequence quant_forward" bash crates/cuda/gpu-pack.sh
#   mv .devcarry/pack.tar.gz .devcarry/new-pack.tar.gz
set -uo pipefail
mkdir -p "${OUT:=/tmp/out}"
export PHASES=${PHASES:-"bench tests"} ROUNDS=${ROUNDS:-2} TESTS_PAR=${TESTS_PAR:-6}
export TESTS=${TESTS:-"forward cuda_answers cuda_batch_invariance generate sequence quant_forward"}
export PACKS=${PACKS:-"plain=new buckets=new"} BENCH_ARGS_plain=${BENCH_ARGS_plain:---gpu-no-shape-buckets}
export BENCH_ARGS=${BENCH_ARGS:-"--unseen 10 --prefix-cache-mb 0 --profile-workload 1 --batch 32"}
bash "$(dirname "$0")/old-new-run.sh" >"$OUT/run.log" 2>&1
cat "$OUT/summary.txt"
