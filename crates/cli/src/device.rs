//! `--device cpu|cuda` and the GPU options (`--gpu-*`) of the commands that run the model, the engine they load,
//! and the parse-and-plan step of a request body. The CUDA paths of `logits` and `bench` are in cuda_bench.rs,
//! `bench-systemone` in bench_systemone.rs.
//!
//! The default is cuda when a usable GPU (driver, NVRTC, cuBLAS and a device) is present, else cpu;
//! asking for cuda where there is none is an error that says what is missing.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use onepass_model::Model;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArg {
    /// Where the model runs: cpu or cuda (default: cuda when a GPU is present, else cpu).
    #[arg(long)]
    pub device: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl DeviceArg {
    pub fn resolve(&self) -> Result<Device> {
        match self.device.as_deref() {
            None => Ok(if onepass_cuda::available() {
                Device::Cuda
            } else {
                Device::Cpu
            }),
            Some("cpu") => Ok(Device::Cpu),
            Some("cuda") => match onepass_cuda::probe() {
                Ok(_) => Ok(Device::Cuda),
                Err(e) => bail!("--device cuda was asked for, but {e}; use --device cpu"),
            },
            Some(other) => bail!("--device {other:?}: expected cpu or cuda"),
        }
    }
}

/// `--gpu-precision`, for every command that can run on the GPU.
#[derive(clap::Args, Clone, Debug)]
pub struct PrecisionArg {
    /// GPU arithmetic: half (the default: every product on f16 weights and activations, each scaled into f16's
    /// range; the attention and gated delta kernels in TF32; within 0.02 of float32 probabilities in every check;
    /// models it does not fit, such as quantized GGUF files, run mixed), mixed (bf16 weights, every product on
    /// activations carried as two bf16 halves: slower than half), split (mixed's products with f32-accurate
    /// attention and gated delta kernels: the closest to the CPU), bf16 (fastest, plain bf16 activations), or f32
    /// (f32 weights; for checking).
    #[arg(long, value_name = "PRECISION")]
    pub gpu_precision: Option<String>,
}

impl PrecisionArg {
    /// The precision named (unset: the default), or an error naming the choices.
    pub fn parse(&self) -> Result<onepass_cuda::Precision> {
        let Some(s) = &self.gpu_precision else {
            return Ok(onepass_cuda::Precision::default());
        };
        onepass_cuda::Precision::from_name(s).with_context(|| {
            let names: Vec<_> = onepass_cuda::Precision::ALL.map(|p| p.name()).into();
            let (last, rest) = names.split_last().expect("precisions");
            format!(
                "--gpu-precision {s:?}: expected {} or {last}",
                rest.join(", ")
            )
        })
    }

    /// What a model loaded in the precision asked for says on stderr: why it runs in another one, when the user
    /// named it (the default falls back to mixed silently; the load line names the precision either way).
    pub fn fallback_note(&self, m: &onepass_cuda::CudaModel) -> Option<String> {
        self.gpu_precision.as_ref()?;
        m.precision_fallback().map(|why| format!("note: {why}"))
    }
}

