//! ggml tensor types and their dequantisation to f32.
//!
//! Block layouts and formulas follow ggml's `ggml-common.h` / `ggml-quants.c`
//! (`dequantize_row_*`), including the order of the f32 operations (e.g. Q4_K computes
//! `d·sc` first, then `(d·sc)·q − dmin·m`), so results are bit-identical to llama.cpp's
//! reference dequantisation. See docs/models.md §3.5.

use anyhow::{bail, Result};
use half::{bf16, f16};
use std::fmt;

/// A ggml tensor type, as stored in a GGUF tensor info (`ggml_type`).
///
/// All types that current GGUF files may carry are listed, so that block sizes are known and
/// tensor data offsets can be validated even for types this crate cannot dequantise.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// Elements per K-quant super-block.
const QK_K: usize = 256;

/// (type, ggml id, name, elements per block, bytes per block). Sizes from gguf-py's
/// `GGML_QUANT_SIZES` / ggml's `type_traits`.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, 84),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, 110),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 144),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, 176),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, 210),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

/// The types [`dequantize`] handles, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, MXFP4";

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every GgmlType variant has a TABLE row")
    }

    /// The type with ggml id `id`, or `None` for ids unknown to this reader.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name: "Q4_K", "F32", ...
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per quantisation block (1 for plain types).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Whether [`dequantize`] handles this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q4_K
                | GgmlType::Q6_K
                | GgmlType::MXFP4
        )
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks (or the
    /// size overflows).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantise `dst.len()` elements of type `ty` from `src` into `dst`.
///
/// `dst.len()` must be a whole number of blocks and `src` exactly the bytes of those blocks.
/// Errors (never panics) on an unsupported type or mismatched lengths; the caller adds the file
/// and tensor name.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if !ty.is_supported() {
        bail!("unsupported tensor type {ty} (supported: {SUPPORTED})");
    }
    let n = dst.len();
    if !n.is_multiple_of(ty.block_size()) {
        bail!(
            "{n} elements is not a multiple of the {ty} block size {}",
            ty.block_size()
        );
    }
    let want = n / ty.block_size() * ty.type_size();
    if src.len() != want {
        bail!("{n} elements of {ty} take {want} bytes, got {}", src.len());
    }
    match ty {
        GgmlType::F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => blocks(src, dst, 18, 32, q4_0),
        GgmlType::Q4_1 => blocks(src, dst, 20, 32, q4_1),
        GgmlType::Q5_0 => blocks(src, dst, 22, 32, q5_0),
        GgmlType::Q5_1 => blocks(src, dst, 24, 32, q5_1),
        GgmlType::Q8_0 => blocks(src, dst, 34, 32, q8_0),
        GgmlType::Q4_K => blocks(src, dst, 144, QK_K, q4_k),
        GgmlType::Q6_K => blocks(src, dst, 210, QK_K, q6_k),
        GgmlType::MXFP4 => blocks(src, dst, 17, 32, mxfp4),
        _ => unreachable!("is_supported() was checked above"),
    }
    Ok(())
}

/// Apply a per-block kernel over matching byte and element chunks.
#[inline]
fn blocks(src: &[u8], dst: &mut [f32], bytes: usize, elems: usize, f: fn(&[u8], &mut [f32])) {
    for (b, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(elems)) {
        f(b, y);
    }
}

#[inline]
fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `d` f16, `qs[16]`: element j < 16 is the low nibble of qs[j], element j + 16 the high one.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `d` f16, `m` f16, `qs[16]`: `y = q·d + m`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// `d` f16, `qh` u32 LE (5th bits), `qs[16]`: bit j of qh belongs to element j, bit j + 16 to
/// element j + 16; `y = (q5 − 16)·d`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = (((qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// `d`, `m` f16, `qh` u32 LE, `qs[16]`: same bit assembly as Q5_0, `y = q5·d + m`.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = ((qs[j] & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

/// `d` f16, `qs[32]` i8: `y = q·d`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = (q as i8) as f32 * d;
    }
}

