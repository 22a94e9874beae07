//! The kernel source and how NVRTC compiles it: the CUDA files joined ([`KERNELS_CU`]), the programs it is compiled
//! as at once ([`PROGRAMS`], one thread each), to machine code for the device (`sm_XY`, `sm_90a` on compute
//! capability 9.0: [`arch_suffix`]; PTX for `compute_XY` where NVRTC does not know the GPU, which the driver
//! JIT-compiles), cached per program at `$XDG_CACHE_HOME/onepass/cuda/<hash>-sm_XY-<program>.cubin` (else
//! `$HOME/.cache/...`), the hash (FNV-1a 64) covering the source, the arch, the NVRTC options and the program's
//! kernel groups. [`crate::runtime`] loads the images into a context.

use std::path::PathBuf;

use crate::CudaError;

/// The suffix of compute capability `cc`'s NVRTC architecture: `a` on 9.0 (Hopper), whose architecture-specific
/// instructions (the warpgroup mma of qwgmma.cu) every program is then compiled with (that code runs on 9.0 devices
/// only, which is all it is compiled for); none elsewhere.
pub fn arch_suffix(cc: (i32, i32)) -> &'static str {
    if cc == (9, 0) {
        "a"
    } else {
        ""
    }
}

/// The kernel source (CUDA C, no headers).
pub const KERNELS_CU: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("norms.cu"),
    include_str!("decode.cu"),
    include_str!("sample.cu"),
    include_str!("tc_common.cu"),
    include_str!("gdn_tc.cu"),
    include_str!("attn_tc.cu"),
    include_str!("gdn_prep_tc.cu"),
    include_str!("fused.cu"),
    include_str!("quant.cu"),
    include_str!("qmma.cu"),
    include_str!("qwgmma.cu"),
);

pub(crate) const NVRTC_OPTS: &[&str] = &["--std=c++17"];

/// The groups of [`Fallbacks`](crate::runtime::Fallbacks); the programs that compile them are [`Gpu::fallbacks`](crate::runtime::Gpu::fallbacks)'.
pub(crate) const FALLBACK_GROUPS: &[&str] = &["gdn_wy_prep", "gdn_wy_state", "attention_tiled"];

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("onepass").join("cuda"))
}

/// The NVRTC programs the kernel source is compiled as, at once, each to its own module: the kernel groups each
/// compiles (`KERNEL(group)` in kernels.cu: `simt` for the light kernels, a kernel's own name for each slow one; every
/// group in exactly one program), slowest first, so that fewer threads than programs still finish early. Seconds
/// to an sm_90 cubin, one thread of the 2-core build machine: gdn_wy_prep 16.1, gdn_wy_state 6.9, attention_bf 5.2,
/// the eight state passes and six leaf passes 5.1 (2.4 and 1.8 apart), attention_tiled 4.8, attention_tc 3.6,
/// attention_tc_tf32 3.6, attention_bf1 2.8, simt 2.4, the two pre-passes 1.6; the whole source as one program 58.8
/// (before the leaf passes). The three fallback programs ([`is_fallback`]) are compiled at their first use.
pub const PROGRAMS: &[&[&str]] = &[
    &["gdn_wy_prep"],
    &["gdn_wy_state"],
    &["attention_bf"],
    &[
        "gdn_tc_state_8",
        "gdn_tc_state_16",
        "gdn_tc_state_32",
        "gdn_tc_state_64",
        "gdn_tc_state_8_tf32",
        "gdn_tc_state_16_tf32",
        "gdn_tc_state_32_tf32",
        "gdn_tc_state_64_tf32",
        "gdn_tc_leaf_32",
        "gdn_tc_leaf_64",
        "gdn_tc_leaf_128",
        "gdn_tc_leaf_32_tf32",
        "gdn_tc_leaf_64_tf32",
        "gdn_tc_leaf_128_tf32",
    ],
    &["attention_tiled"],
    &["attention_tc"],
    &["attention_tc_tf32"],
    &["attention_bf1"],
    &["attention_h"],
    &["simt"],
    &[
        "gdn_tc_prep",
        "gdn_tc_prep_tf32",
        "gdn_tc_prep8",
        "gdn_tc_prep8_tf32",
    ],
    &["qmma_pq2", "qmma_pq2_16", "qmma_q8"],
    &["qwg_pq2"],
];

/// Whether program `i` compiles fallback kernels only (loaded by [`Gpu::fallbacks`](crate::runtime::Gpu::fallbacks), not when the GPU opens).
pub fn is_fallback(i: usize) -> bool {
    PROGRAMS[i].iter().all(|g| FALLBACK_GROUPS.contains(g))
}

/// The index in [`PROGRAMS`] of the program that compiles kernel `name` (its group: its own name, else `simt`).
pub fn program_of(name: &str) -> Option<usize> {
    PROGRAMS
        .iter()
        .position(|p| p.contains(&name))
        .or_else(|| PROGRAMS.iter().position(|p| p.contains(&"simt")))
}

/// The source of program `i`: KERNEL defined so that the program's groups are compiled and every other kernel is a
/// template never instantiated.
pub fn program_source(i: usize) -> String {
    let mut s = String::from("#define KERNEL(group) KERNEL_##group\n");
    for g in PROGRAMS.iter().flat_map(|p| p.iter()) {
        let open = if PROGRAMS[i].contains(g) {
            "extern \"C\" __global__"
        } else {
            "template <int> __global__"
        };
        s.push_str(&format!("#define KERNEL_{g} {open}\n"));
    }
    s.push_str(KERNELS_CU);
    s
}

/// What NVRTC made of a program: machine code for one GPU (`sm_XY`), or PTX (`compute_XY`) for the driver to
/// JIT-compile.
pub enum Image {
    Cubin(Vec<u8>),
    Ptx(String),
}

