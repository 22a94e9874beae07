//! CPU kernels (rayon across cores, AVX-512 / AVX2 where the processor has them).

pub(crate) mod act_q;
pub mod attention;
pub mod deltanet;
mod grouped;
pub mod hadamard;
pub mod matmul;
pub mod ops;
pub mod ptq1_0;
pub mod q8_0;
mod q8_0_amx;
#[cfg(test)]
mod q8_0_test_data;
mod q8_0_vnni;
pub(crate) mod sgemm;
pub mod ternary;
mod ternary_grouped;
mod ternary_vnni;
mod tiled;
pub mod vexp;
