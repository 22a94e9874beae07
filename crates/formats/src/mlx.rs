//! MLX's affine-quantized safetensors: the container PrismML's reference runtime reads a ternary Bonsai pack
//! from (mlx-lm / mlx-vlm `save`, `mx.quantize(bits=2, group_size=128)`).
//!
//! A folder's `config.json` carries `"quantization": {"bits": 2, "group_size": G, "mode": "affine"}`, and each
//! quantized linear `P` is three tensors: `P.weight`, `U32 [N, K/16]`, value `j` of a row in bits `2·(j mod 16)`
//! of word `j / 16` (little-endian); `P.scales` and `P.biases`, `[N, K/G]` (F16, BF16 or F32); value
//! `code·s + b`. A ternary pack stores `b = −s`, so a value is `(code − 1)·s`: four words are exactly a PQ2_0
//! block's 32 code bytes and `s` its scale. Such a tensor is converted when it is read into PQ2_0 blocks
//! (2.125 bits per weight, one copy, the file's pages of the three tensors then released), so resident memory
//! stays below the file's size and the PQ2_0 kernels run it. Nothing is re-quantized: a group whose bias is not
//! exactly `−scale`, or whose scale an f16 cannot hold exactly, is refused naming the tensor, row and group, and
//! so is a group size that is not a multiple of 128 (a PQ2_0 block has one scale per 128 values) or a bit
//! width other than 2. Every other tensor is read as [`crate::Checkpoint::open_dir`] reads it.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use onepass_tensor::{DType, Tensor};

use crate::safetensors::{mapped_tensor, read_raw, weight_files, RawEntry, RawFile};
use crate::{Checkpoint, FormatError};

/// Values per PQ2_0 block.
const BLOCK: usize = 128;

/// The `quantization` block of an MLX `config.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlxQuantization {
    pub bits: u32,
    pub group_size: usize,
}

impl MlxQuantization {
    /// The folder's quantization (`None` when `config.json` has no `quantization` block); an error naming the
    /// key when it is one onepass cannot run exactly.
    pub fn from_config(config: &serde_json::Value) -> Result<Option<Self>, String> {
        let Some(q) = config.get("quantization") else {
            return Ok(None);
        };
        let q = q.as_object().ok_or("\"quantization\" is not an object")?;
        let int = |k: &str| {
            q.get(k)
                .and_then(serde_json::Value::as_u64)
                .ok_or(format!("\"quantization\" has no integer {k:?}"))
        };
        let bits = int("bits")? as u32;
        let group_size = int("group_size")? as usize;
        if let Some(mode) = q.get("mode") {
            if mode.as_str() != Some("affine") {
                return Err(format!(
                    "\"quantization\": mode {mode} is not supported (onepass reads \"affine\")"
                ));
            }
        }
        if bits != 2 {
            return Err(format!(
                "\"quantization\": bits {bits} is not supported (onepass reads the 2-bit ternary packs)"
            ));
        }
        if group_size == 0 || !group_size.is_multiple_of(BLOCK) {
            return Err(format!(
                "\"quantization\": group_size {group_size} is not a multiple of {BLOCK} (one PQ2_0 scale per \
                 {BLOCK} values)"
            ));
        }
        for (k, v) in q {
            if !["bits", "group_size", "mode"].contains(&k.as_str()) && v.is_object() {
                let same = v.get("bits").and_then(serde_json::Value::as_u64) == Some(bits.into())
                    && v.get("group_size").and_then(serde_json::Value::as_u64)
                        == Some(group_size as u64);
                if !same {
                    return Err(format!(
                        "\"quantization\": module {k:?} has its own parameters; onepass reads one bit width \
                         and group size for the whole pack"
                    ));
                }
            }
        }
        Ok(Some(MlxQuantization { bits, group_size }))
    }
}

