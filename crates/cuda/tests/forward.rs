//! The whole GPU forward against the CPU model on the synthetic presets: a prefill, a segment batch
//! over forked prefix states (different lengths, one of a single token), a one-token decode step
//! over every segment, and label-row readout. GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
//!
//! The checkpoints are written with bf16 weights (`tiny-gva` and `tiny-attn-first` are f32 presets;
//! their bf16 twins hold the same draws rounded), so both sides use identical weights and the
//! difference is the GPU's bf16 GEMM inputs against the CPU's f32 activations. Rounding the weights
//! alone moves these random tiny models' logits by up to 7e-2 of their largest logit (measured on
//! the CPU, tiny-gva, 130 tokens), so an f32 checkpoint is not a fair reference for a bf16 engine.
//!
//! Tolerance: max |logit_gpu − logit_cpu| / max(1, max |logit_cpu|) ≤ 1e-1. Measured on an H200
//! (2026-11-30): 1.5e-2 to 8.7e-2 (worst: tiny-attn-first, batch over forks). The 2e-2 first aimed at
//! is not reached; every op alone matches its CPU twin to 3e-3 (bf16 outputs) or 3e-7 (f32), and a
//! structural error (wrong offset, state or position) shows as O(1), so this bound still catches
//! those. The f32 mode separates bf16 amplification from a subtle error at the 1e-2 level:
//! `forward_f32_mode_matches_cpu_within_1e4`.
#![allow(clippy::unwrap_used)]

mod common;

use common::forward_check::*;
use common::*;
use onepass_cuda::{Arith, CudaModel, CudaOptions, Precision, TcArith};
use onepass_model::{synth, Model};
use onepass_tensor::DType;

const LOGIT_TOL: f32 = 1e-1;
/// The exact mode ([`Precision::F32`]) against the CPU.
const F32_LOGIT_TOL: f32 = 1e-4;

fn load(preset: &str, dtype: DType) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = synth::SynthSpec {
        dtype,
        ..synth::preset(preset).expect("preset")
    };
    synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).expect("synth");
    let m = Model::load(dir.path()).expect("load");
    (dir, m)
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn forward_matches_cpu_on_presets() {
    let g = gpu();
    let mut fails = Vec::new();
    for preset in ["tiny-gva", "tiny-attn-first", "tiny-bf16"] {
        let (_dir, m) = load(preset, DType::BF16);
        let gm = CudaModel::with_gpu(&m, g.clone()).expect("upload");
        check_forward(&mut fails, preset, &m, &gm, LOGIT_TOL);
    }
    assert!(fails.is_empty(), "over tolerance: {fails:?}");
}

/// The half precision (every projection on f16 inputs, the residual ones' scaled by a power of two from the
/// upload's bound, 1xTF32 gated delta kernels, attention on f16 KV caches) against the CPU on the bf16 presets, beside
/// half on f32 KV caches (1xTF32 attention) and the mixed and bf16 precisions on the same models (1xTF32 kernels;
/// mixed carries every GEMM input on two bf16 planes, bf16 rounds every one to 8 significant bits): the upload takes
/// it (no fallback to mixed, f16 caches), it stays within the bf16 bound, and its worst error over prefill, forks,
/// label rows and decode steps is below the bf16 precision's (its rounded inputs carry 3 more bits), f16 caches or
/// f32. Prints all four.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn half_precision_lands_between_mixed_and_bf16() {
    let g = gpu();
    let mut fails = Vec::new();
    let f32_kv = Some(TcArith::all(Arith::Tf32));
    // (name, precision, kernels, f16 KV caches expected)
    let runs = [
        ("mixed", Precision::Mixed, None, false),
        ("half", Precision::Half, None, true),
        ("half f32 KV", Precision::Half, f32_kv, false),
        ("bf16", Precision::Bf16, None, false),
    ];
    for preset in ["tiny-gva", "tiny-attn-first", "tiny-bf16"] {
        let (_dir, m) = load(preset, DType::BF16);
        let mut worst = Vec::new();
        for (name, prec, kernels, f16_kv) in runs {
            let o = CudaOptions {
                precision: prec,
                kernels,
                memory_budget_bytes: 0,
                ..CudaOptions::default()
            };
            let gm = CudaModel::with_options(&m, g.clone(), &o).expect("upload");
            assert_eq!(
                gm.precision(),
                prec,
                "{preset}: the upload fell back from {prec:?}"
            );
            if gm.kv_f16() != f16_kv {
                fails.push(format!("{preset} {name}: f16 KV caches {}", gm.kv_f16()));
            }
            worst.push(check_forward(
                &mut fails,
                &format!("{preset} {name}"),
                &m,
                &gm,
                LOGIT_TOL,
            ));
        }
        eprintln!(
            "{preset}: worst logit error mixed {:.3e}, half {:.3e}, half on f32 KV caches {:.3e}, bf16 {:.3e}",
            worst[0], worst[1], worst[2], worst[3]
        );
        for h in [1, 2] {
            if worst[h] >= worst[3] {
                fails.push(format!(
                    "{preset}: {} {:.3e} not below bf16 {:.3e}",
                    runs[h].0, worst[h], worst[3]
                ));
            }
        }
    }
    assert!(fails.is_empty(), "{fails:?}");
}

