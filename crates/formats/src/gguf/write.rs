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

/// Writes a version 3 GGUF file the way llama.cpp's `gguf` Python writer lays it out: metadata in
/// the given order, tensor records, padding to the alignment (`general.alignment` when the
/// metadata has it as a `u32`, else 32), then each tensor's bytes padded to the alignment.
pub fn write_gguf(
    out: &mut impl Write,
    metadata: &[(String, GgufValue)],
    tensors: &[GgufWriteTensor<'_>],
) -> std::io::Result<()> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
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
    for t in tensors {
        let numel: u64 = t.ne.iter().product();
        let want = numel / t.ggml_type.block_len() as u64 * t.ggml_type.block_bytes() as u64;
        if t.data.len() as u64 != want || !numel.is_multiple_of(t.ggml_type.block_len() as u64) {
            return Err(invalid(format!(
                "tensor {}: {} bytes for {} values of {}",
                t.name,
                t.data.len(),
                numel,
                t.ggml_type
            )));
        }
        put_string(&mut head, t.name);
        head.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset += pad(t.data.len() as u64);
    }
    head.resize(pad(head.len() as u64) as usize, 0);
    out.write_all(&head)?;
    for t in tensors {
        out.write_all(t.data)?;
        let padding = pad(t.data.len() as u64) - t.data.len() as u64;
        out.write_all(&vec![0u8; padding as usize])?;
    }
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