/// Reads an MLX folder's safetensors (as [`Checkpoint::open_dir`] finds them): every `P.weight` that has
/// `P.scales` and `P.biases` becomes a PQ2_0 tensor `P.weight` of shape `[N, K]`; the scales and biases are
/// consumed; the other tensors are mapped as they are (F32, BF16, F16).
pub fn open_mlx_dir(dir: &Path, q: MlxQuantization) -> Result<Checkpoint, FormatError> {
    let files = weight_files(dir)?;
    let mut raws: Vec<(std::path::PathBuf, RawFile)> = Vec::new();
    let mut where_: HashMap<String, (usize, usize)> = HashMap::new();
    let mut file_bytes = 0;
    for path in &files {
        let raw = read_raw(path)?;
        file_bytes += raw.len;
        let fi = raws.len();
        for (ei, e) in raw.entries.iter().enumerate() {
            if where_.insert(e.name.clone(), (fi, ei)).is_some() {
                return Err(FormatError::Tensor {
                    path: path.clone(),
                    name: e.name.clone(),
                    why: "appears in more than one shard".into(),
                });
            }
        }
        raws.push((path.clone(), raw));
    }
    let get = |name: &str| {
        where_
            .get(name)
            .map(|&(f, e)| (&raws[f].0, &raws[f].1, &raws[f].1.entries[e]))
    };
    let mut tensors = HashMap::new();
    let mut names: Vec<&String> = where_.keys().collect();
    names.sort();
    for name in names {
        let (path, raw, e) = get(name).expect("listed");
        if let Some(base) = name
            .strip_suffix(".scales")
            .or(name.strip_suffix(".biases"))
        {
            if get(&format!("{base}.weight")).is_none() {
                return Err(tensor_err(
                    path,
                    name,
                    "has no packed .weight beside it".into(),
                ));
            }
            continue;
        }
        let base = name.strip_suffix(".weight");
        let scales = base.and_then(|b| get(&format!("{b}.scales")));
        let t = match (base, scales) {
            (Some(base), Some(scales)) => {
                let biases = get(&format!("{base}.biases")).ok_or_else(|| {
                    tensor_err(
                        path,
                        name,
                        format!("has {base}.scales but no {base}.biases"),
                    )
                })?;
                let t = ternary_from_affine(q, (path, raw, e), scales, biases)?;
                for (_, r, x) in [(path, raw, e), scales, biases] {
                    release(r, x);
                }
                t
            }
            _ if e.dtype == "U32" => {
                return Err(tensor_err(
                    path,
                    name,
                    "is packed (U32) but has no .scales and .biases beside it".into(),
                ))
            }
            _ => mapped_tensor(path, raw, e)?,
        };
        tensors.insert(name.clone(), t);
    }
    Ok(Checkpoint::from_tensors(tensors, files, file_bytes))
}

fn tensor_err(path: &Path, name: &str, why: String) -> FormatError {
    FormatError::Tensor {
        path: path.to_path_buf(),
        name: name.to_string(),
        why,
    }
}

/// The values of a scales / biases tensor as f32 (exact for every float type).
fn floats(path: &Path, raw: &RawFile, e: &RawEntry) -> Result<Vec<f32>, FormatError> {
    let bytes = &raw.map[e.begin..e.end];
    Ok(match e.dtype.as_str() {
        "F32" => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        "F16" => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        "BF16" => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(tensor_err(
                path,
                &e.name,
                format!("has dtype {other}; scales and biases are F16, BF16 or F32"),
            ))
        }
    })
}

type Part<'a> = (&'a std::path::PathBuf, &'a RawFile, &'a RawEntry);

