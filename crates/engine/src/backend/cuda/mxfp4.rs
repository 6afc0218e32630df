//! MXFP4 weights kept packed on the device (`kernels/mxfp4.cu`; docs/cuda.md, "MXFP4 experts
//! kept packed"): gpt-oss's experts stay as their checkpoint bytes, 17 bytes per 32 values instead
//! of 64 in bf16, and the grouped GEMM of the device-routed experts dequantises them in registers.
//! That is what lets gpt-oss-120b (≈ 61 GiB so, ≈ 218 GiB in bf16) fit one 80 GB GPU.
//!
//! - Upload ([`CudaBackend::upload_mxfp4`], `Backend::matrix_mxfp4`): the blocks, then the scales,
//!   in one device buffer ([`PackedMxfp4`]); with `DRAFTLENS_MXFP4=bf16` (read once per backend,
//!   [`CudaBackend::set_mxfp4_packed`] for tests) the weight is dequantised on the host and
//!   uploaded as bf16, as before.
//! - The grouped GEMM (`moe_grouped_gemm_mxfp4_*`, launched from moe.rs's
//!   `moe_grouped_gemm`): the bf16 grouped GEMM's chunks, order and epilogue on values dequantised
//!   by the CPU's own table (`backend::mxfp4::device_table`), so its output is bit-identical to
//!   the bf16 kernel's on the dequantised weights, and as batch-invariant.
//! - Anything else that multiplies by a packed weight (`matmul`, `matmul_acc`: the host-routed
//!   experts, `DRAFTLENS_MOE_ROUTING=host` or a layer the route kernel does not take) dequantises
//!   it just in time into a scratch bf16 weight ([`CudaBackend::mxfp4_to_bf16`], the same
//!   device function), freed after the call: the same bits as the bf16 mode, at the cost of one
//!   write and read of the bf16 weight per call. Simpler than forcing device routing, and it keeps
//!   the host-routing A/B switch meaningful for packed experts.

use super::{blocks, derr, CudaBackend, CudaMatrix, CudaTensor, MAX_DECODE_ROWS};
use crate::backend::{mxfp4, Backend};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};

/// An MXFP4 weight `[out, inp]` on the device: its blocks (`out · inp / 2` bytes), then its scales
/// (`out · inp / 32`), in one buffer, as `kernels/mxfp4.cu` reads it.
pub(crate) struct PackedMxfp4 {
    bytes: CudaSlice<u8>,
}

impl CudaMatrix {
    /// Whether this weight is MXFP4 kept packed on the device.
    pub fn is_mxfp4(&self) -> bool {
        self.mxfp4.is_some()
    }
}

impl CudaBackend {
    /// MXFP4 weights uploaded from now on stay packed (`true`; the default unless
    /// `DRAFTLENS_MXFP4=bf16`) or are dequantised to bf16 at upload (tests and A/B benchmarks).
    /// Weights already uploaded keep their form; the two give the same bits.
    pub fn set_mxfp4_packed(&self, on: bool) {
        *self
            .moe
            .mxfp4_packed
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Ok(on);
    }

    /// Whether MXFP4 weights are kept packed: `DRAFTLENS_MXFP4` as read when the backend was
    /// created (an invalid value is this error, at the first MXFP4 upload), or the last
    /// [`CudaBackend::set_mxfp4_packed`].
    pub(super) fn mxfp4_packed_mode(&self) -> Result<bool> {
        self.moe
            .mxfp4_packed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map_err(|e| anyhow!(e))
    }

