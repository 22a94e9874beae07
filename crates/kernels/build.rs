//! Tells the tests whether the building processor has the AMX tile unit with bf16 products (Linux's cpuinfo
//! flags `amx_tile` and `amx_bf16`): `cfg(onepass_amx_host)` un-ignores the tests of the Q8_0 tile kernels, which
//! are ignored, with the reason, where the unit is missing.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(onepass_amx_host)");
    println!("cargo::rerun-if-changed=build.rs");
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| {
        flags
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|w| w == f))
    };
    if has("amx_tile") && has("amx_bf16") {
        println!("cargo::rustc-cfg=onepass_amx_host");
    }
}
