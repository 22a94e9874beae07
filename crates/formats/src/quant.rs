//! The GGUF tensor types onepass reads and their block layouts, with a plain decoder to f32 for
//! each (the reference the packed kernels are tested against).
//!
//! | type   | id  | values per block | bytes per block | layout |
//! |--------|-----|------------------|-----------------|--------|
//! | F32    | 0   | 1   | 4  | little-endian IEEE single |
//! | F16    | 1   | 1   | 2  | little-endian IEEE half |
//! | Q8_0   | 8   | 32  | 34 | f16 scale `d`, then 32 `i8` codes `q`; value `q·d` |
//! | BF16   | 30  | 1   | 2  | the top half of an f32 |
//! | PQ2_0  | 142 | 128 | 34 | f16 scale `d`, then 32 bytes of 2-bit codes; value `(code − 1)·d` |
//! | PTQ1_0 | 143 | 128 | 28 | 24 bytes of 5 trits, 2 bytes of 4 trits, then the f16 scale `d`; value `(trit − 1)·d` |
//!
//! PQ2_0: value `j` of a block is the code in bits `2·(j % 4)`..`2·(j % 4) + 1` of code byte
//! `j / 4`, so four little-endian code bytes read as a `u32` hold 16 consecutive values at bits
//! `2·i`. Codes 0, 1, 2 mean −d, 0, +d; a ternary quantiser never writes code 3, but it is decoded
//! as +2·d, the value the format's own arithmetic gives it.
//!
//! PTQ1_0 stores base-3 digits ("trits"), the first one most significant: a byte holding trits
//! `t0..t4` is `ceil(256 · (81·t0 + 27·t1 + 9·t2 + 3·t3 + t4) / 243)`, and trit `n` comes back as
//! `((byte · 3ⁿ) mod 256) · 3 / 256` (integer division). The four-trit bytes are encoded the same
//! way with a fifth trit of 0. Values are not stored in order: trit `n` of byte `m` is value
//! `16·n + m` for the first 16 bytes (values 0..80), value `80 + 8·n + (m − 16)` for the next 8
//! (values 80..120), and trit `n` of four-trit byte `h` is value `120 + 2·n + h`.

use half::{bf16, f16};

/// A tensor type of a GGUF file that onepass can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q8_0,
    BF16,
    PQ2_0,
    PTQ1_0,
}

/// Values per PQ2_0 / PTQ1_0 block (one scale per 128 weights).
pub const TERNARY_BLOCK: usize = 128;
/// Bytes per PQ2_0 block: a 2-byte scale and 32 bytes of 2-bit codes.
pub const PQ2_0_BLOCK_BYTES: usize = 34;
/// Bytes per PTQ1_0 block: 24 + 2 bytes of trits and a 2-byte scale.
pub const PTQ1_0_BLOCK_BYTES: usize = 28;
/// Values per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes per Q8_0 block.
pub const Q8_0_BLOCK_BYTES: usize = 34;

