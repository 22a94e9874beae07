//! Generation through the library API (`Session::generate`, the session line protocol) on synthetic checkpoints
//! with the real Qwen3.5 tokenizer: greedy tokens against transformers `generate(do_sample=False)` in float32
//! (tests/fixtures/generate, tools/oracle/generate_fixtures.py), seeded sampling, end-of-sequence ids, stop strings,
//! streaming, the context limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{array, copy_tokenizer, jsonl, process_dir, root};
use onepass_decide::generate::{Finish, GenerateRequest, Input};
use onepass_decide::{Engine, EngineOptions, SessionOptions};
use onepass_model::synth;
use serde_json::{json, Value as J};

fn fixtures() -> PathBuf {
    root().join("tests/fixtures/generate")
}

fn manifest() -> &'static J {
    static M: OnceLock<J> = OnceLock::new();
    M.get_or_init(|| {
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap())
            .unwrap()
    })
}

/// A checkpoint folder: `preset`'s weights (with `max_positions` when given), the real tokenizer, the fixtures' chat
/// template, and `extra` files.
fn checkpoint(
    name: &str,
    preset: &str,
    max_positions: Option<usize>,
    extra: &[(&str, &str)],
) -> PathBuf {
    let dir = process_dir().join(format!("gen-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut spec = synth::preset(preset).unwrap();
    if let Some(n) = max_positions {
        spec.max_position_embeddings = n;
    }
    synth::write_checkpoint(&spec, &dir, &mut |_, _| {}).unwrap();
    copy_tokenizer(&dir);
    std::fs::write(
        dir.join("chat_template.jinja"),
        manifest()["chat_template"].as_str().unwrap(),
    )
    .unwrap();
    for (f, text) in extra {
        std::fs::write(dir.join(f), text).unwrap();
    }
    dir
}

fn engine(dir: &Path) -> Engine {
    Engine::load(dir, EngineOptions::default()).unwrap()
}

fn tiny() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| engine(&checkpoint("tiny", "tiny-qwen-vocab", None, &[])))
}

fn run(e: &Engine, req: &GenerateRequest) -> (onepass_decide::Generation, Vec<String>) {
    let mut deltas = Vec::new();
    let g = e
        .session(SessionOptions::default())
        .generate(req, &mut |d| {
            deltas.push(d.to_string());
            true
        })
        .unwrap();
    (g, deltas)
}

fn input_of(case: &J) -> Input {
    match case.get("prompt") {
        Some(p) => Input::Prompt(p.as_str().unwrap().to_string()),
        None => Input::Messages(
            case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap().to_string(),
                        m["content"].as_str().unwrap().to_string(),
                    )
                })
                .collect(),
        ),
    }
}

/// The gate: greedy generation is token-identical to transformers in float32, the prompt ids too.
#[test]
fn greedy_matches_transformers() {
    let mut engines: Vec<(String, Engine)> = Vec::new();
    let mut cases = 0;
    for case in jsonl(&fixtures().join("greedy.jsonl")) {
        let preset = case["preset"].as_str().unwrap();
        if !engines.iter().any(|(p, _)| p == preset) {
            let dir = checkpoint(&format!("oracle-{preset}"), preset, None, &[]);
            let digest = {
                use sha2::Digest;
                format!(
                    "{:x}",
                    sha2::Sha256::digest(std::fs::read(dir.join("model.safetensors")).unwrap())
                )
            };
            let m = &manifest()["presets"][preset];
            assert_eq!(
                digest,
                m["model_safetensors_sha256"].as_str().unwrap(),
                "{preset}: checkpoint changed"
            );
            let e = engine(&dir);
            let eos: Vec<u64> = e
                .generator()
                .unwrap()
                .eos
                .iter()
                .map(|&x| x as u64)
                .collect();
            let want: Vec<u64> = array(&m["eos_token_id"], |x| x.as_u64().unwrap());
            assert_eq!(eos, want, "{preset}: end-of-sequence ids");
            engines.push((preset.to_string(), e));
        }
        let e = &engines.iter().find(|(p, _)| p == preset).unwrap().1;
        let name = case["name"].as_str().unwrap();
        let input = input_of(&case);
        let ids = e.generator().unwrap().prompt_ids(&input).unwrap();
        let want_ids: Vec<u32> = common::u32s(&case["prompt_ids"]);
        assert_eq!(ids, want_ids, "{preset} {name}: prompt ids");
        let want = common::u32s(&case["tokens"]);
        let req = GenerateRequest {
            input,
            ..GenerateRequest::greedy("", manifest()["max_new_tokens"].as_u64().unwrap() as usize)
        };
        let (g, _) = run(e, &req);
        assert_eq!(g.tokens, want, "{preset} {name}: generated tokens");
        assert!(
            want.len() >= 32,
            "{preset} {name}: the gate needs at least 32 tokens, the fixture has {}",
            want.len()
        );
        cases += 1;
    }
    assert!(cases >= 6, "{cases} cases");
}

