//! The Qwen3.5 hybrid forward on one GPU: the layer sequence is the model crate's
//! (`onepass_model::layer_ops::run_layers`); this module implements its ops as launches (`layers`). What they
//! compute, per layer:
//!
//! ```text
//! x = embed[ids]                                        x: [N, H] f32 (all segments stacked)
//! per layer:
//!   h = rms_norm(x) → bf16
//!   GDN:  p = h·[W_qkv; W_z; W_a; W_b]ᵀ (one GEMM)      p: [N, cd + HV*DV + 2*HV] f32
//!         c = silu(conv1d(p[:, :cd])) per segment        (conv state in/out)
//!         q, k = l2norm(q)·DK^-½, l2norm(k); g, β from a, b
//!         o = gated_delta(q, k, v, g, β) per (value head, segment)   (chunked; one-token step)
//!         x += (rms_norm_gated(o, z) → bf16)·W_outᵀ      (the GEMM accumulates into x)
//!   Attn: p = h·[W_q|gate; W_k; W_v]ᵀ                    p: [N, H*2D + 2*HKV*D]
//!         q, k = rope(rms_norm(q)), rope(rms_norm(k)); k, v → the segment's KV cache
//!         x += (attention(q, cache)·σ(gate) → bf16)·W_oᵀ
//!   x += (swiglu(rms_norm(x)·[W_gate; W_up]ᵀ) → bf16)·W_downᵀ
//! hidden = rms_norm(x)                                  hidden: [N, H] f32, stays on the device
//! ```
//! Segment semantics are those of the CPU model: the projections see every token of every segment,
//! the token mixers walk each segment with its own [`CudaState`].
//!
//! By concern: [`precision`] (arithmetic modes), `upload` (weights to the device, constructors), `state` (sequence
//! state, KV layout, memory budget), `scratch` (forward scratch, table, CUDA graphs), `forward` (entry points,
//! trees, staging), `layers` (the launches of the layer sequence, readout), `decode` (greedy decoding, each step one
//! graph queued ahead of the host), `profile` (events and host timing).
//! This file holds [`CudaModel`] itself, its sizes and run-time switches, and the types those modules share (declared
//! here so that each of them reads their fields).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaSlice};
use half::bf16;
pub use onepass_model::layer_ops::Projection;
use onepass_model::layer_ops::{NormSite, Param};
use onepass_model::{LayerKind, Model, ModelError};
use onepass_tensor::{Tensor, View};

use crate::ops::{self, AttnDims, GdnDims, Out, KV_ENTRIES, W};
use crate::options::{AttnKernels, CudaOptions, GdnKernels};
use crate::runtime::{Arith, AttnArith, Gpu, TcArith};
use crate::CudaError;

mod bounds;
mod decode;
mod forward;
mod layers;
pub mod precision;
mod profile;
mod scratch;
mod state;
mod upload;

pub use decode::GreedyRun;
pub use precision::{GemmInputs, Precision, SplitGemms, SplitGemmsError};
use profile::*;
use scratch::*;
use upload::*;

// Weights on the device (uploaded by `upload`). Their behaviour is in that module.

/// A device buffer with its address.
struct Dev<T> {
    /// Owns the memory `ptr` points into.
    _buf: CudaSlice<T>,
    ptr: u64,
}

/// A weight matrix on the device: a float one in the model's precision, or a block-format one (PQ2_0, Q8_0) as the
/// file stores it ([`crate::qgemm`]).
struct Weight {
    /// Owns the memory `w` points into.
    _buf: WeightBuf,
    w: W,
    /// Row stride in elements: the column count K, or 2K where every row is stored twice (`[W | W]`, an input
    /// projection with [`GemmInputs::Split`]: one GEMM over K = 2K multiplies both planes of its input).
    ld: usize,
}

/// Consecutive weights of a [`Linear`] stored alike (one format, one input): rows `row0 .. row0 + rows` of its
/// output.
struct Part {
    w: Weight,
    row0: usize,
    rows: usize,
    /// Reads the rotated input (a folded weight of a rotated pack), else the input as it is.
    rot: bool,
}

