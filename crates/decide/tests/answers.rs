//! The engine against decider-ai 1.10.0's answers on CPU float32 (tests/fixtures/systemone/answers, made by
//! tools/oracle/decider_answers.py): every answer field within 2e-4 of the reference, choices equal except near-ties,
//! usage exact; on both synthetic checkpoints, with the shared prefix on and off. Also: shared prefix on, off, one
//! fork per row and all requests in one `score` call give the same probabilities within 1e-5; and the prefix-state
//! LRU: a request whose context (`"Context:\n"` + state) is kept answers bit for bit as the same request computed
//! in the same pieces, an LRU too small for any state keeps none, and either is within 1e-5 of the LRU off.
//!
//! Each checkpoint is regenerated once per test binary (`onepass_model::synth`) into a temp folder and must hash to
//! what the oracle saw. Needs testdata/qwen3_5-tokenizer (tools/setup-testdata.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{answer_checkpoint, answer_fixtures, array, f64s};
use onepass_decide::pyjson::dumps_compact;
use onepass_decide::{parse_request, Engine, EngineOptions, Plan};
use serde_json::Value as J;

/// Answer fields (rounded to 4 places by the reference) and raw probabilities.
const TOLERANCE: f64 = 2e-4;
/// Shared prefix vs whole rows, f32 on the CPU.
const SHARED_TOLERANCE: f32 = 1e-5;

struct Case {
    name: String,
    body: String,
    response: J,
    probs: Vec<Vec<f64>>,
}

fn cases(preset: &str) -> Vec<Case> {
    common::jsonl(&answer_fixtures().join(format!("{preset}.jsonl")))
        .into_iter()
        .map(|v| Case {
            name: v["name"].as_str().unwrap().into(),
            body: v["body"].as_str().unwrap().into(),
            response: serde_json::from_str(v["response"].as_str().unwrap()).unwrap(),
            probs: array(&v["probs"], f64s),
        })
        .collect()
}

fn engine(preset: &'static str, opts: EngineOptions) -> Engine {
    Engine::load(answer_checkpoint(preset), opts).expect("engine")
}

#[derive(Default, Debug)]
struct Worst {
    field: f64,
    prob: f64,
    fields: usize,
    near_ties: usize,
}

