//! The System One engine: a model, its tokenizer and its `decider_config.json`, answering `/v1/systemone` bodies.
//!
//! ```text
//! body ──parse_request──▶ Request ──plan──▶ Plan ──check_size──▶ score ──▶ probs per slot ──assemble──▶ response
//! ```
//!
//! [`Engine::score`] is the only part that runs the model. Rows of all plans passed to one call run together:
//!
//! 1. per plan, the longest common prefix of its rows, capped one token below the shortest row so every slot stays in
//!    a suffix (`rows::common_prefix_len`, decider-contract R5.5.1), runs once;
//! 2. its sequence state is forked per row, at most as many live forks as `fork_budget_bytes` allows (R5.5.2);
//! 3. the suffixes of all rows of all plans go through [`Model::forward_batch`] together (the projections see every
//!    token stacked; each token mixer walks its own row);
//! 4. at every slot the final-normed hidden state is projected onto the first `nopts` label rows only
//!    ([`Model::logits_rows`], never the full head, R3.1.1) and `softmax` runs at the slot's temperature (R3.3).
//!
//! With `shared_prefix: false` every row runs whole from a fresh state. Both give the same probabilities up to f32
//! reduction order (R5.5.3; `tests/answers.rs` checks it).
//!
//! One pass: the call's plans, in order, are split into groups that each fit one pass, greedily (a group takes plans
//! while the next one still fits): the group's states within `fork_budget_bytes` (estimated before they exist: each
//! root, a shared prefix or a row without one, a fresh state plus its ids' KV; each child its suffix's KV plus
//! [`Backend::tree_child_bytes`]; the first job always fits) and one forward (every shared prefix once plus every row's
//! remaining ids, at most [`MAX_BATCH_TOKENS`]). A plan without slots needs no forward and joins none. Each
//! group runs steps 1–3 as one [`Backend::forward_tree`]: the roots are the shared prefixes and the rows without one,
//! each row with a prefix is a child of its prefix's root (a shared prefix shorter than [`Backend::min_tree_root`] is
//! not shared: its rows run whole, as roots). A GPU backend then reads every weight once per group. The plans that do
//! not fit one pass even alone, and the groups the backend answers `None` for, run the steps above together,
//! unchanged. A backend whose [`Backend::runs_trees`] is false (the CPU [`Model`]) is never asked: every plan takes
//! those steps.
//! Every route shares step 4 and writes its plans' slots only (`tests/tree.rs` checks the routes agree).
//!
//! Kept contexts: with the prefix-state LRU on (`prefix_cache_bytes` > 0, shared prefixes on, state-first rows), a
//! plan's shared prefix is its context, the ids of `[chat head +] "Context:\n" + state` that open every row (capped
//! one id below the shortest row; one row or many), not the rows' whole common prefix: its state is what a later
//! request with the same state starts from. Before any forward, each such plan looks its context up in the LRU
//! [`Engine::choose`] uses too (keyed on ids, the longest kept prefix of them; one hit or miss per plan). A hit takes
//! the two-pass route from the kept state: a context kept whole is forked per row as it is; a kept prefix of it is
//! copied and the rest of the context prefilled. After the call, every context state computed (a tree's root, or the
//! two-pass prefix) moves into the LRU, unless it is larger than the LRU. Kept and computed are bit-identical where
//! the pieces are the same (`tests/answers.rs`).
//!
//! The model is any [`Backend`] of the sequence API (`onepass-engine`, re-exported here): the CPU [`Model`] (the
//! default), the GPU's, or [`AnyBackend`] (either, chosen at run time; what the CLI and the server hold). This crate
//! never names a device.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub use onepass_engine::{AnyBackend, Backend, Pick};
use onepass_model::{Model, ModelError};
use onepass_tokenizer::{Tokenizer, TokenizerError};

use crate::assemble::softmax;
use crate::choice::{PrefixLru, PrefixStore};
use crate::config::{ConfigError, DecideConfig, Order};
use crate::error::ApiError;
use crate::generate::{GenerateError, Generator};
use crate::pipeline::{Limits, Pipeline, Route};
use crate::prompt::tokens::{common_prefix_len, plan, Plan, Row};
use crate::pyjson::Value;
use crate::request::Request;
use crate::session::{Session, SessionOptions};

/// Most tokens stacked into one `forward_batch` call (bounds activation memory: `[N, intermediate]` f32 buffers).
/// A row longer than this still runs, alone; a shared prefix runs in pieces of this size.
pub const MAX_BATCH_TOKENS: usize = 8192;

