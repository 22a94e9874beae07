//! `encode` against the generic `tokenizers` pipeline, and where the generic one spends its time.
//!
//! `cargo run --release -p onepass-tokenizer --example encode_bench -- <tokenizer dir> <text
//! file>...` prints, per file, the best of several rounds (other work on the machine only ever
//! makes a round slower) for both views: the tokenizer.json as written and
//! `transformers_compatible()`. The word cache is warm, as in a running server.
use std::time::Instant;

use onepass_tokenizer::Tokenizer;
use tokenizers::{NormalizedString, Normalizer, PreTokenizedString, PreTokenizer};

fn best_ms(mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..15 {
        let t0 = Instant::now();
        for _ in 0..5 {
            f();
        }
        best = best.min(t0.elapsed().as_secs_f64() * 1e3 / 5.0);
    }
    best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: encode_bench <tokenizer dir> <text file>...".into());
    }
    let tok = Tokenizer::from_dir(std::path::Path::new(&args[1]), None)?;
    let compat = tok.transformers_compatible();
    println!("fast path: {}", tok.has_fast_path());
    for path in &args[2..] {
        let text = std::fs::read_to_string(path)?;
        let ids = tok.encode(&text)?;
        assert_eq!(
            ids,
            tok.encode_generic(&text)?,
            "{path}: fast and generic differ"
        );
        assert_eq!(
            compat.encode(&text)?,
            compat.encode_generic(&text)?,
            "{path}: compat differ"
        );
        println!(
            "{path}: {} chars, {} tokens",
            text.chars().count(),
            ids.len()
        );
        for (view, t) in [
            ("tokenizer.json", &tok),
            ("transformers_compatible", &compat),
        ] {
            let generic = best_ms(|| drop(t.encode_generic(&text)));
            let fast = best_ms(|| drop(t.encode(&text)));
            println!(
                "  {view:<24} generic {generic:8.3} ms ({:5.2} us/token)   fast {fast:7.3} ms ({:5.3} us/token)   {:5.1}x",
                generic * 1e3 / ids.len() as f64,
                fast * 1e3 / ids.len() as f64,
                generic / fast
            );
        }
        // The generic pipeline's stages, one by one.
        let inner = tok.inner();
        let nfc = inner.get_normalizer().ok_or("no normalizer")?;
        let pre = inner.get_pre_tokenizer().ok_or("no pre-tokenizer")?;
        let tokenizers::PreTokenizerWrapper::Sequence(seq) = pre else {
            return Err("pre-tokenizer is not a Sequence".into());
        };
        let split = seq.as_ref().first().ok_or("empty Sequence")?;
        let t_nfc = best_ms(|| {
            let mut s = NormalizedString::from(text.as_str());
            nfc.normalize(&mut s).expect("nfc");
        });
        let t_split = best_ms(|| {
            let mut p = PreTokenizedString::from(text.as_str());
            split.pre_tokenize(&mut p).expect("split");
        });
        let t_pre = best_ms(|| {
            let mut p = PreTokenizedString::from(text.as_str());
            pre.pre_tokenize(&mut p).expect("pre-tokenize");
        });
        println!(
            "  generic stages: NFC {t_nfc:.3} ms, Split(regex) {t_split:.3} ms, + ByteLevel {:.3} ms",
            t_pre - t_split
        );
    }
    Ok(())
}
