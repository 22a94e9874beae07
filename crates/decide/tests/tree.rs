//! The one-pass route of `Engine::score` ([`Backend::forward_tree`]) against the plain CPU engine, which never takes
//! it. `TreeCpu` wraps the CPU [`Model`] and runs a tree the long way (the roots batched, each child on a clone of its
//! root's state taken after the roots ran, the children batched, the hidden rows concatenated), counting its calls
//! and the engine's own `forward_batch` calls (the two-pass route).
//!
//! - via the tree, every probability is within 1e-5 of the plain engine's, one tree per `score` call that fits one
//!   pass, on the answer fixtures' bodies (one and several plans per call, with and without a shared prefix, a row
//!   without slots, 2..40 options) and on hand-built plans;
//! - a call over [`MAX_BATCH_TOKENS`] or over `fork_budget_bytes` (one byte past the engine's estimate) runs one tree
//!   per greedy group of plans (`tree_groups` works the count out from the plans' sizes), no two-pass forward; at the
//!   limits it is one tree;
//! - a plan that does not fit one pass alone (over the token cap, or over the fork budget) takes the two-pass route
//!   while the plans around it take trees; every answer lands in its own slot;
//! - a backend that declines the tree (`Ok(None)`) is asked once per group and answers exactly as the plain engine;
//!   a declined group leaves the groups after it on the tree;
//! - the slot check still fails a bad plan on the tree route.
//!
//! Checkpoints come from `onepass_model::synth`, written once per test binary into a temp folder with the
//! decider_config.json of tests/fixtures/systemone/answers. Needs testdata/qwen3_5-tokenizer (tools/setup-testdata.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{answer_checkpoint, answer_fixtures};
use onepass_decide::engine::{Backend, MAX_BATCH_TOKENS};
use onepass_decide::render::QType;
use onepass_decide::rows::common_prefix_len;
use onepass_decide::{parse_request, Engine, EngineOptions, Plan, Row};
use onepass_model::{Model, ModelError, SequenceState};

/// Tree route vs plain engine, per probability: the same rows in other `forward_batch` compositions, f32 on the CPU
/// (a route may cut a row into other pieces: f32 reduction order), as `SHARED_TOLERANCE` in tests/answers.rs.
/// Seen: 1.1e-6 (before the float matmul was made batch-invariant, the plain engine itself moved up to 2.0e-6
/// between five plans per call and one per call; now it moves nothing: tests/batch_invariance.rs). Where both
/// engines take the same route the answers must be equal.
const TOLERANCE: f32 = 1e-5;

/// Both presets of the answer fixtures: text and composite layouts, tied and untied heads.
const PRESETS: [&str; 2] = ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"];

/// The CPU model with a `forward_tree` that really runs the tree, or declines it when `decline` is set, on its first
/// call when `decline_first` is, or (as the GPU does) when a root with children has fewer than `min_root` ids (which
/// it reports as `min_tree_root`, so the engine never builds one).
struct TreeCpu {
    model: Model,
    /// `forward_tree` calls.
    asked: AtomicUsize,
    /// `forward_tree` calls that ran the tree.
    ran: AtomicUsize,
    /// Children of the trees run.
    kids: AtomicUsize,
    /// `forward_batch` calls from the engine (the two-pass route; a tree runs the model's own).
    batches: AtomicUsize,
    decline: AtomicBool,
    decline_first: AtomicBool,
    min_root: AtomicUsize,
    /// What `tree_child_bytes` reports (`usize::MAX`: `None`, the default). The stand-in's children are whole forks;
    /// the engine budgets by what the backend says, and the GPU's children hold no recurrent state.
    child_bytes: AtomicUsize,
}

impl TreeCpu {
    /// (asked, ran) so far.
    fn counts(&self) -> (usize, usize) {
        (
            self.asked.load(Ordering::SeqCst),
            self.ran.load(Ordering::SeqCst),
        )
    }

    /// `forward_batch` calls from the engine so far.
    fn batches(&self) -> usize {
        self.batches.load(Ordering::SeqCst)
    }
}

