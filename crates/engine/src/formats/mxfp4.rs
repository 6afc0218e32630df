//! MXFP4 weights as gpt-oss checkpoints store its experts (docs/moe-models.md, "gpt-oss"): a
//! tensor `W` `[E, R, C]` is kept as `{name}_blocks` U8 `[E, R, C/32, 16]` (two e2m1 values per
//! byte, the low nibble first) and `{name}_scales` U8 `[E, R, C/32]` (one e8m0 exponent per 32
//! values, biased by 127). Dequantised exactly to f32: an e2m1 value (at most two significant
//! bits) times a power of two is an f32, a subnormal at worst, so nothing is rounded; only
//! products beyond f32's range (scales of 2^126 and up, never seen in a real checkpoint) become
//! ±inf, as in transformers' bf16, which has the same exponent range.
//!
//! Reference: transformers 5.17 `integrations/mxfp4.py` (`FP4_VALUES`,
//! `_convert_moe_packed_tensors`: `lut[blk & 0x0F]` at even, `lut[blk >> 4]` at odd columns,
//! `torch.ldexp(value, scale − 127)`, then the last two axes transposed to `[E, C, R]`, the
//! layout `x @ W` reads). draftlens keeps `[E, R, C]`, which per expert is already a weight's
//! `[out, in]`.
//!
//! The blocks are U8 tensors, which [`super::WeightSource`] does not serve (it dequantises
//! floats), so [`StoredU8`] reads them from the folder's safetensors files itself (the index's
//! `weight_map` names the shard); a source that generates them (a `random:DIR` target) hands
//! them over one expert at a time ([`Mxfp4Tensor::of_source`]).
//!
//! llama.cpp's GGUF files store the same values in ggml's own block layout; [`from_ggml`] moves
//! their bytes into this one (a gpt-oss GGUF's experts, [`super::WeightSource::mxfp4`]).

use super::safetensors::{INDEX_FILE, SINGLE_FILE};
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// The 16 e2m1 values by code (transformers' `FP4_VALUES`): sign bit 3, then 2 exponent bits and
/// 1 mantissa bit.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Values per scale (one e8m0 exponent per 16 bytes of blocks).
pub const BLOCK: usize = 32;

/// `2^(scale − 127)`, exact in f32 for every scale but 255, which the OCP MX format reserves for
/// NaN (refused: transformers' `ldexp` would give inf or NaN weights).
pub fn e8m0(scale: u8) -> Option<f32> {
    (scale != 255).then(|| 2f64.powi(scale as i32 - 127) as f32)
}

/// Dequantise rows of packed blocks: `blocks` holds `rows · cols / 2` bytes (row-major, each row
/// `cols / 32` groups of 16 bytes), `scales` `rows · cols / 32` exponents; `out` gets
/// `rows · cols` values. Returns the index of the first scale of 255, if any (nothing is written
/// from there on).
pub fn dequantize_into(blocks: &[u8], scales: &[u8], out: &mut [f32]) -> Result<(), usize> {
    debug_assert_eq!(blocks.len() * 2, out.len());
    debug_assert_eq!(scales.len() * BLOCK, out.len());
    for (g, ((bytes, &s), vals)) in blocks
        .chunks_exact(BLOCK / 2)
        .zip(scales)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        let scale = e8m0(s).ok_or(g)?;
        for (pair, &b) in vals.chunks_exact_mut(2).zip(bytes) {
            pair[0] = E2M1[(b & 0x0F) as usize] * scale;
            pair[1] = E2M1[(b >> 4) as usize] * scale;
        }
    }
    Ok(())
}

/// Bytes of one ggml `block_mxfp4`: the e8m0 exponent, then 16 bytes of e2m1 codes.
pub const GGML_BLOCK_BYTES: usize = 1 + BLOCK / 2;

