//! Shapes, dtypes and weight storage for onepass.
//!
//! This crate exists so that every other crate agrees on what a weight *is*: a named, shaped
//! block of numbers in one element format, living in a memory-mapped checkpoint file, in an owned
//! buffer, or in anonymous memory of the process's own (the CPU's copies and regrouped forms). It
//! does no arithmetic; kernels read weights through the typed views here and dispatch on [`DType`]
//! (a weight format belongs to the tensor, not to the model).

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;

/// Element format of a stored tensor: a float type, or a block format of GGUF files whose rows are whole
/// blocks (the innermost dimension is a multiple of [`DType::block_len`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    /// Blocks of 32 values: an f16 scale `d`, then 32 `i8` codes `q`; value `q·d` (34 bytes).
    Q8_0,
    /// Ternary blocks of 128 values: an f16 scale `d`, then 32 bytes of 2-bit codes, value `j` in bits
    /// `2·(j % 4)` of byte `j / 4`; value `(code − 1)·d` (34 bytes).
    PQ2_0,
    /// Ternary blocks of 128 values in base 3: 24 bytes of five trits, 2 bytes of four, then the f16 scale
    /// `d`; value `(trit − 1)·d` (28 bytes; the trit order is GGUF's PTQ1_0, see docs/formats.md).
    PTQ1_0,
    /// Q8_0 blocks regrouped in memory for the CPU's integer kernels (never in a file; see
    /// [`Tensor::grouped`]): groups of 16 blocks (512 values), eight 64-byte registers where byte `4j + b`
    /// of register `r` is code `4r + b` of block `j` plus 128 (as an unsigned byte), then the 16 blocks' f16
    /// scales (544 bytes, as many as the 16 blocks take in Q8_0).
    Q8_0G,
    /// PQ2_0 blocks regrouped in memory for the CPU's integer kernels (never in a file; see
    /// [`Tensor::grouped`]): groups of 8 blocks (1024 values), four 64-byte registers where byte `4L + b` of
    /// register `q` is code byte `16·(L / 8) + 4q + b` of block `L mod 8` (so each 32-bit lane belongs to one
    /// block), then the 8 blocks' f16 scales (272 bytes, as many as the 8 blocks take in PQ2_0).
    PQ2_0G,
}

/// Values per [`DType::PQ2_0G`] group.
pub const PQ2_0G_VALUES: usize = 1024;
/// Bytes per [`DType::PQ2_0G`] group: the four code registers, then the 8 scales.
pub const PQ2_0G_BYTES: usize = 4 * 64 + 2 * 8;

/// Values per [`DType::Q8_0G`] group.
pub const Q8_0G_VALUES: usize = 512;
/// Bytes per [`DType::Q8_0G`] group: the eight code registers, then the 16 scales.
pub const Q8_0G_BYTES: usize = 8 * 64 + 2 * 16;

impl DType {
    /// Bytes per block (per element for the float types).
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::Q8_0 | DType::PQ2_0 => 34,
            DType::PTQ1_0 => 28,
            DType::Q8_0G => Q8_0G_BYTES,
            DType::PQ2_0G => PQ2_0G_BYTES,
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::BF16 | DType::F16 => 1,
            DType::Q8_0 => 32,
            DType::PQ2_0 | DType::PTQ1_0 => 128,
            DType::Q8_0G => Q8_0G_VALUES,
            DType::PQ2_0G => PQ2_0G_VALUES,
        }
    }

    /// Whether the values are stored as plain floats (one element, one number).
    pub fn is_float(self) -> bool {
        self.block_len() == 1
    }

    /// The safetensors / GGUF spelling (`F32`, `BF16`, `F16`, `Q8_0`, `PQ2_0`, `PTQ1_0`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::Q8_0 => "Q8_0",
            DType::PQ2_0 => "PQ2_0",
            DType::PTQ1_0 => "PTQ1_0",
            DType::Q8_0G => "Q8_0 (grouped)",
            DType::PQ2_0G => "PQ2_0 (grouped)",
        }
    }

    /// Bytes that `numel` values take (`numel` a whole number of blocks).
    pub fn bytes_for(self, numel: usize) -> usize {
        numel / self.block_len() * self.size()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the bytes of a tensor live.
#[derive(Clone)]
enum Bytes {
    /// A slice of a memory-mapped file (aligned to the element size).
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    /// An owned buffer of 32-bit words, so every element type is aligned.
    Owned(Arc<Vec<u32>>, usize),
    /// An anonymous map of this process's own (a regrouped weight): page-aligned, asking for huge pages where the
    /// system gives them, and handed back to the system when dropped (a large `Vec` freed can stay in the
    /// allocator's heap).
    Anon(Arc<Mmap>, usize),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            Bytes::Anon(map, len) => &map[..*len],
            Bytes::Owned(words, len) => {
                // SAFETY: a Vec<u32> is a valid, initialised byte buffer of 4 * words.len() bytes
                // and `len` never exceeds that.
                let all = unsafe {
                    std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 4)
                };
                &all[..*len]
            }
        }
    }
}