/// How [`Engine::score`] runs rows.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Bytes of forked sequence state alive at once (estimated before the states exist: see the module docs for the
    /// one-pass route, and prefix state + KV of the suffix per row for the two-pass one). At least one row always
    /// runs. Default 2 GiB.
    pub fork_budget_bytes: usize,
    /// Run each plan's common prefix once and fork it per row (default true).
    pub shared_prefix: bool,
    /// Shortest common prefix worth sharing, in tokens (default 1).
    pub min_shared_prefix: usize,
    /// The 413 limits applied by [`Engine::system_one`].
    pub limits: Limits,
    /// `DECIDER_LAYOUT`: `"plain"` or `"chat"` replaces decider_config.json's prompt layout (decider-contract R6.3).
    pub layout: Option<String>,
    /// `DECIDER_TEMPERATURE`: replaces decider_config.json's temperature and switches its by-type and by-options maps
    /// off (decider-contract R3.2.1, R6.3). Validated at load.
    pub temperature: Option<String>,
    /// `DECIDER_MAX_STATE_TOKENS`: replaces the config's cap on the ids of `"Context:\n" + state` (default: the
    /// config's, [`crate::config::DEFAULT_MAX_STATE_TOKENS`]).
    pub max_state_tokens: Option<usize>,
    /// Bytes of prefix states kept for later requests (`--prefix-cache-mb`; 0: none), one LRU for the prefixes of
    /// [`Engine::choose`] and the contexts of [`Engine::score`] (module docs). Default 1 GiB.
    pub prefix_cache_bytes: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            fork_budget_bytes: 2 << 30,
            shared_prefix: true,
            min_shared_prefix: 1,
            limits: Limits::default(),
            layout: None,
            temperature: None,
            max_state_tokens: None,
            prefix_cache_bytes: 1 << 30,
        }
    }
}

/// Why the engine could not load or score (not a client error).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    // Transparent: the inner message already names the file (config.json, tokenizer.json, ...), and a prefix with
    // the inner error also returned as `source()` printed every cause twice.
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Not a `source()`: the message is already in the prefix.
    #[error("decider_config.json: {0}")]
    Config(ConfigError),
    #[error("score: plan {plan} row {row}: {reason}")]
    Row {
        plan: usize,
        row: usize,
        reason: String,
    },
}

impl From<ConfigError> for EngineError {
    fn from(e: ConfigError) -> Self {
        EngineError::Config(e)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError::detail(500, e.to_string())
    }
}

/// A loaded System One model. `Send + Sync` (for a backend whose states are `Sync`, as the CPU and GPU ones are): share
/// it in an `Arc` and call [`Engine::score`] from any thread.
pub struct Engine<B: Backend = Model> {
    model: B,
    tokenizer: Tokenizer,
    config: DecideConfig,
    opts: EngineOptions,
    /// The 255 label ids (decider-contract §2.2); option `j` is read at `label_ids[j]`.
    label_ids: Vec<u32>,
    /// Bytes of a fresh state and KV bytes per token, for the fork budget (measured once at load).
    fresh_state_bytes: usize,
    state_bytes_per_token: usize,
    /// The model folder and `model_type`, for the generation side (loaded on first use, [`Engine::generator`]).
    dir: Option<(PathBuf, String)>,
    generator: OnceLock<Result<Generator, GenerateError>>,
    /// The prefix states of [`Engine::choose`] and the contexts of [`Engine::score`], least recently used out first
    /// (crate::choice).
    prefix_lru: Mutex<PrefixLru<B::State>>,
}

/// One row's work inside a `score` call: where its state comes from, the ids still to run, where its slots are.
struct Job {
    plan: usize,
    row: usize,
    /// Index into the call's shared prefix states, or `None` for a fresh state.
    prefix: Option<usize>,
    /// Tokens already covered by the prefix.
    skip: usize,
}

/// One plan's share of a `score` call.
struct Part<S> {
    /// Tokens of the common prefix that runs once and is forked per row; 0: none, every row runs whole.
    lcp: usize,
    /// The rows read (those with slots), in order.
    rows: Vec<usize>,
    /// The shared prefix is the plan's context (`[chat head +] "Context:\n" + state`): it is looked up in the
    /// prefix-state LRU and its state kept there after the call.
    keep: bool,
    /// The kept state the prefix starts from (found in the LRU): the ids it covers and the state.
    start: Option<(usize, Arc<S>)>,
}

/// The state after a shared prefix: run in this call, or kept in the LRU and restored whole (forked per row, never
/// continued).
enum Prefix<S> {
    Own(S),
    Kept(Arc<S>),
}

impl<S> Prefix<S> {
    fn get(&self) -> &S {
        match self {
            Prefix::Own(s) => s,
            Prefix::Kept(s) => s,
        }
    }
}