/// The bytes of a NUL-terminated C string NVRTC returned (log, PTX), up to the NUL.
fn c_bytes(v: &[std::ffi::c_char]) -> Vec<u8> {
    v.iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect()
}

/// Compiles program `i` ([`program_source`]) for `arch` (`sm_XY`: a cubin; `compute_XY`: PTX).
pub fn compile_program(i: usize, arch: &str) -> Result<Image, CudaError> {
    use cudarc::nvrtc::{result, sys};
    let err = |msg: String| CudaError::Compile {
        arch: arch.to_string(),
        msg,
    };
    let src = std::ffi::CString::new(program_source(i)).map_err(|e| err(e.to_string()))?;
    let name = std::ffi::CString::new(format!("onepass_kernels_{i}.cu"))
        .map_err(|e| err(e.to_string()))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| err(format!("{e:?}")))?;
    let mut opts: Vec<String> = NVRTC_OPTS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` was created above and is destroyed once, below; `src` and `name` outlive it.
    let out = unsafe {
        let r = match result::compile_program(prog, &opts) {
            Err(e) => {
                let log = c_bytes(&result::get_program_log(prog).unwrap_or_default());
                Err(err(format!("{e:?}: {}", String::from_utf8_lossy(&log))))
            }
            Ok(()) if arch.starts_with("sm_") => {
                let mut n = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut n)
                    .result()
                    .and_then(|()| {
                        let mut buf = vec![0u8; n];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map(|()| Image::Cubin(buf))
                    })
                    .map_err(|e| err(format!("cubin: {e:?}")))
            }
            Ok(()) => result::get_ptx(prog)
                .map(|p| Image::Ptx(String::from_utf8_lossy(&c_bytes(&p)).into_owned()))
                .map_err(|e| err(format!("ptx: {e:?}"))),
        };
        let _ = result::destroy_program(prog);
        r
    };
    out
}

/// The images of `programs` (indices into [`PROGRAMS`], in that order) for a device of compute capability
/// `maj`.`min`, from the disk cache or compiled now, at once (one thread each, up to the host's cores, slowest
/// first). Machine code (`sm_XY`) where this NVRTC knows the GPU; else PTX (`compute_XY`), which the driver
/// JIT-compiles. Either is cached. `what` names them in the progress lines.
pub fn images_for(
    maj: i32,
    min: i32,
    programs: &[usize],
    what: &str,
) -> Result<Vec<Image>, CudaError> {
    let a = arch_suffix((maj, min));
    let (sm, compute) = (
        format!("sm_{maj}{min}{a}"),
        format!("compute_{maj}{min}{a}"),
    );
    // The source hashed once; each program's file adds its groups and the image kind.
    let source = fnv1a(&[KERNELS_CU.as_bytes(), NVRTC_OPTS.join(" ").as_bytes()]);
    let dir = cache_dir();
    let path = |i: usize, arch: &str, ext: &str| {
        let key = fnv1a(&[
            &source.to_le_bytes(),
            arch.as_bytes(),
            PROGRAMS[i].join(",").as_bytes(),
        ]);
        dir.as_ref()
            .map(|d| d.join(format!("{key:016x}-{arch}-{i}.{ext}")))
    };
    let cached = |i: usize| {
        let read = |arch: &str, ext: &str| path(i, arch, ext).and_then(|p| std::fs::read(p).ok());
        read(&sm, "cubin").map(Image::Cubin).or_else(|| {
            read(&compute, "ptx").map(|b| Image::Ptx(String::from_utf8_lossy(&b).into_owned()))
        })
    };
    let mut images: Vec<Option<Image>> = programs.iter().map(|&i| cached(i)).collect();
    // Positions in `programs` still to compile.
    let todo: Vec<usize> = (0..programs.len())
        .filter(|k| images[*k].is_none())
        .collect();
    if !todo.is_empty() {
        let threads = std::thread::available_parallelism()
            .map_or(1, |t| t.get())
            .min(todo.len());
        // Seconds to a minute: said before, not left to look like a hang.
        let cache_note = dir.as_ref().map_or(
            "no cache directory: HOME and XDG_CACHE_HOME unset".to_string(),
            |d| format!("cached in {}", d.display()),
        );
        eprintln!(
            "onepass: compiling the {what} for {sm} ({} programs on {threads} threads; once per build and kind of \
             GPU; {cache_note})",
            todo.len()
        );
        let t0 = std::time::Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done: Vec<(usize, Result<Image, CudaError>)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&at) = todo.get(k) else { break };
                            out.push((at, compile_program(programs[at], &sm)));
                        }
                        out
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_default())
                .collect()
        });
        for (at, r) in done {
            let i = programs[at];
            // An NVRTC older than the GPU: PTX for its compute capability, JIT-compiled by the driver.
            let im = match r {
                Ok(im) => im,
                Err(e) => compile_program(i, &compute).map_err(|_| e)?,
            };
            let file = match &im {
                Image::Cubin(b) => path(i, &sm, "cubin").map(|p| (p, b.as_slice())),
                Image::Ptx(p) => path(i, &compute, "ptx").map(|f| (f, p.as_bytes())),
            };
            if let Some((p, bytes)) = file {
                write_cache(&p, bytes);
            }
            images[at] = Some(im);
        }
        eprintln!(
            "onepass: compiled the {what} in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
    }
    // None left only where a compile thread panicked.
    images
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CudaError::Compile {
            arch: sm,
            msg: "a compile thread panicked".into(),
        })
}

/// Writes a cache file whole or not at all; a cache that cannot be written only costs a recompile next time.
fn write_cache(p: &std::path::Path, bytes: &[u8]) {
    if let Some(dir) = p.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, p);
    }
}
