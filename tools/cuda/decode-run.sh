#!/usr/bin/env bash
# Decode on the GPU machine in one device run: the GPU tests (unless TESTS=0), then per shape `onepass bench --device
# cuda` (decode three ways and ahead of the host, per-op profile) and generation through `onepass session`
# (benches/generate.py; transformers bf16 beside it for the first shape only, PEER_ALL=1 for every shape). Needs the
# pack of crates/cuda/gpu-pack.sh carried (.devcarry):
#
#   run(command="bash tools/cuda/decode-run.sh", carry=[".devcarry"])
#
# Knobs: PRESETS ("qwen3.5-0.8b qwen3.5-2b"), DECODE (256), REPS (2), TESTS (1). Logs to $OUT/decode-gpu.log
# (and $OUT/tests.log).
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
exec > >(tee -a "$OUT/decode-gpu.log") 2>&1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" XDG_CACHE_HOME=/tmp/xdg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
B=/tmp/op/bin
peer=()
for p in ${PRESETS:-qwen3.5-0.8b qwen3.5-2b}; do
  echo; echo "=== [$SECONDS s] $p"
  $B/onepass synth --preset "$p" --out "/tmp/$p" --tokenizer /tmp/op/tokenizer 2>&1 | tail -1
  timeout 120 $B/onepass bench --device cuda ${BENCH_FLAGS:-} --model "/tmp/$p" --prompt-lens 128 --decode "${DECODE:-256}" \
    --reps "${REPS:-2}" || echo "FAILED: bench $p (rc $?)"
  timeout 200 python3 benches/generate.py --device cuda --onepass $B/onepass --model "/tmp/$p" --lens 128 \
    --decode "${DECODE:-256}" --reps "${REPS:-2}" "${peer[@]}" || echo "FAILED: generate $p (rc $?)"
  [[ ${PEER_ALL:-0} == 1 ]] || peer=(--no-peer)
  rm -rf "/tmp/$p"
done
echo "=== [$SECONDS s] done"
