//! Gated DeltaNet token mixer (Qwen3.5 `linear_attn`).
//!
//! ```text
//! qkv = in_proj_qkv(x); z = in_proj_z(x); b = in_proj_b(x); a = in_proj_a(x)
//! qkv = silu(causal_conv1d(qkv))             (depthwise, kernel K, continuing the conv history)
//! q, k, v = split(qkv);  q, k = l2norm(q), l2norm(k);  q /= sqrt(DK)
//! g = -exp(A_log) * softplus(a + dt_bias);   beta = sigmoid(b)
//! o = gated_delta_rule(q, k, v, g, beta)     (chunked for prefill, recurrent for one token)
//! out = out_proj(rmsnorm(o) * weight * silu(z))   (per value head)
//! ```

use onepass_kernels::{
    causal_conv1d_silu_taps, conv_taps, gated_delta_chunked, gated_delta_recurrent, l2_normalize,
    rms_norm_gated, sigmoid, softplus, DeltaInputs, DeltaShape,
};
use onepass_tensor::Tensor;

use std::sync::Arc;

use super::{linear, linears, rotated, site, unrotated, Seg};
use crate::config::TextConfig;
use crate::state::{LayerState, RecurrentState};
use crate::weights::Binder;
use crate::ModelError;

/// Tokens per chunk of the chunked gated delta rule.
pub const CHUNK: usize = 64;

pub struct GatedDeltaNet {
    /// in_proj_qkv: [2*HK*DK + HV*DV, H]; in_proj_z: [HV*DV, H]; in_proj_a/b: [HV, H]
    pub(crate) in_qkv: Tensor,
    pub(crate) in_z: Tensor,
    pub(crate) in_a: Tensor,
    pub(crate) in_b: Tensor,
    /// conv: [conv_dim, K]
    pub(crate) conv: Vec<f32>,
    /// The same taps channel-contiguous, [K, conv_dim], as the CPU conv reads them.
    conv_taps: Vec<f32>,
    /// -exp(A_log): [HV]
    pub(crate) neg_a: Vec<f32>,
    pub(crate) dt_bias: Vec<f32>,
    /// norm weight: [DV] (applied as is, not 1 + w)
    pub(crate) norm: Vec<f32>,
    /// out_proj: [H, HV*DV]
    pub(crate) out: Tensor,
    pub(crate) hk: usize,
    pub(crate) hv: usize,
    pub(crate) dk: usize,
    pub(crate) dv: usize,
    pub(crate) kernel: usize,
    pub(crate) eps: f32,
    /// Hadamard sites of a rotated pack: the normed input read by in_proj_qkv and in_proj_z (in_proj_a/b read
    /// it unrotated), and the gated core output read by out_proj. `None`: not rotated.
    pub(crate) rot_in: Option<Arc<[f32]>>,
    pub(crate) rot_out: Option<Arc<[f32]>>,
}

impl GatedDeltaNet {
    pub fn load(vb: &Binder, c: &TextConfig) -> Result<Self, ModelError> {
        let (h, hk, hv, dk, dv) = (
            c.hidden_size,
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        );
        let conv_dim = c.gdn_conv_dim();
        let kernel = c.linear_conv_kernel_dim;
        let a_log = vb.get_f32("A_log", &[hv])?;
        let conv = vb.get_f32("conv1d.weight", &[conv_dim, 1, kernel])?;
        unrotated(vb, "in_proj_a.weight")?;
        unrotated(vb, "in_proj_b.weight")?;
        Ok(GatedDeltaNet {
            rot_in: site(vb, &["in_proj_qkv.weight", "in_proj_z.weight"])?,
            rot_out: site(vb, &["out_proj.weight"])?,
            in_qkv: vb.get("in_proj_qkv.weight", &[conv_dim, h])?,
            in_z: vb.get("in_proj_z.weight", &[hv * dv, h])?,
            in_a: vb.get("in_proj_a.weight", &[hv, h])?,
            in_b: vb.get("in_proj_b.weight", &[hv, h])?,
            conv_taps: conv_taps(&conv, conv_dim, kernel),
            conv,
            neg_a: a_log.iter().map(|x| -x.exp()).collect(),
            dt_bias: vb.get_f32("dt_bias", &[hv])?,
            norm: vb.get_f32("norm.weight", &[dv])?,
            out: vb.get("out_proj.weight", &[h, hv * dv])?,
            hk,
            hv,
            dk,
            dv,
            kernel,
            eps: c.rms_norm_eps,
        })
    }

    pub fn new_state(&self) -> LayerState {
        LayerState::Recurrent(RecurrentState {
            conv: vec![0.0; (self.kernel - 1) * self.conv_dim()],
            ssm: vec![0.0; self.hv * self.dk * self.dv],
        })
    }

    fn conv_dim(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }

    pub fn tensors(&self) -> [&Tensor; 5] {
        [&self.in_qkv, &self.in_z, &self.in_a, &self.in_b, &self.out]
    }

