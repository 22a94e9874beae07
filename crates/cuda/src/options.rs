//! How a [`CudaModel`](crate::CudaModel) runs: every choice a caller makes (the CLI's flags, a test's
//! comparison), passed at construction. Nothing in this crate reads the environment to pick a kernel.

use crate::model::{Precision, SplitGemms};
use crate::runtime::TcArith;

/// Which kernels run the gated delta rule of a prefill (one-token steps always take `gdn_step`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GdnKernels {
    /// The tensor-core WY pre-pass and state pass; in a tree, children of one chunk whose states are dropped take
    /// the leaf pass. The default.
    #[default]
    TensorCore,
    /// As [`GdnKernels::TensorCore`], but tree children take the state pass too (for comparing the two).
    TensorCoreNoLeaf,
    /// The f32 SIMT WY pair (for comparison); no one-forward trees.
    Simt,
}

/// Which kernel runs attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnKernels {
    /// The tensor-core kernel where it takes the head dim, else the tiled one. The default.
    #[default]
    TensorCore,
    /// The f32 SIMT tiled kernel everywhere (for comparison).
    Tiled,
}

/// How the model is uploaded and run on the GPU.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Device ordinal.
    pub device: usize,
    pub precision: Precision,
    /// Bytes of sequence state and forward scratch alive at once on the device (0: no cap).
    pub memory_budget_bytes: usize,
    /// How the tensor-core kernels multiply (`None`: the precision's default, [`TcArith::for_precision`]).
    pub kernels: Option<TcArith>,
    /// Split and mixed precision: the projections that multiply both bf16 planes of their input (`None`: all). Half
    /// precision: the residual projections stored to multiply both bf16 planes instead of f16 (`None`: none;
    /// ignored where half falls back to mixed, which then splits all).
    pub split_gemms: Option<SplitGemms>,
    pub gdn: GdnKernels,
    pub attention: AttnKernels,
    /// Prefixes and suffixes in one forward where the shapes allow (else always the two-pass path).
    pub trees: bool,
    /// CUDA graphs for repeated forward shapes.
    pub graphs: bool,
    /// Forwards padded to buckets of rows, so that requests of lengths not seen before replay a graph of their
    /// bucket ([`crate::CudaModel::set_shape_buckets`]). Off by default here (exact shapes, as the GPU tests
    /// assume); the command line turns it on unless `--gpu-no-shape-buckets` (docs/cuda.md, "Options").
    pub shape_buckets: bool,
    /// Programmatic dependent launch where the device has it (compute capability 9.0 and later): a kernel's launch
    /// and its weight prefetch overlap the tail of the kernel before ([`crate::pdl`]); off by default (the 27B
    /// decode step measured slower with it, docs/benchmarks/ternary-gpu.md). A setting of the opened
    /// [`crate::Gpu`]: the model loaded last on it sets it.
    pub pdl: bool,
    /// PQ2_0's prefill GEMM on Hopper's warpgroup mma where the device has it (compute capability 9.0; the same
    /// bits as the mma.sync kernels, faster); off keeps to those. A setting of the opened [`crate::Gpu`], as `pdl`.
    pub wgmma: bool,
    /// The device memory pool keeps freed memory for the next request ([`crate::Gpu::open`]).
    pub keep_freed_memory: bool,
    /// A sequence's results do not depend on the other sequences of its forward (batch invariance,
    /// [`crate::CudaModel::set_batch_invariant`]).
    pub batch_invariant: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            precision: Precision::default(),
            memory_budget_bytes: 16 << 30,
            kernels: None,
            split_gemms: None,
            gdn: GdnKernels::default(),
            attention: AttnKernels::default(),
            trees: true,
            graphs: true,
            shape_buckets: false,
            pdl: false,
            wgmma: true,
            keep_freed_memory: true,
            batch_invariant: false,
        }
    }
}