/// ggml's MXFP4 (ggml type 39, `block_mxfp4`) as this module's blocks and scales: the same
/// values, only bytes and nibbles moved (no arithmetic, nothing rounded). Per 32 values:
///
/// - ggml (`ggml-common.h` `block_mxfp4`, `ggml-quants.c` `dequantize_row_mxfp4`; read by
///   `formats::dequant`): 17 bytes, the e8m0 exponent `e`, then `qs[16]`: value j in the low
///   nibble of `qs[j]`, value j + 16 in its high nibble;
/// - Hugging Face (this module, [`dequantize_into`]): the exponent in `scales`, and 16 bytes in
///   `blocks`: value 2k in the low nibble of byte k, value 2k + 1 in its high nibble.
///
/// A ggml row of C values is C / 32 blocks as a row here is C / 32 groups, so ggml rows `[out,
/// in]` come out as blocks and scales `[out, in]`. The exponent byte is copied as it is: ggml reads
/// 255 as 2^127 where the OCP MX format (and so this module) has NaN; the caller decides about
/// it. Errors when `ggml` is not whole blocks.
pub fn from_ggml(ggml: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    if !ggml.len().is_multiple_of(GGML_BLOCK_BYTES) {
        bail!(
            "{} bytes are not whole ggml MXFP4 blocks of {GGML_BLOCK_BYTES}",
            ggml.len()
        );
    }
    let n = ggml.len() / GGML_BLOCK_BYTES;
    let (mut blocks, mut scales) = (vec![0u8; n * BLOCK / 2], Vec::with_capacity(n));
    for (block, out) in ggml
        .chunks_exact(GGML_BLOCK_BYTES)
        .zip(blocks.chunks_exact_mut(BLOCK / 2))
    {
        scales.push(block[0]);
        let qs = &block[1..];
        for k in 0..8 {
            // Values 2k, 2k + 1: the low nibbles of qs[2k], qs[2k + 1]; values 2k + 16,
            // 2k + 17: their high nibbles.
            out[k] = (qs[2 * k] & 0x0F) | (qs[2 * k + 1] << 4);
            out[k + 8] = (qs[2 * k] >> 4) | (qs[2 * k + 1] & 0xF0);
        }
    }
    Ok((blocks, scales))
}

/// A U8 tensor of a Hugging Face folder, its bytes borrowed from the shard's memory map.
pub struct StoredU8 {
    /// The shard file that holds it.
    pub file: PathBuf,
    pub shape: Vec<usize>,
    mmap: Mmap,
    begin: usize,
    end: usize,
}