    /// `Backend::matrix_mxfp4_impl`: checked blocks and scales of `[out, inp]` uploaded as they
    /// are, or dequantised on the host and uploaded as bf16 in the bf16 mode.
    pub(super) fn upload_mxfp4(
        &self,
        blocks: &[u8],
        scales: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<CudaMatrix> {
        if !self.mxfp4_packed_mode()? {
            return self.matrix_impl(&mxfp4::dequantize(blocks, scales)?, out, inp);
        }
        let nb = mxfp4::blocks_len(out, inp);
        let mut bytes = self.alloc::<u8>(mxfp4::packed_bytes(out, inp))?;
        self.stream
            .memcpy_htod(blocks, &mut bytes.slice_mut(0..nb))
            .map_err(derr("host-to-device copy of MXFP4 blocks"))?;
        self.stream
            .memcpy_htod(scales, &mut bytes.slice_mut(nb..nb + scales.len()))
            .map_err(derr("host-to-device copy of MXFP4 scales"))?;
        Ok(CudaMatrix {
            buf: self.alloc(0)?,
            out,
            inp,
            mxfp4: Some(PackedMxfp4 { bytes }),
        })
    }

    /// The device address a grouped GEMM's table holds for `w`: its packed bytes, or its bf16
    /// values.
    pub(super) fn weight_ptr(&self, w: &CudaMatrix) -> u64 {
        match &w.mxfp4 {
            Some(p) => self.ptr(&p.bytes),
            None => self.ptr(&w.buf),
        }
    }

    /// The device table of [`mxfp4::device_table`] (uploaded once per backend).
    pub(super) fn mxfp4_table(&self) -> Result<u64> {
        self.f32_table(&mxfp4::device_table())
    }

    /// A packed weight's values as a bf16 weight (`mxfp4_dequant_bf16`, the device function the
    /// grouped GEMM dequantises with): the bits the bf16 mode uploads. What `matmul` and
    /// `matmul_acc` multiply by for a packed weight, and the tests' view of the device's
    /// dequantisation.
    pub fn mxfp4_to_bf16(&self, w: &CudaMatrix) -> Result<CudaMatrix> {
        let p = w
            .mxfp4
            .as_ref()
            .ok_or_else(|| anyhow!("mxfp4_to_bf16: a bf16 weight [{}, {}]", w.out, w.inp))?;
        let mut buf = self.alloc(w.out * w.inp)?;
        let n8 = w.out * w.inp / 8;
        if n8 > 0 {
            let lut = self.mxfp4_table()?;
            let f = self.kernels.get("decode", "mxfp4_dequant_bf16")?;
            let n8_64 = n8 as i64;
            let mut b = self.launch_builder(&f);
            b.arg(&p.bytes).arg(&lut).arg(&mut buf).arg(&n8_64);
            // SAFETY: (const u8*, const float*, bf16*, ll): the packed buffer holds 4·n8 bytes
            // of blocks then n8/4 scales (inp is whole groups of 32: Backend::matrix_mxfp4's
            // check), lut the table's MX_LUT_LEN floats, buf n8 · 8 values.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (blocks(n8, 256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("mxfp4_dequant_bf16"))?;
        }
        Ok(CudaMatrix {
            buf,
            out: w.out,
            inp: w.inp,
            mxfp4: None,
        })
    }

    /// `y = x · W_eᵀ` over consecutive blocks of x's rows, `rows[e]` of them for expert e
    /// (ascending, 0 allowed), in one grouped launch as the device-routed experts run: each
    /// expert's rows cut into groups of at most 64, the packed kernel when the weights are packed
    /// MXFP4, else the bf16 one. For tests and benchmarks (the packed kernel against the bf16 one
    /// on the same values, and their speed), without a router in the way.
    pub fn moe_grouped_matmul(
        &self,
        x: &CudaTensor,
        weights: &[&CudaMatrix],
        rows: &[usize],
    ) -> Result<CudaTensor> {
        let first = weights
            .first()
            .ok_or_else(|| anyhow!("grouped matmul: no experts"))?;
        let (out, inp) = (first.out, first.inp);
        ensure!(
            rows.len() == weights.len() && rows.iter().sum::<usize>() == x.rows && x.cols == inp,
            "grouped matmul: {} row counts (sum {}) for {} experts [{out}, {inp}] and x [{}, {}]",
            rows.len(),
            rows.iter().sum::<usize>(),
            weights.len(),
            x.rows,
            x.cols
        );
        for (e, w) in weights.iter().enumerate() {
            ensure!(
                (w.out, w.inp, w.is_mxfp4()) == (out, inp, first.is_mxfp4()),
                "grouped matmul: expert {e}'s weight differs from expert 0's in shape or kind"
            );
        }
        let mut y = self.new_tensor(x.rows, out)?;
        // The plan's groups (moe_plan_groups): ascending experts, at most 64 rows each.
        let mut groups: Vec<i32> = Vec::new();
        let mut row0 = 0;
        for (e, &n) in rows.iter().enumerate() {
            for start in (0..n).step_by(MAX_DECODE_ROWS) {
                let len = MAX_DECODE_ROWS.min(n - start);
                groups.extend([e as i32, (row0 + start) as i32, len as i32]);
            }
            row0 += n;
        }
        let n_groups = groups.len() / 3;
        if n_groups == 0 {
            return Ok(y);
        }
        let max_rows = groups.chunks(3).map(|g| g[2] as usize).max().unwrap_or(1);
        let ptrs: Vec<u64> = weights.iter().map(|w| self.weight_ptr(w)).collect();
        let table = self.upload(&ptrs)?;
        let (groups, count) = (self.upload(&groups)?, self.upload(&[n_groups as i32])?);
        self.moe_grouped_gemm(
            x,
            (&table, first.is_mxfp4()),
            None,
            &mut y,
            (self.ptr(&groups), self.ptr(&count), n_groups),
            max_rows,
        )?;
        Ok(y)
    }
}