/// GPU options of the commands that run System One.
#[derive(clap::Args, Clone, Debug)]
pub struct CudaArgs {
    /// GPU memory for sequence state and forward scratch, in MiB; a request past it fails alone (cuda only).
    #[arg(long, default_value_t = 16384)]
    pub gpu_memory_mb: usize,
    #[command(flatten)]
    pub precision: PrecisionArg,
    /// Make each request's answers on the GPU independent of the other requests batched with it, bit for bit
    /// (the GPU then runs one GEMM algorithm per shape and plans attention per sequence; docs/cuda.md).
    #[arg(long)]
    pub gpu_batch_invariant: bool,
    /// Arithmetic of the tensor-core kernels, comma-separated items applied in order: 3xtf32 (f32 accuracy),
    /// tf32 (faster, less exact), a kernel that runs tf32 (prep, state, attn), or attn=3xtf32|tf32|bf16x3|bf16|f16
    /// (f16: keys and values cached in f16, where the model's weights bound them inside its range; half's default,
    /// which `tf32` turns off). Default: the precision's (docs/cuda.md).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_kernels: Option<String>,
    /// Half, mixed and split precision only: the projections that multiply both bf16 halves of their input (all,
    /// none, or comma-separated gdn_in, gdn_out, attn_in, attn_out, mlp_in, mlp_out). In mixed and split the others
    /// round it to bf16 (default: all). In half the output projections named (gdn_out, attn_out, mlp_out) take both
    /// bf16 halves instead of f16, and the input ones read f16 whatever this names (default: none).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_split_gemms: Option<String>,
    /// Kernels of the gated delta rule: tc (tensor cores, the default), tc-no-leaf (tree children take the
    /// full state pass), simt (f32 SIMT kernels, no one-forward trees).
    #[arg(long, value_enum, default_value_t = GdnArg::Tc, help_heading = EXPERT)]
    pub gpu_gdn: GdnArg,
    /// Kernel of attention: tc (tensor cores where the head dim allows, the default) or tiled (f32 SIMT).
    #[arg(long, value_enum, default_value_t = AttnArg::Tc, help_heading = EXPERT)]
    pub gpu_attention: AttnArg,
    /// Run each request's shared prefix and its suffixes as two forwards, never as one.
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_trees: bool,
    /// Launch every forward kernel by kernel (no CUDA graphs).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_graphs: bool,
    /// Run every forward at its exact number of rows. By default a forward is padded to a bucket of rows (at most 64
    /// more), so that a request of a length not seen before replays its bucket's CUDA graph instead of launching
    /// every kernel one by one.
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_shape_buckets: bool,
    /// Let a kernel start while the one before it finishes (programmatic dependent launch, compute capability 9.0
    /// and later; measured slower on the decode step so far).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_pdl: bool,
    /// Keep the ternary (PQ2_0) prefill GEMM to the older tensor-core kernels instead of Hopper's warpgroup ones
    /// (the same results, slower; for comparing the two).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_wgmma: bool,
    /// Hand freed GPU memory back to the driver at every synchronisation instead of keeping it for the next request.
    #[arg(long, help_heading = EXPERT)]
    pub gpu_release_memory: bool,
}

/// The help heading of the GPU flags most users never need.
const EXPERT: &str = "Expert GPU kernel options";

/// `--gpu-gdn`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnArg {
    Tc,
    TcNoLeaf,
    Simt,
}

/// `--gpu-attention`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnArg {
    Tc,
    Tiled,
}

impl CudaArgs {
    pub fn options(&self) -> Result<onepass_cuda::CudaOptions> {
        use onepass_cuda::{AttnKernels, GdnKernels, SplitGemms, TcArith};
        let precision = self.precision.parse()?;
        let kernels = parse_flag("--gpu-kernels", &self.gpu_kernels, TcArith::parse)?;
        let split_gemms = parse_flag(
            "--gpu-split-gemms",
            &self.gpu_split_gemms,
            SplitGemms::parse,
        )?;
        if split_gemms.is_some() && !precision.planes() {
            bail!(
                "--gpu-split-gemms applies to --gpu-precision half, mixed or split, not {}",
                precision.name()
            );
        }
        Ok(onepass_cuda::CudaOptions {
            device: 0,
            precision,
            memory_budget_bytes: self.gpu_memory_mb << 20,
            kernels,
            split_gemms,
            gdn: match self.gpu_gdn {
                GdnArg::Tc => GdnKernels::TensorCore,
                GdnArg::TcNoLeaf => GdnKernels::TensorCoreNoLeaf,
                GdnArg::Simt => GdnKernels::Simt,
            },
            attention: if self.gpu_attention == AttnArg::Tiled {
                AttnKernels::Tiled
            } else {
                AttnKernels::TensorCore
            },
            trees: !self.gpu_no_trees,
            graphs: !self.gpu_no_graphs,
            shape_buckets: !self.gpu_no_shape_buckets,
            pdl: self.gpu_pdl,
            wgmma: !self.gpu_no_wgmma,
            keep_freed_memory: !self.gpu_release_memory,
            batch_invariant: self.gpu_batch_invariant,
        })
    }
}

