//! GGUF (versions 2 and 3, little-endian): the container llama.cpp and PrismML's packs use.
//!
//! Layout: `"GGUF"`, a `u32` version, a `u64` tensor count and a `u64` key/value count; then the
//! key/value pairs (a string key, a `u32` value type, the value); then one record per tensor (name,
//! `u32` dimension count, that many `u64` dimensions in ggml's `ne` order, innermost first, a
//! `u32` tensor type and a `u64` offset into the data region); then padding up to
//! `general.alignment` (32 when absent); then the data region. Strings are a `u64` byte length and
//! UTF-8 bytes; arrays are a `u32` element type, a `u64` count and the elements (arrays of arrays
//! carry their own type and count per element).
//!
//! The file is untrusted: every count and length is checked against the bytes that remain before
//! anything is allocated, nesting is bounded, every tensor's byte range must lie inside the data
//! region, start on the alignment and not overlap another, and a tensor type onepass cannot read
//! is refused naming its id and the tensor. Tensor data is handed out as slices of one memory map.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use onepass_tensor::{DType, Tensor};

use crate::quant::GgmlType;

mod write;
pub use write::{write_gguf, GgufStreamWriter, GgufTensorPlan, GgufWriteTensor};

/// The magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of the data region and of every tensor when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays nested deeper than this are refused (a hostile file could otherwise exhaust the stack).
const MAX_ARRAY_DEPTH: usize = 8;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// Errors reading a GGUF file. Every variant names the file; those about one key or tensor name it,
/// and those about bytes say where in the file they are.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (it does not start with the bytes \"GGUF\")")]
    Magic { path: PathBuf },
    #[error(
        "{path}: GGUF version {version} is not supported (onepass reads versions 2 and 3{hint})"
    )]
    Version {
        path: PathBuf,
        version: u32,
        hint: &'static str,
    },
    #[error("{path}: {what} at byte {offset} needs {need} bytes but the file has {len}; the file is truncated or corrupt")]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error("{path}: {what} at byte {offset} declares {count} entries, more than the {remaining} bytes left in the file could hold; the file is corrupt")]
    Count {
        path: PathBuf,
        what: String,
        offset: u64,
        count: u64,
        remaining: u64,
    },
    #[error("{path}: {what} at byte {offset} is not valid UTF-8")]
    Utf8 {
        path: PathBuf,
        what: String,
        offset: u64,
    },
    #[error("{path}: metadata key {key:?} at byte {offset}: {why}")]
    Value {
        path: PathBuf,
        key: String,
        offset: u64,
        why: String,
    },
    #[error("{path}: metadata key {key:?} appears twice")]
    DuplicateKey { path: PathBuf, key: String },
    #[error("{path}: metadata key {key:?}: {why}")]
    Metadata {
        path: PathBuf,
        key: String,
        why: String,
    },
    #[error("{path}: tensor {name:?} appears twice")]
    DuplicateTensor { path: PathBuf, name: String },
    #[error("{path}: tensor {name:?} has type id {type_id}, which onepass cannot read (it reads F32, F16, BF16, Q8_0, PQ2_0 and PTQ1_0); re-export the file with one of those types")]
    UnknownType {
        path: PathBuf,
        name: String,
        type_id: u32,
    },
    #[error("{path}: tensor {name:?}: {why}")]
    Tensor {
        path: PathBuf,
        name: String,
        why: String,
    },
    #[error("{path}: tensor {name:?} at data offset {offset} is not aligned to {alignment} bytes")]
    Misaligned {
        path: PathBuf,
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("{path}: tensor {name:?} spans bytes {begin}..{end} of the data region, which has {data_len} bytes (it starts at file byte {data_start}); the file is truncated or corrupt")]
    OutOfFile {
        path: PathBuf,
        name: String,
        begin: u64,
        end: u64,
        data_len: u64,
        data_start: u64,
    },
    #[error("{path}: tensors {first:?} (bytes {first_begin}..{first_end}) and {second:?} (bytes {second_begin}..{second_end}) overlap in the data region")]
    Overlap {
        path: PathBuf,
        first: String,
        first_begin: u64,
        first_end: u64,
        second: String,
        second_begin: u64,
        second_end: u64,
    },
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

/// A metadata array, typed by its element type.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
}

