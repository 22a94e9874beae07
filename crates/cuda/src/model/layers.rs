//! The model crate's op set as launches ([`Launches`], driven by `onepass_model::layer_ops::run_layers` from
//! [`CudaModel::run_layers`]: this crate holds no layer loop of its own), the precision-dependent GEMM inputs and
//! residual updates (each projection dispatched on its weights' formats: cuBLAS or the bf16 GEMV for float ones,
//! [`crate::qgemm`] for block-format ones), a rotated pack's Hadamard sites, and the readout (label rows or full
//! logits).

use onepass_model::layer_ops::{self, LayerOps};

use super::*;
use crate::ops::RotSrc;
use crate::qgemm::Act;

impl CudaModel {
    pub(super) fn head(&self) -> W {
        self.lm_head.as_ref().unwrap_or(&self.embed).w
    }

    /// The activation (GEMM input) buffer at `p` for `rows` rows of `k` values of residual projection `lin`, in
    /// this model's precision: f16 times the power of two `lin` reads it at ([`Linear::f16_exp`], the half
    /// precision), else in split inputs ([`GemmInputs::Split`], and a half-precision residual projection on both
    /// planes) the producer writes the hi and lo bf16 planes ([2, rows, k]) itself.
    pub(super) fn act(&self, p: u64, rows: usize, k: usize, lin: &Linear) -> Out {
        if let Some(e) = lin.f16_exp {
            return Out::F16(p, e);
        }
        match self.prec.inputs() {
            GemmInputs::Bf16 => Out::Bf16(p),
            GemmInputs::F32 => Out::F32(p),
            GemmInputs::Split | GemmInputs::Half => Out::Split(p, rows * k),
        }
    }

    /// The input buffer of an input projection at `p` (a norm writes it) and its row stride: in
    /// split inputs each row holds its hi and lo planes side by side (`[hi | lo]`, 2K bf16), which the
    /// projection's twice-stored weight (`[W | W]`) multiplies in one GEMM over 2K; in the half precision f16 rows;
    /// else as [`CudaModel::act`].
    pub(super) fn act_in(&self, p: u64, k: usize) -> (Out, usize) {
        match self.prec.inputs() {
            GemmInputs::Split => (Out::Split(p, k), 2 * k),
            GemmInputs::Half => (Out::F16(p, 0), k),
            GemmInputs::Bf16 => (Out::Bf16(p), k),
            GemmInputs::F32 => (Out::F32(p), k),
        }
    }

    /// A block-format GEMM ([`crate::qgemm::gemm_q`]) over this model's dequantisation scratch.
    fn gemm_q(
        &self,
        x: Act,
        t: usize,
        k: usize,
        w: W,
        n: usize,
        y: (u64, usize),
        beta: f32,
    ) -> Result<(), CudaError> {
        let s = self
            .dequant
            .as_ref()
            .map_or((0, 0), |b| (self.gpu.ptr(b), b.len()));
        crate::qgemm::gemm_q(&self.gpu, x, t, k, w, n, y, beta, s)
    }

    /// The [`Act`] of an input projection's input at `x` ([`CudaModel::act_in`]'s layout): split mode both planes
    /// (`both`) or the hi plane alone. The half precision's f16 rows have none (its models have no block-format
    /// input projections: the upload falls back to mixed for those).
    fn act_in_q(&self, x: u64, k: usize, both: bool) -> Result<Act, CudaError> {
        Ok(match self.prec.inputs() {
            GemmInputs::Bf16 => Act::Bf16 { x, ldx: k },
            GemmInputs::F32 => Act::F32 { x, ldx: k },
            GemmInputs::Split if both => Act::Split {
                x,
                ldx: 2 * k,
                lo: k,
            },
            GemmInputs::Split => Act::Bf16 { x, ldx: 2 * k },
            GemmInputs::Half => {
                return Err(CudaError::Unsupported(
                    "a block-format input projection in the half precision".into(),
                ))
            }
        })
    }