impl GgmlType {
    /// The type for a ggml type id, if onepass reads it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            142 => GgmlType::PQ2_0,
            143 => GgmlType::PTQ1_0,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q8_0 => 8,
            GgmlType::BF16 => 30,
            GgmlType::PQ2_0 => 142,
            GgmlType::PTQ1_0 => 143,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::BF16 => "BF16",
            GgmlType::PQ2_0 => "PQ2_0",
            GgmlType::PTQ1_0 => "PTQ1_0",
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0 => Q8_0_BLOCK,
            GgmlType::PQ2_0 | GgmlType::PTQ1_0 => TERNARY_BLOCK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q8_0 => Q8_0_BLOCK_BYTES,
            GgmlType::PQ2_0 => PQ2_0_BLOCK_BYTES,
            GgmlType::PTQ1_0 => PTQ1_0_BLOCK_BYTES,
        }
    }

    /// Bits of storage per value (2.125 for PQ2_0, 1.75 for PTQ1_0).
    pub fn bits_per_weight(self) -> f64 {
        (self.block_bytes() * 8) as f64 / self.block_len() as f64
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A decode request whose byte and value counts do not agree with the type's block layout.
#[derive(Debug, thiserror::Error)]
#[error("{ty}: {bytes} bytes cannot decode to {values} values ({block_bytes} bytes per {block_len} values)")]
pub struct BlockSizeError {
    pub ty: GgmlType,
    pub bytes: usize,
    pub values: usize,
    pub block_bytes: usize,
    pub block_len: usize,
}

/// `ty`'s (block length, block bytes) when `values` values fill whole blocks that take `bytes` bytes.
fn whole_blocks(
    ty: GgmlType,
    bytes: usize,
    values: usize,
) -> Result<(usize, usize), BlockSizeError> {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    if !values.is_multiple_of(bl) || bytes != values / bl * bb {
        return Err(BlockSizeError {
            ty,
            bytes,
            values,
            block_bytes: bb,
            block_len: bl,
        });
    }
    Ok((bl, bb))
}

/// Decodes `src` (whole blocks of type `ty`) into `out`, one f32 per value.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), BlockSizeError> {
    let (bl, bb) = whole_blocks(ty, src.len(), out.len())?;
    for (block, dst) in src.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        match ty {
            GgmlType::F32 => dst[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
            GgmlType::F16 => dst[0] = f16::from_le_bytes([block[0], block[1]]).to_f32(),
            GgmlType::BF16 => dst[0] = bf16::from_le_bytes([block[0], block[1]]).to_f32(),
            GgmlType::Q8_0 => dequantize_q8_0_block(block, dst),
            GgmlType::PQ2_0 => dequantize_pq2_0_block(block, dst),
            GgmlType::PTQ1_0 => dequantize_ptq1_0_block(block, dst),
        }
    }
    Ok(())
}

/// One Q8_0 block (34 bytes) to 32 values.
pub fn dequantize_q8_0_block(block: &[u8], out: &mut [f32]) {
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    for (o, &q) in out[..Q8_0_BLOCK]
        .iter_mut()
        .zip(&block[2..Q8_0_BLOCK_BYTES])
    {
        *o = f32::from(q as i8) * d;
    }
}

/// One PQ2_0 block (34 bytes) to 128 values.
pub fn dequantize_pq2_0_block(block: &[u8], out: &mut [f32]) {
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    for j in 0..TERNARY_BLOCK {
        let code = (block[2 + j / 4] >> (2 * (j % 4))) & 3;
        out[j] = (f32::from(code) - 1.0) * d;
    }
}

/// Trit `n` (0 = most significant) of a PTQ1_0 byte.
pub fn ptq1_0_trit(byte: u8, n: u32) -> u8 {
    let scaled = byte.wrapping_mul(3u8.pow(n));
    ((u16::from(scaled) * 3) >> 8) as u8
}

/// The trits (0, 1, 2) of one PTQ1_0 block in value order.
pub fn ptq1_0_trits(block: &[u8]) -> [u8; TERNARY_BLOCK] {
    let mut t = [0u8; TERNARY_BLOCK];
    for n in 0..5u32 {
        for m in 0..16 {
            t[16 * n as usize + m] = ptq1_0_trit(block[m], n);
        }
        for m in 0..8 {
            t[80 + 8 * n as usize + m] = ptq1_0_trit(block[16 + m], n);
        }
    }
    for n in 0..4u32 {
        for h in 0..2 {
            t[120 + 2 * n as usize + h] = ptq1_0_trit(block[24 + h], n);
        }
    }
    t
}

/// One PTQ1_0 block (28 bytes) to 128 values.
pub fn dequantize_ptq1_0_block(block: &[u8], out: &mut [f32]) {
    let d = f16::from_le_bytes([block[26], block[27]]).to_f32();
    for (o, t) in out.iter_mut().zip(ptq1_0_trits(block)) {
        *o = (f32::from(t) - 1.0) * d;
    }
}

