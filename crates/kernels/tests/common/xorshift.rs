//! A small deterministic generator for test inputs (xorshift64*): the same numbers for a seed on every machine, no
//! dependency. Shared by the kernel tests and, through `#[path]`, crates/server/tests/fuzz.rs.
#![allow(dead_code)]

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1), 24 bits.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Roughly normal, mean 0 (three uniforms summed).
    pub fn normal_ish(&mut self) -> f32 {
        (self.unit() + self.unit() + self.unit() - 1.5) * 2.0
    }

    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
