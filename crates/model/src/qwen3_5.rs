//! The Qwen3.5 hybrid decoder, top to bottom.
//!
//! ```text
//! x = embed_tokens[ids]                                   x: [N, H]
//! for each layer:                                         (kind from config.layer_types)
//!     x = x + mixer(input_layernorm(x))                   mixer = GatedDeltaNet | Attention
//!     x = x + mlp(post_attention_layernorm(x))
//! h = norm(x)                                             h: [N, H]
//! logits = h · lm_headᵀ   (or only selected rows)         lm_head = embed_tokens when tied
//! ```
//!
//! The layers run through [`run_layers`] (the sequence every backend shares) over `CpuLayers`, the CPU's ops:
//! the blocks' forwards split at the op seams, each op's arithmetic in the order it always had.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use onepass_formats::{Checkpoint, Gguf, ModelFiles};
use onepass_kernels::{add_assign, dot_rows, hadamard_unrotate};
use onepass_tensor::{DType, Tensor};

use crate::blocks::attention::{Attention, AttnScratch};
use crate::blocks::gated_deltanet::{GatedDeltaNet, GdnScratch};
use crate::blocks::mlp::Mlp;
use crate::blocks::norm::RmsNorm;
use crate::blocks::{linear, rotated, Seg};
use crate::config::{LayerKind, ModelConfig, ModelForm, TextConfig};
use crate::gguf::read_gguf;
use crate::layer_ops::{run_layers, LayerOps, NormSite, Param, Projection};
use crate::state::{LayerState, SequenceState};
use crate::weights::Binder;
use crate::ModelError;

pub(crate) enum Mixer {
    GatedDeltaNet(GatedDeltaNet),
    Attention(Attention),
}

pub(crate) struct Layer {
    pub(crate) input_norm: RmsNorm,
    pub(crate) mixer: Mixer,
    pub(crate) post_norm: RmsNorm,
    pub(crate) mlp: Mlp,
}

/// A loaded model, ready to run.
pub struct Model {
    config: ModelConfig,
    /// embed: [V, H]
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: RmsNorm,
    /// lm_head: [V, H] (the embedding when tied)
    pub(crate) lm_head: Tensor,
    /// A rotated pack's embedding rows are stored as `R·e`: restored after the gather with these signs.
    pub(crate) embed_signs: Option<Arc<[f32]>>,
    /// A rotated pack's head is folded: the final hidden rows are rotated with these signs first.
    pub(crate) head_signs: Option<Arc<[f32]>>,
    file_bytes: u64,
}

/// What `onepass info` reports.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_type: String,
    pub form: ModelForm,
    pub layers: usize,
    pub gdn_layers: usize,
    pub attention_layers: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub parameters: usize,
    pub weight_dtypes: Vec<DType>,
    pub weight_bytes: usize,
    pub file_bytes: u64,
    pub tied: bool,
    /// KV bytes each token adds.
    pub state_bytes_per_token: usize,
    /// Fixed bytes per sequence (GDN conv + recurrent state).
    pub state_bytes_per_sequence: usize,
    pub max_position_embeddings: usize,
}