/// Typed view of a tensor's elements (the block formats as their raw blocks).
pub enum View<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
    Q8_0(&'a [u8]),
    PQ2_0(&'a [u8]),
    PTQ1_0(&'a [u8]),
    Q8_0G(&'a [u8]),
    PQ2_0G(&'a [u8]),
}

/// A named tensor with a shape and an element format (outermost dimension first).
#[derive(Clone)]
pub struct Tensor {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    bytes: Bytes,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {} {:?})", self.name, self.dtype, self.shape)
    }
}

/// Errors building a tensor from bytes.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error(
        "tensor {name}: {dtype} {shape:?} is not a whole number of {block}-value blocks per row"
    )]
    Blocks {
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        block: usize,
    },
    #[error("tensor {name}: {len} bytes cannot hold {dtype} {shape:?} ({expected} bytes)")]
    Size {
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        len: usize,
        expected: usize,
    },
}

fn element_count(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Checks that every row of `shape` is whole blocks of `dtype` and returns the byte size.
fn checked_bytes(name: &str, dtype: DType, shape: &[usize]) -> Result<usize, TensorError> {
    let inner = shape.last().copied().unwrap_or(1);
    if !inner.is_multiple_of(dtype.block_len()) {
        return Err(TensorError::Blocks {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            block: dtype.block_len(),
        });
    }
    Ok(dtype.bytes_for(element_count(shape)))
}

impl Tensor {
    /// A tensor over `len` bytes at `offset` of a mapped file. Copies into an owned buffer when
    /// the bytes are not aligned to the element size.
    pub fn mapped(
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    ) -> Result<Self, TensorError> {
        let expected = checked_bytes(name, dtype, &shape)?;
        if len != expected || offset + len > map.len() {
            return Err(TensorError::Size {
                name: name.to_string(),
                dtype,
                shape,
                len,
                expected,
            });
        }
        // Block formats are read byte by byte; the float types need their element alignment.
        let align = if dtype.is_float() { dtype.size() } else { 1 };
        let aligned = (map.as_ptr() as usize + offset).is_multiple_of(align);
        let bytes = if aligned {
            Bytes::Mapped { map, offset, len }
        } else {
            owned_bytes(&map[offset..offset + len])
        };
        Ok(Tensor {
            name: name.to_string(),
            dtype,
            shape,
            bytes,
        })
    }

    /// An owned tensor holding a copy of `raw` (the type's little-endian layout).
    pub fn from_raw(
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        raw: &[u8],
    ) -> Result<Self, TensorError> {
        let expected = checked_bytes(name, dtype, &shape)?;
        if raw.len() != expected {
            return Err(TensorError::Size {
                name: name.to_string(),
                dtype,
                shape,
                len: raw.len(),
                expected,
            });
        }
        Ok(Tensor {
            name: name.to_string(),
            dtype,
            shape,
            bytes: owned_bytes(raw),
        })
    }

    /// The same tensor with another shape of the same element count (storage shared), e.g. a squeezed
    /// dimension. Panics if the counts differ or a row would split a block (programming errors).
    pub fn reshaped(&self, shape: Vec<usize>) -> Self {
        assert_eq!(element_count(&shape), self.numel(), "reshape {}", self.name);
        assert!(
            shape
                .last()
                .copied()
                .unwrap_or(1)
                .is_multiple_of(self.dtype.block_len()),
            "reshape {}: rows must be whole blocks",
            self.name
        );
        Tensor {
            shape,
            ..self.clone()
        }
    }

    /// Whether the bytes are a slice of a memory-mapped file (not an owned copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped { .. })
    }

    /// Tells the kernel that this process will not read the tensor's mapped bytes for a while: the whole pages
    /// inside them leave its resident memory (a later read faults them back in from the file, so nothing is lost;
    /// the maps are of files, read-only). Used after a copy of the tensor replaced it, so that the copy does not
    /// count twice. Does nothing for an owned tensor.
    pub fn release_mapped_pages(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped { map, offset, len } = &self.bytes {
            let page = 4096usize;
            let (b, e) = (offset.next_multiple_of(page), (offset + len) / page * page);
            if e > b {
                // SAFETY: the map is a private read-only map of a file, so dropping its pages loses nothing: any
                // later access reads the file again.
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, b, e - b)
                };
            }
        }
    }

    /// An owned f32 tensor.
    pub fn from_f32(name: &str, shape: Vec<usize>, data: &[f32]) -> Self {
        assert_eq!(
            element_count(&shape),
            data.len(),
            "tensor {name}: shape {shape:?} vs {} values",
            data.len()
        );
        let words: Vec<u32> = data.iter().map(|v| v.to_bits()).collect();
        let len = words.len() * 4;
        Tensor {
            name: name.to_string(),
            dtype: DType::F32,
            shape,
            bytes: Bytes::Owned(Arc::new(words), len),
        }
    }

    /// An owned bf16 tensor (values rounded to nearest even).
    pub fn from_f32_as_bf16(name: &str, shape: Vec<usize>, data: &[f32]) -> Self {
        assert_eq!(
            element_count(&shape),
            data.len(),
            "tensor {name}: shape {shape:?} vs {} values",
            data.len()
        );
        let raw: Vec<u8> = data
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let bytes = owned_bytes(&raw);
        Tensor {
            name: name.to_string(),
            dtype: DType::BF16,
            shape,
            bytes,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn numel(&self) -> usize {
        element_count(&self.shape)
    }
    /// Bytes of storage.
    pub fn byte_len(&self) -> usize {
        self.dtype.bytes_for(self.numel())
    }
    /// The raw little-endian bytes.
    pub fn raw(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Typed view of all elements.
    pub fn view(&self) -> View<'_> {
        let raw = self.bytes.as_slice();
        let n = self.numel();
        // SAFETY: construction guarantees the bytes are aligned to the element size and hold
        // exactly `n` elements; f32/bf16/f16 have no invalid bit patterns.
        unsafe {
            match self.dtype {
                DType::F32 => View::F32(std::slice::from_raw_parts(raw.as_ptr() as *const f32, n)),
                DType::BF16 => {
                    View::BF16(std::slice::from_raw_parts(raw.as_ptr() as *const bf16, n))
                }
                DType::F16 => View::F16(std::slice::from_raw_parts(raw.as_ptr() as *const f16, n)),
                DType::Q8_0 => View::Q8_0(raw),
                DType::PQ2_0 => View::PQ2_0(raw),
                DType::PTQ1_0 => View::PTQ1_0(raw),
                DType::Q8_0G => View::Q8_0G(raw),
                DType::PQ2_0G => View::PQ2_0G(raw),
            }
        }
    }

    /// All elements converted to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel()];
        self.read_f32(0, &mut out);
        out
    }

    /// Converts `out.len()` elements starting at flat index `start` to f32 (exact for every type: a
    /// block value `q·d` is an f16 times a small integer). For the block formats `start` and the length
    /// must be whole blocks (a row, for example); panics otherwise (a programming error).
    pub fn read_f32(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        let bl = self.dtype.block_len();
        if bl > 1 {
            assert!(
                start.is_multiple_of(bl) && out.len().is_multiple_of(bl),
                "read_f32 {}: {start}..{end} is not whole {bl}-value blocks",
                self.name
            );
        }
        match self.view() {
            View::F32(v) => out.copy_from_slice(&v[start..end]),
            View::BF16(v) => {
                for (o, x) in out.iter_mut().zip(&v[start..end]) {
                    *o = x.to_f32();
                }
            }
            View::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[start..end]) {
                    *o = x.to_f32();
                }
            }
            View::Q8_0(raw) => {
                let blocks = &raw[start / bl * 34..end / bl * 34];
                for (o, b) in out.chunks_exact_mut(bl).zip(blocks.chunks_exact(34)) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    for (o, &q) in o.iter_mut().zip(&b[2..]) {
                        *o = f32::from(q as i8) * d;
                    }
                }
            }
            View::PQ2_0(raw) => {
                let blocks = &raw[start / bl * 34..end / bl * 34];
                for (o, b) in out.chunks_exact_mut(bl).zip(blocks.chunks_exact(34)) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    for (j, o) in o.iter_mut().enumerate() {
                        let code = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
                        *o = (f32::from(code) - 1.0) * d;
                    }
                }
            }
            View::Q8_0G(raw) => {
                let groups = &raw[start / bl * Q8_0G_BYTES..end / bl * Q8_0G_BYTES];
                for (o, g) in out
                    .chunks_exact_mut(bl)
                    .zip(groups.chunks_exact(Q8_0G_BYTES))
                {
                    for (u, o) in o.iter_mut().enumerate() {
                        let (j, b) = (u / 32, u % 32);
                        let code = (g[64 * (b / 4) + 4 * j + b % 4] ^ 0x80) as i8;
                        let d = f16::from_le_bytes([g[512 + 2 * j], g[513 + 2 * j]]).to_f32();
                        *o = f32::from(code) * d;
                    }
                }
            }
            View::PQ2_0G(raw) => {
                let groups = &raw[start / bl * PQ2_0G_BYTES..end / bl * PQ2_0G_BYTES];
                for (o, g) in out
                    .chunks_exact_mut(bl)
                    .zip(groups.chunks_exact(PQ2_0G_BYTES))
                {
                    for (u, o) in o.iter_mut().enumerate() {
                        let (j, v) = (u / 128, u % 128);
                        let code = (g[pq2_0g_byte(j, v / 4)] >> (2 * (v % 4))) & 3;
                        let d = f16::from_le_bytes([g[256 + 2 * j], g[257 + 2 * j]]).to_f32();
                        *o = (f32::from(code) - 1.0) * d;
                    }
                }
            }
            View::PTQ1_0(raw) => {
                let blocks = &raw[start / bl * 28..end / bl * 28];
                for (o, b) in out.chunks_exact_mut(bl).zip(blocks.chunks_exact(28)) {
                    let d = f16::from_le_bytes([b[26], b[27]]).to_f32();
                    for (j, o) in o.iter_mut().enumerate() {
                        // Trit n of byte m: values 16n + m (m < 16), 80 + 8n + (m − 16) (m < 24),
                        // 120 + 2n + (m − 24).
                        let (m, n) = match j {
                            0..80 => (j % 16, j / 16),
                            80..120 => (16 + (j - 80) % 8, (j - 80) / 8),
                            _ => (24 + (j - 120) % 2, (j - 120) / 2),
                        };
                        let u = u32::from(b[m]) * 3u32.pow(n as u32) % 256;
                        *o = ((u * 3 / 256) as f32 - 1.0) * d;
                    }
                }
            }
        }
    }

    /// A 2-D Q8_0 or PQ2_0 tensor regrouped as [`DType::Q8_0G`] or [`DType::PQ2_0G`] (an owned copy; the same
    /// values in as many bytes), or `None` for other types and for rows that are not whole groups (512 values for
    /// Q8_0, 1024 for PQ2_0).
    pub fn grouped(&self) -> Option<Tensor> {
        let (&[n, k], dtype) = (self.shape(), self.dtype) else {
            return None;
        };
        let (to, regroup): (DType, RowRegroup) = match dtype {
            DType::Q8_0 => (DType::Q8_0G, group_q8_0_row),
            DType::PQ2_0 => (DType::PQ2_0G, group_pq2_0_row),
            _ => return None,
        };
        if !k.is_multiple_of(to.block_len()) {
            return None;
        }
        let (row_in, row_out) = (dtype.bytes_for(k), to.bytes_for(k));
        let bytes = anon_bytes(to.bytes_for(n * k), |out| {
            for (src, dst) in self
                .raw()
                .chunks_exact(row_in)
                .zip(out.chunks_exact_mut(row_out))
            {
                regroup(src, dst);
            }
        });
        Some(Tensor {
            name: self.name.clone(),
            dtype: to,
            shape: self.shape.clone(),
            bytes,
        })
    }

    /// A copy in anonymous memory of its own that asks for huge pages (the same type and bytes).
    pub fn to_anon(&self) -> Tensor {
        let raw = self.raw();
        Tensor {
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            bytes: anon_bytes(raw.len(), |out| out.copy_from_slice(raw)),
        }
    }

    /// Whether the bytes are in anonymous memory of this process's own ([`Tensor::to_anon`], [`Tensor::grouped`],
    /// a large owned copy).
    pub fn is_anon(&self) -> bool {
        matches!(self.bytes, Bytes::Anon(..))
    }

    /// The bytes as a file stores the tensor: a regrouped tensor's blocks back in order (Q8_0 or PQ2_0), the bytes
    /// of any other.
    pub fn file_blocks(&self) -> std::borrow::Cow<'_, [u8]> {
        let raw = self.raw();
        if !matches!(self.dtype, DType::Q8_0G | DType::PQ2_0G) {
            return raw.into();
        }
        let mut out = vec![0u8; raw.len()];
        match self.dtype {
            DType::Q8_0G => {
                for (g, o) in raw
                    .chunks_exact(Q8_0G_BYTES)
                    .zip(out.chunks_exact_mut(Q8_0G_BYTES))
                {
                    for (j, block) in o.chunks_exact_mut(34).enumerate() {
                        block[..2].copy_from_slice(&g[512 + 2 * j..514 + 2 * j]);
                        for (v, c) in block[2..].iter_mut().enumerate() {
                            *c = g[64 * (v / 4) + 4 * j + v % 4] ^ 0x80;
                        }
                    }
                }
            }
            DType::PQ2_0G => {
                for (g, o) in raw
                    .chunks_exact(PQ2_0G_BYTES)
                    .zip(out.chunks_exact_mut(PQ2_0G_BYTES))
                {
                    for (j, block) in o.chunks_exact_mut(34).enumerate() {
                        block[..2].copy_from_slice(&g[256 + 2 * j..258 + 2 * j]);
                        for (i, c) in block[2..].iter_mut().enumerate() {
                            *c = g[pq2_0g_byte(j, i)];
                        }
                    }
                }
            }
            _ => unreachable!("only the regrouped forms are rewritten"),
        }
        out.into()
    }

    /// Same tensor with a new name (storage shared).
    pub fn renamed(&self, name: &str) -> Self {
        Tensor {
            name: name.to_string(),
            ..self.clone()
        }
    }
}