/// What one tree forward gives back: the hidden rows, per job the row its ids start at, and the states after the
/// shared prefixes (the roots with children), in order.
struct Tree<B: Backend> {
    hidden: B::Hidden,
    starts: Vec<usize>,
    prefixes: Vec<B::State>,
}

/// What one pass holds so far, for [`Engine::grow`].
#[derive(Debug, Clone, Copy, Default)]
struct PassSize {
    jobs: usize,
    /// Every shared prefix once plus every job's remaining ids.
    tokens: usize,
    /// Estimated bytes of the jobs' states.
    bytes: usize,
}

/// The shared prefixes `(plan, lcp)` and the jobs of `plans[p]` for every `p` in `which`, in that order; each job's
/// `prefix` indexes the prefixes returned.
fn work<S>(parts: &[Part<S>], which: &[usize]) -> (Vec<(usize, usize)>, Vec<Job>) {
    let mut shared = Vec::new();
    let mut jobs = Vec::new();
    for &pi in which {
        let part = &parts[pi];
        let prefix = (part.lcp > 0).then(|| {
            shared.push((pi, part.lcp));
            shared.len() - 1
        });
        jobs.extend(part.rows.iter().map(|&row| Job {
            plan: pi,
            row,
            prefix,
            skip: part.lcp,
        }));
    }
    (shared, jobs)
}

impl Engine {
    /// Loads `dir`: `config.json` + safetensors weights, or a GGUF file (a folder holding one, or the file itself),
    /// `tokenizer.json` (+ config; else the GGUF file's tokenizer), `decider_config.json` (a missing file means
    /// defaults, decider-contract R6.1).
    pub fn load(dir: &Path, opts: EngineOptions) -> Result<Engine, EngineError> {
        let mut model = Model::load(dir)?;
        model.prepare_for_cpu();
        let model_type = model.config().model_type.clone();
        Engine::from_dir_with(dir, &model_type, model, opts)
    }
}

impl<B: Backend> Engine<B> {
    /// An engine over `backend` with the tokenizer and `decider_config.json` of `dir`, loaded the way the reference
    /// sees them: the tokenizer's transformers view (decider-contract R2.1.2), `DECIDER_LAYOUT` and
    /// `DECIDER_TEMPERATURE` from `opts`, and the chat template rendered and validated (its errors are load errors,
    /// R2.5.1). `model_type` is config.json's.
    pub fn from_dir_with(
        dir: &Path,
        model_type: &str,
        backend: B,
        opts: EngineOptions,
    ) -> Result<Engine<B>, EngineError> {
        let (tokenizer, config) = load_planner(
            dir,
            Some(model_type),
            opts.layout.as_deref(),
            opts.temperature.as_deref(),
        )?;
        let mut e = Engine::new(backend, tokenizer, config, opts)?;
        e.dir = Some((dir.to_path_buf(), model_type.to_string()));
        Ok(e)
    }

    /// What generation needs from the model folder (the tokenizer as written, chat template, end-of-sequence ids,
    /// sampling defaults), loaded on first use: System One never pays for it.
    pub fn generator(&self) -> Result<&Generator, GenerateError> {
        let Some((dir, model_type)) = &self.dir else {
            return Err(GenerateError::unsupported(
                "this engine was built without its model folder, so it cannot generate",
            ));
        };
        self.generator
            .get_or_init(|| Generator::load(dir, Some(model_type)))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// One decision over a list of choices ([`crate::choice`], `POST /v1/decide`), with the engine's LRU of prefix states standing in
    /// for a session's kept state (the server's `POST /v1/decide`). Decisions run one at a time (the LRU is held for
    /// the whole decision).
    pub fn choose(
        &self,
        req: &crate::choice::DecideRequest,
    ) -> Result<crate::choice::DecideAnswer, crate::choice::DecideError> {
        let gen = self
            .generator()
            .map_err(|e| crate::choice::DecideError::server(req.id.clone(), e.message.clone()))?;
        let prompt = gen.decide_prompt();
        let mut lru = self.lru();
        let store = (lru.cap_bytes() > 0).then_some(&mut *lru);
        crate::choice::decide(&self.model, &gen.tokenizer, &prompt, store, req)
    }

    /// What the prefix-state LRU ([`Engine::choose`], [`Engine::score`]) has done and holds.
    pub fn prefix_cache_stats(&self) -> crate::choice::PrefixCacheStats {
        self.lru().stats()
    }

    /// A session over this engine ([`Session`]).
    pub fn session(&self, opts: SessionOptions) -> Session<'_, B> {
        Session::new(self, opts)
    }
}

