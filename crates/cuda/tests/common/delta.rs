//! The gated delta test inputs shared by tests/ops.rs, gdn_tc.rs and gdn_prep_tc.rs: random q/k/v, decays, betas
//! and initial states; the CPU recurrence they are held to; their device copies.

use cudarc::driver::CudaSlice;
use onepass_cuda::ops::GdnDims;
use onepass_cuda::Gpu;
use onepass_kernels as cpu;

use super::rnd;

/// The Qwen3.5-0.8B gated delta head shape, timed by the `*_timings` benches.
pub const HEADS_08B: GdnDims = GdnDims {
    hk: 16,
    hv: 16,
    dk: 128,
    dv: 128,
};

pub fn dims(hk: usize, hv: usize, dk: usize, dv: usize) -> GdnDims {
    GdnDims { hk, hv, dk, dv }
}

/// The shapes of the WY tests (tests/ops.rs, gdn_prep_tc.rs, gdn_tc.rs), with the factor on their decays: T = 1,
/// 63, 65, 130, 200 in one batch; HV != HK; DK != DV both ways, not multiples of 16 (60/24, 16/40, 36/100); the
/// 0.8B head shape (128/128); strong decays (g x20: e^gam underflows).
pub fn wy_cases() -> Vec<(GdnDims, Vec<usize>, f32)> {
    vec![
        (dims(2, 4, 60, 24), vec![1, 63, 65, 130, 200], 1.0),
        (dims(1, 3, 16, 40), vec![200, 1], 1.0),
        (dims(2, 6, 36, 100), vec![65, 130], 1.0),
        (dims(2, 2, 128, 128), vec![130, 7, 64], 1.0),
        (dims(2, 4, 128, 128), vec![1, 63, 65, 200], 1.0),
        (dims(2, 4, 60, 24), vec![130, 63], 20.0),
    ]
}

/// The System One segment shapes the benches time: a 175-token prefix, 7 suffixes of 33, 7 of 29, the 7 suffixes of
/// the bench's workloads (the 11-option question's is 66 tokens, two chunks), a 3,400-token prefix, 224 suffixes of
/// 33.
pub fn bench_lens() -> [Vec<usize>; 6] {
    [
        vec![175],
        vec![33; 7],
        vec![29; 7],
        vec![30, 24, 66, 23, 31, 31, 31],
        vec![3400],
        vec![33; 224],
    ]
}

/// A segment shape in the timing tables: "7 x 33", or "7 x 23..66" when the lengths differ.
pub fn lens_label(lens: &[usize]) -> String {
    let (lo, hi) = (lens.iter().min(), lens.iter().max());
    match (lo, hi) {
        (Some(a), Some(b)) if a != b => format!("{} x {a}..{b}", lens.len()),
        (Some(a), _) => format!("{} x {a}", lens.len()),
        _ => "none".into(),
    }
}

/// One batch of segments, the inputs of every gated delta kernel.
pub struct DeltaCase {
    pub d: GdnDims,
    pub lens: Vec<usize>,
    /// qkv: [N, cd] (q, k L2-normalised; q scaled by 1/sqrt(dk))
    pub qkv: Vec<f32>,
    /// g: [N, HV]
    pub g: Vec<f32>,
    /// beta: [N, HV]
    pub beta: Vec<f32>,
    /// s0: per segment [HV, DK, DV]
    pub s0: Vec<Vec<f32>>,
}

/// Columns of a qkv row: q [HK, DK] | k [HK, DK] | v [HV, DV].
pub fn cols(d: GdnDims) -> usize {
    2 * d.hk * d.dk + d.hv * d.dv
}

/// L2-normalised q and k (q times 1/sqrt(dk)), decays in [-1.01, -0.01), beta in [0, 1), non-zero initial
/// states; every draw from `seed` and the next few (`seed + 10 + s` for segment s's state).
pub fn delta_case(d: GdnDims, lens: &[usize], seed: u64) -> DeltaCase {
    let n: usize = lens.iter().sum();
    let cd = cols(d);
    let mut qkv = rnd(n * cd, seed);
    let scale = 1.0 / (d.dk as f32).sqrt();
    for row in qkv.chunks_exact_mut(cd) {
        cpu::l2_normalize(&mut row[..2 * d.hk * d.dk], d.dk, 1e-6);
        row[..d.hk * d.dk].iter_mut().for_each(|v| *v *= scale);
    }
    let g = rnd(n * d.hv, seed + 1)
        .iter()
        .map(|x| -0.5 * (x + 1.0) - 0.01)
        .collect();
    let beta = rnd(n * d.hv, seed + 2)
        .iter()
        .map(|x| 0.5 * (x + 1.0))
        .collect();
    let s0 = (0..lens.len())
        .map(|s| rnd(d.hv * d.dk * d.dv, seed + 10 + s as u64))
        .collect();
    DeltaCase {
        d,
        lens: lens.to_vec(),
        qkv,
        g,
        beta,
        s0,
    }
}