/// The exact mode (f32 weights as stored, f32 GEMM inputs, no TF32) against the CPU on every preset in its own
/// dtype, composite and GVA included: what is left is reduction order, so the bound is 1e-4. This is what
/// separates bf16 rounding from a bug: a structural error fails here whatever the bf16 amplification.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn forward_f32_mode_matches_cpu_within_1e4() {
    let g = gpu();
    let mut fails = Vec::new();
    for preset in synth::PRESETS.iter().filter(|p| p.starts_with("tiny")) {
        let (_dir, m) = load(preset, synth::preset(preset).expect("preset").dtype);
        let gm = CudaModel::with_precision(&m, g.clone(), Precision::F32).expect("upload");
        check_forward(&mut fails, &format!("{preset} f32"), &m, &gm, F32_LOGIT_TOL);
    }
    assert!(fails.is_empty(), "over tolerance: {fails:?}");
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn fork_is_independent_and_deterministic() {
    let g = gpu();
    let (_dir, m) = load("tiny-gva", DType::BF16);
    let gm = CudaModel::with_gpu(&m, g.clone()).expect("upload");
    let v = m.vocab_size();
    let mut base = gm.new_state().unwrap();
    gm.forward(&mut base, &ids(70, v, 9)).unwrap();
    let mut f = gm.fork(&base, 2).unwrap();
    let x = ids(20, v, 10);
    let a = gm.forward(&mut f[0], &x).unwrap().to_host(&g).unwrap();
    // Advancing the original must not touch the fork's copy.
    gm.forward(&mut base, &ids(5, v, 11)).unwrap();
    let b = gm.forward(&mut f[1], &x).unwrap().to_host(&g).unwrap();
    assert_eq!(
        a, b,
        "two forks continued with the same tokens must agree bit for bit"
    );
    // A fork of a fork (its KV base copied into a cache of its own) continues like the original.
    let mut ff = gm.fork(&f[1], 1).unwrap();
    let y = ids(9, v, 12);
    let c = gm.forward(&mut ff[0], &y).unwrap().to_host(&g).unwrap();
    let d = gm.forward(&mut f[1], &y).unwrap().to_host(&g).unwrap();
    assert_eq!(c, d, "a fork of a fork must continue like its parent");
}

/// CUDA graphs: the same forward shapes run directly (graphs off), then with graphs on, where the first sight of a
/// shape runs directly, the second is captured and the third replays the graph, with other token ids and other
/// states each time (the table's contents change, the shape does not). Every logit must be bit-identical to the
/// run without graphs, and a replay must read the states it is given (not those it was captured with).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn graph_replays_equal_direct_runs() {
    let g = gpu();
    let (_dir, m) = load("tiny-gva", DType::BF16);
    let vocab = m.vocab_size();
    let run = |graphs: bool| -> Vec<Vec<f32>> {
        let gm = CudaModel::with_precision(&m, g.clone(), Precision::Bf16Split).expect("upload");
        gm.set_graphs(graphs);
        let mut out = Vec::new();
        for rep in 0..4u64 {
            let mut st = gm.new_state().unwrap();
            // Prefix of 40 tokens, then suffixes of 9, 1 and 70 tokens over three forks.
            let h = gm.forward(&mut st, &ids(40, vocab, 100 + rep)).unwrap();
            out.push(gm.logits(&h).unwrap());
            let mut forks = gm.fork(&st, 3).unwrap();
            let seqs = [
                ids(9, vocab, 200 + rep),
                ids(1, vocab, 300 + rep),
                ids(70, vocab, 400 + rep),
            ];
            let h = gm.forward_batch(&mut pairs(&mut forks, &seqs)).unwrap();
            out.push(gm.logits(&h).unwrap());
            // One-token steps on every fork (the decode shape).
            let one: Vec<Vec<u32>> = (0..3).map(|i| ids(1, vocab, 500 + 10 * rep + i)).collect();
            let h = gm.forward_batch(&mut pairs(&mut forks, &one)).unwrap();
            out.push(gm.logits(&h).unwrap());
        }
        assert_eq!(
            gm.graphs_on(),
            graphs,
            "a capture failed and turned graphs off"
        );
        // Each shape is seen 4 times: captured on the second sight, replayed after (a scratch that grows drops graphs
        // and sights, so the exact count depends on when it grows).
        let launches = gm.graph_launches();
        if graphs {
            assert!(launches > 0, "no graph was captured or replayed");
        } else {
            assert_eq!(launches, 0, "graphs ran while switched off");
        }
        out
    };
    let direct = run(false);
    let graphed = run(true);
    for (i, (a, b)) in direct.iter().zip(&graphed).enumerate() {
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        eprintln!("graph forward {i}: max|diff| {diff:e}");
        assert!(a == b, "forward {i} differs with graphs: {diff:e}");
    }
}