#[test]
fn seeded_sampling_reproduces() {
    let e = tiny();
    let req = |seed| GenerateRequest {
        temperature: Some(1.0),
        top_p: Some(0.9),
        top_k: Some(50),
        seed: Some(seed),
        ..GenerateRequest::greedy("Once upon a time", 24)
    };
    let (a, _) = run(e, &req(7));
    let (b, _) = run(e, &req(7));
    let (c, _) = run(e, &req(8));
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
    assert_ne!(a.tokens, c.tokens, "another seed, another sample");
    let (g, _) = run(e, &GenerateRequest::greedy("Once upon a time", 24));
    assert_ne!(
        a.tokens, g.tokens,
        "sampling at temperature 1 is not greedy"
    );
}

/// `req`'s tokens the plain way, on `e`'s backend: the prompt prefilled in chunks, then one `step_logits` and one
/// host `sample` per token (the rng continuing from the first draw), until an end-of-sequence id or `max_tokens`.
fn host_steps<B: onepass_engine::Backend>(e: &Engine<B>, req: &GenerateRequest) -> Vec<u32> {
    use onepass_decide::generate::{sample, Rng, Sampling, PREFILL_CHUNK};
    let gen = e.generator().unwrap();
    let b = e.model();
    let ids = gen.prompt_ids(&req.input).unwrap();
    let mut st = b.new_state().unwrap_or_else(|_| panic!("state"));
    let logits = b
        .extend(
            &mut st,
            &ids,
            PREFILL_CHUNK,
            &[ids.len() - 1],
            onepass_engine::Pick::Full,
        )
        .unwrap_or_else(|_| panic!("prefill"))
        .pop()
        .unwrap();
    let s = Sampling {
        temperature: req.temperature.unwrap(),
        top_k: req.top_k.unwrap(),
        top_p: req.top_p.unwrap(),
    };
    let mut rng = Rng::new(req.seed.unwrap());
    let mut tokens = vec![sample::sample(&logits, &s, &mut rng)];
    while tokens.len() < req.max_tokens && gen.eos.binary_search(tokens.last().unwrap()).is_err() {
        let l = b
            .step_logits(&mut st, *tokens.last().unwrap())
            .unwrap_or_else(|_| panic!("step"));
        tokens.push(sample::sample(&l, &s, &mut rng));
    }
    tokens
}

/// Seeded requests under several settings (the whole distribution, top-k, top-p, both).
fn sampled_requests() -> Vec<GenerateRequest> {
    [
        (1.0f32, 0usize, 1.0f32, 1u64),
        (0.8, 50, 1.0, 2),
        (1.0, 0, 0.9, 3),
        (1.2, 40, 0.95, 4),
    ]
    .into_iter()
    .map(|(t, k, p, seed)| GenerateRequest {
        temperature: Some(t),
        top_k: Some(k),
        top_p: Some(p),
        seed: Some(seed),
        ..GenerateRequest::greedy("Once upon a time", 20)
    })
    .collect()
}

/// A seeded generation (its steps through `Backend::sample_steps`) gives the tokens of the plain host loop: the
/// generator continues from the first token's draw, one number per step.
#[test]
fn seeded_sampling_is_the_host_loop() {
    let e = tiny();
    for req in sampled_requests() {
        let (g, _) = run(e, &req);
        assert_eq!(g.tokens, host_steps(e, &req), "{:?}", req.seed);
    }
}

