#!/usr/bin/env bash
# decider-ai 1.10.0 on CUDA, on the same synthetic checkpoint and request bodies as `onepass bench-systemone` (the
# side-by-side of issue #4). One device run, from the repository root:
#
#   run(command="bash benches/gpu-decider.sh", carry=[".devcarry/wheels", <onepass + tokenizer, below>], timeout_s=600)
#
# Inputs (git-ignored, carried):
# - .devcarry/wheels/*.whl (fetch here: pip download --no-deps -d .devcarry/wheels decider-ai==1.10.0
#   flash-linear-attention==0.6.0 fla-core==0.6.0; and -d .devcarry/wheels/alt flash-linear-attention==0.5.2
#   fla-core==0.5.2): decider-ai 1.10.0 and flash-linear-attention 0.6.0 (fla-core + flash-linear-attention, the
#   Gated DeltaNet kernels transformers' Qwen3.5 model calls on CUDA when `import fla` works). The machine's torch 2.11,
#   transformers 5.17 (has models/qwen3_5), triton 3.6, tokenizers, huggingface_hub, numpy, jinja2, einops are used as
#   they are. .devcarry/wheels/alt/: flash-linear-attention 0.5.2, tried only when 0.6.0 fails its smoke test.
# - the onepass binary and the Qwen3.5 tokenizer: $ONEPASS_BIN and $TOKENIZER when set (crates/cuda/gpu-run.sh
#   "decider" sets them), else .devcarry/onepass + testdata/qwen3_5-tokenizer, else .devcarry/pack.tar.gz
#   (crates/cuda/gpu-pack.sh: bin/onepass and tokenizer/, unpacked to /tmp/op).
#
# Steps: install the wheels into /tmp/pydeps (first on PYTHONPATH); print versions; synthesize the 0.8B checkpoint and
# write the three request bodies; smoke-test flash-linear-attention on the GPU (chunked gated delta rule against a
# plain recurrence, prefix + continued suffix, CUDA graph replay); onepass's answers to the three bodies (for the
# answer comparison); onepass bench-systemone on the same checkpoint, same run; decider-ai's server path
# (benches/systemone_gpu_decider.py --engine server); decider-ai's library path (Decider(...).system_one) with the
# time left; a side-by-side table. If fla fails, decider-ai still runs on transformers' PyTorch Gated DeltaNet, labelled so
# in the JSON and the table.
#
# Files in $OUT: decider.log (everything printed), decider-server.json, decider-library.json, onepass-bench.jsonl.
# Knobs: REPS (30), GRID (workload: capture the graph buckets the workloads use, every batch size of them; full:
# decider.serve's whole start-up grid), BATCH ("8,32" requests in flight), LIBRARY (1), ONEPASS_ANSWERS (1),
# ONEPASS_PRECS (the --gpu-precision values onepass is timed in: "half mixed split bf16"), ONEPASS_BENCH (1; 0 when the onepass bench runs elsewhere in the same run), ONEPASS_FLAGS (more bench-systemone
# flags, e.g. "--prefix-cache-mb 0" for cold contexts), BUDGET (seconds for the whole script,
# 570), PRESET (qwen3.5-0.8b).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/decider.log") 2>&1
export XDG_CACHE_HOME=/tmp/xdg TRITON_CACHE_DIR=/tmp/xdg/triton PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
PY=${PY:-python3}
W=.devcarry/wheels
M=/tmp/q08; R=/tmp/q08-req; OPA=/tmp/onepass-answers
REPS=${REPS:-30}; GRID=${GRID:-workload}; BATCH=${BATCH:-8,32}; LIBRARY=${LIBRARY:-1}
ONEPASS_ANSWERS=${ONEPASS_ANSWERS:-1}; ONEPASS_BENCH=${ONEPASS_BENCH:-1}
if [[ -z ${ONEPASS_BIN:-} ]]; then
  if [[ -x .devcarry/onepass ]]; then
    ONEPASS_BIN=.devcarry/onepass
  elif [[ -f .devcarry/pack.tar.gz ]]; then
    PACK_DIR=${PACK_DIR:-/tmp/op}
    rm -rf $PACK_DIR && mkdir -p $PACK_DIR && tar -C $PACK_DIR -xzf .devcarry/pack.tar.gz --strip-components=1
    ONEPASS_BIN=$PACK_DIR/bin/onepass; TOKENIZER=${TOKENIZER:-$PACK_DIR/tokenizer}
  fi
