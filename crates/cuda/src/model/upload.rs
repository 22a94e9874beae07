//! Weight upload: a loaded CPU model's weights, asked for by role (each layer's projections and parameters in the
//! vocabulary of `onepass_model::layer_ops`), as device matrices: float weights in the model's precision (stacked
//! projections, `[W | W]` rows for split-mode inputs), block-format ones as the file stores them (PQ2_0 and Q8_0
//! blocks with their scales moved out, PTQ1_0 transcoded to PQ2_0 words; quant.cu's layout), a rotated pack's sign
//! vectors per site; the per-layer device weights, and the constructors.

use super::*;

impl<T: cudarc::driver::DeviceRepr> Dev<T> {
    pub(super) fn new(g: &Gpu, buf: CudaSlice<T>) -> Self {
        let ptr = g.ptr(&buf);
        Dev { _buf: buf, ptr }
    }
}

pub(super) fn upload_f32(g: &Gpu, v: &[f32]) -> Result<Dev<f32>, CudaError> {
    Ok(Dev::new(g, g.upload(v)?))
}

/// How a weight goes to the device. Every weight format is matched by name here: a format the model gains is
/// uploaded, or refused with [`CudaError::Unsupported`] naming the tensor and format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// BF16, and F32 or F16 outside split mode or held exactly by bf16: converted to the precision's float layout.
    Float,
    /// PQ2_0 as stored; PTQ1_0 transcoded to PQ2_0 words (the same values, losslessly).
    Pq2,
    Q8,
    /// Split mode, an F16 matrix bf16 does not hold exactly: kept as stored, multiplied by [`crate::qgemm`]
    /// (decode reads it directly, prefill splits it into bf16 hi and lo planes), so that the weights stay exact.
    F16Rows,
    /// Split mode, an F32 matrix bf16 does not hold exactly: the same, as f32.
    F32Rows,
}

/// How `t` goes to the device in `prec`. Split mode promises exact weights: a float matrix that bf16 does not hold
/// exactly (an F16 file from f32 weights, say) keeps its own values (the float-rows forms; their GEMV groups take
/// 16 columns); one that bf16 holds (the usual F16 or F32 file of a bf16 model) takes the bf16 path.
fn form(t: &Tensor, prec: Precision) -> Form {
    let split = prec.planes() && t.shape().last().is_some_and(|k| k % 16 == 0);
    let bf16 = |x: f32| x.to_bits() & 0xffff == 0;
    match t.view() {
        View::F16(v) if split && !v.iter().all(|h| bf16(h.to_f32())) => Form::F16Rows,
        View::F32(v) if split && !v.iter().all(|x| bf16(*x)) => Form::F32Rows,
        View::F32(_) | View::BF16(_) | View::F16(_) => Form::Float,
        View::PQ2_0(_) | View::PTQ1_0(_) | View::PQ2_0G(_) => Form::Pq2,
        View::Q8_0(_) | View::Q8_0G(_) => Form::Q8,
    }
}

/// Appends a float weight's values as bf16 bits.
pub(super) fn push_bf16(out: &mut Vec<u16>, t: &Tensor) -> Result<(), CudaError> {
    match t.view() {
        View::BF16(v) => out.extend(v.iter().map(|x| x.to_bits())),
        View::F32(_) | View::F16(_) => {
            out.extend(t.to_f32_vec().iter().map(|x| bf16::from_f32(*x).to_bits()))
        }
        View::Q8_0(_) | View::PQ2_0(_) | View::PTQ1_0(_) | View::Q8_0G(_) | View::PQ2_0G(_) => {
            return Err(not_float(t))
        }
    }
    Ok(())
}

/// Appends a float weight's values as f32 (the checkpoint's values exactly).
pub(super) fn push_f32(out: &mut Vec<f32>, t: &Tensor) -> Result<(), CudaError> {
    match t.view() {
        View::F32(_) | View::BF16(_) | View::F16(_) => out.extend(t.to_f32_vec()),
        View::Q8_0(_) | View::PQ2_0(_) | View::PTQ1_0(_) | View::Q8_0G(_) | View::PQ2_0G(_) => {
            return Err(not_float(t))
        }
    }
    Ok(())
}

fn not_float(t: &Tensor) -> CudaError {
    CudaError::Unsupported(format!(
        "{} is stored as {}, not as a float weight",
        t.name(),
        t.dtype().name()
    ))
}

