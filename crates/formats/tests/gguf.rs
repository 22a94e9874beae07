//! The GGUF reader against files written by llama.cpp's own writer (PyPI `gguf` 0.19.0, see
//! tests/fixtures/gguf/README.md), and against hostile headers built here.

use std::path::PathBuf;

use onepass_formats::gguf::{write_gguf, Gguf, GgufArray, GgufError, GgufValue, GgufWriteTensor};
use onepass_formats::quant::{dequantize, ptq1_0_to_pq2_0, GgmlType};
use onepass_formats::HadamardMeta;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf")
        .join(name)
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

fn open(name: &str) -> Gguf {
    Gguf::open(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn decode(file: &Gguf, name: &str) -> Vec<f32> {
    let info = file
        .tensor(name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    let mut out = vec![0f32; info.numel() as usize];
    dequantize(info.ggml_type, file.tensor_data(info), &mut out).expect("whole blocks");
    out
}

fn f32s(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).expect("an array of numbers")
}

fn check_all_types(file: &Gguf, version: u32) {
    assert_eq!(file.version(), version);
    assert_eq!(file.alignment(), 64);
    let get = |k: &str| file.get(k).unwrap_or_else(|| panic!("missing {k}")).clone();
    assert_eq!(
        get("general.architecture"),
        GgufValue::String("testarch".into())
    );
    assert_eq!(get("general.alignment"), GgufValue::U32(64));
    assert_eq!(get("t.u8"), GgufValue::U8(200));
    assert_eq!(get("t.i8"), GgufValue::I8(-100));
    assert_eq!(get("t.u16"), GgufValue::U16(60000));
    assert_eq!(get("t.i16"), GgufValue::I16(-30000));
    assert_eq!(get("t.u32"), GgufValue::U32(4_000_000_000));
    assert_eq!(get("t.i32"), GgufValue::I32(-2_000_000_000));
    assert_eq!(get("t.u64"), GgufValue::U64((1u64 << 63) + 5));
    assert_eq!(get("t.i64"), GgufValue::I64(-(1i64 << 62)));
    assert_eq!(get("t.f32"), GgufValue::F32(1.5));
    assert_eq!(get("t.f64"), GgufValue::F64(-2.25e300));
    assert_eq!(get("t.true"), GgufValue::Bool(true));
    assert_eq!(get("t.false"), GgufValue::Bool(false));
    assert_eq!(get("t.string"), GgufValue::String("héllo, wörld ✓".into()));
    let arr = |k: &str| match get(k) {
        GgufValue::Array(a) => a,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(arr("t.arr.u8"), GgufArray::U8(vec![1, 2, 255]));
    assert_eq!(arr("t.arr.i8"), GgufArray::I8(vec![-1, 0, 127]));
    assert_eq!(arr("t.arr.u16"), GgufArray::U16(vec![1, 65535]));
    assert_eq!(arr("t.arr.i16"), GgufArray::I16(vec![-32768, 7]));
    assert_eq!(arr("t.arr.u32"), GgufArray::U32(vec![0, u32::MAX]));
    assert_eq!(arr("t.arr.i32"), GgufArray::I32(vec![-5, 6, -7]));
    assert_eq!(arr("t.arr.u64"), GgufArray::U64(vec![u64::MAX]));
    assert_eq!(arr("t.arr.i64"), GgufArray::I64(vec![i64::MIN]));
    assert_eq!(arr("t.arr.f32"), GgufArray::F32(vec![0.5, -1.0]));
    assert_eq!(arr("t.arr.f64"), GgufArray::F64(vec![0.1, 1e-300]));
    assert_eq!(arr("t.arr.bool"), GgufArray::Bool(vec![true, false, true]));
    assert_eq!(
        arr("t.arr.string"),
        GgufArray::String(vec!["a".into(), "".into(), "ünï".into()])
    );
    assert_eq!(
        arr("t.arr.nested"),
        GgufArray::Array(vec![GgufArray::I32(vec![1, 2]), GgufArray::I32(vec![3])])
    );
    assert_eq!(
        arr("t.arr.nested_strings"),
        GgufArray::Array(vec![
            GgufArray::String(vec!["x".into(), "y".into()]),
            GgufArray::String(vec!["z".into()])
        ])
    );
    assert_eq!(file.metadata().len(), 29);

    let want = expected();
    let tensors = want["all_types"].as_object().expect("object");
    let types = [
        ("f32.weight", GgmlType::F32),
        ("f16.weight", GgmlType::F16),
        ("bf16.weight", GgmlType::BF16),
        ("q8_0.weight", GgmlType::Q8_0),
    ];
    assert_eq!(file.tensors().len(), types.len());
    for (name, ty) in types {
        let info = file.tensor(name).expect("tensor");
        assert_eq!(info.ggml_type, ty, "{name}");
        assert_eq!(info.offset % 64, 0, "{name} aligned");
        let shape: Vec<usize> = tensors[name]["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        assert_eq!(info.shape(), shape, "{name}");
        let got = decode(file, name);
        let values = f32s(&tensors[name]["values"]);
        assert_eq!(got, values, "{name}: decoded values differ from gguf-py's");
    }
}

#[test]
fn reads_every_value_type_and_float_and_q8_0_tensors_v3() {
    check_all_types(&open("all_types.gguf"), 3);
}

#[test]
fn reads_version_2() {
    check_all_types(&open("all_types_v2.gguf"), 2);
}

/// The writer lays a file out byte for byte as gguf-py does, so files it makes in tests (hostile
/// variants, the tokenizer GGUF) are the files llama.cpp's writer would make.
#[test]
fn writer_reproduces_gguf_py_files_byte_for_byte() {
    for name in ["all_types.gguf", "ternary.gguf"] {
        let file = open(name);
        let out = rewrite(&file, file.metadata());
        let original = std::fs::read(fixture(name)).expect("read");
        assert_eq!(out.len(), original.len(), "{name}: length");
        assert!(out == original, "{name}: bytes differ");
    }
}

fn codes_and_scales(v: &Value) -> (Vec<usize>, Vec<f32>) {
    let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).expect("shape");
    let codes = v["codes"].as_str().expect("codes");
    let scales = f32s(&v["scales"]);
    let values = codes
        .bytes()
        .enumerate()
        .map(|(i, c)| (f32::from(c - b'0') - 1.0) * scales[i / 128])
        .collect();
    (shape, values)
}

#[test]
fn decodes_pq2_0_and_ptq1_0_as_packed_by_the_numpy_reference() {
    let file = open("ternary.gguf");
    let want = expected();
    for (name, ty) in [
        ("token_embd.weight", GgmlType::PQ2_0),
        ("blk.0.ffn_up.weight", GgmlType::PQ2_0),
        ("blk.0.ffn_up_t1.weight", GgmlType::PTQ1_0),
        ("blk.0.ffn_down.weight", GgmlType::PTQ1_0),
    ] {
        let info = file.tensor(name).expect("tensor");
        assert_eq!(info.ggml_type, ty, "{name}");
        let (shape, values) = codes_and_scales(&want["ternary"][name]);
        assert_eq!(info.shape(), shape, "{name}");
        assert_eq!(
            info.nbytes as usize,
            shape[0] * shape[1] / 128 * ty.block_bytes()
        );
        assert_eq!(decode(&file, name), values, "{name}");
    }
    // The PQ2_0 tensor carries code 3 at four places: decoded as +2·d.
    let up = decode(&file, "blk.0.ffn_up.weight");
    let (_, scales) = {
        let v = &want["ternary"]["blk.0.ffn_up.weight"];
        (0, f32s(&v["scales"]))
    };
    assert_eq!(up[5], 2.0 * scales[0]);
    assert_eq!(up[1000], 2.0 * scales[7]);
}

#[test]
fn ptq1_0_transcodes_to_the_same_pq2_0_values() {
    let file = open("ternary.gguf");
    for name in ["blk.0.ffn_up_t1.weight", "blk.0.ffn_down.weight"] {
        let info = file.tensor(name).expect("tensor");
        let src = file.tensor_data(info);
        let mut words = vec![0u8; src.len() / 28 * 34];
        ptq1_0_to_pq2_0(src, &mut words).expect("sizes");
        let mut via_pq2 = vec![0f32; info.numel() as usize];
        dequantize(GgmlType::PQ2_0, &words, &mut via_pq2).expect("sizes");
        assert_eq!(via_pq2, decode(&file, name), "{name}");
    }
    assert!(ptq1_0_to_pq2_0(&[0u8; 27], &mut [0u8; 34]).is_err());
}

// ---- prism.hadamard.* ----------------------------------------------------------------------------

#[test]
fn hadamard_metadata_is_read() {
    let file = open("ternary.gguf");
    let meta = HadamardMeta::from_gguf(&file)
        .expect("valid")
        .expect("present");
    assert_eq!(meta.signs.keys().copied().collect::<Vec<_>>(), [1024, 2048]);
    assert!(meta
        .signs
        .values()
        .flatten()
        .all(|&s| s == 1.0 || s == -1.0));
    assert_eq!(meta.weight_names.len(), 3);
    assert!(meta.is_folded("blk.0.ffn_down.weight"));
    assert!(!meta.is_folded("token_embd.weight"));
    assert!(meta.inverse_weight_names.contains("token_embd.weight"));
    assert!(meta.gdn_v_grouped);
    assert!(HadamardMeta::from_gguf(&open("all_types.gguf"))
        .expect("no keys is fine")
        .is_none());
}

/// `file`'s tensors under the metadata `meta`, written as a GGUF file.
fn rewrite(file: &Gguf, meta: &[(String, GgufValue)]) -> Vec<u8> {
    let tensors: Vec<GgufWriteTensor<'_>> = file
        .tensors()
        .iter()
        .map(|t| GgufWriteTensor {
            name: &t.name,
            ggml_type: t.ggml_type,
            ne: t.ne.clone(),
            data: file.tensor_data(t),
        })
        .collect();
    let mut out = Vec::new();
    write_gguf(&mut out, meta, &tensors).expect("write");
    out
}

/// `ternary.gguf` with its metadata edited by `edit`, re-written and parsed.
fn ternary_with(edit: impl FnOnce(&mut Vec<(String, GgufValue)>)) -> Gguf {
    let file = open("ternary.gguf");
    let mut meta = file.metadata().to_vec();
    edit(&mut meta);
    let out = rewrite(&file, &meta);
    Gguf::from_bytes("edited.gguf", out).expect("still a valid container")
}

fn set(meta: &mut [(String, GgufValue)], key: &str, value: GgufValue) {
    let slot = meta
        .iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key}"));
    slot.1 = value;
}

fn signs_of(meta: &[(String, GgufValue)]) -> Vec<i8> {
    match &meta
        .iter()
        .find(|(k, _)| k == "prism.hadamard.sign_values")
        .expect("signs")
        .1
    {
        GgufValue::Array(GgufArray::I8(v)) => v.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn hadamard_accepts_any_integer_or_float_array_for_widths_and_signs() {
    let file = ternary_with(|m| {
        let signs = signs_of(m);
        set(
            m,
            "prism.hadamard.sign_widths",
            GgufValue::Array(GgufArray::I64(vec![1024, 2048])),
        );
        set(
            m,
            "prism.hadamard.sign_values",
            GgufValue::Array(GgufArray::F32(
                signs.iter().map(|&s| f32::from(s)).collect(),
            )),
        );
        set(m, "prism.hadamard.version", GgufValue::U8(1));
    });
    let reference = HadamardMeta::from_gguf(&open("ternary.gguf")).expect("valid");
    assert_eq!(HadamardMeta::from_gguf(&file).expect("valid"), reference);
}

#[test]
fn hadamard_refusals_name_the_key() {
    type Meta = Vec<(String, GgufValue)>;
    /// Edits the metadata; the second argument is the case's full key (`prism.hadamard.{key}`).
    type Edit = Box<dyn FnOnce(&mut Meta, &str)>;
    let to = |v: GgufValue| -> Edit { Box::new(move |m, key| set(m, key, v)) };
    let s = |x: &str| GgufValue::String(x.into());
    let strings = |xs: &[&str]| {
        GgufValue::Array(GgufArray::String(
            xs.iter().map(|x| x.to_string()).collect(),
        ))
    };
    let u32s = |xs: &[u32]| GgufValue::Array(GgufArray::U32(xs.to_vec()));
    let i8s = |xs: Vec<i8>| GgufValue::Array(GgufArray::I8(xs));
    let cases: Vec<(&str, &str, Edit)> = vec![
        ("version", "version 2", to(GgufValue::U32(2))),
        ("version", "expected an integer", to(s("1"))),
        ("block_size", "512", to(GgufValue::U32(512))),
        ("transform", "orthogonal", to(s("orthogonal"))),
        ("axis", "output", to(s("output"))),
        ("sign_mode", "seeded", to(s("seeded"))),
        (
            "axis",
            "missing",
            Box::new(|m, key| m.retain(|(k, _)| k != key)),
        ),
        (
            "seed",
            "not a key",
            Box::new(|m, key| m.push((key.into(), GgufValue::U32(7)))),
        ),
        ("sign_widths", "1000", to(u32s(&[1000, 2072]))),
        ("sign_widths", "twice", to(u32s(&[1024, 1024, 1024]))),
        (
            "sign_widths",
            "array[f32]",
            to(GgufValue::Array(GgufArray::F32(vec![1024.0, 2048.0]))),
        ),
        (
            "sign_values",
            "add up to",
            Box::new(move |m, key| {
                let mut v = signs_of(m);
                v.pop();
                set(m, key, i8s(v));
            }),
        ),
        (
            "sign_values",
            "entry 17 is 0",
            Box::new(move |m, key| {
                let mut v = signs_of(m);
                v[17] = 0;
                set(m, key, i8s(v));
            }),
        ),
        (
            "sign_values",
            "entry 3 is 0.5",
            Box::new(|m, key| {
                let mut v: Vec<f64> = signs_of(m).iter().map(|&x| f64::from(x)).collect();
                v[3] = 0.5;
                set(m, key, GgufValue::Array(GgufArray::F64(v)));
            }),
        ),
        ("sign_values", "array[string]", to(strings(&["+"]))),
        (
            "weight_names",
            "not a tensor",
            to(strings(&["blk.9.ffn_up.weight"])),
        ),
        (
            "weight_names",
            "no sign vector",
            Box::new(move |m, _| {
                let v = signs_of(m);
                set(m, "prism.hadamard.sign_widths", u32s(&[1024]));
                set(m, "prism.hadamard.sign_values", i8s(v[..1024].to_vec()));
            }),
        ),
        (
            "weight_names",
            "twice",
            to(strings(&["blk.0.ffn_up.weight", "blk.0.ffn_up.weight"])),
        ),
        ("weight_names", "array[u32]", to(u32s(&[1]))),
        (
            "inverse_weight_names",
            "weight_names also names",
            to(strings(&["blk.0.ffn_up.weight"])),
        ),
        ("gdn_v_grouped", "expected a bool", to(GgufValue::U8(1))),
    ];
    for (key, why, edit) in cases {
        let full = format!("prism.hadamard.{key}");
        let file = ternary_with(|m| edit(m, &full));
        let err = HadamardMeta::from_gguf(&file).expect_err(key);
        let msg = err.to_string();
        assert!(
            matches!(&err, GgufError::Metadata { key: k, .. } if k == &format!("prism.hadamard.{key}")),
            "{key}: {msg}"
        );
        assert!(msg.contains(why), "{key}: {msg:?} does not say {why:?}");
    }
}

// ---- hostile headers -----------------------------------------------------------------------------

/// A header builder for files no writer would make.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn start(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.0.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s);
        self
    }
    /// A tensor record.
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name.as_bytes()).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad_to(&mut self, align: usize) -> &mut Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Raw {
        self.0.extend(std::iter::repeat_n(0u8, n));
        self
    }
    fn parse(&self) -> Result<Gguf, GgufError> {
        Gguf::from_bytes("hostile.gguf", self.0.clone())
    }
}

fn refused(raw: &Raw) -> String {
    match raw.parse() {
        Ok(_) => panic!("accepted a hostile file"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_truncation_of_a_real_file_is_refused_cleanly() {
    let bytes = std::fs::read(fixture("all_types.gguf")).expect("read");
    let file = open("all_types.gguf");
    let data_end = file
        .tensors()
        .iter()
        .map(|t| file.data_start() + t.offset + t.nbytes)
        .max()
        .expect("tensors");
    for len in 0..data_end as usize {
        let err = Gguf::from_bytes("cut.gguf", bytes[..len].to_vec())
            .expect_err("a truncated file must be refused");
        let msg = err.to_string();
        assert!(
            msg.contains("truncated")
                || msg.contains("not a GGUF file")
                || msg.contains("more than"),
            "cut at {len}: {msg}"
        );
    }
    // The padding after the last tensor's bytes is not needed.
    Gguf::from_bytes("cut.gguf", bytes[..data_end as usize].to_vec()).expect("complete");
}

#[test]
fn every_single_byte_corruption_of_the_header_is_handled_without_panic() {
    let bytes = std::fs::read(fixture("ternary.gguf")).expect("read");
    let data_start = open("ternary.gguf").data_start() as usize;
    for i in 0..data_start {
        for v in [0x00u8, 0xFF, 0x80] {
            let mut b = bytes.clone();
            b[i] = v;
            // Ok or Err, but never a panic or an allocation the file cannot back.
            let _ = Gguf::from_bytes("flipped.gguf", b);
        }
    }
}

#[test]
fn bad_magic_and_versions_are_refused() {
    assert!(refused(&Raw(b"GGU".to_vec())).contains("not a GGUF file"));
    assert!(refused(&Raw(b"GGML\x03\0\0\0".to_vec())).contains("not a GGUF file"));
    assert!(refused(&Raw::start(1, 0, 0)).contains("version 1"));
    assert!(refused(&Raw::start(4, 0, 0)).contains("version 4"));
    assert!(refused(&Raw::start(3u32.swap_bytes(), 0, 0)).contains("big-endian"));
    Raw::start(3, 0, 0)
        .parse()
        .expect("an empty v3 file is valid");
}

#[test]
fn huge_counts_and_lengths_are_refused_before_allocating() {
    let msg = refused(&Raw::start(3, 0, u64::MAX));
    assert!(
        msg.contains("metadata count") && msg.contains("18446744073709551615"),
        "{msg}"
    );
    assert!(refused(&Raw::start(3, u64::MAX / 2, 0)).contains("tensor count"));
    // A key whose length runs past the end.
    let mut r = Raw::start(3, 0, 1);
    r.u64(u64::MAX - 3).zeros(16);
    assert!(refused(&r).contains("truncated"));
    // An array declaring 2^60 u32 elements.
    let mut r = Raw::start(3, 0, 1);
    r.str(b"k").u32(9).u32(4).u64(1 << 60).zeros(8);
    let msg = refused(&r);
    assert!(
        msg.contains("\"k\"") && msg.contains("1152921504606846976"),
        "{msg}"
    );
    // An array of 10^15 strings (each needs at least 8 bytes).
    let mut r = Raw::start(3, 0, 1);
    r.str(b"k")
        .u32(9)
        .u32(8)
        .u64(1_000_000_000_000_000)
        .zeros(64);
    assert!(refused(&r).contains("more than"));
    // Arrays nested 1000 deep.
    let mut r = Raw::start(3, 0, 1);
    r.str(b"deep").u32(9);
    for _ in 0..1000 {
        r.u32(9).u64(1);
    }
    assert!(refused(&r).contains("nested"));
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    let mut r = Raw::start(3, 0, 1);
    r.str(b"general.name").u32(8).str(b"ok\xff");
    let msg = refused(&r);
    assert!(
        msg.contains("general.name") && msg.contains("UTF-8"),
        "{msg}"
    );
    let mut r = Raw::start(3, 0, 1);
    r.str(b"\xc3(").u32(4).u32(1);
    assert!(refused(&r).contains("metadata key at byte 24 is not valid UTF-8"));
    let mut r = Raw::start(3, 0, 1);
    r.str(b"flag").u32(7).zeros(1);
    r.0.pop();
    r.0.push(2);
    assert!(refused(&r).contains("0 or 1"));
    let mut r = Raw::start(3, 0, 1);
    r.str(b"odd").u32(13).zeros(8);
    let msg = refused(&r);
    assert!(
        msg.contains("\"odd\"") && msg.contains("unknown value type 13"),
        "{msg}"
    );
    let mut r = Raw::start(3, 0, 2);
    r.str(b"a").u32(4).u32(1).str(b"a").u32(4).u32(2);
    assert!(refused(&r).contains("appears twice"));
    for (value_type, value, why) in [
        (4u32, 0u32, "power of two"),
        (4, 48, "power of two"),
        (5, 64, "expected a u32, found i32"),
    ] {
        let mut r = Raw::start(3, 0, 1);
        r.str(b"general.alignment").u32(value_type).u32(value);
        let msg = refused(&r);
        assert!(
            msg.contains("general.alignment") && msg.contains(why),
            "{msg}"
        );
    }
}

/// A file with the given tensor records and `data` bytes of data region.
fn with_tensors(records: &[(&str, &[u64], u32, u64)], data: usize) -> Raw {
    let mut r = Raw::start(3, records.len() as u64, 0);
    for &(name, ne, ty, offset) in records {
        r.tensor(name, ne, ty, offset);
    }
    r.pad_to(32).zeros(data);
    r
}

#[test]
fn bad_tensor_records_are_refused_naming_the_tensor() {
    with_tensors(&[("a", &[8], 0, 0), ("b", &[4, 2], 1, 32)], 48)
        .parse()
        .expect("valid");

    let msg = refused(&with_tensors(&[("blk.0.q4", &[32], 2, 0)], 64));
    assert!(
        msg.contains("\"blk.0.q4\"") && msg.contains("type id 2"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("a", &[8], 0, 0), ("a", &[8], 0, 32)], 64));
    assert!(msg.contains("\"a\" appears twice"), "{msg}");
    let msg = refused(&with_tensors(&[("w", &[8], 0, 16)], 64));
    assert!(
        msg.contains("\"w\"") && msg.contains("not aligned to 32"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("w", &[8], 0, 32)], 48));
    assert!(
        msg.contains("\"w\"") && msg.contains("bytes 32..64") && msg.contains("48 bytes"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("w", &[8], 0, u64::MAX - 31)], 48));
    assert!(msg.contains("\"w\""), "{msg}");
    let msg = refused(&with_tensors(&[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 96));
    assert!(
        msg.contains("\"a\"") && msg.contains("\"b\"") && msg.contains("overlap"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("q", &[33, 2], 8, 0)], 128));
    assert!(
        msg.contains("\"q\"") && msg.contains("multiple of the Q8_0 block of 32"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("t", &[100, 2], 142, 0)], 128));
    assert!(msg.contains("PQ2_0 block of 128"), "{msg}");
    let msg = refused(&with_tensors(&[("z", &[0, 4], 0, 0)], 0));
    assert!(
        msg.contains("\"z\"") && msg.contains("zero dimension"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("big", &[1 << 40, 1 << 40], 0, 0)], 0));
    assert!(msg.contains("\"big\"") && msg.contains("overflow"), "{msg}");
    let msg = refused(&with_tensors(&[("h", &[1 << 62, 8], 142, 0)], 0));
    assert!(msg.contains("\"h\""), "{msg}");
    let msg = refused(&with_tensors(&[("d", &[1, 1, 1, 1, 1], 0, 0)], 64));
    assert!(
        msg.contains("\"d\"") && msg.contains("5 dimensions"),
        "{msg}"
    );
    let msg = refused(&with_tensors(&[("d", &[], 0, 0)], 64));
    assert!(msg.contains("0 dimensions"), "{msg}");
}

