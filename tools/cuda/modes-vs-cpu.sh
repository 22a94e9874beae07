#!/usr/bin/env bash
# GPU precision modes against the CPU engine's f32 answers on a larger synthetic checkpoint than the answer tests'
# (default: the 0.8B shape with bf16 weights) and the three `bench-systemone` workloads (about 406, 927 and 3,691
# unique tokens). Needs crates/cuda/gpu-pack.sh's .devcarry/pack.tar.gz (carry .devcarry). One device run:
#   bash tools/cuda/modes-vs-cpu.sh
# MODES: space-separated PRECISION[/SPLIT][:KERNELS] (`--gpu-precision`, `--gpu-split-gemms`, `--gpu-kernels`;
# default "half mixed split bf16"); a mode ending in @base runs on the onepass binary BASELINE names (e.g. the
# parent commit's, carried in .devcarry) instead of the pack's, for an old-vs-new comparison; each "+NAME" before
# it passes --gpu-NAME (e.g. half+no-graphs);
# PRESET (qwen3.5-0.8b). Prints max / mean |dp| over every option probability of each workload, per mode.
set -uo pipefail
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" XDG_CACHE_HOME=/tmp/xdg
P=/tmp/op; [[ -x $P/bin/onepass ]] || { rm -rf $P && mkdir -p $P && tar -C $P -xzf .devcarry/pack.tar.gz --strip-components=1; }
B=$P/bin/onepass M=/tmp/modes-ck R=/tmp/modes-req A=/tmp/modes-ans
PRESET=${PRESET:-qwen3.5-0.8b}
rm -rf $M $R $A && mkdir -p $A
$B synth --preset $PRESET --dtype bf16 --out $M --tokenizer $P/tokenizer 2>&1 | tail -1
echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > $M/decider_config.json
$B bench-systemone --device cpu --model $M --write-requests $R 2>&1 | tail -1
MODES=${MODES:-half mixed split bf16}
for w in 1 2 3; do
  $B systemone --model $M --device cpu $R/workload$w.json > $A/$w-cpu 2>/dev/null || echo "CPU answer to workload $w failed"
  for v in $MODES; do
    bin=$B; m=$v; [[ $v == *@base ]] && { bin=${BASELINE:?a @base mode needs BASELINE}; m=${v%@base}; }
    a=(); while [[ $m == *+* ]]; do a+=(--gpu-${m##*+}); m=${m%+*}; done
    p=${m%%:*}; a+=(--device cuda --gpu-precision ${p%%/*}); [[ $p == */* ]] && a+=(--gpu-split-gemms ${p#*/})
    [[ $m == *:* && -n ${m#*:} ]] && a+=(--gpu-kernels ${m#*:})
    f="$A/$w-${v//[\/:@+]/_}"  # '/', ':', '@' and '+' in a mode's name become '_' in its file's
    $bin systemone --model $M "${a[@]}" $R/workload$w.json > "$f" 2>"$f.err" || tail -2 "$f.err"
  done
done
MODES="$MODES" A=$A python3 - <<'PY'
import json, os, re
A = os.environ["A"]
def probs(path):
    return {k: v.get("probabilities", {}) for k, v in json.load(open(path))["answers"].items()}
for v in os.environ["MODES"].split():
    out = []
    for w in (1, 2, 3):
        # The answer file's name as the loop above writes it ('/', ':', '@', '+' to '_').
        cp, gp = probs(f"{A}/{w}-cpu"), probs(f"{A}/{w}-" + re.sub("[/:@+]", "_", v))
        ds = [abs(gp[q][o] - cp[q][o]) for q in cp for o in cp[q]]
        out.append(f"workload {w}: {max(ds):.4f} / {sum(ds) / len(ds):.5f}")
    print(f"{v:28} max / mean |dp|  " + ", ".join(out))
PY
