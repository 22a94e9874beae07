#!/usr/bin/env bash
# Generation on the GPU machine: onepass against transformers (bf16, same checkpoint, same run), one stream, greedy,
# on the synthetic 0.8B and 2B checkpoints (benches/generate.py --device cuda). One device run, from the repository
# root, with the pack of crates/cuda/gpu-pack.sh carried:
#
#   run(command="bash tools/cuda/generate-run.sh", carry=[".devcarry"])
#
# Knobs: PACK (.devcarry/pack.tar.gz), PRESETS ("qwen3.5-0.8b qwen3.5-2b"), LENS (128,512), DECODE (256), REPS (3).
# Writes generate-gpu.log to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/generate-gpu.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PACK=${PACK:-.devcarry/pack.tar.gz}
rm -rf /tmp/op && mkdir -p /tmp/op && tar -C /tmp/op -xzf "$PACK" --strip-components=1 || { echo "FAILED: unpack $PACK"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
for p in ${PRESETS:-qwen3.5-0.8b qwen3.5-2b}; do
  echo; echo "=== [$SECONDS s] $p"
  /tmp/op/bin/onepass synth --preset "$p" --out "/tmp/$p" --tokenizer /tmp/op/tokenizer 2>&1 | tail -1
  timeout 280 python3 benches/generate.py --device cuda --onepass /tmp/op/bin/onepass --model "/tmp/$p" \
    --lens "${LENS:-128,512}" --decode "${DECODE:-256}" --reps "${REPS:-3}" || echo "FAILED: $p (rc $?)"
done
echo "=== [$SECONDS s] done"