impl StoredU8 {
    /// Tensor `name` of the folder `dir` (`model.safetensors`, or the shard the index names),
    /// which must be stored as U8.
    pub fn open(dir: &Path, name: &str) -> Result<StoredU8> {
        let file = shard_of(dir, name)?;
        let f = file.display();
        let handle = std::fs::File::open(&file).with_context(|| format!("{f}: cannot open"))?;
        // SAFETY: read-only map; as every mmap loader we rely on the file not being truncated
        // while open (the safetensors source maps the same file).
        let mmap =
            unsafe { Mmap::map(&handle) }.with_context(|| format!("{f}: cannot memory-map"))?;
        let (n, meta) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| anyhow::anyhow!("{f}: invalid safetensors header: {e}"))?;
        let info = meta
            .info(name)
            .with_context(|| format!("{f}: tensor {name} is missing"))?;
        if info.dtype != Dtype::U8 {
            bail!(
                "{f}: tensor {name} has dtype {:?}; MXFP4 blocks and scales are U8",
                info.dtype
            );
        }
        let (begin, end) = (8 + n + info.data_offsets.0, 8 + n + info.data_offsets.1);
        Ok(StoredU8 {
            shape: info.shape.clone(),
            file,
            mmap,
            begin,
            end,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.mmap[self.begin..self.end]
    }
}

/// The safetensors file of `dir` that holds `name`.
fn shard_of(dir: &Path, name: &str) -> Result<PathBuf> {
    let index = dir.join(INDEX_FILE);
    if !index.is_file() {
        return Ok(dir.join(SINGLE_FILE));
    }
    let i = index.display();
    let text = std::fs::read_to_string(&index).with_context(|| format!("{i}: cannot read"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{i}: not valid JSON"))?;
    let shard = v
        .get("weight_map")
        .and_then(|m| m.get(name))
        .and_then(|s| s.as_str())
        .with_context(|| format!("{i}: weight_map has no tensor {name}"))?;
    // Shards live next to the index (the safetensors source refused any other path at open).
    Ok(dir.join(shard))
}

/// An MXFP4 tensor `[E, R, C]` stored as `{base}_blocks` / `{base}_scales`, shapes checked.
pub struct Mxfp4Tensor<'a> {
    pub base: String,
    bytes: PackedBytes<'a>,
    /// `[E, R, C]`.
    pub shape: [usize; 3],
}

/// One expert's (blocks, scales): borrowed from a mapped file, or generated.
pub type ExpertBytes<'b> = (Cow<'b, [u8]>, Cow<'b, [u8]>);

/// Where an [`Mxfp4Tensor`]'s bytes come from: the folder's files, or a source that generates
/// them one expert at a time ([`super::WeightSource::generated_u8`]: a `random:DIR` target).
enum PackedBytes<'a> {
    Stored {
        blocks: StoredU8,
        scales: StoredU8,
    },
    Generated {
        src: &'a dyn super::WeightSource,
        blocks: String,
        scales: String,
    },
}

impl<'a> Mxfp4Tensor<'a> {
    /// `{base}_blocks` / `{base}_scales` of `src`: generated by the source when it lists them
    /// ([`super::WeightSource::generated_u8`]), else read from its folder ([`Mxfp4Tensor::open`]).
    pub fn of_source(src: &'a dyn super::WeightSource, base: &str) -> Result<Mxfp4Tensor<'a>> {
        let (bn, sn) = (format!("{base}_blocks"), format!("{base}_scales"));
        let (Some(b), Some(s)) = (src.generated_u8(&bn), src.generated_u8(&sn)) else {
            return Mxfp4Tensor::open(src.path(), base);
        };
        let shape = packed_shape(&b, &s).with_context(|| {
            format!(
                "{}: tensors {bn} {b:?} and {sn} {s:?} are not MXFP4 blocks [E, R, G, 16] with scales [E, R, G]",
                src.path().display()
            )
        })?;
        Ok(Mxfp4Tensor {
            base: base.to_string(),
            bytes: PackedBytes::Generated {
                src,
                blocks: bn,
                scales: sn,
            },
            shape,
        })
    }

    /// Open `{base}_blocks` and `{base}_scales` of folder `dir`; errors name the file and both
    /// tensors when their shapes do not fit each other (`blocks [E, R, G, 16]`, `scales [E, R,
    /// G]`).
    pub fn open(dir: &Path, base: &str) -> Result<Mxfp4Tensor<'a>> {
        let (bn, sn) = (format!("{base}_blocks"), format!("{base}_scales"));
        let blocks = StoredU8::open(dir, &bn)?;
        let scales = StoredU8::open(dir, &sn)?;
        let shape = packed_shape(&blocks.shape, &scales.shape).with_context(|| {
            format!(
                "{}: tensors {bn} {:?} and {sn} {:?} are not MXFP4 blocks [E, R, G, 16] with scales [E, R, G]",
                blocks.file.display(),
                blocks.shape,
                scales.shape
            )
        })?;
        Ok(Mxfp4Tensor {
            base: base.to_string(),
            bytes: PackedBytes::Stored { blocks, scales },
            shape,
        })
    }

    /// Matrix `e` (`[R, C]`, row-major) dequantised to f32.
    pub fn dequantize(&self, e: usize) -> Result<Vec<f32>> {
        let (blocks, scales) = self.expert_bytes(e)?;
        let mut out = vec![0f32; blocks.len() * 2];
        dequantize_into(&blocks, &scales, &mut out).expect("expert_bytes refused scales of 255");
        Ok(out)
    }

