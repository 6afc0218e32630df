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

    #[test]
    fn shapes_of_blocks_and_scales_must_fit() {
        assert_eq!(packed_shape(&[4, 6, 2, 16], &[4, 6, 2]), Some([4, 6, 64]));
        assert_eq!(packed_shape(&[4, 6, 2, 16], &[4, 6, 3]), None);
        assert_eq!(packed_shape(&[4, 6, 2, 8], &[4, 6, 2]), None);
        assert_eq!(packed_shape(&[4, 6, 32], &[4, 6]), None);
    }
}