/// A projection's weights on the device, stacked by output rows as `Model::linear` lists them: one [`Part`] per run
/// of weights that share a format and an input (a Bonsai pack's Gated DeltaNet input projection: the ternary
/// in_proj_qkv and in_proj_z reading the rotated input, then the float in_proj_a and in_proj_b reading it as it is).
struct Linear {
    parts: Vec<Part>,
    /// The Hadamard signs of the input of the rotated parts ([K]; a rotated pack), uploaded once per site.
    rot: Option<Dev<f32>>,
    /// The half precision's f16 input: its producer stores each value times 2^e (0 for a norm's output; a residual
    /// projection's e puts its input's bound from the weights inside f16's range), and every part is a
    /// [`crate::ops::W::Half`] whose shift includes e, so the GEMM's alpha undoes both. `None`: the input is the
    /// precision's other form (a residual projection of the half precision on both bf16 planes).
    f16_exp: Option<i32>,
}

struct GdnLayer {
    /// w_in: [cd + HV*DV + 2*HV, H] = in_proj_qkv; in_proj_z; in_proj_a; in_proj_b
    w_in: Linear,
    /// w_out: [H, HV*DV]
    w_out: Linear,
    /// Offsets (f32 values) of this layer's conv state [K-1, cd] and recurrent state [HV, DK, DV] in a
    /// [`CudaState`]'s `rec` buffer.
    conv_off: usize,
    ssm_off: usize,
    conv: Dev<f32>,
    neg_a: Dev<f32>,
    dt_bias: Dev<f32>,
    norm: Dev<f32>,
    d: GdnDims,
    kernel: usize,
    eps: f32,
    cd: usize,
}

struct AttnLayer {
    /// w_in: [H*2D + 2*HKV*D, hidden] = q_proj (q|gate per head); k_proj; v_proj
    w_in: Linear,
    /// w_o: [hidden, H*D]
    w_o: Linear,
    q_norm: Dev<f32>,
    k_norm: Dev<f32>,
    inv_freq: Dev<f32>,
    a: AttnDims,
    eps: f32,
    /// Runs `attention_tc` (else `attention_tiled`: [`AttnKernels::Tiled`], or dims the tensor-core kernel does not
    /// take).
    tc: bool,
}

struct Layer {
    in_norm: Dev<f32>,
    post_norm: Dev<f32>,
    mixer: Mixer,
    /// w_gu: [2I, H] = gate; up
    w_gu: Linear,
    /// w_down: [H, I]
    w_down: Linear,
}

// Sequence state and the memory ledger (`state`). Their behaviour is in that module.

/// Bytes of sequence state (and forward scratch) alive on the device, against an optional budget.
#[derive(Debug, Default)]
struct Ledger {
    live: AtomicUsize,
    /// 0: no budget.
    budget: AtomicUsize,
}

/// Bytes counted in a [`Ledger`] until dropped.
struct Charge {
    ledger: Arc<Ledger>,
    bytes: usize,
}

/// `t` with attention's arithmetic fitted to the KV caches: [`AttnArith::F16`] on f16 caches (`kv_f16`) whatever `t`
/// names, and 1xTF32 in its place on f32 caches.
fn fit_attn(mut t: TcArith, kv_f16: bool) -> TcArith {
    if kv_f16 {
        t.attn = AttnArith::F16;
    } else if t.attn == AttnArith::F16 {
        t.attn = AttnArith::Tf32;
    }
    t
}

/// Where every attention layer's K and V rows sit in one buffer of `cap` positions ([`KvBuf`], and the forward
/// scratch's rows for a tree's dropped children): layer a's K rows, [cap, HKV, D] values (f32, or f16 with
/// [`AttnArith::F16`]), at `cap · pre[a]` values, its V rows right after them.
struct KvLayout {
    /// Values per position of each attention layer's K (or V) rows, in layer order.
    rows: Vec<usize>,
    /// Values per position of the layers before each (K and V).
    pre: Vec<usize>,
    /// Values per position of every layer, K and V.
    per_pos: usize,
    /// Bytes per value: 2 (f16 caches) or 4 (f32). With 2, every offset and count in values is even (the head dim
    /// is a multiple of 8), so each is a whole number of the buffer's f32 words.
    bytes: usize,
}