impl DeltaCase {
    /// The case with every decay multiplied by `s`.
    pub fn decays_x(mut self, s: f32) -> DeltaCase {
        self.g.iter_mut().for_each(|v| *v *= s);
        self
    }

    /// N, the rows of all segments.
    pub fn rows(&self) -> usize {
        self.lens.iter().sum()
    }

    pub fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// segs [S, 3] = (start row, rows, position 0).
    pub fn segs(&self) -> Vec<i32> {
        let mut segs = Vec::new();
        let mut start = 0;
        for &t in &self.lens {
            segs.extend([start as i32, t as i32, 0]);
            start += t;
        }
        segs
    }
}

/// CPU recurrence per segment: outputs [N, HV, DV] and final states.
pub fn delta_cpu(c: &DeltaCase) -> (Vec<f32>, Vec<Vec<f32>>) {
    let d = c.d;
    let cd = cols(d);
    let mut out = vec![0.0; c.rows() * d.hv * d.dv];
    let mut states = Vec::new();
    let mut start = 0;
    for (s, &t) in c.lens.iter().enumerate() {
        let rows = start..start + t;
        let col = |a: usize, b: usize| -> Vec<f32> {
            rows.clone()
                .flat_map(|r| c.qkv[r * cd + a..r * cd + b].to_vec())
                .collect()
        };
        let q = col(0, d.hk * d.dk);
        let k = col(d.hk * d.dk, 2 * d.hk * d.dk);
        let v = col(2 * d.hk * d.dk, cd);
        let sh = cpu::DeltaShape {
            t,
            hk: d.hk,
            hv: d.hv,
            dk: d.dk,
            dv: d.dv,
        };
        let mut st = c.s0[s].clone();
        let inp = cpu::DeltaInputs {
            sh,
            q: &q,
            k: &k,
            v: &v,
            g: &c.g[start * d.hv..(start + t) * d.hv],
            beta: &c.beta[start * d.hv..(start + t) * d.hv],
        };
        cpu::gated_delta_recurrent(
            &inp,
            &mut st,
            &mut out[start * d.hv * d.dv..(start + t) * d.hv * d.dv],
        );
        states.push(st);
        start += t;
    }
    (out, states)
}

/// The device copies of a case's inputs: qkv, g, beta, the segment table, each segment's state (the kernels
/// update them in place) and the table of their addresses.
pub struct DeltaDev {
    pub qkv: CudaSlice<f32>,
    pub g: CudaSlice<f32>,
    pub beta: CudaSlice<f32>,
    /// [S, 3], as [`DeltaCase::segs`]
    pub segs: CudaSlice<i32>,
    /// per segment [HV, DK, DV], starting as `s0`
    pub states: Vec<CudaSlice<f32>>,
    /// [S]: the address of each of `states`
    pub table: CudaSlice<u64>,
}

/// The addresses of a [`DeltaDev`]'s buffers, in the order the gated delta launchers take them.
#[derive(Clone, Copy)]
pub struct DeltaPtrs {
    pub x: u64,
    pub g: u64,
    pub beta: u64,
    pub segs: u64,
    pub states: u64,
}

impl DeltaDev {
    pub fn upload(g: &Gpu, c: &DeltaCase) -> DeltaDev {
        let states: Vec<_> = c.s0.iter().map(|s| g.upload(s).unwrap()).collect();
        let ptrs: Vec<u64> = states.iter().map(|s| g.ptr(s)).collect();
        DeltaDev {
            qkv: g.upload(&c.qkv).unwrap(),
            g: g.upload(&c.g).unwrap(),
            beta: g.upload(&c.beta).unwrap(),
            segs: g.upload(&c.segs()).unwrap(),
            table: g.upload(&ptrs).unwrap(),
            states,
        }
    }

    pub fn ptrs(&self, g: &Gpu) -> DeltaPtrs {
        DeltaPtrs {
            x: g.ptr(&self.qkv),
            g: g.ptr(&self.g),
            beta: g.ptr(&self.beta),
            segs: g.ptr(&self.segs),
            states: g.ptr(&self.table),
        }
    }

    /// The states as they are now, per segment [HV, DK, DV].
    pub fn download_states(&self, g: &Gpu, d: GdnDims) -> Vec<Vec<f32>> {
        self.states
            .iter()
            .map(|s| g.download(s, d.hv * d.dk * d.dv).unwrap())
            .collect()
    }
}
