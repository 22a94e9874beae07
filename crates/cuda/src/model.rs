//! The Qwen3.5 hybrid forward on one GPU, the twin of `onepass_model::Model::forward_batch`.
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaSlice};
use half::bf16;
use onepass_model::{LayerKind, MixerView, Model, ModelError};
use onepass_tensor::{Tensor, View};

use crate::ops::{self, AttnDims, GdnDims, Out, KV_ENTRIES, W};
use crate::options::{AttnKernels, CudaOptions, GdnKernels};
use crate::runtime::{Arith, AttnArith, Gpu, TcArith};
use crate::CudaError;

/// The arithmetic of the projections (GEMMs) and their inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// bf16 weights; each GEMM input (f32) split into two bf16 planes, hi + lo, both multiplied (f32
    /// accumulation): activations carried to about 2^-16 instead of bf16's 2^-8, at twice the GEMM work. The input
    /// projections run one GEMM over K = 2K (`[hi | lo]` rows times their weight stored twice per row, `[W | W]`),
    /// the residual ones one GEMM of 2N rows whose halves the next norm adds ([`SplitGemms`] picks the projections
    /// that take both planes). Attention's products the same way (bf16x3), the gated delta rule's in 3xTF32. The
    /// default: on the synthetic checkpoints plain bf16 inputs miss the System One ship bar (docs/cuda.md).
    #[default]
    Bf16Split,
    /// bf16 weights and GEMM inputs, f32 accumulation, and the tensor-core kernels (gated delta rule,
    /// attention) in 1xTF32 ([`TcArith::for_precision`]); norms, gates and the recurrent state f32. The fastest.
    Bf16,
    /// f32 weights and GEMM inputs, f32 GEMMs without TF32: the CPU model's arithmetic up to reduction
    /// order. For checking the forward (tests hold it to 1e-4 of the CPU), not for speed.
    F32,
}

/// The projections of a layer, as [`SplitGemms`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projection {
    /// The gated delta layer's input projection (q, k, v, z, a, b).
    GdnIn = 0,
    /// The gated delta layer's output projection.
    GdnOut = 1,
    /// The attention layer's q|gate, k, v projection.
    AttnIn = 2,
    /// The attention layer's output projection.
    AttnOut = 3,
    /// The MLP's gate|up projection.
    MlpIn = 4,
    /// The MLP's down projection.
    MlpOut = 5,
}

impl Projection {
    pub const ALL: [Projection; 6] = [
        Projection::GdnIn,
        Projection::GdnOut,
        Projection::AttnIn,
        Projection::AttnOut,
        Projection::MlpIn,
        Projection::MlpOut,
    ];

    /// Its name in `--gpu-split-gemms` and device descriptions.
    pub const fn name(self) -> &'static str {
        match self {
            Projection::GdnIn => "gdn_in",
            Projection::GdnOut => "gdn_out",
            Projection::AttnIn => "attn_in",
            Projection::AttnOut => "attn_out",
            Projection::MlpIn => "mlp_in",
            Projection::MlpOut => "mlp_out",
        }
    }
}

/// Which projections multiply both bf16 planes of their input in [`Precision::Bf16Split`]; the others multiply the
/// hi plane alone (a plain bf16 GEMM: half the work, the input rounded to bf16 as in [`Precision::Bf16`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitGemms(u8);

/// A `--gpu-split-gemms` spec [`SplitGemms::parse`] does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?}: expected all, none, or projections (comma-separated): gdn_in, gdn_out, attn_in, attn_out, mlp_in, \
     mlp_out"
)]
pub struct SplitGemmsError(pub String);

impl Default for SplitGemms {
    fn default() -> Self {
        SplitGemms::ALL
    }
}

impl SplitGemms {
    /// Every projection on both planes.
    pub const ALL: SplitGemms = SplitGemms(0x3f);
    /// None: every GEMM input rounded to bf16.
    pub const NONE: SplitGemms = SplitGemms(0);

    pub fn of(ps: &[Projection]) -> Self {
        SplitGemms(ps.iter().fold(0, |m, p| m | 1 << *p as u8))
    }

    pub fn has(self, p: Projection) -> bool {
        self.0 & 1 << p as u8 != 0
    }