    /// Extra f32 parameters held outside tensors (conv, A, dt_bias, norm).
    pub fn small_params(&self) -> usize {
        self.conv.len() + self.neg_a.len() + self.dt_bias.len() + self.norm.len()
    }

    /// The input projections of the normed rows x: [N, H] (every segment stacked).
    pub fn project(&self, x: &[f32], n: usize) -> GdnScratch {
        // One rotation for the folded qkv and z; a and b read x as it is.
        let xr = rotated(x, &self.rot_in);
        let [qkv, z] = linears(&xr, n, [&self.in_qkv, &self.in_z]);
        GdnScratch {
            qkv,
            z,
            a: linear(x, n, &self.in_a),
            b: linear(x, n, &self.in_b),
            segs: Vec::new(),
            core: vec![0.0; n * self.hv * self.dv],
        }
    }

    /// Per segment: the causal conv + SiLU (advancing its conv history), q, k, v split out with q and k
    /// L2-normed and q scaled, and the gates g and β.
    pub fn prep(&self, s: &mut GdnScratch, segs: &[Seg], states: &mut [&mut LayerState]) {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        let cd = self.conv_dim();
        let scale = 1.0 / (dk as f32).sqrt();
        s.segs.clear();
        for (seg, st) in segs.iter().zip(states.iter_mut()) {
            let st = recurrent(st);
            let t = seg.len;
            let rows = seg.start..seg.start + t;
            let xs = &mut s.qkv[rows.start * cd..rows.end * cd];
            causal_conv1d_silu_taps(xs, t, cd, &self.conv_taps, self.kernel, &mut st.conv);
            // Split the conv output into q [T, HK, DK], k [T, HK, DK], v [T, HV, DV].
            let mut q = Vec::with_capacity(t * hk * dk);
            let mut k = Vec::with_capacity(t * hk * dk);
            let mut v = Vec::with_capacity(t * hv * dv);
            for row in xs.chunks_exact(cd) {
                q.extend_from_slice(&row[..hk * dk]);
                k.extend_from_slice(&row[hk * dk..2 * hk * dk]);
                v.extend_from_slice(&row[2 * hk * dk..]);
            }
            l2_normalize(&mut q, dk, 1e-6);
            l2_normalize(&mut k, dk, 1e-6);
            q.iter_mut().for_each(|e| *e *= scale);
            let mut g = vec![0.0; t * hv];
            let mut beta = vec![0.0; t * hv];
            for i in 0..t {
                for h in 0..hv {
                    let r = (rows.start + i) * hv + h;
                    g[i * hv + h] = self.neg_a[h] * softplus(s.a[r] + self.dt_bias[h]);
                    beta[i * hv + h] = sigmoid(s.b[r]);
                }
            }
            s.segs.push(SegQkv { q, k, v, g, beta });
        }
    }

    /// The gated delta rule of every segment over its recurrent state: one step for a single token, chunked
    /// otherwise.
    pub fn delta(&self, s: &mut GdnScratch, segs: &[Seg], states: &mut [&mut LayerState]) {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        for ((seg, st), p) in segs.iter().zip(states.iter_mut()).zip(&s.segs) {
            let st = recurrent(st);
            let t = seg.len;
            let sh = DeltaShape { t, hk, hv, dk, dv };
            let o = &mut s.core[seg.start * hv * dv..(seg.start + t) * hv * dv];
            let (q, k, v, g, beta) = (&p.q, &p.k, &p.v, &p.g, &p.beta);
            let inp = DeltaInputs {
                sh,
                q,
                k,
                v,
                g,
                beta,
            };
            if t == 1 {
                gated_delta_recurrent(&inp, &mut st.ssm, o);
            } else {
                gated_delta_chunked(&inp, &mut st.ssm, o, CHUNK);
            }
        }
    }

    /// `rmsnorm(o) · weight · silu(z)` per value head, in place on the core output.
    pub fn gated_norm(&self, s: &mut GdnScratch) {
        rms_norm_gated(&mut s.core, &s.z, &self.norm, self.eps);
    }

    /// `out_proj` of the gated core output. → [N, H]
    pub fn project_out(&self, s: &GdnScratch, n: usize) -> Vec<f32> {
        linear(&rotated(&s.core, &self.rot_out), n, &self.out)
    }
}

/// A Gated DeltaNet layer's activations between its ops.
pub struct GdnScratch {
    /// [N, conv_dim], the conv output after [`GatedDeltaNet::prep`]
    qkv: Vec<f32>,
    /// [N, HV*DV]
    z: Vec<f32>,
    /// [N, HV] each
    a: Vec<f32>,
    b: Vec<f32>,
    segs: Vec<SegQkv>,
    /// [N, HV*DV]
    core: Vec<f32>,
}

/// One segment's inputs of the gated delta rule.
struct SegQkv {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

fn recurrent<'a>(st: &'a mut &mut LayerState) -> &'a mut RecurrentState {
    let LayerState::Recurrent(st) = &mut **st else {
        unreachable!("a Gated DeltaNet layer always holds a recurrent state")
    };
    st
}
