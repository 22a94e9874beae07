#!/usr/bin/env bash
# One device run over .devcarry/pack.tar.gz (made by crates/cuda/gpu-pack.sh): phases named in $1 (default
# "tests bench"): tests (every test executable of the pack, or those TESTS names, with --include-ignored: the GPU
# tests are #[ignore]d so that machines without one count them as ignored; ONEPASS_CUDA_BENCH=0 skips the kernel
# timing tables), bench (System One on the 0.8B shape in each of PRECS, below; with "twopass" also split with
# prefixes and suffixes as two forwards, --gpu-no-trees; with "nograph" split without CUDA graphs, --gpu-no-graphs),
# b2b (the 2B shape),
# decider (benches/gpu-decider.sh, the decider-ai side-by-side), http (benches/http_load.py: a saturating concurrent
# load through `onepass serve --device cuda`), profile (one request under nsys and ncu where the machine has them: run
# s12's H200 machine had ncu only; PROFILE_WORKLOAD=1|2|3,
# PROFILE_NCU=0 for nsys only; NCU_KERNELS: a kernel-name regex, NCU_COUNT: launches, NCU_ARGS: more ncu arguments;
# PROFILE_SASS: a kernel-name regex whose first launch's SASS source page is summarised by tools/cuda/sass-summary.py).
# Logs: $OUT/tests.log, $OUT/bench.log, $OUT/bench.jsonl, $OUT/http.*, $OUT/kern_*.csv, $OUT/ncu.csv, $OUT/sass.txt.
# BENCH_ARGS: more bench-systemone arguments (e.g. "--profile-workload 3"). BASELINE: see the bench phase.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WHAT=${1:-"tests bench"}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/xdg
P=/tmp/op
rm -rf $P && mkdir -p $P && tar -C $P -xzf .devcarry/pack.tar.gz --strip-components=1
B=$P/bin TOK=$P/tokenizer
# The answer tests read the tokenizer where tools/setup-testdata.sh puts it.
mkdir -p testdata && ln -sfn $TOK testdata/qwen3_5-tokenizer
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
if [[ $WHAT == *tests* ]]; then
  for t in ${TESTS:-$(ls $B | grep -v '^onepass$')}; do
    echo "== $t" | tee -a "$OUT/tests.log"
    skip=(); [[ ${ONEPASS_CUDA_BENCH:-1} == 0 ]] && skip=(--skip timings)
    timeout ${TEST_TIMEOUT:-240} $B/$t --include-ignored "${skip[@]}" --test-threads=1 --nocapture \
      >>"$OUT/tests.log" 2>&1
    echo "== $t exit $?" | tee -a "$OUT/tests.log"
  done
  grep -E "^test .*(ok|FAILED)$|panicked|^== " "$OUT/tests.log" | grep -v "exit 0" | head -80
