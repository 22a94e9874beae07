#!/usr/bin/env bash
# Decode of two builds on one warm GPU, interleaved (old, new, old, new per checkpoint), so that both see the same
# machine state: `onepass bench --device cuda --prompt-lens 128 --decode N` with its per-op table, on checkpoints
# written there by `onepass synth` (random weights: speed only, never quality). Packs as for old-new-run.sh:
# crates/cuda/gpu-pack.sh's pack.tar.gz of each build, carried as .devcarry/old-pack.tar.gz and
# .devcarry/new-pack.tar.gz:
#
#   run(command="bash tools/cuda/old-new-decode.sh", carry=[".devcarry"])
#
# Knobs: MODELS (space-separated preset:format pairs; default "qwen3.5-2b:pq2_0 qwen3.5-0.8b:safetensors"),
# DECODE (128), REPS (2), ROUNDS (2), PACKS ("old new"), BENCH_FLAGS (more `onepass bench` flags).
# Logs: $OUT/decode.log (everything) and $OUT/decode-summary.txt (the decode lines in run order).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" XDG_CACHE_HOME=/tmp/xdg
PACKS=${PACKS:-old new}
LAST=${PACKS##* }
for v in $PACKS; do
  rm -rf /tmp/$v && mkdir -p /tmp/$v && tar -C /tmp/$v -xzf .devcarry/$v-pack.tar.gz --strip-components=1
done
exec > >(tee -a "$OUT/decode.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
for m in ${MODELS:-qwen3.5-2b:pq2_0 qwen3.5-0.8b:safetensors}; do
  preset=${m%%:*} format=${m##*:}
  if [[ $format == safetensors ]]; then
    f=/tmp/$preset-st
    /tmp/$LAST/bin/onepass synth --preset "$preset" --out "$f" --tokenizer /tmp/$LAST/tokenizer 2>&1 | tail -1
  else
    f=/tmp/$preset.$format.gguf
    /tmp/$LAST/bin/onepass synth --preset "$preset" --format "$format" --out "$f" 2>&1 | tail -1
  fi
  for r in $(seq ${ROUNDS:-2}); do
    for v in $PACKS; do
      echo "=== [$SECONDS s] $m round $r $v"
      timeout ${BENCH_TIMEOUT:-120} /tmp/$v/bin/onepass bench --device cuda ${BENCH_FLAGS:-} --model "$f" \
        --prompt-lens 128 --decode "${DECODE:-128}" --reps "${REPS:-2}" || echo "FAILED: $m $v (rc $?)"
    done
  done
  rm -rf "$f"
done
echo "=== [$SECONDS s] done"
grep -E "^=== |decode" "$OUT/decode.log" > "$OUT/decode-summary.txt"