/// Transcodes PTQ1_0 blocks to PQ2_0 blocks (lossless: same scales, trit `t` becomes code `t`),
/// so a PTQ1_0 file runs on the PQ2_0 kernels. `dst` must hold `src.len() / 28 * 34` bytes.
pub fn ptq1_0_to_pq2_0(src: &[u8], dst: &mut [u8]) -> Result<(), BlockSizeError> {
    let blocks = src.len() / PTQ1_0_BLOCK_BYTES;
    if !src.len().is_multiple_of(PTQ1_0_BLOCK_BYTES) || dst.len() != blocks * PQ2_0_BLOCK_BYTES {
        return Err(BlockSizeError {
            ty: GgmlType::PTQ1_0,
            bytes: src.len(),
            values: dst.len() / PQ2_0_BLOCK_BYTES * TERNARY_BLOCK,
            block_bytes: PTQ1_0_BLOCK_BYTES,
            block_len: TERNARY_BLOCK,
        });
    }
    for (s, d) in src
        .chunks_exact(PTQ1_0_BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(PQ2_0_BLOCK_BYTES))
    {
        d[0] = s[26];
        d[1] = s[27];
        let trits = ptq1_0_trits(s);
        for (byte, four) in d[2..].iter_mut().zip(trits.chunks_exact(4)) {
            *byte = four[0] | (four[1] << 2) | (four[2] << 4) | (four[3] << 6);
        }
    }
    Ok(())
}

/// Encodes `src` (one f32 per value, a whole number of blocks) into `dst` in `ty`'s block layout,
/// the way llama.cpp's reference quantisers (and gguf-py) do: F16/BF16 round to nearest even;
/// Q8_0 `d = max|x| / 127`, `q = round(x / d)`; PQ2_0 and PTQ1_0 `d = max|x|` over the 128
/// values (stored as f16) and trit `round(x / d) + 1`, so every value becomes −d, 0 or +d.
/// Rounding is half away from zero, as C's `roundf`.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), BlockSizeError> {
    let (bl, bb) = whole_blocks(ty, dst.len(), src.len())?;
    for (x, block) in src.chunks_exact(bl).zip(dst.chunks_exact_mut(bb)) {
        match ty {
            GgmlType::F32 => block.copy_from_slice(&x[0].to_le_bytes()),
            GgmlType::F16 => block.copy_from_slice(&f16::from_f32(x[0]).to_le_bytes()),
            GgmlType::BF16 => block.copy_from_slice(&bf16::from_f32(x[0]).to_le_bytes()),
            GgmlType::Q8_0 => quantize_q8_0_block(x, block),
            GgmlType::PQ2_0 => quantize_pq2_0_block(x, block),
            GgmlType::PTQ1_0 => quantize_ptq1_0_block(x, block),
        }
    }
    Ok(())
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// 32 values to one Q8_0 block (34 bytes), as gguf-py's `Q8_0.quantize_blocks`.
pub fn quantize_q8_0_block(x: &[f32], block: &mut [u8]) {
    let d = absmax(&x[..Q8_0_BLOCK]) / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &v) in block[2..Q8_0_BLOCK_BYTES].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// The trits (0, 1, 2 for −d, 0, +d) and the f16 scale of 128 values: `d = max|x|`,
/// trit `round(x / d) + 1` clamped to 0..=2.
pub fn ternary_trits(x: &[f32]) -> ([u8; TERNARY_BLOCK], f16) {
    let d = absmax(&x[..TERNARY_BLOCK]);
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut t = [1u8; TERNARY_BLOCK];
    for (t, &v) in t.iter_mut().zip(x) {
        *t = ((v * id).round() + 1.0).clamp(0.0, 2.0) as u8;
    }
    (t, f16::from_f32(d))
}

/// Packs trits (value order) and a scale as one PQ2_0 block (34 bytes).
pub fn pack_pq2_0_block(trits: &[u8; TERNARY_BLOCK], d: f16, block: &mut [u8]) {
    block[..2].copy_from_slice(&d.to_le_bytes());
    for (byte, four) in block[2..PQ2_0_BLOCK_BYTES]
        .iter_mut()
        .zip(trits.chunks_exact(4))
    {
        *byte = four[0] | (four[1] << 2) | (four[2] << 4) | (four[3] << 6);
    }
}