    /// `all`, `none`, or a comma-separated list of [`Projection`] names.
    pub fn parse(spec: &str) -> Result<Self, SplitGemmsError> {
        match spec.trim() {
            "all" => return Ok(SplitGemms::ALL),
            "none" => return Ok(SplitGemms::NONE),
            _ => {}
        }
        let ps = spec
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|part| {
                Projection::ALL
                    .into_iter()
                    .find(|p| p.name() == part)
                    .ok_or_else(|| SplitGemmsError(part.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SplitGemms::of(&ps))
    }

    /// For a device description: "all", "none", or the names.
    pub fn describe(self) -> String {
        match self {
            SplitGemms::ALL => "all".into(),
            SplitGemms::NONE => "none".into(),
            s => Projection::ALL
                .into_iter()
                .filter(|p| s.has(*p))
                .map(Projection::name)
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

impl TcArith {
    /// The default for a precision:
    /// - f32: 3xTF32 everywhere (f32 accuracy; the mode checks the forward against the CPU).
    /// - split: the gated delta kernels in 3xTF32, attention in bf16x3, which carries its operands as the split
    ///   GEMMs carry theirs (about 2^-17) and is the faster of the two high-precision attentions (H200, 3,400-token
    ///   prefix: 782 µs against 1,030; the bf16 twins' answers 5.78e-5 against 5.84e-5 max |dp| in the same run).
    /// - bf16: 1xTF32 everywhere (its point is speed; 1xTF32 attention, 584 µs there, beats one bf16 product, 618,
    ///   whose per-tile conversion costs more than the halved mma count saves). Measured (fifth measurement,
    ///   docs/benchmarks/cuda-systemone.md): 1xTF32 kernels take split-mode requests from 4.98 / 10.61 / 37.86 to
    ///   4.64 / 9.14 / 32.39 ms and the bf16 twins' answers from max |dp| 5.9e-5 to 2.6e-3 (mean 1.3e-5 to 6.4e-4).
    pub fn for_precision(p: Precision) -> Self {
        match p {
            Precision::Bf16 => TcArith::all(Arith::Tf32),
            Precision::Bf16Split => TcArith {
                attn: AttnArith::Bf16x3,
                ..TcArith::all(Arith::X3)
            },
            Precision::F32 => TcArith::all(Arith::X3),
        }
    }
}

/// A device buffer with its address.
struct Dev<T> {
    /// Owns the memory `ptr` points into.
    _buf: CudaSlice<T>,
    ptr: u64,
}

impl<T: cudarc::driver::DeviceRepr> Dev<T> {
    fn new(g: &Gpu, buf: CudaSlice<T>) -> Self {
        let ptr = g.ptr(&buf);
        Dev { _buf: buf, ptr }
    }
}

fn upload_f32(g: &Gpu, v: &[f32]) -> Result<Dev<f32>, CudaError> {
    Ok(Dev::new(g, g.upload(v)?))
}

/// Appends a weight's values as bf16 bits.
fn push_bf16(out: &mut Vec<u16>, t: &Tensor) {
    match t.view() {
        View::BF16(v) => out.extend(v.iter().map(|x| x.to_bits())),
        _ => out.extend(t.to_f32_vec().iter().map(|x| bf16::from_f32(*x).to_bits())),
    }
}

/// A weight matrix on the device, in the model's precision.
struct Weight {
    /// Owns the memory `w` points into.
    _buf: WeightBuf,
    w: W,
    /// Row stride in elements: the column count K, or 2K where every row is stored twice (`[W | W]`, an input
    /// projection in [`Precision::Bf16Split`]: one GEMM over K = 2K multiplies both planes of its input).
    ld: usize,
}

/// The device memory a [`Weight`]'s `w` points into.
enum WeightBuf {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

impl Weight {
    /// Device bytes.
    fn bytes(&self) -> usize {
        match &self._buf {
            WeightBuf::Bf16(b) => 2 * b.len(),
            WeightBuf::F32(b) => 4 * b.len(),
        }
    }
}

/// Uploads weights stacked by rows (all with the same column count) as one matrix: bf16, or f32 (the
/// checkpoint's values exactly) in [`Precision::F32`]. `twice` (bf16): every row stored twice, `[W | W]`.
fn upload_stacked(
    g: &Gpu,
    parts: &[&Tensor],
    prec: Precision,
    twice: bool,
) -> Result<Weight, CudaError> {
    let total: usize = parts.iter().map(|t| t.numel()).sum();
    let cols = parts
        .first()
        .and_then(|t| t.shape().last().copied())
        .unwrap_or(0);
    Ok(match prec {
        Precision::Bf16 | Precision::Bf16Split => {
            let mut host = Vec::with_capacity(total);
            for t in parts {
                push_bf16(&mut host, t);
            }
            if twice && cols > 0 {
                host = host
                    .chunks(cols)
                    .flat_map(|row| row.iter().chain(row).copied())
                    .collect();
            }
            let buf = g.upload(&host)?;
            let w = W::Bf16(g.ptr(&buf));
            Weight {
                _buf: WeightBuf::Bf16(buf),
                w,
                ld: if twice { 2 * cols } else { cols },
            }
        }
        Precision::F32 => {
            let mut host = Vec::with_capacity(total);
            for t in parts {
                host.extend(t.to_f32_vec());
            }
            let buf = g.upload(&host)?;
            let w = W::F32(g.ptr(&buf));
            Weight {
                _buf: WeightBuf::F32(buf),
                w,
                ld: cols,
            }
        }
    })
}

/// Bytes of sequence state (and forward scratch) alive on the device, against an optional budget.
#[derive(Debug, Default)]
struct Ledger {
    live: AtomicUsize,
    /// 0: no budget.
    budget: AtomicUsize,
}

impl Ledger {
    /// Counts `bytes` more, or fails (counting nothing) when that would pass the budget.
    fn charge(self: &Arc<Self>, bytes: usize, what: &str) -> Result<Charge, CudaError> {
        let budget = self.budget.load(Ordering::Relaxed);
        let prev = self.live.fetch_add(bytes, Ordering::Relaxed);
        if budget > 0 && prev + bytes > budget {
            self.live.fetch_sub(bytes, Ordering::Relaxed);
            return Err(CudaError::Budget {
                what: what.to_string(),
                need: bytes,
                live: prev,
                budget,
            });
        }
        Ok(Charge {
            ledger: self.clone(),
            bytes,
        })
    }
}

/// Bytes counted in a [`Ledger`] until dropped.
struct Charge {
    ledger: Arc<Ledger>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger.live.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

struct GdnLayer {
    /// w_in: [cd + HV*DV + 2*HV, H] = in_proj_qkv; in_proj_z; in_proj_a; in_proj_b
    w_in: Weight,
    /// w_out: [H, HV*DV]
    w_out: Weight,
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

impl GdnLayer {
    fn proj_width(&self) -> usize {
        self.cd + self.d.hv * self.d.dv + 2 * self.d.hv
    }
}

struct AttnLayer {
    /// w_in: [H*2D + 2*HKV*D, hidden] = q_proj (q|gate per head); k_proj; v_proj
    w_in: Weight,
    /// w_o: [hidden, H*D]
    w_o: Weight,
    q_norm: Dev<f32>,
    k_norm: Dev<f32>,
    inv_freq: Dev<f32>,
    a: AttnDims,
    eps: f32,
    /// Runs `attention_tc` (else `attention_tiled`: [`AttnKernels::Tiled`], or dims the tensor-core kernel does not
    /// take).
    tc: bool,
}

impl AttnLayer {
    fn proj_width(&self) -> usize {
        let a = self.a;
        a.heads * 2 * a.head_dim + 2 * a.kv_heads * a.head_dim
    }
}

enum Mixer {
    Gdn(GdnLayer),
    Attn(AttnLayer),
}

struct Layer {
    in_norm: Dev<f32>,
    post_norm: Dev<f32>,
    mixer: Mixer,
    /// w_gu: [2I, H] = gate; up
    w_gu: Weight,
    /// w_down: [H, I]
    w_down: Weight,
}

/// Forwards of at most this many token rows run in the persistent scratch (and may replay CUDA graphs); larger
/// ones allocate their scratch per call (launch costs are small next to their work).
const ARENA_ROWS: usize = 4096;
/// Captured graphs kept (least recently captured dropped first).
const GRAPHS_KEPT: usize = 64;
/// Addresses per segment of a GDN layer in the forward's table: conv state, recurrent state, and the recurrent state
/// the segment starts from (its own, or its parent's in [`CudaModel::forward_tree`]).
const GDN_ENTRIES: usize = 3;

/// What a forward's launches depend on besides the table's contents (graph key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    n: usize,
    nseg: usize,
    /// Segments `roots..nseg` continue one of `0..roots` ([`CudaModel::forward_tree`]); `nseg` in a plain batch.
    roots: usize,
    /// Whether the states of segments `roots..` are written (false: dropped after the forward).
    keep_children: bool,
    /// Segments `roots..` (if any) are each at most one gated delta chunk long ([`crate::gdn_tc::SegStates`]).
    short_children: bool,
    /// The longest segment (1: every segment one token, the decode step).
    max_len: usize,
    /// Key splits per tile of the tensor-core attention ([`crate::attn_tc::attention_tc_plan`] of the segments; 1
    /// when no layer runs it).
    attn_splits: usize,
    /// The projections on both planes (split mode; read once per forward).
    split: SplitGemms,
}

/// Values per token row of the forward scratch buffers.
struct Widths {
    /// Split mode: the two halves of a residual GEMM's output ([2N, H]).
    fold: usize,
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

impl<T: cudarc::driver::DeviceRepr> Growing<T> {
    /// A buffer of `len` values, charged as `what`.
    fn new(m: &CudaModel, len: usize, what: &str) -> Result<Self, CudaError> {
        let mut b = Growing {
            buf: m.gpu.alloc(1)?,
            len: 0,
            _charge: None,
        };
        if len > 0 {
            b.reserve(m, len, what)?;
        }
        Ok(b)
    }

    /// Bytes charged for it.
    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Makes room for `len` values (the next power of two). The old charge goes first, so the budget never holds
    /// both; a failed charge leaves the buffer counted empty, to be reserved again. → whether the buffer moved
    fn reserve(&mut self, m: &CudaModel, len: usize, what: &str) -> Result<bool, CudaError> {
        if len <= self.len {
            return Ok(false);
        }
        let len = len.next_power_of_two();
        self._charge = None;
        self.len = 0;
        self._charge = Some(m.ledger.charge(len * std::mem::size_of::<T>(), what)?);
        self.buf = m.gpu.alloc(len)?;
        self.len = len;
        Ok(true)
    }
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

impl TableLayout {
    fn new(layers: &[Layer], n: usize, nseg: usize) -> Self {
        let entries: usize = layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Gdn(_) => GDN_ENTRIES * nseg,
                Mixer::Attn(_) => KV_ENTRIES * nseg,
            })
            .sum();
        let ids = 8 * entries;
        let segs = ids + 4 * n;
        let tok = segs + 4 * 3 * nseg;
        let par = tok + 4 * 2 * n;
        TableLayout {
            ids,
            segs,
            tok,
            par,
            len: par + 4 * nseg,
        }
    }
}

impl Scratch {
    fn ptrs(&self, m: &CudaModel, s: Shape) -> FwdPtrs {
        let g = &*m.gpu;
        let t = TableLayout::new(&m.layers, s.n, s.nseg);
        let ptrs = g.ptr(&self.table.buf);
        FwdPtrs {
            ptrs,
            ids: ptrs + t.ids as u64,
            segs: ptrs + t.segs as u64,
            tok: ptrs + t.tok as u64,
            par: ptrs + t.par as u64,
            x: g.ptr(&self.x),
            act: g.ptr(&self.act),
            proj: g.ptr(&self.proj),
            mid: g.ptr(&self.mid),
            gates: g.ptr(&self.gates),
            wy: g.ptr(&self.wy),
            fold: g.ptr(&self.fold),
            attn: g.ptr(&self.attn.buf),
        }
    }
}

/// An instantiated graph. SAFETY of Send: graphs are only touched under [`CudaModel::graphs`]'s mutex (CUDA
/// requires graph calls on one object to be serialised, not to stay on one thread).
struct Graph(cudarc::driver::CudaGraph);
unsafe impl Send for Graph {}

/// Graphs by shape, and how often each shape was seen.
#[derive(Default)]
struct GraphCache {
    graphs: Vec<(Shape, Graph)>,
    seen: std::collections::HashMap<Shape, u32>,
}

impl GraphCache {
    fn get(&self, s: &Shape) -> Option<&cudarc::driver::CudaGraph> {
        self.graphs.iter().find(|(k, _)| k == s).map(|(_, g)| &g.0)
    }

    /// Counts one more sight of `s`. → sights so far
    fn note(&mut self, s: Shape) -> u32 {
        if self.seen.len() > 4096 {
            self.seen.clear();
        }
        let c = self.seen.entry(s).or_insert(0);
        *c += 1;
        *c
    }

    fn insert(&mut self, s: Shape, g: cudarc::driver::CudaGraph) {
        if self.graphs.len() >= GRAPHS_KEPT {
            self.graphs.remove(0);
        }
        self.graphs.push((s, Graph(g)));
    }

    fn clear(&mut self) {
        self.graphs.clear();
        self.seen.clear();
    }
}

/// A model on one GPU.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    prec: Precision,
    /// embed: [V, H]
    embed: Weight,
    /// lm_head: [V, H]; None when tied to the embedding.
    lm_head: Option<Weight>,
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
    /// How the tensor-core kernels multiply ([`CudaModel::set_tc_arith`]; the precision's default).
    tc: Mutex<TcArith>,
    /// The projections that multiply both planes in split mode ([`CudaModel::set_split_gemms`]).
    split: Mutex<SplitGemms>,
}

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

/// What a forward records while asked to (the profiling marks, the forward spans): `start` turns it on, `take` off,
/// with what it holds.
struct Recorder<T>(Mutex<Option<Vec<T>>>);

impl<T> Default for Recorder<T> {
    fn default() -> Self {
        Recorder(Mutex::new(None))
    }
}

impl<T> Recorder<T> {
    fn start(&self) {
        if let Ok(mut r) = self.0.lock() {
            *r = Some(Vec::new());
        }
    }

    fn take(&self) -> Vec<T> {
        self.0
            .lock()
            .ok()
            .and_then(|mut r| r.take())
            .unwrap_or_default()
    }

    fn on(&self) -> bool {
        self.0.lock().is_ok_and(|r| r.is_some())
    }

    /// Keeps `x` while on.
    fn push(&self, x: T) {
        if let Ok(mut r) = self.0.lock() {
            if let Some(v) = r.as_mut() {
                v.push(x);
            }
        }
    }
}

/// Milliseconds between two recorded events (the GPU has passed both).
fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f64, CudaError> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(|err| CudaError::Driver {
            op: "event elapsed",
            err,
        })
}

/// Runs `f`, adding the host nanoseconds it took to `ns`.
fn timed<R>(ns: &AtomicU64, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Where every attention layer's K and V rows sit in one buffer of `cap` positions ([`KvBuf`], and the forward
/// scratch's rows for a tree's dropped children): layer a's K rows, [cap, HKV, D] f32, at `cap · pre[a]` floats,
/// its V rows right after them.
struct KvLayout {
    /// Floats per position of each attention layer's K (or V) rows, in layer order.
    rows: Vec<usize>,
    /// Floats per position of the layers before each (K and V).
    pre: Vec<usize>,
    /// Floats per position of every layer, K and V.
    per_pos: usize,
}

impl KvLayout {
    fn new(rows: Vec<usize>) -> Self {
        let pre = rows
            .iter()
            .scan(0, |acc, r| {
                let at = *acc;
                *acc += 2 * r;
                Some(at)
            })
            .collect();
        let per_pos = 2 * rows.iter().sum::<usize>();
        KvLayout { rows, pre, per_pos }
    }

    /// Float offsets of layer `a`'s K and V rows in a buffer of `cap` positions.
    fn offsets(&self, cap: usize, a: usize) -> (usize, usize) {
        let k = cap * self.pre[a];
        (k, k + cap * self.rows[a])
    }
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

impl CudaState {
    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Device bytes this state holds itself (a forked-from KV base it shares is not counted).
    pub fn bytes(&self) -> usize {
        let own = if self.kv.cap > 0 {
            self.kv.buf.len()
        } else {
            0
        };
        4 * (self.rec.len() + own)
    }

    fn base_len(&self) -> usize {
        self.base.as_ref().map_or(0, |b| b.1)
    }
}

/// Final-normed hidden rows on the device. hidden: [N, H] f32
pub struct CudaHidden {
    buf: CudaSlice<f32>,
    pub rows: usize,
    pub hid: usize,
}

impl CudaModel {
    /// Uploads a loaded CPU model's weights to device `ordinal` (bf16, the other options their defaults, no memory
    /// cap).
    pub fn from_model(m: &Model, ordinal: usize) -> Result<Self, CudaError> {
        let gpu = Gpu::new(ordinal)?;
        Self::with_precision(m, gpu, Precision::Bf16)
    }

    /// Opens device `o.device` and uploads a loaded CPU model as `o` says.
    pub fn load(m: &Model, o: &CudaOptions) -> Result<Self, CudaError> {
        let gpu = Gpu::open(o.device, o.keep_freed_memory)?;
        Self::with_options(m, gpu, o)
    }

    /// Uploads onto an opened GPU (bf16, the other options their defaults, no memory cap).
    pub fn with_gpu(m: &Model, gpu: Arc<Gpu>) -> Result<Self, CudaError> {
        Self::with_precision(m, gpu, Precision::Bf16)
    }

    /// Uploads onto an opened GPU in the given precision (the other options their defaults, no memory cap).
    pub fn with_precision(m: &Model, gpu: Arc<Gpu>, prec: Precision) -> Result<Self, CudaError> {
        let o = CudaOptions {
            precision: prec,
            memory_budget_bytes: 0,
            ..CudaOptions::default()
        };
        Self::with_options(m, gpu, &o)
    }

    /// Uploads onto an opened GPU as `o` says (`o.device` and `o.keep_freed_memory` are the opener's).
    pub fn with_options(m: &Model, gpu: Arc<Gpu>, o: &CudaOptions) -> Result<Self, CudaError> {
        let prec = o.precision;
        let g = &*gpu;
        let c = m.text_config();
        let w = m.weights();
        let up = |parts: &[&Tensor]| upload_stacked(g, parts, prec, false);
        // The input projections (their input is a norm's output): both planes in one GEMM in split mode.
        let up_in =
            |parts: &[&Tensor]| upload_stacked(g, parts, prec, prec == Precision::Bf16Split);
        let embed = up(&[w.embed])?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(up(&[w.lm_head])?)
        };
        let attn_tc = o.attention == AttnKernels::TensorCore;
        let mut layers = Vec::with_capacity(w.layers.len());
        let mut rec_len = 0usize;
        let mut kv_rows = Vec::new();
        for (li, l) in w.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                MixerView::GatedDeltaNet(v) => {
                    if v.hv % v.hk != 0 {
                        return Err(CudaError::Unsupported(format!(
                            "layer {li}: value heads {} not a multiple of key heads {}",
                            v.hv, v.hk
                        )));
                    }
                    let cd = 2 * v.hk * v.dk + v.hv * v.dv;
                    let conv_off = rec_len;
                    let ssm_off = conv_off + (v.kernel - 1) * cd;
                    // Each layer's state starts on a 16-byte boundary.
                    rec_len = (ssm_off + v.hv * v.dk * v.dv).next_multiple_of(4);
                    Mixer::Gdn(GdnLayer {
                        w_in: up_in(&[v.in_qkv, v.in_z, v.in_a, v.in_b])?,
                        w_out: up(&[v.out])?,
                        conv_off,
                        ssm_off,
                        conv: upload_f32(g, v.conv)?,
                        neg_a: upload_f32(g, v.neg_a)?,
                        dt_bias: upload_f32(g, v.dt_bias)?,
                        norm: upload_f32(g, v.norm)?,
                        d: GdnDims {
                            hk: v.hk,
                            hv: v.hv,
                            dk: v.dk,
                            dv: v.dv,
                        },
                        kernel: v.kernel,
                        eps: v.eps,
                        cd,
                    })
                }
                MixerView::Attention(v) => {
                    kv_rows.push(v.kv_heads * v.head_dim);
                    let a = AttnDims {
                        heads: v.heads,
                        kv_heads: v.kv_heads,
                        head_dim: v.head_dim,
                        half: v.inv_freq.len(),
                    };
                    Mixer::Attn(AttnLayer {
                        w_in: up_in(&[v.q, v.k, v.v])?,
                        w_o: up(&[v.o])?,
                        q_norm: upload_f32(g, v.q_norm)?,
                        k_norm: upload_f32(g, v.k_norm)?,
                        inv_freq: upload_f32(
                            g,
                            if v.inv_freq.is_empty() {
                                &[0.0]
                            } else {
                                v.inv_freq
                            },
                        )?,
                        a,
                        eps: v.eps,
                        tc: attn_tc && crate::attn_tc::attention_tc_supported(g, a),
                    })
                }
            };
            layers.push(Layer {
                in_norm: upload_f32(g, l.input_norm)?,
                post_norm: upload_f32(g, l.post_norm)?,
                mixer,
                w_gu: up_in(&[l.mlp_gate, l.mlp_up])?,
                w_down: up(&[l.mlp_down])?,
            });
        }
        // The kinds must agree with the config (they are data, not inferred).
        for (li, (l, kind)) in layers.iter().zip(&c.layer_types).enumerate() {
            let ok = matches!(
                (&l.mixer, kind),
                (Mixer::Gdn(_), LayerKind::GatedDeltaNet) | (Mixer::Attn(_), LayerKind::Attention)
            );
            if !ok {
                return Err(CudaError::Unsupported(format!(
                    "layer {li}: mixer does not match layer_types"
                )));
            }
        }
        let final_norm = upload_f32(g, w.final_norm)?;
        let gdn_tc = o.gdn != GdnKernels::Simt;
        let gdn_leaf = o.gdn == GdnKernels::TensorCore;
        let mut tree_min_root = gdn_tc.then_some(2);
        for l in &layers {
            if let Mixer::Gdn(m) = &l.mixer {
                let tc = crate::gdn_tc::gdn_tc_takes(g, m.d);
                tree_min_root = tree_min_root.filter(|_| tc).map(|k| k.max(m.kernel - 1));
            }
        }
        g.sync()?;
        Ok(CudaModel {
            gpu: gpu.clone(),
            prec,
            embed,
            lm_head,
            final_norm,
            eps: w.eps,
            layers,
            hid: c.hidden_size,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            max_pos: c.max_position_embeddings,
            rec_len,
            kv: KvLayout::new(kv_rows),
            ledger: Arc::new(Ledger {
                live: AtomicUsize::new(0),
                budget: AtomicUsize::new(o.memory_budget_bytes),
            }),
            prof: Recorder::default(),
            enqueue_ns: AtomicU64::new(0),
            phase_ns: Default::default(),
            spans: Recorder::default(),
            trees: AtomicU64::new(0),
            graph_runs: AtomicU64::new(0),
            empty_kv: Arc::new(KvBuf {
                buf: g.alloc(1)?,
                cap: 0,
                _charge: None,
            }),
            arena: Mutex::new(None),
            graphs: Mutex::new(GraphCache::default()),
            gdn_tc,
            gdn_leaf,
            tree_min_root,
            tree_on: std::sync::atomic::AtomicBool::new(o.trees),
            use_graphs: std::sync::atomic::AtomicBool::new(o.graphs),
            tc: Mutex::new(o.kernels.unwrap_or(TcArith::for_precision(prec))),
            split: Mutex::new(o.split_gemms.unwrap_or_default()),
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn precision(&self) -> Precision {
        self.prec
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
        4 * self.kv.per_pos
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

    fn head(&self) -> W {
        self.lm_head.as_ref().unwrap_or(&self.embed).w
    }

    /// The activation (GEMM input) buffer at `p` for `rows` rows of `k` values, in this model's precision: in
    /// [`Precision::Bf16Split`] the producer writes the hi and lo bf16 planes ([2, rows, k]) itself.
    fn act(&self, p: u64, rows: usize, k: usize) -> Out {
        match self.prec {
            Precision::Bf16 => Out::Bf16(p),
            Precision::F32 => Out::F32(p),
            Precision::Bf16Split => Out::Split(p, rows * k),
        }
    }

    /// The input buffer of an input projection at `p` (a norm writes it) and its row stride: in
    /// [`Precision::Bf16Split`] each row holds its hi and lo planes side by side (`[hi | lo]`, 2K bf16), which the
    /// projection's twice-stored weight (`[W | W]`) multiplies in one GEMM over 2K; else as [`CudaModel::act`].
    fn act_in(&self, p: u64, k: usize) -> (Out, usize) {
        match self.prec {
            Precision::Bf16Split => (Out::Split(p, k), 2 * k),
            Precision::Bf16 => (Out::Bf16(p), k),
            Precision::F32 => (Out::F32(p), k),
        }
    }

    /// `y = x · wᵀ` for an input projection: `x` [T, K] as [`CudaModel::act_in`] laid it out; in split mode both
    /// planes (`both`: one GEMM over 2K) or the hi plane alone.
    fn gemm_in(
        &self,
        x: u64,
        t: usize,
        k: usize,
        w: &Weight,
        n: usize,
        y: u64,
        ldy: usize,
        both: bool,
    ) -> Result<(), CudaError> {
        let (_, ldx) = self.act_in(x, k);
        let kk = if both { 2 * k } else { k };
        crate::gemm::gemm_ld(&self.gpu, x, ldx, t, kk, w.w, w.ld, n, y, ldy, 0.0)
    }

    /// How the tensor-core kernels multiply from the next forward on (captured graphs are dropped).
    pub fn set_tc_arith(&self, t: TcArith) {
        *self.tc.lock().unwrap_or_else(|e| e.into_inner()) = t;
        self.drop_graphs();
    }

    /// How the tensor-core kernels multiply.
    pub fn tc_arith(&self) -> TcArith {
        *self.tc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Which projections multiply both planes of their input in [`Precision::Bf16Split`] from the next forward on
    /// (captured graphs are dropped); no effect in the other precisions.
    pub fn set_split_gemms(&self, s: SplitGemms) {
        *self.split.lock().unwrap_or_else(|e| e.into_inner()) = s;
        self.drop_graphs();
    }

    /// The projections that multiply both planes in split mode.
    pub fn split_gemms(&self) -> SplitGemms {
        *self.split.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns CUDA graphs for repeated forward shapes on or off (at first: [`CudaOptions::graphs`]).
    pub fn set_graphs(&self, on: bool) {
        self.use_graphs.store(on, Ordering::Relaxed);
        self.drop_graphs();
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

    /// [`CudaModel::host_enqueue_ns`] by phase so far, in ns: the states (checks, KV rows, the children's states:
    /// what the other three leave), the table (written and uploaded), launching the layers (one graph launch when a
    /// graph replays), the output buffer and final norm.
    pub fn host_phases(&self) -> [(&'static str, u64); 4] {
        let p = &self.phase_ns;
        let [table, launch, out] = [&p.table, &p.launch, &p.out].map(|a| a.load(Ordering::Relaxed));
        let total = self.host_enqueue_ns();
        [
            ("states", total.saturating_sub(table + launch + out)),
            ("table", table),
            ("launch", launch),
            ("final norm", out),
        ]
    }

    /// Starts recording, per forward, an event before its table upload and one after its final norm (for
    /// [`CudaModel::span_take`]).
    pub fn span_start(&self) {
        self.spans.start();
    }

    /// Stops recording; waits for the GPU; → the GPU time of each forward since [`CudaModel::span_start`], ms (from
    /// its table upload to its final norm: the GPU's work, and any wait on the host's launches within it).
    pub fn span_take(&self) -> Result<Vec<f64>, CudaError> {
        let spans = self.spans.take();
        self.gpu.sync()?;
        spans.iter().map(|(a, b)| elapsed_ms(a, b)).collect()
    }

    /// An event recorded now on the stream while spans are recorded.
    fn span_event(&self) -> Result<Option<CudaEvent>, CudaError> {
        if !self.spans.on() {
            return Ok(None);
        }
        self.event_now().map(Some)
    }

    /// A timing event recorded now on the stream (profiling and spans).
    fn event_now(&self) -> Result<CudaEvent, CudaError> {
        let e = self
            .gpu
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|err| CudaError::Driver { op: "event", err })?;
        e.record(&self.gpu.stream)
            .map_err(|err| CudaError::Driver {
                op: "event record",
                err,
            })?;
        Ok(e)
    }

    /// Host nanoseconds spent inside `forward_batch` and `forward_tree` so far. The forward never waits for the GPU,
    /// so when this grows as fast as the wall clock the host's kernel launches, not the GPU, bound the request.
    pub fn host_enqueue_ns(&self) -> u64 {
        self.enqueue_ns.load(Ordering::Relaxed)
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

    /// Forwards that ran children with their roots ([`CudaModel::forward_tree`]) since load.
    pub fn tree_forwards(&self) -> u64 {
        self.trees.load(Ordering::Relaxed)
    }

    fn profiling(&self) -> bool {
        self.prof.on()
    }

    /// Starts recording one CUDA event after every op of the following forwards (for `profile_take`). Each
    /// forward then starts behind a ~20 ms busy wait on the GPU, so the events time the GPU's work and not the
    /// host's launches (the wait itself is left out of the figures).
    pub fn profile_start(&self) {
        self.prof.start();
    }

    /// Stops recording; waits for the GPU; → (op, total ms, count) per op name, in first-seen order.
    pub fn profile_take(&self) -> Result<Vec<(&'static str, f64, usize)>, CudaError> {
        let marks = self.prof.take();
        self.gpu.sync()?;
        let mut out: Vec<(&'static str, f64, usize)> = Vec::new();
        for w in marks.windows(2) {
            if w[1].0 == "start" {
                continue;
            }
            let ms = elapsed_ms(&w[0].1, &w[1].1)?;
            match out.iter_mut().find(|e| e.0 == w[1].0) {
                Some(e) => {
                    e.1 += ms;
                    e.2 += 1;
                }
                None => out.push((w[1].0, ms, 1)),
            }
        }
        Ok(out)
    }

    /// Records that the work queued so far ends op `name` (only while profiling).
    fn mark(&self, name: &'static str) -> Result<(), CudaError> {
        if self.prof.on() {
            self.prof.push((name, self.event_now()?));
        }
        Ok(())
    }

    /// A KV buffer of `cap` positions: every attention layer's K and V rows ([`KvLayout`]), one allocation.
    fn kv_buf(&self, cap: usize) -> Result<KvBuf, CudaError> {
        let floats = cap * self.kv.per_pos;
        let charge = self.ledger.charge(4 * floats, "KV cache")?;
        Ok(KvBuf {
            buf: self.gpu.alloc(floats)?,
            cap,
            _charge: Some(charge),
        })
    }

    /// Copies positions `0..rows` of every layer's K and V rows from `src` to `dst` starting at position `at`.
    fn copy_kv(
        &self,
        src: &KvBuf,
        dst: &mut KvBuf,
        at: usize,
        rows: usize,
    ) -> Result<(), CudaError> {
        for (a, &row) in self.kv.rows.iter().enumerate() {
            let (sk, sv) = self.kv.offsets(src.cap, a);
            let (dk, dv) = self.kv.offsets(dst.cap, a);
            for (s, d) in [(sk, dk), (sv, dv)] {
                self.gpu
                    .copy(&src.buf, s, &mut dst.buf, d + at * row, rows * row)?;
            }
        }
        Ok(())
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> Result<CudaState, CudaError> {
        let g = &*self.gpu;
        let charge = self.ledger.charge(4 * self.rec_len, "sequence state")?;
        let rec = g.zeros(self.rec_len)?;
        Ok(CudaState {
            pos: 0,
            rec,
            kv: self.empty_kv.clone(),
            base: None,
            _charge: charge,
        })
    }

    /// `n` independent device-side continuations of `st`: the recurrent state copied (one copy per fork),
    /// the KV caches shared read-only (a fork appends to its own rows). Neither side sees the other's later
    /// tokens.
    pub fn fork(&self, st: &CudaState, n: usize) -> Result<Vec<CudaState>, CudaError> {
        let out = (0..n).map(|_| self.copy_state(st)).collect();
        self.mark("fork")?;
        out
    }

    /// A device-side copy (snapshot); restore by using the copy in place of the original.
    pub fn copy_state(&self, st: &CudaState) -> Result<CudaState, CudaError> {
        let g = &*self.gpu;
        let charge = self.ledger.charge(4 * self.rec_len, "sequence state")?;
        let mut rec = g.alloc(self.rec_len)?;
        g.copy(&st.rec, 0, &mut rec, 0, self.rec_len)?;
        let (kv, base) = match &st.base {
            // The usual case: share everything this state holds.
            None => (self.empty_kv.clone(), Some((st.kv.clone(), st.pos))),
            // A fork of a fork: one level of sharing only, so copy base and own rows into a new buffer.
            Some((b, blen)) => {
                let mut nb = self.kv_buf(st.pos.next_multiple_of(256))?;
                self.copy_kv(b, &mut nb, 0, *blen)?;
                self.copy_kv(&st.kv, &mut nb, *blen, st.pos - blen)?;
                (Arc::new(nb), None)
            }
        };
        Ok(CudaState {
            pos: st.pos,
            rec,
            kv,
            base,
            _charge: charge,
        })
    }

    /// Grows the own KV rows of `st` to hold positions up to `need`.
    fn reserve(&self, st: &mut CudaState, need: usize) -> Result<(), CudaError> {
        let blen = st.base_len();
        let rows = need - blen;
        if rows > st.kv.cap {
            let mut nb = self.kv_buf(rows.next_multiple_of(256).max(st.kv.cap * 2))?;
            self.copy_kv(&st.kv, &mut nb, 0, st.pos - blen)?;
            st.kv = Arc::new(nb);
        }
        Ok(())
    }

    fn check_input(&self, st: &CudaState, ids: &[u32]) -> Result<(), CudaError> {
        self.check_ids(st.pos, ids)?;
        let fits = |b: &KvBuf| b.cap == 0 || b.buf.len() == b.cap * self.kv.per_pos;
        if !fits(&st.kv)
            || !st.base.as_ref().is_none_or(|b| fits(&b.0))
            || st.rec.len() != self.rec_len.max(1)
        {
            return Err(CudaError::Model(ModelError::Input(
                "sequence state belongs to another model".into(),
            )));
        }
        Ok(())
    }

    /// `ids` continue a sequence at position `pos`: not empty, in the vocabulary, within the positions.
    fn check_ids(&self, pos: usize, ids: &[u32]) -> Result<(), CudaError> {
        let bad = |m: String| CudaError::Model(ModelError::Input(m));
        if ids.is_empty() {
            return Err(bad("empty token sequence".into()));
        }
        if let Some(b) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(bad(format!(
                "token id {b} is outside the vocabulary (0..{})",
                self.vocab
            )));
        }
        if pos + ids.len() > self.max_pos {
            return Err(bad(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                pos + ids.len(),
                self.max_pos
            )));
        }
        Ok(())
    }

    /// Runs `ids` through the model, continuing `state`. → hidden [T, H] on the device
    pub fn forward(&self, state: &mut CudaState, ids: &[u32]) -> Result<CudaHidden, CudaError> {
        self.forward_batch(&mut [(state, ids)])
    }

    /// Runs several sequences at once (the projections see all tokens stacked, the mixers walk each
    /// segment with its own state). → hidden [ΣT, H] on the device, sequences in order.
    pub fn forward_batch(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
    ) -> Result<CudaHidden, CudaError> {
        timed(&self.enqueue_ns, || {
            let par = vec![-1; items.len()];
            self.prepare(items)?;
            self.forward_queue(items, &[], &par)
        })
    }

    /// Checks every item's ids against its state, then grows each state's KV rows to hold them.
    fn prepare(&self, items: &mut [(&mut CudaState, &[u32])]) -> Result<(), CudaError> {
        for (st, seq) in items.iter() {
            self.check_input(st, seq)?;
        }
        for (st, seq) in items.iter_mut() {
            let need = st.pos + seq.len();
            self.reserve(st, need)?;
        }
        Ok(())
    }

    /// Runs `roots` (each continuing its state, as [`CudaModel::forward_batch`]) and `children` — `(root, ids)`, a
    /// continuation of `roots[root]` after the root's ids — in ONE forward: within each layer the children's mixers
    /// start from the state their root reached in that layer (conv inputs from the root's last rows, a second state
    /// pass launch that reads the root's recurrent state, attention over the root's cache rows written earlier in the
    /// layer). Every weight is read and every kernel launched once for roots and children together, instead of once
    /// for the roots and again for the forks. → the hidden rows of the roots' ids then of the children's, and with
    /// `keep` the children's states (equal to forks of the roots after their ids, sharing the roots' KV caches
    /// read-only); without it none, and nothing is allocated for them: their recurrent states are never written (the
    /// state pass skips its last update) and their KV rows live in the forward scratch.
    ///
    /// `Ok(None)`, with nothing run: this model does not take the tree ([`GdnKernels::Simt`], a GDN layer the tensor-core
    /// state pass does not take, trees turned off), or a root with children has fewer ids than `tree_min_root` or is
    /// itself a fork (its KV caches shared). The caller then runs the roots, forks them and runs the children.
    pub fn forward_tree(
        &self,
        roots: &mut [(&mut CudaState, &[u32])],
        children: &[(usize, &[u32])],
        keep: bool,
    ) -> Result<Option<(CudaHidden, Vec<CudaState>)>, CudaError> {
        if children.is_empty() {
            return Ok(Some((self.forward_batch(roots)?, Vec::new())));
        }
        let Some(min_root) = self
            .tree_min_root
            .filter(|_| self.tree_on.load(Ordering::Relaxed))
        else {
            return Ok(None);
        };
        for &(r, _) in children {
            let Some((st, ids)) = roots.get(r) else {
                return Err(CudaError::Model(ModelError::Input(format!(
                    "child of root {r}, of {} roots",
                    roots.len()
                ))));
            };
            if ids.len() < min_root || st.base.is_some() {
                return Ok(None);
            }
        }
        let r = timed(&self.enqueue_ns, || self.run_tree(roots, children, keep))?;
        self.trees.fetch_add(1, Ordering::Relaxed);
        Ok(Some(r))
    }

    /// [`CudaModel::forward_tree`] once it takes the tree.
    fn run_tree(
        &self,
        roots: &mut [(&mut CudaState, &[u32])],
        children: &[(usize, &[u32])],
        keep: bool,
    ) -> Result<(CudaHidden, Vec<CudaState>), CudaError> {
        // The roots' KV rows first: a child shares its root's buffer as it stands after this.
        self.prepare(roots)?;
        for &(r, ids) in children {
            self.check_ids(roots[r].0.pos + roots[r].1.len(), ids)?;
        }
        let par: Vec<i32> = (0..roots.len())
            .map(|_| -1)
            .chain(children.iter().map(|&(r, _)| r as i32))
            .collect();
        if !keep {
            let h = self.forward_queue(roots, children, &par)?;
            return Ok((h, Vec::new()));
        }
        let mut kids = Vec::with_capacity(children.len());
        for &(r, ids) in children {
            let mut kid = self.continuation(roots[r].0, roots[r].1.len())?;
            let need = kid.pos + ids.len();
            self.reserve(&mut kid, need)?;
            kids.push(kid);
        }
        let mut items: Vec<(&mut CudaState, &[u32])> = roots
            .iter_mut()
            .map(|(st, ids)| (&mut **st, *ids))
            .chain(
                kids.iter_mut()
                    .zip(children)
                    .map(|(st, &(_, ids))| (st, ids)),
            )
            .collect();
        let h = self.forward_queue(&mut items, &[], &par)?;
        Ok((h, kids))
    }

    /// The state a continuation of `st` after `ahead` more ids starts from, for a [`CudaModel::forward_tree`] that
    /// keeps it: its KV rows share `st`'s (not yet written), its conv and recurrent state are left for that forward to
    /// write (every value of them: the conv states from the root's and its own rows, the recurrent ones by the state
    /// pass).
    fn continuation(&self, st: &CudaState, ahead: usize) -> Result<CudaState, CudaError> {
        let charge = self.ledger.charge(4 * self.rec_len, "sequence state")?;
        let pos = st.pos + ahead;
        Ok(CudaState {
            pos,
            rec: self.gpu.alloc(self.rec_len)?,
            kv: self.empty_kv.clone(),
            base: Some((st.kv.clone(), pos)),
            _charge: charge,
        })
    }

    /// One forward over `items` then `dropped` (see [`CudaModel::forward_tree`] for `par`: -1, or the index of the
    /// earlier segment a segment continues; those come after every segment with -1). `dropped`: children `(root,
    /// ids)` without states of their own (their recurrent states are not written, their KV rows live in the forward
    /// scratch); when empty, the states of every child among `items` are written.
    fn forward_queue(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
        dropped: &[(usize, &[u32])],
        par: &[i32],
    ) -> Result<CudaHidden, CudaError> {
        let g = &*self.gpu;
        let hid = self.hid;
        let lens: Vec<usize> = items
            .iter()
            .map(|(_, s)| s.len())
            .chain(dropped.iter().map(|(_, s)| s.len()))
            .collect();
        let nseg = lens.len();
        let roots = par.iter().take_while(|&&p| p < 0).count();
        if self.profiling() {
            // Hold the GPU (~20 ms at 2 GHz) while this forward is queued: the events then time GPU work only.
            crate::launch!(g, g.k.spin_wait, crate::runtime::cfg((1, 1), 1, 0); 40_000_000i64)?;
        }
        self.mark("start")?;
        let n: usize = lens.iter().sum();
        if n == 0 {
            return Err(CudaError::Model(ModelError::Input("empty batch".into())));
        }
        let shape = Shape {
            n,
            nseg,
            roots,
            keep_children: dropped.is_empty(),
            short_children: lens[roots..].iter().all(|&l| l <= ops::GDN_CHUNK),
            max_len: lens.iter().copied().max().unwrap_or(0),
            split: self.split_gemms(),
            attn_splits: self.attn_tc_dims().map_or(1, |a| {
                crate::attn_tc::attention_tc_plan(lens.iter().copied(), a, g.sms)
            }),
        };
        let table_len = TableLayout::new(&self.layers, n, nseg).len;
        // Positions of KV rows the dropped children write into the scratch.
        let kv_rows: usize = dropped.iter().map(|(_, s)| s.len()).sum();
        let ph = &self.phase_ns;
        let (out, _out_charge) = timed(&ph.out, || -> Result<_, CudaError> {
            let out: CudaSlice<f32> = g.alloc(n * hid)?;
            Ok((out, self.ledger.charge(4 * n * hid, "forward scratch")?))
        })?;
        let span0 = self.span_event()?;
        // The table, written once the scratch (which holds the dropped children's KV rows) is in place.
        let upload = |sc: &mut Scratch| {
            timed(&ph.table, || -> Result<FwdPtrs, CudaError> {
                sc.kv
                    .reserve(self, kv_rows * self.kv.per_pos, "tree children's KV rows")?;
                let table = self.table(items, dropped, par, (g.ptr(&sc.kv.buf), kv_rows));
                debug_assert_eq!(table.len(), table_len, "the table and its layout disagree");
                g.upload_into(&table, &sc.table.buf)?;
                Ok(sc.ptrs(self, shape))
            })
        };
        if n <= ARENA_ROWS {
            // The persistent scratch: fixed addresses, so a repeated shape can replay a captured CUDA graph.
            let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
            if arena.as_ref().is_none_or(|a| a.rows < n) {
                // More rows than the arena holds: all of it anew (the old one freed first, so that the budget
                // holds one arena at a time).
                let (rows, tl) = arena.as_ref().map_or((0, 0), |a| (a.rows, a.table.len));
                *arena = None;
                self.drop_graphs();
                let rows = n.max(rows).next_power_of_two().clamp(256, ARENA_ROWS);
                *arena = Some(self.scratch(rows, table_len.max(tl).next_power_of_two())?);
            }
            let a = arena
                .as_mut()
                .ok_or_else(|| CudaError::Unsupported("no arena".into()))?;
            // A longer table or more attention splits than before: those buffers alone move (and the graphs that
            // captured their addresses go). The children's KV rows may move freely: only the table names them.
            let moved = a.table.reserve(self, table_len, "forward table")?;
            if a.attn
                .reserve(self, self.attn_scratch(shape), "attention scratch")?
                || moved
            {
                self.drop_graphs();
            }
            let p = upload(a)?;
            timed(&ph.launch, || self.run_layers_graphed(&p, shape))?;
            timed(&ph.out, || self.final_norm(&p, shape, &out))?;
        } else {
            let mut sc = self.scratch(n, table_len)?;
            sc.attn
                .reserve(self, self.attn_scratch(shape), "attention scratch")?;
            let p = upload(&mut sc)?;
            timed(&ph.launch, || self.run_layers(&p, shape))?;
            timed(&ph.out, || self.final_norm(&p, shape, &out))?;
            // The scratch is freed in stream order when it drops here.
        }
        if let (Some(a), Some(b)) = (span0, self.span_event()?) {
            self.spans.push((a, b));
        }
        for (st, seq) in items.iter_mut() {
            st.pos += seq.len();
        }
        Ok(CudaHidden {
            buf: out,
            rows: n,
            hid,
        })
    }

    /// The bytes of one forward's table over `items` then `dropped` (as [`CudaModel::forward_queue`]), laid out as
    /// [`TableLayout`] says. Per layer: GDN conv [S] | ssm [S] | the ssm each segment starts from [S] (its parent's
    /// when `par[s] >= 0`); attention [S, KV_ENTRIES]. `kv`: the address of the dropped children's KV rows and the
    /// positions it holds ([`KvLayout`]; the children's rows one after another).
    fn table(
        &self,
        items: &[(&mut CudaState, &[u32])],
        dropped: &[(usize, &[u32])],
        par: &[i32],
        kv: (u64, usize),
    ) -> Vec<u8> {
        let g = &*self.gpu;
        let keep_children = dropped.is_empty();
        // Per segment: the recurrent state it starts from (its root's for a child) and the one it is written to (a
        // child whose state is dropped names its root's, which no launch then writes for it); its position, ids and
        // KV entries per attention layer.
        struct Seg<'a> {
            from: u64,
            to: u64,
            pos: usize,
            ids: &'a [u32],
            /// The own rows' address in a KV buffer of layout `cap` positions, at position `at`, and the base.
            own: (u64, usize, usize),
            base: Option<(&'a KvBuf, usize)>,
        }
        let root_of = |s: usize| usize::try_from(par[s]).ok().map(|p| &*items[p].0);
        let mut segs: Vec<Seg> = Vec::with_capacity(items.len() + dropped.len());
        for (s, (st, ids)) in items.iter().enumerate() {
            let to = g.ptr(&st.rec);
            segs.push(Seg {
                from: root_of(s).map_or(to, |r| g.ptr(&r.rec)),
                to,
                pos: st.pos,
                ids,
                own: (g.ptr(&st.kv.buf), st.kv.cap, 0),
                base: st.base.as_ref().map(|(b, l)| (&**b, *l)),
            });
        }
        let mut at = 0;
        for &(r, ids) in dropped {
            let (root, root_ids) = (&items[r].0, items[r].1);
            let rec = g.ptr(&root.rec);
            let pos = root.pos + root_ids.len();
            segs.push(Seg {
                from: rec,
                to: rec,
                pos,
                ids,
                own: (kv.0, kv.1, at),
                base: Some((&root.kv, pos)),
            });
            at += ids.len();
        }
        debug_assert!(keep_children || items.len() == par.iter().filter(|&&p| p < 0).count());
        let mut ptrs: Vec<u64> = Vec::with_capacity(self.layers.len() * KV_ENTRIES * segs.len());
        let mut ai = 0;
        for l in &self.layers {
            match &l.mixer {
                Mixer::Gdn(m) => {
                    let (conv, ssm) = (4 * m.conv_off as u64, 4 * m.ssm_off as u64);
                    ptrs.extend(segs.iter().map(|s| s.to + conv));
                    ptrs.extend(segs.iter().map(|s| s.to + ssm));
                    ptrs.extend(segs.iter().map(|s| s.from + ssm));
                }
                Mixer::Attn(_) => {
                    let row = self.kv.rows[ai];
                    let kv_at = |p: u64, cap: usize, at: usize| {
                        let (k, v) = self.kv.offsets(cap, ai);
                        (p + 4 * (k + at * row) as u64, p + 4 * (v + at * row) as u64)
                    };
                    for s in &segs {
                        let (ok, ov) = kv_at(s.own.0, s.own.1, s.own.2);
                        let (bk, bv, blen) = match s.base {
                            Some((b, len)) => {
                                let (bk, bv) = kv_at(g.ptr(&b.buf), b.cap, 0);
                                (bk, bv, len as u64)
                            }
                            None => (0, 0, 0),
                        };
                        ptrs.extend([ok, ov, bk, bv, blen]);
                    }
                    ai += 1;
                }
            }
        }
        let mut ids: Vec<i32> = Vec::new();
        let mut seg_rows = Vec::with_capacity(segs.len() * 3);
        let mut tok = Vec::new();
        for (si, s) in segs.iter().enumerate() {
            seg_rows.extend([ids.len() as i32, s.ids.len() as i32, s.pos as i32]);
            for (i, &id) in s.ids.iter().enumerate() {
                tok.extend([si as i32, (s.pos + i) as i32]);
                ids.push(id as i32);
            }
        }
        let mut bytes: Vec<u8> =
            Vec::with_capacity(8 * ptrs.len() + 4 * (ids.len() * 3 + seg_rows.len() + par.len()));
        bytes.extend(ptrs.iter().flat_map(|p| p.to_le_bytes()));
        for v in [&ids, &seg_rows, &tok, par] {
            bytes.extend(v.iter().flat_map(|i| i.to_le_bytes()));
        }
        bytes
    }

    /// f32 values of key-split scratch the tensor-core attention needs for this shape (0 with [`AttnKernels::Tiled`]).
    fn attn_scratch(&self, s: Shape) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attn(m) if m.tc => {
                    crate::attn_tc::attention_tc_scratch_len(s.attn_splits, s.n, m.a)
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// The dims of the first attention layer that runs on tensor cores (the split plan's; Qwen3.5's attention
    /// layers share theirs, and any split count is correct for any layer).
    fn attn_tc_dims(&self) -> Option<AttnDims> {
        self.layers.iter().find_map(|l| match &l.mixer {
            Mixer::Attn(m) if m.tc => Some(m.a),
            _ => None,
        })
    }

    /// Values per token row of each forward scratch buffer (the widest layer's).
    fn widths(&self) -> Widths {
        let mut w = Widths {
            proj: 2 * self.inter,
            mid: 0,
            act: self.hid.max(self.inter),
            gates: 1,
            wy: 0,
            fold: 0,
        };
        if self.prec == Precision::Bf16Split {
            // Residual GEMMs over both planes write 2N rows of H.
            w.fold = 2 * self.hid;
        }
        for l in &self.layers {
            match &l.mixer {
                Mixer::Gdn(m) => {
                    w.proj = w.proj.max(m.proj_width());
                    w.mid = w.mid.max(m.cd + m.d.hv * m.d.dv);
                    w.act = w.act.max(m.d.hv * m.d.dv);
                    w.gates = w.gates.max(2 * m.d.hv);
                    // The WY pre-pass's U, W, M and decays of every chunk.
                    w.wy = w.wy.max(ops::gdn_wy_scratch(m.d));
                }
                Mixer::Attn(m) => {
                    w.proj = w.proj.max(m.proj_width());
                    w.act = w.act.max(m.a.heads * m.a.head_dim);
                    w.mid = w.mid.max(m.a.heads * m.a.head_dim);
                }
            }
        }
        w
    }

    /// Scratch for forwards of up to `rows` token rows and a table of `table_len` bytes, charged to the budget.
    fn scratch(&self, rows: usize, table_len: usize) -> Result<Scratch, CudaError> {
        let g = &*self.gpu;
        let w = self.widths();
        let floats = rows * (self.hid + w.act + w.proj + w.mid + w.gates + w.wy + w.fold);
        let charge = self.ledger.charge(4 * floats, "forward scratch")?;
        Ok(Scratch {
            rows,
            bytes: 4 * floats,
            table: Growing::new(self, table_len, "forward table")?,
            x: g.alloc(rows * self.hid)?,
            // GEMM inputs: bf16, two bf16 planes (split) or f32 (allocated for the larger).
            act: g.alloc(rows * w.act)?,
            proj: g.alloc(rows * w.proj)?,
            mid: g.alloc(rows * w.mid)?,
            gates: g.alloc(rows * w.gates)?,
            wy: g.alloc(rows * w.wy)?,
            fold: g.alloc(rows * w.fold)?,
            attn: Growing::new(self, 0, "attention scratch")?,
            kv: Growing::new(self, 0, "tree children's KV rows")?,
            _charge: charge,
        })
    }

    /// The layers of one forward, through a CUDA graph when this shape was seen before (the first sight runs
    /// them directly, so one-off shapes never pay a capture; GEMM tuning also happens on that first run).
    fn run_layers_graphed(&self, p: &FwdPtrs, s: Shape) -> Result<(), CudaError> {
        if self.profiling() || !self.use_graphs.load(Ordering::Relaxed) {
            return self.run_layers(p, s);
        }
        let mut c = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gr) = c.get(&s) {
            self.graph_runs.fetch_add(1, Ordering::Relaxed);
            return gr.launch().map_err(|err| CudaError::Driver {
                op: "graph launch",
                err,
            });
        }
        if c.note(s) < 2 {
            drop(c);
            return self.run_layers(p, s);
        }
        let stream = &self.gpu.stream;
        stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|err| CudaError::Driver {
                op: "begin capture",
                err,
            })?;
        let r = self.run_layers(p, s);
        let gr = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        match (r, gr) {
            (Ok(()), Ok(Some(gr))) => {
                self.graph_runs.fetch_add(1, Ordering::Relaxed);
                gr.launch().map_err(|err| CudaError::Driver {
                    op: "graph launch",
                    err,
                })?;
                c.insert(s, gr);
                Ok(())
            }
            // Something in the forward cannot be captured (nothing ran): no graphs from now on.
            _ => {
                self.use_graphs.store(false, Ordering::Relaxed);
                c.clear();
                drop(c);
                self.run_layers(p, s)
            }
        }
    }

    /// `out = rms_norm(x) · final_norm` for `n` rows (f32).
    fn final_norm(&self, p: &FwdPtrs, s: Shape, out: &CudaSlice<f32>) -> Result<(), CudaError> {
        let o = Out::F32(self.gpu.ptr(out));
        let pending = self.both_planes(s.split, Projection::MlpOut);
        self.norm(p, s.n, self.final_norm.ptr, pending, (o, self.hid))
    }

    /// Whether projection `p` multiplies both planes of its input (split mode, and `p` among `split`): its residual
    /// GEMM then leaves two halves for the next [`CudaModel::norm`] to add.
    fn both_planes(&self, split: SplitGemms, p: Projection) -> bool {
        self.prec == Precision::Bf16Split && split.has(p)
    }

    /// RMSNorm of the residual x into `out` (row stride `ldo`); `pending` (split mode only: see
    /// [`CudaModel::both_planes`]) first adds the two halves of the last residual GEMM's output
    /// ([`CudaModel::gemm_residual`]).
    fn norm(
        &self,
        p: &FwdPtrs,
        n: usize,
        gain: u64,
        pending: bool,
        (out, ldo): (Out, usize),
    ) -> Result<(), CudaError> {
        let (g, hid) = (&*self.gpu, self.hid);
        if pending {
            ops::add2_rms_norm(
                g,
                p.x,
                hid,
                p.fold,
                n * hid,
                gain,
                self.eps,
                n,
                hid,
                out,
                ldo,
            )?;
        } else {
            ops::rms_norm(g, p.x, hid, gain, self.eps, n, hid, out, ldo)?;
        }
        self.mark("rms_norm")
    }

    /// The residual update `x += act · wᵀ` (act: [T, K]). On both planes (`both`, split mode) one GEMM over both
    /// writes its two halves to the fold buffer and the next [`CudaModel::norm`] adds them to x (weights read
    /// once); → whether that add is pending. Otherwise the GEMM accumulates into x (split mode: the hi plane alone).
    fn gemm_residual(
        &self,
        p: &FwdPtrs,
        t: usize,
        k: usize,
        w: &Weight,
        both: bool,
    ) -> Result<bool, CudaError> {
        let hid = self.hid;
        if both {
            self.gpu.gemm(p.act, 2 * t, k, w.w, hid, p.fold, hid, 0.0)?;
        } else {
            self.gpu.gemm(p.act, t, k, w.w, hid, p.x, hid, 1.0)?;
        }
        Ok(both)
    }

    /// Every layer of one forward over the scratch at `p` (no allocation, no host synchronisation: capturable).
    fn run_layers(&self, p: &FwdPtrs, s: Shape) -> Result<(), CudaError> {
        let g = &*self.gpu;
        let (hid, inter) = (self.hid, self.inter);
        let Shape {
            n,
            nseg,
            roots,
            keep_children,
            short_children,
            max_len,
            attn_splits,
            split,
        } = s;
        let both = |proj| self.both_planes(split, proj);
        // The last residual GEMM left two halves in the fold buffer (see `gemm_residual`).
        let mut pending = false;
        let (xp, hbp, pp, midp, gp, wyp) = (p.x, p.act, p.proj, p.mid, p.gates, p.wy);
        // Read once: every layer of this forward multiplies the same way.
        let tc = self.tc_arith();
        let (ptrs_p, ids_p, segs_p, tok_p) = (p.ptrs, p.ids, p.segs, p.tok);
        self.mark("upload")?;
        ops::embed_gather(g, self.embed.w, ids_p, xp, n, hid)?;
        self.mark("embed")?;
        let mut poff = 0usize;
        for l in &self.layers {
            self.norm(p, n, l.in_norm.ptr, pending, self.act_in(hbp, hid))?;
            match &l.mixer {
                Mixer::Gdn(m) => {
                    let d = m.d;
                    let pw = m.proj_width();
                    let conv_p = ptrs_p + 8 * poff as u64;
                    let ssm_p = conv_p + 8 * nseg as u64;
                    let init_p = ssm_p + 8 * nseg as u64;
                    poff += GDN_ENTRIES * nseg;
                    self.gemm_in(hbp, n, hid, &m.w_in, pw, pp, pw, both(Projection::GdnIn))?;
                    self.mark("gemm gdn in")?;
                    // mid: conv output [N, cd] then core [N, HV*DV]
                    let core_p = midp + 4 * (n * m.cd) as u64;
                    let beta_p = gp + 4 * (n * d.hv) as u64;
                    let z_off = m.cd;
                    let a_off = m.cd + d.hv * d.dv;
                    ops::gdn_conv_prep(
                        g,
                        pp,
                        pw,
                        midp,
                        m.conv.ptr,
                        m.kernel,
                        m.cd,
                        segs_p,
                        tok_p,
                        conv_p,
                        p.par,
                        // The conv states advanced: every segment's, or the roots' alone when the children's are
                        // dropped (their rows in the table point at their root's state, which they must not touch).
                        if keep_children { nseg } else { roots },
                        n,
                        d,
                        1.0 / (d.dk as f32).sqrt(),
                        (a_off, a_off + d.hv, m.neg_a.ptr, m.dt_bias.ptr),
                        gp,
                        beta_p,
                    )?;
                    self.mark("conv, l2norm, gates")?;
                    if max_len == 1 {
                        ops::gdn_step(g, midp, m.cd, gp, beta_p, core_p, segs_p, ssm_p, nseg, d)?;
                        self.mark("gdn step")?;
                    } else {
                        // The WY pre-pass and the state pass on tensor cores (`tc`'s arithmetic, f32 state; the SIMT
                        // kernels for head dims they do not take), or the f32 SIMT pair with GdnKernels::Simt (never in
                        // a tree: tree_min_root).
                        if self.gdn_tc {
                            crate::gdn_tc::gdn_tc_chunked(
                                g,
                                tc,
                                midp,
                                m.cd,
                                gp,
                                beta_p,
                                core_p,
                                segs_p,
                                crate::gdn_tc::SegStates {
                                    states: ssm_p,
                                    init: init_p,
                                    roots,
                                    keep_children,
                                    leaf_children: short_children && self.gdn_leaf,
                                },
                                nseg,
                                d,
                                n,
                                max_len,
                                wyp,
                            )?;
                        } else {
                            ops::gdn_chunked_wy(
                                g, midp, m.cd, gp, beta_p, core_p, segs_p, ssm_p, nseg, d, n,
                                max_len, wyp,
                            )?;
                        }
                        self.mark("gdn chunked")?;
                    }
                    ops::rms_norm_gated(
                        g,
                        core_p,
                        pp + 4 * z_off as u64,
                        pw,
                        m.norm.ptr,
                        m.eps,
                        n,
                        d.hv,
                        d.dv,
                        self.act(hbp, n, d.hv * d.dv),
                    )?;
                    self.mark("gated norm")?;
                    pending =
                        self.gemm_residual(p, n, d.hv * d.dv, &m.w_out, both(Projection::GdnOut))?;
                    self.mark("gemm gdn out")?;
                }
                Mixer::Attn(m) => {
                    let a = m.a;
                    let pw = m.proj_width();
                    let kv_p = ptrs_p + 8 * poff as u64;
                    poff += KV_ENTRIES * nseg;
                    self.gemm_in(hbp, n, hid, &m.w_in, pw, pp, pw, both(Projection::AttnIn))?;
                    self.mark("gemm attn in")?;
                    ops::attn_prep(
                        g,
                        pp,
                        pw,
                        m.q_norm.ptr,
                        m.k_norm.ptr,
                        m.eps,
                        m.inv_freq.ptr,
                        a,
                        n,
                        tok_p,
                        kv_p,
                        midp,
                    )?;
                    self.mark("attn prep")?;
                    let scale = 1.0 / (a.head_dim as f32).sqrt();
                    let out = self.act(hbp, n, a.heads * a.head_dim);
                    if m.tc {
                        crate::attn_tc::attention_tc(
                            g,
                            tc.attn,
                            midp,
                            pp,
                            pw,
                            segs_p,
                            kv_p,
                            nseg,
                            max_len,
                            n,
                            a,
                            scale,
                            out,
                            p.attn,
                            attn_splits,
                        )?;
                    } else {
                        ops::attention_tiled(
                            g, midp, pp, pw, segs_p, kv_p, nseg, max_len, a, scale, out,
                        )?;
                    }
                    self.mark("attention")?;
                    pending = self.gemm_residual(
                        p,
                        n,
                        a.heads * a.head_dim,
                        &m.w_o,
                        both(Projection::AttnOut),
                    )?;
                    self.mark("gemm attn out")?;
                }
            }
            self.norm(p, n, l.post_norm.ptr, pending, self.act_in(hbp, hid))?;
            let gu = 2 * inter;
            self.gemm_in(hbp, n, hid, &l.w_gu, gu, pp, gu, both(Projection::MlpIn))?;
            self.mark("gemm mlp gate|up")?;
            ops::swiglu(g, pp, inter, n, self.act(hbp, n, inter))?;
            self.mark("swiglu")?;
            pending = self.gemm_residual(p, n, inter, &l.w_down, both(Projection::MlpOut))?;
            self.mark("gemm mlp down")?;
        }
        Ok(())
    }

    /// Label-row readout: `out[i] = hidden[picks[i].0] · lm_head[picks[i].1]`. One upload, one launch, one
    /// download (the only synchronisation with the host).
    pub fn logits_rows(
        &self,
        h: &CudaHidden,
        picks: &[(usize, u32)],
    ) -> Result<Vec<f32>, CudaError> {
        let g = &*self.gpu;
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        let mut pairs = Vec::with_capacity(2 * picks.len());
        for &(r, v) in picks {
            if r >= h.rows || v as usize >= self.vocab {
                return Err(CudaError::Model(ModelError::Input(format!(
                    "readout of row {r} (of {}), vocabulary row {v} (of {})",
                    h.rows, self.vocab
                ))));
            }
            pairs.extend([r as i32, v as i32]);
        }
        let pd = g.upload(&pairs)?;
        let out: CudaSlice<f32> = g.alloc(picks.len())?;
        ops::rows_dot(
            g,
            g.ptr(&h.buf),
            h.hid,
            g.ptr(&pd),
            picks.len(),
            self.head(),
            g.ptr(&out),
        )?;
        let r = g.download(&out, picks.len());
        self.mark("readout")?;
        r
    }

    /// Full-vocabulary logits of every hidden row (for tests and `onepass logits`). → [N, V]
    pub fn logits(&self, h: &CudaHidden) -> Result<Vec<f32>, CudaError> {
        let g = &*self.gpu;
        let out: CudaSlice<f32> = g.alloc(h.rows * self.vocab)?;
        // The GEMM input in the head's dtype: the hidden rows rounded to bf16, or as they are (f32).
        let hb: Option<CudaSlice<u16>> = match self.prec {
            Precision::Bf16 | Precision::Bf16Split => {
                let hb = g.alloc(h.rows * h.hid)?;
                ops::to_bf16(g, g.ptr(&h.buf), g.ptr(&hb), h.rows * h.hid)?;
                Some(hb)
            }
            Precision::F32 => None,
        };
        let x = hb.as_ref().map_or(g.ptr(&h.buf), |b| g.ptr(b));
        g.gemm(
            x,
            h.rows,
            h.hid,
            self.head(),
            self.vocab,
            g.ptr(&out),
            self.vocab,
            0.0,
        )?;
        g.download(&out, h.rows * self.vocab)
    }
}

impl CudaHidden {
    /// Copies the rows to the host. → [N, H]
    pub fn to_host(&self, g: &Gpu) -> Result<Vec<f32>, CudaError> {
        g.download(&self.buf, self.rows * self.hid)
    }
}
