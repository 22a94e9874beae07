//! Weight upload: a loaded CPU model's weights, asked for by role (each layer's projections and parameters in the
//! vocabulary of `onepass_model::layer_ops`), as device matrices: float weights in the model's precision (stacked
//! projections, `[W | W]` rows for split-mode inputs), block-format ones as the file stores them (PQ2_0 and Q8_0
//! blocks with their scales moved out, PTQ1_0 transcoded to PQ2_0 words; quant.cu's layout), a rotated pack's sign
//! vectors per site; the per-layer device weights, and the constructors.

use super::bounds::{half_misfit, half_residual_exps, kv_bound, HALF_NORM_BOUND};
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
pub(super) enum Form {
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
pub(super) fn form(t: &Tensor, prec: Precision) -> Form {
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

pub(super) fn not_float(t: &Tensor) -> CudaError {
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
        let tc = o.kernels.unwrap_or(TcArith::for_precision(prec));
        let kv_f16 = tc.attn == AttnArith::F16 && kv_f16_fits(m, g, &layers)?;
        let tc = fit_attn(tc, kv_f16);
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
            buckets: std::sync::atomic::AtomicBool::new(o.shape_buckets),
            pad_state: Mutex::new(None),
            tc: Mutex::new(tc),
            split: Mutex::new(split),
            invariant: std::sync::atomic::AtomicBool::new(false),
        })
        .inspect(|m: &CudaModel| m.set_batch_invariant(o.batch_invariant))
    }
}