impl Model {
    /// Loads a model folder (`config.json` and the safetensors weights; an MLX 2-bit folder through
    /// [`crate::mlx`]) or a GGUF file (or a folder whose weights are one GGUF file; see [`ModelFiles::locate`]
    /// for which a folder with both runs).
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let files = ModelFiles::locate(path).map_err(|e| ModelError::Io(e.to_string()))?;
        if let Some(file) = &files.gguf {
            return Self::load_gguf(file);
        }
        let dir = &files.dir;
        if crate::mlx::is_mlx_dir(dir) {
            let m = crate::mlx::read_mlx(dir)?;
            let ck = Arc::new(m.checkpoint);
            return Self::bind(
                m.config,
                Binder::with_rotations(ck.clone(), m.rotations),
                ck,
            );
        }
        let config = ModelConfig::from_dir(dir)?;
        let ck = Arc::new(Checkpoint::open_dir(dir)?);
        Self::from_checkpoint(config, ck)
    }

    /// Loads a `qwen35` GGUF file (its tensors renamed and their conventions undone by [`read_gguf`]).
    pub fn load_gguf(path: &Path) -> Result<Self, ModelError> {
        let file = Gguf::open(path)?;
        Self::from_gguf(&file)
    }

    /// A model from a parsed GGUF file.
    pub fn from_gguf(file: &Gguf) -> Result<Self, ModelError> {
        let g = read_gguf(file)?;
        let ck = Arc::new(g.checkpoint);
        Self::bind(g.config, Binder::from_gguf(ck.clone(), g.rotations), ck)
    }

    pub fn from_checkpoint(config: ModelConfig, ck: Arc<Checkpoint>) -> Result<Self, ModelError> {
        Self::bind(config, Binder::new(ck.clone()), ck)
    }

    fn bind(config: ModelConfig, root: Binder, ck: Arc<Checkpoint>) -> Result<Self, ModelError> {
        let c = &config.text;

        let base = match config.form {
            ModelForm::Text => root.pp("model"),
            ModelForm::Composite => root.pp("model").pp("language_model"),
        };
        let embed = base.get("embed_tokens.weight", &[c.vocab_size, c.hidden_size])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for (i, kind) in c.layer_types.iter().enumerate() {
            let vb = base.pp("layers").pp(i);
            let mixer = match kind {
                LayerKind::GatedDeltaNet => {
                    Mixer::GatedDeltaNet(GatedDeltaNet::load(&vb.pp("linear_attn"), c)?)
                }
                LayerKind::Attention => Mixer::Attention(Attention::load(&vb.pp("self_attn"), c)?),
            };
            layers.push(Layer {
                input_norm: RmsNorm::load(
                    &vb.pp("input_layernorm"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                mixer,
                post_norm: RmsNorm::load(
                    &vb.pp("post_attention_layernorm"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                mlp: Mlp::load(&vb.pp("mlp"), c.hidden_size, c.intermediate_size)?,
            });
        }
        let norm = RmsNorm::load(&base.pp("norm"), c.hidden_size, c.rms_norm_eps)?;
        let lm_head = if c.tie_word_embeddings {
            embed.renamed("lm_head.weight (tied to embed_tokens)")
        } else {
            root.get("lm_head.weight", &[c.vocab_size, c.hidden_size])?
        };
        let embed_signs = base.inverse_signs("embed_tokens.weight");
        // Tied to a table of rotated rows Z (E = Z·R), the head is Z·(R·h): a folded head with the same signs.
        let head_signs = if c.tie_word_embeddings {
            embed_signs.clone()
        } else {
            root.folded_signs("lm_head.weight")
        };
        if base.folded_signs("embed_tokens.weight").is_some()
            || root.inverse_signs("lm_head.weight").is_some()
        {
            return Err(ModelError::Weights(
                "the rotation metadata folds the embedding or stores the head rotated per row; onepass reads \
                 packs whose embedding is the inverse-rotated table and whose head is folded"
                    .into(),
            ));
        }
        // The multi-token-prediction head and the vision tower are not part of the text model.
        root.finish(&["mtp.", "model.visual.", "visual."])?;
        Ok(Model {
            config,
            embed,
            layers,
            norm,
            lm_head,
            embed_signs,
            head_signs,
            file_bytes: ck.file_bytes(),
        })
    }

    /// Puts the weight matrices where and how this processor's kernels read them fastest, for a model that stays on
    /// the CPU: each in anonymous memory of its own that asks for huge pages (streaming a mapped file's pages is
    /// slower on some machines: 2B F16 decode 4.8 -> 5.4 tok/s on one), regrouped where the processor has AVX-512
    /// VNNI (and GFNI, for PQ2_0): Q8_0 and PQ2_0 matrices whose rows are whole groups (512 and 1024 values) become
    /// [`DType::Q8_0G`] and [`DType::PQ2_0G`], the same values in as many bytes, on which decode and prefill run the
    /// integer kernels with one scale step per lane of blocks. The file's pages of the originals leave resident
    /// memory, so it stays about the file's size. An untied embedding stays where it is (a gather reads a few of
    /// its rows). Returns how many matrices moved. A model that is to be uploaded to a GPU keeps the file's forms,
    /// which the upload reads: do not call this on one.
    pub fn prepare_for_cpu(&mut self) -> usize {
        let tied = self.config.text.tie_word_embeddings;
        let mut slots: Vec<&mut Tensor> = vec![if tied {
            &mut self.embed
        } else {
            &mut self.lm_head
        }];
        for l in &mut self.layers {
            match &mut l.mixer {
                Mixer::GatedDeltaNet(m) => slots.extend([
                    &mut m.in_qkv,
                    &mut m.in_z,
                    &mut m.in_a,
                    &mut m.in_b,
                    &mut m.out,
                ]),
                Mixer::Attention(m) => slots.extend([&mut m.q, &mut m.k, &mut m.v, &mut m.o]),
            }
            slots.extend([&mut l.mlp.gate, &mut l.mlp.up, &mut l.mlp.down]);
        }
        let moved = slots
            .into_par_iter()
            .map(|t| {
                let grouped = onepass_kernels::runs_grouped(t.dtype()).then(|| t.grouped());
                let Some(moved) = grouped
                    .flatten()
                    .or_else(|| t.is_mapped().then(|| t.to_anon()))
                else {
                    return 0;
                };
                t.release_mapped_pages();
                *t = moved;
                1
            })
            .sum();
        if tied {
            // The head is the embedding: one copy serves both.
            self.lm_head = self.embed.renamed(self.lm_head.name());
        }
        moved
    }

    /// Whether the weights are folded with a Hadamard rotation (a Bonsai pack).
    pub fn is_rotated(&self) -> bool {
        self.embed_signs.is_some()
            || self.head_signs.is_some()
            || self.layers.iter().any(|l| {
                l.mlp.rot_in.is_some()
                    || l.mlp.rot_down.is_some()
                    || match &l.mixer {
                        Mixer::GatedDeltaNet(m) => m.rot_in.is_some() || m.rot_out.is_some(),
                        Mixer::Attention(m) => m.rot_in.is_some() || m.rot_out.is_some(),
                    }
            })
    }

    /// Why a backend that runs plain float matrices cannot run this model (`None` when it can): a weight
    /// stored in a block format, or folded with a Hadamard rotation.
    pub fn float_only_reason(&self) -> Option<String> {
        if self.is_rotated() {
            return Some("this model's weights are folded with a Hadamard rotation".into());
        }
        let info = self.info();
        let blocks: Vec<&str> = info
            .weight_dtypes
            .iter()
            .filter(|d| !d.is_float())
            .map(|d| d.name())
            .collect();
        (!blocks.is_empty()).then(|| format!("this model has {} weights", blocks.join(" and ")))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn text_config(&self) -> &TextConfig {
        &self.config.text
    }

    pub fn vocab_size(&self) -> usize {
        self.config.text.vocab_size
    }

    pub fn hidden_size(&self) -> usize {
        self.config.text.hidden_size
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> SequenceState {
        SequenceState::new(
            self.layers
                .iter()
                .map(|l| match &l.mixer {
                    Mixer::GatedDeltaNet(m) => m.new_state(),
                    Mixer::Attention(m) => m.new_state(),
                })
                .collect(),
        )
    }

    /// Runs `ids` through the model, continuing `state`, and returns the final-normed hidden
    /// states. → [T, H]
    pub fn forward(&self, state: &mut SequenceState, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.forward_batch(&mut [(state, ids)])
    }

    /// Runs several sequences at once: the projections see all their tokens stacked, each token
    /// mixer walks each sequence with its own state. → [ΣT, H], sequences in order.
    pub fn forward_batch(
        &self,
        items: &mut [(&mut SequenceState, &[u32])],
    ) -> Result<Vec<f32>, ModelError> {
        let mut segs = Vec::with_capacity(items.len());
        let mut n = 0;
        for (st, ids) in items.iter() {
            self.check_input(st, ids)?;
            segs.push(Seg {
                start: n,
                len: ids.len(),
                pos: st.pos,
            });
            n += ids.len();
        }
        let mut ops = CpuLayers {
            model: self,
            items,
            segs: &segs,
            n,
            x: Vec::new(),
            h: Vec::new(),
            gdn: None,
            attn: None,
            mlp: (Vec::new(), Vec::new()),
        };
        // On one of the thread pool's own threads: each op's parallel loop then splits there (the other threads
        // steal its halves) instead of being handed to the pool while this thread sleeps and wakes, once per
        // weight; a decode step has hundreds.
        let kinds = &self.config.text.layer_types;
        rayon::scope(|_| run_layers(kinds, &mut ops))?;
        let CpuLayers { mut x, items, .. } = ops;
        self.norm.forward_inplace(&mut x);
        for (st, ids) in items.iter_mut() {
            st.pos += ids.len();
        }
        Ok(x)
    }

    fn check_input(&self, st: &SequenceState, ids: &[u32]) -> Result<(), ModelError> {
        let c = &self.config.text;
        if ids.is_empty() {
            return Err(ModelError::Input("empty token sequence".into()));
        }
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= c.vocab_size) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary (0..{})",
                c.vocab_size
            )));
        }
        if st.pos + ids.len() > c.max_position_embeddings {
            return Err(ModelError::Input(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                st.pos + ids.len(),
                c.max_position_embeddings
            )));
        }
        if st.layers.len() != self.layers.len() {
            return Err(ModelError::Input(
                "sequence state belongs to another model".into(),
            ));
        }
        Ok(())
    }

    /// Full-vocabulary logits for hidden rows. hidden: [T, H] → [T, V]
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let t = hidden.len() / self.hidden_size();
        linear(&rotated(hidden, &self.head_signs), t, &self.lm_head)
    }

    /// Logits of selected vocabulary rows for one hidden vector (a decision reads at most a few
    /// hundred label rows and never pays for the whole head). hidden: [H] → [rows.len()]
    pub fn logits_rows(&self, hidden: &[f32], rows: &[u32]) -> Result<Vec<f32>, ModelError> {
        if let Some(bad) = rows.iter().find(|&&r| r as usize >= self.vocab_size()) {
            return Err(ModelError::Input(format!(
                "vocabulary row {bad} is outside 0..{}",
                self.vocab_size()
            )));
        }
        let mut out = vec![0.0; rows.len()];
        dot_rows(
            &rotated(hidden, &self.head_signs),
            &self.lm_head,
            rows,
            &mut out,
        );
        Ok(out)
    }

    /// Architecture, sizes and state costs.
    pub fn info(&self) -> ModelInfo {
        let c = &self.config.text;
        let mut tensors: Vec<&Tensor> = vec![&self.embed];
        if !c.tie_word_embeddings {
            tensors.push(&self.lm_head);
        }
        let mut small = self.norm_params();
        for l in &self.layers {
            match &l.mixer {
                Mixer::GatedDeltaNet(m) => {
                    tensors.extend(m.tensors());
                    small += m.small_params();
                }
                Mixer::Attention(m) => tensors.extend(m.tensors()),
            }
            tensors.extend(l.mlp.tensors());
        }
        let mut dtypes: Vec<DType> = Vec::new();
        for t in &tensors {
            if !dtypes.contains(&t.dtype()) {
                dtypes.push(t.dtype());
            }
        }
        let gdn = c.count(LayerKind::GatedDeltaNet);
        let attn = c.count(LayerKind::Attention);
        ModelInfo {
            model_type: self.config.model_type.clone(),
            form: self.config.form,
            layers: c.num_hidden_layers,
            gdn_layers: gdn,
            attention_layers: attn,
            hidden_size: c.hidden_size,
            vocab_size: c.vocab_size,
            parameters: tensors.iter().map(|t| t.numel()).sum::<usize>() + small,
            weight_dtypes: dtypes,
            weight_bytes: tensors.iter().map(|t| t.byte_len()).sum(),
            file_bytes: self.file_bytes,
            tied: c.tie_word_embeddings,
            state_bytes_per_token: attn * 2 * c.num_key_value_heads * c.head_dim * 4,
            state_bytes_per_sequence: gdn
                * ((c.linear_conv_kernel_dim - 1) * c.gdn_conv_dim()
                    + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim)
                * 4,
            max_position_embeddings: c.max_position_embeddings,
        }
    }

    /// embed_tokens: [V, H]
    pub fn embedding(&self) -> &Tensor {
        &self.embed
    }

    /// lm_head: [V, H] (the embedding when tied)
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// The final norm's gain, `1 + weight`. [H]
    pub fn final_norm_gain(&self) -> &[f32] {
        &self.norm.gain
    }

    /// The weights of projection `p` of layer `l`, in the order their rows stack in its output (`GdnIn`:
    /// in_proj_qkv [2·HK·DK + HV·DV, H], in_proj_z [HV·DV, H], in_proj_a and in_proj_b [HV, H]; `AttnIn`: q_proj
    /// [H·2D, hidden] (per head D query rows, then D gate rows), k_proj and v_proj [HKV·D, hidden]; `MlpIn`:
    /// gate_proj and up_proj [I, H]; an output projection one matrix), each the linear weight as loaded, in its
    /// checkpoint format. An error when layer `l` has no such projection.
    pub fn linear(&self, l: usize, p: Projection) -> Result<Vec<&Tensor>, ModelError> {
        let layer = self.layer(l)?;
        Ok(match (&layer.mixer, p) {
            (Mixer::GatedDeltaNet(m), Projection::GdnIn) => {
                vec![&m.in_qkv, &m.in_z, &m.in_a, &m.in_b]
            }
            (Mixer::GatedDeltaNet(m), Projection::GdnOut) => vec![&m.out],
            (Mixer::Attention(m), Projection::AttnIn) => vec![&m.q, &m.k, &m.v],
            (Mixer::Attention(m), Projection::AttnOut) => vec![&m.o],
            (_, Projection::MlpIn) => vec![&layer.mlp.gate, &layer.mlp.up],
            (_, Projection::MlpOut) => vec![&layer.mlp.down],
            _ => return Err(Self::no_such(l, layer, p.name())),
        })
    }

    /// The Hadamard rotation of projection `p`'s input in layer `l` (a rotated pack, see docs/formats.md): the
    /// site's sign vector, and how many of [`Model::linear`]`(l, p)`'s weights (the leading ones) are folded and
    /// read the rotated input (`GdnIn`: in_proj_qkv and in_proj_z; in_proj_a and in_proj_b read the normed input
    /// as it is; every other projection: all). `None` when the site is not rotated; an error when layer `l` has no
    /// such projection.
    pub fn rotation(&self, l: usize, p: Projection) -> Result<Option<(&[f32], usize)>, ModelError> {
        let layer = self.layer(l)?;
        let (signs, folded) = match (&layer.mixer, p) {
            (Mixer::GatedDeltaNet(m), Projection::GdnIn) => (&m.rot_in, 2),
            (Mixer::GatedDeltaNet(m), Projection::GdnOut) => (&m.rot_out, 1),
            (Mixer::Attention(m), Projection::AttnIn) => (&m.rot_in, 3),
            (Mixer::Attention(m), Projection::AttnOut) => (&m.rot_out, 1),
            (_, Projection::MlpIn) => (&layer.mlp.rot_in, 2),
            (_, Projection::MlpOut) => (&layer.mlp.rot_down, 1),
            _ => return Err(Self::no_such(l, layer, p.name())),
        };
        Ok(signs.as_deref().map(|s| (s, folded)))
    }

    /// A rotated pack's embedding signs: the gathered rows are restored as `S·(H·z / 32)` (`None`: not rotated).
    pub fn embedding_signs(&self) -> Option<&[f32]> {
        self.embed_signs.as_deref()
    }

    /// A rotated pack's head signs: the head reads the final hidden rows rotated by `R` (`None`: not rotated).
    pub fn head_signs(&self) -> Option<&[f32]> {
        self.head_signs.as_deref()
    }

    /// Parameter `p` of layer `l` (see [`Param`] for its shape and form). An error when layer `l` has none.
    pub fn param(&self, l: usize, p: Param) -> Result<&[f32], ModelError> {
        let layer = self.layer(l)?;
        Ok(match (&layer.mixer, p) {
            (_, Param::NormGain(NormSite::Input)) => &layer.input_norm.gain,
            (_, Param::NormGain(NormSite::Post)) => &layer.post_norm.gain,
            (Mixer::GatedDeltaNet(m), Param::ConvTaps) => &m.conv,
            (Mixer::GatedDeltaNet(m), Param::NegDecay) => &m.neg_a,
            (Mixer::GatedDeltaNet(m), Param::DtBias) => &m.dt_bias,
            (Mixer::GatedDeltaNet(m), Param::GatedNormWeight) => &m.norm,
            (Mixer::Attention(m), Param::QNormGain) => &m.q_norm.gain,
            (Mixer::Attention(m), Param::KNormGain) => &m.k_norm.gain,
            (Mixer::Attention(m), Param::RopeInvFreq) => &m.inv_freq,
            _ => return Err(Self::no_such(l, layer, &format!("{p:?}"))),
        })
    }

    fn layer(&self, l: usize) -> Result<&Layer, ModelError> {
        self.layers.get(l).ok_or_else(|| {
            ModelError::Weights(format!("layer {l} is outside 0..{}", self.layers.len()))
        })
    }

    fn no_such(l: usize, layer: &Layer, what: &str) -> ModelError {
        let kind = match layer.mixer {
            Mixer::GatedDeltaNet(_) => "a Gated DeltaNet",
            Mixer::Attention(_) => "an attention",
        };
        ModelError::Weights(format!("layer {l} is {kind} layer: it has no {what}"))
    }

    fn norm_params(&self) -> usize {
        let c = &self.config.text;
        // final norm + two per layer + q/k norms per attention layer
        c.hidden_size * (1 + 2 * c.num_hidden_layers)
            + c.count(LayerKind::Attention) * 2 * c.head_dim
    }
}