/// Regroups one row of Q8_0 blocks (`src`) as [`DType::Q8_0G`] groups into `dst` (whole groups; blocks past the
/// row's end are written as code 0 with scale 0, so a row of any whole number of blocks can be regrouped).
pub fn group_q8_0_row(src: &[u8], dst: &mut [u8]) {
    let blocks = src.len() / 34;
    assert!(
        src.len() == blocks * 34 && dst.len() == blocks.div_ceil(16) * Q8_0G_BYTES,
        "group_q8_0_row: {} bytes into {}",
        src.len(),
        dst.len()
    );
    // Code 0, scale 0.
    const PAD: [u8; 34] = [0; 34];
    for (g, out) in dst.chunks_exact_mut(Q8_0G_BYTES).enumerate() {
        for j in 0..16 {
            let block = src
                .get((16 * g + j) * 34..(16 * g + j + 1) * 34)
                .unwrap_or(&PAD);
            // Four codes at a time, each + 128.
            for r in 0..8 {
                let w = u32::from_le_bytes([
                    block[2 + 4 * r],
                    block[3 + 4 * r],
                    block[4 + 4 * r],
                    block[5 + 4 * r],
                ]) ^ 0x8080_8080;
                out[64 * r + 4 * j..64 * r + 4 * j + 4].copy_from_slice(&w.to_le_bytes());
            }
            out[512 + 2 * j..512 + 2 * j + 2].copy_from_slice(&block[..2]);
        }
    }
}