/// Every attention layer's own K and V rows of one state, one allocation ([`KvLayout`]).
struct KvBuf {
    buf: CudaSlice<f32>,
    /// Positions it holds (0: none, the shared empty buffer).
    cap: usize,
    _charge: Option<Charge>,
}

/// The state of one sequence on the device.
pub struct CudaState {
    pos: usize,
    /// Every GDN layer's conv [K-1, cd] and recurrent [HV, DK, DV] state, f32, at the layer's offsets.
    rec: CudaSlice<f32>,
    /// Own KV rows: position `p` at row `p - base.1`. Positions below `base.1` are read from `base` (the cache of the
    /// state this one was forked from, shared and never written through here), so a fork copies no KV rows.
    kv: Arc<KvBuf>,
    base: Option<(Arc<KvBuf>, usize)>,
    _charge: Charge,
}

// Forward scratch, table and graph keys (`scratch`). Their behaviour is in that module.

/// What a forward's launches depend on besides the table's contents (graph key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    n: usize,
    nseg: usize,
    /// Segments `roots..nseg` continue one of `0..roots` ([`CudaModel::forward_tree`]); `nseg` in a plain batch.
    roots: usize,
    /// Whether the states of segments `roots..` are written (false: dropped after the forward).
    keep_children: bool,
    /// Segments `roots..` (if any) are each at most one gated delta chunk long, or with `invariant` some of them are
    /// ([`crate::gdn_tc::SegStates`]).
    short_children: bool,
    /// With `invariant`: some of segments `roots..` are longer than one chunk (they take the state pass, the short
    /// ones the leaf pass); else false.
    long_children: bool,
    /// The longest segment (1: every segment one token, the decode step).
    max_len: usize,
    /// Gated delta chunks over all segments (each segment's length in chunks of 64 tokens, rounded up, summed).
    chunks: usize,
    /// Key splits per tile of the tensor-core attention ([`crate::attn_tc::attention_tc_plan`] of the segments; 1
    /// when no layer runs it).
    attn_splits: usize,
    /// The projections on both planes (split mode; read once per forward).
    split: SplitGemms,
    /// A plain forward, or a decode step whose graph also holds the head ([`GreedyRun`]).
    step: Step,
    /// Batch-invariant launches ([`CudaModel::set_batch_invariant`]; read once per forward).
    invariant: bool,
}

/// What a forward's graph holds after the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// The layers alone (the final norm and the readout are launched apart).
    Forward,
    /// A greedy step: the id fed from the previous pick on the device, then the final norm, the head and the pick.
    Greedy,
    /// A sampled step whose logits go to the host: the final norm and the head's logits.
    Logits,
    /// A sampled step drawn on the device: the final norm, the head and the draw ([`crate::sample`]), which writes
    /// the next pick as a greedy step does.
    Sample(crate::sample::SampleMode),
}

/// Values per token row of the forward scratch buffers.
struct Widths {
    /// Split mode: the two halves of a residual GEMM's output ([2N, H]).
    fold: usize,
    /// A rotated pack: the normed input as it is, beside its rotation in `act` (H; 0 otherwise).
    actu: usize,
    /// A rotated pack: the f32 output of a mixer or the SwiGLU before its rotation into `act` (0 otherwise).
    rot: usize,
    proj: usize,
    mid: usize,
    act: usize,
    gates: usize,
    wy: usize,
}

/// One forward's device buffers (see [`CudaModel::scratch`]).
struct Scratch {
    rows: usize,
    /// Bytes charged to the budget for the activation buffers (the table and the attention scratch apart).
    bytes: usize,
    /// The forward's table ([`CudaModel::table`]; grown on demand, apart from the rest: it depends on the
    /// segment count and the layers, not only on the rows).
    table: Growing<u8>,
    x: CudaSlice<f32>,
    act: CudaSlice<f32>,
    proj: CudaSlice<f32>,
    mid: CudaSlice<f32>,
    gates: CudaSlice<f32>,
    wy: CudaSlice<f32>,
    fold: CudaSlice<f32>,
    actu: CudaSlice<f32>,
    rot: CudaSlice<f32>,
    /// Partial results of the tensor-core attention's key splits (grown on demand).
    attn: Growing<f32>,
    /// The KV rows of a tree's children whose states are dropped ([`KvLayout`]; grown on demand).
    kv: Growing<f32>,
    _charge: Charge,
}