fi
synth() {  # $1 preset, $2 folder
  $B/onepass synth --preset "$1" --out "$2" --tokenizer $TOK 2>&1 | tail -1
  echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > "$2/decider_config.json"
}
bench() {  # label, then bench-systemone arguments; BIN: the onepass binary (default the pack's)
  local label=$1; shift
  echo "== $label: onepass bench-systemone $*" | tee -a "$OUT/bench.log"
  timeout ${BENCH_TIMEOUT:-240} ${BIN:-$B/onepass} bench-systemone "$@" ${BENCH_ARGS:-} 2>>"$OUT/bench.log" \
    >>"$OUT/bench.jsonl"
  echo "== $label exit $?" >>"$OUT/bench.log"
}
if [[ $WHAT == *bench* ]]; then
  synth qwen3.5-0.8b /tmp/q08
  # PRECS: half (the default), mixed, split, bf16, f32, or <precision>[/<split GEMMs>][-<kernels>] (split-tf32: split GEMMs, 1xTF32
  # tensor-core kernels; split/mlp_out,gdn_out: those two projections on both planes, the others bf16).
  # BASELINE: another onepass binary, executable (e.g. the parent commit's, carried in .devcarry): each of PRECS
  # runs on it right after this pack's, labelled "baseline", for an old-vs-new comparison in one run.
  # Each "+NAME" at the end passes --gpu-NAME (half+no-graphs).
  for P_ in ${PRECS:-half mixed split bf16}; do
    K_=(); Q_=$P_; while [[ $Q_ == *+* ]]; do K_+=(--gpu-${Q_##*+}); Q_=${Q_%+*}; done
    [[ $Q_ == *-* ]] && K_+=(--gpu-kernels ${Q_#*-})
    B_=${Q_%%-*}; [[ $B_ == */* ]] && K_+=(--gpu-split-gemms ${B_#*/})
    bench "0.8B $P_" --device cuda --gpu-precision ${B_%%/*} "${K_[@]}" --model /tmp/q08 --reps 30 --batch-reps 2
    if [[ -n ${BASELINE:-} ]]; then
      BIN=$BASELINE bench "0.8B $P_ baseline" --device cuda --gpu-precision ${B_%%/*} "${K_[@]}" --model /tmp/q08 \
        --reps 30 --batch-reps 2
    fi
  done
  if [[ $WHAT == *twopass* ]]; then
    bench "0.8B split, prefix and suffixes as two forwards" --device cuda --gpu-precision split --gpu-no-trees --model /tmp/q08 --reps 30 --batch 8 --batch-reps 2
  fi
  if [[ $WHAT == *nograph* ]]; then
    bench "0.8B split, no CUDA graphs" --device cuda --gpu-precision split --gpu-no-graphs --model /tmp/q08 --reps 30 --batch 8 --batch-reps 2
  fi
  grep -vE "^\s+[a-z].* ms .*launches" "$OUT/bench.log" | tail -40
fi
if [[ $WHAT == *b2b* ]]; then
  synth qwen3.5-2b /tmp/q2b
  bench "2B (default precision)" --device cuda --model /tmp/q2b --reps 20 --batch 8 --batch-reps 2
  tail -8 "$OUT/bench.log"
fi
if [[ $WHAT == *http* ]]; then
  [[ -f /tmp/q08/config.json ]] || synth qwen3.5-0.8b /tmp/q08
  $B/onepass bench-systemone --device cpu --model /tmp/q08 --write-requests /tmp/q08-req 2>&1 | tail -3
  # workload, decisions per request, concurrency levels, seconds per level, rows per engine call
  for spec in "1 7 1,8,32,64 10 512" "3 10 1,8,32 8 64"; do
    set -- $spec
    echo "== http: workload$1, concurrency $3" | tee -a "$OUT/http.log"
    timeout 200 python3 benches/http_load.py --onepass $B/onepass --model /tmp/q08 --body /tmp/q08-req/workload$1.json \
      --decisions $2 --concurrency $3 --seconds $4 -- --device cuda --max-batch-rows $5 >>"$OUT/http.jsonl" 2>>"$OUT/http.log"
  done
  grep -E "in flight|==" "$OUT/http.log"
fi
if [[ $WHAT == *profile* ]]; then
  # One request of workload $PROFILE_WORKLOAD (default 1; one tree forward, run directly: the first sight of a shape
  # is not a graph) under Nsight Systems (time per kernel: $OUT/kern_*.csv) and, unless PROFILE_NCU=0, Nsight Compute
  # (the GDN, conv, norm and attention kernels: $OUT/ncu.csv), where the machine has them.
  [[ -f /tmp/q08/config.json ]] || synth qwen3.5-0.8b /tmp/q08
  [[ -f /tmp/q08-req/workload1.json ]] || $B/onepass bench-systemone --device cpu --model /tmp/q08 --write-requests /tmp/q08-req 2>&1 | tail -1
  one=($B/onepass systemone --device cuda --model /tmp/q08 /tmp/q08-req/workload${PROFILE_WORKLOAD:-1}.json)
  "${one[@]}" >/dev/null  # the PTX cache
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/target-linux-x64/nsys 2>/dev/null | head -1)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [[ -n $NSYS ]]; then
    timeout 120 $NSYS profile -o /tmp/prof -f true -t cuda "${one[@]}" >/dev/null 2>>"$OUT/profile.log"
    $NSYS stats -r cuda_gpu_kern_sum --format csv -o "$OUT/kern" /tmp/prof.nsys-rep >>"$OUT/profile.log" 2>&1
  else echo "no nsys" | tee -a "$OUT/profile.log"; fi
  if [[ -n $NCU && ${PROFILE_NCU:-1} == 1 ]]; then
    # --clock-control none: the device README's advice (leave the clocks alone; ncu's default locks them).
    K_RE=gdn_tc_state\|gdn_tc_leaf\|gdn_tc_prep\|gdn_conv_prep_run\|gdn_conv_state\|rms_norm\|attention_h\|swiglu
    K_RE=${NCU_KERNELS:-$K_RE}
    timeout 300 $NCU --clock-control none -k "regex:$K_RE" \
      --launch-count ${NCU_COUNT:-14} --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis ${NCU_ARGS:-} --csv --page details "${one[@]}" \
      >"$OUT/ncu.csv" 2>>"$OUT/profile.log"
  else echo "no ncu" | tee -a "$OUT/profile.log"; fi
  if [[ -n $NCU && -n ${PROFILE_SASS:-} ]]; then
    timeout 300 $NCU --clock-control none -k "regex:$PROFILE_SASS" --launch-count 1 --section SourceCounters \
      --page source --print-source sass --csv "${one[@]}" >/tmp/sass.csv 2>>"$OUT/profile.log"
    python3 tools/cuda/sass-summary.py /tmp/sass.csv >"$OUT/sass.txt" 2>>"$OUT/profile.log"
  fi
  ls -la "$OUT" | tail -5
fi
if [[ $WHAT == *decider* ]]; then
  ONEPASS_BIN=$B/onepass TOKENIZER=$TOK bash benches/gpu-decider.sh 2>&1 | tail -30
fi