/// One packed linear as PQ2_0 blocks: per 128 values the f16 scale and the 32 bytes of its 8 words.
fn ternary_from_affine(
    q: MlxQuantization,
    (path, wraw, w): Part<'_>,
    (spath, sraw, s): Part<'_>,
    (bpath, braw, b): Part<'_>,
) -> Result<Tensor, FormatError> {
    let name = w.name.as_str();
    let words_per_row = 32 / q.bits as usize;
    let (rows, cols) = match w.shape.as_slice() {
        [rows, cols] => (*rows, *cols),
        other => {
            return Err(tensor_err(
                path,
                name,
                format!("packed weight has shape {other:?}, expected [rows, words]"),
            ))
        }
    };
    if w.dtype != "U32" {
        return Err(tensor_err(
            path,
            name,
            format!(
                "has .scales beside it but dtype {} (packed words are U32)",
                w.dtype
            ),
        ));
    }
    let k = cols * words_per_row;
    let groups = k / q.group_size;
    for (p, e) in [(spath, s), (bpath, b)] {
        if e.shape != [rows, groups] {
            return Err(tensor_err(
                p,
                &e.name,
                format!(
                    "has shape {:?}, expected [{rows}, {groups}] for {rows} rows of {k} values in groups of {}",
                    e.shape, q.group_size
                ),
            ));
        }
    }
    if !k.is_multiple_of(q.group_size) {
        return Err(tensor_err(
            path,
            name,
            format!(
                "{k} values per row are not whole groups of {}",
                q.group_size
            ),
        ));
    }
    let scales = floats(spath, sraw, s)?;
    let biases = floats(bpath, braw, b)?;
    for (i, (&sc, &bi)) in scales.iter().zip(&biases).enumerate() {
        let (row, group) = (i / groups.max(1), i % groups.max(1));
        if bi != -sc {
            return Err(tensor_err(
                bpath,
                &b.name,
                format!(
                    "row {row}, group {group}: bias {bi} is not minus the scale {sc}, so the values are not \
                     the ternary −s, 0, +s (onepass runs ternary 2-bit packs, it does not re-quantize)"
                ),
            ));
        }
        if f16::from_f32(sc).to_f32() != sc {
            return Err(tensor_err(
                spath,
                &s.name,
                format!(
                    "row {row}, group {group}: scale {sc} is not exactly an f16 (a PQ2_0 scale)"
                ),
            ));
        }
    }
    let src = &wraw.map[w.begin..w.end];
    let blocks_per_row = k / BLOCK;
    let mut out = vec![0u8; rows * blocks_per_row * 34];
    let per_group = q.group_size / BLOCK;
    for row in 0..rows {
        let words = &src[row * cols * 4..(row + 1) * cols * 4];
        for blk in 0..blocks_per_row {
            let dst = &mut out[(row * blocks_per_row + blk) * 34..][..34];
            let sc = scales[row * groups + blk / per_group];
            dst[..2].copy_from_slice(&f16::from_f32(sc).to_le_bytes());
            // 128 values at 2 bits are 8 words, 32 bytes: the PQ2_0 code bytes as they are.
            dst[2..].copy_from_slice(&words[blk * 32..(blk + 1) * 32]);
        }
    }
    Tensor::from_raw(name, DType::PQ2_0, vec![rows, k], &out)
        .map_err(|e| tensor_err(path, name, e.to_string()))
}