/// ggml's `kvalues_mxfp4`: the e2m1 values doubled (`ggml-common.h`), so that the scale can be
/// halved ([`e8m0_half`]); the product is the e2m1 value times `2^(e − 127)`, exactly.
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half` (`ggml-impl.h`): `2^(e − 128)` built from its bits, the
/// subnormals 2^-128 and 2^-127 for e = 0 and 1; e = 255 is the finite 2^127 there (ggml does
/// not treat it as NaN), so here too.
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// `e` (e8m0 exponent), `qs[16]`: element j < 16 is the low nibble of qs[j], element j + 16 the
/// high one (ggml `dequantize_row_mxfp4`; gpt-oss's checkpoints pair them differently, see
/// `formats::mxfp4`, whose `from_ggml` repacks these blocks into that layout).
fn mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        y[j] = KVALUES_MXFP4[(q & 0x0F) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

/// 6-bit (scale, min) of sub-block `j` (0..8) from the 12 packed bytes (ggml `get_scale_min_k4`).
#[inline]
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `d`, `dmin` f16, `scales[12]`, `qs[128]`: four chunks of 64 values; chunk c reads 32 bytes
/// of qs, low nibbles with sub-block 2c, high nibbles with sub-block 2c + 1.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * c..32 * c + 32];
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `ql[128]`, `qh[64]`, `scales[16]` i8, `d` f16 (last). Two halves of 128 values.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            // ggml evaluates d * sc * q left to right in float.
            out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // element indices are the point of these tests
mod tests {
    //! Known-answer tests: each block is built by hand from the format definition and the
    //! expected values are worked out independently of the kernels above (by element index,
    //! with the quantised value and scale chosen per element).
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    fn deq(ty: GgmlType, src: &[u8], n: usize) -> Vec<f32> {
        let mut y = vec![f32::NAN; n];
        dequantize(ty, src, &mut y).unwrap();
        y
    }

    #[test]
    fn type_table_ids_round_trip_and_sizes() {
        for &(t, id, name, bs, ts) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(t));
            assert_eq!(t.name(), name);
            assert_eq!((t.block_size(), t.type_size()), (bs, ts));
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from ggml");
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(576), None);
    }

    #[test]
    fn plain_types() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let src: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(deq(GgmlType::F32, &src, 4), vals);
        // f16 0x3C00 = 1.0, 0xC000 = -2.0, 0x3555 = 2^-2 · (1 + 341/1024) = 1365/4096, 0x7BFF = 65504.
        let src = [0x00, 0x3C, 0x00, 0xC0, 0x55, 0x35, 0xFF, 0x7B];
        assert_eq!(
            deq(GgmlType::F16, &src, 4),
            [1.0, -2.0, 1365.0 / 4096.0, 65504.0]
        );
        // bf16 is the top half of an f32: 0x3FC0 = 1.5, 0xC120 = -10.0, 0x3E80 = 0.25.
        let src = [0xC0, 0x3F, 0x20, 0xC1, 0x80, 0x3E];
        assert_eq!(deq(GgmlType::BF16, &src, 3), [1.5, -10.0, 0.25]);
    }

    #[test]
    fn q4_0_known_answer() {
        // d = 0.5; low nibble of byte j is j, high nibble is 15 - j.
        let mut b = h(0.5).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = deq(GgmlType::Q4_0, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], ((15 - j) as f32 - 8.0) * 0.5);
        }
        assert_eq!(y[0], -4.0);
        assert_eq!(y[16], 3.5);
    }

    #[test]
    fn q4_1_known_answer() {
        // d = 0.25, m = -1.0; all low nibbles 3, all high nibbles 12.
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        b.extend([0xC3u8; 16]);
        let y = deq(GgmlType::Q4_1, &b, 32);
        assert!(y[..16].iter().all(|&v| v == 3.0 * 0.25 - 1.0)); // -0.25
        assert!(y[16..].iter().all(|&v| v == 12.0 * 0.25 - 1.0)); // 2.0
    }

    /// Build a Q5 block body: element e gets the 5-bit value q(e).
    fn q5_body(q: impl Fn(usize) -> u8) -> ([u8; 4], [u8; 16]) {
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let (a, b) = (q(j), q(j + 16));
            qs[j] = (a & 0xF) | ((b & 0xF) << 4);
            qh |= ((a >> 4) as u32) << j;
            qh |= ((b >> 4) as u32) << (j + 16);
        }
        (qh.to_le_bytes(), qs)
    }

    #[test]
    fn q5_0_known_answer() {
        // q(e) = e (0..31), so y[e] = (e - 16)·d with d = 2: exercises every 5th bit.
        let (qh, qs) = q5_body(|e| e as u8);
        let mut b = h(2.0).to_vec();
        b.extend(qh);
        b.extend(qs);
        let y = deq(GgmlType::Q5_0, &b, 32);
        for e in 0..32 {
            assert_eq!(y[e], (e as f32 - 16.0) * 2.0, "element {e}");
        }
    }

    #[test]
    fn q5_1_known_answer() {
        // q(e) = 31 - e, d = 0.5, m = 0.25 → y[e] = (31 - e)·0.5 + 0.25.
        let (qh, qs) = q5_body(|e| 31 - e as u8);
        let mut b = h(0.5).to_vec();
        b.extend(h(0.25));
        b.extend(qh);
        b.extend(qs);
        let y = deq(GgmlType::Q5_1, &b, 32);
        for e in 0..32 {
            assert_eq!(y[e], (31 - e) as f32 * 0.5 + 0.25, "element {e}");
        }
        assert_eq!(y[0], 15.75);
    }

    #[test]
    fn mxfp4_known_answer() {
        // e = 130 → scale 2^(130 − 127) = 8; qs[j] = code j low, code 15 − j high, so
        // y[j] = E2M1[j]·8 and y[j + 16] = E2M1[15 − j]·8 (E2M1 as in formats::mxfp4).
        let e2m1 = crate::formats::mxfp4::E2M1;
        let mut b = vec![130u8];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = deq(GgmlType::MXFP4, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], e2m1[j] * 8.0, "element {j}");
            assert_eq!(y[j + 16], e2m1[15 - j] * 8.0, "element {}", j + 16);
        }
        // The exponent's ends: 2^-127 · 0.5 (a subnormal) for e = 0, 2^-126 · 0.5 for e = 1,
        // 6 · 2^127 overflowing to inf for e = 255 (finite scale, as in ggml).
        for (e, want) in [
            (0u8, f32::from_bits(0x0020_0000)),
            (1, f32::from_bits(0x0040_0000)),
            (127, 0.5),
            (255, 2f32.powi(127)),
        ] {
            let mut b = vec![e];
            b.extend([1u8; 16]); // code 1 (0.5) in every low nibble, 0 in the high ones
            let y = deq(GgmlType::MXFP4, &b, 32);
            assert_eq!((y[0], y[16]), (want, 0.0), "e = {e}");
        }
        let mut b = vec![255u8];
        b.extend([7u8; 16]);
        assert_eq!(deq(GgmlType::MXFP4, &b, 32)[0], f32::INFINITY);
    }

    #[test]
    fn q8_0_known_answer() {
        // d = 0.125, q[e] = e - 16 as i8 (negative values exercise sign).
        let mut b = h(0.125).to_vec();
        b.extend((0..32i32).map(|e| (e - 16) as i8 as u8));
        let y = deq(GgmlType::Q8_0, &b, 32);
        for e in 0..32 {
            assert_eq!(y[e], (e as f32 - 16.0) * 0.125);
        }
    }

    #[test]
    fn q4_k_known_answer() {
        // Chosen 6-bit scales and mins per sub-block s (0..8): sc = 10 + 5s (10..45, some ≥ 32
        // so the high 2 bits matter), m = 60 - 7s (60..11).
        let sc: Vec<u8> = (0..8).map(|s| 10 + 5 * s).collect();
        let mn: Vec<u8> = (0..8).map(|s| 60 - 7 * s).collect();
        // Pack per ggml: bytes 0..4 = sc[0..4] low 6 bits | (sc[4..8] >> 4) << 6,
        // bytes 4..8 = mn[0..4] | (mn[4..8] >> 4) << 6, bytes 8..12 = (sc[4+j] & 15) | (mn[4+j] & 15) << 4.
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
        }
        // Quant of element e: sub-block e/32, q = (e * 7) % 16.
        let q = |e: usize| ((e * 7) % 16) as u8;
        let mut qs = [0u8; 128];
        for c in 0..4 {
            for l in 0..32 {
                qs[32 * c + l] = q(64 * c + l) | (q(64 * c + 32 + l) << 4);
            }
        }
        let (d, dmin) = (0.5f32, 0.25f32);
        let mut b = h(d).to_vec();
        b.extend(h(dmin));
        b.extend(s);
        b.extend(qs);
        assert_eq!(b.len(), 144);
        let y = deq(GgmlType::Q4_K, &b, 256);
        for e in 0..256 {
            let sb = e / 32;
            let want = d * sc[sb] as f32 * q(e) as f32 - dmin * mn[sb] as f32;
            assert_eq!(y[e], want, "element {e}");
        }
        // Spot values worked by hand: e = 0: q 0, sc 10, m 60 → -15; e = 255: sb 7, sc 45,
        // m 11, q = 1785 % 16 = 9 → 0.5·45·9 − 0.25·11 = 199.75.
        assert_eq!(y[0], -15.0);
        assert_eq!(y[255], 199.75);
    }

    #[test]
    fn q6_k_known_answer() {
        // Quant of element e: q6(e) = (e * 5) % 64 (stored +32 offset removed on read), scale of
        // group e/16: sc = (g as i8) - 8 (negative and positive), d = 0.5.
        let q6 = |e: usize| ((e * 5) % 64) as u8;
        let scale = |g: usize| g as i8 - 8;
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for half in 0..2 {
            for l in 0..32 {
                let base = 128 * half;
                let (a, b2, c, dd) = (
                    q6(base + l),
                    q6(base + l + 32),
                    q6(base + l + 64),
                    q6(base + l + 96),
                );
                ql[64 * half + l] = (a & 15) | ((c & 15) << 4);
                ql[64 * half + l + 32] = (b2 & 15) | ((dd & 15) << 4);
                qh[32 * half + l] =
                    (a >> 4) | ((b2 >> 4) << 2) | ((c >> 4) << 4) | ((dd >> 4) << 6);
            }
        }
        let mut b = ql.to_vec();
        b.extend(qh);
        b.extend((0..16).map(|g| scale(g) as u8));
        b.extend(h(0.5));
        assert_eq!(b.len(), 210);
        let y = deq(GgmlType::Q6_K, &b, 256);
        for e in 0..256 {
            let want = 0.5 * scale(e / 16) as f32 * (q6(e) as f32 - 32.0);
            assert_eq!(y[e], want, "element {e}");
        }
        // e = 0: scale -8, q 0 - 32 → 0.5·(−8)·(−32) = 128.
        assert_eq!(y[0], 128.0);
    }

    #[test]
    fn unsupported_and_bad_lengths_are_errors() {
        let mut y = vec![0.0; 256];
        let e = dequantize(GgmlType::Q5_K, &[0; 176], &mut y)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported tensor type Q5_K"), "{e}");
        let e = dequantize(GgmlType::Q4_K, &[0; 100], &mut y)
            .unwrap_err()
            .to_string();
        assert!(e.contains("take 144 bytes, got 100"), "{e}");
        let mut y = vec![0.0; 33];
        let e = dequantize(GgmlType::Q8_0, &[0; 68], &mut y)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a multiple of the Q8_0 block size 32"),
            "{e}"
        );
    }
}