impl Backend for TreeCpu {
    type State = SequenceState;
    /// hidden: [ΣT, H] f32
    type Hidden = Vec<f32>;
    type Error = ModelError;
    fn device(&self) -> String {
        "cpu (tree test)".into()
    }
    fn vocab_size(&self) -> usize {
        Backend::vocab_size(&self.model)
    }
    fn state_bytes_per_token(&self) -> usize {
        Backend::state_bytes_per_token(&self.model)
    }
    fn new_state(&self) -> Result<SequenceState, ModelError> {
        Backend::new_state(&self.model)
    }
    fn state_bytes(&self, st: &SequenceState) -> usize {
        Backend::state_bytes(&self.model, st)
    }
    fn fork(&self, st: &SequenceState) -> Result<SequenceState, ModelError> {
        Backend::fork(&self.model, st)
    }
    fn position(&self, st: &SequenceState) -> usize {
        Backend::position(&self.model, st)
    }
    fn logits(&self, h: &Vec<f32>, rows: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
        Backend::logits(&self.model, h, rows)
    }
    fn forward_batch(
        &self,
        items: &mut [(&mut SequenceState, &[u32])],
    ) -> Result<Vec<f32>, ModelError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        Backend::forward_batch(&self.model, items)
    }
    fn runs_trees(&self) -> bool {
        true
    }
    fn min_tree_root(&self) -> usize {
        self.min_root.load(Ordering::SeqCst).max(1)
    }
    fn tree_child_bytes(&self) -> Option<usize> {
        Some(self.child_bytes.load(Ordering::SeqCst)).filter(|&b| b != usize::MAX)
    }
    fn forward_tree(
        &self,
        roots: &mut [(&mut SequenceState, &[u32])],
        children: &[(usize, &[u32])],
    ) -> Result<Option<Vec<f32>>, ModelError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let min_root = self.min_root.load(Ordering::SeqCst);
        if self.decline.load(Ordering::SeqCst)
            || self.decline_first.swap(false, Ordering::SeqCst)
            || children
                .iter()
                .any(|&(r, _)| roots.get(r).is_some_and(|(_, ids)| ids.len() < min_root))
        {
            return Ok(None);
        }
        // hidden: [Σ root T + Σ child T, H]
        let mut hidden = Backend::forward_batch(&self.model, roots)?;
        let mut states: Vec<SequenceState> = children
            .iter()
            .map(|&(r, _)| {
                let (st, _) = roots.get(r).ok_or_else(|| {
                    ModelError::Input(format!("child of root {r} of {}", roots.len()))
                })?;
                Backend::fork(&self.model, st)
            })
            .collect::<Result<_, _>>()?;
        if !children.is_empty() {
            let mut items: Vec<(&mut SequenceState, &[u32])> = states
                .iter_mut()
                .zip(children)
                .map(|(st, &(_, ids))| (st, ids))
                .collect();
            hidden.extend(Backend::forward_batch(&self.model, &mut items)?);
        }
        self.ran.fetch_add(1, Ordering::SeqCst);
        self.kids.fetch_add(children.len(), Ordering::SeqCst);
        Ok(Some(hidden))
    }
    fn label_logits(
        &self,
        h: &Vec<f32>,
        picks: &[(usize, &[u32])],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        Backend::label_logits(&self.model, h, picks)
    }
}

/// Without the prefix-state LRU: the routes the tests count are those of contexts seen for the first time (a kept
/// context takes the two-pass route, `kept_context_takes_the_two_pass_route`).
fn no_lru(opts: EngineOptions) -> EngineOptions {
    EngineOptions {
        prefix_cache_bytes: 0,
        ..opts
    }
}

fn plain(preset: &'static str, opts: EngineOptions) -> Engine {
    Engine::load(answer_checkpoint(preset), no_lru(opts)).expect("engine")
}

fn tree(preset: &'static str, opts: EngineOptions, decline: bool) -> Engine<TreeCpu> {
    tree_with_lru(preset, no_lru(opts), decline)
}

fn tree_with_lru(preset: &'static str, opts: EngineOptions, decline: bool) -> Engine<TreeCpu> {
    let dir = answer_checkpoint(preset);
    let model = Model::load(dir).expect("model");
    let model_type = model.config().model_type.clone();
    let backend = TreeCpu {
        model,
        asked: AtomicUsize::new(0),
        ran: AtomicUsize::new(0),
        kids: AtomicUsize::new(0),
        batches: AtomicUsize::new(0),
        decline: AtomicBool::new(decline),
        decline_first: AtomicBool::new(false),
        min_root: AtomicUsize::new(0),
        child_bytes: AtomicUsize::new(usize::MAX),
    };
    Engine::from_dir_with(dir, &model_type, backend, opts).expect("engine")
}