impl GgufValue {
    /// The GGUF name of the value's type (`u32`, `string`, `array[f32]`, ...), for messages.
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::U8(_) => "u8".into(),
            GgufValue::I8(_) => "i8".into(),
            GgufValue::U16(_) => "u16".into(),
            GgufValue::I16(_) => "i16".into(),
            GgufValue::U32(_) => "u32".into(),
            GgufValue::I32(_) => "i32".into(),
            GgufValue::U64(_) => "u64".into(),
            GgufValue::I64(_) => "i64".into(),
            GgufValue::F32(_) => "f32".into(),
            GgufValue::F64(_) => "f64".into(),
            GgufValue::Bool(_) => "bool".into(),
            GgufValue::String(_) => "string".into(),
            GgufValue::Array(a) => format!("array[{}]", a.element_type_name()),
        }
    }

    /// The value as an integer, if it is one of the integer types (any width or sign).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float, if it is `f32` or `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the element type, for messages.
    pub fn element_type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "u8",
            GgufArray::I8(_) => "i8",
            GgufArray::U16(_) => "u16",
            GgufArray::I16(_) => "i16",
            GgufArray::U32(_) => "u32",
            GgufArray::I32(_) => "i32",
            GgufArray::U64(_) => "u64",
            GgufArray::I64(_) => "i64",
            GgufArray::F32(_) => "f32",
            GgufArray::F64(_) => "f64",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "string",
            GgufArray::Array(_) => "array",
        }
    }

    /// The elements as integers, if the element type is an integer type (any width or sign).
    pub fn to_i128_vec(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            GgufArray::U8(v) => widen(v),
            GgufArray::I8(v) => widen(v),
            GgufArray::U16(v) => widen(v),
            GgufArray::I16(v) => widen(v),
            GgufArray::U32(v) => widen(v),
            GgufArray::I32(v) => widen(v),
            GgufArray::U64(v) => widen(v),
            GgufArray::I64(v) => widen(v),
            _ => return None,
        })
    }

    /// The elements as floats, if the element type is `f32` or `f64`.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        match self {
            GgufArray::F32(v) => Some(v.iter().map(|&x| x.into()).collect()),
            GgufArray::F64(v) => Some(v.clone()),
            _ => None,
        }
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }
}

/// One tensor record of the header, checked against the file.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    pub name: String,
    /// The dimensions in ggml's `ne` order: `ne[0]` is the innermost (contiguous) one, so a
    /// `[N, K]` row-major matrix is stored as `ne = [K, N]`.
    pub ne: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the first byte from the start of the data region.
    pub offset: u64,
    /// Number of bytes the tensor occupies.
    pub nbytes: u64,
}

impl GgufTensorInfo {
    /// The shape outermost first (the reverse of `ne`), the convention of the rest of onepass.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn numel(&self) -> u64 {
        self.ne.iter().product()
    }
}

enum Backing {
    Mmap(Arc<Mmap>),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: its metadata and its tensors, the data memory-mapped.
pub struct Gguf {
    path: PathBuf,
    backing: Backing,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    by_key: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .finish()
    }
}

