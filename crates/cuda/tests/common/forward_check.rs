//! The whole forward of a GPU model against its CPU model, shared by the float (forward.rs) and block-format
//! (quant_forward.rs) tests: a prefill, a batch over forked prefix states (63, 1 and 65 ids), label rows, three
//! one-token steps over the forks, one row alone and greedy's argmax.

use onepass_cuda::CudaModel;
use onepass_model::Model;

use super::{rel_err, rnd};

pub fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    rnd(n, seed)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * vocab as f32) as usize).min(vocab - 1) as u32)
        .collect()
}

pub fn pairs<'a, S>(states: &'a mut [S], seqs: &'a [Vec<u32>]) -> Vec<(&'a mut S, &'a [u32])> {
    states
        .iter_mut()
        .zip(seqs)
        .map(|(s, x)| (s, x.as_slice()))
        .collect()
}

/// Records a failure over `tol` (and carries on); → the error, also kept as the worst in `worst`.
pub fn soft(fails: &mut Vec<String>, name: &str, a: &[f32], b: &[f32], tol: f32) -> f32 {
    let e = rel_err(a, b);
    eprintln!("{name}: max|diff|/max(1,max|ref|) = {e:.3e} (tolerance {tol:.1e})");
    if e > tol {
        fails.push(format!("{name}: {e:.3e}"));
    }
    e
}

/// Prefill, batch over forks, label rows, three decode steps: GPU logits against the CPU's. → the worst error
pub fn check_forward(
    fails: &mut Vec<String>,
    name: &str,
    m: &Model,
    gm: &CudaModel,
    tol: f32,
) -> f32 {
    let mut worst = 0.0f32;
    let mut soft = |fails: &mut Vec<String>, name: &str, a: &[f32], b: &[f32], tol: f32| {
        worst = worst.max(soft(fails, name, a, b, tol));
    };
    let (v, h) = (m.vocab_size(), m.hidden_size());
    let seq = ids(130, v, 1);
    let mut cs = m.new_state();
    let want = m.logits(&m.forward(&mut cs, &seq).unwrap());
    let mut gs = gm.new_state().unwrap();
    let hid = gm.forward(&mut gs, &seq).unwrap();
    soft(
        fails,
        &format!("{name} prefill 130"),
        &gm.logits(&hid).unwrap(),
        &want,
        tol,
    );

    let prefix = ids(40, v, 2);
    let mut cp = m.new_state();
    m.forward(&mut cp, &prefix).unwrap();
    let mut gp = gm.new_state().unwrap();
    gm.forward(&mut gp, &prefix).unwrap();
    let sufs = [ids(63, v, 3), ids(1, v, 4), ids(65, v, 5)];
    let mut cf = cp.fork(3);
    let mut gf = gm.fork(&gp, 3).unwrap();
    let cpu_h = m.forward_batch(&mut pairs(&mut cf, &sufs)).unwrap();
    let got_h = gm.forward_batch(&mut pairs(&mut gf, &sufs)).unwrap();
    soft(
        fails,
        &format!("{name} batch over forks"),
        &gm.logits(&got_h).unwrap(),
        &m.logits(&cpu_h),
        tol,
    );

    let labels: Vec<u32> = vec![3, 17, 42, (v - 1) as u32];
    let mut picks = Vec::new();
    let mut want_rows = Vec::new();
    for r in [62usize, 63, 128] {
        for &l in &labels {
            picks.push((r, l));
        }
        want_rows.extend(m.logits_rows(&cpu_h[r * h..(r + 1) * h], &labels).unwrap());
    }
    soft(
        fails,
        &format!("{name} label rows"),
        &gm.logits_rows(&got_h, &picks).unwrap(),
        &want_rows,
        tol,
    );

    for step in 0..3u64 {
        let one: Vec<Vec<u32>> = (0..3).map(|i| ids(1, v, 10 + 3 * step + i)).collect();
        let want = m.logits(&m.forward_batch(&mut pairs(&mut cf, &one)).unwrap());
        let got = gm
            .logits(&gm.forward_batch(&mut pairs(&mut gf, &one)).unwrap())
            .unwrap();
        soft(
            fails,
            &format!("{name} decode step {step} (3 rows)"),
            &got,
            &want,
            tol,
        );
    }
    assert_eq!(gf[0].position(), 40 + 63 + 3);
    // One row alone (the one-row GEMVs), and greedy's argmax on the GPU against the CPU logits' (ties aside).
    let one = ids(1, v, 30);
    let want = m.logits(&m.forward(&mut cs, &one).unwrap());
    let got_h = gm.forward(&mut gs, &one).unwrap();
    soft(
        fails,
        &format!("{name} decode one row"),
        &gm.logits(&got_h).unwrap(),
        &want,
        tol,
    );
    let arg = gm.argmax_at(&got_h, &[0]).unwrap()[0] as usize;
    let best = want.iter().copied().fold(f32::MIN, f32::max);
    let margin = best - want[arg];
    eprintln!("{name} argmax {arg}: {margin:.3e} below the CPU's best");
    if margin > tol * best.abs().max(1.0) {
        fails.push(format!("{name} argmax {arg}: {margin:.3e} below the best"));
    }
    worst
}