/// The plain engine and the tree engine on one checkpoint, default options.
fn engines(preset: &'static str) -> (Engine, Engine<TreeCpu>) {
    (
        plain(preset, EngineOptions::default()),
        tree(preset, EngineOptions::default(), false),
    )
}

/// The answer fixtures' bodies, a packed body of three questions (one row, 2, 4 and 3 options) and a packed body
/// without questions (one row, no slots), planned.
fn fixture_plans(eng: &Engine, preset: &str) -> Vec<Plan> {
    let mut bodies: Vec<String> = common::jsonl(&answer_fixtures().join(format!("{preset}.jsonl")))
        .iter()
        .map(|v| v["body"].as_str().unwrap().to_string())
        .collect();
    bodies.push(
        r#"{"state": "A parcel arrived damaged.", "independent": false, "questions": {"a": {"type": "bool", "instructions": "Is it damaged?"}, "b": {"type": "choice", "instructions": "What next?", "criteria": ["refund", "replace", "repair", "ignore"]}, "c": {"type": "choice", "instructions": "Who pays?", "criteria": ["shop", "courier", "client"]}}}"#
            .into(),
    );
    bodies.push(r#"{"state": "s", "questions": {}, "independent": false}"#.into());
    bodies
        .iter()
        .map(|b| {
            eng.plan(&parse_request(b.as_bytes()).unwrap())
                .unwrap_or_else(|e| panic!("{b}: {e:?}"))
        })
        .collect()
}

/// Rows of `p` that are read (have slots), and the shared prefix `score` gives `p` under default options.
fn read_rows(p: &Plan) -> (Vec<&Row>, usize) {
    let lcp = if p.rows.len() >= 2 {
        let rows: Vec<&[u32]> = p.rows.iter().map(|r| r.ids.as_slice()).collect();
        common_prefix_len(&rows)
    } else {
        0
    };
    (p.rows.iter().filter(|r| !r.slots.is_empty()).collect(), lcp)
}

/// Tokens of the one pass over `plans`: every shared prefix once, then every read row's remaining ids.
fn one_pass_tokens(plans: &[&Plan]) -> usize {
    plans
        .iter()
        .map(|p| {
            let (rows, lcp) = read_rows(p);
            lcp + rows.iter().map(|r| r.ids.len() - lcp).sum::<usize>()
        })
        .sum()
}

/// The fork budget the engine estimates for one pass over `plans`: a plan with a shared prefix, its root (a fresh
/// state and the prefix's KV) and per read row a child (the backend's `tree_child_bytes`, else a fresh state, and the
/// suffix's KV); a plan without one, per read row a fresh state and the row's KV.
fn one_pass_bytes<B: Backend>(eng: &Engine<B>, plans: &[&Plan]) -> usize {
    let m = eng.model();
    let fresh = m.state_bytes(&m.new_state().map_err(|e| e.to_string()).unwrap());
    let per_token = m.state_bytes_per_token();
    let child = m.tree_child_bytes().unwrap_or(fresh);
    plans
        .iter()
        .map(|p| {
            let (rows, lcp) = read_rows(p);
            let kids = |base: usize| {
                rows.iter()
                    .map(|r| base + (r.ids.len() - lcp) * per_token)
                    .sum::<usize>()
            };
            if lcp > 0 {
                fresh + lcp * per_token + kids(child)
            } else {
                kids(fresh)
            }
        })
        .sum()
}

/// How many trees `score` runs over `plans` under fork budget `budget`, worked out from the plans' sizes: in order, a
/// plan without read rows skipped and one that does not fit a pass alone left to the two-pass route, a group takes
/// plans while it still fits one pass (at most [`MAX_BATCH_TOKENS`], and within `budget` unless it is one row).
fn tree_groups<B: Backend>(eng: &Engine<B>, plans: &[&Plan], budget: usize) -> usize {
    // (tokens, bytes, read rows)
    let fits = |(tokens, bytes, rows): (usize, usize, usize)| {
        tokens <= MAX_BATCH_TOKENS && (rows <= 1 || bytes <= budget)
    };
    let (mut groups, mut open) = (0, None);
    for p in plans {
        let rows = read_rows(p).0.len();
        let size = (one_pass_tokens(&[p]), one_pass_bytes(eng, &[p]), rows);
        if rows == 0 || !fits(size) {
            continue;
        }
        open = match open.map(|(t, b, r)| (t + size.0, b + size.1, r + size.2)) {
            Some(grown) if fits(grown) => Some(grown),
            _ => {
                groups += 1;
                Some(size)
            }
        };
    }
    groups
}

/// `got` and `want` have the same shape and every probability within `tol`. → the worst |diff|.
fn compare(label: &str, got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{label}: plans");
    let mut worst = 0.0f32;
    for (pi, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{label} plan {pi}: slots");
        for (s, (gs, ws)) in g.iter().zip(w).enumerate() {
            assert_eq!(gs.len(), ws.len(), "{label} plan {pi} slot {s}: options");
            for (x, y) in gs.iter().zip(ws) {
                let d = (x - y).abs();
                assert!(d <= tol, "{label} plan {pi} slot {s}: {x} vs {y}");
                worst = worst.max(d);
            }
        }
    }
    worst
}

/// Score `plans` on both engines; the tree engine must ask for `asked` trees and run `ran` of them in this call.
fn check_call(
    label: &str,
    tree: &Engine<TreeCpu>,
    plain: &Engine,
    plans: &[&Plan],
    (asked, ran): (usize, usize),
    tol: f32,
) -> f32 {
    let before = tree.model().counts();
    let got = tree.score(plans).unwrap_or_else(|e| panic!("{label}: {e}"));
    let after = tree.model().counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (asked, ran),
        "{label}: (trees asked, trees run)"
    );
    let want = plain
        .score(plans)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    compare(label, &got, &want, tol)
}

