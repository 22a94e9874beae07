#!/usr/bin/env bash
# Set up onepass on a fresh machine and run its main job: answer System One decisions over HTTP.
#
#   bash tools/quickstart.sh                 # synthetic model (no download needed), port 8000
#   MODEL=/path/to/model bash tools/quickstart.sh
#   MODEL=Qwen/Qwen3.5-0.8B bash tools/quickstart.sh   (a repo already in the Hugging Face cache)
#
# Builds the release binary, makes a deterministic synthetic checkpoint with the real Qwen3.5
# tokenizer when no MODEL is given (random weights: the probabilities mean nothing, the code paths
# are the real ones), answers examples/ticket.json once from the command line, then serves
# /v1/systemone on 127.0.0.1:${PORT:-8000} until Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== building onepass (release)"
cargo build --release -p onepass
bin=target/release/onepass

model="${MODEL:-}"
if [[ -z "$model" ]]; then
    bash tools/setup-testdata.sh
    model=testdata/quickstart-model
    if [[ ! -f "$model/model.safetensors" ]]; then
        echo "== writing a synthetic checkpoint to $model"
        "$bin" synth --preset tiny-qwen-vocab --tokenizer testdata/qwen3_5-tokenizer --out "$model"
    fi
fi

echo "== one decision from the command line: $bin systemone --model $model examples/ticket.json"
"$bin" systemone --model "$model" examples/ticket.json
echo

port="${PORT:-8000}"
echo "== serving on http://127.0.0.1:$port  (try: curl -s localhost:$port/v1/systemone -d @examples/ticket.json)"
exec "$bin" serve --model "$model" --port "$port"
