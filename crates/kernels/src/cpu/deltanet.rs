//! The gated delta rule of Gated DeltaNet, per value head `h` with state `S: [DK, DV]`:
//!
//! ```text
//! S ← exp(g_t) · S
//! S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)
//! o_t = Sᵀ q_t
//! ```
//!
//! [`gated_delta_recurrent`] runs it token by token (the decode step; [`gated_delta_recurrent_reference`], the rule
//! as written, is its slow twin and the chunked form's);
//! [`gated_delta_chunked`] processes chunks of `C` tokens with the WY/UT form: inside a chunk with
//! cumulative log decay `γ`, solve `(I + A) [U | W] = [β v | β e^γ k]` where
//! `A_ij = β_i (k_i·k_j) e^{γ_i−γ_j}` for `j < i`, then `v' = U − W S`,
//! `o = e^γ q S + ((q kᵀ) ⊙ e^{γ_i−γ_j})_{j≤i} v'`, `S ← e^{γ_C} S + (e^{γ_C−γ} k)ᵀ v'`.
//! Query/key heads are shared by `HV / HK` consecutive value heads.

use rayon::prelude::*;

use super::sgemm::{sgemm, Mat};

/// Dimensions of one gated-delta call.
#[derive(Debug, Clone, Copy)]
pub struct DeltaShape {
    /// Tokens.
    pub t: usize,
    /// Query/key heads.
    pub hk: usize,
    /// Value heads (a multiple of `hk`).
    pub hv: usize,
    /// Key head dim.
    pub dk: usize,
    /// Value head dim.
    pub dv: usize,
}

/// The inputs of one gated-delta call.
#[derive(Debug, Clone, Copy)]
pub struct DeltaInputs<'a> {
    pub sh: DeltaShape,
    /// q, k: [T, HK, DK], q already L2-normalised and scaled, k L2-normalised.
    pub q: &'a [f32],
    pub k: &'a [f32],
    /// v: [T, HV, DV]
    pub v: &'a [f32],
    /// g (log decay), beta: [T, HV]
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl DeltaInputs<'_> {
    /// Panics unless the buffers have the shapes `sh` gives (state: [HV, DK, DV], out: [T, HV, DV]).
    fn check(&self, state: &[f32], out: &[f32]) {
        let DeltaInputs {
            sh,
            q,
            k,
            v,
            g,
            beta,
        } = *self;
        assert!(
            sh.hk > 0 && sh.hv.is_multiple_of(sh.hk),
            "value heads {} must be a multiple of key heads {}",
            sh.hv,
            sh.hk
        );
        assert_eq!(q.len(), sh.t * sh.hk * sh.dk);
        assert_eq!(k.len(), sh.t * sh.hk * sh.dk);
        assert_eq!(v.len(), sh.t * sh.hv * sh.dv);
        assert_eq!(g.len(), sh.t * sh.hv);
        assert_eq!(beta.len(), sh.t * sh.hv);
        assert_eq!(state.len(), sh.hv * sh.dk * sh.dv);
        assert_eq!(out.len(), sh.t * sh.hv * sh.dv);
    }

    fn kh(&self, h: usize) -> usize {
        h / (self.sh.hv / self.sh.hk)
    }
    fn q_row(&self, t: usize, h: usize) -> &[f32] {
        let (hk, dk) = (self.sh.hk, self.sh.dk);
        let o = (t * hk + self.kh(h)) * dk;
        &self.q[o..o + dk]
    }
    fn k_row(&self, t: usize, h: usize) -> &[f32] {
        let (hk, dk) = (self.sh.hk, self.sh.dk);
        let o = (t * hk + self.kh(h)) * dk;
        &self.k[o..o + dk]
    }
    fn v_row(&self, t: usize, h: usize) -> &[f32] {
        let (hv, dv) = (self.sh.hv, self.sh.dv);
        let o = (t * hv + h) * dv;
        &self.v[o..o + dv]
    }
}