/// `n` ids in the vocabulary, from a seed.
fn ids(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 150_000) as u32
        })
        .collect()
}

/// A row of `ids` read at `slots`, with 2, 7, 40, ... options in turn.
fn row(ids: Vec<u32>, slots: &[usize]) -> Row {
    let n = slots.len();
    Row {
        ids,
        slots: slots.to_vec(),
        nopts: [2, 7, 40, 3].iter().cycle().take(n).copied().collect(),
        types: vec![QType::Choice; n],
        temperatures: [1.0, 0.7, 1.6].iter().cycle().take(n).copied().collect(),
    }
}

fn plan_of(rows: Vec<Row>) -> Plan {
    Plan {
        rqs: Vec::new(),
        index: Vec::new(),
        rows,
        ctx_len: 0,
        input_tokens: 0,
    }
}

/// `k` rows sharing the first `prefix` ids, then `suffix` ids of their own (the first differs per row), each read at
/// its last id and in the middle of its suffix.
fn shared_plan(seed: u64, k: usize, prefix: usize, suffix: usize) -> Plan {
    let head = ids(seed, prefix);
    plan_of(
        (0..k)
            .map(|r| {
                let mut tail = ids(seed + 1 + r as u64, suffix);
                tail[0] = 200_000 + r as u32;
                let n = prefix + suffix;
                row([head.clone(), tail].concat(), &[prefix + suffix / 2, n - 1])
            })
            .collect(),
    )
}

/// Rows of `lens` ids that share no prefix (their first ids differ), each read at its first and last id: a plan that
/// runs every row whole. (The synthetic checkpoints take rows of at most 4096 ids.)
fn unshared_plan(seed: u64, lens: &[usize]) -> Plan {
    plan_of(
        lens.iter()
            .enumerate()
            .map(|(r, &n)| {
                let mut ids = ids(seed + r as u64, n);
                ids[0] = 200_000 + r as u32;
                row(ids, &[0, n - 1])
            })
            .collect(),
    )
}

