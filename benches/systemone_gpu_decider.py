"""decider-ai 1.10.0 on the same checkpoint and request bodies as `onepass bench-systemone` (the side-by-side of
issue #4). Run on the GPU machine by `benches/gpu-decider.sh`, which installs the carried wheels and makes the inputs:

    onepass synth --preset qwen3.5-0.8b --tokenizer testdata/qwen3_5-tokenizer --out /tmp/q08
    echo '{"isolated_levels": true, "neutralize_none": false, "version": "bench"}' > /tmp/q08/decider_config.json
    onepass bench-systemone --device cpu --model /tmp/q08 --write-requests /tmp/q08-req       # workload1..3.json
    python3 benches/systemone_gpu_decider.py --model /tmp/q08 --requests /tmp/q08-req [--reps 30] [--engine server]

Two ways of running decider-ai (--engine):

- `server` (default): what `uvicorn decider.serve:app` does, minus HTTP. The script imports decider.serve (with
  stand-ins for fastapi/pydantic when they are not installed: only its routes' decorators and request classes use them),
  points it at the model (DECIDER_MODEL / DECIDER_DEVICE) and runs its own start-up `decider.serve._start()`:
  decider.engine_v2.EngineV2 in bf16, cuDNN SDPA off, CUDA graphs captured for the whole (batch bucket, length bucket)
  grid and sealed, torch.compile and FP8 off (their server defaults; DECIDER_COMPILE=1 / DECIDER_FP8=1 turn them on as
  for the server). Each request then goes through the real route `decider.serve.systemone`: render + tokenize on the
  server's CPU pool, and either the shared-prefix fork (`EngineV2.score_shared`: the state once, its cache forked per
  question, when every row has >= DECIDER_SHARED_MIN_TOKENS = 768 tokens) or the batcher (rows of the request padded
  into one captured (B, T) graph, `decider.batching.plan_batches`). The saturating load puts N identical requests in
  flight at once (asyncio.gather), so the server's batcher merges their rows as it would under load.
- `library`: `decider.infer.Decider(model, device=...)` and `Decider.system_one(state, questions)`; on CUDA that is
  decider.engine.Engine with its defaults (bf16, CUDA graphs per shape bucket, torch.compile, fused conv) and the
  shared-prefix fork for every request whose rows share >= 192 tokens.

The Gated DeltaNet kernels are whatever transformers' Qwen3.5 model resolved at import: flash-linear-attention's
(`fla.ops.gated_delta_rule`) when `import fla` works, else transformers' reference PyTorch loops. The script reports
which (`gdn_kernels` in the JSON, and a banner on stderr when the fast path is missing on CUDA).

Timings: one request at a time, --reps timed after 3 warm-ups, each from the JSON body to the assembled answers on the
host (json.loads + route / system_one); p50/p95 are nearest-rank as in `onepass bench-systemone`, requests/s = 1 / mean,
decisions/s = rows (answer slots; a Score with isolated levels counts one per level, as onepass's `decisions`) / mean.
Prints a table on stderr and one JSON object on stdout (also --out). The JSON keeps each workload's last answers so
they can be compared with onepass's.
"""
import argparse, asyncio, contextlib, glob, json, os, statistics, sys, time, traceback, types

from percentile import pct  # benches/percentile.py: nearest rank, as onepass


def summarize(secs, decisions):
    mean = statistics.fmean(secs)
    return {"p50_ms": pct(secs, 0.5) * 1e3, "p95_ms": pct(secs, 0.95) * 1e3, "mean_ms": mean * 1e3,
            "min_ms": min(secs) * 1e3, "requests_per_s": 1 / mean, "decisions_per_s": decisions / mean, "runs": len(secs)}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def versions():
    from importlib.metadata import version, PackageNotFoundError
    out = {}
    for d in ("decider-ai", "flash-linear-attention", "fla-core", "transformers", "torch", "triton", "tokenizers",
              "huggingface_hub", "safetensors", "causal-conv1d"):
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            out[d] = None
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["python"] = sys.version.split()[0]
    return out


def fla_probe():
    """Can flash-linear-attention's Gated DeltaNet ops be imported? -> (ok, error text)."""
    try:
        import fla  # noqa: F401
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule  # noqa: F401
        return True, None
    except Exception as e:
        return False, "".join(traceback.format_exception_only(type(e), e)).strip()