/// What planning a request needs from a model folder, without the weights: its tokenizer as the reference sees it
/// (`transformers_compatible`, decider-contract R2.1.2) and its `decider_config.json` with the `DECIDER_LAYOUT` /
/// `DECIDER_TEMPERATURE` overrides. [`Engine::from_dir_with`] and `onepass render` both load through it.
pub fn load_planner(
    dir: &Path,
    model_type: Option<&str>,
    layout: Option<&str>,
    temperature: Option<&str>,
) -> Result<(Tokenizer, DecideConfig), EngineError> {
    let tokenizer = Tokenizer::from_model(dir, model_type)?.transformers_compatible();
    // A GGUF file's folder holds the decider_config.json.
    let folder = match dir.parent() {
        Some(p) if dir.is_file() && !p.as_os_str().is_empty() => p,
        _ if dir.is_file() => Path::new("."),
        _ => dir,
    };
    let config = DecideConfig::load(folder, &tokenizer, layout, temperature)?;
    Ok((tokenizer, config))
}

impl<B: Backend> Engine<B> {
    /// An engine from parts already loaded.
    pub fn new(
        model: B,
        tokenizer: Tokenizer,
        mut config: DecideConfig,
        opts: EngineOptions,
    ) -> Result<Engine<B>, EngineError> {
        if config.chat.is_none() {
            config.attach_chat(&tokenizer, None)?; // a chat-layout config built without its template
        }
        if let Some(cap) = opts.max_state_tokens {
            config.max_state_tokens = cap;
        }
        let label_ids = tokenizer.label_table()?.ids.clone();
        if let Some(&bad) = label_ids
            .iter()
            .find(|&&id| id as usize >= model.vocab_size())
        {
            return Err(EngineError::Model(ModelError::Input(format!(
                "label id {bad} is outside the model's vocabulary (0..{}); tokenizer and weights do not match",
                model.vocab_size()
            ))));
        }
        let fresh_state_bytes = {
            let st = model
                .new_state()
                .map_err(|e| EngineError::Model(ModelError::Input(format!("new state: {e}"))))?;
            model.state_bytes(&st)
        };
        let state_bytes_per_token = model.state_bytes_per_token();
        let prefix_cache_bytes = opts.prefix_cache_bytes;
        Ok(Engine {
            model,
            tokenizer,
            config,
            opts,
            label_ids,
            fresh_state_bytes,
            state_bytes_per_token,
            dir: None,
            generator: OnceLock::new(),
            prefix_lru: Mutex::new(PrefixLru::new(prefix_cache_bytes)),
        })
    }

    /// `"decider-" + str(version)` from `decider_config.json`.
    pub fn model_name(&self) -> &str {
        &self.config.model_name
    }

    pub fn config(&self) -> &DecideConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn model(&self) -> &B {
        &self.model
    }