#[test]
fn tensor_bytes_are_the_mapped_file_bytes() {
    let file = open("all_types.gguf");
    let raw = std::fs::read(fixture("all_types.gguf")).expect("read");
    let info = file.tensor("q8_0.weight").expect("tensor");
    let begin = (file.data_start() + info.offset) as usize;
    assert_eq!(file.tensor_data(info), &raw[begin..begin + 136]);
    assert_eq!(info.nbytes, 136);
    assert_eq!(info.ne, [64, 2]);
}

/// Every tensor of the fixtures as a `Tensor` (a slice of the map, PTQ1_0 included: it stays packed) reads back
/// the values the reference decoder gives, with the shape outermost first.
#[test]
fn tensors_read_as_the_reference_decoder_decodes_them() {
    for name in ["all_types.gguf", "ternary.gguf"] {
        let file = open(name);
        for info in file.tensors() {
            let t = file.tensor_data_as_tensor(info).expect("tensor");
            assert_eq!(t.shape(), info.shape().as_slice(), "{}", info.name);
            assert!(t.is_mapped(), "{}", info.name);
            assert_eq!(t.dtype().name(), info.ggml_type.name(), "{}", info.name);
            assert_eq!(t.to_f32_vec(), decode(&file, &info.name), "{}", info.name);
        }
    }
}
