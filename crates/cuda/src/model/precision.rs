//! The arithmetic modes: [`Precision`] (mixed, split, half, bf16, f32), which projections multiply both bf16 planes in the
//! modes that split ([`SplitGemms`], over the model crate's [`Projection`]s), and each precision's tensor-core
//! arithmetic ([`TcArith::for_precision`]).

use super::*;

/// The arithmetic of the projections (GEMMs) and their inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// bf16 weights; each GEMM input (f32) split into two bf16 planes, hi + lo, both multiplied (f32
    /// accumulation): activations carried to about 2^-16 instead of bf16's 2^-8, at twice the GEMM work. The input
    /// projections run one GEMM over K = 2K (`[hi | lo]` rows times their weight stored twice per row, `[W | W]`),
    /// the residual ones one GEMM of 2N rows whose halves the next norm adds ([`SplitGemms`] picks the projections
    /// that take both planes). Attention's products the same way (bf16x3), the gated delta rule's in 3xTF32. On the
    /// bf16 answer fixtures plain bf16 inputs move System One probabilities by up to 1.7e-2 against the CPU, split
    /// by 5.8e-5 (docs/cuda.md, "Precision modes"). The closest to the CPU of the serving modes.
    Bf16Split,
    /// [`Precision::Bf16Split`]'s GEMMs (every projection on both bf16 planes) with the tensor-core kernels (gated
    /// delta rule, attention) in 1xTF32: within the ship bar of the CPU's float32 answers (max |dp| 0.02, mean
    /// 0.002) in every check, 3-8% less time per request than split. What [`Precision::Half`] falls back to on a
    /// model it does not fit. Leaving any projection's input in bf16 (attention's, the MLP's down) failed the bar on
    /// the 0.8B shape's longest request (docs/cuda.md, "Precision modes").
    Mixed,
    /// The default: the fastest mode that met the ship bar in every check (the test checkpoints' bf16 twins on their
    /// fixtures and on random requests, the 0.8B shape's three bench workloads; docs/cuda.md, "Precision modes").
    /// Every projection on f16 inputs and f16 weights, one GEMM each where [`Precision::Mixed`] multiplies both bf16
    /// planes: f16 carries 11 significant bits (the inputs to 2^-11 relative, 8x closer than bf16), and every bf16
    /// weight within 2^31 of its matrix's largest exactly (each matrix scaled by a power of two into f16's range,
    /// undone by the GEMM's alpha). f16's range is the catch: a norm's output (the input projections' input) is at
    /// most sqrt(K) times its largest gain, which the upload checks against it; each residual projection's input
    /// (SwiGLU, the gated norm, attention) has a bound the upload derives from the weights, and its producer stores
    /// it times the power of two that puts that bound inside f16's range (the weight's shift raised to undo it).
    /// Residual projections named by `--gpu-split-gemms` at upload, or stored in a block format, stay on both bf16
    /// planes as in mixed. A model this does not fit (block-format input projections, any rotated projection, f32
    /// weights bf16 does not hold, a gain past the bound, a bound out of reach) is uploaded in [`Precision::Mixed`]
    /// instead ([`crate::CudaModel::precision_fallback`] says why).
    #[default]
    Half,
    /// bf16 weights and GEMM inputs, f32 accumulation, and the tensor-core kernels (gated delta rule,
    /// attention) in 1xTF32 ([`TcArith::for_precision`]); norms, gates and the recurrent state f32. The fastest.
    Bf16,
    /// f32 weights and GEMM inputs, f32 GEMMs without TF32: the CPU model's arithmetic up to reduction
    /// order. For checking the forward (tests hold it to 1e-4 of the CPU), not for speed.
    F32,
}

/// Which projections multiply both bf16 planes of their input in split and mixed precision; the others multiply the
/// hi plane alone (a plain bf16 GEMM: half the work, the input rounded to bf16 as in [`Precision::Bf16`]). In the
/// half precision, the residual projections that stay on both planes instead of f16, fixed at upload
/// ([`crate::CudaOptions::split_gemms`]; by default none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitGemms(u8);

/// The form of the GEMMs' inputs and weights a precision runs: what the layers, the upload and the scratch follow
/// (the precisions that share a form differ only in their tensor-core kernels' arithmetic, [`TcArith`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmInputs {
    /// f32 weights and activations.
    F32,
    /// bf16 weights, activations rounded to bf16.
    Bf16,
    /// bf16 weights, activations carried as hi and lo bf16 planes (split and mixed precision).
    Split,
    /// Every projection's weights and inputs f16 (the weights scaled, [`crate::ops::W::Half`], the residual
    /// projections' inputs too), except residual projections the upload kept on both bf16 planes as
    /// [`GemmInputs::Split`] (half precision).
    Half,
}

impl Precision {
    /// The form of this precision's GEMM inputs.
    pub fn inputs(self) -> GemmInputs {
        match self {
            Precision::Bf16Split | Precision::Mixed => GemmInputs::Split,
            Precision::Half => GemmInputs::Half,
            Precision::Bf16 => GemmInputs::Bf16,
            Precision::F32 => GemmInputs::F32,
        }
    }