/// With shape buckets on, forwards of lengths not seen before replay one captured graph when their rows fall in one
/// bucket (each padded to it with ids 0: a tree by its last child's going on within its chunk, or where that child
/// fills its chunk by one more dropped child, a plain forward by one more root): trees of a root of 40 to 48 ids and
/// children of 9 and 5 (54 to 62 rows, the bucket of 64; the child of 5 goes on), then of 9 and 64 (113 to 121 rows,
/// the bucket of 128; a pad child), then prefills of 33 to 45 ids (the bucket of 48). The first of each runs kernel
/// by kernel, the second captures, the rest replay; every forward's rows equal those of the same model without
/// graphs bit for bit
/// (the padding does not depend on graphs), and agree with the exact CPU model within the exact mode's bound, the
/// prefills' states too (3 more ids on each: the pad root, a state of the model's own, must leave the prefill's
/// conv, recurrent and KV state alone).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn one_bucket_of_lengths_replays_one_graph() {
    let g = gpu();
    let (_dir, m) = load("tiny-gva", DType::F32);
    let v = m.vocab_size();
    let gm = CudaModel::with_precision(&m, g.clone(), Precision::F32).expect("upload");
    let direct = CudaModel::with_precision(&m, g.clone(), Precision::F32).expect("upload");
    direct.set_graphs(false);
    for m in [&gm, &direct] {
        m.set_shape_buckets(true);
    }
    let mut fails = Vec::new();
    for (kid_lens, i) in [[9usize, 5], [9, 64]]
        .into_iter()
        .flat_map(|k| (0..5).map(move |i| (k, i)))
    {
        let root_len = 40 + 2 * i;
        let s = 100 * i as u64 + kid_lens[1] as u64;
        let root = [ids(root_len, v, s + 1)];
        let kids = kid_lens.map(|l| ids(l, v, s + 2 + l as u64));
        let children: Vec<(usize, &[u32])> = kids.iter().map(|k| (0, k.as_slice())).collect();
        let rows = root_len + kid_lens.iter().sum::<usize>();
        let tree = |gm: &CudaModel| {
            let mut st = vec![gm.new_state().unwrap()];
            let (h, _) = gm
                .forward_tree(&mut pairs(&mut st, &root), &children, false)
                .unwrap()
                .expect("this tree runs in one forward");
            assert_eq!(
                h.rows, rows,
                "tree {i} {kid_lens:?}: the pad rows are not the caller's"
            );
            gm.logits(&h).unwrap()
        };
        let before = gm.graph_launches();
        let got = tree(&gm);
        assert_eq!(
            gm.graph_launches() > before,
            i > 0,
            "tree {i} {kid_lens:?} ({rows} rows): a graph ran only from the bucket's second forward on"
        );
        assert!(
            got == tree(&direct),
            "tree {i} {kid_lens:?}: the graph's rows differ from direct launches"
        );
        let mut cs = m.new_state();
        let mut want = m.logits(&m.forward(&mut cs, &root[0]).unwrap());
        let mut forks = cs.fork(2);
        want.extend(m.logits(&m.forward_batch(&mut pairs(&mut forks, &kids)).unwrap()));
        soft(
            &mut fails,
            &format!("tree {i} {kid_lens:?} against the CPU"),
            &got,
            &want,
            F32_LOGIT_TOL,
        );
    }
    for (i, len) in [33usize, 36, 39, 42, 45].into_iter().enumerate() {
        let (prompt, more) = (ids(len, v, 1000 + i as u64), ids(3, v, 2000 + i as u64));
        let prefill = |gm: &CudaModel| {
            let mut st = gm.new_state().unwrap();
            let a = gm.logits(&gm.forward(&mut st, &prompt).unwrap()).unwrap();
            let b = gm.logits(&gm.forward(&mut st, &more).unwrap()).unwrap();
            (a, b)
        };
        let before = gm.graph_launches();
        let got = prefill(&gm);
        // The 3-id forward that follows is padded to its own bucket (16 rows): it replays from the second prefill
        // on as well, so the count only says that something replayed.
        assert!(
            i == 0 || gm.graph_launches() > before,
            "prefill {i} of {len} ids: no graph from the bucket's second forward on"
        );
        assert!(
            got == prefill(&direct),
            "prefill {i}: the graph's rows differ from direct launches"
        );
        let mut cs = m.new_state();
        let want_a = m.logits(&m.forward(&mut cs, &prompt).unwrap());
        let want_b = m.logits(&m.forward(&mut cs, &more).unwrap());
        soft(
            &mut fails,
            &format!("prefill {i} against the CPU"),
            &got.0,
            &want_a,
            F32_LOGIT_TOL,
        );
        soft(
            &mut fails,
            &format!("prefill {i}: 3 more ids"),
            &got.1,
            &want_b,
            F32_LOGIT_TOL,
        );
    }
    assert!(fails.is_empty(), "over tolerance: {fails:?}");
}