/// Token-by-token gated delta rule (the decode step). state: [HV, DK, DV] (updated); out: [T, HV, DV].
///
/// Each head's state is read twice per token instead of the rule's four passes: once for `Sᵀ k` over the decayed
/// rows (`exp(g)·S`, not stored), once to write `exp(g)·S + k ⊗ u` while `Sᵀ q` sums the new rows. Every value is
/// the same product and the sums run in the same order as [`gated_delta_recurrent_reference`], so the bits are
/// the same (tested); AVX-512 where the processor has it (the same arithmetic, vectorised).
pub fn gated_delta_recurrent(inp: &DeltaInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    token_by_token(inp, state, out, recurrent_step);
}

/// Runs `step` over every head (in parallel) and token (in order): state: [HV, DK, DV] (updated); out: [T, HV, DV].
fn token_by_token(inp: &DeltaInputs<'_>, state: &mut [f32], out: &mut [f32], step: StepFn) {
    inp.check(state, out);
    let sh = inp.sh;
    let (dk, dv, hv) = (sh.dk, sh.dv, sh.hv);
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(h, s)| {
            let mut o = vec![0.0f32; sh.t * dv];
            let mut kv = vec![0.0f32; dv];
            for t in 0..sh.t {
                let st = Step {
                    decay: inp.g[t * hv + h].exp(),
                    beta: inp.beta[t * hv + h],
                    q: inp.q_row(t, h),
                    k: inp.k_row(t, h),
                    v: inp.v_row(t, h),
                };
                step(&st, s, &mut kv, &mut o[t * dv..(t + 1) * dv]);
            }
            o
        })
        .collect();
    scatter_heads(&per_head, sh, out);
}

/// One token of one head: `s` [DK, DV] updated, `o` [DV] = the new `Sᵀ q` (zeros on entry), `kv` [DV] scratch.
type StepFn = fn(&Step<'_>, &mut [f32], &mut [f32], &mut [f32]);

/// One token of one head: its decay, β and rows.
struct Step<'a> {
    decay: f32,
    beta: f32,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

/// `s` [DK, DV] ← the rule's update for `st`; `o` [DV] = the new `Sᵀ q`; `kv` [DV] scratch.
fn recurrent_step(st: &Step<'_>, s: &mut [f32], kv: &mut [f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the processor has AVX-512F (checked above).
        return unsafe { recurrent_step_avx512(st, s, kv, o) };
    }
    recurrent_step_body(st, s, kv, o);
}

/// [`recurrent_step_body`] compiled for AVX-512.
///
/// # Safety
/// The processor has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn recurrent_step_avx512(st: &Step<'_>, s: &mut [f32], kv: &mut [f32], o: &mut [f32]) {
    recurrent_step_body(st, s, kv, o);
}

#[inline(always)]
fn recurrent_step_body(st: &Step<'_>, s: &mut [f32], kv: &mut [f32], o: &mut [f32]) {
    let dv = kv.len();
    kv.fill(0.0);
    for (row, &ki) in s.chunks_exact(dv).zip(st.k) {
        for (a, &x) in kv.iter_mut().zip(row) {
            *a += (x * st.decay) * ki;
        }
    }
    for (a, &vj) in kv.iter_mut().zip(st.v) {
        *a = (vj - *a) * st.beta;
    }
    for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(st.k).zip(st.q) {
        for ((x, &u), oj) in row.iter_mut().zip(kv.iter()).zip(o.iter_mut()) {
            *x = *x * st.decay + ki * u;
            *oj += *x * qi;
        }
    }
}

/// The slow twin of [`gated_delta_recurrent`]: the rule as written, four passes over each head's state per token
/// (decay, `Sᵀ k`, the update, `Sᵀ q`). state: [HV, DK, DV] (updated); out: [T, HV, DV].
pub fn gated_delta_recurrent_reference(inp: &DeltaInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    token_by_token(inp, state, out, reference_step);
}

