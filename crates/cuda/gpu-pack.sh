#!/usr/bin/env bash
# Builds what a device run needs and packs it into .devcarry/pack.tar.gz (git-excluded; carry `.devcarry`):
# the stripped release `onepass` binary, every GPU test executable of onepass-cuda, onepass-engine and onepass-decide, and the
# Qwen3.5 tokenizer folder (testdata/qwen3_5-tokenizer, from tools/setup-testdata.sh). Then run on the device:
#   bash crates/cuda/gpu-run.sh "tests bench"      (see that script for the phases)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p onepass
mapfile -t TESTS < <(cargo test --release -p onepass-cuda -p onepass-engine -p onepass-decide --no-run --message-format=json ${ONLY:+$(for t in $ONLY; do printf -- '--test %s ' $t; done)} |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"] + " " + m["executable"])')
(( ${#TESTS[@]} )) || { echo "gpu-pack: no GPU test executables built (see the cargo output above)" >&2; exit 1; }
rm -rf .devcarry/pack && mkdir -p .devcarry/pack/bin
cp "${CARGO_TARGET_DIR:-target}/release/onepass" .devcarry/pack/bin/onepass
for t in "${TESTS[@]}"; do
  set -- $t
  cp "$2" ".devcarry/pack/bin/$1"  # ONLY="ops forward": cargo built just these
done
strip .devcarry/pack/bin/*
cp -r testdata/qwen3_5-tokenizer .devcarry/pack/tokenizer
tar -C .devcarry -czf .devcarry/pack.tar.gz pack
rm -rf .devcarry/pack
ls .devcarry/pack.tar.gz -la
tar -tzf .devcarry/pack.tar.gz | grep bin/ | tr '\n' ' '; echo
