#!/usr/bin/env bash
# One device run: GPU op tests, forward tests and the first benchmark, with logs under $OUT.
# Expects the stripped release binaries in .devcarry/ (onepass, ops, forward); see docs/cuda.md.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls /usr/local/cuda/lib64 2>/dev/null | grep -E "libnvrtc.so|libcublas.so" | head -4
B=.devcarry
export ONEPASS_CUDA_TESTS=1
(time $B/ops --test-threads=1 --nocapture) 2>&1 | tee "$OUT/ops.log" | grep -E "max\|diff|test |result|panicked|error" 
(time $B/forward --test-threads=1 --nocapture) 2>&1 | tee "$OUT/forward.log" | grep -E "max\|diff|test |result|panicked|error"
ls -la /tmp/xdg/onepass/cuda 2>/dev/null
M=/tmp/q08
(time $B/onepass synth --preset qwen3.5-0.8b --out $M) 2>&1 | tail -3
$B/onepass bench --device cuda --model $M --prompt-lens 128,512,2048 --reps 5 --decode 32 2>&1 | tee "$OUT/bench.log"
$B/onepass bench --device bogus --model $M 2>&1 | tail -1
