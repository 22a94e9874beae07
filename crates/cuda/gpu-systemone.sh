#!/usr/bin/env bash
# One device run for System One on the GPU: op, forward and answer tests, then the System One benchmark with a
# per-op profile. Logs under $OUT. Expects stripped release binaries in .devcarry/ (onepass, ops, forward, answers)
# and testdata/qwen3_5-tokenizer carried; see docs/cuda.md. `$1` = what to run (default: tests bench); PRECS = the
# precisions of the 0.8B bench (default "split bf16"); ONEPASS_CUDA_BENCH=1 also prints the gated delta kernel timings.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
B=.devcarry
export ONEPASS_CUDA_TESTS=1
WHAT=${1:-"tests bench"}
if [[ $WHAT == *tests* ]]; then
  for t in ops forward answers; do
    (time $B/$t --test-threads=1 --nocapture) 2>&1 | tee "$OUT/$t.log" | grep -E "max\|diff|max\|dp|test |result|panicked|error|budget|slots" | grep -v "^test result: ok. 0"
  done
fi
M=/tmp/q08
if [[ $WHAT == *bench* ]]; then
  $B/onepass synth --preset qwen3.5-0.8b --out $M --tokenizer testdata/qwen3_5-tokenizer 2>&1 | tail -1
  echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > $M/decider_config.json
  for P in ${PRECS:-split bf16}; do
    $B/onepass bench-systemone --device cuda --gpu-precision $P --model $M --reps 30 --batch-reps 2 2>&1 >"$OUT/bench08-$P.json" | tee "$OUT/bench08-$P.log"
  done
fi
if [[ $WHAT == *b2b* ]]; then
  M2=/tmp/q2b
  $B/onepass synth --preset qwen3.5-2b --out $M2 --tokenizer testdata/qwen3_5-tokenizer 2>&1 | tail -1
  echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > $M2/decider_config.json
  $B/onepass bench-systemone --device cuda --model $M2 --reps 20 --batch 8 --batch-reps 2 2>&1 >"$OUT/bench2b.json" | tee "$OUT/bench2b.log"
fi