/// A PTQ1_0 byte holding `trits` (first most significant, missing ones 0): `⌈256·v / 243⌉`.
pub fn ptq1_0_byte(trits: &[u8]) -> u8 {
    let mut v: u32 = 0;
    for i in 0..5 {
        v = v * 3 + u32::from(trits.get(i).copied().unwrap_or(0));
    }
    (v * 256).div_ceil(243) as u8
}

/// Packs trits (value order) and a scale as one PTQ1_0 block (28 bytes), in the staged order the
/// module docs describe.
pub fn pack_ptq1_0_block(trits: &[u8; TERNARY_BLOCK], d: f16, block: &mut [u8]) {
    for m in 0..16 {
        let t: [u8; 5] = std::array::from_fn(|n| trits[16 * n + m]);
        block[m] = ptq1_0_byte(&t);
    }
    for m in 0..8 {
        let t: [u8; 5] = std::array::from_fn(|n| trits[80 + 8 * n + m]);
        block[16 + m] = ptq1_0_byte(&t);
    }
    for h in 0..2 {
        let t: [u8; 4] = std::array::from_fn(|n| trits[120 + 2 * n + h]);
        block[24 + h] = ptq1_0_byte(&t);
    }
    block[26..28].copy_from_slice(&d.to_le_bytes());
}

/// 128 values to one PQ2_0 block (34 bytes).
pub fn quantize_pq2_0_block(x: &[f32], block: &mut [u8]) {
    let (t, d) = ternary_trits(x);
    pack_pq2_0_block(&t, d, block);
}