/// Uploads block-format weights stacked by rows (all of one [`Form`], the same column count) in quant.cu's layout:
/// every block's code bytes in order (rows after rows), then, from a 256-byte boundary, every block's f16 scale;
/// float rows (the float-rows forms) as their values in order.
fn upload_block(g: &Gpu, parts: &[&Tensor], f: Form) -> Result<Weight, CudaError> {
    let cols = parts
        .first()
        .and_then(|t| t.shape().last().copied())
        .unwrap_or(0);
    let mut owned: Vec<std::borrow::Cow<[u8]>> = Vec::with_capacity(parts.len());
    for t in parts {
        owned.push(match (t.view(), f) {
            (View::PQ2_0(b), Form::Pq2) | (View::Q8_0(b), Form::Q8) => b.into(),
            // A model prepared for the CPU (it should not come here): its Q8_0 blocks back as the file held them.
            (View::Q8_0G(_), Form::Q8) | (View::PQ2_0G(_), Form::Pq2) => t.file_blocks(),
            (View::PTQ1_0(b), Form::Pq2) => {
                let mut o = vec![0u8; b.len() / 28 * 34];
                onepass_formats::ptq1_0_to_pq2_0(b, &mut o)
                    .map_err(|e| CudaError::Unsupported(format!("{}: {e}", t.name())))?;
                o.into()
            }
            (View::F16(v), Form::F16Rows) => v
                .iter()
                .flat_map(|h| h.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
            (View::F32(v), Form::F32Rows) => v
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
            _ => return Err(not_float(t)),
        });
    }
    let blocks: Vec<&[u8]> = owned.iter().map(|b| &**b).collect();
    let (buf, w) = match f {
        Form::F16Rows | Form::F32Rows => crate::qgemm::upload_rows(g, &blocks, f == Form::F16Rows)?,
        _ => crate::qgemm::upload_blocks(g, &blocks, f == Form::Q8)?,
    };
    Ok(Weight {
        _buf: WeightBuf::Bytes(buf),
        w,
        ld: cols,
    })
}

/// One weight matrix (the embedding, the head): a float one in the precision's layout, or blocks as stored.
fn upload_one(g: &Gpu, t: &Tensor, prec: Precision) -> Result<Weight, CudaError> {
    match form(t, prec) {
        Form::Float => upload_stacked(g, &[t], prec, false),
        f => upload_block(g, &[t], f),
    }
}

/// How a projection's float parts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InLayout {
    /// As the precision stores any float weight (residual projections in mixed and split; bf16 and f32 precision).
    Plain,
    /// Every row twice, `[W | W]` (split and mixed precision).
    Twice,
    /// f16, scaled by a power of two, its input stored times 2^e (half precision, [`W::Half`], [`Linear::f16_exp`]).
    Half(i32),
}

/// A projection's weights (`Model::linear`'s order) as a [`Linear`]: runs of weights of one [`Form`] and one input
/// stacked into one [`Part`] each. `rot`: the site's signs and how many leading weights read the rotated input.
/// `layout`: how float parts are stored.
fn upload_linear(
    g: &Gpu,
    ts: &[&Tensor],
    rot: Option<(&[f32], usize)>,
    prec: Precision,
    layout: InLayout,
) -> Result<Linear, CudaError> {
    let folded = rot.map_or(0, |r| r.1);
    let forms: Vec<Form> = ts
        .iter()
        .map(|t| match layout {
            // f16 holds an F16 file's values as they are, and bf16's ([`half_misfit`] refuses the rest).
            InLayout::Half(_) => form(t, Precision::Bf16),
            _ => form(t, prec),
        })
        .collect();
    let mut parts = Vec::new();
    let (mut i, mut row0) = (0, 0);
    while i < ts.len() {
        let (f, r) = (forms[i], i < folded);
        let mut j = i + 1;
        while j < ts.len() && forms[j] == f && (j < folded) == r {
            j += 1;
        }
        let group = &ts[i..j];
        let rows: usize = group.iter().map(|t| t.shape()[0]).sum();
        let w = match (f, layout) {
            (Form::Float, InLayout::Half(e)) => upload_half(g, group, e)?,
            (Form::Float, _) => upload_stacked(g, group, prec, layout == InLayout::Twice)?,
            _ => upload_block(g, group, f)?,
        };
        parts.push(Part {
            w,
            row0,
            rows,
            rot: r,
        });
        row0 += rows;
        i = j;
    }
    let rot = match rot {
        Some((s, _)) => Some(upload_f32(g, s)?),
        None => None,
    };
    let f16_exp = match layout {
        InLayout::Half(e) => Some(e),
        InLayout::Plain | InLayout::Twice => None,
    };
    Ok(Linear {
        parts,
        rot,
        f16_exp,
    })
}

/// The device memory a [`Weight`]'s `w` points into.
pub(super) enum WeightBuf {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
    /// Block-format codes and scales.
    Bytes(CudaSlice<u8>),
}

impl Weight {
    /// Device bytes.
    pub(super) fn bytes(&self) -> usize {
        match &self._buf {
            WeightBuf::Bf16(b) => 2 * b.len(),
            WeightBuf::F32(b) => 4 * b.len(),
            WeightBuf::Bytes(b) => b.len(),
        }
    }
}

impl Linear {
    /// Device bytes of its weights.
    pub(super) fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.w.bytes()).sum()
    }

    /// Whether any part is stored in a block format.
    pub(super) fn has_blocks(&self) -> bool {
        self.parts.iter().any(|p| p.w.w.is_block())
    }
}