    /// Where the model runs ([`Backend::device`]).
    pub fn device(&self) -> String {
        self.model.device()
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Render and tokenize a request (422s and the chat-layout 500 come from here); no model work.
    pub fn plan(&self, req: &Request) -> Result<Plan, ApiError> {
        plan(req, &self.tokenizer, &self.config)
    }

    /// Probabilities for every slot of every plan: `[plan][slot in row order][option]`, each of length `nopts`.
    pub fn score(&self, plans: &[&Plan]) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        // Per plan: its shared prefix worth running (0: none) and the rows it reads.
        let trees = self.model.runs_trees();
        let min_root = self.model.min_tree_root();
        // Shared only when at least `min_shared_prefix` ids long and, with trees, at least a tree root's minimum
        // (a shorter prefix's rows run whole on every route of the call: the same answers up to f32 reduction
        // order, R5.5.3, and the group keeps the one-pass route).
        let worth = |n: usize| n >= self.opts.min_shared_prefix.max(1) && (!trees || n >= min_root);
        let contexts = self.keeps_contexts();
        let mut parts: Vec<Part<B::State>> = Vec::with_capacity(plans.len());
        for (pi, p) in plans.iter().enumerate() {
            let ids: Vec<&[u32]> = p.rows.iter().map(|r| r.ids.as_slice()).collect();
            // With the prefix-state LRU, the shared prefix is the context, one row or many (capped one id below the
            // shortest row, as any shared prefix), so that its state is the one a later request with the same
            // context can start from.
            let context = if contexts && !ids.is_empty() {
                p.ctx_len.min(common_prefix_len(&ids))
            } else {
                0
            };
            let keep = worth(context);
            let lcp = if keep {
                context
            } else if self.opts.shared_prefix && ids.len() >= 2 {
                Some(common_prefix_len(&ids))
                    .filter(|&n| worth(n))
                    .unwrap_or(0)
            } else {
                0
            };
            let mut rows = Vec::new();
            for (ri, r) in p.rows.iter().enumerate() {
                if r.slots.is_empty() {
                    continue; // nothing to read (`independent: false` without questions)
                }
                if r.ids.is_empty() {
                    return Err(EngineError::Row {
                        plan: pi,
                        row: ri,
                        reason: "empty row".into(),
                    });
                }
                // Before any forward: a bad slot fails the call with nothing run.
                self.check_slots(pi, ri, r, lcp)?;
                rows.push(ri);
            }
            parts.push(Part {
                lcp,
                keep: keep && !rows.is_empty(),
                rows,
                start: None,
            });
        }
        // The kept contexts, one lookup per plan that keeps one (a hit or a miss each).
        if parts.iter().any(|p| p.keep) {
            let mut lru = self.lru();
            for (part, p) in parts.iter_mut().zip(plans).filter(|(part, _)| part.keep) {
                part.start = lru.shared(&p.rows[0].ids[..part.lcp]);
            }
        }
        // out: [plan][slot][option]; first_slot[p][r]: the slot where row r of plan p starts.
        let mut out: Vec<Vec<Vec<f32>>> = plans
            .iter()
            .map(|p| vec![Vec::new(); p.slot_count()])
            .collect();
        let first_slot: Vec<Vec<usize>> = plans
            .iter()
            .map(|p| {
                let mut acc = 0;
                p.rows
                    .iter()
                    .map(|r| {
                        let s = acc;
                        acc += r.slots.len();
                        s
                    })
                    .collect()
            })
            .collect();

        // Groups of plans for one pass each, in order, each taking plans while the pass still fits; a plan that does
        // not fit one pass alone goes to the two-pass path.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut two_pass: Vec<usize> = Vec::new();
        let (mut group, mut size) = (Vec::new(), PassSize::default());
        for (pi, part) in parts.iter().enumerate() {
            if part.rows.is_empty() {
                continue; // no forward at all
            }
            // A plan restored from a kept state takes the two-pass route: the state is a root with few or no ids
            // left to run, and a GPU tree takes no copied state as a root.
            if !trees || part.start.is_some() {
                two_pass.push(pi);
                continue;
            }
            if let Some(grown) = self.grow(size, plans[pi], part) {
                group.push(pi);
                size = grown;
                continue;
            }
            match self.grow(PassSize::default(), plans[pi], part) {
                Some(alone) => {
                    groups.push(std::mem::replace(&mut group, vec![pi]));
                    size = alone;
                }
                None => two_pass.push(pi),
            }
        }
        if !group.is_empty() {
            groups.push(group);
        }
        // Every group as one tree; a group the backend declines takes the two-pass path.
        for group in groups {
            let (shared, jobs) = work(&parts, &group);
            let Some(tree) = self.run_tree(plans, &shared, &jobs)? else {
                two_pass.extend(group);
                continue;
            };
            self.read_out(
                plans,
                &jobs,
                &tree.hidden,
                &tree.starts,
                &first_slot,
                &mut out,
            )?;
            self.keep_contexts(
                plans,
                &parts,
                &shared,
                tree.prefixes.into_iter().map(Prefix::Own),
            );
        }
        if !two_pass.is_empty() {
            two_pass.sort_unstable();
            let (shared, jobs) = work(&parts, &two_pass);
            let prefixes =
                self.run_two_pass(plans, &parts, &shared, &jobs, &first_slot, &mut out)?;
            self.keep_contexts(plans, &parts, &shared, prefixes);
        }
        Ok(out)
    }

    /// Whether [`Engine::score`] shares each plan's context and keeps its state in the prefix-state LRU: the LRU
    /// holds something (`prefix_cache_bytes` > 0), prefixes are shared, and the rows open with the context
    /// (state-first order; a schema-first row opens with its questions).
    fn keeps_contexts(&self) -> bool {
        self.opts.prefix_cache_bytes > 0
            && self.opts.shared_prefix
            && self.config.order == Order::StateFirst
    }

    /// The prefix-state LRU, shared by [`Engine::choose`] and [`Engine::score`].
    fn lru(&self) -> MutexGuard<'_, PrefixLru<B::State>> {
        self.prefix_lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves into the LRU the state after every shared prefix (`prefixes[i]`, after `shared[i]`) that is its plan's
    /// context, unless it was restored whole (the LRU has it) or is larger than the LRU.
    fn keep_contexts(
        &self,
        plans: &[&Plan],
        parts: &[Part<B::State>],
        shared: &[(usize, usize)],
        prefixes: impl IntoIterator<Item = Prefix<B::State>>,
    ) {
        let mut lru = None;
        for (&(p, lcp), st) in shared.iter().zip(prefixes) {
            let (Prefix::Own(st), true) = (st, parts[p].keep) else {
                continue;
            };
            let bytes = self.model.state_bytes(&st);
            if bytes <= self.opts.prefix_cache_bytes {
                lru.get_or_insert_with(|| self.lru()).insert(
                    &plans[p].rows[0].ids[..lcp],
                    st,
                    bytes,
                );
            }
        }
    }

