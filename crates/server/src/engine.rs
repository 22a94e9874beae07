//! What the server needs from a model: the tokenizer and config to plan requests (through [`onepass_decide::plan`];
//! the config carries `DECIDER_MAX_STATE_TOKENS`, `EngineOptions::max_state_tokens`), one batched `score` call, and
//! generation (the OpenAI-shaped routes).
//! A trait so tests can drive the HTTP layer with fakes (a slow engine, an engine that fails or panics);
//! [`onepass_decide::Engine`] is the real implementation.

use onepass_decide::choice::{DecideAnswer, DecideError, DecideRequest, PrefixCacheStats};
use onepass_decide::engine::Backend;
use onepass_decide::{
    DecideConfig, Engine, GenerateError, GenerateRequest, Generation, Plan, SessionOptions,
};
use onepass_tokenizer::Tokenizer;

/// Probabilities for every slot of every plan: `[plan][slot in row order][option]`.
pub type Scores = Vec<Vec<Vec<f32>>>;

/// The engine API the server is written against (the methods of [`onepass_decide::Engine`]).
pub trait DecideEngine: Send + Sync + 'static {
    /// `"decider-" + str(version)`.
    fn model_name(&self) -> &str;
    fn config(&self) -> &DecideConfig;
    fn tokenizer(&self) -> &Tokenizer;
    /// Longest row the model takes ([`onepass_decide::check_positions`]); default: no limit.
    fn max_positions(&self) -> usize {
        usize::MAX
    }
    /// One call for every plan's rows; an error fails every plan of the call (the batcher then retries them one by
    /// one so a single bad request cannot fail its neighbours).
    fn score(&self, plans: &[&Plan]) -> Result<Scores, String>;
    /// One generation ([`onepass_decide::Session::generate`]); `on_delta` gets the text as it becomes stable. Default:
    /// refused (an engine that only scores).
    fn generate(
        &self,
        req: &GenerateRequest,
        on_delta: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, GenerateError> {
        let _ = (req, on_delta);
        Err(GenerateError::unsupported("this server does not generate"))
    }
    /// One decision over a list of choices (`POST /v1/decide`). Default: refused (an engine that only scores).
    fn choose(&self, req: &DecideRequest) -> Result<DecideAnswer, DecideError> {
        Err(DecideError::unsupported(
            req.id.clone(),
            "this server does not answer decide requests".into(),
        ))
    }
    /// The prefix-state cache's counters, for `/metrics` (`None`: no cache).
    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        None
    }
}

impl<B: Backend + 'static> DecideEngine for Engine<B>
where
    B::State: Sync,
{
    fn model_name(&self) -> &str {
        Engine::model_name(self)
    }
    fn config(&self) -> &DecideConfig {
        Engine::config(self)
    }
    fn tokenizer(&self) -> &Tokenizer {
        Engine::tokenizer(self)
    }
    fn max_positions(&self) -> usize {
        self.model().max_positions()
    }
    fn score(&self, plans: &[&Plan]) -> Result<Scores, String> {
        Engine::score(self, plans).map_err(|e| e.to_string())
    }
    fn generate(
        &self,
        req: &GenerateRequest,
        on_delta: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, GenerateError> {
        self.session(SessionOptions::default())
            .generate(req, on_delta)
    }
    fn choose(&self, req: &DecideRequest) -> Result<DecideAnswer, DecideError> {
        Engine::choose(self, req)
    }
    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        Some(Engine::prefix_cache_stats(self))
    }
}