/// Top-2 gap of a reference answer's probabilities (rounded to 4 places by the reference).
fn top2_gap(answer: &J) -> f64 {
    let mut p: Vec<f64> = answer["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .collect();
    p.sort_by(|a, b| b.partial_cmp(a).unwrap());
    p[0] - p.get(1).copied().unwrap_or(0.0)
}

/// Same keys in the same order, equal strings and integers, floats within TOLERANCE.
fn compare(path: &str, got: &J, want: &J, w: &mut Worst) {
    match (got, want) {
        (J::Object(g), J::Object(r)) => {
            let gk: Vec<&String> = g.keys().collect();
            let rk: Vec<&String> = r.keys().collect();
            assert_eq!(gk, rk, "{path}: keys");
            for (k, rv) in r {
                compare(&format!("{path}.{k}"), &g[k], rv, w);
            }
        }
        (J::Number(g), J::Number(r)) if r.is_i64() && !path.contains("answers") => {
            assert_eq!(g, r, "{path}: usage must be exact");
        }
        (J::Number(g), J::Number(r)) => {
            let d = (g.as_f64().unwrap() - r.as_f64().unwrap()).abs();
            // `score` is rounded to 2 places: a 2e-4 move in probabilities may cross one rounding boundary.
            let tol = if path.ends_with(".score") {
                0.01 + 1e-9
            } else {
                TOLERANCE + 1e-12
            };
            assert!(d <= tol, "{path}: {g} vs reference {r} (|diff| {d:e})");
            if !path.ends_with(".score") {
                w.field = w.field.max(d);
            }
            w.fields += 1;
        }
        _ => {
            assert_eq!(got, want, "{path}");
            w.fields += 1;
        }
    }
}

fn check_answers(preset: &'static str, shared_prefix: bool) {
    let eng = engine(
        preset,
        EngineOptions {
            shared_prefix,
            ..EngineOptions::default()
        },
    );
    let cases = cases(preset);
    assert!(cases.len() >= 20, "{preset}: {} cases", cases.len());
    let mut w = Worst::default();
    for c in &cases {
        let got = eng
            .system_one(c.body.as_bytes())
            .unwrap_or_else(|e| panic!("{preset} {}: {e}", c.name));
        let got: J = serde_json::from_str(&dumps_compact(&got).unwrap()).unwrap();
        // Choices: equal unless the reference's top two are within the tolerance.
        for (id, ra) in c.response["answers"].as_object().unwrap() {
            let ga = &got["answers"][id];
            if ra["type"] == "choice" && ga["choice"] != ra["choice"] {
                assert!(
                    top2_gap(ra) < TOLERANCE + 1e-4,
                    "{preset} {} {id}: choice {} vs {}",
                    c.name,
                    ga["choice"],
                    ra["choice"]
                );
                w.near_ties += 1;
                let mut ga = ga.clone();
                ga["choice"] = ra["choice"].clone();
                compare(
                    &format!("{preset} {} answers.{id}", c.name),
                    &ga,
                    ra,
                    &mut w,
                );
            } else {
                compare(&format!("{preset} {} answers.{id}", c.name), ga, ra, &mut w);
            }
        }
        let (gm, rm) = (&got["model"], &c.response["model"]);
        assert_eq!(gm, rm, "{preset} {}: model", c.name);
        compare(
            &format!("{preset} {} usage", c.name),
            &got["usage"],
            &c.response["usage"],
            &mut w,
        );
        // Raw probabilities per slot.
        let plan = eng
            .plan(&parse_request(c.body.as_bytes()).unwrap())
            .unwrap();
        let probs = eng.score(&[&plan]).unwrap().pop().unwrap();
        assert_eq!(probs.len(), c.probs.len(), "{preset} {}: slots", c.name);
        for (s, (g, r)) in probs.iter().zip(&c.probs).enumerate() {
            // The reference reads all 255 labels with the tail masked to -inf: exact zeros past nopts.
            assert!(
                g.len() <= r.len() && r[g.len()..].iter().all(|&x| x == 0.0),
                "{preset} {} slot {s}: options",
                c.name
            );
            for (x, y) in g.iter().zip(r) {
                let d = (*x as f64 - y).abs();
                assert!(d <= TOLERANCE, "{preset} {} slot {s}: {x} vs {y}", c.name);
                w.prob = w.prob.max(d);
            }
        }
    }
    eprintln!(
        "{preset} shared_prefix={shared_prefix}: {} requests, {} fields, worst field |diff| {:e}, worst probability |diff| {:e}, near-tie choices {}",
        cases.len(),
        w.fields,
        w.field,
        w.prob,
        w.near_ties
    );
}

#[test]
fn text_form_shared_prefix() {
    check_answers("tiny-qwen-vocab", true);
}

#[test]
fn text_form_whole_rows() {
    check_answers("tiny-qwen-vocab", false);
}

#[test]
fn composite_form_shared_prefix() {
    check_answers("tiny-qwen-vocab-composite", true);
}

#[test]
fn composite_form_whole_rows() {
    check_answers("tiny-qwen-vocab-composite", false);
}

/// Shared prefix on/off, one fork at a time, and every request in one call (rows of different plans batched together)
/// agree within 1e-5.
#[test]
fn shared_prefix_equals_whole_rows() {
    for preset in ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"] {
        let whole = engine(
            preset,
            EngineOptions {
                shared_prefix: false,
                ..EngineOptions::default()
            },
        );
        let shared = engine(preset, EngineOptions::default());
        let one_fork = engine(
            preset,
            EngineOptions {
                fork_budget_bytes: 1,
                ..EngineOptions::default()
            },
        );
        let plans: Vec<Plan> = cases(preset)
            .iter()
            .map(|c| {
                whole
                    .plan(&parse_request(c.body.as_bytes()).unwrap())
                    .unwrap()
            })
            .collect();
        let refs: Vec<&Plan> = plans.iter().collect();
        let base: Vec<Vec<Vec<f32>>> = refs
            .iter()
            .map(|p| whole.score(&[p]).unwrap().pop().unwrap())
            .collect();
        let mut worst = 0.0f32;
        for (label, got) in [
            ("whole rows, one call", whole.score(&refs).unwrap()),
            ("shared prefix, one call", shared.score(&refs).unwrap()),
            (
                "one fork per group, one call",
                one_fork.score(&refs).unwrap(),
            ),
            (
                "shared prefix, per request",
                refs.iter()
                    .map(|p| shared.score(&[p]).unwrap().pop().unwrap())
                    .collect(),
            ),
        ] {
            assert_eq!(got.len(), base.len());
            for (pi, (g, b)) in got.iter().zip(&base).enumerate() {
                assert_eq!(g.len(), b.len(), "{preset} {label} plan {pi}");
                for (gs, bs) in g.iter().zip(b) {
                    for (x, y) in gs.iter().zip(bs) {
                        let d = (x - y).abs();
                        assert!(
                            d <= SHARED_TOLERANCE,
                            "{preset} {label} plan {pi}: {x} vs {y}"
                        );
                        worst = worst.max(d);
                    }
                }
            }
        }
        eprintln!(
            "{preset}: shared prefix vs whole rows over {} plans: worst |diff| {worst:e}",
            plans.len()
        );
    }
}