/// The stream adds up to the text, the text is the tokens decoded (nothing lost or replaced at a character split),
/// and a stop string cuts the text before it.
#[test]
fn streaming_and_stop_strings() {
    let e = tiny();
    let tok = &e.generator().unwrap().tokenizer;
    let (g, deltas) = run(e, &GenerateRequest::greedy("The weather today", 40));
    assert_eq!(deltas.concat(), g.text);
    let eos = &e.generator().unwrap().eos;
    let body: Vec<u32> = g
        .tokens
        .iter()
        .copied()
        .filter(|t| !eos.contains(t))
        .collect();
    assert_eq!(g.text, tok.decode(&body).unwrap());
    assert_eq!(
        g.finish,
        if g.tokens.len() < 40 {
            Finish::Stop
        } else {
            Finish::Length
        }
    );
    // A stop string from the middle of that text.
    let chars: Vec<(usize, char)> = g.text.char_indices().collect();
    assert!(chars.len() > 8, "text too short to cut: {:?}", g.text);
    let (a, b) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 3].0);
    let stop = g.text[a..b].to_string();
    let first = g.text.find(&stop).unwrap();
    let (s, sd) = run(
        e,
        &GenerateRequest {
            stop: vec!["\u{1}never".into(), stop.clone()],
            ..GenerateRequest::greedy("The weather today", 40)
        },
    );
    assert_eq!(s.text, g.text[..first]);
    assert_eq!(sd.concat(), s.text);
    assert_eq!(s.finish, Finish::Stop);
    assert!(s.tokens.len() <= g.tokens.len() && g.tokens.starts_with(&s.tokens));
}

/// A model whose head is wider than its tokenizer (`tiny-qwen-vocab`'s 248,320 rows with the synthetic tokenizer's
/// 19,934 tokens) generates ids the tokenizer has no token for: the generation goes on, and they add no text (the text
/// is the decoding of the ids the tokenizer knows, as transformers' decode skips the others).
#[test]
fn ids_past_the_tokenizer_add_no_text() {
    let dir = process_dir().join("gen-synthetic-tokenizer");
    std::fs::create_dir_all(&dir).unwrap();
    let spec = synth::preset("tiny-qwen-vocab").unwrap();
    synth::write_checkpoint(&spec, &dir, &mut |_, _| {}).unwrap();
    // What `onepass synth` writes without --tokenizer.
    let n = spec
        .vocab_size
        .min(onepass_tokenizer::synthetic_max_vocab());
    std::fs::write(
        dir.join("tokenizer.json"),
        onepass_tokenizer::synthetic_tokenizer_json(n).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        onepass_tokenizer::synthetic_tokenizer_config_json(),
    )
    .unwrap();
    let e = engine(&dir);
    let tok = &e.generator().unwrap().tokenizer;
    let vocab = onepass_decide::engine::Backend::vocab_size(e.model());
    assert!(
        tok.vocab_size() < vocab,
        "the synthetic tokenizer is narrower than the head"
    );
    for req in [
        GenerateRequest::greedy("Hello there", 40),
        GenerateRequest {
            input: Input::Messages(vec![("user".into(), "Hi".into())]),
            ..GenerateRequest::greedy("", 40)
        },
    ] {
        let (g, deltas) = run(&e, &req);
        assert!(g.tokens.iter().all(|&t| (t as usize) < vocab));
        let known: Vec<u32> = g
            .tokens
            .iter()
            .copied()
            .filter(|&t| {
                (t as usize) < tok.vocab_size() && !e.generator().unwrap().eos.contains(&t)
            })
            .collect();
        assert!(
            known.len() < g.tokens.len(),
            "no id past the tokenizer: {:?}",
            g.tokens
        );
        assert_eq!(g.text, tok.decode(&known).unwrap());
        assert_eq!(deltas.concat(), g.text);
    }
}

/// A character split over several byte-level tokens never reaches a delta half-made.
#[test]
fn deltas_never_split_a_character() {
    let e = tiny();
    let tok = &e.generator().unwrap().tokenizer;
    let text = "a🦀b漢字é\u{10FFFF}z";
    let ids = tok.encode(text).unwrap();
    assert!(
        ids.len() > text.chars().count() - 3,
        "the test needs characters that take several tokens: {ids:?}"
    );
    let mut s = onepass_decide::generate::text::TextStream::new(tok, &[]);
    let mut out = Vec::new();
    for &id in &ids {
        s.push(id).unwrap();
        out.push(s.delta());
    }
    out.push(s.finish().unwrap());
    assert!(out.iter().all(|d| !d.contains('\u{FFFD}')), "{out:?}");
    assert_eq!(out.concat(), text);
}

