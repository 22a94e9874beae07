//! The kernel source compiled as several NVRTC programs (`onepass_cuda::runtime::PROGRAMS`): each program compiles
//! exactly the kernels `program_of` looks up in its module, no kernel is compiled twice, and every named group
//! (each slow kernel) is compiled. Needs NVRTC but no GPU: `#[ignore]`d, run with `--include-ignored` where NVRTC loads,
//! e.g. on a build machine with the NVRTC wheel (tools/cuda/ptx-check.py's docstring) on LD_LIBRARY_PATH.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use onepass_cuda::runtime::{compile_program, program_of, Image, PROGRAMS};

#[test]
#[ignore = "needs NVRTC (run with --include-ignored where libnvrtc loads)"]
fn programs_split_the_kernels_once_each() {
    // PTX (no ptxas pass) is enough to list the entries; the programs compile at once, as the loader does.
    let ptx: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..PROGRAMS.len())
            .map(|i| s.spawn(move || compile_program(i, "compute_90")))
            .collect();
        hs.into_iter()
            .map(|h| match h.join().unwrap().unwrap() {
                Image::Ptx(p) => p,
                Image::Cubin(_) => panic!("compute_90 gives PTX"),
            })
            .collect()
    });
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, p) in ptx.iter().enumerate() {
        let entries: Vec<&str> = p
            .lines()
            .filter_map(|l| l.split(".entry ").nth(1))
            .map(|l| l.trim_end_matches('(').trim())
            .collect();
        assert!(
            !entries.is_empty(),
            "program {i} ({:?}) compiles no kernel",
            PROGRAMS[i]
        );
        for e in entries {
            assert_eq!(
                program_of(e),
                Some(i),
                "kernel {e} compiled by program {i}, looked up elsewhere"
            );
            if let Some(j) = seen.insert(e.to_string(), i) {
                panic!("kernel {e} compiled by programs {j} and {i}");
            }
        }
    }
    for g in PROGRAMS
        .iter()
        .flat_map(|p| p.iter())
        .filter(|g| **g != "simt")
    {
        assert!(
            seen.contains_key(*g),
            "group {g}: its kernel was compiled nowhere"
        );
    }
    for k in [
        "rms_norm",
        "add2_rms_norm",
        "attention_tc_combine",
        "spin_wait",
    ] {
        assert!(seen.contains_key(k), "simt kernel {k} missing");
    }
    eprintln!("{} kernels in {} programs", seen.len(), PROGRAMS.len());
}
