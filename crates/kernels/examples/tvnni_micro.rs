use onepass_kernels::{ternary_matmul_t_with, TernaryPath};
use std::time::Instant;
fn main() {
    let a: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, k, reps) = (a[0], a[1], a[2]);
    let mut s = 12345u64;
    let w: Vec<u8> = (0..n * k / 128 * 34).map(|i| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; if i % 34 < 2 { if i % 34 == 0 { 0x00 } else { 0x20 } } else { s as u8 } }).collect();
    for t in [1usize, 4] {
        let x: Vec<f32> = (0..t * k).map(|i| ((i % 17) as f32 - 8.0) * 0.1).collect();
        let mut y = vec![0f32; t * n];
        for p in [TernaryPath::Avx512Vnni, TernaryPath::Avx512] {
            ternary_matmul_t_with(p, &x, t, &w, n, k, &mut y);
            let t0 = Instant::now();
            for _ in 0..reps { ternary_matmul_t_with(p, &x, t, &w, n, k, &mut y); }
            let sec = t0.elapsed().as_secs_f64() / reps as f64;
            println!("{p:?} T={t}: {:.1} us, {:.2} Gweight-rows/s/thread-set, {:.2} weights/cycle@2.6GHz", sec*1e6, (n*k) as f64/sec/1e9, (n*k*t) as f64/sec/2.6e9);
        }
    }
}
