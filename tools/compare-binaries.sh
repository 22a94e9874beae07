#!/usr/bin/env bash
# Holds two onepass binaries to byte-identical CPU behaviour on the synthetic checkpoints: the checkpoints `synth`
# writes, `logits --device cpu` (whole, chunked, last row), and `systemone --device cpu` on examples/ticket.json and
# the answer fixtures' request bodies. For a refactor that must change nothing on the CPU:
#   cp target/release/onepass /tmp/onepass-old     # before the change
#   ... change, cargo build --release -p onepass ...
#   bash tools/compare-binaries.sh /tmp/onepass-old target/release/onepass
# Needs testdata/qwen3_5-tokenizer (tools/setup-testdata.sh). Prints one line per comparison and a count; exits 1 on
# any difference. REQUESTS: fixture bodies per checkpoint (default 8).
set -uo pipefail
OLD=${1:?usage: compare-binaries.sh OLD_BINARY NEW_BINARY}
NEW=${2:?usage: compare-binaries.sh OLD_BINARY NEW_BINARY}
cd "$(dirname "$0")/.."
TOK=testdata/qwen3_5-tokenizer
FIX=tests/fixtures/systemone/answers
[[ -f $TOK/tokenizer.json ]] || { echo "compare-binaries: $TOK missing (run tools/setup-testdata.sh)" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
same=0 diff=0
compare() {  # label, then the arguments both binaries run with (stdout compared)
  local label=$1; shift
  "$OLD" "$@" >"$W/old.out" 2>"$W/old.err"; local ro=$?
  "$NEW" "$@" >"$W/new.out" 2>"$W/new.err"; local rn=$?
  if [[ $ro == "$rn" ]] && cmp -s "$W/old.out" "$W/new.out"; then
    same=$((same + 1))
    echo "same   $label ($(wc -c <"$W/new.out") bytes, exit $rn)"
  else
    diff=$((diff + 1))
    echo "DIFFER $label (exit $ro vs $rn)"
    cmp "$W/old.out" "$W/new.out" | head -2
  fi
}
for preset in tiny-gva tiny-attn-first tiny-composite tiny-bf16 tiny-qwen-vocab tiny-qwen-vocab-composite; do
  tok=(); [[ $preset == tiny-qwen-vocab* ]] && tok=(--tokenizer "$TOK")
  "$OLD" synth --preset $preset --out "$W/old-$preset" "${tok[@]}" >/dev/null 2>&1
  "$NEW" synth --preset $preset --out "$W/new-$preset" "${tok[@]}" >/dev/null 2>&1
  if diff -r -q "$W/old-$preset" "$W/new-$preset" >/dev/null; then
    same=$((same + 1)); echo "same   synth $preset"
  else
    diff=$((diff + 1)); echo "DIFFER synth $preset"
  fi
  m="$W/new-$preset"
  for ids in 3 1,2,3,4,5,6,7,8,9,10,11 7,0,13,2,2,9,30,1,5,8,21,34,55,12,40,6,19,3,27,44,10,4,31,16,2; do
    compare "logits $preset --ids $ids" logits --device cpu --model "$m" --ids $ids
    compare "logits $preset --ids $ids --chunk 4" logits --device cpu --model "$m" --ids $ids --chunk 4
    compare "logits $preset --ids $ids --last" logits --device cpu --model "$m" --ids $ids --last
  done
done
for preset in tiny-qwen-vocab tiny-qwen-vocab-composite; do
  m="$W/new-$preset"
  python3 - "$FIX/manifest.json" "$preset" "$m/decider_config.json" "$FIX/$preset.jsonl" "$W/req-$preset" \
    "${REQUESTS:-8}" <<'EOF'
import json, os, sys
manifest, preset, cfg, fixtures, out, n = sys.argv[1:]
with open(cfg, "w") as f:
    f.write(json.load(open(manifest))["presets"][preset]["decider_config"])
os.makedirs(out, exist_ok=True)
for i, line in enumerate(open(fixtures)):
    if i >= int(n):
        break
    with open(os.path.join(out, f"{i:02d}.json"), "w") as f:
        f.write(json.loads(line)["body"])
EOF
  compare "systemone $preset examples/ticket.json" systemone --device cpu --model "$m" examples/ticket.json
  compare "systemone $preset examples/ticket.json --no-shared-prefix" systemone --device cpu --model "$m" \
    --no-shared-prefix examples/ticket.json
  for r in "$W/req-$preset"/*.json; do
    compare "systemone $preset fixture request $(basename "$r")" systemone --device cpu --model "$m" "$r"
  done
done
echo "compare-binaries: $same same, $diff different"
[[ $diff == 0 ]]