impl Gguf {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and onepass never writes model files while they are open;
        // a file truncated underneath a running process is the usual mmap caveat.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), Backing::Mmap(Arc::new(map)))
    }

    /// Parses a GGUF file held in memory; `origin` names it in errors.
    pub fn from_bytes(origin: &str, bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Self::parse(PathBuf::from(origin), Backing::Owned(bytes))
    }

    fn parse(path: PathBuf, backing: Backing) -> Result<Gguf, GgufError> {
        let header = {
            let mut r = Reader {
                bytes: backing.bytes(),
                pos: 0,
                path: &path,
            };
            read_header(&mut r)?
        };
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let by_key = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Ok(Gguf {
            path,
            backing,
            version: header.version,
            metadata: header.metadata,
            by_key,
            tensors: header.tensors,
            by_name,
            alignment: header.alignment,
            data_start: header.data_start,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    /// `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// File offset of the data region.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }
    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }
    /// The metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.by_key.get(key).map(|&i| &self.metadata[i].1)
    }
    /// The tensor records in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor (already checked to lie inside the file).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        let begin = (self.data_start + info.offset) as usize;
        &self.backing.bytes()[begin..begin + info.nbytes as usize]
    }

    /// A tensor as a [`Tensor`] (shape outermost first) in the type it is stored in: a slice of the
    /// memory map (no copy) for every type, the ternary kernels reading PQ2_0 and PTQ1_0 blocks as
    /// stored. A file held in memory gives owned copies.
    pub fn tensor_data_as_tensor(&self, info: &GgufTensorInfo) -> Result<Tensor, GgufError> {
        let bad = |why: String| GgufError::Tensor {
            path: self.path.clone(),
            name: info.name.clone(),
            why,
        };
        let dtype = match info.ggml_type {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            GgmlType::Q8_0 => DType::Q8_0,
            GgmlType::PQ2_0 => DType::PQ2_0,
            GgmlType::PTQ1_0 => DType::PTQ1_0,
        };
        let shape = info.shape();
        let begin = (self.data_start + info.offset) as usize;
        let len = info.nbytes as usize;
        let made = match &self.backing {
            Backing::Mmap(map) => Tensor::mapped(&info.name, dtype, shape, map.clone(), begin, len),
            Backing::Owned(v) => Tensor::from_raw(&info.name, dtype, shape, &v[begin..begin + len]),
        };
        made.map_err(|e| bad(e.to_string()))
    }

    /// Tells the kernel that the bytes of `info` will not be read again (their pages are dropped from
    /// this process's resident memory; a later read faults them back in from the file). Used after a
    /// tensor was copied out, reordered, so the copy does not count twice. Does nothing for a file held
    /// in memory.
    pub fn release(&self, info: &GgufTensorInfo) {
        #[cfg(unix)]
        if let Backing::Mmap(map) = &self.backing {
            let page = 4096usize;
            let begin = (self.data_start + info.offset) as usize;
            let end = begin + info.nbytes as usize;
            let (b, e) = (begin.next_multiple_of(page), end / page * page);
            if e > b {
                // SAFETY: the map is private and read-only, so dropping its pages loses nothing: any later
                // access reads the file again. No reference into these bytes is used after this call by
                // the loader (the tensor was copied).
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, b, e - b)
                };
            }
        }
        #[cfg(not(unix))]
        let _ = info;
    }

    /// A metadata error naming `key`, for typed views built on this file.
    pub fn metadata_error(&self, key: &str, why: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            why: why.into(),
        }
    }

    /// A required string value.
    pub fn str_value(&self, key: &str) -> Result<&str, GgufError> {
        match self.get(key) {
            None => Err(self.metadata_error(key, "is missing")),
            Some(GgufValue::String(s)) => Ok(s),
            Some(v) => {
                Err(self.metadata_error(key, format!("expected a string, found {}", v.type_name())))
            }
        }
    }

    /// A required integer value of any integer type that fits `u64`.
    pub fn u64_value(&self, key: &str) -> Result<u64, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.metadata_error(key, "is missing"))?;
        let i = v.as_i128().ok_or_else(|| {
            self.metadata_error(key, format!("expected an integer, found {}", v.type_name()))
        })?;
        u64::try_from(i).map_err(|_| self.metadata_error(key, format!("{i} is negative")))
    }

    /// A required array value.
    pub fn array_value(&self, key: &str) -> Result<&GgufArray, GgufError> {
        match self.get(key) {
            None => Err(self.metadata_error(key, "is missing")),
            Some(GgufValue::Array(a)) => Ok(a),
            Some(v) => {
                Err(self.metadata_error(key, format!("expected an array, found {}", v.type_name())))
            }
        }
    }
}

struct Header {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_start: u64,
}