/// Every fixture body alone and in calls of several plans, through the tree: within [`TOLERANCE`] of the plain engine, one
/// tree per call.
#[test]
fn tree_equals_plain_engine() {
    for preset in PRESETS {
        let (base, eng) = engines(preset);
        let plans = fixture_plans(&base, preset);
        // The bodies cover what the route must handle.
        assert!(plans.iter().any(|p| read_rows(p).1 > 0), "a shared prefix");
        assert!(
            plans
                .iter()
                .any(|p| p.rows.len() == 1 && p.slot_count() >= 3),
            "a single row of several slots (no shared prefix)"
        );
        let empty = plans.iter().position(|p| p.slot_count() == 0).unwrap();
        let mut nopts: Vec<usize> = plans
            .iter()
            .flat_map(|p| p.rows.iter().flat_map(|r| r.nopts.iter().copied()))
            .collect();
        nopts.sort_unstable();
        nopts.dedup();
        assert!(nopts.len() >= 5, "option counts {nopts:?}");

        let mut worst = 0.0f32;
        let mut calls = 0;
        for (i, p) in plans.iter().enumerate() {
            let n = usize::from(p.slot_count() > 0); // no slots: no forward at all
            let label = format!("{preset} plan {i} alone");
            worst = worst.max(check_call(&label, &eng, &base, &[p], (n, n), TOLERANCE));
            calls += n;
        }
        // Several plans per call, the plan without slots in each, within one pass.
        let refs: Vec<&Plan> = plans.iter().collect();
        for (c, chunk) in refs.chunks(5).enumerate() {
            let mut call: Vec<&Plan> = chunk.to_vec();
            call.insert(call.len() / 2, refs[empty]);
            assert!(one_pass_tokens(&call) <= MAX_BATCH_TOKENS);
            let label = format!("{preset} call {c} of {} plans", call.len());
            worst = worst.max(check_call(&label, &eng, &base, &call, (1, 1), TOLERANCE));
            calls += 1;
        }
        eprintln!(
            "{preset}: {calls} score calls through the tree, worst |diff| vs plain {worst:e}"
        );
    }
}

/// Hand-built plans at the token limit: exactly [`MAX_BATCH_TOKENS`] in the pass is one tree, one more is two (a plan
/// each), neither with a two-pass forward; a plan of three rows one token over alone takes the two-pass route and asks
/// for no tree (the plain engine's answers exactly).
#[test]
fn token_limit() {
    let preset = PRESETS[0];
    let (base, eng) = engines(preset);
    let budget = EngineOptions::default().fork_budget_bytes;
    // 2000 shared + 4 × 1000 own + a single row: 6000 + the single row.
    let shared = shared_plan(1, 4, 2000, 1000);
    let rest = MAX_BATCH_TOKENS - 6000;
    let at = plan_of(vec![row(ids(9, rest), &[0, rest / 3, rest - 1])]);
    let over = plan_of(vec![row(ids(9, rest + 1), &[0, rest / 3, rest])]);
    let third = MAX_BATCH_TOKENS / 3;
    let alone = unshared_plan(10, &[third, third, MAX_BATCH_TOKENS + 1 - 2 * third]);
    assert_eq!(one_pass_tokens(&[&alone]), MAX_BATCH_TOKENS + 1);
    assert_eq!(one_pass_tokens(&[&shared, &at]), MAX_BATCH_TOKENS);
    assert_eq!(one_pass_tokens(&[&shared, &over]), MAX_BATCH_TOKENS + 1);
    assert_eq!(tree_groups(&eng, &[&shared, &at], budget), 1);
    assert_eq!(tree_groups(&eng, &[&shared, &over], budget), 2);
    assert_eq!(tree_groups(&eng, &[&alone], budget), 0);
    let batches = eng.model().batches();
    let w = check_call(
        "at the limit",
        &eng,
        &base,
        &[&shared, &at],
        (1, 1),
        TOLERANCE,
    );
    let w = w.max(check_call(
        "one token over",
        &eng,
        &base,
        &[&shared, &over],
        (2, 2),
        TOLERANCE,
    ));
    assert_eq!(eng.model().batches(), batches, "no two-pass forward");
    check_call(
        "one plan over the limit",
        &eng,
        &base,
        &[&alone],
        (0, 0),
        0.0,
    );
    assert!(eng.model().batches() > batches, "the two-pass route");
    eprintln!("{preset}: {MAX_BATCH_TOKENS} tokens in one tree, worst |diff| vs plain {w:e}");
}

/// `plans` repeated, in order, until the one pass over them holds more than `tokens`.
fn past(plans: &[Plan], tokens: usize) -> Vec<&Plan> {
    let mut call: Vec<&Plan> = Vec::new();
    for p in plans.iter().cycle() {
        call.push(p);
        if one_pass_tokens(&call) > tokens {
            break;
        }
    }
    call
}

