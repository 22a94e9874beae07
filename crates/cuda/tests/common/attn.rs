//! The attention test setup shared by tests/ops.rs and attn_tc.rs: attn_prep's inputs on four segments (63 new
//! tokens after 5 cached, 65 fresh, 1 after 130 of which the first 100 come from a base cache, 130 after 2), the
//! CPU reference, the KV cache tables, and attn_prep run on them.

use cudarc::driver::CudaSlice;
use onepass_cuda::ops::{self, AttnDims};
use onepass_cuda::Gpu;
use onepass_kernels as cpu;

use super::rnd;

/// Odd head dims: 4 heads over 2 KV heads of 40, half of them rotated.
pub const ATTN_ODD: AttnDims = AttnDims {
    heads: 4,
    kv_heads: 2,
    head_dim: 40,
    half: 10,
};
/// The Qwen3.5 attention shape: 8 heads over 2 KV heads of 256, a quarter rotated.
pub const ATTN_08B: AttnDims = AttnDims {
    heads: 8,
    kv_heads: 2,
    head_dim: 256,
    half: 32,
};

/// (new tokens, past tokens already in the cache) per segment.
pub const SEGS: [(usize, usize); 4] = [(63, 5), (65, 0), (1, 130), (130, 2)];
/// Positions each segment reads from a base cache (a forked-from state): segment 2 its first 100, the rest from
/// its own cache.
pub const BASES: [usize; 4] = [0, 0, 100, 0];

/// The CPU reference and the device buffers after attn_prep.
pub struct AttnPrepped {
    /// Columns of a projection row: per head q | gate [2 * D], then k [HKV * D], v [HKV * D].
    pub ld: usize,
    /// N, the new tokens of all segments.
    pub n: usize,
    /// q after norm and rope: [N, H, D]
    pub want_q: Vec<f32>,
    /// Per segment, the whole k cache after the append: [past + t, HKV, D]
    pub want_k: Vec<Vec<f32>>,
    /// attention · σ(gate): [N, H, D]
    pub want_o: Vec<f32>,
    /// Per segment: own k, own v (from its base position on), base k, base v.
    pub caches: Vec<[CudaSlice<f32>; 4]>,
    /// The same caches in f16 (the earlier rows rounded to nearest on the host, attn_prep_h's rows written there).
    pub caches16: Vec<[CudaSlice<u16>; 4]>,
    /// proj: [N, ld]
    pub proj: CudaSlice<f32>,
    /// The token table [N, 2] = (segment, position).
    pub tok: CudaSlice<i32>,
    /// The KV table [S, 5] (the four cache addresses, the base length).
    pub kv: CudaSlice<u64>,
    /// The same over the f16 caches.
    pub kv16: CudaSlice<u64>,
    /// The segment table [S, 3] = (start row, rows, past).
    pub segs: CudaSlice<i32>,
    /// q as attn_prep wrote it: [N, H, D]
    pub q: CudaSlice<f32>,
    /// attn_prep's norm gains and inverse frequencies, kept alive with the rest.
    pub norms: [CudaSlice<f32>; 3],
    pub max_len: usize,
}