    /// Steps 1–4 the long way for `jobs` (prefix indices into `shared`): the shared prefixes, then groups of jobs
    /// within the fork budget and the token cap, in order, each forked and run together, then read out. → the states
    /// after the shared prefixes.
    fn run_two_pass(
        &self,
        plans: &[&Plan],
        parts: &[Part<B::State>],
        shared: &[(usize, usize)],
        jobs: &[Job],
        first_slot: &[Vec<usize>],
        out: &mut [Vec<Vec<f32>>],
    ) -> Result<Vec<Prefix<B::State>>, EngineError> {
        let per_token = self.state_bytes_per_token;
        // 1. The shared prefixes, batched together (from their kept states where the LRU had them).
        let prefixes = self.run_prefixes(plans, parts, shared)?;
        let fresh_bytes = self.fresh_state_bytes;

        // 2. Groups of jobs within the fork budget and the token cap, in order.
        let mut start = 0;
        while start < jobs.len() {
            let mut end = start;
            let (mut bytes, mut tokens) = (0usize, 0usize);
            while end < jobs.len() {
                let j = &jobs[end];
                let suffix = plans[j.plan].rows[j.row].ids.len() - j.skip;
                let base = j
                    .prefix
                    .map_or(fresh_bytes, |k| self.model.state_bytes(prefixes[k].get()));
                let b = base + suffix * per_token;
                if end > start
                    && (bytes + b > self.opts.fork_budget_bytes
                        || tokens + suffix > MAX_BATCH_TOKENS)
                {
                    break;
                }
                bytes += b;
                tokens += suffix;
                end += 1;
            }
            let group = &jobs[start..end];
            // 3. Fork, run every suffix together.
            let mut states: Vec<B::State> = group
                .iter()
                .map(|j| {
                    match j.prefix {
                        None => self.model.new_state(),
                        Some(k) => self.model.fork(prefixes[k].get()),
                    }
                    .map_err(|e| row_err(j.plan, j.row, e))
                })
                .collect::<Result<_, _>>()?;
            let mut items: Vec<(&mut B::State, &[u32])> = states
                .iter_mut()
                .zip(group)
                .map(|(st, j)| (st, &plans[j.plan].rows[j.row].ids[j.skip..]))
                .collect();
            // hidden: [ΣT, H]
            let hidden = self.model.forward_batch(&mut items).map_err(|e| {
                let j = &group[0];
                row_err(j.plan, j.row, e)
            })?;
            drop(items);
            // 4. Readout at every slot.
            let starts: Vec<usize> = group
                .iter()
                .scan(0, |offset, j| {
                    let s = *offset;
                    *offset += plans[j.plan].rows[j.row].ids.len() - j.skip;
                    Some(s)
                })
                .collect();
            self.read_out(plans, group, &hidden, &starts, first_slot, out)?;
            start = end;
        }
        Ok(prefixes)
    }

    /// The pass `size` with plan `p` added, or `None` when it no longer fits one: the fork budget (the states the
    /// tree will hold, estimated before they exist: a shared prefix's root a fresh state plus its `lcp` ids of KV and
    /// each of its children [`Backend::tree_child_bytes`] (else a fresh state) plus its suffix's KV; a row without a
    /// prefix is a root of its own, a fresh state plus its ids' KV; the first job of a pass always fits) and one
    /// forward of at most [`MAX_BATCH_TOKENS`] (every shared prefix once plus every job's remaining ids).
    fn grow(&self, mut size: PassSize, p: &Plan, part: &Part<B::State>) -> Option<PassSize> {
        let per_token = self.state_bytes_per_token;
        let fresh = self.fresh_state_bytes;
        let child = self.model.tree_child_bytes().unwrap_or(fresh);
        size.tokens += part.lcp;
        if part.lcp > 0 {
            size.bytes += fresh + part.lcp * per_token;
        }
        for &r in &part.rows {
            let suffix = p.rows[r].ids.len() - part.lcp;
            size.bytes += if part.lcp > 0 { child } else { fresh } + suffix * per_token;
            size.tokens += suffix;
            size.jobs += 1;
            if size.jobs > 1 && size.bytes > self.opts.fork_budget_bytes {
                return None;
            }
        }
        (size.tokens <= MAX_BATCH_TOKENS).then_some(size)
    }

