//! The token-parallel conv kernel (`ops::gdn_conv_prep`, fused.cu gdn_conv_prep_run) takes one of three paths for a
//! row: a full run of 8 rows whose window lies in its segment's rows (`conv_run4`), other runs in windows of 4 rows
//! (`conv_rows4<4>`), or token by token (`conv_token`, rows of x not 16-byte aligned). Each must give a row the same
//! bits. GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::conv::{conv_prep_gpu, ConvLaunch};
use common::*;
use onepass_cuda::ops::GdnDims;

/// A segment of 45 rows after a segment of `lead` rows (0: alone), its rows of x `ld` apart: → its output rows.
fn conv_rows(g: &onepass_cuda::Gpu, lead: usize, pad: usize) -> Vec<f32> {
    let d = GdnDims {
        hk: 2,
        hv: 6,
        dk: 40,
        dv: 20,
    };
    let (k, len) = (4, 45);
    let cd = 2 * d.hk * d.dk + d.hv * d.dv;
    let (off_a, off_b, ld) = (cd + 7, cd + 7 + d.hv, cd + 7 + 2 * d.hv + pad);
    let lens: Vec<usize> = if lead > 0 { vec![lead, len] } else { vec![len] };
    let n = lead + len;
    // The same values of each row whatever its place: row r of the segment from one stream, the lead's from another.
    let (seg_x, lead_x) = (rnd(len * cd, 70), rnd(lead * cd, 71));
    let mut x = vec![0.0; n * ld];
    for (r, v) in lead_x
        .chunks_exact(cd)
        .chain(seg_x.chunks_exact(cd))
        .enumerate()
    {
        x[r * ld..r * ld + cd].copy_from_slice(v);
    }
    let w = rnd(cd * k, 72);
    let neg_a: Vec<f32> = rnd(d.hv, 73).iter().map(|v| -(v + 1.5)).collect();
    let dt = rnd(d.hv, 74);
    // The segment's conv state the same whatever comes before it.
    let states: Vec<Vec<f32>> = (0..lens.len())
        .map(|s| rnd((k - 1) * cd, 80 + (lens.len() - 1 - s) as u64))
        .collect();
    let got = conv_prep_gpu(
        g,
        &ConvLaunch {
            d,
            k,
            x: &x,
            ld,
            w: &w,
            lens: &lens,
            par: None,
            states: &states,
            skew: 0,
            gates: (off_a, off_b, &neg_a, &dt),
        },
    );
    got.out[lead * cd..].to_vec()
}

/// One segment's output rows, bit for bit, alone (rows 0..8 in a run of 4-row windows, reading the conv state; then
/// full runs), after 5 rows of another segment (its rows 3..10 in a full run, which alone were split between the
/// two), after 2, and with rows of x not 16-byte aligned (token by token).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn conv_rows_do_not_depend_on_the_path() {
    let g = gpu();
    let alone = conv_rows(&g, 0, 5);
    for (lead, pad) in [(5, 5), (2, 5), (5, 3)] {
        let got = conv_rows(&g, lead, pad);
        assert!(
            got == alone,
            "lead {lead} pad {pad}: the segment's conv rows differ from its rows alone"
        );
    }
}