    /// `y = x · wᵀ` for an input projection, part by part (each into its rows of y): `x` [T, K] as
    /// [`CudaModel::act_in`] laid it out, at `p.act` (a rotated part, or any part of an unrotated site) or `p.actu`
    /// (the normed input as it is, beside its rotation); in split mode both planes (`both`: a float part's one GEMM
    /// over 2K) or the hi plane alone. `invariant`: a float part batch-invariant ([`CudaModel::invariant_gemms`]).
    pub(super) fn gemm_in(
        &self,
        p: &FwdPtrs,
        t: usize,
        k: usize,
        lin: &Linear,
        y: u64,
        ldy: usize,
        both: bool,
        invariant: bool,
    ) -> Result<(), CudaError> {
        let inv = self.invariant_gemms(invariant, t);
        for part in &lin.parts {
            let x = if part.rot || lin.rot.is_none() {
                p.act
            } else {
                p.actu
            };
            let (_, ldx) = self.act_in(x, k);
            let (w, yp) = (&part.w, y + 4 * part.row0 as u64);
            if w.w.is_block() {
                let a = self.act_in_q(x, k, both)?;
                self.gemm_q(a, t, k, w.w, part.rows, (yp, ldy), 0.0)?;
            } else if both {
                crate::gemm::gemm_split_as(
                    &self.gpu,
                    inv,
                    (x, ldx),
                    t,
                    k,
                    (w.w, w.ld),
                    part.rows,
                    (yp, ldy),
                    0.0,
                )?;
            } else {
                let (g, rows) = (&*self.gpu, part.rows);
                crate::gemm::gemm_ld_as(g, inv, x, ldx, t, k, w.w, w.ld, rows, yp, ldy, 0.0)?;
            }
        }
        Ok(())
    }

    /// Whether a forward's float product over `t` rows runs batch-invariant: the forward does (`invariant`, its
    /// [`Shape`]'s) and has more than one row (a decode step, one row, keeps the few-row GEMV: nothing is stacked
    /// with it). Block-format weights (Q8_0, PQ2_0) are not covered.
    pub(super) fn invariant_gemms(&self, invariant: bool, t: usize) -> bool {
        invariant && t > 1
    }

    /// `out = rms_norm(x) · final_norm` for `n` rows (f32).
    pub(super) fn final_norm(
        &self,
        p: &FwdPtrs,
        s: Shape,
        out: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let o = Out::F32(self.gpu.ptr(out));
        let pending = self
            .layers
            .last()
            .is_some_and(|l| self.defers(s.split, Projection::MlpOut, &l.w_down, s.n, self.inter));
        self.norm(p, s.n, self.final_norm.ptr, pending, (o, self.hid))
    }

    /// Whether projection `p` (weights `lin`) multiplies both planes of its input (split mode, and `p` among
    /// `split`; in the half precision a projection whose input is not f16, [`Linear::f16_exp`], fixed at upload): a
    /// residual GEMM then leaves two halves for the next [`CudaModel::norm`] to add.
    pub(super) fn both_planes(&self, split: SplitGemms, p: Projection, lin: &Linear) -> bool {
        match self.prec.inputs() {
            GemmInputs::Split => split.has(p),
            GemmInputs::Half => lin.f16_exp.is_none(),
            GemmInputs::Bf16 | GemmInputs::F32 => false,
        }
    }

    /// Whether residual projection `p` (weights `lin`, over `t` rows of K = `k`) leaves its two halves for the next
    /// norm to add: both planes of a float weight in a model without rotation (a block-format GEMM, and any GEMM of
    /// a rotated pack, whose norms rotate their output, adds into the residual itself), unless one token row's GEMV
    /// adds them ([`CudaModel::direct_residual`]).
    pub(super) fn defers(
        &self,
        split: SplitGemms,
        p: Projection,
        lin: &Linear,
        t: usize,
        k: usize,
    ) -> bool {
        self.both_planes(split, p, lin)
            && !lin.has_blocks()
            && !self.rotated
            && !self.direct_residual(t, k, lin)
    }

    /// Whether a residual projection of one token row on both planes adds their products into x itself (one GEMV
    /// per part, every part a bf16 weight the GEMV takes).
    fn direct_residual(&self, t: usize, k: usize, lin: &Linear) -> bool {
        t == 1
            && k.is_multiple_of(8)
            && lin.parts.iter().all(|pt| {
                pt.w.ld.is_multiple_of(8) && matches!(pt.w.w, W::Bf16(a) if a.is_multiple_of(16))
            })
    }

