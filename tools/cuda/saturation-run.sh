#!/usr/bin/env bash
# Saturation of `onepass serve` on the GPU (benches/saturation.py): a synthetic Qwen3.5-0.8B checkpoint, POST
# /v1/systemone from 1, 8, 32 and 64 concurrent clients with requests of mixed sizes, SECONDS per level, for each
# configuration of CONFIGS (default "half half-invariant mixed mixed-invariant split split-invariant bf16
# bf16-invariant": --gpu-precision, and with -invariant --gpu-batch-invariant, with -exact --gpu-no-shape-buckets, e.g.
# "half half-exact half-invariant-exact"; CONFIGS="" runs none). Needs
# crates/cuda/gpu-pack.sh's .devcarry/pack.tar.gz (carry .devcarry) and python3 (standard library). Optional,
# before: TESTS="cuda_batch_invariance gemm" runs those
# GPU test executables of the pack (--include-ignored; TIMINGS=1 keeps their timing tables, e.g. gemm_timings: GemmEx
# against the pinned batch-invariant GEMM); BENCH=1 runs bench-systemone in split precision without and with
# --gpu-batch-invariant, alternating, ROUNDS times (default 2): one request at a time, the latency side of the
# trade-off. Logs: $OUT/saturation.log (the per-level lines), $OUT/saturation.jsonl (one JSON object per
# configuration), $OUT/tests.log, $OUT/bench.log, $OUT/bench.jsonl.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/xdg
P=/tmp/op
rm -rf $P && mkdir -p $P && tar -C $P -xzf .devcarry/pack.tar.gz --strip-components=1
B=$P/bin TOK=$P/tokenizer
mkdir -p testdata && ln -sfn $TOK testdata/qwen3_5-tokenizer
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee -a "$OUT/saturation.log"
for t in ${TESTS:-}; do
  echo "== $t" | tee -a "$OUT/tests.log"
  skip=(--skip timings); [[ ${TIMINGS:-0} == 1 ]] && skip=()
  timeout ${TEST_TIMEOUT:-300} $B/$t --include-ignored "${skip[@]}" --test-threads=1 --nocapture >>"$OUT/tests.log" 2>&1
  echo "== $t exit $?" | tee -a "$OUT/tests.log"
done
[[ -n ${TESTS:-} ]] && grep -E "^test .*(ok|FAILED)$|panicked|differ|fell back|^== " "$OUT/tests.log" | head -60
[[ -f /tmp/q08/config.json ]] || {
  $B/onepass synth --preset qwen3.5-0.8b --out /tmp/q08 --tokenizer $TOK 2>&1 | tail -1
  echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > /tmp/q08/decider_config.json
}
if [[ ${BENCH:-0} == 1 ]]; then
  for r in $(seq ${ROUNDS:-2}); do
    for inv in "" --gpu-batch-invariant; do
      echo "== bench-systemone split ${inv:-(default)} round $r" | tee -a "$OUT/bench.log"
      timeout 300 $B/onepass bench-systemone --device cuda --gpu-precision split $inv --model /tmp/q08 --reps 30 \
        --batch-reps 2 2>>"$OUT/bench.log" >>"$OUT/bench.jsonl"
      echo "== exit $?" >>"$OUT/bench.log"
    done
  done
  grep -vE "^\s+[a-z].* ms .*launches" "$OUT/bench.log" | tail -60
fi
for c in ${CONFIGS-half half-invariant mixed mixed-invariant split split-invariant bf16 bf16-invariant}; do
  args=(--device cuda --gpu-precision ${c%%-*})
  [[ $c == *-invariant* ]] && args+=(--gpu-batch-invariant)
  [[ $c == *-exact* ]] && args+=(--gpu-no-shape-buckets)
  echo "== $c: onepass serve ${args[*]} ${SERVE_ARGS:-}" | tee -a "$OUT/saturation.log"
  timeout ${RUN_TIMEOUT:-400} python3 benches/saturation.py --onepass $B/onepass --model /tmp/q08 --label "$c" \
    --concurrency ${CONCURRENCY:-1,8,32,64} --seconds ${SECONDS_PER_LEVEL:-8} --warmup ${WARMUP:-3} \
    -- "${args[@]}" ${SERVE_ARGS:-} >>"$OUT/saturation.jsonl" 2>>"$OUT/saturation.log"
  echo "== $c exit $?" | tee -a "$OUT/saturation.log"
done
grep -E "clients:|^== " "$OUT/saturation.log"