/// Uploads weights stacked by rows (all with the same column count) as one matrix: bf16, or f32 (the
/// checkpoint's values exactly) in [`Precision::F32`]. `twice` (bf16): every row stored twice, `[W | W]`.
pub(super) fn upload_stacked(
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
    Ok(match prec.inputs() {
        GemmInputs::Bf16 | GemmInputs::Split | GemmInputs::Half => {
            let mut host = Vec::with_capacity(total);
            for t in parts {
                push_bf16(&mut host, t)?;
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
        GemmInputs::F32 => {
            let mut host = Vec::with_capacity(total);
            for t in parts {
                push_f32(&mut host, t)?;
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

/// Uploads float weights stacked by rows as one f16 matrix scaled by a power of two ([`W::Half`]; the half
/// precision's projections), its shift raised by `e`: the GEMM's input is stored times 2^e
/// ([`Linear::f16_exp`]).
fn upload_half(g: &Gpu, parts: &[&Tensor], e: i32) -> Result<Weight, CudaError> {
    let cols = parts
        .first()
        .and_then(|t| t.shape().last().copied())
        .unwrap_or(0);
    let mut v = Vec::with_capacity(parts.iter().map(|t| t.numel()).sum());
    for t in parts {
        push_f32(&mut v, t)?;
    }
    let (host, shift) = crate::gemm::half_scaled(&v);
    let buf = g.upload(&host)?;
    let w = W::Half {
        w: g.ptr(&buf),
        shift: shift + e,
    };
    Ok(Weight {
        _buf: WeightBuf::Bf16(buf),
        w,
        ld: cols,
    })
}

/// The largest value a norm's output takes in the half precision is sqrt(K) times its largest gain; f16's largest
/// finite value is 65,504. The bound kept for every f16 GEMM input (a norm's output as it is, a residual
/// projection's input scaled by a power of two): half of that, 2^15.
const HALF_NORM_BOUND: f64 = 32768.0;

/// The largest |silu(z)| over z ≤ 0 (at z ≈ -1.278, 0.27846...), rounded up.
const SILU_NEG_MAX: f64 = 0.2785;

/// The largest 2-norm of a float weight's rows (infinite where a row holds a non-finite value), rounded up: every
/// output of a product with it is at most this times its input row's 2-norm (Cauchy-Schwarz).
fn max_row_norm(t: &Tensor) -> Result<f64, CudaError> {
    if !t.dtype().is_float() {
        return Err(not_float(t));
    }
    let k = t.shape().last().copied().unwrap_or(0);
    if k == 0 {
        return Ok(0.0);
    }
    let rows = t.numel() / k;
    // The rows split over the host's threads (every float weight is read once more at upload for this).
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, rows.div_ceil(64).max(1));
    let per = rows.div_ceil(threads);
    let big = std::thread::scope(|s| {
        let parts: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || {
                    let mut row = vec![0f32; k];
                    let mut big = 0f64;
                    for r in i * per..((i + 1) * per).min(rows) {
                        t.read_f32(r * k, &mut row);
                        let ss: f64 = row
                            .chunks(64)
                            .map(|c| f64::from(c.iter().map(|x| x * x).sum::<f32>()))
                            .sum();
                        // NaN and infinity both make the bound infinite.
                        big = if ss.is_finite() {
                            big.max(ss)
                        } else {
                            f64::INFINITY
                        };
                    }
                    big
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().unwrap_or(f64::INFINITY))
            .fold(0f64, f64::max)
    });
    // The f32 partial sums round by well under 1e-3 of the total.
    Ok(big.sqrt() * 1.001)
}

/// The largest |value| of a gain or weight vector; infinite where one is NaN or infinite (no bound then).
fn largest_abs(v: &[f32]) -> f64 {
    v.iter().fold(0f64, |a, x| {
        if x.is_finite() {
            a.max(f64::from(x.abs()))
        } else {
            f64::INFINITY
        }
    })
}

/// The power of two e that puts `bound` times 2^e at most [`HALF_NORM_BOUND`] and as close to it as a power of two
/// goes, within [-60, 60] (an all-zero input takes the largest). `None` where no such e holds it.
fn half_exp(bound: f64) -> Option<i32> {
    if !bound.is_finite() {
        return None;
    }
    let e = if bound > 0.0 {
        ((HALF_NORM_BOUND / bound).log2().floor() as i32).clamp(-60, 60)
    } else {
        60
    };
    // log2's rounding: step down until the product fits.
    (e - 1..=e)
        .rev()
        .find(|e| *e >= -60 && bound * 2f64.powi(*e) <= HALF_NORM_BOUND)
}

/// Per layer, the powers of two the half precision stores its residual projections' inputs times (the mixer's
/// output projection's, the MLP's down projection's), each from a bound on that input known from the weights
/// alone. Each input projection's output is at most sqrt(K) times its norm's largest gain times its weight row's
/// 2-norm (the normed row's 2-norm is at most sqrt(K) times the gain). So: the gated norm's output (Gated
/// DeltaNet) is at most sqrt(DV) (a head's normed value) times the norm's largest weight times the bound of
/// silu(z); attention's output is a convex mix of V rows times a sigmoid gate, at most V's bound; SwiGLU's
/// output is at most the bound of silu(gate) times up's. (|silu(z)| ≤ max(|z|, 0.2785).) Loose (Cauchy-Schwarz is
/// tight only for a hidden row aligned with a weight row), which f16's range absorbs: with the bound scaled into
/// (2^14, 2^15], every value down to 2^-28 of it stays normal, 11 significant bits. `Err`: why a bound is out of
/// reach (a non-finite weight or gain).
pub(super) fn half_residual_exps(m: &Model) -> Result<Result<Vec<[i32; 2]>, String>, CudaError> {
    let c = m.text_config();
    let root_k = (c.hidden_size as f64).sqrt();
    let mut exps = Vec::with_capacity(c.layer_types.len());
    for (l, kind) in c.layer_types.iter().enumerate() {
        let h_in = root_k * largest_abs(m.param(l, Param::NormGain(NormSite::Input))?);
        let h_post = root_k * largest_abs(m.param(l, Param::NormGain(NormSite::Post))?);
        let mixer = match kind {
            LayerKind::GatedDeltaNet => {
                let z = h_in * max_row_norm(m.linear(l, Projection::GdnIn)?[1])?;
                let dv = c.linear_value_head_dim as f64;
                dv.sqrt() * largest_abs(m.param(l, Param::GatedNormWeight)?) * z.max(SILU_NEG_MAX)
            }
            LayerKind::Attention => h_in * max_row_norm(m.linear(l, Projection::AttnIn)?[2])?,
        };
        let gu = m.linear(l, Projection::MlpIn)?;
        let mlp = (h_post * max_row_norm(gu[0])?).max(SILU_NEG_MAX) * h_post * max_row_norm(gu[1])?;
        let (Some(a), Some(b)) = (half_exp(mixer), half_exp(mlp)) else {
            return Ok(Err(format!(
                "layer {l}'s residual projections' inputs have no bound inside f16's range"
            )));
        };
        exps.push([a, b]);
    }
    Ok(Ok(exps))
}

/// Whether attention's KV caches can hold f16 ([`AttnArith::F16`]): every attention layer on the tensor-core kernels
/// with dims `attention_h` takes, and [`kv_bound`] inside [`HALF_NORM_BOUND`] (half of f16's range).
fn kv_f16_fits(m: &Model, g: &Gpu, layers: &[Layer]) -> Result<bool, CudaError> {
    let kernels = layers.iter().all(|l| match &l.mixer {
        Mixer::Attn(at) => at.tc && crate::attn_tc::attention_f16_supported(g, at.a),
        Mixer::Gdn(_) => true,
    });
    // NaN compares false: no bound.
    Ok(kernels && kv_bound(m)?.is_some_and(|b| b <= HALF_NORM_BOUND))
}

/// The largest |value| attention's q, k and v can take, from the weights alone (`None`: no bound, a block-format
/// or non-finite weight). q and k are RMS-normed per head, each value at most sqrt(D) times the norm's largest gain
/// (the rotary turns pairs of values, which keeps each pair's 2-norm); v is a projection of the normed hidden row,
/// at most sqrt(hidden) times the input norm's largest gain times W_v's largest row 2-norm (Cauchy-Schwarz; a rotated
/// pack's rotation keeps 2-norms).
fn kv_bound(m: &Model) -> Result<Option<f64>, CudaError> {
    let c = m.text_config();
    let (root_k, root_d) = ((c.hidden_size as f64).sqrt(), (c.head_dim as f64).sqrt());
    let mut big = 0f64;
    for (l, kind) in c.layer_types.iter().enumerate() {
        if *kind != LayerKind::Attention {
            continue;
        }
        let gain = |p: Param| -> Result<f64, CudaError> { Ok(largest_abs(m.param(l, p)?)) };
        let w_v = m.linear(l, Projection::AttnIn)?[2];
        if !w_v.dtype().is_float() {
            return Ok(None);
        }
        let qk = root_d * gain(Param::QNormGain)?.max(gain(Param::KNormGain)?);
        let v = root_k * gain(Param::NormGain(NormSite::Input))? * max_row_norm(w_v)?;
        if !(qk.is_finite() && v.is_finite()) {
            return Ok(None);
        }
        big = big.max(qk).max(v);
    }
    Ok(Some(big))
}

/// Why the half precision does not fit `m` (it then runs in mixed), or `None`: no rotated site, every input
/// projection float, every float projection held by f16 (bf16 values, or an F16 file's), and every norm that feeds
/// one bounded inside f16's range. (The residual projections' inputs need their bounds too: `half_residual_exps`.)
pub(super) fn half_misfit(m: &Model) -> Result<Option<String>, CudaError> {
    let c = m.text_config();
    if m.embedding_signs().is_some() || m.head_signs().is_some() {
        return Ok(Some("a rotated pack".into()));
    }
    let root_k = (c.hidden_size as f64).sqrt();
    for (l, kind) in c.layer_types.iter().enumerate() {
        let (mixer_in, mixer_out) = match kind {
            LayerKind::GatedDeltaNet => (Projection::GdnIn, Projection::GdnOut),
            LayerKind::Attention => (Projection::AttnIn, Projection::AttnOut),
        };
        for p in [mixer_in, mixer_out, Projection::MlpIn, Projection::MlpOut] {
            // A rotated input is not the one the residual bounds hold (H·x reaches sqrt(K) times max |x|).
            if m.rotation(l, p)?.is_some() {
                return Ok(Some(format!(
                    "layer {l}'s {} reads a rotated input",
                    p.name()
                )));
            }
            for t in m.linear(l, p)? {
                // A block-format residual projection stays on both bf16 planes; an input projection has no such
                // form in half.
                if !t.dtype().is_float() {
                    if p.is_input() {
                        return Ok(Some(format!(
                            "{} is stored as {}",
                            t.name(),
                            t.dtype().name()
                        )));
                    }
                    continue;
                }
                // Only f32 values need a look (bf16's and f16's all fit); `form` reads them once.
                if t.dtype() == onepass_tensor::DType::F32
                    && form(t, Precision::Mixed) == Form::F32Rows
                {
                    return Ok(Some(format!(
                        "{} holds f32 values that f16 does not hold exactly",
                        t.name()
                    )));
                }
            }
        }
        for site in [NormSite::Input, NormSite::Post] {
            let big = largest_abs(m.param(l, Param::NormGain(site))?);
            if big * root_k >= HALF_NORM_BOUND || !big.is_finite() {
                return Ok(Some(format!(
                    "layer {l}'s norm gain reaches {big:.1}: its output could leave f16's range"
                )));
            }
        }
    }
    Ok(None)
}

impl GdnLayer {
    pub(super) fn proj_width(&self) -> usize {
        self.cd + self.d.hv * self.d.dv + 2 * self.d.hv
    }
}

impl AttnLayer {
    pub(super) fn proj_width(&self) -> usize {
        let a = self.a;
        a.heads * 2 * a.head_dim + 2 * a.kv_heads * a.head_dim
    }
}

pub(super) enum Mixer {
    Gdn(GdnLayer),
    Attn(AttnLayer),
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
        let mut prec = o.precision;
        let mut fallback = None;
        let mut half_exps = Vec::new();
        if prec == Precision::Half {
            let why = match half_misfit(m)? {
                Some(why) => Some(why),
                None => match half_residual_exps(m)? {
                    Ok(e) => {
                        half_exps = e;
                        None
                    }
                    Err(why) => Some(why),
                },
            };
            if let Some(why) = why {
                fallback = Some(format!(
                    "the half GPU precision does not fit this model ({why}); it runs in mixed"
                ));
                prec = Precision::Mixed;
            }
        }
        // The half precision's residual projections named here stay on both bf16 planes (fixed at upload: their
        // weights are stored for it); by default none, every projection f16. The other precisions split all. A
        // set named for half means something else in mixed, so half's fallback splits all whatever it names.
        let split = match (o.split_gemms, prec) {
            (Some(s), _) if fallback.is_none() => s,
            (_, Precision::Half) => SplitGemms::NONE,
            _ => SplitGemms::ALL,
        };
        if let (Some(f), Some(_)) = (fallback.as_mut(), o.split_gemms) {
            f.push_str(", every projection on both bf16 planes (the projections named for half do not apply)");
        }
        let g = &*gpu;
        g.set_pdl(o.pdl);
        g.set_wgmma(o.wgmma);
        let c = m.text_config();
        let up = |t: &Tensor| upload_one(g, t, prec);
        // A projection's weights stacked by format and input; a float input projection (its input a norm's output)
        // stored `[W | W]` in split mode, so that one GEMM multiplies both planes. In the half precision every
        // projection in f16, its input scaled by the layer's power of two for it (a norm's output: none), except a
        // residual one that `split` names or that has block-format weights (both bf16 planes, as in mixed).
        let linear = |l: usize, p: Projection| {
            let ts = m.linear(l, p)?;
            let layout = match (p.is_input(), prec.inputs()) {
                (true, GemmInputs::Split) => InLayout::Twice,
                (true, GemmInputs::Half) => InLayout::Half(0),
                (false, GemmInputs::Half)
                    if !split.has(p) && ts.iter().all(|t| t.dtype().is_float()) =>
                {
                    InLayout::Half(half_exps[l][usize::from(p == Projection::MlpOut)])
                }
                _ => InLayout::Plain,
            };
            upload_linear(g, &ts, m.rotation(l, p)?, prec, layout)
        };
        let param = |l: usize, p: Param| upload_f32(g, m.param(l, p)?);
        let embed = up(m.embedding())?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(up(m.lm_head())?)
        };
        let signs = |s: Option<&[f32]>| s.map(|s| upload_f32(g, s)).transpose();
        let (embed_rot, head_rot) = (signs(m.embedding_signs())?, signs(m.head_signs())?);
        let attn_tc = o.attention == AttnKernels::TensorCore;
        let mut layers = Vec::with_capacity(c.layer_types.len());
        let mut rec_len = 0usize;
        let mut kv_rows = Vec::new();
        for (li, kind) in c.layer_types.iter().enumerate() {
            let mixer = match kind {
                LayerKind::GatedDeltaNet => {
                    let d = GdnDims {
                        hk: c.linear_num_key_heads,
                        hv: c.linear_num_value_heads,
                        dk: c.linear_key_head_dim,
                        dv: c.linear_value_head_dim,
                    };
                    if !d.hv.is_multiple_of(d.hk) {
                        return Err(CudaError::Unsupported(format!(
                            "layer {li}: value heads {} not a multiple of key heads {}",
                            d.hv, d.hk
                        )));
                    }
                    let kernel = c.linear_conv_kernel_dim;
                    let cd = c.gdn_conv_dim();
                    let conv_off = rec_len;
                    let ssm_off = conv_off + (kernel - 1) * cd;
                    // Each layer's state starts on a 16-byte boundary.
                    rec_len = (ssm_off + d.hv * d.dk * d.dv).next_multiple_of(4);
                    Mixer::Gdn(GdnLayer {
                        w_in: linear(li, Projection::GdnIn)?,
                        w_out: linear(li, Projection::GdnOut)?,
                        conv_off,
                        ssm_off,
                        conv: param(li, Param::ConvTaps)?,
                        neg_a: param(li, Param::NegDecay)?,
                        dt_bias: param(li, Param::DtBias)?,
                        norm: param(li, Param::GatedNormWeight)?,
                        d,
                        kernel,
                        eps: c.rms_norm_eps,
                        cd,
                    })
                }
                LayerKind::Attention => {
                    let inv_freq = m.param(li, Param::RopeInvFreq)?;
                    let a = AttnDims {
                        heads: c.num_attention_heads,
                        kv_heads: c.num_key_value_heads,
                        head_dim: c.head_dim,
                        half: inv_freq.len(),
                    };
                    kv_rows.push(a.kv_heads * a.head_dim);
                    Mixer::Attn(AttnLayer {
                        w_in: linear(li, Projection::AttnIn)?,
                        w_o: linear(li, Projection::AttnOut)?,
                        q_norm: param(li, Param::QNormGain)?,
                        k_norm: param(li, Param::KNormGain)?,
                        inv_freq: upload_f32(
                            g,
                            if inv_freq.is_empty() {
                                &[0.0]
                            } else {
                                inv_freq
                            },
                        )?,
                        a,
                        eps: c.rms_norm_eps,
                        tc: attn_tc && crate::attn_tc::attention_tc_supported(g, a),
                    })
                }
            };
            layers.push(Layer {
                in_norm: param(li, Param::NormGain(NormSite::Input))?,
                post_norm: param(li, Param::NormGain(NormSite::Post))?,
                mixer,
                w_gu: linear(li, Projection::MlpIn)?,
                w_down: linear(li, Projection::MlpOut)?,
            });
        }
        let final_norm = upload_f32(g, m.final_norm_gain())?;
        let lins = |l: &Layer| -> [bool; 2] {
            let (a, b) = match &l.mixer {
                Mixer::Gdn(m) => (&m.w_in, &m.w_out),
                Mixer::Attn(m) => (&m.w_in, &m.w_o),
            };
            let all = [a, b, &l.w_gu, &l.w_down];
            [
                all.iter().any(|x| x.rot.is_some()),
                all.iter().any(|x| x.has_blocks()),
            ]
        };
        let rotated =
            embed_rot.is_some() || head_rot.is_some() || layers.iter().any(|l| lins(l)[0]);
        let blocks = embed.w.is_block()
            || lm_head.as_ref().is_some_and(|h| h.w.is_block())
            || layers.iter().any(|l| lins(l)[1]);
        let dequant = if blocks {
            Some(g.alloc::<u8>(crate::qgemm::DEQUANT_BYTES)?)
        } else {
            None
        };
        let gdn_tc = o.gdn != GdnKernels::Simt;
        let gdn_leaf = o.gdn == GdnKernels::TensorCore;
        let mut tree_min_root = gdn_tc.then_some(2);
        for l in &layers {
            if let Mixer::Gdn(m) = &l.mixer {
                let tc = crate::gdn_tc::gdn_tc_takes(g, m.d);
                tree_min_root = tree_min_root.filter(|_| tc).map(|k| k.max(m.kernel - 1));
            }
        }
        // Attention's keys and values in f16 where that is the arithmetic asked for and the model's bounds allow it
        // (else 1xTF32 on f32 caches, silently as other defaults: the description names the arithmetic).
        let mut tc = o.kernels.unwrap_or(TcArith::for_precision(prec));
        let kv_f16 = tc.attn == AttnArith::F16 && kv_f16_fits(m, g, &layers)?;
        if tc.attn == AttnArith::F16 && !kv_f16 {
            tc.attn = AttnArith::Tf32;
        }
        g.sync()?;
        Ok(CudaModel {
            gpu: gpu.clone(),
            prec,
            fallback,
            embed,
            lm_head,
            embed_rot,
            head_rot,
            rotated,
            dequant,
            final_norm,
            eps: c.rms_norm_eps,
            layers,
            hid: c.hidden_size,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            max_pos: c.max_position_embeddings,
            rec_len,
            kv: KvLayout::new(kv_rows, kv_f16),
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
            decode: Mutex::new(None),
            gdn_tc,
            gdn_leaf,
            tree_min_root,
            tree_on: std::sync::atomic::AtomicBool::new(o.trees),
            use_graphs: std::sync::atomic::AtomicBool::new(o.graphs),
            tc: Mutex::new(tc),
            split: Mutex::new(split),
            invariant: std::sync::atomic::AtomicBool::new(false),
        })
        .inspect(|m: &CudaModel| m.set_batch_invariant(o.batch_invariant))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use onepass_model::synth;

    fn silu(z: f64) -> f64 {
        z / (1.0 + (-z).exp())
    }

    /// `W · h` in f64 for a float weight [N, K].
    fn product(t: &Tensor, h: &[f64]) -> Vec<f64> {
        let w = t.to_f32_vec();
        w.chunks(h.len())
            .map(|r| r.iter().zip(h).map(|(a, b)| f64::from(*a) * b).sum())
            .collect()
    }

    /// rms_norm(x) · gain in f64, as the model's norm computes it.
    fn normed(x: &[f64], gain: &[f32], eps: f64) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        x.iter()
            .zip(gain)
            .map(|(v, g)| v * inv * f64::from(*g))
            .collect()
    }

    /// Rows of `t` (f64), the inputs that make an output reach its Cauchy-Schwarz bound.
    fn rows(t: &Tensor) -> Vec<Vec<f64>> {
        let k = t.shape()[1];
        t.to_f32_vec()
            .chunks(k)
            .map(|r| r.iter().map(|v| f64::from(*v)).collect())
            .collect()
    }

    /// The residual projections' inputs the half precision scales, computed directly (f64) over random hidden rows
    /// and over the rows that make one factor of a bound tight (each weight row itself as the hidden row): scaled by
    /// the upload's power of two, every one stays within 2^15, half of f16's range (the bound the exponents promise),
    /// and the largest comes within 2^16 of it (a bound loose past that would push small values into subnormals).
    #[test]
    fn half_residual_bounds_hold_the_values_the_model_takes() {
        for preset in ["tiny-gva", "tiny-attn-first", "tiny-bf16"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let spec = synth::preset(preset).expect("preset");
            synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).expect("synth");
            let m = Model::load(dir.path()).expect("load");
            let exps = half_residual_exps(&m).expect("weights").expect("bounds");
            let c = m.text_config();
            let (k, eps) = (c.hidden_size, f64::from(c.rms_norm_eps));
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut rnd = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            };
            for (l, kind) in c.layer_types.iter().enumerate() {
                let scale = |e: i32| 2f64.powi(e);
                let in_gain = m.param(l, Param::NormGain(NormSite::Input)).unwrap();
                let post_gain = m.param(l, Param::NormGain(NormSite::Post)).unwrap();
                let gdn = m.linear(l, Projection::GdnIn);
                let (mixer_w, gu) = (
                    match kind {
                        LayerKind::GatedDeltaNet => gdn.as_ref().unwrap()[1],
                        LayerKind::Attention => m.linear(l, Projection::AttnIn).unwrap()[2],
                    },
                    m.linear(l, Projection::MlpIn).unwrap(),
                );
                let mut hidden: Vec<Vec<f64>> = (0..16)
                    .map(|_| (0..k).map(|_| 4.0 * rnd()).collect())
                    .collect();
                hidden.extend(rows(mixer_w));
                hidden.extend(rows(gu[0]));
                hidden.extend(rows(gu[1]));
                let (mut mixer, mut mlp) = (0f64, 0f64);
                for x in &hidden {
                    let h = normed(x, in_gain, eps);
                    let v = product(mixer_w, &h);
                    mixer = mixer.max(match kind {
                        // A head's normed value reaches 1 / sqrt(1/DV + eps) where the core is one-hot.
                        LayerKind::GatedDeltaNet => {
                            let dv = c.linear_value_head_dim;
                            let w = m.param(l, Param::GatedNormWeight).unwrap();
                            let peak = 1.0 / (1.0 / dv as f64 + eps).sqrt();
                            v.iter()
                                .enumerate()
                                .map(|(i, z)| peak * f64::from(w[i % dv]).abs() * silu(*z).abs())
                                .fold(0.0, f64::max)
                        }
                        // A convex mix of V rows, times a gate below 1: at most the largest |V|.
                        LayerKind::Attention => v.iter().fold(0.0, |a, x| a.max(x.abs())),
                    });
                    let h = normed(x, post_gain, eps);
                    let (g, u) = (product(gu[0], &h), product(gu[1], &h));
                    mlp = g
                        .iter()
                        .zip(&u)
                        .fold(mlp, |a, (g, u)| a.max((silu(*g) * u).abs()));
                }
                for (what, top, e) in [
                    ("mixer output", mixer, exps[l][0]),
                    ("SwiGLU", mlp, exps[l][1]),
                ] {
                    let scaled = top * scale(e);
                    // The bound times 2^e lies in (2^14, 2^15]: it is between half this and this times the value.
                    eprintln!(
                        "{preset} layer {l} {what}: largest {top:.3e}, bound within {:.2}x of it (at most)",
                        HALF_NORM_BOUND / scaled
                    );
                    assert!(
                        (HALF_NORM_BOUND / 65536.0..=HALF_NORM_BOUND).contains(&scaled),
                        "{preset} layer {l} {what}: largest |value| {top:.4e} times 2^{e} = {scaled:.4e}"
                    );
                }
            }
        }
    }

    /// The f16 KV caches' bound: on every preset with attention it is finite and inside half of f16's range, and it
    /// holds the q and k values per head (RMS-normed, rotated: a rotation keeps the pair norms, so the normed values
    /// are checked) and v values of random hidden rows and of the hidden rows that make v's bound tight (W_v's rows).
    #[test]
    fn kv_bound_holds_q_k_and_v() {
        for preset in ["tiny-gva", "tiny-attn-first", "tiny-bf16"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let spec = synth::preset(preset).expect("preset");
            synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).expect("synth");
            let m = Model::load(dir.path()).expect("load");
            let bound = kv_bound(&m).expect("weights").expect("a bound");
            assert!(bound > 0.0 && bound <= HALF_NORM_BOUND, "{preset}: {bound}");
            let c = m.text_config();
            let (eps, d) = (f64::from(c.rms_norm_eps), c.head_dim);
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            let mut rnd = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            };
            let mut top = 0f64;
            for (l, kind) in c.layer_types.iter().enumerate() {
                if *kind != LayerKind::Attention {
                    continue;
                }
                let w = m.linear(l, Projection::AttnIn).unwrap();
                let in_gain = m.param(l, Param::NormGain(NormSite::Input)).unwrap();
                let mut hidden: Vec<Vec<f64>> = (0..16)
                    .map(|_| (0..c.hidden_size).map(|_| 4.0 * rnd()).collect())
                    .collect();
                hidden.extend(rows(w[2]));
                for x in &hidden {
                    let h = normed(x, in_gain, eps);
                    for (t, gain) in [(w[1], Param::KNormGain), (w[2], Param::QNormGain)] {
                        // k heads (w[1]); for q the same norm on any D values (the bound does not use W).
                        let raw = product(t, &h);
                        for head in raw.chunks(d).filter(|c| c.len() == d) {
                            let y = normed(head, m.param(l, gain).unwrap(), eps);
                            top = top.max(y.iter().fold(0.0, |a, v| a.max(v.abs())));
                        }
                    }
                    top = top.max(product(w[2], &h).iter().fold(0.0, |a, v| a.max(v.abs())));
                }
            }
            eprintln!("{preset}: largest q, k, v {top:.3e}, bound {bound:.3e}");
            assert!(top <= bound, "{preset}: {top} > {bound}");
        }
    }

    /// The largest row 2-norm, over rows split between threads: at least the exact one (f64 over every row) and within
    /// 2e-3 of it; infinite where a row holds a NaN or an infinity (no bound: the model falls back to mixed).
    #[test]
    fn max_row_norm_bounds_every_row() {
        for (rows, k) in [(1, 7), (3, 64), (1000, 96), (4099, 33)] {
            let v: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-3 * (1 + i / k % 5) as f32)
                .collect();
            let exact = v
                .chunks(k)
                .map(|r| r.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt())
                .fold(0.0, f64::max);
            let t = Tensor::from_f32("w", vec![rows, k], &v);
            let got = max_row_norm(&t).unwrap();
            assert!(
                got >= exact && got <= exact * 1.002,
                "{rows} x {k}: {got} against {exact}"
            );
            for bad in [f32::NAN, f32::INFINITY] {
                let mut w = v.clone();
                w[(rows - 1) * k + k / 2] = bad;
                let t = Tensor::from_f32("w", vec![rows, k], &w);
                assert_eq!(
                    max_row_norm(&t).unwrap(),
                    f64::INFINITY,
                    "{rows} x {k} with {bad}"
                );
            }
        }
    }

    /// The exponent is the largest power of two that keeps the bound within 2^15, and none where nothing does.
    #[test]
    fn half_exp_puts_the_bound_just_inside_the_range() {
        for bound in [1e-30, 3.7e-4, 0.5, 1.0, 3.0, 32768.0, 32769.0, 1e9, 1e20] {
            let e = half_exp(bound).expect("a power of two");
            let scaled = bound * 2f64.powi(e);
            assert!(scaled <= HALF_NORM_BOUND, "{bound}: 2^{e}");
            assert!(
                e == 60 || scaled * 2.0 > HALF_NORM_BOUND,
                "{bound}: 2^{e} is not the largest"
            );
        }
        assert_eq!(half_exp(0.0), Some(60));
        assert_eq!(half_exp(2f64.powi(75)), Some(-60));
        assert_eq!(half_exp(2f64.powi(75) * 1.5), None);
        assert_eq!(largest_abs(&[0.5, -3.0, 2.0]), 3.0);
        assert_eq!(largest_abs(&[0.5, f32::NAN, 2.0]), f64::INFINITY);
        assert_eq!(half_exp(1e40), None);
        assert_eq!(half_exp(f64::INFINITY), None);
        assert_eq!(half_exp(f64::NAN), None);
    }
}