/// [`gated_delta_recurrent_reference`]'s token: the rule's four passes over `s`.
fn reference_step(st: &Step<'_>, s: &mut [f32], kv: &mut [f32], o: &mut [f32]) {
    let dv = kv.len();
    let dk = s.len() / dv;
    s.iter_mut().for_each(|x| *x *= st.decay);
    kv.fill(0.0);
    for i in 0..dk {
        let row = &s[i * dv..(i + 1) * dv];
        for j in 0..dv {
            kv[j] += row[j] * st.k[i];
        }
    }
    for j in 0..dv {
        kv[j] = (st.v[j] - kv[j]) * st.beta;
    }
    for i in 0..dk {
        let row = &mut s[i * dv..(i + 1) * dv];
        for j in 0..dv {
            row[j] += st.k[i] * kv[j];
        }
    }
    for i in 0..dk {
        let row = &s[i * dv..(i + 1) * dv];
        for j in 0..dv {
            o[j] += row[j] * st.q[i];
        }
    }
}

fn scatter_heads(per_head: &[Vec<f32>], sh: DeltaShape, out: &mut [f32]) {
    let (hv, dv) = (sh.hv, sh.dv);
    for (h, o) in per_head.iter().enumerate() {
        for t in 0..sh.t {
            out[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
}

/// Chunked gated delta rule (chunks of `chunk` tokens; the last may be shorter).
/// state: [HV, DK, DV] (updated); out: [T, HV, DV].
pub fn gated_delta_chunked(
    inp: &DeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
    chunk: usize,
) {
    inp.check(state, out);
    assert!(chunk > 0);
    let sh = inp.sh;
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(sh.dk * sh.dv)
        .enumerate()
        .map(|(h, s)| chunked_head(inp, h, s, chunk))
        .collect();
    scatter_heads(&per_head, sh, out);
}

fn chunked_head(inp: &DeltaInputs<'_>, h: usize, s: &mut [f32], chunk: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the processor has AVX-512F (checked above).
        return unsafe { chunked_head_avx512(inp, h, s, chunk) };
    }
    chunked_head_body(inp, h, s, chunk)
}

/// [`chunked_head_body`] compiled for AVX-512: its element-wise loops (the chunk's scaled rows, the forward
/// substitution's row updates) run 16 values a step, each value's operations as written (no fused multiply-adds, no
/// reordered sums), so the bits are those of the portable build.
///
/// # Safety
/// The processor has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chunked_head_avx512(
    inp: &DeltaInputs<'_>,
    h: usize,
    s: &mut [f32],
    chunk: usize,
) -> Vec<f32> {
    chunked_head_body(inp, h, s, chunk)
}

#[inline(always)]
fn chunked_head_body(inp: &DeltaInputs<'_>, h: usize, s: &mut [f32], chunk: usize) -> Vec<f32> {
    let sh = inp.sh;
    let (dk, dv, hv) = (sh.dk, sh.dv, sh.hv);
    let mut out = vec![0.0f32; sh.t * dv];
    let cap = chunk.min(sh.t.max(1));
    // Scratch, sized for a full chunk.
    let mut qc = vec![0.0f32; cap * dk]; // [C, DK] e^γ-scaled queries
    let mut kc = vec![0.0f32; cap * dk]; // [C, DK]
    let mut kd = vec![0.0f32; cap * dk]; // [C, DK] keys scaled by e^{γ_C − γ}
    let mut rhs = vec![0.0f32; cap * (dv + dk)]; // [C, DV + DK]: β v | β e^γ k, solved in place
    let mut kk = vec![0.0f32; cap * cap]; // [C, C]
    let mut qk = vec![0.0f32; cap * cap]; // [C, C]
    let mut vnew = vec![0.0f32; cap * dv]; // [C, DV]
    let mut ws = vec![0.0f32; cap * dv]; // [C, DV] W S
    let mut gamma = vec![0.0f32; cap];
    let w = dv + dk;
    let mut start = 0;
    while start < sh.t {
        let n = chunk.min(sh.t - start);
        let mut acc = 0.0f32;
        for i in 0..n {
            acc += inp.g[(start + i) * hv + h];
            gamma[i] = acc;
        }
        let glast = gamma[n - 1];
        for i in 0..n {
            let t = start + i;
            let b = inp.beta[t * hv + h];
            let eg = gamma[i].exp();
            let (qt, kt, vt) = (inp.q_row(t, h), inp.k_row(t, h), inp.v_row(t, h));
            let edge = (glast - gamma[i]).exp();
            for c in 0..dk {
                qc[i * dk + c] = qt[c] * eg;
                kc[i * dk + c] = kt[c];
                kd[i * dk + c] = kt[c] * edge;
                rhs[i * w + dv + c] = kt[c] * b * eg;
            }
            for c in 0..dv {
                rhs[i * w + c] = vt[c] * b;
            }
        }
        // kk = K Kᵀ, qk = Q Kᵀ (with unscaled q: recover by dividing e^γ out below).
        sgemm(
            &mut kk,
            n,
            Mat::rm(&kc[..n * dk], n, dk),
            Mat::rm_t(&kc[..n * dk], dk, n),
            false,
        );
        sgemm(
            &mut qk,
            n,
            Mat::rm(&qc[..n * dk], n, dk),
            Mat::rm_t(&kc[..n * dk], dk, n),
            false,
        );
        // Forward substitution: X_i = rhs_i − Σ_{j<i} A_ij X_j.
        for i in 1..n {
            let bi = inp.beta[(start + i) * hv + h];
            let (done, rest) = rhs.split_at_mut(i * w);
            let xi = &mut rest[..w];
            for j in 0..i {
                let a = bi * kk[i * n + j] * (gamma[i] - gamma[j]).exp();
                if a != 0.0 {
                    let xj = &done[j * w..(j + 1) * w];
                    for c in 0..w {
                        xi[c] -= a * xj[c];
                    }
                }
            }
        }
        // v' = U − W S, with U = rhs[:, :DV] and W = rhs[:, DV:].
        for i in 0..n {
            vnew[i * dv..(i + 1) * dv].copy_from_slice(&rhs[i * w..i * w + dv]);
        }
        let wmat = Mat {
            data: &rhs[dv..],
            rows: n,
            cols: dk,
            rs: w,
            cs: 1,
        };
        sgemm(&mut ws, dv, wmat, Mat::rm(s, dk, dv), false);
        for (a, b) in vnew[..n * dv].iter_mut().zip(&ws) {
            *a -= b;
        }
        // o = (e^γ q) S + M v', M_ij = (q_i·k_j) e^{γ_i−γ_j} for j ≤ i. qk holds e^{γ_i} q_i·k_j.
        for i in 0..n {
            for j in 0..n {
                qk[i * n + j] = if j <= i {
                    qk[i * n + j] * (-gamma[j]).exp()
                } else {
                    0.0
                };
            }
        }
        // The e^{γ_i}·e^{−γ_j} split can overflow for long chunks with strong decay; recompute
        // those entries directly when either factor is extreme.
        if gamma[..n].iter().any(|&x| x < -60.0) {
            for i in 0..n {
                let qi = inp.q_row(start + i, h);
                for j in 0..=i {
                    let kj = &kc[j * dk..(j + 1) * dk];
                    let dot: f32 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                    qk[i * n + j] = dot * (gamma[i] - gamma[j]).exp();
                }
            }
        }
        let o = &mut out[start * dv..(start + n) * dv];
        sgemm(
            o,
            dv,
            Mat::rm(&qc[..n * dk], n, dk),
            Mat::rm(s, dk, dv),
            false,
        );
        sgemm(
            o,
            dv,
            Mat::rm(&qk[..n * n], n, n),
            Mat::rm(&vnew[..n * dv], n, dv),
            true,
        );
        // S ← e^{γ_C} S + (e^{γ_C − γ} k)ᵀ v'
        let decay = glast.exp();
        s.iter_mut().for_each(|x| *x *= decay);
        sgemm(
            s,
            dv,
            Mat::rm_t(&kd[..n * dk], dk, n),
            Mat::rm(&vnew[..n * dv], n, dv),
            true,
        );
        start += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        sh: DeltaShape,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        s0: Vec<f32>,
    }

    impl Case {
        fn inputs(&self) -> DeltaInputs<'_> {
            DeltaInputs {
                sh: self.sh,
                q: &self.q,
                k: &self.k,
                v: &self.v,
                g: &self.g,
                beta: &self.beta,
            }
        }
    }

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        crate::testdata::xorshift_unit(state, n)
    }

    fn case(t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> Case {
        let sh = DeltaShape { t, hk, hv, dk, dv };
        let mut q = rnd(t * hk * dk, 1);
        let mut k = rnd(t * hk * dk, 2);
        crate::l2_normalize(&mut q, dk, 1e-6);
        crate::l2_normalize(&mut k, dk, 1e-6);
        let scale = 1.0 / (dk as f32).sqrt();
        q.iter_mut().for_each(|x| *x *= scale);
        let g = rnd(t * hv, 3)
            .iter()
            .map(|x| -0.5 * (x + 1.0) - 0.01)
            .collect();
        let beta = rnd(t * hv, 4).iter().map(|x| 0.5 * (x + 1.0)).collect();
        Case {
            sh,
            q,
            k,
            v: rnd(t * hv * dv, 5),
            g,
            beta,
            s0: rnd(hv * dk * dv, 6),
        }
    }

    #[test]
    fn chunked_matches_recurrent_on_odd_shapes() {
        for &(t, hk, hv, dk, dv, chunk) in &[
            (63, 1, 1, 60, 60, 64),
            (130, 2, 4, 16, 24, 64),
            (9, 3, 3, 8, 5, 4),
            (1, 1, 2, 7, 9, 64),
            (70, 2, 2, 32, 16, 7),
        ] {
            let c = case(t, hk, hv, dk, dv);
            let mut s_ref = c.s0.clone();
            let mut o_ref = vec![0.0; t * hv * dv];
            gated_delta_recurrent_reference(&c.inputs(), &mut s_ref, &mut o_ref);
            let mut s = c.s0.clone();
            let mut o = vec![0.0; t * hv * dv];
            gated_delta_chunked(&c.inputs(), &mut s, &mut o, chunk);
            let max_o = o_ref.iter().fold(1.0f32, |m, x| m.max(x.abs()));
            for (a, b) in o.iter().zip(&o_ref) {
                assert!(
                    (a - b).abs() <= 2e-5 * max_o,
                    "out t={t} hk={hk} hv={hv}: {a} vs {b}"
                );
            }
            let max_s = s_ref.iter().fold(1.0f32, |m, x| m.max(x.abs()));
            for (a, b) in s.iter().zip(&s_ref) {
                assert!((a - b).abs() <= 2e-5 * max_s, "state t={t}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn the_two_pass_step_gives_the_rules_bits_on_odd_shapes() {
        for &(t, hk, hv, dk, dv) in &[
            (1, 1, 1, 128, 128),
            (5, 2, 4, 16, 24),
            (3, 3, 3, 8, 5),
            (9, 1, 2, 7, 33),
        ] {
            let c = case(t, hk, hv, dk, dv);
            let (mut s_ref, mut s) = (c.s0.clone(), c.s0.clone());
            let (mut o_ref, mut o) = (vec![0.0; t * hv * dv], vec![0.0; t * hv * dv]);
            gated_delta_recurrent_reference(&c.inputs(), &mut s_ref, &mut o_ref);
            gated_delta_recurrent(&c.inputs(), &mut s, &mut o);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&o),
                bits(&o_ref),
                "out t={t} hk={hk} hv={hv} dk={dk} dv={dv}"
            );
            assert_eq!(
                bits(&s),
                bits(&s_ref),
                "state t={t} hk={hk} hv={hv} dk={dk} dv={dv}"
            );
        }
    }

    #[test]
    fn strong_decay_stays_finite() {
        let mut c = case(64, 1, 1, 8, 8);
        c.g.iter_mut().for_each(|x| *x = -5.0);
        let mut s_ref = c.s0.clone();
        let mut o_ref = vec![0.0; 64 * 8];
        gated_delta_recurrent(&c.inputs(), &mut s_ref, &mut o_ref);
        let mut s = c.s0.clone();
        let mut o = vec![0.0; 64 * 8];
        gated_delta_chunked(&c.inputs(), &mut s, &mut o, 64);
        for (a, b) in o.iter().zip(&o_ref) {
            assert!(a.is_finite() && (a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