fn read_header(r: &mut Reader<'_>) -> Result<Header, GgufError> {
    if r.bytes.len() < 4 || &r.bytes[..4] != GGUF_MAGIC {
        return Err(GgufError::Magic {
            path: r.path.to_path_buf(),
        });
    }
    r.pos = 4;
    let version = r.u32("the version")?;
    if version != 2 && version != 3 {
        let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            "; this file is big-endian, onepass reads little-endian files"
        } else if version == 1 {
            "; version 1 files predate 64-bit counts, convert the model again with a current llama.cpp"
        } else {
            ""
        };
        return Err(GgufError::Version {
            path: r.path.to_path_buf(),
            version,
            hint,
        });
    }
    let n_tensors_at = r.pos as u64;
    let n_tensors = r.u64("the tensor count")?;
    let n_kv_at = r.pos as u64;
    let n_kv = r.u64("the metadata count")?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor record at
    // least 8 + 4 + 4 + 8.
    r.check_count("the metadata count", n_kv_at, n_kv, 13)?;
    r.check_count("the tensor count", n_tensors_at, n_tensors, 24)?;

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut keys = BTreeSet::new();
    for _ in 0..n_kv {
        let key = r.string("a metadata key")?;
        let type_at = r.pos as u64;
        let value_type = r.u32(&format!("the type of metadata key {key:?}"))?;
        let value = r.value(&key, value_type, type_at, 0)?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey {
                path: r.path.to_path_buf(),
                key,
            });
        }
        metadata.push((key, value));
    }

    let alignment_value = metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .map(|(_, v)| v);
    let alignment = match alignment_value {
        None => GGUF_DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
        Some(GgufValue::U32(a)) => {
            return Err(GgufError::Metadata {
                path: r.path.to_path_buf(),
                key: "general.alignment".into(),
                why: format!("{a} is not a power of two"),
            })
        }
        Some(v) => {
            return Err(GgufError::Metadata {
                path: r.path.to_path_buf(),
                key: "general.alignment".into(),
                why: format!("expected a u32, found {}", v.type_name()),
            })
        }
    };

    let mut tensors: Vec<GgufTensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = r.string("a tensor name")?;
        if seen.insert(name.clone(), ()).is_some() {
            return Err(GgufError::DuplicateTensor {
                path: r.path.to_path_buf(),
                name,
            });
        }
        let tensor_err = |why: String| GgufError::Tensor {
            path: r.path.to_path_buf(),
            name: name.clone(),
            why,
        };
        let n_dims = r.u32(&format!("the dimension count of tensor {name:?}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(tensor_err(format!(
                "{n_dims} dimensions (ggml tensors have 1 to {MAX_DIMS})"
            )));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(r.u64(&format!("a dimension of tensor {name:?}"))?);
        }
        let type_id = r.u32(&format!("the type of tensor {name:?}"))?;
        let offset = r.u64(&format!("the data offset of tensor {name:?}"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownType {
            path: r.path.to_path_buf(),
            name: name.clone(),
            type_id,
        })?;
        if ne.contains(&0) {
            return Err(tensor_err(format!("has a zero dimension (ne = {ne:?})")));
        }
        let numel = ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| tensor_err(format!("dimensions {ne:?} overflow")))?;
        let block = ggml_type.block_len() as u64;
        if ne[0] % block != 0 {
            return Err(tensor_err(format!(
                "its innermost dimension {} is not a multiple of the {} block of {block} values",
                ne[0],
                ggml_type.name()
            )));
        }
        let nbytes = (numel / block)
            .checked_mul(ggml_type.block_bytes() as u64)
            .ok_or_else(|| tensor_err(format!("byte size of {ne:?} overflows")))?;
        if offset % alignment != 0 {
            return Err(GgufError::Misaligned {
                path: r.path.to_path_buf(),
                name,
                offset,
                alignment,
            });
        }
        tensors.push(GgufTensorInfo {
            name,
            ne,
            ggml_type,
            offset,
            nbytes,
        });
    }

    let file_len = r.bytes.len() as u64;
    let header_end = r.pos as u64;
    let data_start = header_end.div_ceil(alignment) * alignment;
    // A file with no tensors may end right after its header, without the padding.
    let data_len = file_len.saturating_sub(data_start);
    for t in &tensors {
        let end = t.offset.checked_add(t.nbytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(GgufError::OutOfFile {
                path: r.path.to_path_buf(),
                name: t.name.clone(),
                begin: t.offset,
                end: end.unwrap_or(u64::MAX),
                data_len,
                data_start,
            });
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if a.offset + a.nbytes > b.offset {
            return Err(GgufError::Overlap {
                path: r.path.to_path_buf(),
                first: a.name.clone(),
                first_begin: a.offset,
                first_end: a.offset + a.nbytes,
                second: b.name.clone(),
                second_begin: b.offset,
                second_end: b.offset + b.nbytes,
            });
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

/// A cursor over the file's bytes that never reads past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl Reader<'_> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset: self.pos as u64,
                need: n,
                len: self.bytes.len() as u64,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuses a count of elements of at least `min_size` bytes each that cannot fit in the rest
    /// of the file, before anything is allocated for it.
    fn check_count(
        &self,
        what: &str,
        offset: u64,
        count: u64,
        min_size: u64,
    ) -> Result<(), GgufError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(GgufError::Count {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset,
                count,
                remaining: self.remaining(),
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(&format!("the length of {what}"))?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(GgufError::Utf8 {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset: at,
            }),
        }
    }

    fn value(
        &mut self,
        key: &str,
        value_type: u32,
        type_at: u64,
        depth: usize,
    ) -> Result<GgufValue, GgufError> {
        let what = format!("the value of metadata key {key:?}");
        Ok(match value_type {
            0 => GgufValue::U8(self.array::<1>(&what)?[0]),
            1 => GgufValue::I8(self.array::<1>(&what)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => GgufValue::Bool(self.bool(key, &what)?),
            8 => GgufValue::String(self.string(&what)?),
            9 => GgufValue::Array(self.array_value(key, depth)?),
            10 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            other => {
                return Err(GgufError::Value {
                    path: self.path.to_path_buf(),
                    key: key.to_string(),
                    offset: type_at,
                    why: format!("unknown value type {other} (GGUF defines 0 to 12)"),
                })
            }
        })
    }

    fn bool(&mut self, key: &str, what: &str) -> Result<bool, GgufError> {
        let at = self.pos as u64;
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(GgufError::Value {
                path: self.path.to_path_buf(),
                key: key.to_string(),
                offset: at,
                why: format!("a bool byte must be 0 or 1, found {b}"),
            }),
        }
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufArray, GgufError> {
        let at = self.pos as u64;
        let bad = |why: String| GgufError::Value {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            offset: at,
            why,
        };
        if depth >= MAX_ARRAY_DEPTH {
            return Err(bad(format!(
                "arrays nested more than {MAX_ARRAY_DEPTH} deep"
            )));
        }
        let what = format!("the array of metadata key {key:?}");
        let elem_type = self.u32(&what)?;
        let count_at = self.pos as u64;
        let count = self.u64(&what)?;
        // Smallest encoding of one element: strings are at least their 8-byte length, arrays
        // their 12-byte type and count.
        let min_size = match elem_type {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => {
                return Err(GgufError::Value {
                    path: self.path.to_path_buf(),
                    key: key.to_string(),
                    offset: at,
                    why: format!("unknown array element type {other} (GGUF defines 0 to 12)"),
                })
            }
        };
        self.check_count(&what, count_at, count, min_size)?;
        let n = count as usize;
        fn fixed<const N: usize, T>(
            r: &mut Reader<'_>,
            n: usize,
            what: &str,
            f: fn([u8; N]) -> T,
        ) -> Result<Vec<T>, GgufError> {
            let bytes = r.take((n * N) as u64, what)?;
            Ok(bytes
                .chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect())
        }
        Ok(match elem_type {
            0 => GgufArray::U8(self.take(n as u64, &what)?.to_vec()),
            1 => GgufArray::I8(fixed(self, n, &what, |[b]| b as i8)?),
            2 => GgufArray::U16(fixed(self, n, &what, u16::from_le_bytes)?),
            3 => GgufArray::I16(fixed(self, n, &what, i16::from_le_bytes)?),
            4 => GgufArray::U32(fixed(self, n, &what, u32::from_le_bytes)?),
            5 => GgufArray::I32(fixed(self, n, &what, i32::from_le_bytes)?),
            6 => GgufArray::F32(fixed(self, n, &what, f32::from_le_bytes)?),
            7 => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.bool(key, &what)?);
                }
                GgufArray::Bool(out)
            }
            8 => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.string(&format!("an element of {what}"))?);
                }
                GgufArray::String(out)
            }
            9 => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.array_value(key, depth + 1)?);
                }
                GgufArray::Array(out)
            }
            10 => GgufArray::U64(fixed(self, n, &what, u64::from_le_bytes)?),
            11 => GgufArray::I64(fixed(self, n, &what, i64::from_le_bytes)?),
            _ => GgufArray::F64(fixed(self, n, &what, f64::from_le_bytes)?),
        })
    }
}
