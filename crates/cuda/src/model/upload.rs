//! Weight upload: a loaded CPU model's tensors as device matrices in the model's precision (stacked projections,
//! `[W | W]` rows for split-mode inputs), the per-layer device weights, and the constructors.

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

/// Appends a weight's values as bf16 bits.
pub(super) fn push_bf16(out: &mut Vec<u16>, t: &Tensor) {
    match t.view() {
        View::BF16(v) => out.extend(v.iter().map(|x| x.to_bits())),
        _ => out.extend(t.to_f32_vec().iter().map(|x| bf16::from_f32(*x).to_bits())),
    }
}

/// The device memory a [`Weight`]'s `w` points into.
pub(super) enum WeightBuf {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

impl Weight {
    /// Device bytes.
    pub(super) fn bytes(&self) -> usize {
        match &self._buf {
            WeightBuf::Bf16(b) => 2 * b.len(),
            WeightBuf::F32(b) => 4 * b.len(),
        }
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
        let prec = o.precision;
        let g = &*gpu;
        let c = m.text_config();
        if let Some(why) = m.float_only_reason() {
            return Err(CudaError::Unsupported(format!(
                "the GPU runs float weights (F32, F16, BF16) only; {why}; run it with --device cpu"
            )));
        }
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
}
