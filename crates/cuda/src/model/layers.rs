//! The layer sequence as launches ([`CudaModel::run_layers`]: embed, then per layer the norms, projections, the
//! token mixer and the MLP), the precision-dependent GEMM inputs and residual updates, and the readout (label rows
//! or full logits).

use super::*;

impl CudaModel {
    pub(super) fn head(&self) -> W {
        self.lm_head.as_ref().unwrap_or(&self.embed).w
    }

    /// The activation (GEMM input) buffer at `p` for `rows` rows of `k` values, in this model's precision: in
    /// [`Precision::Bf16Split`] the producer writes the hi and lo bf16 planes ([2, rows, k]) itself.
    pub(super) fn act(&self, p: u64, rows: usize, k: usize) -> Out {
        match self.prec {
            Precision::Bf16 => Out::Bf16(p),
            Precision::F32 => Out::F32(p),
            Precision::Bf16Split => Out::Split(p, rows * k),
        }
    }

    /// The input buffer of an input projection at `p` (a norm writes it) and its row stride: in
    /// [`Precision::Bf16Split`] each row holds its hi and lo planes side by side (`[hi | lo]`, 2K bf16), which the
    /// projection's twice-stored weight (`[W | W]`) multiplies in one GEMM over 2K; else as [`CudaModel::act`].
    pub(super) fn act_in(&self, p: u64, k: usize) -> (Out, usize) {
        match self.prec {
            Precision::Bf16Split => (Out::Split(p, k), 2 * k),
            Precision::Bf16 => (Out::Bf16(p), k),
            Precision::F32 => (Out::F32(p), k),
        }
    }

    /// `y = x · wᵀ` for an input projection: `x` [T, K] as [`CudaModel::act_in`] laid it out; in split mode both
    /// planes (`both`: one GEMM over 2K) or the hi plane alone.
    pub(super) fn gemm_in(
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

    /// `out = rms_norm(x) · final_norm` for `n` rows (f32).
    pub(super) fn final_norm(
        &self,
        p: &FwdPtrs,
        s: Shape,
        out: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let o = Out::F32(self.gpu.ptr(out));
        let pending = self.both_planes(s.split, Projection::MlpOut);
        self.norm(p, s.n, self.final_norm.ptr, pending, (o, self.hid))
    }

    /// Whether projection `p` multiplies both planes of its input (split mode, and `p` among `split`): its residual
    /// GEMM then leaves two halves for the next [`CudaModel::norm`] to add.
    pub(super) fn both_planes(&self, split: SplitGemms, p: Projection) -> bool {
        self.prec == Precision::Bf16Split && split.has(p)
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

    /// The residual update `x += act · wᵀ` (act: [T, K]). On both planes (`both`, split mode) one GEMM over both
    /// writes its two halves to the fold buffer and the next [`CudaModel::norm`] adds them to x (weights read
    /// once); → whether that add is pending. Otherwise the GEMM accumulates into x (split mode: the hi plane alone).
    pub(super) fn gemm_residual(
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
    pub(super) fn run_layers(&self, p: &FwdPtrs, s: Shape) -> Result<(), CudaError> {
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
