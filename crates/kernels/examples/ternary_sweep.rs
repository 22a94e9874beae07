//! A decode step's matvecs alone: every packed ternary matrix of a GGUF file (PQ2_0 or PTQ1_0, the token embedding
//! excepted: decode gathers one of its rows) times one token, in file order, as the model reads them, with the
//! memory read bandwidth measured before each sweep in the same process (the `mem_read` example's xor-reduce, best
//! of 3). What the kernels reach on the model's mix of shapes, without the rest of the model; per shape, the median
//! call's GB/s.
//!
//!     cargo run --release -p onepass-kernels --example ternary_sweep -- FILE.gguf [SWEEPS] [mapped|anon|huge]
//!
//! `mapped` (the default) reads the matrices where the file is mapped, as the model does; `anon` copies them into
//! anonymous memory first, `huge` into anonymous memory advised to use huge pages.
//!
//! Prints figures, asserts nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use onepass_formats::gguf::Gguf;
use onepass_formats::quant::GgmlType;
use onepass_kernels::{ptq1_0_matmul_t, ternary_matmul_t};

#[path = "common/mem.rs"]
mod mem;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: ternary_sweep FILE.gguf [SWEEPS] [mapped|anon|huge]");
        std::process::exit(2);
    };
    let sweeps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let mode = args.get(2).map_or("mapped", String::as_str);
    let g = match Gguf::open(Path::new(path)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    let mats: Vec<_> = g
        .tensors()
        .iter()
        .filter(|t| {
            matches!(t.ggml_type, GgmlType::PQ2_0 | GgmlType::PTQ1_0)
                && t.ne.len() == 2
                && !t.name.starts_with("token_embd")
        })
        .collect();
    let bytes: u64 = mats.iter().map(|t| t.nbytes).sum();
    println!(
        "{path}: {} packed matrices, {:.2} GB per sweep; {} threads",
        mats.len(),
        bytes as f64 / 1e9,
        rayon::current_num_threads()
    );
    // Where each matrix's bytes are read from: the mapping, or one anonymous region holding them all.
    let mut offsets = Vec::new();
    let mut total = 0usize;
    for t in &mats {
        offsets.push(total);
        total += (t.nbytes as usize).next_multiple_of(4096);
    }
    let anon = (mode != "mapped").then(|| {
        let mut m = memmap2::MmapMut::map_anon(total).expect("anonymous memory");
        if mode == "huge" {
            m.advise(memmap2::Advice::HugePage).expect("madvise");
        }
        for (t, &o) in mats.iter().zip(&offsets) {
            m[o..o + t.nbytes as usize].copy_from_slice(g.tensor_data(t));
        }
        m
    });
    println!("matrices read from: {mode}");
    let kmax = mats.iter().map(|t| t.ne[0] as usize).max().unwrap_or(0);
    let nmax = mats.iter().map(|t| t.ne[1] as usize).max().unwrap_or(0);
    let x: Vec<f32> = (0..kmax).map(|i| ((i % 17) as f32 - 8.0) * 0.1).collect();
    let mut y = vec![0f32; nmax];
    let src: Vec<u64> = (0..(1usize << 30) / 8).map(|i| i as u64).collect();
    let mut per_shape: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for sweep in 0..=sweeps {
        let read = mem::read_gbs(&src, 3);
        let t0 = Instant::now();
        for (i, t) in mats.iter().enumerate() {
            let (k, n) = (t.ne[0] as usize, t.ne[1] as usize);
            let w = match &anon {
                Some(m) => &m[offsets[i]..offsets[i] + t.nbytes as usize],
                None => g.tensor_data(t),
            };
            let c0 = Instant::now();
            match t.ggml_type {
                GgmlType::PQ2_0 => ternary_matmul_t(&x[..k], 1, w, n, k, &mut y[..n]),
                _ => ptq1_0_matmul_t(&x[..k], 1, w, n, k, &mut y[..n]),
            }
            if sweep > 0 {
                per_shape
                    .entry((n, k))
                    .or_default()
                    .push(t.nbytes as f64 / c0.elapsed().as_secs_f64() / 1e9);
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let gbs = bytes as f64 / secs / 1e9;
        let what = if sweep == 0 { "warm-up" } else { "sweep" };
        println!(
            "{what} {sweep}: memory read {read:.1} GB/s, sweep {:.1} ms, {gbs:.1} GB/s ({:.0}% of read)",
            secs * 1e3,
            100.0 * gbs / read
        );
    }
    println!("per shape (N x K): calls, median GB/s");
    for ((n, k), mut v) in per_shape {
        v.sort_by(f64::total_cmp);
        println!("  {n:>6} x {k:<6} {:>5} {:6.1}", v.len(), v[v.len() / 2]);
    }
}