#[test]
fn eos_from_generation_config_and_the_context_limit() {
    let e = tiny();
    let (g, _) = run(e, &GenerateRequest::greedy("Hello", 3));
    let first = g.tokens[0];
    // generation_config.json names the first greedy token as an end of sequence: the generation stops on it.
    let dir = checkpoint(
        "eos",
        "tiny-qwen-vocab",
        Some(40),
        &[(
            "generation_config.json",
            &json!({"eos_token_id": [first]}).to_string(),
        )],
    );
    let e2 = engine(&dir);
    let (s, d) = run(&e2, &GenerateRequest::greedy("Hello", 3));
    assert_eq!(
        (s.tokens.clone(), s.text.as_str(), s.finish),
        (vec![first], "", Finish::Stop)
    );
    assert!(d.is_empty());
    // 40 positions: a prompt of 40 ids is refused, one of 36 gets 4 tokens and ends with `length`.
    let long = "word ".repeat(60);
    let ids = e2
        .generator()
        .unwrap()
        .prompt_ids(&Input::Prompt(long.clone()))
        .unwrap();
    assert!(ids.len() >= 40);
    let err = e2
        .session(SessionOptions::default())
        .generate(&GenerateRequest::greedy(&long, 3), &mut |_| true)
        .unwrap_err();
    assert_eq!(err.kind, "context_length", "{}", err.message);
    let tok = &e2.generator().unwrap().tokenizer;
    let p36 = tok.decode(&ids[..36]).unwrap();
    assert_eq!(
        e2.generator()
            .unwrap()
            .prompt_ids(&Input::Prompt(p36.clone()))
            .unwrap()
            .len(),
        36
    );
    let (s, _) = run(
        &e2,
        &GenerateRequest {
            temperature: Some(1.0),
            seed: Some(1),
            ..GenerateRequest::greedy(&p36, 100)
        },
    );
    let eos = &e2.generator().unwrap().eos;
    assert!(
        s.finish == Finish::Length && s.tokens.len() == 4 || eos.contains(s.tokens.last().unwrap())
    );
}