/// `forward_tree` (roots and the children that continue them in one forward) against the two-pass path it replaces:
/// the roots through `forward_batch`, forks of them, the children through `forward_batch`. The roots: a fresh one of
/// 40 ids with children of 63, 1 and 65 ids; one that already consumed 17 ids (so its children's conv inputs mix its
/// rows and its state is not zero) running 9 more, with children of 2 and 70 ids; a fresh one of 5 ids without
/// children. Compared: every logit of the one forward, then of one more batch of 3 ids on every child (the children's
/// conv, recurrent and KV state), and the positions; without the children's states (the engine's route) the rows must
/// be the same bit for bit. Three rounds per model with new ids and states, so with CUDA
/// graphs on the third replays a captured tree. In the exact mode on every tiny preset and in split on tiny-gva; a
/// structural error (a wrong parent row, state or cache position) shows as O(1).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn tree_forward_equals_prefix_then_forks() {
    let g = gpu();
    const TOL: f32 = 1e-4;
    let mut fails = Vec::new();
    let mut cases: Vec<(String, Precision)> = synth::PRESETS
        .iter()
        .filter(|p| p.starts_with("tiny"))
        .map(|p| (p.to_string(), Precision::F32))
        .collect();
    cases.push(("tiny-gva".into(), Precision::Bf16Split));
    for (preset, prec) in cases {
        let (_dir, m) = load(&preset, synth::preset(&preset).expect("preset").dtype);
        let gm = CudaModel::with_precision(&m, g.clone(), prec).expect("upload");
        let v = m.vocab_size();
        for round in 0..3u64 {
            let s = 1000 * (round + 1);
            let warm = ids(17, v, s);
            let root_ids = [ids(40, v, s + 1), ids(9, v, s + 2), ids(5, v, s + 3)];
            let kids: Vec<(usize, Vec<u32>)> = [(0, 63), (0, 1), (0, 65), (1, 2), (1, 70)]
                .iter()
                .enumerate()
                .map(|(i, &(r, n))| (r, ids(n, v, s + 10 + i as u64)))
                .collect();
            let more: Vec<Vec<u32>> = (0..kids.len())
                .map(|i| ids(3, v, s + 20 + i as u64))
                .collect();
            let fresh_roots = |gm: &CudaModel| {
                let mut st: Vec<_> = (0..3).map(|_| gm.new_state().unwrap()).collect();
                gm.forward(&mut st[1], &warm).unwrap();
                st
            };

            // The two-pass reference.
            let mut rs = fresh_roots(&gm);
            let hr = gm.forward_batch(&mut pairs(&mut rs, &root_ids)).unwrap();
            let mut want = gm.logits(&hr).unwrap();
            let mut forks: Vec<_> = kids
                .iter()
                .map(|(r, _)| gm.copy_state(&rs[*r]).unwrap())
                .collect();
            let kid_ids: Vec<Vec<u32>> = kids.iter().map(|(_, x)| x.clone()).collect();
            let hc = gm.forward_batch(&mut pairs(&mut forks, &kid_ids)).unwrap();
            want.extend(gm.logits(&hc).unwrap());
            let want_more = gm
                .logits(&gm.forward_batch(&mut pairs(&mut forks, &more)).unwrap())
                .unwrap();

            // The tree.
            let mut ts = fresh_roots(&gm);
            let children: Vec<(usize, &[u32])> =
                kids.iter().map(|(r, x)| (*r, x.as_slice())).collect();
            let (h, mut tk) = gm
                .forward_tree(&mut pairs(&mut ts, &root_ids), &children, true)
                .unwrap()
                .expect("this tree runs in one forward");
            assert_eq!(h.rows, 40 + 9 + 5 + 63 + 1 + 65 + 2 + 70);
            let name = format!("{preset} {prec:?} round {round}");
            soft(
                &mut fails,
                &format!("{name}: tree logits"),
                &gm.logits(&h).unwrap(),
                &want,
                TOL,
            );
            let got_more = gm
                .logits(&gm.forward_batch(&mut pairs(&mut tk, &more)).unwrap())
                .unwrap();
            soft(
                &mut fails,
                &format!("{name}: 3 more ids on every child"),
                &got_more,
                &want_more,
                TOL,
            );
            for (i, (a, b)) in tk.iter().zip(&forks).enumerate() {
                assert_eq!(a.position(), b.position(), "{name}: child {i} position");
            }
            assert_eq!(ts[1].position(), 17 + 9, "{name}: root position");
            // Without the children's states (the engine's readout): the same rows bit for bit, no states.
            let mut ts = fresh_roots(&gm);
            let (h2, none) = gm
                .forward_tree(&mut pairs(&mut ts, &root_ids), &children, false)
                .unwrap()
                .expect("this tree runs in one forward");
            assert!(none.is_empty(), "{name}: states returned without keep");
            assert_eq!(h2.rows, h.rows, "{name}: the pad rows are the caller's");
            let (dropped, kept) = (gm.logits(&h2).unwrap(), gm.logits(&h).unwrap());
            if gm.shape_buckets() {
                // Padded to its bucket (the last dropped child's ids going on, or one more dropped child), the
                // forward's GEMMs run at another row count: the same rows within rounding, where a wrong state or row
                // is O(1).
                let name = format!("{name}: children's states dropped");
                soft(&mut fails, &name, &dropped, &kept, 1e-5);
            } else {
                assert!(
                    dropped == kept,
                    "{name}: dropping the children's states changed their rows"
                );
            }
        }

        // What one forward does not take: a root too short to continue, a root that is itself a fork.
        let mut st = vec![gm.new_state().unwrap()];
        let one = [ids(1, v, 7)];
        let r = gm.forward_tree(&mut pairs(&mut st, &one), &[(0, &one[0][..])], true);
        assert!(
            matches!(r, Ok(None)),
            "{preset}: a 1-id root must be refused"
        );
        assert_eq!(st[0].position(), 0, "{preset}: a refused tree must not run");
        gm.forward(&mut st[0], &ids(6, v, 8)).unwrap();
        let mut f = gm.fork(&st[0], 1).unwrap();
        let x = [ids(8, v, 9)];
        let r = gm.forward_tree(&mut pairs(&mut f, &x), &[(0, &x[0][..])], true);
        assert!(
            matches!(r, Ok(None)),
            "{preset}: a forked root must be refused"
        );
        let r = gm.forward_tree(&mut pairs(&mut f, &x), &[(1, &x[0][..])], true);
        assert!(
            r.is_err(),
            "{preset}: a child of a missing root is an error"
        );
    }
    assert!(fails.is_empty(), "over tolerance: {fails:?}");
}

