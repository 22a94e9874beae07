//! Shared by the integration tests: where the real Qwen3.5 tokenizer is, loaded once per binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use onepass_tokenizer::Tokenizer;

/// `$ONEPASS_TEST_TOKENIZER`, else `<repo>/testdata/qwen3_5-tokenizer`. Panics (the test fails,
/// it is never skipped) when the folder has no tokenizer.json.
pub fn qwen3_5_dir() -> PathBuf {
    let dir = match std::env::var_os("ONEPASS_TEST_TOKENIZER") {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("testdata/qwen3_5-tokenizer"),
    };
    assert!(
        dir.join("tokenizer.json").is_file(),
        "no Qwen3.5 tokenizer at {} (set ONEPASS_TEST_TOKENIZER or run tools/setup-testdata.sh)",
        dir.display()
    );
    dir
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The real tokenizer, loaded with `model_type = "qwen3_5"`.
pub fn qwen3_5() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = qwen3_5_dir();
        Tokenizer::from_dir(&dir, Some("qwen3_5"))
            .unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
    })
}

/// A fresh, empty folder under the system temp dir, unique to this process and `name`.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onepass-tokenizer-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}
