//! MXFP4 weights at the backend seam ([`super::Backend::matrix_mxfp4`]): the checks of a packed
//! weight, its host dequantisation (the CPU reference, and CUDA with `DRAFTLENS_MXFP4=bf16`),
//! the device layout and table the CUDA backend keeps it in (`backend/cuda/mxfp4.rs`,
//! `kernels/mxfp4.cu`), its device bytes (the memory estimate), and the switch between the two
//! CUDA modes. The format itself (nibble order, the e2m1 table, the e8m0 rule) is
//! [`crate::formats::mxfp4`]'s, used here, never restated.
//!
//! A weight `[out, inp]` (inp a multiple of 32) is `blocks`, `out · inp / 2` bytes row-major (each
//! row `inp / 32` groups of 16 bytes, two e2m1 codes a byte, the low nibble first), and `scales`,
//! `out · inp / 32` e8m0 exponents row-major, none 255.

use crate::formats::mxfp4::{dequantize_into, e8m0, BLOCK, E2M1};
use anyhow::{bail, ensure, Result};

/// The environment variable that picks how the CUDA backend holds MXFP4 weights (read once, when
/// the backend is created): `packed` (the default: bytes on the device, dequantised inside the
/// grouped GEMM) or `bf16` (dequantised at load, as before; the A/B switch of the benchmarks).
pub const MODE_ENV: &str = "DRAFTLENS_MXFP4";

/// Whether MXFP4 weights stay packed on the device, from `value` (the variable's, `None` when
/// unset). Anything but `packed` or `bf16` is an error naming the variable, so that a typo in an
/// A/B benchmark never silently measures the default.
pub fn packed_mode(value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("packed") => Ok(true),
        Some("bf16") => Ok(false),
        Some(other) => {
            bail!(
                "{MODE_ENV}={other:?} is not a mode: expected \"packed\" (the default) or \"bf16\""
            )
        }
    }
}

/// [`packed_mode`] of the process's environment.
pub fn packed_mode_from_env() -> Result<bool> {
    packed_mode(std::env::var(MODE_ENV).ok().as_deref())
}

/// Device bytes of a packed weight `[out, inp]`: its blocks, then its scales, in one buffer
/// (`backend/cuda/mxfp4.rs`): 17 bytes per 32 values.
pub fn packed_bytes(out: usize, inp: usize) -> usize {
    blocks_len(out, inp) + scales_len(out, inp)
}

/// Bytes of the blocks of `[out, inp]`, and so where its scales start in the device buffer.
pub fn blocks_len(out: usize, inp: usize) -> usize {
    out * inp / 2
}

/// e8m0 exponents of `[out, inp]`, one per [`BLOCK`] values.
pub fn scales_len(out: usize, inp: usize) -> usize {
    out * inp / BLOCK
}

/// Refuse blocks and scales that are not a weight `[out, inp]`, or that hold a scale of 255 (NaN
/// in e8m0), naming the row and group.
pub fn check(blocks: &[u8], scales: &[u8], out: usize, inp: usize) -> Result<()> {
    ensure!(
        inp.is_multiple_of(BLOCK),
        "MXFP4 weight [{out}, {inp}]: {inp} columns are not whole groups of {BLOCK}"
    );
    ensure!(
        blocks.len() == blocks_len(out, inp) && scales.len() == scales_len(out, inp),
        "MXFP4 weight [{out}, {inp}]: {} bytes of blocks and {} scales, it needs {} and {}",
        blocks.len(),
        scales.len(),
        blocks_len(out, inp),
        scales_len(out, inp)
    );
    if let Some(g) = scales.iter().position(|&s| e8m0(s).is_none()) {
        let per_row = inp / BLOCK;
        bail!(
            "MXFP4 weight [{out}, {inp}]: scale {} (not a number in e8m0) at row {}, group {}",
            scales[g],
            g / per_row,
            g % per_row
        );
    }
    Ok(())
}

/// The values of a checked weight ([`check`]) as f32, row-major: the CPU dequantiser's.
pub fn dequantize(blocks: &[u8], scales: &[u8]) -> Result<Vec<f32>> {
    let mut out = vec![0f32; blocks.len() * 2];
    if let Err(g) = dequantize_into(blocks, scales, &mut out) {
        bail!("MXFP4 weight: scale 255 (not a number in e8m0) in group {g}");
    }
    Ok(out)
}