/// The CPU implementation of the op set over one batch: `x` the residual [N, H], `h` the normed rows the next
/// input projection reads, and each op's activations between the ops of one layer. Every residual update is
/// added at once (nothing is deferred into the next norm).
struct CpuLayers<'m, 'i, 's, 'a> {
    model: &'m Model,
    items: &'i mut [(&'s mut SequenceState, &'a [u32])],
    segs: &'i [Seg],
    n: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    gdn: Option<GdnScratch>,
    attn: Option<AttnScratch>,
    /// The MLP's gate and up rows.
    mlp: (Vec<f32>, Vec<f32>),
}

impl<'m> CpuLayers<'m, '_, '_, '_> {
    fn layer(&self, l: usize) -> &'m Layer {
        let m: &'m Model = self.model;
        &m.layers[l]
    }

    /// Every item's state at layer `l`, in segment order.
    fn states<'b>(
        items: &'b mut [(&mut SequenceState, &[u32])],
        l: usize,
    ) -> Vec<&'b mut LayerState> {
        items.iter_mut().map(|(s, _)| &mut s.layers[l]).collect()
    }

    fn gdn(&self, l: usize) -> &'m GatedDeltaNet {
        match &self.layer(l).mixer {
            Mixer::GatedDeltaNet(m) => m,
            Mixer::Attention(_) => unreachable!("layer {l} is an attention layer"),
        }
    }

    fn attn(&self, l: usize) -> &'m Attention {
        match &self.layer(l).mixer {
            Mixer::Attention(m) => m,
            Mixer::GatedDeltaNet(_) => unreachable!("layer {l} is a Gated DeltaNet layer"),
        }
    }

    /// `op` of layer `l`'s Gated DeltaNet over its scratch and every segment's state at that layer.
    fn gdn_op(
        &mut self,
        l: usize,
        op: impl FnOnce(&GatedDeltaNet, &mut GdnScratch, &[Seg], &mut [&mut LayerState]),
    ) -> Result<(), ModelError> {
        let block = self.gdn(l);
        let mut states = Self::states(self.items, l);
        op(
            block,
            self.gdn.as_mut().expect(PROJECTED),
            self.segs,
            &mut states,
        );
        Ok(())
    }

    /// `op` of layer `l`'s attention over its scratch and every segment's state at that layer.
    fn attn_op(
        &mut self,
        l: usize,
        op: impl FnOnce(&Attention, &mut AttnScratch, &[Seg], &mut [&mut LayerState]),
    ) -> Result<(), ModelError> {
        let block = self.attn(l);
        let mut states = Self::states(self.items, l);
        op(
            block,
            self.attn.as_mut().expect(PROJECTED),
            self.segs,
            &mut states,
        );
        Ok(())
    }
}