/// Every fixture plan in one call, repeated past twice [`MAX_BATCH_TOKENS`]: one tree per greedy group, no two-pass
/// forward, every answer within [`TOLERANCE`] of the plain engine's.
#[test]
fn over_token_limit_runs_groups() {
    for preset in PRESETS {
        let (base, eng) = engines(preset);
        let plans = fixture_plans(&base, preset);
        let call = past(&plans, 2 * MAX_BATCH_TOKENS);
        let groups = tree_groups(&eng, &call, EngineOptions::default().fork_budget_bytes);
        assert!(groups >= 3, "{groups} groups");
        let batches = eng.model().batches();
        let w = check_call(
            &format!("{preset}: {} plans over the token limit", call.len()),
            &eng,
            &base,
            &call,
            (groups, groups),
            TOLERANCE,
        );
        assert_eq!(eng.model().batches(), batches, "no two-pass forward");
        eprintln!(
            "{preset}: {} plans, {} tokens in {groups} trees, worst |diff| vs plain {w:e}",
            call.len(),
            one_pass_tokens(&call)
        );
    }
}

/// Plans that do not fit one pass alone (rows without a shared prefix over [`MAX_BATCH_TOKENS`] together, a shared
/// prefix and its suffixes over it) between plans that do: one tree per greedy group of the fitting ones, the two-pass
/// route for the others, every answer in its own slots within [`TOLERANCE`] of the plain engine's. The unfit plans
/// alone: no tree asked, the plain engine's answers exactly.
#[test]
fn unfit_plans_take_two_pass() {
    let preset = PRESETS[1];
    let (base, eng) = engines(preset);
    let fixture = fixture_plans(&base, preset);
    let long_rows = unshared_plan(20, &[3000, 3000, 2500]);
    let long_suffixes = shared_plan(21, 4, 1000, 1900);
    let (a, b, c) = (
        shared_plan(23, 3, 1500, 500),
        shared_plan(24, 2, 2000, 700),
        shared_plan(25, 4, 500, 400),
    );
    let call: Vec<&Plan> = vec![
        &a,
        &long_rows,
        &fixture[0],
        &b,
        &long_suffixes,
        &c,
        &fixture[1],
        &fixture[2],
    ];
    let unfit = [&long_rows, &long_suffixes];
    for p in unfit {
        assert!(one_pass_tokens(&[p]) > MAX_BATCH_TOKENS);
    }
    let groups = tree_groups(&eng, &call, EngineOptions::default().fork_budget_bytes);
    assert!(groups >= 2, "{groups} groups");
    let batches = eng.model().batches();
    let w = check_call(
        "fit and unfit plans",
        &eng,
        &base,
        &call,
        (groups, groups),
        TOLERANCE,
    );
    assert!(eng.model().batches() > batches, "the two-pass route");
    check_call("unfit plans only", &eng, &base, &unfit, (0, 0), 0.0);
    eprintln!(
        "{preset}: {groups} trees around {} unfit plans, worst |diff| vs plain {w:e}",
        unfit.len()
    );
}

/// The fork budget: at the engine's estimate the call is one tree; one byte less, two trees; a budget of one byte, a
/// tree per one-row plan and the two-pass route for the plans of several rows (each alone over the budget). Answers
/// within [`TOLERANCE`] of the plain engine with the same budget. Twice: children budgeted as fresh states (the
/// default), and as 4 bytes (a backend whose children hold next to nothing besides their KV rows, as the GPU's, which
/// hold none: `tree_child_bytes`), which must need less.
#[test]
fn fork_budget() {
    let preset = PRESETS[1];
    let probe = plain(preset, EngineOptions::default());
    let plans = fixture_plans(&probe, preset);
    let call: Vec<&Plan> = plans
        .iter()
        .filter(|p| read_rows(p).1 > 0)
        .take(2)
        .chain(plans.iter().filter(|p| read_rows(p).1 == 0).take(3))
        .collect();
    assert!(call.iter().map(|p| read_rows(p).0.len()).sum::<usize>() >= 2);
    assert!(call.iter().any(|p| read_rows(p).1 > 0), "a shared prefix");
    let one_row = call.iter().filter(|p| read_rows(p).0.len() == 1).count();
    assert!(one_row >= 1, "a one-row plan");
    for child in [usize::MAX, 4] {
        let with_child = |opts: EngineOptions| {
            let eng = tree(preset, opts, false);
            eng.model().child_bytes.store(child, Ordering::SeqCst);
            eng
        };
        let need = one_pass_bytes(&with_child(EngineOptions::default()), &call);
        for (budget, trees, two_pass) in
            [(need, 1, false), (need - 1, 2, false), (1, one_row, true)]
        {
            let opts = EngineOptions {
                fork_budget_bytes: budget,
                ..EngineOptions::default()
            };
            let eng = with_child(opts.clone());
            assert_eq!(tree_groups(&eng, &call, budget), trees, "budget {budget}");
            let base = plain(preset, opts);
            check_call(
                &format!("{preset}: budget {budget} of {need} bytes (child {child})"),
                &eng,
                &base,
                &call,
                (trees, trees),
                TOLERANCE,
            );
            assert_eq!(
                eng.model().batches() > 0,
                two_pass,
                "budget {budget}: two-pass route"
            );
        }
    }
}