/// Regroups one row of blocks into its grouped form ([`group_q8_0_row`], [`group_pq2_0_row`]).
type RowRegroup = fn(&[u8], &mut [u8]);

/// Where code byte `i` (0..32) of block `j` (0..8) of a [`DType::PQ2_0G`] group lies: lane `j + 8·(i / 16)` of
/// register `(i mod 16) / 4`, byte `i mod 4`.
#[inline]
pub fn pq2_0g_byte(j: usize, i: usize) -> usize {
    64 * ((i % 16) / 4) + 4 * (j + 8 * (i / 16)) + i % 4
}

/// Regroups one row of PQ2_0 blocks (`src`) as [`DType::PQ2_0G`] groups into `dst` (whole groups; blocks past
/// the row's end are written as code 1, value 0, with scale 0).
pub fn group_pq2_0_row(src: &[u8], dst: &mut [u8]) {
    let blocks = src.len() / 34;
    assert!(
        src.len() == blocks * 34 && dst.len() == blocks.div_ceil(8) * PQ2_0G_BYTES,
        "group_pq2_0_row: {} bytes into {}",
        src.len(),
        dst.len()
    );
    // Scale 0, every code 1.
    const PAD: [u8; 34] = {
        let mut b = [0x55u8; 34];
        (b[0], b[1]) = (0, 0);
        b
    };
    for (g, out) in dst.chunks_exact_mut(PQ2_0G_BYTES).enumerate() {
        for j in 0..8 {
            let block = src
                .get((8 * g + j) * 34..(8 * g + j + 1) * 34)
                .unwrap_or(&PAD);
            // Four code bytes at a time: one 32-bit lane.
            for i in (0..32).step_by(4) {
                let at = pq2_0g_byte(j, i);
                out[at..at + 4].copy_from_slice(&block[2 + i..6 + i]);
            }
            out[256 + 2 * j..256 + 2 * j + 2].copy_from_slice(&block[..2]);
        }
    }
}

