//! One directory per test binary for the checkpoints its tests share (crates/decide/tests/common and
//! crates/server/tests/common include this file).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A directory under the system temp dir for this test binary's shared checkpoints, removed when the process exits.
/// Statics are never dropped, so a `TempDir` held in one would stay behind after every run (76 or 137 MB of
/// checkpoint each: 380 of them had filled this machine's disk).
pub fn process_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove() {
        if let Some(d) = DIR.get() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        // SAFETY: `remove` is a plain function that touches only a static set before registration; the test
        // harness leaves through `exit`, which runs it once.
        unsafe { libc::atexit(remove) };
        dir
    })
}