/// 128 values to one PTQ1_0 block (28 bytes).
pub fn quantize_ptq1_0_block(x: &[f32], block: &mut [u8]) {
    let (t, d) = ternary_trits(x);
    pack_ptq1_0_block(&t, d, block);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes trits the way the format defines it (first trit most significant, rounded up).
    fn encode(trits: &[u8]) -> u8 {
        let mut q: u32 = 0;
        for &t in trits {
            q = q * 3 + u32::from(t);
        }
        for _ in trits.len()..5 {
            q *= 3;
        }
        ((q * 256).div_ceil(243)) as u8
    }

    #[test]
    fn every_trit_byte_decodes_to_its_digits() {
        for v in 0..243u32 {
            let digits: Vec<u8> = (0..5)
                .rev()
                .map(|i| ((v / 3u32.pow(i)) % 3) as u8)
                .collect();
            let byte = encode(&digits);
            let back: Vec<u8> = (0..5).map(|n| ptq1_0_trit(byte, n)).collect();
            assert_eq!(back, digits, "value {v} byte {byte}");
        }
    }

    #[test]
    fn pq2_0_code_three_is_plus_two_d() {
        let mut block = [0u8; PQ2_0_BLOCK_BYTES];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Value 5 lives in byte 1 at bits 2..4.
        block[2 + 1] = 0b0000_1100;
        let mut out = [9.0f32; TERNARY_BLOCK];
        dequantize_pq2_0_block(&block, &mut out);
        assert_eq!(out[5], 1.0);
        assert_eq!(out[4], -0.5);
        assert_eq!(out[6], -0.5);
    }

    #[test]
    fn size_mismatch_is_refused() {
        let mut out = [0f32; 128];
        assert!(dequantize(GgmlType::PQ2_0, &[0u8; 33], &mut out).is_err());
        assert!(dequantize(GgmlType::PQ2_0, &[0u8; 34], &mut out[..127]).is_err());
        assert!(dequantize(GgmlType::PQ2_0, &[0u8; 34], &mut out).is_ok());
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn ternary_encoders_round_trip_through_the_decoders() {
        let mut seed = 7u64;
        let x: Vec<f32> = (0..TERNARY_BLOCK * 5)
            .map(|_| lcg(&mut seed) * 0.05)
            .collect();
        for ty in [GgmlType::PQ2_0, GgmlType::PTQ1_0] {
            let mut bytes = vec![0u8; 5 * ty.block_bytes()];
            quantize(ty, &x, &mut bytes).expect("whole blocks");
            let mut back = vec![0f32; x.len()];
            dequantize(ty, &bytes, &mut back).expect("whole blocks");
            for (b, (xs, ys)) in x.chunks(128).zip(back.chunks(128)).enumerate() {
                let d = f16::from_f32(xs.iter().fold(0f32, |m, v| m.max(v.abs()))).to_f32();
                for (j, (&v, &y)) in xs.iter().zip(ys).enumerate() {
                    // Independent expectation: the nearest of −d, 0, +d to v in units of max|x|.
                    let want = (v / xs.iter().fold(0f32, |m, v| m.max(v.abs()))).round() * d;
                    assert_eq!(y, want, "{ty} block {b} value {j}");
                }
            }
            // Re-encoding the decoded values reproduces the bytes exactly.
            let mut again = vec![0u8; bytes.len()];
            quantize(ty, &back, &mut again).expect("whole blocks");
            assert_eq!(again, bytes, "{ty}");
        }
        // PTQ1_0 and PQ2_0 hold the same values: transcoding one encoder's output gives the other's.
        let mut pq = vec![0u8; 5 * PQ2_0_BLOCK_BYTES];
        let mut pt = vec![0u8; 5 * PTQ1_0_BLOCK_BYTES];
        quantize(GgmlType::PQ2_0, &x, &mut pq).expect("whole blocks");
        quantize(GgmlType::PTQ1_0, &x, &mut pt).expect("whole blocks");
        let mut transcoded = vec![0u8; pq.len()];
        ptq1_0_to_pq2_0(&pt, &mut transcoded).expect("whole blocks");
        assert_eq!(transcoded, pq);
    }

    #[test]
    fn ptq1_0_staged_order_puts_each_value_in_its_byte() {
        // One nonzero trit at a time: the byte and digit that change are the layout's.
        for j in 0..TERNARY_BLOCK {
            let mut t = [0u8; TERNARY_BLOCK];
            t[j] = 2;
            let mut block = [0u8; PTQ1_0_BLOCK_BYTES];
            pack_ptq1_0_block(&t, f16::ONE, &mut block);
            let (byte, digit) = if j < 80 {
                (j % 16, j / 16)
            } else if j < 120 {
                (16 + (j - 80) % 8, (j - 80) / 8)
            } else {
                (24 + (j - 120) % 2, (j - 120) / 2)
            };
            for (b, &v) in block[..26].iter().enumerate() {
                let zero = ptq1_0_byte(&[0; 5]);
                if b == byte {
                    assert_eq!(ptq1_0_trit(v, digit as u32), 2, "value {j}");
                } else {
                    assert_eq!(v, zero, "value {j} byte {b}");
                }
            }
        }
    }

    #[test]
    fn q8_0_and_float_encoders_round_trip() {
        let mut seed = 3u64;
        let x: Vec<f32> = (0..Q8_0_BLOCK * 4).map(|_| lcg(&mut seed) * 3.0).collect();
        let mut bytes = vec![0u8; 4 * Q8_0_BLOCK_BYTES];
        quantize(GgmlType::Q8_0, &x, &mut bytes).expect("whole blocks");
        let mut back = vec![0f32; x.len()];
        dequantize(GgmlType::Q8_0, &bytes, &mut back).expect("whole blocks");
        for (xs, ys) in x.chunks(32).zip(back.chunks(32)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = f16::from_f32(amax / 127.0).to_f32();
            for (&v, &y) in xs.iter().zip(ys) {
                assert!((v - y).abs() <= 0.5 * d + amax * 1e-3, "{v} -> {y}");
            }
        }
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let mut bytes = vec![0u8; x.len() * ty.block_bytes()];
            quantize(ty, &x, &mut bytes).expect("whole blocks");
            dequantize(ty, &bytes, &mut back).expect("whole blocks");
            for (&v, &y) in x.iter().zip(&back) {
                let tol = match ty {
                    GgmlType::F32 => 0.0,
                    GgmlType::F16 => v.abs() / 2048.0,
                    _ => v.abs() / 256.0,
                };
                assert!((v - y).abs() <= tol, "{ty}: {v} -> {y}");
            }
        }
        assert!(quantize(GgmlType::Q8_0, &x[..31], &mut bytes[..34]).is_err());
    }
}
