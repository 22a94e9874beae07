//! A session: one caller's requests to one engine, in order, as a library ([`Session::generate`]) or as JSON lines
//! ([`Session::handle_line`], what `onepass session` reads on stdin).
//!
//! The line protocol: each input line is one JSON object with a `"cmd"`; each gets exactly one JSON line back, the
//! answer, or `{"id", "error": {"type", "message"}}` when the line was malformed or refused (the session goes on).
//! A generation with `"stream": true` also writes `{"id", "delta"}` lines before its answer.
//!
//! | `"cmd"` | request | answer |
//! | --- | --- | --- |
//! | `generate` | [`crate::generate::parse_generate`]'s fields | [`Generation::to_json`] |
//! | `decide` | [`DecideRequest`]'s fields (refused unless the session was opened with [`SessionOptions::decide`]) | [`DecideAnswer::to_json`] |
//!
//! [`Session::handle_line`] is the one dispatch point on `"cmd"`.

use onepass_engine::Backend;
use serde_json::{json, Value as J};

use crate::choice::{DecideAnswer, DecideError, DecideRequest, DecideSession, PrefixCacheMode};
use crate::engine::Engine;
use crate::generate::{self, parse_generate, GenerateError, GenerateRequest, Generation};

/// What a session may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// Decide requests are answered (off: they are refused, harmlessly, and nothing is kept for them).
    pub decide: bool,
    /// Whether decisions keep the prefix state between them (`--decide-prefix-cache`).
    pub prefix_cache: PrefixCacheMode,
}

/// One caller's requests to `engine`, in order.
pub struct Session<'e, B: Backend> {
    engine: &'e Engine<B>,
    opts: SessionOptions,
    /// The decisions' prompt rule and kept prefix state, made on the first decision (none without `decide`).
    decider: Option<DecideSession<B::State>>,
}

/// `{"id", "error": {"type", "message"}}`.
pub fn error_line(id: &J, e: &GenerateError) -> J {
    json!({"id": id, "error": {"type": e.kind, "message": e.message}})
}

impl<'e, B: Backend> Session<'e, B> {
    pub fn new(engine: &'e Engine<B>, opts: SessionOptions) -> Session<'e, B> {
        Session {
            engine,
            opts,
            decider: None,
        }
    }

    pub fn engine(&self) -> &'e Engine<B> {
        self.engine
    }

    pub fn options(&self) -> SessionOptions {
        self.opts
    }

    /// Generates for `req` ([`generate::generate`]); `on_delta` gets the text as it becomes stable and answers
    /// whether to go on.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        on_delta: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, GenerateError> {
        // A kept prefix state is worth its memory only while decisions follow one another.
        if let Some(d) = &mut self.decider {
            d.drop_kept();
        }
        let gen = self.engine.generator()?;
        generate::generate(self.engine.model(), gen, req, on_delta)
    }

    /// One decision over `req.choices` ([`crate::choice`]); with the prefix cache on it restores and keeps the prefix
    /// state. Refused (harmlessly: nothing runs, nothing is kept) unless the session was opened with decisions on.
    pub fn decide(&mut self, req: &DecideRequest) -> Result<DecideAnswer, DecideError> {
        if !self.opts.decide {
            return Err(DecideError::unsupported(
                req.id.clone(),
                "decide requests need a session opened with --decide".into(),
            ));
        }
        let gen = self
            .engine
            .generator()
            .map_err(|e| DecideError::server(req.id.clone(), e.message.clone()))?;
        let decider = self
            .decider
            .get_or_insert_with(|| DecideSession::new(gen.decide_prompt(), self.opts.prefix_cache));
        decider.decide(self.engine.model(), &gen.tokenizer, req)
    }

    /// The ids of the kept prefix state, if one is kept.
    pub fn kept_prefix(&self) -> Option<&[u32]> {
        self.decider.as_ref().and_then(|d| d.kept_ids())
    }

    /// Answers one input line: `out` gets every output line (deltas, then exactly one answer or error), each one JSON
    /// value.
    pub fn handle_line(&mut self, line: &str, out: &mut dyn FnMut(&J)) {
        let v: J = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                let e = GenerateError::invalid(format!("the line is not JSON: {e}"));
                out(&error_line(&J::Null, &e));
                return;
            }
        };
        let id = v.get("id").cloned().unwrap_or(J::Null);
        let answer = match v.get("cmd").and_then(J::as_str) {
            Some("generate") => self.generate_line(&v, &id, out),
            Some("decide") => self.decide_line(&v),
            Some(other) => Err(GenerateError::invalid(format!(
                "unknown \"cmd\" {other:?}: expected \"generate\" or \"decide\""
            ))),
            None => Err(GenerateError::invalid(
                "each line needs a \"cmd\": \"generate\" or \"decide\"",
            )),
        };
        match answer {
            Ok(a) => out(&a),
            Err(e) => out(&error_line(&id, &e)),
        }
    }

    fn generate_line(
        &mut self,
        v: &J,
        id: &J,
        out: &mut dyn FnMut(&J),
    ) -> Result<J, GenerateError> {
        let req = parse_generate(v)?;
        let stream = req.stream;
        let g = self.generate(&req, &mut |d| {
            if stream {
                out(&json!({"id": id, "delta": d}));
            }
            true
        })?;
        Ok(g.to_json(id))
    }

    /// A `{"cmd": "decide", ...}` line.
    fn decide_line(&mut self, v: &J) -> Result<J, GenerateError> {
        let as_line = |e: DecideError| GenerateError {
            kind: e.type_name(),
            message: e.message,
        };
        let req = DecideRequest::from_json(v, &["cmd"]).map_err(as_line)?;
        self.decide(&req).map(|a| a.to_json()).map_err(as_line)
    }
}
