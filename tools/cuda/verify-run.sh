#!/usr/bin/env bash
# One device run that checks a session's GPU work and measures the figures the docs quote: every GPU test executable
# of the pack (crates/cuda/gpu-pack.sh, carried as .devcarry), then, each under its own time limit: decode through the
# engine and through `onepass session` on the synthetic 0.8B and 2B (onepass alone), decisions over a growing prefix
# with the kept state on and off (benches/decide_prefix.py --device cuda), System One one request at a time
# (bench-systemone, split), and decode/prefill on a random 27B-shape PQ2_0 pack.
#
#   run(command="bash tools/cuda/verify-run.sh", carry=[".devcarry"])
#
# Knobs: TESTS (1), BENCHES ("decode decide systemone ternary"), TEST_TIMEOUT (150). Logs in $OUT: tests.log,
# verify.log (everything else).
# BENCH_FLAGS: more `onepass bench` flags. Builds bench in half precision by default since the night of 2026-12-06
# (mixed where it does not fit, as on block-format files), in mixed earlier that day, in bf16 only before:
# BENCH_FLAGS="--gpu-precision bf16" compares new builds with those figures.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [[ ${TESTS:-1} == 1 ]]; then
  ONEPASS_CUDA_BENCH=0 TEST_TIMEOUT=${TEST_TIMEOUT:-150} bash crates/cuda/gpu-run.sh tests
else
  rm -rf /tmp/op && mkdir -p /tmp/op && tar -C /tmp/op -xzf .devcarry/pack.tar.gz --strip-components=1
fi
exec > >(tee -a "$OUT/verify.log") 2>&1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" XDG_CACHE_HOME=/tmp/xdg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
B=/tmp/op/bin TOK=/tmp/op/tokenizer
W=${BENCHES:-decode decide systemone ternary}
synth() { [[ -f $2/config.json ]] || $B/onepass synth --preset "$1" --out "$2" --tokenizer $TOK 2>&1 | tail -1; }
if [[ $W == *decode* ]]; then
  for p in qwen3.5-0.8b qwen3.5-2b; do
    echo; echo "=== [$SECONDS s] decode $p"
    synth $p /tmp/$p
    timeout 100 $B/onepass bench --device cuda ${BENCH_FLAGS:-} --model /tmp/$p --prompt-lens 128 --decode 256 --reps 2 2>&1 |
      grep -E "^(prefill|decode|systemone)" || echo "FAILED: bench $p"
    timeout 100 python3 benches/generate.py --device cuda --onepass $B/onepass --model /tmp/$p --lens 128 \
      --decode 256 --reps 2 --no-peer 2>&1 | grep -E "^\||^onepass" || echo "FAILED: generate $p"
  done
fi
if [[ $W == *decide* ]]; then
  echo; echo "=== [$SECONDS s] decide prefix, 0.8B"
  synth qwen3.5-0.8b /tmp/qwen3.5-0.8b
  timeout 120 python3 benches/decide_prefix.py --onepass $B/onepass --model /tmp/qwen3.5-0.8b --steps 6 --rounds 2 \
    -- --device cuda || echo "FAILED: decide prefix"
fi
if [[ $W == *systemone* ]]; then
  echo; echo "=== [$SECONDS s] bench-systemone split, 0.8B"
  synth qwen3.5-0.8b /tmp/qwen3.5-0.8b
  echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > /tmp/qwen3.5-0.8b/decider_config.json
  timeout 120 $B/onepass bench-systemone --device cuda --model /tmp/qwen3.5-0.8b 2>&1 | grep -vE "^ {2,}[a-z]" |
    head -20 || echo "FAILED: bench-systemone"
fi
if [[ $W == *ternary* ]]; then
  echo; echo "=== [$SECONDS s] 27B-shape PQ2_0 pack"
  rm -rf /tmp/qwen3.5-0.8b /tmp/qwen3.5-2b
  timeout 120 $B/onepass synth --preset qwen3.5-27b --format pq2_0 --out /tmp/27b.gguf 2>&1 | tail -1
  timeout 150 $B/onepass bench --device cuda ${BENCH_FLAGS:-} --model /tmp/27b.gguf --prompt-lens 512 --decode 64 --reps 2 2>&1 |
    grep -E "^(uploaded|prefill|decode|systemone)" || echo "FAILED: 27B bench"
fi
echo "=== [$SECONDS s] done"