/// `len` bytes written by `fill`, in an anonymous map that asks for huge pages ([`Bytes::Anon`]); in an owned
/// buffer if the system refuses the map.
fn anon_bytes(len: usize, fill: impl Fn(&mut [u8])) -> Bytes {
    if let Ok(mut map) = memmap2::MmapMut::map_anon(len.max(1)) {
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        fill(&mut map[..len]);
        if let Ok(map) = map.make_read_only() {
            return Bytes::Anon(Arc::new(map), len);
        }
    }
    let mut words = vec![0u32; len.div_ceil(4)];
    // SAFETY: u32 words are valid as 4·words.len() ≥ len bytes.
    fill(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, len) });
    Bytes::Owned(Arc::new(words), len)
}

/// A copy of `raw`: in an anonymous map from 1 MiB on (whose memory goes back to the system when the tensor is
/// dropped, as when a model regroups its weights), else in a `Vec`.
fn owned_bytes(raw: &[u8]) -> Bytes {
    if raw.len() >= 1 << 20 {
        return anon_bytes(raw.len(), |out| out.copy_from_slice(raw));
    }
    let mut words = vec![0u32; raw.len().div_ceil(4)];
    for (i, chunk) in raw.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        words[i] = u32::from_le_bytes(w);
    }
    Bytes::Owned(Arc::new(words), raw.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_reads_back_rounded_values() {
        let t = Tensor::from_f32_as_bf16("w", vec![2, 2], &[1.0, -2.5, 3.140625, 1.0e-3]);
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(t.byte_len(), 8);
        let back = t.to_f32_vec();
        assert_eq!(back[0], 1.0);
        assert_eq!(back[1], -2.5);
        assert_eq!(back[2], 3.140625);
        assert!((back[3] - 1.0e-3).abs() < 1.0e-5 && back[3] != 1.0e-3);
    }

    #[test]
    fn grouped_q8_0_holds_the_same_values_and_bytes() {
        // Two rows of 1024 values: every code, varied scales.
        let (n, k) = (2, 1024);
        let mut raw = Vec::new();
        for b in 0..n * k / 32 {
            raw.extend_from_slice(&f16::from_f32(0.01 + 0.003 * (b % 7) as f32).to_le_bytes());
            raw.extend((0..32).map(|i| ((i * 37 + b * 11) % 256) as u8));
        }
        let q = Tensor::from_raw("w", DType::Q8_0, vec![n, k], &raw).expect("q8_0");
        let g = q.grouped().expect("grouped");
        assert_eq!(
            (g.dtype(), g.shape(), g.byte_len()),
            (DType::Q8_0G, &[n, k][..], raw.len())
        );
        assert_eq!(g.raw().len(), raw.len());
        let bits = |t: &Tensor| {
            t.to_f32_vec()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&g), bits(&q));
        assert_eq!(&*g.file_blocks(), &raw[..]);
        // A window of one row reads that row.
        let mut row = vec![0.0; k];
        g.read_f32(k, &mut row);
        assert_eq!(row, q.to_f32_vec()[k..]);
        // Rows that are not whole groups stay as they are.
        let short =
            Tensor::from_raw("s", DType::Q8_0, vec![4, 256], &raw[..4 * 8 * 34]).expect("q8_0");
        assert!(short.grouped().is_none());
    }

    #[test]
    fn grouped_pq2_0_holds_the_same_values_and_bytes() {
        // Two rows of 2048 values: every code, varied scales.
        let (n, k) = (2, 2048);
        let mut raw = Vec::new();
        for b in 0..n * k / 128 {
            raw.extend_from_slice(&f16::from_f32(0.02 + 0.001 * (b % 5) as f32).to_le_bytes());
            raw.extend((0..32).map(|i| ((i * 59 + b * 13) % 256) as u8));
        }
        let p = Tensor::from_raw("w", DType::PQ2_0, vec![n, k], &raw).expect("pq2_0");
        let g = p.grouped().expect("grouped");
        assert_eq!(
            (g.dtype(), g.shape(), g.byte_len()),
            (DType::PQ2_0G, &[n, k][..], raw.len())
        );
        let bits = |t: &Tensor| {
            t.to_f32_vec()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&g), bits(&p));
        assert_eq!(&*g.file_blocks(), &raw[..]);
        // Every lane of a register holds bytes of one block.
        for q in 0..4 {
            for lane in 0..16 {
                for b in 0..4 {
                    let i = 16 * (lane / 8) + 4 * q + b;
                    assert_eq!(pq2_0g_byte(lane % 8, i), 64 * q + 4 * lane + b);
                }
            }
        }
        let short =
            Tensor::from_raw("s", DType::PQ2_0, vec![1, 512], &raw[..4 * 34]).expect("pq2_0");
        assert!(short.grouped().is_none());
    }

    #[test]
    fn a_short_row_regroups_with_zero_padding() {
        // 3 blocks: one group whose 13 missing blocks read code 0 (stored 128) and scale 0.
        let src: Vec<u8> = (0..3 * 34).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0xAA; Q8_0G_BYTES];
        group_q8_0_row(&src, &mut dst);
        for j in 0..16 {
            for v in 0..32 {
                let byte = dst[64 * (v / 4) + 4 * j + v % 4];
                let want = if j < 3 {
                    src[34 * j + 2 + v] ^ 0x80
                } else {
                    0x80
                };
                assert_eq!(byte, want, "block {j} value {v}");
            }
            let d = &dst[512 + 2 * j..514 + 2 * j];
            assert_eq!(
                d,
                if j < 3 {
                    &src[34 * j..34 * j + 2]
                } else {
                    &[0, 0][..]
                }
            );
        }
    }

    #[test]
    fn read_f32_reads_a_window() {
        let t = Tensor::from_f32("w", vec![3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let mut row = [0.0; 2];
        t.read_f32(2, &mut row);
        assert_eq!(row, [2.0, 3.0]);
    }
}
