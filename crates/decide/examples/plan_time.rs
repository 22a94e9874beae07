//! Host-side time of one System One request: parse, render, plan, and the tokenizer's encode of
//! the rendered state. `cargo run --release -p onepass-decide --example plan_time -- <model dir>
//! <request.json> [--dump-context <file>]`. Prints the best of several rounds (other work on the
//! machine only ever makes a round slower).
use std::time::Instant;

fn best_ms(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t0.elapsed().as_secs_f64() * 1e3 / iters as f64);
    }
    best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: plan_time <model dir> <request.json> [--dump-context <file>]".into());
    }
    let dir = std::path::Path::new(&args[1]);
    let body = std::fs::read(&args[2])?;
    let e = onepass_decide::Engine::load(dir, Default::default())?;
    let req = onepass_decide::parse_request(&body)?;
    let ctx = onepass_decide::render::render_state(&req.state);
    if let (Some("--dump-context"), Some(path)) = (args.get(3).map(String::as_str), args.get(4)) {
        std::fs::write(path, &ctx)?;
    }
    let (rounds, iters) = (7, 10);
    let parse = best_ms(rounds, iters, || {
        onepass_decide::parse_request(&body).expect("parse");
    });
    eprintln!("parse        {parse:.3} ms");
    let plan = best_ms(rounds, iters, || {
        e.plan(&req).expect("plan");
    });
    eprintln!("plan         {plan:.3} ms");
    let render = best_ms(rounds, iters, || {
        onepass_decide::render::render_state(&req.state);
    });
    eprintln!(
        "render_state {render:.3} ms ({} chars)",
        ctx.chars().count()
    );
    let tok = onepass_tokenizer::Tokenizer::from_dir(dir, None)?.transformers_compatible();
    let n = tok.encode(&ctx)?.len();
    let encode = best_ms(rounds, iters, || {
        tok.encode(&ctx).expect("encode");
    });
    eprintln!(
        "encode       {encode:.3} ms ({n} tokens, {:.2} us/token)",
        encode * 1e3 / n as f64
    );
    Ok(())
}
