//! Resolving a `--model` argument to a folder on disk.
//!
//! A model is either a local folder or a Hugging Face Hub repo id (`ORG/NAME`, optionally
//! `ORG/NAME@REVISION`). Repo ids are resolved offline from the Hub cache layout
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`):
//! `models--ORG--NAME/snapshots/<commit>/`, choosing the commit that `refs/<revision>` (default
//! `main`) names, or the only snapshot when there is no ref. Downloading is not done here.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("model {arg:?} is neither a local folder nor a Hub repo id of the form ORG/NAME")]
    NotFound { arg: String },
    #[error(
        "model {repo} is not in the Hugging Face cache at {cache} (looked for {looked}); download it on a machine with network access (e.g. `huggingface-cli download {repo}`) or pass a local folder"
    )]
    NotCached {
        repo: String,
        cache: PathBuf,
        looked: PathBuf,
    },
    #[error("model {repo}: {why}")]
    BadCache { repo: String, why: String },
}

/// The Hub cache root, from the environment.
pub fn hub_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("huggingface").join("hub")
}

/// Resolves `arg` to a model folder: an existing folder is taken as is; otherwise `ORG/NAME[@REV]`
/// is looked up in the Hub cache.
pub fn resolve_model_dir(arg: &str) -> Result<PathBuf, ResolveError> {
    let path = Path::new(arg);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    resolve_in_cache(arg, &hub_cache_dir())
}

/// Looks `ORG/NAME[@REV]` up in a given cache root.
pub fn resolve_in_cache(arg: &str, cache: &Path) -> Result<PathBuf, ResolveError> {
    let (repo, rev) = match arg.split_once('@') {
        Some((r, v)) => (r, Some(v)),
        None => (arg, None),
    };
    let parts: Vec<&str> = repo.split('/').collect();
    let valid = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('\\');
    if parts.len() != 2 || !parts.iter().all(|p| valid(p)) {
        return Err(ResolveError::NotFound {
            arg: arg.to_string(),
        });
    }
    let root = cache.join(format!("models--{}--{}", parts[0], parts[1]));
    let snapshots = root.join("snapshots");
    if !snapshots.is_dir() {
        return Err(ResolveError::NotCached {
            repo: repo.to_string(),
            cache: cache.to_path_buf(),
            looked: root,
        });
    }
    let bad = |why: String| ResolveError::BadCache {
        repo: repo.to_string(),
        why,
    };
    let rev = rev.unwrap_or("main");
    let ref_file = root.join("refs").join(rev);
    let commit = if ref_file.is_file() {
        std::fs::read_to_string(&ref_file)
            .map_err(|e| bad(format!("cannot read {}: {e}", ref_file.display())))?
            .trim()
            .to_string()
    } else if snapshots.join(rev).is_dir() {
        rev.to_string()
    } else {
        let mut all: Vec<String> = std::fs::read_dir(&snapshots)
            .map_err(|e| bad(format!("cannot list {}: {e}", snapshots.display())))?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        all.sort();
        match all.len() {
            1 => all.remove(0),
            0 => return Err(bad(format!("{} holds no snapshot", snapshots.display()))),
            _ => {
                return Err(bad(format!(
                    "no refs/{rev} and several snapshots ({}); name one as {repo}@<commit>",
                    all.join(", ")
                )))
            }
        }
    };
    let dir = snapshots.join(&commit);
    if !dir.is_dir() {
        return Err(bad(format!(
            "refs/{rev} names snapshot {commit}, which is missing"
        )));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_ref_and_single_snapshot() {
        let cache = tempfile::tempdir().expect("tempdir");
        let root = cache.path().join("models--Qwen--Qwen3.5-0.8B");
        std::fs::create_dir_all(root.join("snapshots/abc123")).expect("mk");
        std::fs::create_dir_all(root.join("refs")).expect("mk");
        std::fs::write(root.join("refs/main"), "abc123\n").expect("ref");
        let dir = resolve_in_cache("Qwen/Qwen3.5-0.8B", cache.path()).expect("resolve");
        assert!(dir.ends_with("snapshots/abc123"));
        std::fs::remove_file(root.join("refs/main")).expect("rm");
        let dir = resolve_in_cache("Qwen/Qwen3.5-0.8B", cache.path()).expect("resolve one");
        assert!(dir.ends_with("snapshots/abc123"));
        let dir = resolve_in_cache("Qwen/Qwen3.5-0.8B@abc123", cache.path()).expect("resolve rev");
        assert!(dir.ends_with("snapshots/abc123"));
    }

    #[test]
    fn missing_repo_and_bad_ids_are_clear_errors() {
        let cache = tempfile::tempdir().expect("tempdir");
        let err = resolve_in_cache("Qwen/Nope", cache.path())
            .expect_err("fail")
            .to_string();
        assert!(err.contains("not in the Hugging Face cache"), "{err}");
        let err = resolve_in_cache("../etc", cache.path())
            .expect_err("fail")
            .to_string();
        assert!(err.contains("neither a local folder"), "{err}");
    }
}