/// A backend that declines every tree: asked once per group, the plain engine's answers
/// exactly (the route before the hook, unchanged).
#[test]
fn declined_tree_is_the_plain_engine() {
    for preset in PRESETS {
        let base = plain(preset, EngineOptions::default());
        let eng = tree(preset, EngineOptions::default(), true);
        let plans = fixture_plans(&base, preset);
        let refs: Vec<&Plan> = plans.iter().collect();
        for (c, chunk) in refs.chunks(7).enumerate() {
            check_call(
                &format!("{preset} call {c} declined"),
                &eng,
                &base,
                chunk,
                (1, 0),
                0.0,
            );
        }
        // Past the token limit (several groups), and with a plan that does not fit one pass alone: asked once per
        // group (a declined group does not stop the others from asking).
        let mut long = past(&plans, MAX_BATCH_TOKENS);
        let budget = EngineOptions::default().fork_budget_bytes;
        let alone = unshared_plan(30, &[2800, 2800, 2800]);
        long.insert(long.len() / 2, &alone);
        let groups = tree_groups(&eng, &long, budget);
        assert!(groups >= 2);
        check_call(
            &format!("{preset} {} plans past the limit, declined", long.len()),
            &eng,
            &base,
            &long,
            (groups, 0),
            0.0,
        );
        let hand = [shared_plan(3, 3, 40, 17), shared_plan(4, 2, 1, 5)];
        let hand: Vec<&Plan> = hand.iter().collect();
        check_call(
            &format!("{preset} hand-built, declined"),
            &eng,
            &base,
            &hand,
            (1, 0),
            0.0,
        );
        // Switched on, the same engine takes the tree.
        eng.model().decline.store(false, Ordering::SeqCst);
        check_call(
            &format!("{preset} hand-built, tree"),
            &eng,
            &base,
            &hand,
            (1, 1),
            TOLERANCE,
        );
    }
}

/// A group the backend declines (here its first) runs the two-pass route, and the groups after it still take the
/// tree: asked once per group, run for all but the declined one.
#[test]
fn declined_group_leaves_the_others_on_the_tree() {
    for preset in PRESETS {
        let (base, eng) = engines(preset);
        eng.model().decline_first.store(true, Ordering::SeqCst);
        let plans = fixture_plans(&base, preset);
        // A shared-prefix plan, then the fixture plans past the token limit: the first group is declined, the others
        // run.
        let short = shared_plan(5, 3, 2, 30);
        let mut call = vec![&short];
        call.extend(past(&plans, MAX_BATCH_TOKENS));
        let groups = tree_groups(&eng, &call, EngineOptions::default().fork_budget_bytes);
        assert!(groups >= 2, "{groups} groups");
        check_call(
            &format!("{preset} one declined group of {groups}"),
            &eng,
            &base,
            &call,
            (groups, groups - 1),
            TOLERANCE,
        );
    }
}

/// A shared prefix shorter than the backend's `min_tree_root` (2 ids, against 3): the engine runs that plan's rows
/// whole, as roots, and the call keeps the tree (asked once, run once, no two-pass forward), with the plain engine's
/// answers; at `min_root` 2 the same prefix is shared, a root with children. The children counted: the second plan's
/// 2 rows, plus the first plan's 3 when its prefix is shared.
#[test]
fn short_prefix_rows_run_whole_on_the_tree() {
    for preset in PRESETS {
        let base = plain(preset, EngineOptions::default());
        let plans = [shared_plan(5, 3, 2, 30), shared_plan(6, 2, 12, 9)];
        let call: Vec<&Plan> = plans.iter().collect();
        for min_root in [3, 2] {
            let eng = tree(preset, EngineOptions::default(), false);
            eng.model().min_root.store(min_root, Ordering::SeqCst);
            check_call(
                &format!("{preset} prefix of 2 ids, min_root {min_root}"),
                &eng,
                &base,
                &call,
                (1, 1),
                TOLERANCE,
            );
            assert_eq!(eng.model().batches(), 0, "no two-pass forward");
            let kids = if min_root == 3 { 2 } else { 5 };
            assert_eq!(eng.model().kids.load(Ordering::SeqCst), kids, "children");
        }
    }
}