def gdn_kernels():
    """Which implementation transformers' Qwen3.5 model calls for each hub-kernel function (resolved when
    transformers.models.qwen3_5.modeling_qwen3_5 was imported): the module of the function in the wrapper's closure
    that is not the reference, or 'reference PyTorch'."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as mq
    out = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"):
        f = getattr(mq, name, None)
        if f is None:
            out[name] = "absent"
            continue
        impls = [c.cell_contents for c in (getattr(f, "__closure__", None) or []) if callable(getattr(c, "cell_contents", None))]
        ext = [i for i in impls if not str(getattr(i, "__module__", "")).startswith("transformers.")]
        if ext:
            out[name] = f"{ext[0].__module__}.{getattr(ext[0], '__name__', '?')}"
        elif getattr(f, "__module__", "").startswith("decider."):
            out[name] = f"{f.__module__}.{f.__name__} (decider's patch)"
        else:
            out[name] = "reference PyTorch (transformers)"
    return out


def fast_path_label(k):
    fla = str(k.get("torch_chunk_gated_delta_rule", "")).startswith("fla.")
    return "flash-linear-attention" if fla else "reference PyTorch Gated DeltaNet (NO flash-linear-attention)"


def load_bodies(folder):
    paths = sorted(glob.glob(os.path.join(folder, "workload*.json")))
    if not paths:
        sys.exit(f"no workload*.json in {folder} (onepass bench-systemone --write-requests {folder})")
    out = []
    for p in paths:
        with open(p) as f:
            out.append((os.path.basename(p), f.read()))
    return out


def shape_of(items):
    """(rows, unique tokens, mean row tokens, decisions) of one request's scoring rows, as onepass's plan_shape."""
    ids = [it["ids"] for it in items]
    lcp, short = 0, min(len(x) for x in ids)
    while lcp < short and all(x[lcp] == ids[0][lcp] for x in ids):
        lcp += 1
    total = sum(len(x) for x in ids)
    return {"rows": len(ids), "unique_tokens": lcp + total - lcp * len(ids), "mean_row_tokens": total // len(ids),
            "min_row_tokens": min(len(x) for x in ids), "common_prefix_tokens": lcp,
            "decisions": sum(len(it["slots"]) for it in items)}


def sync(dev):
    if str(dev).startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def write_partial(a, info, rows):
    """After each workload: what is measured so far, so that a run stopped by a time limit still leaves its figures."""
    if a.out:
        with open(a.out, "w") as f:
            f.write(json.dumps({"engine": "decider-ai", "mode": a.engine, "complete": False, **info, "workloads": rows}) + "\n")


def row_line(name, r):
    log(f"{name:<44} {r['p50_ms']:9.2f} {r['p95_ms']:9.2f} {r['requests_per_s']:9.1f} {r['decisions_per_s']:12.1f}")


# ---- server: decider.serve's start-up and /v1/systemone route, without HTTP -------------------------------------
def import_serve():
    """decider.serve imports fastapi and pydantic for its HTTP layer only; stand in for them when they are missing."""
    stubs = []
    try:
        import fastapi  # noqa: F401
    except ImportError:
        m = types.ModuleType("fastapi")

        class HTTPException(Exception):
            def __init__(self, status_code, detail=None):
                super().__init__(status_code, detail)
                self.status_code, self.detail = status_code, detail

        class FastAPI:
            def __init__(self, *a, **k):
                pass

            def _route(self, *a, **k):
                return lambda f: f
            post = get = put = delete = _route

        m.FastAPI, m.HTTPException = FastAPI, HTTPException
        sys.modules["fastapi"] = m
        stubs.append("fastapi")
    try:
        import pydantic  # noqa: F401
    except ImportError:
        m = types.ModuleType("pydantic")

        class BaseModel:
            def __init__(self, **kw):
                for k, v in kw.items():
                    setattr(self, k, v)

        m.BaseModel = BaseModel
        sys.modules["pydantic"] = m
        stubs.append("pydantic")
    from decider import serve as S
    return S, stubs


async def run_server(a, bodies):
    import torch
    S, stubs = import_serve()
    S.MODEL, S.DEVICE = a.model, a.device                     # what DECIDER_MODEL / DECIDER_DEVICE set
    t0 = time.perf_counter()
    if a.grid == "workload":
        # Capture only the length buckets the workloads' rows fall in (every batch bucket of them): the buckets and the
        # plan of every request are those of the full grid; only shapes no request uses are left uncaptured.
        from decider import engine_v2
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(a.model)
        S.apply_config(S.load_config(a.model))
        chat = S.chat_template(tok) if S.LAYOUT == "chat" else None
        ladder = sorted(S._ints("DECIDER_T_BUCKETS") or engine_v2.T_BUCKETS)
        needed = set()
        for _, raw in bodies:
            body = json.loads(raw)
            _, _, items, _ = S.prepare(tok, body["state"], body["questions"], body.get("independent", True), S.ISOLATED,
                                       S.MAX_STATE_TOKENS, chat=chat)
            needed |= {next((t for t in ladder if len(it["ids"]) <= t), None) for it in items}
        full = engine_v2.EngineV2.graph_shapes
        engine_v2.EngineV2.graph_shapes = lambda self: [s for s in full(self) if s[1] in needed]
    await S._start()
    startup_s = time.perf_counter() - t0
    eng = S.eng
    kern = gdn_kernels()
    info = {"engine": "decider-ai server path (decider.serve._start + decider.serve.systemone, no HTTP)",
            "stand_ins": stubs, "engine_cfg": {k: v for k, v in eng.cfg.items() if k not in ("t_buckets", "b_buckets")},
            "dtype": str(next(eng.m.parameters()).dtype), "graphs_captured": len(eng.graphs), "grid": a.grid,
            "startup_s": startup_s, "isolated_levels": S.ISOLATED, "layout": S.LAYOUT, "shared": S.SHARED,
            "shared_min_tokens": S.SHARED_MIN_TOKENS, "max_batch": S.MAX_BATCH, "gdn_kernels": kern,
            "fast_path": fast_path_label(kern),
            "cudnn_sdp": bool(torch.backends.cuda.cudnn_sdp_enabled()) if hasattr(torch.backends.cuda, "cudnn_sdp_enabled") else None}
    log(f"[server] start-up {startup_s:.1f}s, {len(eng.graphs)} graphs, cfg {info['engine_cfg']}, GDN: {kern['torch_chunk_gated_delta_rule']}")

    async def call(raw):
        body = json.loads(raw)
        return await S.systemone(S.S1Req(**body))

    rows = []
    log(f"{'workload (one request at a time)':<44} {'p50 ms':>9} {'p95 ms':>9} {'req/s':>9} {'decisions/s':>12}")
    for name, raw in bodies:
        body = json.loads(raw)
        _, _, items, _ = S._prepare_s1(body["state"], body["questions"], body.get("independent", True))
        shp = shape_of(items)
        for _ in range(3):
            await call(raw)
        sync(a.device)
        st0, sh0 = dict(eng.stats), S.stats["shared_prefix_requests"]
        secs = []
        for _ in range(a.reps):
            t = time.perf_counter()
            resp = await call(raw)
            sync(a.device)
            secs.append(time.perf_counter() - t)
        st1 = dict(eng.stats)
        delta = {k: st1.get(k, 0) - st0.get(k, 0) for k in st1 if isinstance(st1.get(k), int)}
        shared = S.stats["shared_prefix_requests"] - sh0
        route = ("shared-prefix fork (EngineV2.score_shared, eager prefix + suffix forwards)" if shared
                 else "batched rows through the batcher (captured CUDA graph per (B, T) bucket)" if delta.get("replays")
                 else "batched rows, eager")
        r = dict(workload=name, **shp, **summarize(secs, shp["decisions"]), route=route,
                 engine_stats_per_request={k: v / a.reps for k, v in delta.items() if v},
                 answers=resp.get("answers"), usage=resp.get("usage"))
        row_line(f"{name} ({shp['rows']} rows ~{shp['mean_row_tokens']} tok, {shp['unique_tokens']} uniq)", r)
        log(f"    route: {route}")
        sat = []
        for b in a.batch:
            await asyncio.gather(*[call(raw) for _ in range(b)])
            sync(a.device)
            t = time.perf_counter()
            for _ in range(a.batch_reps):
                await asyncio.gather(*[call(raw) for _ in range(b)])
            sync(a.device)
            secs_call = (time.perf_counter() - t) / a.batch_reps
            rps = b / secs_call
            sat.append({"requests_in_flight": b, "ms_per_burst": secs_call * 1e3, "requests_per_s": rps,
                        "decisions_per_s": rps * shp["decisions"]})
            log(f"  {b:>3} requests in flight (server batcher)     {secs_call * 1e3:9.2f} ms/burst {rps:9.1f} {rps * shp['decisions']:12.1f}")
        r["saturating"] = sat
        rows.append(r)
        write_partial(a, info, rows)
    info["engine_stats_total"] = dict(eng.stats)
    info["server_stats"] = {k: v for k, v in S.stats.items() if not isinstance(v, dict)}
    S._stop()
    return info, rows


# ---- library: decider.infer.Decider(...).system_one -----------------------------------------------------------
def run_library(a, bodies):
    import torch
    from decider.infer import Decider
    t0 = time.perf_counter()
    d = Decider(a.model, device=a.device)     # dtype: bf16 on CUDA, f32 on CPU; CUDA graphs on CUDA (decider.engine.Engine)
    load_s = time.perf_counter() - t0
    eng = d.eng
    kern = gdn_kernels()
    info = {"engine": "decider-ai library path (decider.infer.Decider(...).system_one)",
            "engine_cfg": dict(eng.cfg) if eng is not None else {"graphs": False, "engine": "DecisionModel eager"},
            "dtype": str(next(d.m.parameters()).dtype), "load_s": load_s, "isolated_levels": d.isolated_levels,
            "gdn_kernels": kern, "fast_path": fast_path_label(kern)}
    log(f"[library] loaded in {load_s:.1f}s, cfg {info['engine_cfg']}, GDN: {kern['torch_chunk_gated_delta_rule']}")
    rows = []
    log(f"{'workload (one request at a time)':<44} {'p50 ms':>9} {'p95 ms':>9} {'req/s':>9} {'decisions/s':>12}")
    for name, raw in bodies:
        body = json.loads(raw)
        ind = body.get("independent", True)
        _, _, items = d._system_one_items(body["state"], body["questions"], ind)
        shp = shape_of(items)

        def call():
            b = json.loads(raw)
            return d.system_one(b["state"], b["questions"], independent=b.get("independent", True))
        t = time.perf_counter()
        call()
        first_s = time.perf_counter() - t                  # includes any graph capture / torch.compile of a new shape
        for _ in range(2):
            call()
        sync(a.device)
        st0 = dict(eng.stats) if eng is not None else {}
        secs = []
        for _ in range(a.reps):
            t = time.perf_counter()
            resp = call()
            sync(a.device)
            secs.append(time.perf_counter() - t)
        st1 = dict(eng.stats) if eng is not None else {}
        delta = {k: st1.get(k, 0) - st0.get(k, 0) for k in st1 if isinstance(st1.get(k), int)}
        route = ("shared-prefix fork (Engine.score_shared)" if delta.get("shared_prefix_calls")
                 else "rows through a captured CUDA graph (Engine.score_items)" if eng is not None and eng.use_graphs
                 else "rows eager")
        r = dict(workload=name, **shp, **summarize(secs, shp["decisions"]), first_request_s=first_s, route=route,
                 engine_stats_per_request={k: v / a.reps for k, v in delta.items() if v},
                 answers=resp.get("answers"), usage=resp.get("usage"))
        row_line(f"{name} ({shp['rows']} rows ~{shp['mean_row_tokens']} tok, {shp['unique_tokens']} uniq)", r)
        log(f"    route: {route}; first request {first_s:.1f}s")
        rows.append(r)
        write_partial(a, info, rows)
    return info, rows


def answer_diff(a, b):
    """Max |difference| of the probabilities of two /v1/systemone answer maps, and the ids whose pick differs."""
    worst, picks = 0.0, []
    for k, x in a.items():
        y = b.get(k)
        if y is None:
            picks.append(k)
            continue
        for field in ("probabilities", "level_fit"):
            for o, v in (x.get(field) or {}).items():
                worst = max(worst, abs(float(v) - float((y.get(field) or {}).get(o, float("nan")))))
        if x.get("type") == "noul":
            worst = max(worst, abs(x["noul"] - y["noul"]))
            if (x["noul"] >= 0.5) != (y["noul"] >= 0.5):
                picks.append(k)
        elif x.get("type") == "choice" and x.get("choice") != y.get("choice"):
            picks.append(k)
        elif x.get("type") == "score":
            px, py = x.get("probabilities") or {}, y.get("probabilities") or {}
            if px and py and max(px, key=px.get) != max(py, key=py.get):
                picks.append(k)
    return worst, picks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True, help="folder of workload*.json (onepass bench-systemone --write-requests)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--engine", choices=("server", "library"), default="server")
    ap.add_argument("--grid", choices=("full", "workload"), default="full",
                    help="server: capture the server's whole graph grid at start-up (full, what decider.serve does) or "
                         "only the length buckets the workloads use (workload; same plans, shorter start-up)")
    ap.add_argument("--batch", default="8,32", help="server: requests in flight at once for the saturating load ('' = none)")
    ap.add_argument("--batch-reps", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated workload file names (e.g. workload1.json)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--no-fla", action="store_true",
                    help="hide flash-linear-attention (transformers then uses its reference PyTorch Gated DeltaNet); the "
                         "fallback when the fla kernels fail on this machine")
    ap.add_argument("--compare-with", default=None,
                    help="folder of onepass responses named like the workloads (onepass systemone --model M workloadN.json "
                         "> DIR/workloadN.json): adds max |dp| and differing picks per workload")
    a = ap.parse_args()
    a.batch = [int(x) for x in a.batch.split(",") if x.strip()]

    t_imp = time.perf_counter()
    import torch
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if not a.device.startswith("cuda") and not a.no_fla:
        log("--device cpu: flash-linear-attention hidden (its kernels are Triton GPU kernels; decider-ai's CPU path is "
            "transformers' PyTorch Gated DeltaNet)")
        a.no_fla = True
    if a.no_fla:
        sys.modules["fla"] = None           # `import fla` raises ImportError; transformers falls back to its PyTorch path
    fla_ok, fla_err = fla_probe()
    vers = versions()
    log(f"versions: {json.dumps(vers)}")
    if a.no_fla:
        fla_err = "hidden by --no-fla"
        log("flash-linear-attention hidden (--no-fla): decider-ai runs transformers' reference PyTorch Gated DeltaNet")
    elif fla_ok:
        log("flash-linear-attention: fla.ops.gated_delta_rule imports")
    else:
        log("=" * 100)
        log("flash-linear-attention does NOT import; decider-ai will run transformers' reference PyTorch Gated DeltaNet "
            "(much slower; NOT decider-ai's CUDA fast path). Error:")
        log(fla_err)
        log("=" * 100)
    bodies = load_bodies(a.requests)
    if a.only:
        keep = set(a.only.split(","))
        bodies = [b for b in bodies if b[0] in keep]
    dev_name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
    with contextlib.redirect_stdout(sys.stderr):     # decider.serve prints its start-up lines; stdout keeps the JSON
        if a.engine == "server":
            info, rows = asyncio.run(run_server(a, bodies))
        else:
            info, rows = run_library(a, bodies)
    if a.compare_with:
        for r in rows:
            p = os.path.join(a.compare_with, r["workload"])
            try:
                with open(p) as f:
                    theirs = json.load(f)["answers"]
            except Exception as e:
                r["vs_onepass"] = {"error": f"{p}: {e}"}
                continue
            worst, picks = answer_diff(r["answers"], theirs)
            r["vs_onepass"] = {"max_abs_dp": worst, "differing_picks": picks}
            log(f"{r['workload']}: decider-ai vs onepass answers: max |dp| {worst:.4f}, differing picks {picks or 'none'}")
    if a.device.startswith("cuda") and not info["fast_path"].startswith("flash"):
        log("!" * 100)
        log(f"LABEL: these figures are decider-ai with {info['fast_path']}, not its CUDA fast path")
        log("!" * 100)
    out = {"engine": "decider-ai", "mode": a.engine, "complete": True, "label": f"decider-ai {vers['decider-ai']} {a.engine} path, {info['fast_path']}",
           "device": dev_name, "model": a.model, "reps": a.reps, "versions": vers, "fla_import_ok": fla_ok,
           "fla_import_error": fla_err, "script_s": time.perf_counter() - t_imp, **info, "workloads": rows}
    if a.device.startswith("cuda"):
        out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    text = json.dumps(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