    /// Whether the residual projections' inputs can carry hi and lo bf16 planes ([`GemmInputs::Split`] and
    /// [`GemmInputs::Half`]): the projections of [`SplitGemms`] multiplying both planes.
    pub fn planes(self) -> bool {
        matches!(self.inputs(), GemmInputs::Split | GemmInputs::Half)
    }

    /// Every precision, the default first.
    pub const ALL: [Precision; 5] = [
        Precision::Half,
        Precision::Mixed,
        Precision::Bf16Split,
        Precision::Bf16,
        Precision::F32,
    ];

    /// The precision `--gpu-precision` names `s` ([`Precision::name`]).
    pub fn from_name(s: &str) -> Option<Self> {
        Precision::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The name `--gpu-precision` takes.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Mixed => "mixed",
            Precision::Bf16Split => "split",
            Precision::Half => "half",
            Precision::Bf16 => "bf16",
            Precision::F32 => "f32",
        }
    }
}

/// A `--gpu-split-gemms` spec [`SplitGemms::parse`] does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?}: expected all, none, or projections (comma-separated): gdn_in, gdn_out, attn_in, attn_out, mlp_in, \
     mlp_out"
)]
pub struct SplitGemmsError(pub String);

impl Default for SplitGemms {
    fn default() -> Self {
        SplitGemms::ALL
    }
}

impl SplitGemms {
    /// Every projection on both planes.
    pub const ALL: SplitGemms = SplitGemms(0x3f);
    /// None: every GEMM input rounded to bf16.
    pub const NONE: SplitGemms = SplitGemms(0);

    pub fn of(ps: &[Projection]) -> Self {
        SplitGemms(ps.iter().fold(0, |m, p| m | 1 << *p as u8))
    }

    pub fn has(self, p: Projection) -> bool {
        self.0 & 1 << p as u8 != 0
    }

    /// `all`, `none`, or a comma-separated list of [`Projection`] names.
    pub fn parse(spec: &str) -> Result<Self, SplitGemmsError> {
        match spec.trim() {
            "all" => return Ok(SplitGemms::ALL),
            "none" => return Ok(SplitGemms::NONE),
            _ => {}
        }
        let ps = spec
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|part| {
                Projection::ALL
                    .into_iter()
                    .find(|p| p.name() == part)
                    .ok_or_else(|| SplitGemmsError(part.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SplitGemms::of(&ps))
    }

    /// For a device description: "all", "none", or the names.
    pub fn describe(self) -> String {
        match self {
            SplitGemms::ALL => "all".into(),
            SplitGemms::NONE => "none".into(),
            s => Projection::ALL
                .into_iter()
                .filter(|p| s.has(*p))
                .map(Projection::name)
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

impl TcArith {
    /// The default for a precision:
    /// - f32: 3xTF32 everywhere (f32 accuracy; the mode checks the forward against the CPU).
    /// - split: the gated delta kernels in 3xTF32, attention in bf16x3, which carries its operands as the split
    ///   GEMMs carry theirs (about 2^-17) and is the faster of the two high-precision attentions (H200, 3,400-token
    ///   prefix: 782 µs against 1,030; the bf16 twins' answers 5.78e-5 against 5.84e-5 max |dp| in the same run).
    /// - bf16: 1xTF32 everywhere (its point is speed; 1xTF32 attention, 584 µs there, beats one bf16 product, 618,
    ///   whose per-tile conversion costs more than the halved mma count saves). Measured (fifth measurement,
    ///   docs/benchmarks/history/cuda-systemone-2026-11-30.md): 1xTF32 kernels take split-mode requests from 4.98 / 10.61 / 37.86 to
    ///   4.64 / 9.14 / 32.39 ms and the bf16 twins' answers from max |dp| 5.9e-5 to 2.6e-3 (mean 1.3e-5 to 6.4e-4).
    /// - mixed: 1xTF32 everywhere, as bf16 (with every projection split, its answers stay inside the ship bar).
    /// - half: 1xTF32 gated delta kernels, attention on an f16 KV cache ([`AttnArith::F16`]; the upload keeps f32
    ///   caches and 1xTF32 attention where the weights' bound or the shapes do not allow it). On one H100 it halves
    ///   attention (3,400-token prefix: 290 µs against 581 for 1xTF32) with the same 11 significant bits.
    pub fn for_precision(p: Precision) -> Self {
        match p {
            Precision::Half => TcArith {
                attn: AttnArith::F16,
                ..TcArith::all(Arith::Tf32)
            },
            Precision::Bf16 | Precision::Mixed => TcArith::all(Arith::Tf32),
            Precision::Bf16Split => TcArith {
                attn: AttnArith::Bf16x3,
                ..TcArith::all(Arith::X3)
            },
            Precision::F32 => TcArith::all(Arith::X3),
        }
    }
}
