#!/usr/bin/env bash
# Set up onepass on a fresh machine and run its main job: answer System One decisions over HTTP.
#
#   bash tools/quickstart.sh                      # synthetic model (no download needed), port 8000
#   MODEL=/path/to/decider-0.8b bash tools/quickstart.sh
#   MODEL=ORG/NAME bash tools/quickstart.sh       (a repo already in the Hugging Face cache; README "Which model")
#
# Builds the release binary, makes a deterministic synthetic checkpoint with the real Qwen3.5
# tokenizer when no MODEL is given (random weights: the answers mean nothing, the code paths are
# the real ones), answers examples/ticket.json once from the command line, then serves
# /v1/systemone on 127.0.0.1:${PORT:-8000} until Ctrl-C. docs/api.md describes the requests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== building onepass (release)"
cargo build --release -p onepass
bin=target/release/onepass

model="${MODEL:-}"
synthetic=0
if [[ -z "$model" ]]; then
    synthetic=1
    bash tools/setup-testdata.sh
    model=testdata/quickstart-model
    if [[ ! -f "$model/model.safetensors" ]]; then
        echo "== writing a synthetic checkpoint to $model"
        "$bin" synth --preset tiny-qwen-vocab --tokenizer testdata/qwen3_5-tokenizer --out "$model"
    fi
fi

warn_synthetic() {
    if [[ $synthetic == 1 ]]; then
        echo "== NOTE: $model is a synthetic model with random weights: its answers mean nothing."
        echo "         For real decisions run MODEL=<a trained decider checkpoint> bash tools/quickstart.sh (README, \"Which model\")."
    fi
}

echo "== one decision from the command line: $bin systemone --model $model examples/ticket.json"
"$bin" systemone --model "$model" examples/ticket.json
warn_synthetic
echo

port="${PORT:-8000}"
echo "== serving on http://127.0.0.1:$port  (try: curl -s localhost:$port/v1/systemone -d @examples/ticket.json; docs/api.md)"
warn_synthetic
exec "$bin" serve --model "$model" --port "$port"
