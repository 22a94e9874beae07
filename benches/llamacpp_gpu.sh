#!/usr/bin/env bash
# onepass next to llama.cpp's CUDA build on one GPU, on the same synthetic GGUF files (random weights: speed only),
# and onepass alone on the 27B-shape PQ2_0 pack (a format llama.cpp cannot read).
#
# Run from the repository root on the GPU machine (nvcc, CMake, Ninja; no network needed):
#   bash benches/llamacpp_gpu.sh build    # unpack and build llama-bench + llama-batched-bench under $LCB/llama.cpp
#   bash benches/llamacpp_gpu.sh synth    # write the five GGUF files into $LCB with `onepass synth`
#   bash benches/llamacpp_gpu.sh small    # per 0.8B / 2B file: llama-bench, llama-batched-bench, onepass bench
#   bash benches/llamacpp_gpu.sh 27b      # onepass bench on $LCB/27b.gguf, batch 1, 8, 32
# Stages can be given together ("build synth", "small 27b"); time only when nothing is building.
#
# Carry layout (git-ignored, next to the repository's files):
#   .devcarry/lcsrc.tgz         llama.cpp's source, unpacking to llama.cpp/ (here: the tree bundled by npm
#                               node-llama-cpp 3.21.1, llama/gitRelease.bundle, release v0.4.0, commit 80fb11ac)
#   .devcarry/main-onepass.gz   onepass's release binary (CUDA), gzipped; or set ONEPASS to a binary
# Work folder $LCB (default /tmp/lcb): llama.cpp/build and the .gguf files; logs under $OUT (default $LCB/logs). Keep it
# outside the repository: an ignored folder in the checkout did not survive from one device call to the next, and
# inside the checkout llama.cpp's build stamps itself with the outer repository's commit.
# FILES: the small files to bench (default "08b-f16 08b-q8_0 2b-f16 2b-q8_0"); REPS: onepass/llama-bench repetitions.
set -uo pipefail
# onepass's GPU arithmetic: bf16 (GEMM inputs rounded to bf16, as llama.cpp's CUDA build rounds its activations;
# every figure in docs/benchmarks/llamacpp-gpu.md) unless PRECISION names another --gpu-precision.
PRECISION=${PRECISION:-bf16}
W=${LCB:-/tmp/lcb}
LOG=${OUT:-$W/logs}; mkdir -p "$W" "$LOG"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/xdg}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [[ -z ${ONEPASS:-} ]]; then
  ONEPASS=/tmp/op-main/onepass
  [[ -x $ONEPASS ]] || { mkdir -p /tmp/op-main && gunzip -c .devcarry/main-onepass.gz >$ONEPASS && chmod +x $ONEPASS; }
fi
LC=$W/llama.cpp/build/bin
FILES=${FILES:-"08b-f16 08b-q8_0 2b-f16 2b-q8_0"}
REPS=${REPS:-3}
STAGES=${1:-"build synth small 27b"}

if [[ $STAGES == *build* ]]; then
  [[ -d $W/llama.cpp ]] || tar -C "$W" -xzf .devcarry/lcsrc.tgz
  ( cd "$W/llama.cpp" &&
    cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON &&
    timeout ${BUILD_TIMEOUT:-480} nice cmake --build build --target llama-bench llama-batched-bench -j ${JOBS:-14} ) \
    >"$LOG/lcbuild.log" 2>&1
  echo "llama.cpp build exit $?" | tee -a "$LOG/lcbuild.log"
fi

if [[ $STAGES == *synth* ]]; then
  {
    for spec in "qwen3.5-0.8b f16 08b-f16" "qwen3.5-0.8b q8_0 08b-q8_0" "qwen3.5-2b f16 2b-f16" \
                "qwen3.5-2b q8_0 2b-q8_0" "qwen3.5-27b pq2_0 27b"; do
      set -- $spec
      [[ -s $W/$3.gguf ]] || ( t0=$SECONDS; $ONEPASS synth --preset $1 --format $2 --out "$W/$3.gguf" 2>&1 | tail -2
                                echo "$3: exit $?, $((SECONDS - t0)) s" ) &
    done
    wait
    ls -l "$W"/*.gguf
  } >"$LOG/synth.log" 2>&1
  cat "$LOG/synth.log"
fi

if [[ $STAGES == *small* ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >>"$LOG/small.log"
  for f in $FILES; do
    F=$W/$f.gguf
    echo "== $f llama-bench" >>"$LOG/small.log"
    timeout 120 $LC/llama-bench -m "$F" -p 512 -n 128 -ngl 99 -fa 1 -r $REPS -o json \
      >"$LOG/lb-$f.json" 2>>"$LOG/small.log"; echo "== exit $?" >>"$LOG/small.log"
    echo "== $f llama-batched-bench" >>"$LOG/small.log"
    timeout 150 $LC/llama-batched-bench -m "$F" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,8,32 -ngl 99 -fa on \
      >>"$LOG/small.log" 2>&1; echo "== exit $?" >>"$LOG/small.log"
    echo "== $f onepass bench" >>"$LOG/small.log"
    timeout 180 $ONEPASS bench --device cuda --gpu-precision $PRECISION --model "$F" --prompt-lens 512 --decode 128 --reps $REPS --batch 8,32 \
      >>"$LOG/small.log" 2>&1; echo "== exit $?" >>"$LOG/small.log"
  done
  grep -E "^== |tok/s|^\| +[0-9]" "$LOG/small.log" | grep -vE "launches" | tail -60
fi

if [[ $STAGES == *27b* ]]; then
  echo "== 27b onepass bench --batch 8,32" >>"$LOG/27b.log"
  timeout 240 $ONEPASS bench --device cuda --gpu-precision $PRECISION --model "$W/27b.gguf" --prompt-lens 128,512 --decode 64 --reps 2 --batch 8,32 \
    >>"$LOG/27b.log" 2>&1; echo "== exit $?" >>"$LOG/27b.log"
  grep -E "^== |tok/s" "$LOG/27b.log"
fi
