#!/usr/bin/env bash
# One device run that holds a change to "same GPU behaviour, same speed": every GPU test of the NEW pack (with
# --include-ignored: the GPU tests are #[ignore]d), then `bench-systemone` of the OLD and NEW binaries interleaved
# (old, new, old, new, ...) on one synthetic Qwen3.5-0.8B checkpoint, in precision PREC (default half, the default
# mode), so that both see the same machine state. Packs are crates/cuda/gpu-pack.sh's pack.tar.gz of each build,
# carried as .devcarry/old-pack.tar.gz and .devcarry/new-pack.tar.gz. Logs: $OUT/tests.log, $OUT/bench.log,
# $OUT/bench.jsonl (one JSON line per bench, in run order), $OUT/timings.log, $OUT/summary.txt (the p50 table).
# ROUNDS: bench pairs (default 2); TESTS=0 skips the tests (TESTS="a b": only those executables); BENCH_ARGS: more
# bench-systemone arguments (e.g. "--unseen 20 --prefix-cache-mb 0"); TIMINGS: test executables whose timing tables
# (their *_timings tests) run from every pack, before the bench (e.g. "attn_tc"); PACKS: the packs benched in each
# round (default "old new"; .devcarry/NAME-pack.tar.gz each), the tests run from the last one's. TESTS_PAR: test
# executables run at once (default 1; their logs are joined in list order); TEST_FILTER_name: a test name filter for
# executable name (e.g. TEST_FILTER_cuda_answers=shape_buckets); PHASES: what runs, in order (default
# "tests timings bench"; "timings tests bench" takes the timing tables before anything else has warmed the GPU).
# A PACKS entry LABEL=PACK benches pack PACK under the name LABEL with the bench arguments BENCH_ARGS_LABEL added
# (e.g. PACKS="exact=new buckets=new" BENCH_ARGS_exact=--gpu-no-shape-buckets: one build, two settings).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/xdg
PACKS=${PACKS:-old new}
LAST=${PACKS##* }
LAST=${LAST#*=}
# The builds (packs) the entries name, each once.
BUILDS=$(for e in $PACKS; do echo "${e#*=}"; done | sort -u)
for v in $BUILDS; do
  rm -rf /tmp/$v && mkdir -p /tmp/$v && tar -C /tmp/$v -xzf .devcarry/$v-pack.tar.gz --strip-components=1
done
TOK=/tmp/$LAST/tokenizer
mkdir -p testdata && ln -sfn $TOK testdata/qwen3_5-tokenizer
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/summary.txt"
run_tests() {
  [[ ${TESTS:-1} != 0 ]] || return 0
  local list=${TESTS:-1} t n=0
  [[ $list == 1 ]] && list=$(ls /tmp/$LAST/bin | grep -v '^onepass$')
  for t in $list; do
    local filter=TEST_FILTER_$t
    (timeout ${TEST_TIMEOUT:-240} /tmp/$LAST/bin/$t --include-ignored --skip timings --test-threads=1 --nocapture \
      ${!filter:-} >"/tmp/test-$t.log" 2>&1; echo "== $t exit $?" >>"/tmp/test-$t.log") &
    (( ++n % ${TESTS_PAR:-1} )) || wait
  done
  wait
  for t in $list; do
    { echo "== $t"; cat "/tmp/test-$t.log"; } >>"$OUT/tests.log"
    tail -1 "/tmp/test-$t.log"
  done
  grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | tee -a "$OUT/summary.txt"
}
run_timings() {
  local t v
  for t in ${TIMINGS:-}; do
    for v in $BUILDS; do
      echo "== $v $t timings" | tee -a "$OUT/timings.log"
      timeout ${TEST_TIMEOUT:-240} /tmp/$v/bin/$t --include-ignored timings --test-threads=1 --nocapture \
        >>"$OUT/timings.log" 2>&1
      echo "== $v $t exit $?" | tee -a "$OUT/timings.log"
    done
  done
}
run_bench() {
  local r v
  /tmp/$LAST/bin/onepass synth --preset qwen3.5-0.8b --out /tmp/q08 --tokenizer $TOK 2>&1 | tail -1
  echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' >/tmp/q08/decider_config.json
  local e label extra
  for r in $(seq ${ROUNDS:-2}); do
    for e in $PACKS; do
      label=${e%%=*} v=${e#*=}
      extra=BENCH_ARGS_$label
      extra=${!extra:-}
      echo "== round $r $label: bench-systemone --device cuda --gpu-precision ${PREC:-half} --reps 30 --batch-reps 2" \
        "${BENCH_ARGS:-} $extra ($v's binary)" | tee -a "$OUT/bench.log"
      timeout ${BENCH_TIMEOUT:-150} /tmp/$v/bin/onepass bench-systemone --device cuda --gpu-precision ${PREC:-half} \
        --model /tmp/q08 --reps 30 --batch-reps 2 ${BENCH_ARGS:-} $extra 2>>"$OUT/bench.log" |
        sed "s/^/{\"binary\": \"$label\", \"round\": $r, \"report\": /; s/\$/}/" >>"$OUT/bench.jsonl"
      echo "== round $r $label exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
    done
  done
  python3 - "$OUT/bench.jsonl" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'binary':6} {'round':>5}  " + "  ".join(f"w{i + 1} p50 ms" for i in range(3)) + "   w1 batch ms/call"
      + "   unseen p50 ms (w1 w2 w3)")
for r in rows:
    w = r["report"]["workloads"]
    sat = w[0]["saturating"][0]["ms_per_call"] if w and w[0]["saturating"] else float("nan")
    unseen = "  ".join(f"{x['unseen']['p50_ms']:7.2f}" for x in w if x.get("unseen"))
    print(f"{r['binary']:6} {r['round']:>5}  " + "  ".join(f"{x['p50_ms']:9.2f}" for x in w) + f"   {sat:11.2f}"
          + f"   {unseen}")
for r in rows:
    h = r["report"].get("host_unseen")
    if h:
        print(f"{r['binary']:6} {r['round']:>5}  workload {h['workload']}, {h['requests']} more new requests: wall p50 "
              f"{h['wall_ms']['p50']:.2f} ms (max {h['wall_ms']['max']:.2f}), GPU span p50 {h['gpu_span_ms']['p50']:.2f}, "
              f"host queue p50 {h['host_queue_ms']['p50']:.2f}, graph launches {h['graph_launches']}")
EOF
}
for phase in ${PHASES:-tests timings bench}; do
  run_$phase
done