    /// One group as one [`Backend::forward_tree`]: roots are every shared prefix (`rows[0].ids[..lcp]`) then every
    /// job without a prefix (its whole row), each on a fresh state; children are every job with a prefix (its
    /// `ids[skip..]` under its prefix's root). → the hidden rows, per job the hidden row its ids start at, and the
    /// states after the shared prefixes; `None` when the backend does not run trees (nothing ran).
    fn run_tree(
        &self,
        plans: &[&Plan],
        shared: &[(usize, usize)],
        jobs: &[Job],
    ) -> Result<Option<Tree<B>>, EngineError> {
        let ids = |j: &Job| &plans[j.plan].rows[j.row].ids[j.skip..];
        let mut root_ids: Vec<&[u32]> = shared
            .iter()
            .map(|&(p, lcp)| &plans[p].rows[0].ids[..lcp])
            .collect();
        let mut children: Vec<(usize, &[u32])> = Vec::new();
        let mut starts = vec![0; jobs.len()];
        let mut offset: usize = root_ids.iter().map(|r| r.len()).sum();
        // Rows of the roots, then of the children.
        for (s, j) in starts.iter_mut().zip(jobs) {
            if j.prefix.is_none() {
                *s = offset;
                offset += ids(j).len();
                root_ids.push(ids(j));
            }
        }
        for (s, j) in starts.iter_mut().zip(jobs) {
            if let Some(k) = j.prefix {
                *s = offset;
                offset += ids(j).len();
                children.push((k, ids(j)));
            }
        }
        let mut states: Vec<B::State> = shared
            .iter()
            .map(|&(p, _)| self.model.new_state().map_err(|e| row_err(p, 0, e)))
            .chain(jobs.iter().filter(|j| j.prefix.is_none()).map(|j| {
                self.model
                    .new_state()
                    .map_err(|e| row_err(j.plan, j.row, e))
            }))
            .collect::<Result<_, _>>()?;
        let mut roots: Vec<(&mut B::State, &[u32])> = states.iter_mut().zip(root_ids).collect();
        // hidden: [ΣT, H], roots' rows then children's
        let tree = self
            .model
            .forward_tree(&mut roots, &children)
            .map_err(|e| row_err(jobs[0].plan, jobs[0].row, e))?;
        drop(roots);
        states.truncate(shared.len());
        Ok(tree.map(|hidden| Tree {
            hidden,
            starts,
            prefixes: states,
        }))
    }

    /// `row` (row `ri` of plan `plan`) has an option count and a temperature per slot, and every slot lies in the part
    /// that runs after its `skip` shared ids with at most as many options as there are label rows.
    fn check_slots(
        &self,
        plan: usize,
        ri: usize,
        row: &Row,
        skip: usize,
    ) -> Result<(), EngineError> {
        let fail = |reason: String| {
            Err(EngineError::Row {
                plan,
                row: ri,
                reason,
            })
        };
        let n = row.slots.len();
        if row.nopts.len() != n || row.temperatures.len() != n {
            return fail(format!(
                "{n} slot(s) but {} option count(s) and {} temperature(s)",
                row.nopts.len(),
                row.temperatures.len()
            ));
        }
        for (&slot, &nopts) in row.slots.iter().zip(&row.nopts) {
            if slot < skip || slot >= row.ids.len() || nopts > self.label_ids.len() {
                return fail(format!(
                    "slot {slot} with {nopts} options does not fit a row of {} ids (prefix {skip})",
                    row.ids.len(),
                ));
            }
        }
        Ok(())
    }

    /// Step 4 for the jobs of one forward: `starts[i]` is the hidden row where `group[i]`'s ids (from `skip`) begin.
    /// The label rows of every slot go to the backend in one call; each slot's softmax lands in `out`. Every job's row
    /// passed [`Engine::check_slots`] in `score` with the job's `skip` (its plan's `lcp`, as [`work`] sets it), which
    /// keeps the indexing below in bounds.
    fn read_out(
        &self,
        plans: &[&Plan],
        group: &[Job],
        hidden: &B::Hidden,
        starts: &[usize],
        first_slot: &[Vec<usize>],
        out: &mut [Vec<Vec<f32>>],
    ) -> Result<(), EngineError> {
        let mut picks: Vec<(usize, &[u32])> = Vec::new();
        for (j, &start) in group.iter().zip(starts) {
            let row = &plans[j.plan].rows[j.row];
            for (&slot, &nopts) in row.slots.iter().zip(&row.nopts) {
                picks.push((start + slot - j.skip, &self.label_ids[..nopts]));
            }
        }
        let logits = self.model.label_logits(hidden, &picks).map_err(|e| {
            let j = &group[0];
            row_err(j.plan, j.row, e)
        })?;
        let mut logits = logits.into_iter();
        for j in group {
            let row = &plans[j.plan].rows[j.row];
            for k in 0..row.slots.len() {
                let l = logits.next().unwrap_or_default();
                out[j.plan][first_slot[j.plan][j.row] + k] =
                    softmax(&l, row.nopts[k], row.temperatures[k]);
            }
        }
        Ok(())
    }