    /// Whether one token row's norm can be formed inside the input projection that reads it
    /// ([`crate::gemm::gemv_norm`]): a bf16 precision and one bf16 part reading the input as it is, or the half
    /// precision's one f16 part.
    pub(super) fn fuses_norm(&self, lin: &Linear) -> bool {
        let aligned = |a: u64| a.is_multiple_of(16);
        self.prec != Precision::F32
            && self.hid.is_multiple_of(8)
            && lin.rot.is_none()
            && matches!(&lin.parts[..], [pt] if matches!(pt.w.w, W::Bf16(a) | W::Half { w: a, .. } if aligned(a)) && pt.w.ld.is_multiple_of(8))
    }

    /// RMSNorm of the residual x into `out` (row stride `ldo`); `pending` (split mode only: see
    /// [`CudaModel::both_planes`]) first adds the two halves of the last residual GEMM's output
    /// ([`CudaModel::gemm_residual`]).
    pub(super) fn norm(
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

    /// The residual update `x += act · wᵀ` (act: [T, K]). On both planes (`both`, split mode) of a float weight
    /// that [`CudaModel::defers`], one GEMM over both writes its two halves to the fold buffer and the next
    /// [`CudaModel::norm`] adds them to x (weights read once); → whether that add is pending. Otherwise the GEMMs
    /// accumulate into x (split mode: both planes, or the hi plane alone).
    pub(super) fn gemm_residual(
        &self,
        p: &FwdPtrs,
        t: usize,
        k: usize,
        lin: &Linear,
        proj: Projection,
        split: SplitGemms,
        invariant: bool,
    ) -> Result<bool, CudaError> {
        let (hid, both) = (self.hid, self.both_planes(split, proj, lin));
        let (g, inv) = (&*self.gpu, self.invariant_gemms(invariant, t));
        let lo = p.act + 2 * (t * k) as u64;
        for part in &lin.parts {
            let (w, y) = (part.w.w, p.x + 4 * part.row0 as u64);
            if w.is_block() {
                let a = match self.prec.inputs() {
                    GemmInputs::Bf16 => Act::Bf16 { x: p.act, ldx: k },
                    GemmInputs::F32 => Act::F32 { x: p.act, ldx: k },
                    GemmInputs::Split | GemmInputs::Half if both => Act::Split {
                        x: p.act,
                        ldx: k,
                        lo: t * k,
                    },
                    GemmInputs::Split | GemmInputs::Half => Act::Bf16 { x: p.act, ldx: k },
                };
                self.gemm_q(a, t, k, w, part.rows, (y, hid), 1.0)?;
            } else if both && self.direct_residual(t, k, lin) {
                // One token row: both planes' products into the residual in one GEMV.
                let wl = (w, part.w.ld);
                if !crate::gemm::gemv_planes(&self.gpu, p.act, k, wl, part.rows, y, 1.0)? {
                    return Err(CudaError::Unsupported(
                        "a residual projection's input is not 16-byte aligned".into(),
                    ));
                }
            } else if self.defers(split, proj, lin, t, k) {
                crate::gemm::gemm_ld_as(g, inv, p.act, k, 2 * t, k, w, k, hid, p.fold, hid, 0.0)?;
                return Ok(true);
            } else {
                crate::gemm::gemm_ld_as(g, inv, p.act, k, t, k, w, k, part.rows, y, hid, 1.0)?;
                if both {
                    crate::gemm::gemm_ld_as(g, inv, lo, k, t, k, w, k, part.rows, y, hid, 1.0)?;
                }
            }
        }
        Ok(false)
    }

    /// Every layer of one forward over the scratch at `p` (no allocation on the device, no host synchronisation:
    /// capturable): the model crate's layer sequence over this model's launches ([`Launches`]).
    pub(super) fn run_layers(&self, p: &FwdPtrs, s: Shape) -> Result<(), CudaError> {
        let kinds: Vec<LayerKind> = self
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Gdn(_) => LayerKind::GatedDeltaNet,
                Mixer::Attn(_) => LayerKind::Attention,
            })
            .collect();
        let mut ops = Launches {
            m: self,
            p,
            s,
            // Read once: every layer of this forward multiplies the same way.
            tc: self.tc_arith(),
            pending: false,
            deferred: None,
            table: 0,
            next_table: 0,
        };
        layer_ops::run_layers(&kinds, &mut ops)
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
        let rot = self.head_input(h)?;
        ops::rows_dot(
            g,
            rot.as_ref().map_or(g.ptr(&h.buf), |r| g.ptr(r)),
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

    /// Full-vocabulary logits of the hidden rows `rows` only (a prefill chunk's last row: the head runs on the rows
    /// asked for, not on the whole chunk). → [rows.len(), V]
    pub fn logits_at(&self, h: &CudaHidden, rows: &[usize]) -> Result<Vec<f32>, CudaError> {
        match self.select_rows(h, rows)? {
            Some(sel) => self.logits(&sel),
            None => self.logits(h),
        }
    }

    /// Full-vocabulary logits of every hidden row (for tests and `onepass logits`). → [N, V]
    pub fn logits(&self, h: &CudaHidden) -> Result<Vec<f32>, CudaError> {
        let out = self.logits_device(h)?;
        self.gpu.download(&out, h.rows * self.vocab)
    }

    /// Greedy decoding's next tokens: the highest logit's id of each of hidden rows `rows` (the lowest id on ties,
    /// as the host's argmax over [`CudaModel::logits_at`]'s values), picked on the GPU: only the ids come back.
    pub fn argmax_at(&self, h: &CudaHidden, rows: &[usize]) -> Result<Vec<u32>, CudaError> {
        let g = &*self.gpu;
        let sel = self.select_rows(h, rows)?;
        let h = sel.as_ref().unwrap_or(h);
        let logits = self.logits_device(h)?;
        let ids: CudaSlice<i32> = g.alloc(h.rows)?;
        ops::argmax_rows(g, g.ptr(&logits), h.rows, self.vocab, g.ptr(&ids))?;
        Ok(g.download(&ids, h.rows)?
            .into_iter()
            .map(|i| i as u32)
            .collect())
    }

    /// The hidden rows `rows` of `h` as their own [`CudaHidden`]; `None` when they are all of `h`'s rows in order.
    fn select_rows(&self, h: &CudaHidden, rows: &[usize]) -> Result<Option<CudaHidden>, CudaError> {
        if rows.iter().copied().eq(0..h.rows) {
            return Ok(None);
        }
        if let Some(&bad) = rows.iter().find(|&&r| r >= h.rows) {
            return Err(CudaError::Model(ModelError::Input(format!(
                "readout of row {bad} of {} hidden rows",
                h.rows
            ))));
        }
        let g = &*self.gpu;
        let mut sel: CudaSlice<f32> = g.alloc(rows.len().max(1) * h.hid)?;
        for (i, &r) in rows.iter().enumerate() {
            g.copy(&h.buf, r * h.hid, &mut sel, i * h.hid, h.hid)?;
        }
        Ok(Some(CudaHidden {
            buf: sel,
            rows: rows.len(),
            hid: h.hid,
        }))
    }

    /// A rotated pack's label-row input: the hidden rows rotated by the head's signs (f32). `None` when the head is
    /// not rotated.
    fn head_input(&self, h: &CudaHidden) -> Result<Option<CudaSlice<f32>>, CudaError> {
        let Some(signs) = &self.head_rot else {
            return Ok(None);
        };
        let g = &*self.gpu;
        let buf: CudaSlice<f32> = g.alloc(h.rows * h.hid)?;
        ops::hadamard_rows(
            g,
            (g.ptr(&h.buf), h.hid),
            h.rows,
            h.hid,
            signs.ptr,
            false,
            None,
            (Out::F32(g.ptr(&buf)), h.hid),
        )?;
        Ok(Some(buf))
    }

    /// The head over every hidden row, left on the device. → [N, V] f32
    fn logits_device(&self, h: &CudaHidden) -> Result<CudaSlice<f32>, CudaError> {
        let g = &*self.gpu;
        let out: CudaSlice<f32> = g.alloc(h.rows * self.vocab)?;
        // Room for the head's input: the rows in bf16 (the bf16 precisions) or rotated (a rotated pack's head).
        let hb: CudaSlice<f32> = g.alloc(h.rows * h.hid)?;
        self.head_into(g.ptr(&h.buf), h.rows, g.ptr(&hb), g.ptr(&out))?;
        Ok(out)
    }

    /// The head over `rows` final-normed hidden rows at `h` (f32) into `out` ([rows, V] f32). `hb`: room for the
    /// head's input, `rows · H` f32 (4 bytes each): the rows rounded to bf16 (a float head in the bf16 precisions),
    /// or rotated by the head's signs (a rotated pack); unused otherwise. A block-format head runs [`crate::qgemm`]
    /// on f32 rows in the f32 and split precisions (its weights are exact, so the split precision's logits are not
    /// held to bf16 inputs), on bf16 ones in bf16; a float one cuBLAS (or the bf16 GEMV).
    pub(super) fn head_into(
        &self,
        h: u64,
        rows: usize,
        hb: u64,
        out: u64,
    ) -> Result<(), CudaError> {
        let g = &*self.gpu;
        let head = self.head();
        let f32_in = match self.prec.inputs() {
            GemmInputs::F32 => true,
            GemmInputs::Split | GemmInputs::Half => head.is_block(),
            GemmInputs::Bf16 => false,
        };
        let x = match (&self.head_rot, f32_in) {
            (Some(signs), _) => {
                let o = if f32_in { Out::F32(hb) } else { Out::Bf16(hb) };
                ops::hadamard_rows(
                    g,
                    (h, self.hid),
                    rows,
                    self.hid,
                    signs.ptr,
                    false,
                    None,
                    (o, self.hid),
                )?;
                hb
            }
            (None, false) => {
                ops::to_bf16(g, h, hb, rows * self.hid)?;
                hb
            }
            (None, true) => h,
        };
        if head.is_block() {
            let a = if f32_in {
                Act::F32 { x, ldx: self.hid }
            } else {
                Act::Bf16 { x, ldx: self.hid }
            };
            return self.gemm_q(a, rows, self.hid, head, self.vocab, (out, self.vocab), 0.0);
        }
        g.gemm(x, rows, self.hid, head, self.vocab, out, self.vocab, 0.0)
    }
}

/// The op set of one forward as launches into the model's stream over the scratch at `p`: the precision of every
/// activation ([`CudaModel::act`]), the deferred residual add of a both-planes GEMM (`pending`) and the choice of
/// gated delta and attention kernels for this batch's [`Shape`] are this implementation's, not the sequence's.
struct Launches<'a> {
    m: &'a CudaModel,
    p: &'a FwdPtrs,
    s: Shape,
    tc: TcArith,
    /// The last residual GEMM left two halves in the fold buffer (see [`CudaModel::gemm_residual`]).
    pending: bool,
    /// A norm not launched yet (its gain): for one token row the next input projection forms it itself
    /// ([`crate::gemm::gemv_norm`]).
    deferred: Option<u64>,
    /// The current layer's first entry in the pointer table (its mixer's per-segment state pointers), and the
    /// next layer's.
    table: usize,
    next_table: usize,
}

