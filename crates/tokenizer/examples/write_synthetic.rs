//! Write a synthetic tokenizer folder for a tiny test checkpoint:
//! `cargo run -p onepass-tokenizer --example write_synthetic -- <vocab_size> <out_dir>`.

use std::path::PathBuf;

use onepass_tokenizer::{synthetic_tokenizer_config_json, synthetic_tokenizer_json};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [vocab_size, out] = args.as_slice() else {
        return Err("usage: write_synthetic <vocab_size> <out_dir>".into());
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("tokenizer.json"),
        synthetic_tokenizer_json(vocab_size.parse()?)?,
    )?;
    std::fs::write(
        out.join("tokenizer_config.json"),
        synthetic_tokenizer_config_json(),
    )?;
    println!(
        "wrote {}/tokenizer.json and tokenizer_config.json",
        out.display()
    );
    Ok(())
}