/// The line protocol: one answer line per request, deltas before it when streaming, errors as lines.
#[test]
fn session_lines() {
    let e = tiny();
    let mut s = e.session(SessionOptions::default());
    let mut lines = |line: &str| {
        let mut out = Vec::new();
        s.handle_line(line, &mut |v| out.push(v.clone()));
        out
    };
    let r =
        lines(r#"{"cmd":"generate","id":7,"prompt":"Hi there","max_tokens":5,"temperature":0}"#);
    assert_eq!(r.len(), 1);
    let a = &r[0];
    let keys: Vec<&str> = a.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "id",
            "text",
            "tokens",
            "finish_reason",
            "n_prompt",
            "n_generated",
            "prefill_ms",
            "decode_tok_s"
        ]
    );
    assert_eq!(a["id"], 7);
    assert_eq!(a["n_generated"], a["tokens"].as_array().unwrap().len());
    let r2 = lines(
        r#"{"cmd":"generate","id":"s","prompt":"Hi there","max_tokens":5,"temperature":0,"stream":true}"#,
    );
    let (last, deltas) = r2.split_last().unwrap();
    assert_eq!(
        last["tokens"], a["tokens"],
        "streaming changes nothing about the answer"
    );
    let text: String = deltas
        .iter()
        .map(|d| {
            assert_eq!(d["id"], "s");
            d["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, last["text"].as_str().unwrap());
    for (line, kind) in [
        ("not json", "invalid_request"),
        (r#"{"cmd":"dance","id":1}"#, "invalid_request"),
        (r#"{"id":1}"#, "invalid_request"),
        (r#"{"cmd":"generate","id":1}"#, "invalid_request"),
        (
            r#"{"cmd":"generate","id":1,"prompt":"x","max_tokens":-1}"#,
            "invalid_request",
        ),
        (
            r#"{"cmd":"decide","id":1,"prefix":"a","suffix":"b","choices":["A"]}"#,
            "unsupported",
        ),
    ] {
        let r = lines(line);
        assert_eq!(r.len(), 1, "{line}");
        assert_eq!(r[0]["error"]["type"], kind, "{line}: {}", r[0]);
        assert!(r[0]["error"]["message"].as_str().unwrap().len() > 10);
    }
    // The session went on: the same request answers the same.
    let again =
        lines(r#"{"cmd":"generate","id":7,"prompt":"Hi there","max_tokens":5,"temperature":0}"#);
    assert_eq!(again[0]["tokens"], a["tokens"]);
}

/// The fixture cases on the GPU (f32 mode, graphs on: every decode step after the first replays a captured graph):
/// the same tokens as transformers and the CPU, the stream adding up to the text. GPU test.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn cuda_greedy_matches_transformers() {
    use onepass_engine::{AnyBackend, CudaOptions};
    let mut checked = 0;
    let mut engines: Vec<(String, Engine<AnyBackend>)> = Vec::new();
    for case in jsonl(&fixtures().join("greedy.jsonl")) {
        let preset = case["preset"].as_str().unwrap();
        if !engines.iter().any(|(p, _)| p == preset) {
            let dir = checkpoint(&format!("cuda-{preset}"), preset, None, &[]);
            let m = onepass_model::Model::load(&dir).unwrap();
            let mt = m.config().model_type.clone();
            let opts = CudaOptions {
                precision: onepass_cuda::Precision::F32,
                ..CudaOptions::default()
            };
            let b = AnyBackend::cuda(&m, &opts).expect("a CUDA GPU");
            drop(m);
            engines.push((
                preset.to_string(),
                Engine::from_dir_with(&dir, &mt, b, EngineOptions::default()).unwrap(),
            ));
        }
        let e = &engines.iter().find(|(p, _)| p == preset).unwrap().1;
        let name = case["name"].as_str().unwrap();
        let want = common::u32s(&case["tokens"]);
        let req = GenerateRequest {
            input: input_of(&case),
            ..GenerateRequest::greedy("", manifest()["max_new_tokens"].as_u64().unwrap() as usize)
        };
        let mut deltas = String::new();
        let g = e
            .session(SessionOptions::default())
            .generate(&req, &mut |d| {
                deltas.push_str(d);
                true
            })
            .unwrap();
        assert_eq!(
            g.tokens, want,
            "{preset} {name}: generated tokens on the GPU"
        );
        assert_eq!(deltas, g.text);
        eprintln!(
            "{preset} {name}: {} tokens, decode {:.1} tok/s",
            g.tokens.len(),
            g.decode_tok_s
        );
        checked += 1;
    }
    assert!(checked >= 6);
}

/// Seeded sampling on the GPU (every step's token drawn on the device, a step ahead of the host): the tokens of the
/// per-step host path on the same GPU (its logits to the host, the host's `sample`), in f32 mode and in the default
/// mode (mixed: its own decode path, a CUDA graph per step, against its own logits); in f32 mode also the CPU's
/// tokens (the default mode prints how many of the first tokens agree with them). The CPU's logits differ from f32 mode's within 1e-4, which moves a
/// draw only when it falls that close to a boundary between two candidates. GPU test.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn cuda_seeded_sampling_matches_host_steps_and_cpu() {
    use onepass_cuda::Precision;
    use onepass_engine::{AnyBackend, CudaOptions};
    let dir = checkpoint("cuda-sample", "tiny-qwen-vocab", None, &[]);
    // The CPU's tokens, once per request.
    let cpu: Vec<Vec<u32>> = sampled_requests()
        .iter()
        .map(|req| run(tiny(), req).0.tokens)
        .collect();
    for precision in [Precision::F32, Precision::default()] {
        let m = onepass_model::Model::load(&dir).unwrap();
        let mt = m.config().model_type.clone();
        let opts = CudaOptions {
            precision,
            ..CudaOptions::default()
        };
        let b = AnyBackend::cuda(&m, &opts).expect("a CUDA GPU");
        drop(m);
        let gpu = Engine::from_dir_with(&dir, &mt, b, EngineOptions::default()).unwrap();
        for (req, cpu) in sampled_requests().iter().zip(&cpu) {
            let g = gpu
                .session(SessionOptions::default())
                .generate(req, &mut |_| true)
                .unwrap();
            let host = host_steps(&gpu, req);
            let same = g.tokens.iter().zip(cpu).take_while(|(a, b)| a == b).count();
            eprintln!(
                "{precision:?} seed {:?}: {} tokens, decode {:.1} tok/s on the GPU; the first {same} as the CPU's",
                req.seed,
                g.tokens.len(),
                g.decode_tok_s
            );
            assert_eq!(
                g.tokens, host,
                "{precision:?} seed {:?}: the GPU's draws against the host's",
                req.seed
            );
            if precision == Precision::F32 {
                assert_eq!(
                    &g.tokens, cpu,
                    "seed {:?}: the GPU against the CPU",
                    req.seed
                );
            }
        }
    }
}
