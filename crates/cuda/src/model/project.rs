//! The input projections' GEMMs part by part (each part's weights in their own format: cuBLAS or the bf16 GEMV for
//! float ones, [`crate::qgemm`] for block-format ones), and for one token row of a rotated pack the GEMVs that form
//! and rotate their own input ([`CudaModel::gemm_rot`]).

use super::*;
use crate::qgemm::{Act, RotKind, RotSrc};

impl CudaModel {
    /// A block-format GEMM ([`crate::qgemm::gemm_q`]) over this model's dequantisation scratch.
    pub(super) fn gemm_q(
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
    /// (`both`) or the hi plane alone.
    pub(super) fn act_in_q(&self, x: u64, k: usize, both: bool) -> Act {
        match self.prec {
            Precision::Bf16 => Act::Bf16 { x, ldx: k },
            Precision::F32 => Act::F32 { x, ldx: k },
            Precision::Bf16Split if both => Act::Split {
                x,
                ldx: 2 * k,
                lo: k,
            },
            Precision::Bf16Split => Act::Bf16 { x, ldx: 2 * k },
        }
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
        for part in &lin.parts {
            self.gemm_in_part(p, t, k, lin, part, (y, ldy), both, invariant)?;
        }
        Ok(())
    }

    /// One part of [`CudaModel::gemm_in`].
    fn gemm_in_part(
        &self,
        p: &FwdPtrs,
        t: usize,
        k: usize,
        lin: &Linear,
        part: &Part,
        (y, ldy): (u64, usize),
        both: bool,
        invariant: bool,
    ) -> Result<(), CudaError> {
        let inv = self.invariant_gemms(invariant, t);
        let x = if part.rot || lin.rot.is_none() {
            p.act
        } else {
            p.actu
        };
        let (_, ldx) = self.act_in(x, k);
        let (w, yp) = (&part.w, y + 4 * part.row0 as u64);
        if w.w.is_block() {
            let a = self.act_in_q(x, k, both);
            self.gemm_q(a, t, k, w.w, part.rows, (yp, ldy), 0.0)
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
            )
        } else {
            let (g, rows) = (&*self.gpu, part.rows);
            crate::gemm::gemm_ld_as(g, inv, x, ldx, t, k, w.w, w.ld, rows, yp, ldy, 0.0)
        }
    }

    /// Whether a rotated site of one token row feeding `lin` (its input K = `k`) runs fused into `lin`'s GEMVs
    /// ([`crate::qgemm::gemv_pq2_rot`]): a bf16 precision (their integer products), every rotated part PQ2_0 of a
    /// K they take, and (`residual`) every part rotated, or (an input projection) at least one rotated part, whose
    /// first GEMV stores the normed row unrotated for the others.
    pub(super) fn fuses_rotation(&self, lin: &Linear, k: usize, residual: bool) -> bool {
        let rotated = |pt: &Part| pt.rot && crate::qgemm::gemv_rot_takes(pt.w.w, k);
        self.prec != Precision::F32
            && lin.rot.is_some()
            && lin.parts.iter().any(|pt| pt.rot)
            && lin.parts.iter().filter(|pt| pt.rot).all(rotated)
            && (!residual || lin.parts.iter().all(rotated))
    }

    /// `y = (R src) · wᵀ + beta · y` over one token row for every part of `lin` ([`CudaModel::fuses_rotation`]):
    /// first the rotated parts, fused ([`crate::qgemm::gemv_pq2_rot`]; the first one also stores the normed row
    /// at `src.raw`), then the parts that read that row as it is (`p.actu`), as [`CudaModel::gemm_in`] runs them.
    pub(super) fn gemm_rot(
        &self,
        p: &FwdPtrs,
        k: usize,
        lin: &Linear,
        (kind, mut src): (RotKind, RotSrc),
        (y, ldy): (u64, usize),
        beta: f32,
        both: bool,
    ) -> Result<(), CudaError> {
        for part in lin.parts.iter().filter(|pt| pt.rot) {
            let yp = y + 4 * part.row0 as u64;
            crate::qgemm::gemv_pq2_rot(&self.gpu, kind, src, k, part.w.w, part.rows, yp, beta)?;
            src.raw = 0;
        }
        for part in lin.parts.iter().filter(|pt| !pt.rot) {
            self.gemm_in_part(p, 1, k, lin, part, (y, ldy), both, false)?;
        }
        Ok(())
    }
}
