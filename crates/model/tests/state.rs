//! Sequence state: chunked prefill, one-token decode, snapshot/restore and fork.

mod common;

use onepass_model::synth;

#[test]
fn chunk_sizes_agree_with_whole_sequence() {
    for preset in ["tiny-gva", "tiny-attn-first", "tiny-bf16"] {
        let (_d, m) = common::load(preset);
        let ids = synth::pseudo_ids(200, m.vocab_size(), 7);
        let whole = common::logits_chunked(&m, &ids, ids.len());
        let v = m.vocab_size();
        for chunk in [1, 7, 64] {
            let got = common::logits_chunked(&m, &ids, chunk);
            for p in 0..ids.len() {
                let d = common::rel_diff(&got[p * v..(p + 1) * v], &whole[p * v..(p + 1) * v]);
                assert!(d <= 1e-4, "{preset} chunk {chunk} position {p}: {d:e}");
            }
        }
    }
}

#[test]
fn fork_and_restore_are_bit_identical_to_fresh() {
    let (_d, m) = common::load("tiny-gva");
    let ids = synth::pseudo_ids(150, m.vocab_size(), 3);
    let (prefix, rest) = ids.split_at(90);
    // Fresh: prefix then the rest in chunks of 13.
    let mut fresh = m.new_state();
    m.forward(&mut fresh, prefix).expect("prefix");
    let snap = fresh.snapshot();
    let mut want = Vec::new();
    for piece in rest.chunks(13) {
        want.extend(m.forward(&mut fresh, piece).expect("rest"));
    }
    // Forks of the prefix state continue identically.
    let mut base = m.new_state();
    m.forward(&mut base, prefix).expect("prefix");
    for mut f in base.fork(3) {
        let mut got = Vec::new();
        for piece in rest.chunks(13) {
            got.extend(m.forward(&mut f, piece).expect("fork"));
        }
        assert!(got == want, "a fork diverged from the fresh run");
    }
    // Restoring the snapshot into a state that moved on gives the same again.
    let mut moved = fresh.clone();
    m.forward(&mut moved, &rest[..5]).expect("move");
    moved.restore(&snap);
    assert_eq!(moved.position(), prefix.len());
    let mut got = Vec::new();
    for piece in rest.chunks(13) {
        got.extend(m.forward(&mut moved, piece).expect("restored"));
    }
    assert!(got == want, "the restored state diverged");
}

#[test]
fn state_bytes_grow_with_attention_only() {
    let (_d, m) = common::load("tiny-gva");
    let info = m.info();
    let mut st = m.new_state();
    assert_eq!(st.bytes(), info.state_bytes_per_sequence);
    m.forward(&mut st, &[1, 2, 3, 4]).expect("forward");
    assert_eq!(
        st.bytes(),
        info.state_bytes_per_sequence + 4 * info.state_bytes_per_token
    );
    assert_eq!(st.position(), 4);
}

#[test]
fn batched_segments_match_separate_runs() {
    let (_d, m) = common::load("tiny-attn-first");
    let v = m.vocab_size();
    let a = synth::pseudo_ids(70, v, 1);
    let b = synth::pseudo_ids(5, v, 2);
    let mut sa = m.new_state();
    let mut sb = m.new_state();
    m.forward(&mut sb, &synth::pseudo_ids(33, v, 9))
        .expect("history");
    let mut sb_sep = sb.clone();
    let both = m
        .forward_batch(&mut [(&mut sa, &a[..]), (&mut sb, &b[..])])
        .expect("batch");
    let ha = m.forward(&mut m.new_state(), &a).expect("a");
    let hb = m.forward(&mut sb_sep, &b).expect("b");
    let h = m.hidden_size();
    let sep: Vec<f32> = ha.iter().chain(hb.iter()).copied().collect();
    assert_eq!(both.len(), sep.len());
    for (i, (x, y)) in both.iter().zip(&sep).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "row {} col {}: {x} vs {y}",
            i / h,
            i % h
        );
    }
}

#[test]
fn selected_rows_equal_full_logits() {
    let (_d, m) = common::load("tiny-composite");
    let ids = synth::pseudo_ids(20, m.vocab_size(), 5);
    let h = m.forward(&mut m.new_state(), &ids).expect("forward");
    let last = &h[h.len() - m.hidden_size()..];
    let full = m.logits(last);
    let rows = [0u32, 17, 319, 42];
    let sel = m.logits_rows(last, &rows).expect("rows");
    for (s, r) in sel.iter().zip(rows) {
        assert!((s - full[r as usize]).abs() < 1e-4);
    }
}