/// An optional flag's value through `parse`; an error names the flag.
fn parse_flag<T, E: std::fmt::Display>(
    flag: &str,
    value: &Option<String>,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<Option<T>> {
    value
        .as_deref()
        .map(parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("{flag} {e}"))
}

/// The one engine value every command holds: System One (and sessions, generation) over the model on the resolved
/// device.
pub type AnyEngine = onepass_decide::Engine<onepass_engine::AnyBackend>;

/// Loads `dir` onto `dev`: weights, tokenizer, `decider_config.json`; one stderr line says where and how long.
pub fn load_engine(
    dir: &std::path::Path,
    opts: onepass_decide::EngineOptions,
    dev: Device,
    cuda: &CudaArgs,
) -> Result<AnyEngine> {
    let t0 = Instant::now();
    let m = Model::load(dir).with_context(|| format!("loading {}", dir.display()))?;
    let model_type = m.config().model_type.clone();
    let backend = match dev {
        Device::Cpu => onepass_engine::AnyBackend::cpu(m),
        Device::Cuda => {
            let b = onepass_engine::AnyBackend::cuda(&m, &cuda.options()?)
                .with_context(|| format!("loading {} onto the GPU", dir.display()))?;
            if let Some(note) = b
                .as_cuda()
                .and_then(|c| cuda.precision.fallback_note(c.model()))
            {
                eprintln!("{note}");
            }
            b
        }
    };
    let e = onepass_decide::Engine::from_dir_with(dir, &model_type, backend, opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    eprintln!(
        "loaded {} on {} in {:.2}s",
        dir.display(),
        e.device(),
        t0.elapsed().as_secs_f64()
    );
    Ok(e)
}

/// Parse and plan one request body: the host work before the engine; a client error is the HTTP answer it would be.
pub fn plan_body<B: onepass_decide::engine::Backend>(
    e: &onepass_decide::Engine<B>,
    body: &[u8],
) -> Result<onepass_decide::Plan> {
    Ok(e.plan(&onepass_decide::parse_request(body)?)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use onepass_cuda::{Arith, AttnArith, Precision, Projection, SplitGemms, TcArith};

    fn args(precision: &str, kernels: Option<&str>) -> CudaArgs {
        CudaArgs {
            gpu_memory_mb: 64,
            precision: PrecisionArg {
                gpu_precision: Some(precision.into()),
            },
            gpu_kernels: kernels.map(str::to_string),
            gpu_split_gemms: None,
            gpu_gdn: GdnArg::Tc,
            gpu_attention: AttnArg::Tc,
            gpu_no_trees: false,
            gpu_no_graphs: false,
            gpu_no_shape_buckets: false,
            gpu_pdl: false,
            gpu_no_wgmma: false,
            gpu_release_memory: false,
            gpu_batch_invariant: false,
        }
    }

    #[test]
    fn gpu_options_parse_precision_and_kernels() {
        let o = args("bf16", None).options().unwrap();
        assert_eq!(o.precision, Precision::Bf16);
        assert_eq!(o.kernels, None, "unset: the precision's default");
        assert!(o.trees && o.graphs && !o.pdl && o.wgmma && o.keep_freed_memory);
        assert_eq!(o.memory_budget_bytes, 64 << 20);
        // Shape buckets: on from the command line unless turned off (the library's default is off).
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cuda: CudaArgs,
        }
        let parse = |a: &[&str]| {
            <Flags as clap::Parser>::try_parse_from([&["onepass"], a].concat())
                .unwrap()
                .cuda
                .options()
                .unwrap()
        };
        assert!(parse(&[]).shape_buckets, "the command line's default");
        assert!(!parse(&["--gpu-no-shape-buckets"]).shape_buckets);
        assert!(!onepass_cuda::CudaOptions::default().shape_buckets);
        let o = args("split", Some("tf32")).options().unwrap();
        assert_eq!(o.precision, Precision::Bf16Split);
        assert_eq!(o.kernels, Some(TcArith::all(Arith::Tf32)));
        let o = args("f32", Some("3xtf32")).options().unwrap();
        assert_eq!(o.kernels, Some(TcArith::all(Arith::X3)));
        let t = args("split", Some("state,attn"))
            .options()
            .unwrap()
            .kernels
            .unwrap();
        assert_eq!(
            (t.prep, t.state, t.attn),
            (Arith::X3, Arith::Tf32, AttnArith::Tf32)
        );
        let t = args("split", Some("attn=bf16x3")).options().unwrap();
        assert_eq!(t.kernels.map(|k| k.attn), Some(AttnArith::Bf16x3));
        let e = args("split", Some("fp8"))
            .options()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"fp8\"") && e.contains("expected 3xtf32, tf32"),
            "{e}"
        );
        let o = args("mixed", None).options().unwrap();
        assert_eq!(
            (o.precision, o.kernels, o.split_gemms),
            (Precision::Mixed, None, None)
        );
        let unset = CudaArgs {
            precision: PrecisionArg {
                gpu_precision: None,
            },
            ..args("mixed", None)
        };
        assert_eq!(
            unset.options().unwrap().precision,
            Precision::Half,
            "unset: the default, half"
        );
        assert_eq!(
            args("half", None).options().unwrap().precision,
            Precision::Half
        );
        let e = args("fp16", None).options().unwrap_err().to_string();
        assert!(
            e.contains("--gpu-precision \"fp16\"") && e.contains("half, mixed, split, bf16"),
            "{e}"
        );
    }

    /// The GPU flags' help speaks to users: no internal variables, issues or experiments; the expert kernel flags
    /// under their own heading, the everyday ones not.
    #[test]
    fn gpu_flags_help_names_no_internals_and_groups_the_expert_flags() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cuda: CudaArgs,
        }
        let help = Flags::command().render_long_help().to_string();
        // Jargon of earlier work ("issue", a run name): crates/cli/tests/cli.rs checks every command's help for the rest.
        for word in ["ONEPASS_", "issue", "run s"] {
            assert!(!help.contains(word), "{word:?} in the help:\n{help}");
        }
        let (everyday, expert) = help
            .split_once(&format!("{EXPERT}:"))
            .unwrap_or_else(|| panic!("no {EXPERT:?} heading:\n{help}"));
        assert!(everyday.contains("--gpu-precision") && everyday.contains("--gpu-memory-mb"));
        for flag in [
            "--gpu-kernels",
            "--gpu-split-gemms",
            "--gpu-gdn",
            "--gpu-attention",
            "--gpu-no-trees",
            "--gpu-no-graphs",
            "--gpu-pdl",
            "--gpu-no-wgmma",
            "--gpu-release-memory",
        ] {
            assert!(
                expert.contains(flag) && !everyday.contains(flag),
                "{flag}:\n{help}"
            );
        }
    }

    #[test]
    fn gpu_switches_map_to_options() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cuda: CudaArgs,
        }
        let options = |argv: &[&str]| Flags::try_parse_from(argv).unwrap().cuda.options().unwrap();
        let o = options(&[
            "t",
            "--gpu-gdn",
            "simt",
            "--gpu-attention",
            "tiled",
            "--gpu-no-trees",
            "--gpu-no-graphs",
            "--gpu-pdl",
            "--gpu-no-wgmma",
            "--gpu-release-memory",
        ]);
        assert_eq!(o.gdn, onepass_cuda::GdnKernels::Simt);
        assert_eq!(o.attention, onepass_cuda::AttnKernels::Tiled);
        assert!(!o.trees && !o.graphs && o.pdl && !o.wgmma && !o.keep_freed_memory);
        assert!(!o.batch_invariant);
        assert!(options(&["t", "--gpu-batch-invariant"]).batch_invariant);
        let o = options(&["t", "--gpu-gdn", "tc-no-leaf"]);
        assert_eq!(o.gdn, onepass_cuda::GdnKernels::TensorCoreNoLeaf);
        assert_eq!(o.attention, onepass_cuda::AttnKernels::TensorCore);
        let e = Flags::try_parse_from(["t", "--gpu-gdn", "wy"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("tc-no-leaf") && e.contains("simt"), "{e}");
    }

    #[test]
    fn gpu_split_gemms_parse_and_need_split_precision() {
        let with = |precision: &str, spec: &str| CudaArgs {
            gpu_split_gemms: Some(spec.into()),
            ..args(precision, None)
        };
        let o = with("split", "mlp_out, gdn_in").options().unwrap();
        let s = o.split_gemms.unwrap();
        assert!(s.has(Projection::MlpOut) && s.has(Projection::GdnIn));
        assert!(!s.has(Projection::MlpIn) && !s.has(Projection::AttnOut));
        assert_eq!(s.describe(), "gdn_in,mlp_out");
        assert_eq!(
            with("split", "none").options().unwrap().split_gemms,
            Some(SplitGemms::NONE)
        );
        assert_eq!(
            with("split", "all").options().unwrap().split_gemms,
            Some(SplitGemms::ALL)
        );
        let e = with("split", "mlp_out,lm_head")
            .options()
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"lm_head\"") && e.contains("gdn_in"), "{e}");
        assert_eq!(
            with("mixed", "all").options().unwrap().split_gemms,
            Some(SplitGemms::ALL)
        );
        let e = with("bf16", "all").options().unwrap_err().to_string();
        assert!(
            e.contains("applies to --gpu-precision half, mixed or split, not bf16"),
            "{e}"
        );
    }
}
