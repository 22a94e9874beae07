//! This machine's memory read bandwidth: a parallel xor-reduce over a buffer of MB megabytes (default
//! 1024, far larger than any cache), best of 5 after a warm-up, each task reading its 1 MiB chunk with
//! eight independent 64-byte accumulators (AVX-512 where present) so no core is bound by its own
//! loop. Prints one JSON object.
//!
//!     cargo run --release -p onepass-kernels --example mem_read [-- MB]

#[path = "common/mem.rs"]
mod mem;

fn main() {
    let mb: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let bytes = mb << 20;
    let src: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    mem::read_gbs(&src, 1);
    println!(
        "{{\"read_gbs\": {:.3}, \"bytes\": {bytes}, \"threads\": {}}}",
        mem::read_gbs(&src, 5),
        rayon::current_num_threads()
    );
}