impl<'a> Launches<'a> {
    fn layer(&self, l: usize) -> &'a Layer {
        let m: &'a CudaModel = self.m;
        &m.layers[l]
    }

    fn gdn(&self, l: usize) -> &'a GdnLayer {
        let m: &'a CudaModel = self.m;
        match &m.layers[l].mixer {
            Mixer::Gdn(m) => m,
            Mixer::Attn(_) => unreachable!("layer {l} is an attention layer"),
        }
    }

    fn attn(&self, l: usize) -> &'a AttnLayer {
        let m: &'a CudaModel = self.m;
        match &m.layers[l].mixer {
            Mixer::Attn(m) => m,
            Mixer::Gdn(_) => unreachable!("layer {l} is a Gated DeltaNet layer"),
        }
    }

    /// A Gated DeltaNet layer's pointers: (conv states, recurrent states, initial states) in the table, the core
    /// output in `mid` (after the conv output [N, cd]), β in `gates` (after g [N, HV]).
    fn gdn_ptrs(&self, m: &GdnLayer) -> (u64, u64, u64, u64, u64) {
        let (p, nseg, n) = (self.p, self.s.nseg as u64, self.s.n);
        let conv_p = p.ptrs + 8 * self.table as u64;
        let ssm_p = conv_p + 8 * nseg;
        let init_p = ssm_p + 8 * nseg;
        let core_p = p.mid + 4 * (n * m.cd) as u64;
        let beta_p = p.gates + 4 * (n * m.d.hv) as u64;
        (conv_p, ssm_p, init_p, core_p, beta_p)
    }

    /// A mixer's input projection starts its layer's entries in the pointer table.
    fn next_entries(&mut self, proj: Projection) {
        let per = match proj {
            Projection::GdnIn => GDN_ENTRIES,
            Projection::AttnIn => KV_ENTRIES,
            _ => return,
        };
        self.table = self.next_table;
        self.next_table += per * self.s.nseg;
    }

    fn kv_ptr(&self) -> u64 {
        self.p.ptrs + 8 * self.table as u64
    }

    /// Where the producer of `lin`'s input (rows of k) writes: the f32 rotation scratch when `lin` reads a
    /// rotated input ([`Launches::rotate_site`] then rotates it into the activation), else the activation itself.
    fn site_out(&self, lin: &Linear, k: usize) -> Out {
        match lin.rot {
            Some(_) => Out::F32(self.p.rot),
            None => self.m.act(self.p.act, self.s.n, k, lin),
        }
    }

    /// A rotated site that is not a norm's: the producer's f32 rows rotated into the activation (one launch).
    fn rotate_site(&self, lin: &Linear, k: usize) -> Result<(), CudaError> {
        let Some(signs) = &lin.rot else {
            return Ok(());
        };
        let (m, p, n) = (self.m, self.p, self.s.n);
        ops::hadamard_rows(
            &m.gpu,
            (p.rot, k),
            n,
            k,
            signs.ptr,
            false,
            None,
            (m.act(p.act, n, k, lin), k),
        )?;
        m.mark("rotation")
    }
}

