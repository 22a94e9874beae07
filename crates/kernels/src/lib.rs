//! The op set the Qwen3.5 hybrid models need.
//!
//! Models call these functions and never loop over weights themselves, so that a second backend
//! (CUDA) can implement the same list and be tested op by op against this one. Every fast kernel
//! here has a slow twin in the same module (`*_reference` or the recurrent form of the gated delta
//! rule) and tests compare them on odd shapes. All arithmetic is f32; weights may be stored as
//! bf16 or f16 and are widened on the fly, or packed ternary (PQ2_0 or PTQ1_0) and decoded in
//! registers by the ternary matvec/GEMM; the blockwise Hadamard rotation those packs need is here too.
//!
//! Layout convention: `/// x: [T, K]` means a row-major buffer, outermost dimension first.

pub mod cpu;
pub mod testdata;

pub use cpu::attention::{causal_attention, causal_attention_reference, AttnShape};
pub use cpu::deltanet::{
    gated_delta_chunked, gated_delta_recurrent, gated_delta_recurrent_reference, DeltaInputs,
    DeltaShape,
};
pub use cpu::hadamard::{
    hadamard_rotate, hadamard_rotate_reference, hadamard_unrotate, hadamard_unrotate_reference,
};
pub use cpu::matmul::{dot_rows, matmul_t, matmul_t_many, matmul_t_reference, runs_grouped};
pub use cpu::ops::*;
pub use cpu::ptq1_0::{ptq1_0_matmul_t, ptq1_0_matmul_t_reference, ptq1_0_matmul_t_with};
pub use cpu::ternary::{
    ternary_matmul_t, ternary_matmul_t_reference, ternary_matmul_t_with, TernaryPath,
};
