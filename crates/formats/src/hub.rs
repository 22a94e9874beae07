//! Resolving a `--model` argument to a folder or a GGUF file on disk, and finding the weights in it.
//!
//! A model is a local folder, a local `.gguf` file, or a Hugging Face Hub repo id (`ORG/NAME`, optionally
//! `ORG/NAME@REVISION`). Repo ids are resolved offline from the Hub cache layout
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`):
//! `models--ORG--NAME/snapshots/<commit>/`, choosing the commit that `refs/<revision>` (default
//! `main`) names, or the snapshot named by the revision itself, or (without a revision) the only
//! snapshot when there is no `refs/main`. Downloading is not done here.
//!
//! The argument is untrusted: a revision is checked to be a plain ref or commit name before it is
//! joined to any path, a ref file must hold a plain commit hash, and no error quotes a file's
//! contents, so `ORG/NAME@../../etc` can neither leave the cache nor show what lies outside it.

use std::io::Read;
use std::path::{Path, PathBuf};

/// What a folder argument needs, said once for every error that points the user at one.
const FOLDER_HINT: &str =
    "pass the folder that holds config.json, the *.safetensors weights and tokenizer.json, or a .gguf file";

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// A path that exists but is neither a folder nor a `.gguf` file.
    #[error("model {path}: this is a file, not a model folder or a .gguf file; {FOLDER_HINT}")]
    NotAFolder { path: PathBuf },
    /// A folder with neither `config.json`, `tokenizer.json` nor a `.gguf` file: no command can use it.
    #[error("model {path}: this folder holds neither config.json, tokenizer.json nor a .gguf file, so it is not a model folder; {FOLDER_HINT}")]
    NotAModelFolder { path: PathBuf },
    /// A folder without safetensors weights that holds several `.gguf` files.
    #[error("model {path}: this folder holds {count} .gguf files ({names}); pass the one to run")]
    SeveralGguf {
        path: PathBuf,
        count: usize,
        names: String,
    },
    #[error("model {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// An argument written as a path (`./x`, `/x`, `a/b/c`) that does not exist.
    #[error("model {path}: no such folder; {FOLDER_HINT}, or a Hub repo id ORG/NAME")]
    NoSuchFolder { path: PathBuf },
    #[error(
        "model {arg:?}: no folder of that name here, and not a Hub repo id of the form ORG/NAME[@REVISION]; {FOLDER_HINT}"
    )]
    NotFound { arg: String },
    #[error(
        "model {repo}: no folder of that name here, and not in the Hugging Face cache at {cache} (looked for {looked}); download it on a machine with network access (`hf download {repo}` or `huggingface-cli download {repo}`), or pass a local folder"
    )]
    NotCached {
        repo: String,
        cache: PathBuf,
        looked: PathBuf,
    },
    #[error(
        "model {repo}@{rev}: {rev:?} is not a revision name (a branch, tag or commit: letters, digits, '.', '_', '-' and '/', without '..' or a leading '/')"
    )]
    BadRevision { repo: String, rev: String },
    #[error(
        "model {repo}@{rev}: revision {rev:?} is not in the Hugging Face cache at {root}; present: {present}; download it (`hf download {repo} --revision {rev}`) or name one of these"
    )]
    MissingRevision {
        repo: String,
        rev: String,
        root: PathBuf,
        /// The refs and snapshots found, already written out.
        present: String,
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

/// Resolves `arg` to a model folder or a `.gguf` file: an existing folder or `.gguf` file is taken as
/// is, another file or a missing path is an error saying so; otherwise `ORG/NAME[@REV]` is looked up
/// in the Hub cache (a snapshot folder).
pub fn resolve_model(arg: &str) -> Result<PathBuf, ResolveError> {
    let path = Path::new(arg);
    if path.is_dir() {
        return model_folder(path.to_path_buf());
    }
    if path.exists() {
        if is_gguf_name(path) && path.is_file() {
            return Ok(path.to_path_buf());
        }
        return Err(ResolveError::NotAFolder {
            path: path.to_path_buf(),
        });
    }
    if looks_like_path(arg) {
        return Err(ResolveError::NoSuchFolder {
            path: path.to_path_buf(),
        });
    }
    resolve_in_cache(arg, &hub_cache_dir()).and_then(model_folder)
}

/// `dir` when it can be a model folder (it holds `config.json`, `tokenizer.json` or a `.gguf` file; each
/// command then says which file it misses).
fn model_folder(dir: PathBuf) -> Result<PathBuf, ResolveError> {
    if dir.join("config.json").exists()
        || dir.join("tokenizer.json").exists()
        || !gguf_files(&dir)?.is_empty()
    {
        Ok(dir)
    } else {
        Err(ResolveError::NotAModelFolder { path: dir })
    }
}

fn is_gguf_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The `.gguf` files directly in `dir`, sorted.
fn gguf_files(dir: &Path) -> Result<Vec<PathBuf>, ResolveError> {
    let io = |cause| ResolveError::Io {
        path: dir.to_path_buf(),
        cause,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if is_gguf_name(&p) && p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Where a model's files are: the folder (for `tokenizer.json`, `decider_config.json`, `config.json`) and,
/// when the weights are a GGUF file, that file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub gguf: Option<PathBuf>,
}

impl ModelFiles {
    /// The files of a resolved model path. A `.gguf` file is the weights, its folder holds the rest. A folder
    /// with safetensors weights (`*.safetensors` or `model.safetensors.index.json`) is a Hugging Face folder,
    /// whatever `.gguf` files lie beside them (name the file to run one of those); a folder without them that
    /// holds exactly one `.gguf` file runs that file; several are an error naming them.
    pub fn locate(path: &Path) -> Result<ModelFiles, ResolveError> {
        if path.is_file() {
            if !is_gguf_name(path) {
                return Err(ResolveError::NotAFolder {
                    path: path.to_path_buf(),
                });
            }
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            return Ok(ModelFiles {
                dir,
                gguf: Some(path.to_path_buf()),
            });
        }
        let dir = path.to_path_buf();
        if !dir.is_dir() {
            // Nothing to choose from; the loader then names the file it misses.
            return Ok(ModelFiles { dir, gguf: None });
        }
        if has_safetensors(&dir)? {
            return Ok(ModelFiles { dir, gguf: None });
        }
        let mut found = gguf_files(&dir)?;
        match found.len() {
            0 => Ok(ModelFiles { dir, gguf: None }),
            1 => Ok(ModelFiles {
                dir,
                gguf: found.pop(),
            }),
            count => Err(ResolveError::SeveralGguf {
                path: dir,
                count,
                names: found
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

fn has_safetensors(dir: &Path) -> Result<bool, ResolveError> {
    if dir.join("model.safetensors.index.json").is_file() {
        return Ok(true);
    }
    let io = |cause| ResolveError::Io {
        path: dir.to_path_buf(),
        cause,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.extension().and_then(|e| e.to_str()) == Some("safetensors") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An argument that cannot be a repo id and reads as a path: it starts with `.`, `/` or `~`, or
/// the part before any `@` has a `/` but is not exactly `ORG/NAME`.
fn looks_like_path(arg: &str) -> bool {
    if arg.starts_with(['.', '/', '~']) || arg.contains('\\') {
        return true;
    }
    let repo = arg.split_once('@').map_or(arg, |(r, _)| r);
    repo.contains('/') && split_repo(repo).is_none()
}

/// `ORG/NAME` → `(ORG, NAME)` when both parts are plain names.
fn split_repo(repo: &str) -> Option<(&str, &str)> {
    let (org, name) = repo.split_once('/')?;
    let plain = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (plain(org) && plain(name)).then_some((org, name))
}

/// A branch, tag or commit name that stays inside the folder it is joined to: ASCII letters,
/// digits, `.`, `_`, `-`, and `/` between non-empty parts that are not `.` or `..`.
fn is_revision_name(rev: &str) -> bool {
    !rev.is_empty()
        && rev.len() <= 256
        && rev
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && rev
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
}

/// A commit hash as the cache names snapshots: hex digits only (40 for a git SHA-1).
fn is_commit(s: &str) -> bool {
    (4..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Looks `ORG/NAME[@REV]` up in a given cache root.
pub fn resolve_in_cache(arg: &str, cache: &Path) -> Result<PathBuf, ResolveError> {
    let (repo, rev) = match arg.split_once('@') {
        Some((r, v)) => (r, Some(v)),
        None => (arg, None),
    };
    let Some((org, name)) = split_repo(repo) else {
        return Err(ResolveError::NotFound {
            arg: arg.to_string(),
        });
    };
    // Checked before any path is built from it.
    if let Some(rev) = rev {
        if !is_revision_name(rev) {
            return Err(ResolveError::BadRevision {
                repo: repo.to_string(),
                rev: rev.to_string(),
            });
        }
    }
    let root = cache.join(format!("models--{org}--{name}"));
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
    let named = rev.unwrap_or("main");
    let ref_file = root.join("refs").join(named);
    let commit = if ref_file.is_file() {
        read_ref(&ref_file).ok_or_else(|| {
            bad(format!(
                "{} does not hold a commit hash, so the cache is damaged; download the model again",
                ref_file.display()
            ))
        })?
    } else if is_commit(named) && snapshots.join(named).is_dir() {
        named.to_string()
    } else if let Some(rev) = rev {
        return Err(ResolveError::MissingRevision {
            repo: repo.to_string(),
            rev: rev.to_string(),
            present: present_revisions(&root, &snapshots),
            root,
        });
    } else {
        let mut all = list_snapshots(&snapshots)
            .map_err(|e| bad(format!("cannot list {}: {e}", snapshots.display())))?;
        match all.len() {
            1 => all.remove(0),
            0 => return Err(bad(format!("{} holds no snapshot", snapshots.display()))),
            _ => {
                return Err(bad(format!(
                    "no refs/main and several snapshots ({}); name one as {repo}@<commit>",
                    all.join(", ")
                )))
            }
        }
    };
    let dir = snapshots.join(&commit);
    if !dir.is_dir() {
        return Err(bad(format!(
            "refs/{named} names snapshot {commit}, which is missing; download the model again"
        )));
    }
    Ok(dir)
}

/// The commit a ref file names, when it holds one (and nothing else) in its first bytes.
fn read_ref(path: &Path) -> Option<String> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(128)
        .read_to_end(&mut buf)
        .ok()?;
    let s = std::str::from_utf8(&buf).ok()?.trim();
    is_commit(s).then(|| s.to_string())
}

/// Snapshot folder names that are commit hashes, sorted.
fn list_snapshots(snapshots: &Path) -> std::io::Result<Vec<String>> {
    let mut all: Vec<String> = std::fs::read_dir(snapshots)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_commit(n))
        .collect();
    all.sort();
    Ok(all)
}

/// "refs main (→ abc123); snapshots abc123, def456", for an error that lists what can be named.
fn present_revisions(root: &Path, snapshots: &Path) -> String {
    let mut refs = Vec::new();
    collect_refs(&root.join("refs"), "", 0, &mut refs);
    refs.sort();
    let snaps = list_snapshots(snapshots).unwrap_or_default();
    let refs = if refs.is_empty() {
        "no refs".to_string()
    } else {
        format!("refs {}", refs.join(", "))
    };
    let snaps = if snaps.is_empty() {
        "no snapshots".to_string()
    } else {
        format!("snapshots {}", snaps.join(", "))
    };
    format!("{refs}; {snaps}")
}

/// Every ref under `dir` (nested names such as `refs/pr/1` included, a few levels deep), as
/// `name (→ commit)`; a ref not holding a commit hash is listed as damaged, never quoted.
fn collect_refs(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        let path = e.path();
        if path.is_dir() && depth < 3 {
            collect_refs(&path, &format!("{name}/"), depth + 1, out);
        } else if path.is_file() {
            out.push(match read_ref(&path) {
                Some(c) => format!("{name} (→ {c})"),
                None => format!("{name} (damaged)"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C1: &str = "0123456789abcdef0123456789abcdef01234567";
    const C2: &str = "fedcba9876543210fedcba9876543210fedcba98";

    /// A cache holding `models--Qwen--Qwen3.5-0.8B` with the given snapshots and refs.
    fn cache(snaps: &[&str], refs: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
        let cache = tempfile::tempdir().expect("tempdir");
        let root = cache.path().join("models--Qwen--Qwen3.5-0.8B");
        for s in snaps {
            std::fs::create_dir_all(root.join("snapshots").join(s)).expect("mk");
        }
        std::fs::create_dir_all(root.join("snapshots")).expect("mk");
        for (name, content) in refs {
            let f = root.join("refs").join(name);
            std::fs::create_dir_all(f.parent().expect("parent")).expect("mk");
            std::fs::write(f, content).expect("ref");
        }
        (cache, root)
    }

    fn err(arg: &str, cache: &Path) -> String {
        resolve_in_cache(arg, cache)
            .expect_err("should fail")
            .to_string()
    }

    #[test]
    fn resolves_ref_commit_and_single_snapshot() {
        let (c, root) = cache(&[C1], &[("main", &format!("{C1}\n"))]);
        let repo = "Qwen/Qwen3.5-0.8B";
        let want = root.join("snapshots").join(C1);
        assert_eq!(resolve_in_cache(repo, c.path()).expect("ref"), want);
        assert_eq!(
            resolve_in_cache(&format!("{repo}@main"), c.path()).expect("@main"),
            want
        );
        assert_eq!(
            resolve_in_cache(&format!("{repo}@{C1}"), c.path()).expect("@commit"),
            want
        );
        std::fs::remove_file(root.join("refs/main")).expect("rm");
        assert_eq!(resolve_in_cache(repo, c.path()).expect("only one"), want);
    }

    #[test]
    fn a_named_branch_resolves_through_its_ref() {
        let (c, root) = cache(&[C1, C2], &[("main", C1), ("pr/1", C2)]);
        let dir = resolve_in_cache("Qwen/Qwen3.5-0.8B@pr/1", c.path()).expect("pr/1");
        assert_eq!(dir, root.join("snapshots").join(C2));
    }

    #[test]
    fn missing_repo_and_bad_ids_are_clear_errors() {
        let (c, _) = cache(&[], &[]);
        let e = err("Qwen/Nope", c.path());
        assert!(e.contains("not in the Hugging Face cache"), "{e}");
        assert!(e.contains("hf download Qwen/Nope"), "{e}");
        let e = err("../etc", c.path());
        assert!(e.contains("not a Hub repo id"), "{e}");
    }

    /// A revision that is not in the cache is an error listing what is, never another snapshot.
    #[test]
    fn a_missing_revision_lists_the_ones_present() {
        let (c, _) = cache(&[C1], &[("main", C1)]);
        let e = err("Qwen/Qwen3.5-0.8B@v2", c.path());
        assert_eq!(
            e,
            format!(
                "model Qwen/Qwen3.5-0.8B@v2: revision \"v2\" is not in the Hugging Face cache at {}; present: refs main (→ {C1}); snapshots {C1}; download it (`hf download Qwen/Qwen3.5-0.8B --revision v2`) or name one of these",
                c.path().join("models--Qwen--Qwen3.5-0.8B").display()
            )
        );
        // A commit that is not there either.
        let e = err(&format!("Qwen/Qwen3.5-0.8B@{C2}"), c.path());
        assert!(e.contains(&format!("revision \"{C2}\" is not in")), "{e}");
    }

    /// Revisions that would leave the cache are refused before any path is built from them.
    #[test]
    fn revisions_that_climb_out_of_the_cache_are_refused() {
        let (c, root) = cache(&[C1], &[("main", C1)]);
        // Targets that exist relative to refs/ or snapshots/ if the revision were joined blindly.
        std::fs::write(c.path().join("secret"), "top secret contents").expect("w");
        for rev in [
            "../../etc/passwd",
            "/etc",
            "../..",
            "../../../secret",
            "..",
            "a/../../b",
            "",
            "main\\..",
        ] {
            let e = err(&format!("Qwen/Qwen3.5-0.8B@{rev}"), c.path());
            assert_eq!(
                e,
                format!(
                    "model Qwen/Qwen3.5-0.8B@{rev}: {rev:?} is not a revision name (a branch, tag or commit: letters, digits, '.', '_', '-' and '/', without '..' or a leading '/')"
                ),
            );
        }
        assert!(root.join("snapshots").join(C1).is_dir());
    }

    /// A ref whose content is not a plain commit hash is refused without quoting it.
    #[test]
    fn a_ref_that_is_not_a_commit_hash_is_refused_unquoted() {
        for content in [
            "../../../etc",
            "/etc",
            "top secret contents",
            &"a".repeat(500),
        ] {
            let (c, root) = cache(&[C1], &[("main", content)]);
            let e = err("Qwen/Qwen3.5-0.8B", c.path());
            assert_eq!(
                e,
                format!(
                    "model Qwen/Qwen3.5-0.8B: {} does not hold a commit hash, so the cache is damaged; download the model again",
                    root.join("refs/main").display()
                )
            );
            // Listed as damaged, not quoted, when another revision is asked for.
            let e = err("Qwen/Qwen3.5-0.8B@v9", c.path());
            assert!(e.contains("refs main (damaged)"), "{e}");
            assert!(!e.contains("secret") && !e.contains("etc"), "{e}");
        }
    }

    #[test]
    fn paths_are_told_apart_from_repo_ids() {
        for p in ["./x", "../x", "/x/y", "~/m", "a/b/c", "models/a/b@v1"] {
            assert!(looks_like_path(p), "{p}");
        }
        for r in [
            "Qwen/Qwen3.5-0.8B",
            "org/name@main",
            "org/name@../../etc",
            "mymodel",
        ] {
            assert!(!looks_like_path(r), "{r}");
        }
    }

    #[test]
    fn files_and_missing_paths_say_what_they_are() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("ticket.json");
        std::fs::write(&f, "{}").expect("w");
        let e = resolve_model(f.to_str().expect("utf8"))
            .expect_err("file")
            .to_string();
        assert_eq!(
            e,
            format!(
                "model {}: this is a file, not a model folder or a .gguf file; {FOLDER_HINT}",
                f.display()
            )
        );
        let e = resolve_model(d.path().to_str().expect("utf8"))
            .expect_err("not a model folder")
            .to_string();
        assert_eq!(
            e,
            format!(
                "model {}: this folder holds neither config.json, tokenizer.json nor a .gguf file, so it is not a model folder; {FOLDER_HINT}",
                d.path().display()
            )
        );
        std::fs::write(d.path().join("tokenizer.json"), "{}").expect("w");
        assert_eq!(
            resolve_model(d.path().to_str().expect("utf8")).expect("a folder"),
            d.path()
        );
        let missing = d.path().join("nothing");
        let e = resolve_model(missing.to_str().expect("utf8"))
            .expect_err("missing")
            .to_string();
        assert_eq!(
            e,
            format!(
                "model {}: no such folder; {FOLDER_HINT}, or a Hub repo id ORG/NAME",
                missing.display()
            )
        );
    }

    #[test]
    fn gguf_files_and_folders_locate_their_weights() {
        let d = tempfile::tempdir().expect("tempdir");
        let g = d.path().join("m.gguf");
        std::fs::write(&g, b"GGUF").expect("w");
        // A folder holding one .gguf file is a model folder that runs it; the file itself resolves as is.
        let dir = d.path().to_str().expect("utf8");
        assert_eq!(resolve_model(dir).expect("folder"), d.path());
        assert_eq!(resolve_model(g.to_str().expect("utf8")).expect("file"), g);
        let want = ModelFiles {
            dir: d.path().to_path_buf(),
            gguf: Some(g.clone()),
        };
        assert_eq!(ModelFiles::locate(d.path()).expect("one"), want);
        assert_eq!(ModelFiles::locate(&g).expect("file"), want);
        // Two are ambiguous and named.
        std::fs::write(d.path().join("n.GGUF"), b"GGUF").expect("w");
        let e = ModelFiles::locate(d.path()).expect_err("two").to_string();
        assert!(e.contains("2 .gguf files (m.gguf, n.GGUF)"), "{e}");
        // Naming one still works, and safetensors weights beside them win for the folder.
        assert_eq!(ModelFiles::locate(&g).expect("file"), want);
        std::fs::write(d.path().join("model.safetensors"), b"").expect("w");
        assert_eq!(
            ModelFiles::locate(d.path()).expect("hf"),
            ModelFiles {
                dir: d.path().to_path_buf(),
                gguf: None
            }
        );
    }
}