    /// Run `plans[p].rows[0].ids[..lcp]` for every `(p, lcp)`, from the kept state `parts[p].start` where there is
    /// one (a state kept for all `lcp` ids is used as it is): what is left to run stacked into `forward_batch` calls
    /// of at most [`MAX_BATCH_TOKENS`]; a longer piece runs alone, in pieces of that size. → one state per entry, in
    /// order.
    fn run_prefixes(
        &self,
        plans: &[&Plan],
        parts: &[Part<B::State>],
        shared: &[(usize, usize)],
    ) -> Result<Vec<Prefix<B::State>>, EngineError> {
        let mut states = Vec::with_capacity(shared.len());
        // Per entry, the first id still to run (`None`: restored whole).
        let mut from = Vec::with_capacity(shared.len());
        for &(p, lcp) in shared {
            let (st, f) = match &parts[p].start {
                Some((k, kept)) if *k >= lcp => {
                    states.push(Prefix::Kept(kept.clone()));
                    from.push(None);
                    continue;
                }
                Some((k, kept)) => (self.model.fork(kept), *k),
                None => (self.model.new_state(), 0),
            };
            states.push(Prefix::Own(st.map_err(|e| row_err(p, 0, e))?));
            from.push(Some(f));
        }
        // (plan, state, ids still to run) of every entry not restored whole.
        let mut todo: Vec<(usize, &mut B::State, &[u32])> = states
            .iter_mut()
            .zip(shared.iter().zip(&from))
            .filter_map(|(st, (&(p, lcp), f))| match (st, f) {
                (Prefix::Own(st), Some(f)) => Some((p, st, &plans[p].rows[0].ids[*f..lcp])),
                _ => None,
            })
            .collect();
        let mut start = 0;
        while start < todo.len() {
            if todo[start].2.len() > MAX_BATCH_TOKENS {
                let (p0, st, ids) = &mut todo[start];
                for piece in ids.chunks(MAX_BATCH_TOKENS) {
                    self.model
                        .forward_batch(&mut [(&mut **st, piece)])
                        .map_err(|e| row_err(*p0, 0, e))?;
                }
                start += 1;
                continue;
            }
            let (mut end, mut tokens) = (start, 0);
            while end < todo.len()
                && todo[end].2.len() <= MAX_BATCH_TOKENS
                && tokens + todo[end].2.len() <= MAX_BATCH_TOKENS
            {
                tokens += todo[end].2.len();
                end += 1;
            }
            let p0 = todo[start].0;
            let mut items: Vec<(&mut B::State, &[u32])> = todo[start..end]
                .iter_mut()
                .map(|(_, st, ids)| (&mut **st, *ids))
                .collect();
            self.model
                .forward_batch(&mut items)
                .map_err(|e| row_err(p0, 0, e))?;
            start = end;
        }
        drop(todo);
        Ok(states)
    }

    /// The request pipeline over this engine's tokenizer, config, limits and positions.
    pub fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            tokenizer: &self.tokenizer,
            config: &self.config,
            limits: &self.opts.limits,
            max_positions: self.model.max_positions(),
        }
    }

    /// The answer of `route` for a request body: prepare (parse, plan, limits) → score → answer.
    pub fn answer(&self, route: Route, body: &[u8]) -> Result<Value, ApiError> {
        let pipeline = self.pipeline();
        let prepared = pipeline.prepare(route, body)?;
        let probs = if prepared.plan.rows.is_empty() {
            Vec::new()
        } else {
            self.score(&[&prepared.plan])?.pop().unwrap_or_default()
        };
        pipeline.answer(&prepared, &probs, self.model_name())
    }

    /// The `/v1/systemone` answer for a request body ([`Engine::answer`]).
    pub fn system_one(&self, body: &[u8]) -> Result<Value, ApiError> {
        self.answer(Route::SystemOne, body)
    }

    /// The `/decide` answer for a request body ([`Engine::answer`]).
    pub fn decide(&self, body: &[u8]) -> Result<Value, ApiError> {
        self.answer(Route::Decide, body)
    }
}

fn row_err(plan: usize, row: usize, e: impl Display) -> EngineError {
    EngineError::Row {
        plan,
        row,
        reason: e.to_string(),
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Engine>();
}
