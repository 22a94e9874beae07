//! Writing GGUF version 3 files byte for byte as llama.cpp's `gguf` Python writer does (for tests, fixtures and
//! conversions).

use std::io::Write;

use super::{GgufArray, GgufValue, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::quant::GgmlType;

/// A tensor to write: its bytes already in the type's block layout.
pub struct GgufWriteTensor<'a> {
    pub name: &'a str,
    pub ggml_type: GgmlType,
    /// ggml `ne` order, innermost first.
    pub ne: Vec<u64>,
    pub data: &'a [u8],
}

/// A tensor's record for [`GgufStreamWriter`]: its bytes come later.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorPlan {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml `ne` order, innermost first.
    pub ne: Vec<u64>,
}

impl GgufTensorPlan {
    /// Bytes of the tensor's data in its type's block layout (an error when the innermost
    /// dimension is not a whole number of blocks).
    pub fn nbytes(&self) -> std::io::Result<u64> {
        let numel: u64 = self.ne.iter().product();
        let bl = self.ggml_type.block_len() as u64;
        if self.ne.is_empty() || !self.ne[0].is_multiple_of(bl) {
            return Err(invalid(format!(
                "tensor {}: shape {:?} is not a whole number of {} blocks ({} values each)",
                self.name, self.ne, self.ggml_type, bl
            )));
        }
        Ok(numel / bl * self.ggml_type.block_bytes() as u64)
    }
}

fn invalid(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, why)
}

/// Writes a version 3 GGUF file one tensor at a time, laid out as llama.cpp's `gguf` Python
/// writer does: [`GgufStreamWriter::new`] writes the header (metadata in the given order, tensor
/// records, padding to `general.alignment` when the metadata has it as a `u32`, else 32), then
/// each [`write_tensor`](GgufStreamWriter::write_tensor) call appends the next planned tensor's
/// bytes, padded to the alignment. Its data may come in pieces; nothing but the header is held.
pub struct GgufStreamWriter<W: Write> {
    out: W,
    plans: Vec<(GgufTensorPlan, u64)>,
    alignment: u64,
    next: usize,
    written: u64,
}

impl<W: Write> GgufStreamWriter<W> {
    pub fn new(
        mut out: W,
        metadata: &[(String, GgufValue)],
        tensors: &[GgufTensorPlan],
    ) -> std::io::Result<Self> {
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, GgufValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some(_) => {
                return Err(invalid(
                    "general.alignment must be a power-of-two u32".into(),
                ))
            }
            None => GGUF_DEFAULT_ALIGNMENT,
        };
        let mut head = Vec::new();
        head.extend_from_slice(GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_string(&mut head, key);
            head.extend_from_slice(&value_type_id(value).to_le_bytes());
            put_value(&mut head, value);
        }
        let pad = |n: u64| n.div_ceil(alignment) * alignment;
        let mut offset = 0u64;
        let mut plans = Vec::with_capacity(tensors.len());
        for t in tensors {
            let nbytes = t.nbytes()?;
            put_string(&mut head, &t.name);
            head.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset += pad(nbytes);
            plans.push((t.clone(), nbytes));
        }
        head.resize(pad(head.len() as u64) as usize, 0);
        out.write_all(&head)?;
        Ok(GgufStreamWriter {
            out,
            plans,
            alignment,
            next: 0,
            written: 0,
        })
    }

    /// The plan of the tensor whose bytes come next, if any.
    pub fn next_tensor(&self) -> Option<&GgufTensorPlan> {
        self.plans.get(self.next).map(|(p, _)| p)
    }

    /// Appends `data` to the current tensor; when its bytes are complete, pads and moves to the
    /// next. A piece that would run past the tensor's size is refused.
    pub fn write_tensor(&mut self, data: &[u8]) -> std::io::Result<()> {
        let Some((plan, nbytes)) = self.plans.get(self.next) else {
            return Err(invalid("all planned tensors are already written".into()));
        };
        let nbytes = *nbytes;
        if self.written + data.len() as u64 > nbytes {
            return Err(invalid(format!(
                "tensor {}: {} bytes written, its size is {nbytes}",
                plan.name,
                self.written + data.len() as u64
            )));
        }
        self.out.write_all(data)?;
        self.written += data.len() as u64;
        if self.written == nbytes {
            let padding = nbytes.div_ceil(self.alignment) * self.alignment - nbytes;
            self.out.write_all(&vec![0u8; padding as usize])?;
            self.next += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Checks that every planned tensor was written and hands back the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        if let Some((plan, nbytes)) = self.plans.get(self.next) {
            return Err(invalid(format!(
                "tensor {} has {} of its {nbytes} bytes; the file is incomplete",
                plan.name, self.written
            )));
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes a version 3 GGUF file the way llama.cpp's `gguf` Python writer lays it out: metadata in
/// the given order, tensor records, padding to the alignment (`general.alignment` when the
/// metadata has it as a `u32`, else 32), then each tensor's bytes padded to the alignment.
pub fn write_gguf(
    out: &mut impl Write,
    metadata: &[(String, GgufValue)],
    tensors: &[GgufWriteTensor<'_>],
) -> std::io::Result<()> {
    let plans: Vec<GgufTensorPlan> = tensors
        .iter()
        .map(|t| GgufTensorPlan {
            name: t.name.to_string(),
            ggml_type: t.ggml_type,
            ne: t.ne.clone(),
        })
        .collect();
    for (t, p) in tensors.iter().zip(&plans) {
        if t.data.len() as u64 != p.nbytes()? {
            return Err(invalid(format!(
                "tensor {}: {} bytes for {} values of {}",
                t.name,
                t.data.len(),
                t.ne.iter().product::<u64>(),
                t.ggml_type
            )));
        }
    }
    let mut w = GgufStreamWriter::new(out, metadata, &plans)?;
    for t in tensors {
        w.write_tensor(t.data)?;
    }
    w.finish()?;
    Ok(())
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn array_type_id(a: &GgufArray) -> u32 {
    match a {
        GgufArray::U8(_) => 0,
        GgufArray::I8(_) => 1,
        GgufArray::U16(_) => 2,
        GgufArray::I16(_) => 3,
        GgufArray::U32(_) => 4,
        GgufArray::I32(_) => 5,
        GgufArray::F32(_) => 6,
        GgufArray::Bool(_) => 7,
        GgufArray::String(_) => 8,
        GgufArray::Array(_) => 9,
        GgufArray::U64(_) => 10,
        GgufArray::I64(_) => 11,
        GgufArray::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_string(out, s),
        GgufValue::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend_from_slice(&array_type_id(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        GgufArray::U8(v) => out.extend_from_slice(v),
        GgufArray::I8(v) => le!(v),
        GgufArray::U16(v) => le!(v),
        GgufArray::I16(v) => le!(v),
        GgufArray::U32(v) => le!(v),
        GgufArray::I32(v) => le!(v),
        GgufArray::U64(v) => le!(v),
        GgufArray::I64(v) => le!(v),
        GgufArray::F32(v) => le!(v),
        GgufArray::F64(v) => le!(v),
        GgufArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        GgufArray::String(v) => {
            for s in v {
                put_string(out, s);
            }
        }
        GgufArray::Array(v) => {
            for inner in v {
                put_array(out, inner);
            }
        }
    }
}