/// The KV table (`ops::KV_ENTRIES` per segment): each segment's own k, own v, base k and base v caches' addresses
/// and its base length.
pub fn kv_table<'a, T: 'a>(
    g: &Gpu,
    caches: impl IntoIterator<Item = [&'a CudaSlice<T>; 4]>,
    bases: impl IntoIterator<Item = usize>,
) -> Vec<u64> {
    caches
        .into_iter()
        .zip(bases)
        .flat_map(|([k, v, kb, vb], b)| [g.ptr(k), g.ptr(v), g.ptr(kb), g.ptr(vb), b as u64])
        .collect()
}

pub fn attn_prepped(g: &Gpu, a: AttnDims) -> AttnPrepped {
    let (h, kvh, dd) = (a.heads, a.kv_heads, a.head_dim);
    let ld = h * 2 * dd + 2 * kvh * dd;
    let n: usize = SEGS.iter().map(|s| s.0).sum();
    let proj = rnd(n * ld, 70).iter().map(|v| 2.0 * v).collect::<Vec<_>>();
    let qn: Vec<f32> = rnd(dd, 71).iter().map(|v| 1.0 + 0.3 * v).collect();
    let kn: Vec<f32> = rnd(dd, 72).iter().map(|v| 1.0 + 0.3 * v).collect();
    let inv_freq: Vec<f32> = (0..a.half)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / (2 * a.half) as f32))
        .collect();
    let eps = 1e-6;
    let mut tok = Vec::new();
    let mut caches = Vec::new();
    let mut caches16 = Vec::new();
    let f16s = super::to_f16_bits;
    let mut want_q = vec![0.0; n * h * dd];
    let mut want_o = vec![0.0; n * h * dd];
    let mut want_k = Vec::new();
    let mut start = 0;
    let row = kvh * dd;
    for (s, &(t, past)) in SEGS.iter().enumerate() {
        let cap = past + t + 3;
        let mut kc = rnd(cap * row, 80 + s as u64);
        let mut vc = rnd(cap * row, 90 + s as u64);
        let b = BASES[s] * row;
        caches.push([
            g.upload(&kc[b..]).unwrap(),
            g.upload(&vc[b..]).unwrap(),
            g.upload(&kc[..b.max(1)]).unwrap(),
            g.upload(&vc[..b.max(1)]).unwrap(),
        ]);
        caches16.push([
            g.upload(&f16s(&kc[b..])).unwrap(),
            g.upload(&f16s(&vc[b..])).unwrap(),
            g.upload(&f16s(&kc[..b.max(1)])).unwrap(),
            g.upload(&f16s(&vc[..b.max(1)])).unwrap(),
        ]);
        for i in 0..t {
            tok.extend([s as i32, (past + i) as i32]);
        }
        // CPU: norms, rope, cache append, attention, gate.
        let rows = start..start + t;
        let mut q: Vec<f32> = rows
            .clone()
            .flat_map(|r| (0..h).map(move |hh| (r, hh)))
            .flat_map(|(r, hh)| proj[r * ld + hh * 2 * dd..r * ld + hh * 2 * dd + dd].to_vec())
            .collect();
        let gate: Vec<f32> = rows
            .clone()
            .flat_map(|r| (0..h).map(move |hh| (r, hh)))
            .flat_map(|(r, hh)| {
                proj[r * ld + hh * 2 * dd + dd..r * ld + (hh + 1) * 2 * dd].to_vec()
            })
            .collect();
        let mut k: Vec<f32> = rows
            .clone()
            .flat_map(|r| proj[r * ld + h * 2 * dd..r * ld + h * 2 * dd + kvh * dd].to_vec())
            .collect();
        let v: Vec<f32> = rows
            .clone()
            .flat_map(|r| proj[r * ld + h * 2 * dd + kvh * dd..r * ld + ld].to_vec())
            .collect();
        cpu::rms_norm(&mut q, &qn, eps);
        cpu::rms_norm(&mut k, &kn, eps);
        let (cos, sin) = cpu::rope_tables(past, t, &inv_freq);
        cpu::apply_rope(&mut q, t, h, dd, &cos, &sin);
        cpu::apply_rope(&mut k, t, kvh, dd, &cos, &sin);
        kc[past * kvh * dd..(past + t) * kvh * dd].copy_from_slice(&k);
        vc[past * kvh * dd..(past + t) * kvh * dd].copy_from_slice(&v);
        want_k.push(kc[..(past + t) * kvh * dd].to_vec());
        let sh = cpu::AttnShape {
            t,
            past,
            heads: h,
            kv_heads: kvh,
            head_dim: dd,
        };
        let o = &mut want_o[start * h * dd..(start + t) * h * dd];
        cpu::causal_attention_reference(
            sh,
            &q,
            &kc[..(past + t) * kvh * dd],
            &vc[..(past + t) * kvh * dd],
            1.0 / (dd as f32).sqrt(),
            o,
        );
        for (x, gv) in o.iter_mut().zip(&gate) {
            *x *= cpu::sigmoid(*gv);
        }
        want_q[start * h * dd..(start + t) * h * dd].copy_from_slice(&q);
        start += t;
    }
    let ptrs = kv_table(g, caches.iter().map(|c| c.each_ref()), BASES);
    let ptrs16 = kv_table(g, caches16.iter().map(|c| c.each_ref()), BASES);
    let (pd, td, kvd, kv16) = (
        g.upload(&proj).unwrap(),
        g.upload(&tok).unwrap(),
        g.upload(&ptrs).unwrap(),
        g.upload(&ptrs16).unwrap(),
    );
    let (qnd, knd, fd) = (
        g.upload(&qn).unwrap(),
        g.upload(&kn).unwrap(),
        g.upload(&inv_freq).unwrap(),
    );
    let qd = g.alloc::<f32>(n * h * dd).unwrap();
    // Into the f16 caches first, then the f32 ones (q is the same either way; the f32 run's stays).
    for (table, f16) in [(&kv16, true), (&kvd, false)] {
        ops::attn_prep(
            g,
            g.ptr(&pd),
            ld,
            g.ptr(&qnd),
            g.ptr(&knd),
            eps,
            g.ptr(&fd),
            a,
            n,
            g.ptr(&td),
            g.ptr(table),
            g.ptr(&qd),
            f16,
        )
        .unwrap();
    }
    let mut segs = Vec::new();
    let mut st = 0;
    for &(t, past) in &SEGS {
        segs.extend([st as i32, t as i32, past as i32]);
        st += t;
    }
    AttnPrepped {
        ld,
        n,
        want_q,
        want_k,
        want_o,
        caches,
        caches16,
        proj: pd,
        tok: td,
        kv: kvd,
        kv16,
        segs: g.upload(&segs).unwrap(),
        q: qd,
        norms: [qnd, knd, fd],
        max_len: SEGS.iter().map(|s| s.0).max().unwrap(),
    }
}
