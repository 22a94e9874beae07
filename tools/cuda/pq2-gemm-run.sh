#!/usr/bin/env bash
# One device run for a change to PQ2_0's prefill GEMM: the GPU tests of the pack (crates/cuda/gpu-pack.sh, carried
# as .devcarry), then `onepass bench --device cuda` on random-weight PQ2_0 packs written there by `onepass synth`,
# the same binary with and without --gpu-no-wgmma interleaved (off, on, off, on) so that both see the same machine
# state. Logs: $OUT/tests.log, $OUT/bench.log. Knobs: PRESETS ("qwen3.5-27b qwen3.5-2b"), PAIRS (2), TESTS (1),
# LENS (128,512), DECODE (32).
# BENCH_FLAGS: more `onepass bench` flags. Builds bench in half precision by default since the night of 2026-12-06
# (mixed where it does not fit, as on block-format files), in mixed earlier that day, in bf16 only before:
# BENCH_FLAGS="--gpu-precision bf16" compares new builds with those figures.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [[ ${TESTS:-1} == 1 ]]; then
  ONEPASS_CUDA_BENCH=0 TEST_TIMEOUT=${TEST_TIMEOUT:-240} bash crates/cuda/gpu-run.sh tests
else
  rm -rf /tmp/op && mkdir -p /tmp/op && tar -C /tmp/op -xzf .devcarry/pack.tar.gz --strip-components=1
fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" XDG_CACHE_HOME=/tmp/xdg
B=/tmp/op/bin
exec > >(tee -a "$OUT/bench.log") 2>&1
for p in ${PRESETS:-qwen3.5-27b qwen3.5-2b}; do
  echo "=== [$SECONDS s] $p"
  $B/onepass synth --preset "$p" --format pq2_0 --out "/tmp/$p.gguf" 2>&1 | tail -1
  for i in $(seq "${PAIRS:-2}"); do
    for flag in --gpu-no-wgmma ""; do
      echo "--- [$SECONDS s] pair $i ${flag:-warpgroup mma}"
      timeout 200 $B/onepass bench --device cuda ${BENCH_FLAGS:-} --model "/tmp/$p.gguf" --prompt-lens "${LENS:-128,512}" \
        --decode "${DECODE:-32}" --reps 2 $flag 2>&1 | grep -v "^onepass: compil" || echo "FAILED: bench (rc $?)"
    done
  done
  rm -f "/tmp/$p.gguf"
done
echo "=== [$SECONDS s] done"
