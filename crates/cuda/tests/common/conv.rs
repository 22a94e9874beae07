//! One launch of the token-parallel conv + L2 norm + gates kernel (`ops::gdn_conv_prep`) from host inputs, with its
//! outputs back on the host: the setup the conv tests share.

use onepass_cuda::ops::{self, GdnDims};
use onepass_cuda::Gpu;

/// Host inputs of one launch. Segments of `lens` tokens on consecutive rows of x [N, ld] (conv channels 0..cd, cd
/// = 2 hk dk + hv dv; the gates' a and b at columns off_a, off_b), token positions from 5; conv weights w [cd, k];
/// each segment's conv state [(k - 1) cd], uploaded `skew` floats past its allocation's start (1: not 16-byte
/// aligned); `par`: each segment's parent (-1: none), or none at all; q scaled by 1 / sqrt(dk).
pub struct ConvLaunch<'a> {
    pub d: GdnDims,
    pub k: usize,
    pub x: &'a [f32],
    pub ld: usize,
    pub w: &'a [f32],
    pub lens: &'a [usize],
    pub par: Option<&'a [i32]>,
    pub states: &'a [Vec<f32>],
    pub skew: usize,
    /// off_a, off_b, neg_a [hv], dt_bias [hv].
    pub gates: (usize, usize, &'a [f32], &'a [f32]),
}

/// What the launch wrote: out [N, cd], g and beta [N, hv], and each segment's conv state after it.
pub struct ConvOut {
    pub out: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
    pub states: Vec<Vec<f32>>,
}

/// Runs `ops::gdn_conv_prep` on `c` and downloads what it wrote.
pub fn conv_prep_gpu(g: &Gpu, c: &ConvLaunch) -> ConvOut {
    let d = c.d;
    let cd = 2 * d.hk * d.dk + d.hv * d.dv;
    let n: usize = c.lens.iter().sum();
    let (mut segs, mut tok, mut start) = (Vec::new(), Vec::new(), 0);
    for (s, &len) in c.lens.iter().enumerate() {
        segs.extend([start as i32, len as i32, 5]);
        tok.extend((0..len).flat_map(|i| [s as i32, (5 + i) as i32]));
        start += len;
    }
    let (xd, wd, sd, td) = (
        g.upload(c.x).unwrap(),
        g.upload(c.w).unwrap(),
        g.upload(&segs).unwrap(),
        g.upload(&tok).unwrap(),
    );
    let (off_a, off_b, neg_a, dt) = c.gates;
    let (nad, dtd) = (g.upload(neg_a).unwrap(), g.upload(dt).unwrap());
    let pard = c.par.map(|p| g.upload(p).unwrap());
    let states: Vec<_> = c
        .states
        .iter()
        .map(|s| g.upload(&[&vec![0.0; c.skew][..], s].concat()).unwrap())
        .collect();
    let ptrs: Vec<u64> = states
        .iter()
        .map(|s| g.ptr(s) + 4 * c.skew as u64)
        .collect();
    let pd = g.upload(&ptrs).unwrap();
    let od = g.alloc::<f32>(n * cd).unwrap();
    let gd = g.alloc::<f32>(n * d.hv).unwrap();
    let bd = g.alloc::<f32>(n * d.hv).unwrap();
    ops::gdn_conv_prep(
        g,
        g.ptr(&xd),
        c.ld,
        g.ptr(&od),
        g.ptr(&wd),
        c.k,
        cd,
        g.ptr(&sd),
        g.ptr(&td),
        g.ptr(&pd),
        pard.as_ref().map_or(0, |p| g.ptr(p)),
        c.lens.len(),
        n,
        d,
        1.0 / (d.dk as f32).sqrt(),
        (off_a, off_b, g.ptr(&nad), g.ptr(&dtd)),
        g.ptr(&gd),
        g.ptr(&bd),
    )
    .unwrap();
    ConvOut {
        out: g.download(&od, n * cd).unwrap(),
        g: g.download(&gd, n * d.hv).unwrap(),
        beta: g.download(&bd, n * d.hv).unwrap(),
        states: states
            .iter()
            .map(|s| g.download(s, c.skew + (c.k - 1) * cd).unwrap()[c.skew..].to_vec())
            .collect(),
    }
}