/// Greedy decoding queued ahead of the host (`greedy_steps`: each step one graph of the layers, head and argmax, the
/// pick fed from the device) against the same decode step by step (`forward` then `argmax_at`): the same 24 tokens,
/// and states that continue alike. Then the bounds: `max_steps` forwards at most, a stop after the fifth token leaves
/// the state one token ahead (the step queued before the answer), and a second decode while one holds the decode
/// buffers is declined with nothing run.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn greedy_steps_pick_what_steps_pick() {
    let g = gpu();
    let (_dir, m) = load("tiny-gva", DType::BF16);
    let vocab = m.vocab_size();
    let gm = CudaModel::with_precision(&m, g.clone(), Precision::Bf16Split).expect("upload");
    let serial = std::sync::Mutex::new(());
    let prompt = ids(30, vocab, 77);
    let start = |gm: &CudaModel| {
        let mut st = gm.new_state().unwrap();
        let h = gm.forward(&mut st, &prompt).unwrap();
        let first = gm.argmax_at(&h, &[prompt.len() - 1]).unwrap()[0];
        (st, first)
    };
    const STEPS: usize = 24;
    let (mut a, first) = start(&gm);
    let mut by_steps = Vec::new();
    let mut tok = first;
    for _ in 0..STEPS {
        let h = gm.forward(&mut a, &[tok]).unwrap();
        tok = gm.argmax_at(&h, &[0]).unwrap()[0];
        by_steps.push(tok);
    }
    let (mut b, first_b) = start(&gm);
    assert_eq!(first, first_b);
    let mut ahead = Vec::new();
    let fed = gm
        .greedy_steps(&mut b, first, STEPS, &serial, &mut |t| {
            ahead.push(t);
            true
        })
        .unwrap();
    assert_eq!(fed, Some(STEPS));
    assert_eq!(
        ahead, by_steps,
        "greedy steps queued ahead picked other tokens"
    );
    assert_eq!(b.position(), a.position());
    // Both states continue alike (KV rows, conv and recurrent state, position).
    let next = ids(3, vocab, 78);
    let la = gm.logits(&gm.forward(&mut a, &next).unwrap()).unwrap();
    let lb = gm.logits(&gm.forward(&mut b, &next).unwrap()).unwrap();
    assert!(la == lb, "the states after the two decodes differ");

    // At most max_steps forwards.
    let (mut c, first) = start(&gm);
    let mut seen = 0;
    let fed = gm
        .greedy_steps(&mut c, first, 3, &serial, &mut |_| {
            seen += 1;
            true
        })
        .unwrap();
    assert_eq!((fed, seen), (Some(3), 3));
    assert_eq!(c.position(), prompt.len() + 3);
    // A stop on the fifth token: the sixth step was queued before the answer.
    let (mut d, first) = start(&gm);
    let mut seen = Vec::new();
    let fed = gm
        .greedy_steps(&mut d, first, STEPS, &serial, &mut |t| {
            seen.push(t);
            seen.len() < 5
        })
        .unwrap();
    assert_eq!(seen, by_steps[..5]);
    assert_eq!(fed, Some(6));
    assert_eq!(d.position(), prompt.len() + 6);
    // Busy buffers: declined, nothing run.
    let held = gm
        .greedy_run()
        .unwrap()
        .expect("the decode buffers are free");
    let (mut e, first) = start(&gm);
    let fed = gm
        .greedy_steps(&mut e, first, 4, &serial, &mut |_| true)
        .unwrap();
    assert_eq!(fed, None);
    assert_eq!(e.position(), prompt.len());
    drop(held);
}

