//! safetensors: an 8-byte little-endian header length, a JSON header
//! `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the data.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use onepass_tensor::{DType, Tensor};
use serde::Deserialize;

/// Errors reading or writing checkpoint files. Every variant names the file and, where there is
/// one, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The I/O error is part of the message and not a `source()`, so a chain printer shows it once.
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {why}")]
    Header { path: PathBuf, why: String },
    #[error("{path}: tensor {name}: {why}")]
    Tensor {
        path: PathBuf,
        name: String,
        why: String,
    },
    #[error("{path}: unsupported dtype {dtype} for tensor {name} (onepass reads F32, BF16, F16)")]
    DType {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{path}: {why}")]
    Index { path: PathBuf, why: String },
    #[error("no safetensors weights in {0} (expected model.safetensors or model.safetensors.index.json)")]
    NoWeights(PathBuf),
}

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// All tensors of a checkpoint folder, memory-mapped, by name.
pub struct Checkpoint {
    tensors: HashMap<String, Tensor>,
    files: Vec<PathBuf>,
    file_bytes: u64,
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`, or
    /// (failing both) every `*.safetensors` file in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self, FormatError> {
        let files = weight_files(dir)?;
        let mut tensors = HashMap::new();
        let mut file_bytes = 0;
        for file in &files {
            let (found, len) = read_file(file)?;
            file_bytes += len;
            for t in found {
                let name = t.name().to_string();
                if tensors.insert(name.clone(), t).is_some() {
                    return Err(FormatError::Tensor {
                        path: file.clone(),
                        name,
                        why: "appears in more than one shard".into(),
                    });
                }
            }
        }
        Ok(Checkpoint {
            tensors,
            files,
            file_bytes,
        })
    }

    /// Opens one safetensors file.
    pub fn open_file(path: &Path) -> Result<Self, FormatError> {
        let (found, len) = read_file(path)?;
        let tensors = found
            .into_iter()
            .map(|t| (t.name().to_string(), t))
            .collect();
        Ok(Checkpoint {
            tensors,
            files: vec![path.to_path_buf()],
            file_bytes: len,
        })
    }

    /// A checkpoint from tensors already made (a GGUF file's, under the names a model binds), read from
    /// `files` of `file_bytes` bytes in all.
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        files: Vec<PathBuf>,
        file_bytes: u64,
    ) -> Self {
        Checkpoint {
            tensors,
            files,
            file_bytes,
        }
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
    /// Total size of the weight files on disk.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }
}

/// The safetensors files of a folder: the shards `model.safetensors.index.json` lists, else
/// `model.safetensors`, else every `*.safetensors` file (sorted); an error when there are none.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, FormatError> {
    let index = dir.join("model.safetensors.index.json");
    let single = dir.join("model.safetensors");
    let files: Vec<PathBuf> = if index.is_file() {
        shards_from_index(&index)?
            .into_iter()
            .map(|f| dir.join(f))
            .collect()
    } else if single.is_file() {
        vec![single]
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|cause| FormatError::Io {
                path: dir.to_path_buf(),
                cause,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        found.sort();
        found
    };
    if files.is_empty() {
        return Err(FormatError::NoWeights(dir.to_path_buf()));
    }
    Ok(files)
}

fn shards_from_index(index: &Path) -> Result<Vec<String>, FormatError> {
    let text = std::fs::read_to_string(index).map_err(|cause| FormatError::Io {
        path: index.to_path_buf(),
        cause,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| FormatError::Index {
        path: index.to_path_buf(),
        why: format!("invalid JSON: {e}"),
    })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| FormatError::Index {
            path: index.to_path_buf(),
            why: "no \"weight_map\" object".into(),
        })?;
    let mut shards: Vec<String> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| FormatError::Index {
            path: index.to_path_buf(),
            why: format!("weight_map entry {name} is not a file name"),
        })?;
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            return Err(FormatError::Index {
                path: index.to_path_buf(),
                why: format!("weight_map entry {name} names a file outside the folder: {file}"),
            });
        }
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
    }
    shards.sort();
    Ok(shards)
}

fn parse_dtype(s: &str) -> Option<DType> {
    match s {
        "F32" => Some(DType::F32),
        "BF16" => Some(DType::BF16),
        "F16" => Some(DType::F16),
        _ => None,
    }
}

/// One tensor of a safetensors header, its byte range checked against the file and its dtype's size.
pub(crate) struct RawEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Byte range in the map (the data region's offsets plus the header).
    pub begin: usize,
    pub end: usize,
}

/// A mapped safetensors file and its checked header.
pub(crate) struct RawFile {
    pub map: Arc<Mmap>,
    pub len: u64,
    pub entries: Vec<RawEntry>,
}

/// Bytes per element of a safetensors dtype onepass knows (`U32` only for MLX's packed words).
fn dtype_size(s: &str) -> Option<usize> {
    match s {
        "F32" | "U32" => Some(4),
        "BF16" | "F16" => Some(2),
        _ => None,
    }
}

pub(crate) fn read_raw(path: &Path) -> Result<RawFile, FormatError> {
    let io = |cause| FormatError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let header_err = |why: String| FormatError::Header {
        path: path.to_path_buf(),
        why,
    };
    if len < 8 {
        return Err(header_err(format!("{len} bytes is too short for a header")));
    }
    // SAFETY: the file is opened read-only; onepass never writes to a mapped checkpoint. Another
    // process truncating it while mapped is outside what any mmap-based loader can defend against.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
    let mut n = [0u8; 8];
    n.copy_from_slice(&map[..8]);
    let header_len = u64::from_le_bytes(n);
    if header_len > len - 8 || header_len > 100_000_000 {
        return Err(header_err(format!(
            "header length {header_len} exceeds the file ({len} bytes): truncated or not safetensors"
        )));
    }
    let header_len = header_len as usize;
    let header = std::str::from_utf8(&map[8..8 + header_len])
        .map_err(|_| header_err("header is not UTF-8".into()))?;
    let raw: BTreeMap<String, serde_json::Value> = serde_json::from_str(header)
        .map_err(|e| header_err(format!("header is not valid JSON: {e}")))?;
    let data_start = 8 + header_len;
    let data_len = map.len() - data_start;
    let mut entries = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let terr = |why: String| FormatError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            why,
        };
        let entry: Entry =
            serde_json::from_value(value).map_err(|e| terr(format!("bad header entry: {e}")))?;
        let size = dtype_size(&entry.dtype).ok_or_else(|| FormatError::DType {
            path: path.to_path_buf(),
            name: name.clone(),
            dtype: entry.dtype.clone(),
        })?;
        let [begin, end] = entry.data_offsets;
        if begin > end || end > data_len {
            return Err(terr(format!(
                "data range {begin}..{end} lies outside the {data_len} data bytes (file truncated?)"
            )));
        }
        let numel = entry
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d));
        let expected = numel.and_then(|n| n.checked_mul(size));
        if expected != Some(end - begin) {
            return Err(terr(format!(
                "{} {:?} needs {:?} bytes but the header gives {}",
                entry.dtype,
                entry.shape,
                expected,
                end - begin
            )));
        }
        entries.push(RawEntry {
            name,
            dtype: entry.dtype,
            shape: entry.shape,
            begin: data_start + begin,
            end: data_start + end,
        });
    }
    Ok(RawFile { map, len, entries })
}

/// A float tensor of a checked header as a slice of the map.
pub(crate) fn mapped_tensor(
    path: &Path,
    raw: &RawFile,
    e: &RawEntry,
) -> Result<Tensor, FormatError> {
    let dtype = parse_dtype(&e.dtype).ok_or_else(|| FormatError::DType {
        path: path.to_path_buf(),
        name: e.name.clone(),
        dtype: e.dtype.clone(),
    })?;
    Tensor::mapped(
        &e.name,
        dtype,
        e.shape.clone(),
        raw.map.clone(),
        e.begin,
        e.end - e.begin,
    )
    .map_err(|err| FormatError::Tensor {
        path: path.to_path_buf(),
        name: e.name.clone(),
        why: err.to_string(),
    })
}

fn read_file(path: &Path) -> Result<(Vec<Tensor>, u64), FormatError> {
    let raw = read_raw(path)?;
    let out = raw
        .entries
        .iter()
        .map(|e| mapped_tensor(path, &raw, e))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((out, raw.len))
}

/// The bytes a safetensors file starts with for `tensors` (name, dtype, shape), whose data follow
/// back to back in this order: the 8-byte little-endian header length, then the JSON header
/// (`__metadata__` first when there is any) padded with spaces so the data start at a multiple of 8.
pub fn safetensors_header<'a>(
    tensors: impl IntoIterator<Item = (&'a str, DType, &'a [usize])>,
    metadata: &[(&str, &str)],
) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        header.insert("__metadata__".into(), meta.into());
    }
    let mut offset = 0usize;
    for (name, dtype, shape) in tensors {
        let len = shape.iter().product::<usize>() * dtype.size();
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut bytes = Vec::with_capacity(8 + text.len());
    bytes.extend_from_slice(&(text.len() as u64).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

/// Writes tensors to one safetensors file (header padded to 8 bytes, data in the given order).
pub fn write_safetensors(
    path: &Path,
    tensors: &[Tensor],
    metadata: &[(&str, &str)],
) -> Result<(), FormatError> {
    let io = |cause| FormatError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let header = safetensors_header(
        tensors.iter().map(|t| (t.name(), t.dtype(), t.shape())),
        metadata,
    );
    let file = File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    w.write_all(&header).map_err(io)?;
    for t in tensors {
        w.write_all(t.raw()).map_err(io)?;
    }
    w.flush().map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Tensor> {
        vec![
            Tensor::from_f32("a.weight", vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            Tensor::from_f32_as_bf16("b", vec![3], &[0.5, -1.0, 2.0]),
        ]
    }

    #[test]
    fn round_trip_keeps_names_shapes_and_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.safetensors");
        write_safetensors(&path, &sample(), &[("format", "pt")]).expect("write");
        let ck = Checkpoint::open_dir(dir.path()).expect("open");
        assert_eq!(ck.len(), 2);
        let a = ck.get("a.weight").expect("a");
        assert_eq!(a.shape(), &[2, 3]);
        assert_eq!(a.to_f32_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = ck.get("b").expect("b");
        assert_eq!(b.dtype(), DType::BF16);
        assert_eq!(b.to_f32_vec(), vec![0.5, -1.0, 2.0]);
    }

    #[test]
    fn truncated_file_is_an_error_naming_the_tensor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.safetensors");
        write_safetensors(&path, &sample(), &[]).expect("write");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 4]).expect("truncate");
        let err = crate::error_text(Checkpoint::open_dir(dir.path()));
        assert!(
            err.contains("tensor b") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn garbage_and_tiny_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, b"abc").expect("write");
        let err = crate::error_text(Checkpoint::open_dir(dir.path()));
        assert!(err.contains("too short"), "{err}");
        std::fs::write(&path, [255u8; 64]).expect("write");
        let err = crate::error_text(Checkpoint::open_dir(dir.path()));
        assert!(err.contains("header length"), "{err}");
    }

    #[test]
    fn sharded_folder_is_read_through_its_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = sample();
        write_safetensors(
            &dir.path().join("model-00001-of-00002.safetensors"),
            &t[..1],
            &[],
        )
        .expect("w1");
        write_safetensors(
            &dir.path().join("model-00002-of-00002.safetensors"),
            &t[1..],
            &[],
        )
        .expect("w2");
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"metadata":{},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#,
        )
        .expect("index");
        let ck = Checkpoint::open_dir(dir.path()).expect("open");
        assert_eq!(ck.len(), 2);
        assert_eq!(ck.files().len(), 2);
    }

    #[test]
    fn empty_folder_says_no_weights() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = crate::error_text(Checkpoint::open_dir(dir.path()));
        assert!(err.contains("no safetensors weights"), "{err}");
    }
}