/// The mixer's scratch exists from its input projection on: `run_layers` always calls that first.
const PROJECTED: &str = "run_layers projects a mixer's input before its other ops";

impl LayerOps for CpuLayers<'_, '_, '_, '_> {
    type Error = ModelError;

    fn embed(&mut self) -> Result<(), ModelError> {
        let hid = self.model.hidden_size();
        // x: [N, H]
        let mut x = vec![0.0f32; self.n * hid];
        for (seg, (_, ids)) in self.segs.iter().zip(self.items.iter()) {
            for (i, &id) in ids.iter().enumerate() {
                let r = seg.start + i;
                self.model
                    .embed
                    .read_f32(id as usize * hid, &mut x[r * hid..(r + 1) * hid]);
            }
        }
        if let Some(signs) = &self.model.embed_signs {
            // The rows were stored as R·e: e = Rᵀ·z.
            hadamard_unrotate(&mut x, signs);
        }
        self.x = x;
        Ok(())
    }

    fn norm(&mut self, l: usize, site: NormSite) -> Result<(), ModelError> {
        let layer = self.layer(l);
        let norm = match site {
            NormSite::Input => &layer.input_norm,
            NormSite::Post => &layer.post_norm,
        };
        self.h = norm.forward(&self.x);
        Ok(())
    }