#[test]
fn engine_is_send_sync_and_reports_config() {
    fn is<T: Send + Sync>() {}
    is::<Engine>();
    let eng = engine("tiny-qwen-vocab-composite", EngineOptions::default());
    assert_eq!(eng.model_name(), "decider-2.5");
    assert!(!eng.config().isolated_levels);
    assert_eq!(eng.tokenizer().label_table().unwrap().ids.len(), 255);
    // A client error comes back as the reference's answer, before any model work.
    let e = eng
        .system_one(br#"{"state": "x", "questions": {"q": {"criteria": ["a"]}}}"#)
        .unwrap_err();
    assert_eq!(e.status, 422);
    let e = eng.system_one(b"{").unwrap_err();
    assert_eq!(e.status, 422);
    // No questions: no model work, the reference's answers (decider-contract R1.9.2, R4.5.1).
    let v = eng
        .system_one(br#"{"state": "s", "questions": {}}"#)
        .unwrap();
    assert_eq!(
        dumps_compact(&v).unwrap(),
        r#"{"model":"decider-2.5","answers":{},"usage":{"input_tokens":0,"output_tokens":0}}"#
    );
    let v = eng
        .system_one(br#"{"state": "s", "questions": {}, "independent": false}"#)
        .unwrap();
    assert!(dumps_compact(&v)
        .unwrap()
        .starts_with(r#"{"model":"decider-2.5","answers":{},"usage":{"input_tokens":"#));
    assert!(eng.score(&[]).unwrap().is_empty());
}

/// An engine whose prefix-state LRU holds `bytes` (1: too small for any state; 0: off).
fn lru_engine(preset: &'static str, bytes: usize) -> Engine {
    let opts = EngineOptions {
        prefix_cache_bytes: bytes,
        ..EngineOptions::default()
    };
    engine(preset, opts)
}

/// Every fixture request's probabilities, each request alone in its `score` call.
fn alone(e: &Engine, plans: &[Plan]) -> Vec<Vec<Vec<f32>>> {
    plans
        .iter()
        .map(|p| e.score(&[p]).unwrap().remove(0))
        .collect()
}

fn worst_diff(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    let flat =
        |x: &[Vec<Vec<f32>>]| -> Vec<f32> { x.iter().flatten().flatten().copied().collect() };
    let (a, b) = (flat(a), flat(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The prefix-state LRU on System One: every fixture request scored twice on an engine with the LRU (the second time
/// each context is a hit, nothing new missed) answers bit for bit as an engine whose LRU is too small to keep any state
/// (the same pieces: the context, then the rows; nothing kept, every lookup a miss), and within 1e-5 of the LRU off
/// (the context and the ids the rows share after it run in one piece there). All requests in one call, every context
/// kept, are within 1e-5 of each alone.
#[test]
fn kept_contexts_answer_as_computed() {
    for preset in ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"] {
        let kept = engine(preset, EngineOptions::default());
        let (tiny, off) = (lru_engine(preset, 1), lru_engine(preset, 0));
        let plans: Vec<Plan> = cases(preset)
            .iter()
            .map(|c| kept.plan(&parse_request(c.body.as_bytes()).unwrap()))
            .collect::<Result<_, _>>()
            .unwrap();
        let lookups = plans
            .iter()
            .filter(|p| p.slot_count() > 0 && p.ctx_len > 0)
            .count() as u64;
        assert!(lookups >= 10, "{preset}: {lookups} requests with a context");
        let first = alone(&kept, &plans);
        let s1 = kept.prefix_cache_stats();
        assert_eq!(
            s1.hits + s1.misses,
            lookups,
            "{preset}: one lookup per request"
        );
        assert_eq!(s1.entries as u64, s1.misses, "{preset}: every miss kept");
        let again = alone(&kept, &plans);
        let s2 = kept.prefix_cache_stats();
        assert_eq!(
            (s2.hits - s1.hits, s2.misses, s2.entries),
            (lookups, s1.misses, s1.entries),
            "{preset}: the second time, every context is a hit"
        );
        let computed = alone(&tiny, &plans);
        let t = tiny.prefix_cache_stats();
        assert_eq!(
            (t.hits, t.misses, t.entries, t.bytes),
            (0, lookups, 0, 0),
            "{preset}: an LRU too small for a state keeps none"
        );
        assert_eq!(again, computed, "{preset}: kept vs computed");
        assert_eq!(first, computed, "{preset}: first time vs computed");
        let unkept = alone(&off, &plans);
        assert_eq!(
            off.prefix_cache_stats().misses,
            0,
            "{preset}: no lookups with the LRU off"
        );
        let d_off = worst_diff(&again, &unkept);
        assert!(d_off <= SHARED_TOLERANCE, "{preset}: LRU vs off {d_off:e}");
        let refs: Vec<&Plan> = plans.iter().collect();
        let together = kept.score(&refs).unwrap();
        let d_batch = worst_diff(&together, &again);
        assert!(
            d_batch <= SHARED_TOLERANCE,
            "{preset}: one call vs alone {d_batch:e}"
        );
        eprintln!(
            "{preset}: {lookups} contexts, {} kept ({} bytes); kept == computed bit for bit; vs the LRU off: worst \
             |diff| {d_off:e}; all in one call vs alone: {d_batch:e}",
            s2.entries, s2.bytes
        );
    }
}

/// A context that extends a kept one (a string state that grew) starts from the kept state and computes the rest: it
/// answers within 1e-5 of the context computed whole, keeps its own state beside the shorter one, and answers bit
/// for bit the same when it comes again (from the state kept after the partial restore).
#[test]
fn a_grown_context_starts_from_the_kept_one() {
    let preset = "tiny-qwen-vocab";
    let kept = engine(preset, EngineOptions::default());
    let tiny = lru_engine(preset, 1);
    let body = |state: &str| {
        format!(
            r#"{{"state": "{state}", "questions": {{"a": {{"type": "noul", "instructions": "Is it damaged?"}}, "b": {{"type": "choice", "instructions": "What next?", "criteria": ["refund", "replace", "repair"]}}}}}}"#
        )
    };
    let plan = |state: &str| {
        kept.plan(&parse_request(body(state).as_bytes()).unwrap())
            .unwrap()
    };
    let short = plan("The parcel arrived damaged");
    let long = plan("The parcel arrived damaged and two days late");
    let ctx = |p: &Plan| p.rows[0].ids[..p.ctx_len].to_vec();
    assert!(
        ctx(&long).starts_with(&ctx(&short)) && long.ctx_len > short.ctx_len,
        "{:?} does not extend {:?}",
        ctx(&long),
        ctx(&short)
    );
    kept.score(&[&short]).unwrap();
    let grown = kept.score(&[&long]).unwrap();
    let s = kept.prefix_cache_stats();
    assert_eq!((s.hits, s.misses, s.entries), (1, 1, 2));
    let whole = tiny.score(&[&long]).unwrap();
    let d = worst_diff(&grown, &whole);
    assert!(d <= SHARED_TOLERANCE, "grown vs whole {d:e}");
    let again = kept.score(&[&long]).unwrap();
    assert_eq!(kept.prefix_cache_stats().hits, 2);
    assert_eq!(again, grown, "the state kept after a partial restore");
    eprintln!("{preset}: a grown context vs computed whole: worst |diff| {d:e}");
}

/// The random requests the GPU modes are held to (tests/common/random_requests.rs) are requests the engine answers:
/// on both checkpoints every body plans and scores, each slot a distribution over its options (finite, summing to 1
/// within 1e-4), and the whole pipeline answers every question it asked.
#[test]
fn random_requests_are_answered() {
    for preset in ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"] {
        let e = engine(preset, EngineOptions::default());
        let mut rows = 0;
        for (i, body) in common::random_requests::bodies(7, 40).iter().enumerate() {
            let req = parse_request(body.as_bytes())
                .unwrap_or_else(|err| panic!("{preset} body {i}: {err:?}\n{body}"));
            let plan = e
                .plan(&req)
                .unwrap_or_else(|err| panic!("{preset} body {i}: {err:?}\n{body}"));
            for slot in e.score(&[&plan]).unwrap().remove(0) {
                rows += 1;
                let sum: f32 = slot.iter().sum();
                assert!(
                    slot.iter()
                        .all(|p| p.is_finite() && (0.0..=1.0).contains(p))
                        && (sum - 1.0).abs() < 1e-4,
                    "{preset} body {i}: {slot:?}"
                );
            }
            let asked: J = serde_json::from_str(body).unwrap();
            let answer: J = serde_json::from_str(
                &dumps_compact(&e.system_one(body.as_bytes()).unwrap()).unwrap(),
            )
            .unwrap();
            for key in asked["questions"].as_object().unwrap().keys() {
                assert!(
                    answer["answers"].get(key).is_some(),
                    "{preset} body {i}: no answer for {key}: {answer}"
                );
            }
        }
        assert!(rows >= 40, "{preset}: {rows} slots");
    }
}
