//! Decisions over a fixed list of choices (`onepass_decide::choice`): the kept-prefix policy over a scripted model
//! whose logits are a pure function of the ids it has read, the gates on real synthetic checkpoints (a restored
//! prefix against the prompt computed fresh, a state stored after a partial restore, a whole decision against the
//! teacher-forced logits of the same ids), and transformers' float32 log-softmax on the same rendered ids
//! (tests/fixtures/decide, made by tools/oracle/decide_fixtures.py).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use onepass_decide::choice::{
    self, DecideModel, DecidePrompt, DecideRequest, DecideSession, ErrorKind, PrefixCacheMode,
    PrefixLru,
};
use onepass_model::{synth, Model};
use onepass_tokenizer::Tokenizer;
use serde_json::{json, Value as J};

mod common;

/// A synthetic checkpoint with the synthetic tokenizer; `template: false` removes its chat template. Written once
/// per test binary.
fn checkpoint(preset: &'static str, template: bool) -> &'static Path {
    static DIRS: OnceLock<Mutex<Vec<(String, &'static Path)>>> = OnceLock::new();
    let name = format!("{preset}-{}", if template { "chat" } else { "plain" });
    let mut dirs = DIRS.get_or_init(Default::default).lock().unwrap();
    if let Some((_, d)) = dirs.iter().find(|(n, _)| *n == name) {
        return d;
    }
    let dir: &'static Path = Box::leak(common::process_dir().join(&name).into_boxed_path());
    let spec = synth::preset(preset).unwrap();
    synth::write_checkpoint(&spec, dir, &mut |_, _| {}).unwrap();
    let vocab = spec
        .vocab_size
        .min(onepass_tokenizer::synthetic_max_vocab());
    std::fs::write(
        dir.join("tokenizer.json"),
        onepass_tokenizer::synthetic_tokenizer_json(vocab).unwrap(),
    )
    .unwrap();
    let mut cfg: J =
        serde_json::from_str(&onepass_tokenizer::synthetic_tokenizer_config_json()).unwrap();
    if !template {
        cfg.as_object_mut().unwrap().remove("chat_template");
    }
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dirs.push((name, dir));
    dir
}

struct Loaded {
    model: Model,
    tok: Tokenizer,
    prompt: DecidePrompt,
}

fn load(preset: &'static str, template: bool) -> &'static Loaded {
    static ALL: OnceLock<Mutex<Vec<(String, &'static Loaded)>>> = OnceLock::new();
    let key = format!("{preset}-{template}");
    let mut all = ALL.get_or_init(Default::default).lock().unwrap();
    if let Some((_, l)) = all.iter().find(|(k, _)| *k == key) {
        return l;
    }
    let dir = checkpoint(preset, template);
    let model = Model::load(dir).unwrap();
    let tok = Tokenizer::from_dir(dir, Some(&model.config().model_type)).unwrap();
    let prompt = DecidePrompt::for_tokenizer(&tok, Some(dir));
    assert_eq!(prompt.has_template(), template);
    let l: &'static Loaded = Box::leak(Box::new(Loaded { model, tok, prompt }));
    all.push((key, l));
    l
}

fn req(v: J) -> DecideRequest {
    DecideRequest::from_json(&v, &[]).unwrap()
}

/// The agent of the reference: a task whose history grows step by step, lettered options.
fn agent_steps() -> Vec<DecideRequest> {
    let task = "Task: turn on Wi-Fi. History: none. ";
    vec![
        req(
            json!({"id": 1, "prefix": task, "suffix": "Screen: Home. Options: A) Settings B) Camera C) Clock. Answer with the letter.", "choices": ["A", "B", "C"]}),
        ),
        req(
            json!({"id": 2, "prefix": task, "suffix": "Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter.", "choices": ["A", "B", "C"]}),
        ),
        req(
            json!({"id": 3, "prefix": format!("{task}Opened Settings; opened Network. "), "suffix": "Screen: Network. Options: A) Airplane B) Internet C) Hotspot D) VPN. Answer with the letter.", "choices": ["A", "B", "C", "D"]}),
        ),
        req(
            json!({"id": 4, "prefix": format!("{task}Opened Settings; opened Network. Opened Internet. "), "suffix": "Screen: Internet. Options: A) Wi-Fi off B) Wi-Fi on C) Back. Answer with the letter.", "choices": ["A", "B", "C"]}),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------------------------
// The policy, over a scripted model: its state is the ids read so far, its logits a pure function of them, and it
// records every prefill, so each test sees exactly which ids a decision prefilled and what it restored or kept.

#[derive(Default)]
struct Scripted {
    vocab: usize,
    max: usize,
    prefills: RefCell<Vec<Vec<u32>>>,
    copies: RefCell<usize>,
}

impl Scripted {
    fn new(vocab: usize) -> Scripted {
        Scripted {
            vocab,
            max: 4096,
            ..Default::default()
        }
    }
    fn logits_of(&self, seen: &[u32]) -> Vec<f32> {
        let mut h: u64 = 1469598103934665603;
        for &x in seen {
            h = (h ^ x as u64).wrapping_mul(1099511628211);
        }
        (0..self.vocab)
            .map(|i| ((h.wrapping_add(i as u64 * 7919) % 1000) as f32) / 100.0)
            .collect()
    }
    fn take(&self) -> Vec<Vec<u32>> {
        std::mem::take(&mut self.prefills.borrow_mut())
    }
}

impl DecideModel for Scripted {
    type State = Vec<u32>;
    type Error = String;
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn max_positions(&self) -> usize {
        self.max
    }
    fn new_state(&self) -> Result<Vec<u32>, String> {
        Ok(Vec::new())
    }
    fn copy_state(&self, st: &Vec<u32>) -> Result<Vec<u32>, String> {
        *self.copies.borrow_mut() += 1;
        Ok(st.clone())
    }
    fn state_bytes(&self, st: &Vec<u32>) -> usize {
        4 * st.len() + 1000
    }
    fn prefill(&self, st: &mut Vec<u32>, ids: &[u32]) -> Result<(), String> {
        self.prefills.borrow_mut().push(ids.to_vec());
        st.extend_from_slice(ids);
        Ok(())
    }
    fn prefill_logits(&self, st: &mut Vec<u32>, ids: &[u32]) -> Result<Vec<f32>, String> {
        self.prefill(st, ids)?;
        Ok(self.logits_of(st))
    }
}

fn split(l: &Loaded, r: &DecideRequest) -> (Vec<u32>, usize) {
    let s = l.prompt.split(&l.tok, &r.prefix, &r.suffix).unwrap();
    (s.ids, s.prefix_len)
}

#[test]
fn the_kept_state_is_restored_extended_and_replaced_on_ids() {
    let l = load("tiny-gva", true);
    let m = Scripted::new(l.model.vocab_size());
    let mut s = DecideSession::new(l.prompt.clone(), PrefixCacheMode::On);
    let steps = agent_steps();
    let (ids0, p0) = split(l, &steps[0]);
    let (ids1, p1) = split(l, &steps[1]);
    let (ids2, p2) = split(l, &steps[2]);
    assert_eq!(p0, p1, "the same prefix, another suffix");
    assert!(
        p2 > p1 && ids2[..p1] == ids1[..p1],
        "the grown prefix extends the first"
    );

    // First step: nothing kept; the prefix, then the rest, and the prefix is kept.
    let a = s.decide(&m, &l.tok, &steps[0]).unwrap();
    assert_eq!((a.n_tokens, a.n_reused), (ids0.len(), 0));
    assert_eq!(m.take(), vec![ids0[..p0].to_vec(), ids0[p0..].to_vec()]);
    assert_eq!(s.kept_ids(), Some(&ids0[..p0]));
    assert!(a.prefix_state_mib > 0.0);
    // The answer is the log-softmax of the logits after every id of the prompt.
    let want = choice::score::log_softmax_at(&m.logits_of(&ids0), &choice_firsts(l, &steps[0]));
    assert_eq!(a.choice_logp, want);

    // Same prefix: restored, only the suffix prefilled, nothing stored again.
    let a = s.decide(&m, &l.tok, &steps[1]).unwrap();
    assert_eq!(a.n_reused, p0);
    assert_eq!(m.take(), vec![ids1[p1..].to_vec()]);
    assert_eq!(a.store_ms, 0.0);

    // A grown prefix: restored, the new prefix ids, kept (the longer one), the rest.
    let a = s.decide(&m, &l.tok, &steps[2]).unwrap();
    assert_eq!(a.n_reused, p1);
    assert_eq!(m.take(), vec![ids2[p1..p2].to_vec(), ids2[p2..].to_vec()]);
    assert_eq!(s.kept_ids(), Some(&ids2[..p2]));

    // reuse_prefix: false prefills whole and leaves the kept state alone.
    let mut whole = steps[1].clone();
    whole.reuse_prefix = false;
    let a = s.decide(&m, &l.tok, &whole).unwrap();
    assert_eq!((a.n_reused, a.prefix_state_mib), (0, 0.0));
    assert_eq!(m.take(), vec![ids1.clone()]);
    assert_eq!(s.kept_ids(), Some(&ids2[..p2]));

    // A prefix that does not extend the kept one: computed fresh and kept instead (the latest prefix).
    let a = s.decide(&m, &l.tok, &steps[1]).unwrap();
    assert_eq!(a.n_reused, 0);
    assert_eq!(m.take(), vec![ids1[..p1].to_vec(), ids1[p1..].to_vec()]);
    assert_eq!(s.kept_ids(), Some(&ids1[..p1]));

    // Dropped (as a generation does): the next decision starts fresh.
    s.drop_kept();
    assert_eq!((s.kept_ids(), s.kept_bytes()), (None, 0));
    assert_eq!(s.decide(&m, &l.tok, &steps[1]).unwrap().n_reused, 0);

    // With the prefix cache off nothing is ever kept.
    let mut off = DecideSession::new(l.prompt.clone(), PrefixCacheMode::Off);
    m.take();
    for r in &steps {
        let a = off.decide(&m, &l.tok, r).unwrap();
        assert_eq!((a.n_reused, a.store_ms), (0, 0.0));
        assert_eq!(m.take(), vec![split(l, r).0]);
    }
    assert_eq!(off.kept_ids(), None);
}

fn choice_firsts(l: &Loaded, r: &DecideRequest) -> Vec<u32> {
    r.choices
        .iter()
        .map(|c| l.tok.encode(c).unwrap()[0])
        .collect()
}

#[test]
fn refusals_come_before_any_model_work_and_keep_the_state() {
    let l = load("tiny-gva", true);
    let mut m = Scripted::new(l.model.vocab_size());
    let mut s = DecideSession::new(l.prompt.clone(), PrefixCacheMode::On);
    let steps = agent_steps();
    s.decide(&m, &l.tok, &steps[0]).unwrap();
    let kept = s.kept_ids().unwrap().to_vec();
    m.take();
    let copies = *m.copies.borrow();
    let base = json!({"id": "x", "prefix": steps[0].prefix, "suffix": "Options: A, B"});
    let with = |choices: J| {
        let mut v = base.clone();
        v["choices"] = choices;
        req(v)
    };
    let cases: Vec<(DecideRequest, &str)> = vec![
        (with(json!([])), "choices is empty"),
        (with(json!(["A", ""])), "choices[1] is empty"),
        (
            with(json!(["B", "Yes", "Yak"])),
            "choices[1] \"Yes\" and choices[2] \"Yak\" both begin with token",
        ),
    ];
    for (r, want) in cases {
        let e = s.decide(&m, &l.tok, &r).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(e.message.contains(want), "{}", e.message);
        assert_eq!(e.id, json!("x"));
        assert_eq!(e.to_json()["error"]["type"], "invalid_request");
    }
    // A prompt longer than the model's positions.
    m.max = 10;
    let e = s.decide(&m, &l.tok, &steps[1]).unwrap_err();
    assert!(
        e.message.contains("longer than the 10 positions"),
        "{}",
        e.message
    );
    // An empty prompt (no template, nothing to read).
    let plain = load("tiny-gva", false);
    m.max = 4096;
    let mut ps = DecideSession::new(plain.prompt.clone(), PrefixCacheMode::On);
    let e = ps
        .decide(&m, &plain.tok, &req(json!({"choices": ["A"]})))
        .unwrap_err();
    assert!(e.message.contains("the prompt is empty"), "{}", e.message);
    // Nothing ran, nothing was copied, the kept state is the one from before.
    assert!(m.take().is_empty());
    assert_eq!(*m.copies.borrow(), copies);
    assert_eq!(s.kept_ids(), Some(&kept[..]));
    let a = s.decide(&m, &l.tok, &steps[1]).unwrap();
    assert_eq!(a.n_reused, kept.len());
}

/// The prefix ends on ids: a merge across the join (`"A" + "B"` is one id of the synthetic vocabulary) moves it back
/// before the merged id, and one agreeing id is given back.
#[test]
fn the_split_gives_one_id_back_before_a_merge_at_the_join() {
    let l = load("tiny-gva", false);
    let s = l.prompt.split(&l.tok, "Pick: A", "B or C").unwrap();
    let whole = l.tok.encode("Pick: AB or C").unwrap();
    assert_eq!(s.ids, whole);
    assert_eq!(
        l.tok.encode("AB").unwrap().len(),
        1,
        "the synthetic vocabulary merges uppercase pairs"
    );
    let alone = l.tok.encode("Pick: A").unwrap();
    // "Pick: " agrees (6 ids), then "AB" differs from "A": one of the 6 is given back.
    assert_eq!(alone.len(), 7);
    assert_eq!(s.prefix_len, 5);
    let t = load("tiny-gva", true);
    let s = t.prompt.split(&t.tok, "Pick: A", "B or C").unwrap();
    let head = t.tok.encode("<|im_start|>user\n").unwrap();
    assert_eq!(s.prefix_len, head.len() + 5);
    assert_eq!(
        t.tok.decode(&s.ids).unwrap(),
        "<|im_start|>user\nPick: AB or C<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Gates on real synthetic checkpoints.

fn logp_of_whole(l: &Loaded, ids: &[u32], firsts: &[u32]) -> Vec<f64> {
    let mut st = l.model.new_state();
    let h = l.model.forward(&mut st, ids).unwrap();
    let d = l.model.hidden_size();
    choice::score::log_softmax_at(&l.model.logits(&h[h.len() - d..]), firsts)
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A whole decision (reuse off) is the log-softmax of the teacher-forced logits of the same ids, bit for bit; a
/// restored prefix scores bit for bit what the same prompt scores when prefilled in the same pieces from a fresh
/// state, and within 1e-4 of the prompt prefilled whole.
#[test]
fn restored_prefixes_score_what_the_prompt_scores_fresh() {
    for (preset, template) in [
        ("tiny-gva", true),
        ("tiny-attn-first", false),
        ("tiny-qwen-vocab", true),
    ] {
        let l = load(preset, template);
        let mut s = DecideSession::new(l.prompt.clone(), PrefixCacheMode::On);
        let mut off = DecideSession::new(l.prompt.clone(), PrefixCacheMode::Off);
        let mut worst: f64 = 0.0;
        // Where the pieces that built the kept state end (a kept state remembers how it was prefilled).
        let mut kept_ends: Vec<usize> = Vec::new();
        for r in agent_steps() {
            let (ids, p) = split(l, &r);
            let firsts = choice_firsts(l, &r);
            let a = s.decide(&l.model, &l.tok, &r).unwrap();
            let fresh = off.decide(&l.model, &l.tok, &r).unwrap();
            // Whole: the teacher-forced logits of the same ids, bit for bit.
            assert_eq!(
                fresh.choice_logp,
                logp_of_whole(l, &ids, &firsts),
                "{preset}"
            );
            assert_eq!(fresh.n_reused, 0);
            // Kept: restored from the last step's prefix (every step's prefix extends the one before).
            assert_eq!(
                a.n_reused,
                kept_ends.last().copied().unwrap_or(0),
                "{preset} step {}",
                r.id
            );
            if kept_ends.last() != Some(&p) {
                kept_ends.push(p);
            }
            // The same pieces from a fresh state, bit for bit.
            let mut st = l.model.new_state();
            let mut h = Vec::new();
            let mut start = 0;
            for &end in kept_ends.iter().chain([ids.len()].iter()) {
                h = l.model.forward(&mut st, &ids[start..end]).unwrap();
                start = end;
            }
            let d = l.model.hidden_size();
            let same_pieces =
                choice::score::log_softmax_at(&l.model.logits(&h[h.len() - d..]), &firsts);
            assert_eq!(a.choice_logp, same_pieces, "{preset} step {}", r.id);
            worst = worst.max(max_diff(&a.choice_logp, &fresh.choice_logp));
            assert_eq!(a.best, fresh.best, "{preset} step {}", r.id);
        }
        eprintln!("{preset}: kept-state decisions vs whole prompts, max |Δ logp| = {worst:.2e}");
        assert!(worst <= 1e-4, "{preset}: {worst}");
    }
}

/// A state kept after a partial restore (restored, extended, kept) answers as it did when it was computed.
#[test]
fn a_state_kept_after_a_partial_restore_answers_as_when_computed() {
    let l = load("tiny-gva", true);
    let mut s = DecideSession::new(l.prompt.clone(), PrefixCacheMode::On);
    let steps = agent_steps();
    s.decide(&l.model, &l.tok, &steps[0]).unwrap();
    let computed = s.decide(&l.model, &l.tok, &steps[2]).unwrap();
    assert!(computed.n_reused > 0 && computed.store_ms >= 0.0);
    let again = s.decide(&l.model, &l.tok, &steps[2]).unwrap();
    assert_eq!(again.n_reused, split(l, &steps[2]).1);
    assert_eq!(again.choice_logp, computed.choice_logp);
    assert_eq!(again.best, computed.best);
}

/// The server's LRU stands in for the kept state: the same answers, bit for bit, and the longest kept prefix wins.
#[test]
fn the_lru_answers_as_the_kept_state() {
    let l = load("tiny-gva", true);
    let mut s = DecideSession::new(l.prompt.clone(), PrefixCacheMode::On);
    let mut lru = PrefixLru::new(64 << 20);
    for r in agent_steps() {
        let a = s.decide(&l.model, &l.tok, &r).unwrap();
        let b = choice::decide(&l.model, &l.tok, &l.prompt, Some(&mut lru), &r).unwrap();
        assert_eq!((a.n_reused, &a.choice_logp), (b.n_reused, &b.choice_logp));
    }
    assert_eq!(lru.len(), 3, "one state per distinct prefix");
    assert_eq!((lru.hits, lru.misses), (3, 1));
    // Step 2's prefix again: served by its own state, not step 4's longer one.
    let r = &agent_steps()[1];
    let b = choice::decide(&l.model, &l.tok, &l.prompt, Some(&mut lru), r).unwrap();
    assert_eq!(b.n_reused, split(l, r).1);
}

// ---------------------------------------------------------------------------------------------------------------
// transformers' float32 log-softmax on the same rendered ids.

fn fixtures() -> PathBuf {
    common::root().join("tests/fixtures/decide")
}

#[test]
fn decisions_match_transformers() {
    let lines = common::jsonl(&fixtures().join("decide.jsonl"));
    assert!(lines.len() >= 20);
    let mut worst: f64 = 0.0;
    let mut sessions: Vec<(String, DecideSession<onepass_model::SequenceState>)> = Vec::new();
    for line in &lines {
        let preset: &'static str = Box::leak(
            line["checkpoint"]
                .as_str()
                .unwrap()
                .to_string()
                .into_boxed_str(),
        );
        let template = line["layout"] == "chat";
        let l = load(preset, template);
        let r = DecideRequest::from_json(&line["request"], &[]).unwrap();
        let name = format!("{preset} {}", r.id);
        let sp = l.prompt.split(&l.tok, &r.prefix, &r.suffix).unwrap();
        assert_eq!(
            l.prompt
                .render(&format!("{}{}", r.prefix, r.suffix))
                .unwrap(),
            line["text"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(sp.ids, common::u32s(&line["ids"]), "{name}: ids");
        assert_eq!(
            sp.prefix_len as u64,
            line["prefix_len"].as_u64().unwrap(),
            "{name}: prefix"
        );
        assert_eq!(
            choice_firsts(l, &r),
            common::u32s(&line["choice_ids"]),
            "{name}: choice ids"
        );
        let want = common::f64s(&line["choice_logp"]);
        let key = format!("{preset}-{template}");
        if !sessions.iter().any(|(k, _)| *k == key) {
            sessions.push((
                key.clone(),
                DecideSession::new(l.prompt.clone(), PrefixCacheMode::On),
            ));
        }
        let s = &mut sessions.iter_mut().find(|(k, _)| *k == key).unwrap().1;
        let mut whole = r.clone();
        whole.reuse_prefix = false;
        for a in [
            s.decide(&l.model, &l.tok, &r).unwrap(),
            s.decide(&l.model, &l.tok, &whole).unwrap(),
        ] {
            let d = max_diff(&a.choice_logp, &want);
            assert!(d <= 1e-4, "{name}: {:?} vs {want:?}", a.choice_logp);
            assert_eq!(
                a.best as u64,
                line["best"].as_u64().unwrap(),
                "{name}: best"
            );
            worst = worst.max(d);
        }
    }
    eprintln!(
        "decide vs transformers float32: max |Δ logp| = {worst:.2e} over {} requests",
        lines.len()
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Sessions: decisions next to generation, on a checkpoint with the real Qwen3.5 tokenizer and the Qwen3-style
// template (an engine needs the 255-label table, so the tiny synthetic vocabulary will not do).

fn session_engine() -> &'static onepass_decide::Engine {
    static E: OnceLock<onepass_decide::Engine> = OnceLock::new();
    E.get_or_init(|| {
        let dir = common::process_dir().join("session-tiny-qwen-vocab");
        std::fs::create_dir_all(&dir).unwrap();
        let spec = synth::preset("tiny-qwen-vocab").unwrap();
        synth::write_checkpoint(&spec, &dir, &mut |_, _| {}).unwrap();
        common::copy_tokenizer(&dir);
        std::fs::write(
            dir.join("chat_template.jinja"),
            onepass_tokenizer::QWEN3_CHAT_TEMPLATE,
        )
        .unwrap();
        onepass_decide::Engine::load(&dir, onepass_decide::EngineOptions::default()).unwrap()
    })
}

fn greedy() -> onepass_decide::generate::GenerateRequest {
    onepass_decide::generate::parse_generate(&json!({
        "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12, "temperature": 0
    }))
    .unwrap()
}

fn generate(
    s: &mut onepass_decide::Session<'_, onepass_model::Model>,
) -> onepass_decide::Generation {
    s.generate(&greedy(), &mut |_| true).unwrap()
}

/// Session options with decide lines on and the prefix cache in `mode`.
fn deciding(prefix_cache: PrefixCacheMode) -> onepass_decide::SessionOptions {
    onepass_decide::SessionOptions {
        decide: true,
        prefix_cache,
    }
}

/// A generation after a decision, and after a refused one, equals a generation in a session that never saw them; it
/// drops the kept state, and the next decision starts fresh and answers as before.
#[test]
fn a_generation_after_decisions_equals_one_that_never_saw_them() {
    let e = session_engine();
    let opts = deciding(PrefixCacheMode::On);
    let fresh = generate(&mut e.session(opts));
    let mut s = e.session(opts);
    let steps = agent_steps();
    let first = s.decide(&steps[0]).unwrap();
    let second = s.decide(&steps[1]).unwrap();
    assert!(second.n_reused > 0 && s.kept_prefix().is_some());
    let mut bad = steps[1].clone();
    bad.choices = vec!["A".into(), "A".into()];
    assert_eq!(s.decide(&bad).unwrap_err().kind, ErrorKind::InvalidRequest);
    let after = generate(&mut s);
    assert_eq!((&after.tokens, &after.text), (&fresh.tokens, &fresh.text));
    assert!(after.tokens.len() > 1);
    assert_eq!(s.kept_prefix(), None, "a generation drops the kept state");
    let again = s.decide(&steps[0]).unwrap();
    assert_eq!(
        (again.n_reused, &again.choice_logp),
        (0, &first.choice_logp)
    );
}

/// Without decisions on, a decide line is refused with a message, nothing is kept, and the session goes on.
#[test]
fn a_session_without_decide_refuses_harmlessly() {
    let e = session_engine();
    let fresh = generate(&mut e.session(Default::default()));
    let mut s = e.session(onepass_decide::SessionOptions::default());
    let mut lines = Vec::new();
    let line =
        json!({"cmd": "decide", "id": 9, "prefix": "p", "suffix": "s", "choices": ["A", "B"]});
    s.handle_line(&line.to_string(), &mut |v| lines.push(v.clone()));
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["id"], 9);
    assert_eq!(lines[0]["error"]["type"], "unsupported");
    assert!(lines[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--decide"));
    assert_eq!(s.kept_prefix(), None);
    let after = generate(&mut s);
    assert_eq!(after.tokens, fresh.tokens);
}

/// The session's decide line is the library call's answer, one JSON line, `"cmd"` accepted; a malformed one is an
/// error line naming the field; the engine's LRU (the server's `/v1/decide`) answers as the session does.
#[test]
fn decide_lines_and_the_engine_lru_answer_as_the_library() {
    let e = session_engine();
    let opts = deciding(PrefixCacheMode::Auto);
    let mut lib = e.session(opts);
    let mut lines = e.session(opts);
    let before = e.prefix_cache_stats();
    for r in agent_steps() {
        let a = lib.decide(&r).unwrap();
        let mut line = json!({"cmd": "decide", "id": r.id, "prefix": r.prefix, "suffix": r.suffix, "choices": r.choices});
        let mut out = Vec::new();
        lines.handle_line(&line.to_string(), &mut |v| out.push(v.clone()));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["choice_logp"], json!(a.choice_logp));
        assert_eq!(out[0]["n_reused"], json!(a.n_reused));
        assert_eq!(
            (out[0]["id"].clone(), out[0]["best"].clone()),
            (r.id.clone(), json!(a.best))
        );
        let b = e.choose(&r).unwrap();
        assert_eq!((b.n_reused, &b.choice_logp), (a.n_reused, &a.choice_logp));
        line["choicez"] = json!(1);
        out.clear();
        lines.handle_line(&line.to_string(), &mut |v| out.push(v.clone()));
        assert!(out[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"choicez\""));
    }
    let after = e.prefix_cache_stats();
    assert_eq!(
        (after.hits - before.hits, after.misses - before.misses),
        (3, 1)
    );
    assert!(after.bytes > 0 && after.entries == 3);
}
