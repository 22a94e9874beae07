//! The sequence API on the CPU: chunked extend against the one-token walk, fork / snapshot / restore against fresh
//! continuations, readouts against the model's own logits, and `AnyBackend` against the model it wraps.
#![allow(clippy::unwrap_used)]

use onepass_engine::{AnyBackend, Backend, Pick, CHUNK_TOLERANCE};
use onepass_kernels::max_rel_diff as rel;
use onepass_model::synth::{self, pseudo_ids as ids};
use onepass_model::Model;

fn load(preset: &str) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    synth::write_checkpoint(&synth::preset(preset).unwrap(), dir.path(), &mut |_, _| {}).unwrap();
    let m = Model::load(dir.path()).unwrap();
    (dir, m)
}

/// The one-token walk: every position's full logits, one forward per id.
fn walk(m: &Model, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut st = Backend::new_state(m).unwrap();
    ids.iter()
        .map(|&id| {
            m.extend(&mut st, &[id], 0, &[0], Pick::Full)
                .unwrap()
                .remove(0)
        })
        .collect()
}

#[test]
fn chunked_extend_matches_the_one_token_walk() {
    for preset in ["tiny-gva", "tiny-attn-first", "tiny-bf16"] {
        let (_d, m) = load(preset);
        let v = Backend::vocab_size(&m);
        let seq = ids(150, v, 7);
        let want = walk(&m, &seq);
        let all: Vec<usize> = (0..seq.len()).collect();
        let mut worst = 0.0f32;
        for chunk in [0, 1, 7, 64, 100] {
            let mut st = Backend::new_state(&m).unwrap();
            let got = m.extend(&mut st, &seq, chunk, &all, Pick::Full).unwrap();
            assert_eq!(got.len(), seq.len());
            assert_eq!(m.position(&st), seq.len());
            for (p, (g, w)) in got.iter().zip(&want).enumerate() {
                let d = rel(g, w);
                assert!(
                    d <= CHUNK_TOLERANCE,
                    "{preset} chunk {chunk} position {p}: {d}"
                );
                worst = worst.max(d);
            }
            if chunk == 1 {
                assert_eq!(got, want, "{preset}: chunk 1 is the walk, bit for bit");
            }
        }
        eprintln!("{preset}: chunked vs one-token walk, worst relative |Δlogit| {worst:.2e}");
    }
}

#[test]
fn readouts_match_the_model_logits() {
    let (_d, m) = load("tiny-gva");
    let seq = ids(20, Backend::vocab_size(&m), 3);
    let mut st = m.new_state();
    let h = m.forward(&mut st, &seq).unwrap();
    let full = m.logits(&h);
    let v = Backend::vocab_size(&m);
    let mut st = Backend::new_state(&m).unwrap();
    let read = [0, 5, 19];
    let got = m.extend(&mut st, &seq, 0, &read, Pick::Full).unwrap();
    // One row through the head (a matrix-vector product) against all rows (a GEMM): the same up to f32 order.
    for (g, &r) in got.iter().zip(&read) {
        let d = rel(g, &full[r * v..(r + 1) * v]);
        assert!(d < 1e-5, "row {r}: {d}");
    }
    let pick = [3u32, 0, 200];
    let mut st = Backend::new_state(&m).unwrap();
    let got = m.extend(&mut st, &seq, 0, &read, Pick::Ids(&pick)).unwrap();
    for (g, &r) in got.iter().zip(&read) {
        let want: Vec<f32> = pick.iter().map(|&i| full[r * v + i as usize]).collect();
        let d = rel(g, &want);
        assert!(
            d < 1e-5,
            "row {r}: selected ids differ from the full head by {d}"
        );
    }
    // A readout outside the forward is an error, not a panic.
    assert!(Backend::logits(&m, &h, &[20]).is_err());
}

#[test]
fn fork_snapshot_restore_continue_bit_identically() {
    let (_d, m) = load("tiny-attn-first");
    let v = Backend::vocab_size(&m);
    let (head, tail) = (ids(40, v, 11), ids(25, v, 12));
    let mut a = Backend::new_state(&m).unwrap();
    m.extend(&mut a, &head, 16, &[], Pick::Full).unwrap();
    let snap = m.snapshot(&a).unwrap();
    let mut b = m.fork(&a).unwrap();
    let last = [tail.len() - 1];
    let ra = m.extend(&mut a, &tail, 8, &last, Pick::Full).unwrap();
    let rb = m.extend(&mut b, &tail, 8, &last, Pick::Full).unwrap();
    assert_eq!(ra, rb, "a fork continues as the original");
    // `a` moved on; restoring the snapshot puts it back where it was.
    let other = ids(5, v, 13);
    m.extend(&mut a, &other, 0, &[], Pick::Full).unwrap();
    m.restore(&mut a, &snap).unwrap();
    assert_eq!(m.position(&a), head.len());
    let rc = m.extend(&mut a, &tail, 8, &last, Pick::Full).unwrap();
    assert_eq!(ra, rc, "a restored snapshot continues as the original did");
    // The whole sequence fresh, with the same chunk boundaries.
    let mut f = Backend::new_state(&m).unwrap();
    m.extend(&mut f, &head, 16, &[], Pick::Full).unwrap();
    let rf = m.extend(&mut f, &tail, 8, &last, Pick::Full).unwrap();
    assert_eq!(ra, rf);
}

#[test]
fn any_backend_is_the_model_it_wraps() {
    let (d, m) = load("tiny-gva");
    let any = AnyBackend::cpu(Model::load(d.path()).unwrap());
    assert!(any.as_cpu().is_some() && any.as_cuda().is_none());
    assert_eq!(any.device(), "cpu");
    assert_eq!(any.vocab_size(), Backend::vocab_size(&m));
    assert_eq!(any.max_positions(), Backend::max_positions(&m));
    let seq = ids(30, Backend::vocab_size(&m), 5);
    let read = [29];
    let mut s1 = any.new_state().unwrap();
    let mut s2 = Backend::new_state(&m).unwrap();
    let a = any.extend(&mut s1, &seq, 7, &read, Pick::Full).unwrap();
    let b = m.extend(&mut s2, &seq, 7, &read, Pick::Full).unwrap();
    assert_eq!(a, b);
    assert_eq!(any.state_bytes(&s1), Backend::state_bytes(&m, &s2));
    let f = any.fork(&s1).unwrap();
    assert_eq!(any.position(&f), 30);
    let pick = [1u32, 2];
    let h1 = any.forward_batch(&mut [(&mut s1, &seq[..3])]).unwrap();
    let h2 = m.forward_batch(&mut [(&mut s2, &seq[..3])]).unwrap();
    assert_eq!(
        any.label_logits(&h1, &[(2, &pick)]).unwrap(),
        m.label_logits(&h2, &[(2, &pick)]).unwrap()
    );
}