/// A device buffer of the persistent scratch that grows on demand, charged to the budget for what it holds.
struct Growing<T> {
    buf: CudaSlice<T>,
    /// Values it holds (0 while a failed reservation left it uncharged).
    len: usize,
    _charge: Option<Charge>,
}

/// Device addresses one forward's launches use.
struct FwdPtrs {
    ptrs: u64,
    ids: u64,
    segs: u64,
    tok: u64,
    par: u64,
    x: u64,
    act: u64,
    proj: u64,
    mid: u64,
    gates: u64,
    wy: u64,
    fold: u64,
    actu: u64,
    rot: u64,
    attn: u64,
}

/// Byte offsets of one forward's table ([`CudaModel::table`] writes it, [`Scratch::ptrs`] addresses it): the
/// state address table (one u64 per entry: [`GDN_ENTRIES`] per segment of a gated delta layer, [`KV_ENTRIES`] per
/// segment of an attention layer), then ids [N] | segs [S, 3] | tok [N, 2] | par [S] (i32).
struct TableLayout {
    ids: usize,
    segs: usize,
    tok: usize,
    par: usize,
    len: usize,
}

/// Graphs by shape, and how often each shape was seen.
#[derive(Default)]
struct GraphCache {
    graphs: Vec<(Shape, Graph)>,
    seen: std::collections::HashMap<Shape, u32>,
}

// Host timing (`profile`). Their behaviour is in that module.

/// Host nanoseconds of forward queueing by phase ([`CudaModel::host_phases`]; the states' share is what the total
/// leaves).
#[derive(Default)]
struct PhaseNs {
    /// The table, written and uploaded (with the children's KV scratch it names).
    table: AtomicU64,
    /// The layers' launches, or one graph launch.
    launch: AtomicU64,
    /// The output buffer and the final norm.
    out: AtomicU64,
}
/// A model on one GPU.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    prec: Precision,
    /// Why `prec` is not the precision asked for ([`CudaModel::precision_fallback`]).
    fallback: Option<String>,
    /// embed: [V, H]
    embed: Weight,
    /// lm_head: [V, H]; None when tied to the embedding.
    lm_head: Option<Weight>,
    /// A rotated pack's embedding signs (the rows are un-rotated after the gather) and head signs (the final hidden
    /// rows are rotated before the head).
    embed_rot: Option<Dev<f32>>,
    head_rot: Option<Dev<f32>>,
    /// Whether any weight is folded with a Hadamard rotation (then no residual add is deferred into a norm).
    rotated: bool,
    /// The dequantisation scratch of the block-format prefill GEMMs ([`crate::qgemm::DEQUANT_BYTES`]; a model
    /// with block-format weights only).
    dequant: Option<CudaSlice<u8>>,
    final_norm: Dev<f32>,
    eps: f32,
    layers: Vec<Layer>,
    hid: usize,
    inter: usize,
    vocab: usize,
    max_pos: usize,
    /// f32 values of every GDN layer's conv and recurrent state (one [`CudaState::rec`] buffer).
    rec_len: usize,
    /// Where each attention layer's K and V rows sit in a state's KV buffer.
    kv: KvLayout,
    ledger: Arc<Ledger>,
    /// Events after each op while profiling (see [`CudaModel::profile_start`]).
    prof: Recorder<(&'static str, CudaEvent)>,
    /// Host nanoseconds spent queueing forwards (no forward waits for the GPU), see [`CudaModel::host_enqueue_ns`].
    enqueue_ns: AtomicU64,
    /// Parts of `enqueue_ns` ([`CudaModel::host_phases`]).
    phase_ns: PhaseNs,
    /// While set ([`CudaModel::span_start`]): per forward, events around its GPU work (table upload to final norm).
    spans: Recorder<(CudaEvent, CudaEvent)>,
    /// Forwards [`CudaModel::forward_tree`] ran with children in them.
    trees: AtomicU64,
    /// CUDA graph launches ([`CudaModel::graph_launches`]).
    graph_runs: AtomicU64,
    /// The own KV rows of every state that has none yet (shared: a fork allocates no KV memory until it appends).
    empty_kv: Arc<KvBuf>,
    /// The persistent forward scratch (forwards of up to [`ARENA_ROWS`] rows).
    arena: Mutex<Option<Scratch>>,
    graphs: Mutex<GraphCache>,
    /// The fixed buffers of greedy decoding (one decode at a time takes them; see [`GreedyRun`]).
    decode: Mutex<Option<decode::DecodeBufs>>,
    /// The gated delta rule on tensor cores (else the f32 SIMT kernels: [`GdnKernels::Simt`]).
    gdn_tc: bool,
    /// A tree's one-chunk children whose states are dropped take `gdn_tc_leaf` ([`GdnKernels::TensorCoreNoLeaf`]: the
    /// state pass, for comparison).
    gdn_leaf: bool,
    /// Fewest ids of a root that [`CudaModel::forward_tree`] continues in the same forward (`None`: it never does:
    /// [`GdnKernels::Simt`], or a GDN layer the tensor-core state pass does not take). At least 2 (so a tree never runs the
    /// one-token path) and every GDN layer's conv kernel − 1 (a child's conv reads only its root's rows).
    tree_min_root: Option<usize>,
    /// [`CudaModel::forward_tree`] runs trees ([`CudaOptions::trees`] or [`CudaModel::set_tree`] turn it off: the
    /// two-pass path, for comparison).
    tree_on: std::sync::atomic::AtomicBool,
    /// CUDA graphs for repeated shapes ([`CudaOptions::graphs`] turns them off; a failed capture too).
    use_graphs: std::sync::atomic::AtomicBool,
    /// Forwards padded to buckets of rows ([`CudaOptions::shape_buckets`], [`CudaModel::pad_for`]).
    buckets: std::sync::atomic::AtomicBool,
    /// The pad root's state between plain padded forwards ([`CudaModel::take_pad_state`]).
    pad_state: Mutex<Option<CudaState>>,
    /// How the tensor-core kernels multiply ([`CudaModel::set_tc_arith`]; the precision's default).
    tc: Mutex<TcArith>,
    /// The projections that multiply both planes in split mode ([`CudaModel::set_split_gemms`]).
    split: Mutex<SplitGemms>,
    /// Batch invariance ([`CudaModel::set_batch_invariant`]).
    invariant: std::sync::atomic::AtomicBool,
}