/// Entries of [`device_table`]: the 16 e2m1 values, then `e8m0(s)` for every s.
pub const DEVICE_TABLE_LEN: usize = 16 + 256;

/// The table the device dequantises with (`kernels/mxfp4.cu`, `MX_LUT_LEN`): the CPU's
/// [`E2M1`] values by code, then [`e8m0`] of every scale byte (255, refused by [`check`] before
/// any upload, holds NaN). A device value is `table[code] · table[16 + scale]` in f32, rounded to
/// bf16: the CPU dequantiser's product, rounded as the upload of its output rounds it.
pub fn device_table() -> Vec<f32> {
    E2M1.iter()
        .copied()
        .chain((0..=255u8).map(|s| e8m0(s).unwrap_or(f32::NAN)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_packed_unless_bf16_and_a_typo_is_an_error() {
        assert!(packed_mode(None).unwrap());
        assert!(packed_mode(Some("packed")).unwrap());
        assert!(!packed_mode(Some("bf16")).unwrap());
        let err = packed_mode(Some("BF16")).unwrap_err().to_string();
        assert!(
            err.contains("DRAFTLENS_MXFP4=\"BF16\" is not a mode"),
            "{err}"
        );
    }

    /// The table is the CPU's definition, entry for entry, and gives the CPU dequantiser's
    /// values for every (code, scale) by the device's rule (product in f32).
    #[test]
    fn the_device_table_is_the_cpu_definition() {
        let t = device_table();
        assert_eq!(t.len(), DEVICE_TABLE_LEN);
        for (code, &v) in E2M1.iter().enumerate() {
            assert_eq!(t[code].to_bits(), v.to_bits(), "code {code}");
        }
        for s in 0..=254u8 {
            assert_eq!(t[16 + s as usize].to_bits(), e8m0(s).unwrap().to_bits());
            // Bytes 0..=255 in 16 groups of 16, all at scale s: every pair of codes.
            let blocks: Vec<u8> = (0..=255u8).collect();
            let scales = vec![s; 16];
            let cpu = dequantize(&blocks, &scales).unwrap();
            for (b, pair) in cpu.chunks_exact(2).enumerate() {
                let (lo, hi) = (b & 15, b >> 4);
                let scale = t[16 + s as usize];
                assert_eq!(pair[0].to_bits(), (t[lo] * scale).to_bits(), "s {s} b {b}");
                assert_eq!(pair[1].to_bits(), (t[hi] * scale).to_bits(), "s {s} b {b}");
            }
        }
        assert!(t[16 + 255].is_nan());
    }

    /// Every (code, scale) product is exact in bf16 (or ±inf, as in f32): the packed path's bf16
    /// values are the bits the upload of the f32 dequantisation gives.
    #[test]
    fn every_value_is_exact_in_bf16() {
        for s in 0..=254u8 {
            for &v in &E2M1 {
                let x = v * e8m0(s).unwrap();
                let b = half::bf16::from_f32(x).to_f32();
                assert!(
                    b.to_bits() == x.to_bits(),
                    "code value {v} at scale {s}: {x:e} is not a bf16 value"
                );
            }
        }
    }

    #[test]
    fn bad_weights_are_refused_naming_row_and_group() {
        let blocks = vec![0u8; 4 * 64 / 2];
        let mut scales = vec![127u8; 4 * 64 / 32];
        check(&blocks, &scales, 4, 64).unwrap();
        scales[5] = 255;
        let err = check(&blocks, &scales, 4, 64).unwrap_err().to_string();
        assert!(
            err.contains("scale 255 (not a number in e8m0) at row 2, group 1"),
            "{err}"
        );
        let err = check(&blocks, &scales[..7], 4, 64).unwrap_err().to_string();
        assert!(
            err.contains("128 bytes of blocks and 7 scales, it needs 128 and 8"),
            "{err}"
        );
        let err = check(&blocks, &scales, 8, 48).unwrap_err().to_string();
        assert!(
            err.contains("48 columns are not whole groups of 32"),
            "{err}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(packed_bytes(2880, 2880), 2880 * 2880 * 17 / 32);
        assert_eq!(blocks_len(6, 64), 192);
        assert_eq!(scales_len(6, 64), 12);
    }
}
