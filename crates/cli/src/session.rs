//! `onepass session` (JSON lines in, one JSON line out per request) and `onepass chat` (a conversation on the
//! terminal, or one prompt per line from a pipe).

use std::io::{BufRead, IsTerminal, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};

use anyhow::Result;
use onepass_decide::choice::PrefixCacheMode;
use onepass_decide::generate::{GenerateRequest, Input};
use onepass_decide::session::error_line;
use onepass_decide::{EngineOptions, GenerateError, SessionOptions};
use serde_json::Value as J;

use crate::device::{load_engine, CudaArgs, DeviceArg};

#[derive(clap::Args, Debug)]
pub struct SessionArgs {
    /// A model folder (config.json, *.safetensors weights, tokenizer.json), or a Hub repo id ORG/NAME[@REVISION]
    /// already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// Answer {"cmd": "decide"} lines (without it they are refused and nothing is kept for them).
    #[arg(long)]
    decide: bool,
    /// Keep the state after a decision's prefix and restore it when the next prefix extends it: auto (on: the
    /// prefill's cost follows the ids it reads, see docs/decide.md), on, off.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    decide_prefix_cache: String,
    #[command(flatten)]
    dev: DeviceArg,
    #[command(flatten)]
    cuda: CudaArgs,
}

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    /// A model folder (config.json, *.safetensors weights, tokenizer.json with a chat template), or a Hub repo id
    /// ORG/NAME[@REVISION] already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// A system message that opens the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// 0: greedy (default: the model's generation_config.json, else 1).
    #[arg(long)]
    temperature: Option<f32>,
    /// Seed for sampling (default: a new one each answer).
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    dev: DeviceArg,
    #[command(flatten)]
    cuda: CudaArgs,
}

/// Writes one JSON line and flushes it (a caller reads answers as they come).
fn write_line(out: &mut impl Write, v: &J) {
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

pub fn session(a: SessionArgs) -> Result<()> {
    let dir = onepass_formats::resolve_model(&a.model)?;
    let engine = load_engine(&dir, EngineOptions::default(), a.dev.resolve()?, &a.cuda)?;
    let prefix_cache = PrefixCacheMode::parse(&a.decide_prefix_cache).unwrap_or_default();
    let mut s = engine.session(SessionOptions {
        decide: a.decide,
        prefix_cache,
    });
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut answered = false;
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.handle_line(&line, &mut |v| {
                answered |= v.get("delta").is_none();
                write_line(&mut out, v)
            })
        }));
        if r.is_err() && !answered {
            let e = GenerateError::model("internal error while answering this line");
            write_line(&mut out, &error_line(&J::Null, &e));
        }
    }
    Ok(())
}

pub fn chat(a: ChatArgs) -> Result<()> {
    let dir = onepass_formats::resolve_model(&a.model)?;
    let engine = load_engine(&dir, EngineOptions::default(), a.dev.resolve()?, &a.cuda)?;
    let gen = engine.generator()?;
    if !gen.has_template() {
        anyhow::bail!(
            "{} has no chat template (chat_template.jinja or tokenizer_config.json's chat_template); \
             `onepass session` takes raw prompts",
            dir.display()
        );
    }
    let mut s = engine.session(SessionOptions::default());
    let tty = std::io::stdin().is_terminal();
    let mut history: Vec<(String, String)> = Vec::new();
    if let Some(sys) = &a.system {
        history.push(("system".into(), sys.clone()));
    }
    if tty {
        eprintln!("onepass chat: one message per line; an empty line or end of input (Ctrl-D) ends the chat");
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if tty {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        if line.trim().is_empty() {
            if tty {
                break;
            }
            continue;
        }
        history.push(("user".into(), line));
        let req = GenerateRequest {
            input: Input::Messages(history.clone()),
            max_tokens: a.max_tokens,
            temperature: a.temperature,
            top_k: None,
            top_p: None,
            seed: a.seed,
            stop: Vec::new(),
            stream: true,
        };
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let r = s.generate(&req, &mut |d| {
            let ok = out.write_all(d.as_bytes()).is_ok();
            let _ = out.flush();
            ok
        });
        let _ = writeln!(out);
        let _ = out.flush();
        match r {
            Ok(g) => history.push(("assistant".into(), g.text)),
            Err(e) => {
                history.pop();
                eprintln!("onepass chat: {}", e.message);
            }
        }
    }
    Ok(())
}