/// Final-normed hidden rows on the device. hidden: [N, H] f32
pub struct CudaHidden {
    buf: CudaSlice<f32>,
    pub rows: usize,
    pub hid: usize,
}

impl CudaModel {
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn precision(&self) -> Precision {
        self.prec
    }

    /// Why the model runs in [`CudaModel::precision`] instead of the precision its options asked for (the half
    /// precision falls back to mixed on a model it does not fit), as a sentence for users; `None` when it runs as
    /// asked. The caller says it where the precision was the user's choice (the default's fallback is silent).
    pub fn precision_fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    pub fn hidden_size(&self) -> usize {
        self.hid
    }

    /// Longest sequence a state may hold (`max_position_embeddings`); a longer forward is refused.
    pub fn max_positions(&self) -> usize {
        self.max_pos
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Device bytes of the weight matrices (in split precision the input projections are stored twice).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.w_gu.bytes()
                    + l.w_down.bytes()
                    + match &l.mixer {
                        Mixer::Gdn(m) => m.w_in.bytes() + m.w_out.bytes(),
                        Mixer::Attn(m) => m.w_in.bytes() + m.w_o.bytes(),
                    }
            })
            .sum();
        self.embed.bytes() + self.lm_head.as_ref().map_or(0, Weight::bytes) + layers
    }

    /// Bytes of KV cache per token (all attention layers, k and v).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv.bytes * self.kv.per_pos
    }

    /// Whether the KV caches hold f16 values ([`AttnArith::F16`]), else f32.
    pub fn kv_f16(&self) -> bool {
        self.kv.bytes == 2
    }

    /// Bytes of one fresh state (the recurrent state of every GDN layer).
    pub fn fresh_state_bytes(&self) -> usize {
        4 * self.rec_len
    }

    /// Caps the device bytes of sequence state and forward scratch alive at once (0: no cap). Past it,
    /// `new_state`, `fork` and `forward_batch` fail with [`CudaError::Budget`]; nothing is allocated.
    pub fn set_memory_budget(&self, bytes: usize) {
        self.ledger.budget.store(bytes, Ordering::Relaxed);
    }

    /// Bytes of the persistent forward scratch (kept between forwards of up to 4,096 rows; part of
    /// [`CudaModel::memory_in_use`]).
    pub fn scratch_reserved(&self) -> usize {
        self.arena
            .lock()
            .map(|a| {
                a.as_ref().map_or(0, |a| {
                    a.bytes + a.table.bytes() + a.attn.bytes() + a.kv.bytes()
                })
            })
            .unwrap_or(0)
    }

    /// Bytes of state and scratch alive now (as counted against the budget).
    pub fn memory_in_use(&self) -> usize {
        self.ledger.live.load(Ordering::Relaxed)
    }

    /// How the tensor-core kernels multiply from the next forward on (captured graphs are dropped).
    /// Attention's arithmetic follows the KV caches, fixed at upload ([`fit_attn`]).
    pub fn set_tc_arith(&self, t: TcArith) {
        *self.tc.lock().unwrap_or_else(|e| e.into_inner()) = fit_attn(t, self.kv_f16());
        self.drop_graphs();
    }

    /// How the tensor-core kernels multiply.
    pub fn tc_arith(&self) -> TcArith {
        *self.tc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Which projections multiply both planes of their input with [`GemmInputs::Split`] (split and mixed precision)
    /// from the next forward on (captured graphs are dropped); no effect in the other precisions (the half
    /// precision's are fixed at upload, [`crate::CudaOptions::split_gemms`]).
    pub fn set_split_gemms(&self, s: SplitGemms) {
        *self.split.lock().unwrap_or_else(|e| e.into_inner()) = s;
        self.drop_graphs();
    }

    /// The projections that multiply both planes in mixed and split precision ([`CudaModel::set_split_gemms`]).
    pub fn split_gemms(&self) -> SplitGemms {
        *self.split.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In the half precision, the residual projections that multiply both bf16 planes instead of f16 in some layer
    /// (named by [`crate::CudaOptions::split_gemms`] at upload, or stored in a block format); none in the other
    /// precisions.
    pub fn half_planes(&self) -> SplitGemms {
        if self.prec != Precision::Half {
            return SplitGemms::NONE;
        }
        let kept: Vec<Projection> = self
            .residual_linears()
            .filter(|(_, lin)| lin.f16_exp.is_none())
            .map(|(p, _)| p)
            .collect();
        SplitGemms::of(&kept)
    }

    /// Every layer's residual projections (the mixer's output projection, the MLP's down) with their weights.
    fn residual_linears(&self) -> impl Iterator<Item = (Projection, &Linear)> {
        self.layers.iter().flat_map(|l| {
            let out = match &l.mixer {
                Mixer::Gdn(m) => (Projection::GdnOut, &m.w_out),
                Mixer::Attn(m) => (Projection::AttnOut, &m.w_o),
            };
            [out, (Projection::MlpOut, &l.w_down)]
        })
    }

    /// Turns CUDA graphs for repeated forward shapes on or off (at first: [`CudaOptions::graphs`]).
    pub fn set_graphs(&self, on: bool) {
        self.use_graphs.store(on, Ordering::Relaxed);
        self.drop_graphs();
    }

    /// Pads forwards to buckets of rows from the next forward on, or stops (at first: [`CudaOptions::shape_buckets`]):
    /// a forward that fits the persistent scratch runs at its bucket's rows, the pad rows after the caller's and
    /// never read (one more root, more ids of a tree's last dropped child, or one more such child:
    /// [`CudaModel::pad_for`]), so forwards of lengths not seen before share a bucket's graph. Whether or not graphs
    /// are on, so that a replay and a direct run of a forward give the same bits.
    pub fn set_shape_buckets(&self, on: bool) {
        self.buckets.store(on, Ordering::Relaxed);
    }

    /// Whether forwards are padded to buckets of rows ([`CudaModel::set_shape_buckets`]).
    pub fn shape_buckets(&self) -> bool {
        self.buckets.load(Ordering::Relaxed)
    }

    /// Forgets every captured graph (their scratch addresses changed, or graphs were switched).
    fn drop_graphs(&self) {
        self.graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// CUDA graph launches since load (captures launched and replays).
    pub fn graph_launches(&self) -> u64 {
        self.graph_runs.load(Ordering::Relaxed)
    }

    /// Whether forwards may replay CUDA graphs (off after a capture failed).
    pub fn graphs_on(&self) -> bool {
        self.use_graphs.load(Ordering::Relaxed)
    }

    /// Turns one-forward trees on or off ([`CudaModel::forward_tree`] then answers `None`: the caller's two-pass path).
    pub fn set_tree(&self, on: bool) {
        self.tree_on.store(on, Ordering::Relaxed);
    }

    /// Bytes [`CudaModel::forward_tree`] allocates and charges for a child whose state is not kept, besides the KV rows
    /// it appends (the engine's fork budget): none (its KV rows live in the forward scratch, and it has no recurrent
    /// state: the forward's table names its root's, which nothing writes for it).
    pub fn tree_child_bytes(&self) -> usize {
        0
    }

    /// Fewest ids a root with children may have in [`CudaModel::forward_tree`] (max(2, K − 1) over the GDN layers'
    /// conv kernels; `None` when it runs no trees).
    pub fn tree_min_root(&self) -> Option<usize> {
        self.tree_min_root
    }

    /// Whether [`CudaModel::forward_tree`] runs trees at all (else it always answers `None`).
    pub fn runs_trees(&self) -> bool {
        self.tree_min_root.is_some() && self.tree_on.load(Ordering::Relaxed)
    }

    /// Batch invariance on or off from the next forward on: with it, a segment's results do not depend on the other
    /// segments of its forward (docs/cuda.md, "Batch invariance"): every projection of a forward of more than one row
    /// runs one cuBLASLt algorithm per shape for every row count, split-K off ([`crate::gemm_lt`]; no few-row GEMV);
    /// the attention's key splits per tile follow from the tile's own segment alone
    /// ([`crate::attn_tc::attention_tc_segment_splits`]); each tree child takes the leaf pass or the state pass by its
    /// own length. Turning it on opens cuBLASLt ([`crate::gemm_lt::prepare`]; where that fails the GEMMs fall back to
    /// GemmEx and count in [`crate::gemm_lt::fallbacks`]).
    pub fn set_batch_invariant(&self, on: bool) {
        if on {
            if let Err(e) = crate::gemm_lt::prepare(&self.gpu) {
                eprintln!("onepass: batch-invariant GEMMs unavailable ({e}); cublasGemmEx instead");
            }
        }
        self.invariant.store(on, Ordering::Relaxed);
    }

    /// Whether forwards are batch-invariant ([`CudaModel::set_batch_invariant`]).
    pub fn batch_invariant(&self) -> bool {
        self.invariant.load(Ordering::Relaxed)
    }

    /// Forwards that ran children with their roots ([`CudaModel::forward_tree`]) since load.
    pub fn tree_forwards(&self) -> u64 {
        self.trees.load(Ordering::Relaxed)
    }
}

impl CudaHidden {
    /// Copies the rows to the host. → [N, H]
    pub fn to_host(&self, g: &Gpu) -> Result<Vec<f32>, CudaError> {
        g.download(&self.buf, self.rows * self.hid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention's arithmetic follows the caches: f16 caches run F16 whatever was asked, f32 caches never do (1xTF32
    /// in its place), every other choice and the gated delta kernels' stay.
    #[test]
    fn attention_arithmetic_follows_the_kv_caches() {
        let f16_asked = TcArith {
            attn: AttnArith::F16,
            ..TcArith::all(Arith::X3)
        };
        assert_eq!(fit_attn(f16_asked, true), f16_asked);
        assert_eq!(fit_attn(f16_asked, false).attn, AttnArith::Tf32);
        assert_eq!(fit_attn(f16_asked, false).state, Arith::X3);
        let bf = TcArith {
            attn: AttnArith::Bf16x3,
            ..TcArith::all(Arith::Tf32)
        };
        assert_eq!(fit_attn(bf, false), bf);
        assert_eq!(fit_attn(bf, true).attn, AttnArith::F16);
        assert_eq!(fit_attn(bf, true).prep, Arith::Tf32);
    }
}