impl LayerOps for Launches<'_> {
    type Error = CudaError;

    fn embed(&mut self) -> Result<(), CudaError> {
        let (m, p) = (self.m, self.p);
        m.mark("upload")?;
        ops::embed_gather(&m.gpu, m.embed.w, p.ids, p.x, self.s.n, m.hid)?;
        if let Some(signs) = &m.embed_rot {
            // The rows were stored as R·e: e = Rᵀ·z, in place.
            ops::hadamard_rows(
                &m.gpu,
                (p.x, m.hid),
                self.s.n,
                m.hid,
                signs.ptr,
                true,
                None,
                (Out::F32(p.x), m.hid),
            )?;
        }
        m.mark("embed")
    }

    fn norm(&mut self, l: usize, site: NormSite) -> Result<(), CudaError> {
        let (m, p) = (self.m, self.p);
        let layer = self.layer(l);
        let (gain, next) = match (site, &layer.mixer) {
            (NormSite::Input, Mixer::Gdn(g)) => (layer.in_norm.ptr, &g.w_in),
            (NormSite::Input, Mixer::Attn(a)) => (layer.in_norm.ptr, &a.w_in),
            (NormSite::Post, _) => (layer.post_norm.ptr, &layer.w_gu),
        };
        let Some(signs) = &next.rot else {
            if self.s.n == 1 && !self.pending && m.fuses_norm(next) {
                self.deferred = Some(gain);
                return Ok(());
            }
            return m.norm(p, self.s.n, gain, self.pending, m.act_in(p.act, m.hid));
        };
        if self.pending {
            return Err(CudaError::Unsupported(
                "a residual add deferred into a rotated norm".into(),
            ));
        }
        // A rotated site: the norm and its rotation in one launch, the normed rows as they are beside them for the
        // parts that read those (a Gated DeltaNet's in_proj_a and in_proj_b).
        let raw = next
            .parts
            .iter()
            .any(|pt| !pt.rot)
            .then(|| m.act_in(p.actu, m.hid));
        if self.s.n == 1 && ops::rotate_row_takes(m.hid) {
            let (raw, raw_mode) = raw.map_or((0, 0), |(o, _)| o.parts());
            let src = RotSrc {
                x: p.x,
                w: gain,
                signs: signs.ptr,
                raw,
                eps: m.eps,
                raw_mode,
            };
            ops::rotate_row_norm(&m.gpu, src, m.hid, m.act_in(p.act, m.hid).0)?;
            return m.mark("rms_norm + rotation");
        }
        ops::hadamard_rows(
            &m.gpu,
            (p.x, m.hid),
            self.s.n,
            m.hid,
            signs.ptr,
            false,
            Some((gain, m.eps, raw)),
            m.act_in(p.act, m.hid),
        )?;
        m.mark("rms_norm + rotation")
    }

    fn project_in(&mut self, l: usize, proj: Projection) -> Result<(), CudaError> {
        let (m, p, n) = (self.m, self.p, self.s.n);
        let (lin, pw, name) = match proj {
            Projection::GdnIn => (&self.gdn(l).w_in, self.gdn(l).proj_width(), "gemm gdn in"),
            Projection::AttnIn => (
                &self.attn(l).w_in,
                self.attn(l).proj_width(),
                "gemm attn in",
            ),
            Projection::MlpIn => (&self.layer(l).w_gu, 2 * m.inter, "gemm mlp gate|up"),
            _ => unreachable!("{proj:?} is an output projection"),
        };
        let both = m.both_planes(self.s.split, proj, lin);
        if let Some(gain) = self.deferred.take() {
            // Both planes in split mode where the projection multiplies both, else the one bf16 (or f16) plane.
            let planes = if both { 2 } else { 1 };
            let w = &lin.parts[0].w;
            let x = (p.x, gain, m.eps);
            if crate::gemm::gemv_norm(&m.gpu, x, planes, m.hid, (w.w, w.ld), pw, p.proj)? {
                self.next_entries(proj);
                return m.mark("norm + input projection");
            }
            m.norm(p, n, gain, false, m.act_in(p.act, m.hid))?;
        }
        self.next_entries(proj);
        m.gemm_in(p, n, m.hid, lin, p.proj, pw, both, self.s.invariant)?;
        m.mark(name)
    }

    fn gdn_prep(&mut self, l: usize) -> Result<(), CudaError> {
        let (m, p, s) = (self.m, self.p, self.s);
        let g = self.gdn(l);
        let (d, pw) = (g.d, g.proj_width());
        let (conv_p, _, _, _, beta_p) = self.gdn_ptrs(g);
        let a_off = g.cd + d.hv * d.dv;
        ops::gdn_conv_prep(
            &m.gpu,
            p.proj,
            pw,
            p.mid,
            g.conv.ptr,
            g.kernel,
            g.cd,
            p.segs,
            p.tok,
            conv_p,
            p.par,
            // The conv states advanced: every segment's, or the roots' alone when the children's are dropped
            // (their rows in the table point at their root's state, which they must not touch).
            if s.keep_children { s.nseg } else { s.roots },
            s.n,
            d,
            1.0 / (d.dk as f32).sqrt(),
            (a_off, a_off + d.hv, g.neg_a.ptr, g.dt_bias.ptr),
            p.gates,
            beta_p,
        )?;
        m.mark("conv, l2norm, gates")
    }

    fn gated_delta(&mut self, l: usize) -> Result<(), CudaError> {
        let (m, p, s) = (self.m, self.p, self.s);
        let g = self.gdn(l);
        let d = g.d;
        let (_, ssm_p, init_p, core_p, beta_p) = self.gdn_ptrs(g);
        if s.max_len == 1 {
            ops::gdn_step(
                &m.gpu, p.mid, g.cd, p.gates, beta_p, core_p, p.segs, ssm_p, s.nseg, d,
            )?;
            return m.mark("gdn step");
        }
        // The WY pre-pass and the state pass on tensor cores (`tc`'s arithmetic, f32 state; the SIMT kernels for
        // head dims they do not take), or the f32 SIMT pair with GdnKernels::Simt (never in a tree:
        // tree_min_root).
        if m.gdn_tc {
            crate::gdn_tc::gdn_tc_chunked(
                &m.gpu,
                self.tc,
                p.mid,
                g.cd,
                p.gates,
                beta_p,
                core_p,
                p.segs,
                crate::gdn_tc::SegStates {
                    states: ssm_p,
                    init: init_p,
                    roots: s.roots,
                    keep_children: s.keep_children,
                    leaf_children: s.short_children && m.gdn_leaf,
                    long_children: s.long_children,
                    chunks: s.chunks,
                },
                s.nseg,
                d,
                s.n,
                s.max_len,
                p.wy,
            )?;
        } else {
            ops::gdn_chunked_wy(
                &m.gpu, p.mid, g.cd, p.gates, beta_p, core_p, p.segs, ssm_p, s.nseg, d, s.n,
                s.max_len, p.wy,
            )?;
        }
        m.mark("gdn chunked")
    }

    fn gated_norm(&mut self, l: usize) -> Result<(), CudaError> {
        let (m, p, n) = (self.m, self.p, self.s.n);
        let g = self.gdn(l);
        let d = g.d;
        let (_, _, _, core_p, _) = self.gdn_ptrs(g);
        let z_off = g.cd;
        if let Some(signs) = g
            .w_out
            .rot
            .as_ref()
            .filter(|_| ops::gated_norm_rotate_takes(d.hv, d.dv))
        {
            // The out_proj site: the gated norm and its rotation in one launch.
            let k = d.hv * d.dv;
            ops::gated_norm_rotate(
                &m.gpu,
                (core_p, p.proj + 4 * z_off as u64, g.proj_width()),
                g.norm.ptr,
                g.eps,
                n,
                (d.hv, d.dv),
                signs.ptr,
                (m.act(p.act, n, k, &g.w_out), k),
            )?;
            return m.mark("gated norm + rotation");
        }
        ops::rms_norm_gated(
            &m.gpu,
            core_p,
            p.proj + 4 * z_off as u64,
            g.proj_width(),
            g.norm.ptr,
            g.eps,
            n,
            d.hv,
            d.dv,
            self.site_out(&g.w_out, d.hv * d.dv),
        )?;
        m.mark("gated norm")?;
        self.rotate_site(&g.w_out, d.hv * d.dv)
    }

    fn attn_prep(&mut self, l: usize) -> Result<(), CudaError> {
        let (m, p, n) = (self.m, self.p, self.s.n);
        let a = self.attn(l);
        ops::attn_prep(
            &m.gpu,
            p.proj,
            a.proj_width(),
            a.q_norm.ptr,
            a.k_norm.ptr,
            a.eps,
            a.inv_freq.ptr,
            a.a,
            n,
            p.tok,
            self.kv_ptr(),
            p.mid,
            m.kv_f16(),
        )?;
        m.mark("attn prep")
    }

    fn attention(&mut self, l: usize) -> Result<(), CudaError> {
        let (m, p, s) = (self.m, self.p, self.s);
        let at = self.attn(l);
        let (a, pw, kv_p) = (at.a, at.proj_width(), self.kv_ptr());
        let scale = 1.0 / (a.head_dim as f32).sqrt();
        let out = self.site_out(&at.w_o, a.heads * a.head_dim);
        if at.tc {
            crate::attn_tc::attention_tc(
                &m.gpu,
                self.tc.attn,
                p.mid,
                p.proj,
                pw,
                p.segs,
                kv_p,
                s.nseg,
                s.max_len,
                s.n,
                a,
                scale,
                out,
                p.attn,
                s.attn_splits,
                s.invariant,
            )?;
        } else {
            ops::attention_tiled(
                &m.gpu, p.mid, p.proj, pw, p.segs, kv_p, s.nseg, s.max_len, a, scale, out,
            )?;
        }
        m.mark("attention")?;
        self.rotate_site(&at.w_o, a.heads * a.head_dim)
    }

    fn swiglu(&mut self, l: usize) -> Result<(), CudaError> {
        let (m, p, n) = (self.m, self.p, self.s.n);
        let down = &self.layer(l).w_down;
        if let Some(signs) = &down.rot {
            // The down projection's site: the SwiGLU and its rotation in one launch.
            let out = (m.act(p.act, n, m.inter, down), m.inter);
            ops::swiglu_rotate(&m.gpu, p.proj, m.inter, n, signs.ptr, out)?;
            return m.mark("swiglu + rotation");
        }
        ops::swiglu(&m.gpu, p.proj, m.inter, n, m.act(p.act, n, m.inter, down))?;
        m.mark("swiglu")
    }

    fn project_residual(&mut self, l: usize, proj: Projection) -> Result<(), CudaError> {
        let (m, p, n) = (self.m, self.p, self.s.n);
        let (w, k, name) = match proj {
            Projection::GdnOut => {
                let g = self.gdn(l);
                (&g.w_out, g.d.hv * g.d.dv, "gemm gdn out")
            }
            Projection::AttnOut => {
                let a = self.attn(l);
                (&a.w_o, a.a.heads * a.a.head_dim, "gemm attn out")
            }
            Projection::MlpOut => (&self.layer(l).w_down, m.inter, "gemm mlp down"),
            _ => unreachable!("{proj:?} is an input projection"),
        };
        self.pending = m.gemm_residual(p, n, k, w, proj, self.s.split, self.s.invariant)?;
        m.mark(name)
    }
}