    /// Matrix `e`'s blocks (`R · C / 2` bytes) and scales (`R · C / 32`), row-major, as stored,
    /// after refusing a scale of 255 (NaN in e8m0) by tensor, expert, row and group: what a
    /// backend keeping MXFP4 packed uploads (`crate::backend::Backend::matrix_mxfp4`).
    pub fn expert_bytes(&self, e: usize) -> Result<ExpertBytes<'_>> {
        let [_, r, c] = self.shape;
        let (nb, ns) = (r * c / 2, r * c / BLOCK);
        let (blocks, scales, origin) = match &self.bytes {
            PackedBytes::Stored { blocks, scales } => (
                Cow::Borrowed(&blocks.bytes()[e * nb..(e + 1) * nb]),
                Cow::Borrowed(&scales.bytes()[e * ns..(e + 1) * ns]),
                scales.file.as_path(),
            ),
            PackedBytes::Generated {
                src,
                blocks,
                scales,
            } => (
                Cow::Owned(src.generated_u8_slice(blocks, e)?),
                Cow::Owned(src.generated_u8_slice(scales, e)?),
                src.path(),
            ),
        };
        if (blocks.len(), scales.len()) != (nb, ns) {
            bail!(
                "{}: expert {e} of {} has {} bytes of blocks and {} of scales, its shape {:?} needs {nb} and {ns}",
                origin.display(),
                self.base,
                blocks.len(),
                scales.len(),
                self.shape
            );
        }
        if let Some(g) = scales.iter().position(|&s| e8m0(s).is_none()) {
            bail!(
                "{}: tensor {}_scales holds 255 (not a number in e8m0) at expert {e}, row {}, group {}",
                origin.display(),
                self.base,
                g / (c / BLOCK),
                g % (c / BLOCK)
            );
        }
        Ok((blocks, scales))
    }
}

/// How many parameters a stored tensor holds: two per byte of MXFP4 blocks (`*_blocks`, U8),
/// none in their scales (`*_scales`, U8), one per element otherwise (`inspect`'s count).
pub fn parameters(t: &super::TensorInfo) -> u64 {
    let n: u64 = t.shape.iter().map(|&d| d as u64).product();
    match (t.dtype.as_str(), t.name.rsplit('_').next()) {
        ("U8", Some("blocks")) => 2 * n,
        ("U8", Some("scales")) => 0,
        _ => n,
    }
}