/// A slot outside its row fails the call with the plain engine's error, before any forward (the tree is not asked).
#[test]
fn slot_check_on_the_tree_route() {
    let preset = PRESETS[0];
    let (base, eng) = engines(preset);
    let mut bad = shared_plan(5, 2, 10, 6);
    bad.rows[1].slots[0] = 16;
    let good = shared_plan(6, 2, 8, 4);
    let got = eng.score(&[&good, &bad]).unwrap_err().to_string();
    let want = base.score(&[&good, &bad]).unwrap_err().to_string();
    assert_eq!(got, want);
    assert!(
        got.contains(
            "plan 1 row 1: slot 16 with 2 options does not fit a row of 16 ids (prefix 10)"
        ),
        "{got}"
    );
    assert_eq!(eng.model().counts(), (0, 0));
}

/// A row whose option counts or temperatures do not match its slots fails the call with a clear error on both
/// engines, nothing run, instead of a panic in the readout.
#[test]
fn malformed_rows_fail_the_call() {
    let preset = PRESETS[0];
    let (base, eng) = engines(preset);
    let mut few_temps = shared_plan(7, 2, 10, 6);
    few_temps.rows[0].temperatures.clear();
    let mut few_opts = shared_plan(8, 2, 10, 6);
    few_opts.rows[1].nopts.clear();
    let n = |p: &Plan, r: usize| p.rows[r].slots.len();
    for (bad, want) in [
        (
            &few_temps,
            format!(
                "plan 0 row 0: {0} slot(s) but {0} option count(s) and 0 temperature(s)",
                n(&few_temps, 0)
            ),
        ),
        (
            &few_opts,
            format!(
                "plan 0 row 1: {0} slot(s) but 0 option count(s) and {0} temperature(s)",
                n(&few_opts, 1)
            ),
        ),
    ] {
        for got in [
            eng.score(&[bad]).unwrap_err().to_string(),
            base.score(&[bad]).unwrap_err().to_string(),
        ] {
            assert!(got.contains(&want), "{got}");
        }
    }
    assert_eq!(eng.model().counts(), (0, 0));
}

/// With the prefix-state LRU on, the tree route shares each plan's context (`"Context:\n"` + state) and keeps its
/// state: the first call of a body runs one tree and misses; the same body again hits, takes the two-pass route (no
/// tree asked: the kept state is a root with no ids left) and answers as the plain engine within the route tolerance;
/// a body with the same state and other questions hits too.
#[test]
fn kept_context_takes_the_two_pass_route() {
    let preset = PRESETS[0];
    let base = plain(preset, EngineOptions::default());
    let eng = tree_with_lru(preset, EngineOptions::default(), false);
    let body = |q: &str| {
        format!(
            r#"{{"state": {{"order": 1234, "note": "the parcel arrived damaged"}}, "questions": {{"a": {{"type": "bool", "instructions": "{q}"}}, "b": {{"type": "choice", "instructions": "What next?", "criteria": ["refund", "replace", "repair"]}}}}}}"#
        )
    };
    let plan = |b: String| eng.plan(&parse_request(b.as_bytes()).unwrap()).unwrap();
    let (first, other) = (plan(body("Is it damaged?")), plan(body("Is it late?")));
    assert!(first.rows.len() >= 2 && first.ctx_len > 0);
    let stats = || {
        let s = eng.prefix_cache_stats();
        (s.hits, s.misses, s.entries)
    };
    let worst = check_call("first", &eng, &base, &[&first], (1, 1), TOLERANCE);
    assert_eq!(stats(), (0, 1, 1), "a miss, and the context kept");
    let batches = eng.model().batches();
    let again = check_call("again", &eng, &base, &[&first], (0, 0), TOLERANCE);
    assert_eq!(stats(), (1, 1, 1), "a hit, nothing new kept");
    let w = check_call("other questions", &eng, &base, &[&other], (0, 0), TOLERANCE);
    assert_eq!(stats(), (2, 1, 1));
    assert_eq!(
        eng.model().batches() - batches,
        2,
        "one forward per call: the suffixes, from the kept state"
    );
    eprintln!(
        "{preset}: kept context vs plain engine: worst |diff| {:e}",
        worst.max(again).max(w)
    );
}