    fn project_in(&mut self, l: usize, proj: Projection) -> Result<(), ModelError> {
        let n = self.n;
        match proj {
            Projection::GdnIn => self.gdn = Some(self.gdn(l).project(&self.h, n)),
            Projection::AttnIn => self.attn = Some(self.attn(l).project(&self.h, n)),
            Projection::MlpIn => self.mlp = self.layer(l).mlp.gate_up(&self.h, n),
            Projection::GdnOut | Projection::AttnOut | Projection::MlpOut => {
                unreachable!("{proj:?} is an output projection")
            }
        }
        Ok(())
    }

    fn gdn_prep(&mut self, l: usize) -> Result<(), ModelError> {
        self.gdn_op(l, |m, s, segs, states| m.prep(s, segs, states))
    }

    fn gated_delta(&mut self, l: usize) -> Result<(), ModelError> {
        self.gdn_op(l, |m, s, segs, states| m.delta(s, segs, states))
    }

    fn gated_norm(&mut self, l: usize) -> Result<(), ModelError> {
        self.gdn_op(l, |m, s, _, _| m.gated_norm(s))
    }

    fn attn_prep(&mut self, l: usize) -> Result<(), ModelError> {
        self.attn_op(l, |m, s, segs, states| m.prep(s, segs, states))
    }

    fn attention(&mut self, l: usize) -> Result<(), ModelError> {
        self.attn_op(l, |m, s, segs, states| m.attend(s, segs, states))
    }

    fn swiglu(&mut self, l: usize) -> Result<(), ModelError> {
        let mlp = &self.layer(l).mlp;
        let (g, u) = &mut self.mlp;
        mlp.activate(g, u);
        Ok(())
    }

    fn project_residual(&mut self, l: usize, proj: Projection) -> Result<(), ModelError> {
        let n = self.n;
        let y = match proj {
            Projection::GdnOut => {
                let s = self.gdn.take().expect(PROJECTED);
                self.gdn(l).project_out(&s, n)
            }
            Projection::AttnOut => {
                let s = self.attn.take().expect(PROJECTED);
                self.attn(l).project_out(&s, n)
            }
            Projection::MlpOut => self.layer(l).mlp.down(&self.mlp.0, n),
            Projection::GdnIn | Projection::AttnIn | Projection::MlpIn => {
                unreachable!("{proj:?} is an input projection")
            }
        };
        add_assign(&mut self.x, &y);
        Ok(())
    }
}