/// `[E, R, C]` of blocks `[E, R, G, 16]` and scales `[E, R, G]` (C = 32·G), `None` when they do
/// not fit.
pub fn packed_shape(blocks: &[usize], scales: &[usize]) -> Option<[usize; 3]> {
    match (blocks, scales) {
        ([e, r, g, 16], [se, sr, sg]) if (e, r, g) == (se, sr, sg) => Some([*e, *r, g * BLOCK]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_and_scale_dequantises_exactly() {
        // One group per scale: bytes 0x10 * hi + lo hold codes (lo, hi).
        for s in [0u8, 1, 100, 126, 127, 128, 200, 254] {
            let blocks: Vec<u8> = (0..16u8).map(|b| (b << 4) | (15 - b)).collect();
            let mut out = vec![0f32; 32];
            dequantize_into(&blocks, &[s], &mut out).unwrap();
            // The exact product in f64, then to f32: equal unless it overflows f32 (±inf then).
            let want = |code: usize| (E2M1[code] as f64 * 2f64.powi(s as i32 - 127)) as f32;
            for (b, pair) in out.chunks(2).enumerate() {
                let (lo, hi) = (15 - b, b);
                assert_eq!(pair[0], want(lo), "scale {s} byte {b} low");
                assert_eq!(pair[1], want(hi), "scale {s} byte {b} high");
                if s < 200 {
                    assert_eq!(pair[0] as f64, E2M1[lo] as f64 * 2f64.powi(s as i32 - 127));
                }
            }
        }
        // The smallest non-zero value is the subnormal 2^-128; the largest 6 · 2^127.
        assert_eq!(e8m0(0).unwrap() * 0.5, f32::from_bits(0x0020_0000));
        assert_eq!(e8m0(253).unwrap() * 1.5, 1.5 * 2f32.powi(126));
        assert_eq!(e8m0(254).unwrap() * 6.0, f32::INFINITY);
        let mut out = vec![0f32; 64];
        assert_eq!(dequantize_into(&[0u8; 32], &[127, 255], &mut out), Err(1));
    }

    /// ggml's MXFP4 blocks, repacked ([`from_ggml`]) and dequantised here, give ggml's own
    /// dequantisation (`formats::dequant`, tested against ggml's reference) bit for bit, but for
    /// the sign of zero: ggml's value table is integers, so its code 8 (−0 in e2m1) is +0.
    #[test]
    fn ggml_blocks_repacked_dequantise_to_ggmls_values() {
        use crate::formats::dequant::{dequantize, GgmlType};
        // Known answer: qs[j] = code j low, code 15 − j high, so value v is code v for v < 16
        // and code 31 − v from 16 on; here byte k holds values 2k (low) and 2k + 1 (high).
        let mut one = vec![127u8];
        one.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let (blocks, scales) = from_ggml(&one).unwrap();
        let code = |v: u8| if v < 16 { v } else { 31 - v };
        let want: Vec<u8> = (0..16u8)
            .map(|k| code(2 * k) | (code(2 * k + 1) << 4))
            .collect();
        assert_eq!((blocks, scales), (want, vec![127]));

        // Random blocks (every code in both nibbles) at scales 0..=254, the ends included.
        let mut r = crate::util::DetRng::new(39);
        let mut ggml = Vec::new();
        for e in (0..=254u8).chain([0, 1, 127, 253, 254]) {
            ggml.push(e);
            ggml.extend((0..16).map(|_| r.below(256) as u8));
        }
        let codes: Vec<u8> = ggml
            .chunks(GGML_BLOCK_BYTES)
            .flat_map(|b| b[1..].iter().flat_map(|q| [q & 0x0F, q >> 4]))
            .collect();
        assert!((0..16).all(|c| codes.contains(&c)), "every code appears");
        let (blocks, scales) = from_ggml(&ggml).unwrap();
        assert_eq!(
            (blocks.len(), scales.len()),
            (codes.len() / 2, ggml.len() / 17)
        );
        let mut ours = vec![0f32; codes.len()];
        dequantize_into(&blocks, &scales, &mut ours).unwrap();
        let mut theirs = vec![0f32; codes.len()];
        dequantize(GgmlType::MXFP4, &ggml, &mut theirs).unwrap();
        let mut signed_zeros = 0;
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            if a.to_bits() != b.to_bits() {
                assert!(
                    a.to_bits() == (-0f32).to_bits() && b.to_bits() == 0,
                    "value {i}: repacked {a:e}, ggml {b:e}"
                );
                signed_zeros += 1;
            }
        }
        let code8 = codes.iter().filter(|&&c| c == 8).count();
        assert!(code8 > 0);
        assert_eq!(
            signed_zeros, code8,
            "only code 8 differs, by the sign of zero"
        );

        let err = from_ggml(&[0u8; 18]).unwrap_err().to_string();
        assert!(
            err.contains("18 bytes are not whole ggml MXFP4 blocks of 17"),
            "{err}"
        );
    }

    #[test]
    fn shapes_of_blocks_and_scales_must_fit() {
        assert_eq!(packed_shape(&[4, 6, 2, 16], &[4, 6, 2]), Some([4, 6, 64]));
        assert_eq!(packed_shape(&[4, 6, 2, 16], &[4, 6, 3]), None);
        assert_eq!(packed_shape(&[4, 6, 2, 8], &[4, 6, 2]), None);
        assert_eq!(packed_shape(&[4, 6, 32], &[4, 6]), None);
    }
}