/// A sampled decode step as one graph (`logits_step`: the layers, the final norm and the head) against a plain
/// one-token forward and its logits: bit-identical logits over 6 steps (the graph is captured at the second and
/// replayed after), states at the same position; declined with nothing run while a decode holds the buffers.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn logits_step_equals_forward_and_head() {
    let g = gpu();
    let (_dir, m) = load("tiny-gva", DType::BF16);
    let vocab = m.vocab_size();
    let gm = CudaModel::with_precision(&m, g.clone(), Precision::Bf16Split).expect("upload");
    let prompt = ids(20, vocab, 91);
    let (mut a, mut b) = (gm.new_state().unwrap(), gm.new_state().unwrap());
    gm.forward(&mut a, &prompt).unwrap();
    gm.forward(&mut b, &prompt).unwrap();
    for (i, &tok) in ids(6, vocab, 92).iter().enumerate() {
        let want = gm.logits(&gm.forward(&mut a, &[tok]).unwrap()).unwrap();
        let got = gm
            .logits_step(&mut b, tok)
            .unwrap()
            .expect("the decode buffers are free");
        assert!(
            got == want,
            "step {i}: the graph's logits differ from the forward's"
        );
        assert_eq!(a.position(), b.position());
    }
    let held = gm
        .greedy_run()
        .unwrap()
        .expect("the decode buffers are free");
    assert!(gm.logits_step(&mut b, 3).unwrap().is_none());
    assert_eq!(b.position(), a.position());
    drop(held);
}