/// Drops the pages of a consumed tensor from this process's resident memory (the map is private and read-only:
/// a later read faults them back in from the file).
fn release(raw: &RawFile, e: &RawEntry) {
    #[cfg(unix)]
    {
        let page = 4096usize;
        let (b, end) = (e.begin.next_multiple_of(page), e.end / page * page);
        if end > b {
            // SAFETY: private read-only map; no reference into these bytes is used after the copy was made.
            let _ = unsafe {
                raw.map
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, b, end - b)
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (raw, e);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, GgmlType};

    /// A folder holding one packed linear `p` of `rows × k` codes at group size `g` (F16 scales, biases
    /// `bias(scale)`) and one F32 vector; returns the codes and scales written.
    fn folder(
        rows: usize,
        k: usize,
        g: usize,
        bias: f32,
    ) -> (tempfile::TempDir, Vec<u8>, Vec<f32>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let codes: Vec<u8> = (0..rows * k).map(|i| ((i * 7 + i / 5) % 4) as u8).collect();
        let scales: Vec<f32> = (0..rows * k / g).map(|i| 0.25 + i as f32 / 8.0).collect();
        let words: Vec<u8> = codes
            .chunks(4)
            .map(|q| q[0] | q[1] << 2 | q[2] << 4 | q[3] << 6)
            .collect();
        let h16 = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect()
        };
        let biases: Vec<f32> = scales.iter().map(|s| -s * bias).collect();
        let parts: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = vec![
            ("p.weight", "U32", vec![rows, k / 16], words),
            ("p.scales", "F16", vec![rows, k / g], h16(&scales)),
            ("p.biases", "F16", vec![rows, k / g], h16(&biases)),
            (
                "n.weight",
                "F32",
                vec![2],
                [1.5f32, -2.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
        ];
        let mut header = serde_json::Map::new();
        let mut at = 0;
        for (name, dtype, shape, data) in &parts {
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}),
            );
            at += data.len();
        }
        let h = serde_json::Value::Object(header).to_string().into_bytes();
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&h);
        for (_, _, _, data) in &parts {
            bytes.extend_from_slice(data);
        }
        std::fs::write(dir.path().join("model.safetensors"), bytes).expect("write");
        (dir, codes, scales)
    }

    #[test]
    fn a_ternary_affine_linear_becomes_the_same_values_in_pq2_0_at_any_group_multiple_of_128() {
        for g in [128, 256] {
            let (rows, k) = (3, 512);
            let (dir, codes, scales) = folder(rows, k, g, 1.0);
            let q = MlxQuantization {
                bits: 2,
                group_size: g,
            };
            let ck = open_mlx_dir(dir.path(), q).expect("reads");
            let t = ck.get("p.weight").expect("converted");
            assert_eq!((t.dtype(), t.shape()), (DType::PQ2_0, &[rows, k][..]));
            assert!(ck.get("p.scales").is_none() && ck.get("p.biases").is_none());
            let mut got = vec![0f32; rows * k];
            dequantize(GgmlType::PQ2_0, t.raw(), &mut got).expect("blocks");
            for (i, &v) in got.iter().enumerate() {
                // code·s + b with b = −s, code 3 included (+2s).
                let s = scales[i / g];
                assert_eq!(v, f32::from(codes[i]) * s - s, "value {i}, group {g}");
            }
            assert_eq!(ck.get("n.weight").expect("float").to_f32_vec(), [1.5, -2.0]);
        }
    }

    #[test]
    fn non_ternary_biases_and_other_parameters_are_refused() {
        let (dir, _, _) = folder(2, 256, 128, 0.5);
        let q = MlxQuantization {
            bits: 2,
            group_size: 128,
        };
        let e = crate::error_text(open_mlx_dir(dir.path(), q));
        assert!(
            e.contains("p.biases") && e.contains("not minus the scale"),
            "{e}"
        );
        let cfg = |q: serde_json::Value| {
            MlxQuantization::from_config(&serde_json::json!({"quantization": q}))
        };
        assert_eq!(
            cfg(serde_json::json!({"bits": 2, "group_size": 128})),
            Ok(Some(MlxQuantization {
                bits: 2,
                group_size: 128
            }))
        );
        for (q, want) in [
            (serde_json::json!({"bits": 4, "group_size": 128}), "bits 4"),
            (
                serde_json::json!({"bits": 2, "group_size": 64}),
                "group_size 64",
            ),
            (
                serde_json::json!({"bits": 2, "group_size": 128, "mode": "mxfp4"}),
                "mode",
            ),
            (
                serde_json::json!({"bits": 2, "group_size": 128, "m.x": {"bits": 8, "group_size": 64}}),
                "\"m.x\"",
            ),
        ] {
            let e = cfg(q).expect_err("refused");
            assert!(e.contains(want), "{e}");
        }
        assert_eq!(
            MlxQuantization::from_config(&serde_json::json!({})),
            Ok(None)
        );
    }
}