fi
TOKENIZER=${TOKENIZER:-testdata/qwen3_5-tokenizer}
OP=${ONEPASS_BIN:-.devcarry/onepass}
[[ -x $OP ]] || { echo "FAILED: no onepass binary (ONEPASS_BIN, .devcarry/onepass or .devcarry/pack.tar.gz)"; exit 1; }
[[ -f $TOKENIZER/tokenizer.json ]] || { echo "FAILED: no tokenizer.json in $TOKENIZER"; exit 1; }
BUDGET=${BUDGET:-570}
left() { echo $((BUDGET - SECONDS)); }
step() { echo; echo "=== [$SECONDS s] $*"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
ls -la $W $W/alt 2>&1 | grep -v '^total'

install() {  # target wheels...
  local t=$1; shift
  rm -rf "$t"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$t" "$@"
}
step "install wheels into /tmp/pydeps"
install /tmp/pydeps $W/*.whl || { echo "FAILED: pip install of $W/*.whl"; exit 1; }
export PYTHONPATH=/tmp/pydeps${PYTHONPATH:+:$PYTHONPATH}

versions() {
  $PY - <<'EOF'
import importlib, importlib.metadata as md, sys
print("python", sys.version.split()[0], sys.executable)
for dist, mod in [("decider-ai", "decider"), ("flash-linear-attention", "fla.models"), ("fla-core", "fla"),
                  ("transformers", "transformers"), ("torch", "torch"), ("triton", "triton"), ("tokenizers", "tokenizers"),
                  ("huggingface_hub", "huggingface_hub"), ("einops", "einops"), ("causal-conv1d", "causal_conv1d")]:
    try:
        v = md.version(dist)
    except md.PackageNotFoundError:
        v = "not installed"
    try:
        where = getattr(importlib.import_module(mod), "__file__", "?")
    except Exception as e:
        where = f"IMPORT FAILED: {type(e).__name__}: {e}"
    print(f"{dist:<24} {v:<16} {where}")
import torch
print("torch.cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
}
step "versions"
versions

step "checkpoint and request bodies"
$OP synth --preset ${PRESET:-qwen3.5-0.8b} --out $M --tokenizer $TOKENIZER 2>&1 | tail -1
echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > $M/decider_config.json
rm -rf $R
$OP bench-systemone --device cpu --model $M --write-requests $R || { echo "FAILED: --write-requests"; exit 1; }
ls -la $R

fla_smoke() {
  timeout 240 $PY - <<'EOF'
# flash-linear-attention's chunked gated delta rule as transformers' Qwen3.5 calls it (q, k, v [B, T, H, D] bf16,
# log-space g, post-sigmoid beta, use_qk_l2norm_in_kernel=True), against a plain f32 recurrence; then a prefix and a
# continued suffix (initial_state, the shared-prefix fork's path); then a CUDA graph capture and replay (decider's
# engines capture through these kernels).
import time, torch, torch.nn.functional as F
t0 = time.time()
import fla
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
print("fla", fla.__version__, fla.__file__)
torch.manual_seed(0)
Bsz, T, H, D = 2, 300, 16, 128
dev = "cuda"
q, k, v = (torch.randn(Bsz, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
g = -F.softplus(torch.randn(Bsz, T, H, device=dev)) * 0.3
beta = torch.rand(Bsz, T, H, device=dev).sigmoid().to(torch.bfloat16)

def ref(q, k, v, g, beta, S=None):
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q = F.normalize(q, dim=-1, eps=1e-6) * q.shape[-1] ** -0.5
    k = F.normalize(k, dim=-1, eps=1e-6)
    S = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3]) if S is None else S.float().clone()
    o = torch.empty(v.shape, device=v.device)
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        u = (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)) * beta[:, t][..., None]
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], u)
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S

def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()

ok = True
o_ref, S_ref = ref(q, k, v, g, beta)
o, S = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
torch.cuda.synchronize()
e1, e2 = rel(o, o_ref), rel(S, S_ref)
print(f"whole {T} tokens: max rel err out {e1:.2e}, final state {e2:.2e}   (first call incl. Triton compile/autotune {time.time() - t0:.1f}s)")
ok &= e1 < 3e-2 and e2 < 3e-2
P = 200
o1, S1 = chunk_gated_delta_rule(q[:, :P], k[:, :P], v[:, :P], g=g[:, :P], beta=beta[:, :P], output_final_state=True, use_qk_l2norm_in_kernel=True)
o2, S2 = chunk_gated_delta_rule(q[:, P:], k[:, P:], v[:, P:], g=g[:, P:], beta=beta[:, P:], initial_state=S1,
                                output_final_state=True, use_qk_l2norm_in_kernel=True)
e3 = max(rel(o2, o_ref[:, P:]), rel(S2, S_ref))
print(f"prefix {P} + continued suffix {T - P}: max rel err {e3:.2e}")
ok &= e3 < 3e-2
st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(st):
    for _ in range(3):
        chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
torch.cuda.current_stream().wait_stream(st)
gr = torch.cuda.CUDAGraph()
with torch.cuda.graph(gr):
    og, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
gr.replay(); torch.cuda.synchronize()
e4 = rel(og, o_ref)
print(f"CUDA graph replay: max rel err {e4:.2e}")
ok &= e4 < 3e-2
print("FLA SMOKE", "OK" if ok else "FAILED", f"({time.time() - t0:.1f}s)")
raise SystemExit(0 if ok else 1)
EOF
}
step "flash-linear-attention smoke test on the GPU"
FLA=fast
if ! fla_smoke; then
  echo "!!! flash-linear-attention $(ls $W/fla_core-*.whl) failed the smoke test (above); trying the alternative in $W/alt"
  if ls $W/alt/*.whl >/dev/null 2>&1 && install /tmp/pydeps $W/decider_ai-*.whl $W/alt/*.whl && fla_smoke; then
    echo "using the alternative flash-linear-attention"; versions
  else
    echo "!!! no working flash-linear-attention: decider-ai runs on transformers' reference PyTorch Gated DeltaNet (labelled)"
    install /tmp/pydeps $W/*.whl
    FLA=none
  fi
fi
NOFLA=(); [[ $FLA == none ]] && NOFLA=(--no-fla)

if [[ $ONEPASS_ANSWERS == 1 ]]; then
  step "onepass answers to the three bodies (cuda, default precision), for the answer comparison"
  mkdir -p $OPA
  for f in $R/workload*.json; do
    timeout 90 $OP systemone --device cuda --model $M "$f" > $OPA/$(basename "$f") || { echo "onepass systemone $f failed"; break; }
  done
fi

decider() {  # name, then extra arguments
  local name=$1; shift
  timeout "$(( $(left) > 30 ? $(left) : 30 ))" $PY benches/systemone_gpu_decider.py --model $M --requests $R --reps $REPS \
    --grid $GRID --batch "$BATCH" --compare-with $OPA --out "$OUT/$name.json" "$@" >/dev/null
}
# onepass first: it takes about 45 s per precision, so a short BUDGET still leaves both sides (decider-ai's server
# path takes about 200 s on the bench workloads; it stops where the budget ends).
if [[ $ONEPASS_BENCH == 1 ]] && (( $(left) > 150 )); then
  step "onepass bench-systemone on the same checkpoint (${ONEPASS_PRECS:-half mixed split bf16}); $(left)s left"
  rm -f "$OUT/onepass-bench.jsonl"
  for P in ${ONEPASS_PRECS:-half mixed split bf16}; do
    timeout 150 $OP bench-systemone --device cuda --gpu-precision $P --model $M --reps $REPS --batch-reps 2 ${ONEPASS_FLAGS:-} \
      >> "$OUT/onepass-bench.jsonl" || echo "onepass bench-systemone ($P) failed"
  done
fi

step "decider-ai, server path (decider.serve start-up + /v1/systemone route, no HTTP); $(left)s left"
decider decider-server --engine server "${NOFLA[@]}"
rc=$?
if [[ $rc != 0 && $FLA == fast ]]; then
  echo "!!! decider-ai server path with flash-linear-attention exited $rc: again without fla (labelled), 10 reps"
  FLA=failed-at-run
  decider decider-server --engine server --no-fla --reps 10 --batch 8
fi

if [[ $LIBRARY == 1 ]] && (( $(left) > 90 )); then
  step "decider-ai, library path (Decider(model).system_one; on CUDA decider.engine.Engine: bf16, graphs, torch.compile); $(left)s left"
  decider decider-library --engine library "${NOFLA[@]}" || echo "decider-ai library path stopped (rc $?; timeout = out of budget)"
fi

step "side by side"
SBS=()
for f in decider-server decider-library; do [[ -s "$OUT/$f.json" ]] && SBS+=(--decider "$OUT/$f.json"); done
[[ -s "$OUT/onepass-bench.jsonl" ]] && SBS+=(--onepass "$OUT/onepass-bench.jsonl")
$PY benches/side_by_side.py "${SBS[@]}" || echo "side by side: nothing to compare"
echo "fla: $FLA; done in $SECONDS s"
sleep 1   # let tee finish decider.log
