//! Device buffers of the backend: allocation, host↔device copies, random fills for benchmarks,
//! and row/column copies (`copy_rows_bf16`) behind concatenation, splitting, embedding and gathers.
//! Weight uploads from checkpoint bytes are in `upload.rs`.

use super::{blocks, derr, CudaBackend, CudaMatrix, CudaTensor};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use half::bf16;

/// Downloads of fewer values than this in one part skip the staging buffer (2 MiB of bf16).
const STAGE_MIN: usize = 1 << 20;

/// Where a block of columns sits in a row-major buffer: rows `ld` elements apart, starting at
/// column `col0`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cols {
    pub ld: usize,
    pub col0: usize,
}

impl Cols {
    /// Whole rows of `ld` columns.
    pub(super) fn rows(ld: usize) -> Cols {
        Cols { ld, col0: 0 }
    }
}

impl CudaBackend {
    pub(super) fn alloc<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller writes all `n` elements before anything reads them. A zero-length
        // request allocates one element so that every buffer has a valid device address.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| {
            anyhow!(
                "cuda: allocating {} bytes: {e}",
                n * std::mem::size_of::<T>()
            )
        })
    }

    /// One allocation cut into arrays of `lens[i]` 4-byte values each (every one starting on a
    /// 256-byte boundary): the buffer, to keep alive while kernels use the arrays (its free is
    /// stream-ordered), and each array's device address. For a step's many small scratch
    /// arrays, where an allocation and a free apiece cost the host more than the kernels take.
    pub(super) fn alloc_carved<const N: usize>(
        &self,
        lens: [usize; N],
    ) -> Result<(CudaSlice<u32>, [u64; N])> {
        const ALIGN: usize = 64; // values: 256 bytes
        let mut offsets = [0usize; N];
        let mut total = 0;
        for (offset, len) in offsets.iter_mut().zip(lens) {
            *offset = total;
            total += len.max(1).next_multiple_of(ALIGN);
        }
        let buf = self.alloc::<u32>(total)?;
        let base = self.ptr(&buf);
        Ok((buf, offsets.map(|o| base + 4 * o as u64)))
    }

    pub(super) fn new_tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc(rows * cols)?,
            rows,
            cols,
        })
    }

    pub(super) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    pub(super) fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.not_recording("a host-to-device copy")?;
        let mut buf = self.alloc::<T>(data.len())?;
        if !data.is_empty() {
            self.stream
                .memcpy_htod(data, &mut buf.slice_mut(0..data.len()))
                .map_err(derr("host-to-device copy"))?;
        }
        Ok(buf)
    }

    /// The device address of `values` uploaded once per content (compared bit for bit, so an
    /// entry is never stale): small per-layer tables the host holds, such as gpt-oss's sink
    /// logits, which every decode step would otherwise upload again. Entries live as long as the
    /// backend (a model's layers hold a few dozen).
    pub(super) fn f32_table(&self, values: &[f32]) -> Result<u64> {
        let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        let mut tables = self.f32_tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = tables.iter().find(|(b, _)| *b == bits) {
            return Ok(self.ptr(t));
        }
        let t = self.upload(values)?;
        let p = self.ptr(&t);
        tables.push((bits, t));
        Ok(p)
    }

    /// A tensor of random bf16 values (uniform, the given mean and standard deviation), generated
    /// on the device: benchmark weights and activations need no host memory or transfers.
    pub fn random_tensor(
        &self,
        rows: usize,
        cols: usize,
        std_dev: f32,
        mean: f32,
        seed: u64,
    ) -> Result<CudaTensor> {
        let mut t = self.new_tensor(rows, cols)?;
        self.fill_random(&mut t.buf, rows * cols, std_dev, mean, seed)?;
        Ok(t)
    }

    /// A random weight `[out, inp]` (uniform, zero mean, standard deviation `std_dev`).
    pub fn random_matrix(
        &self,
        out: usize,
        inp: usize,
        std_dev: f32,
        seed: u64,
    ) -> Result<CudaMatrix> {
        let mut buf = self.alloc(out * inp)?;
        self.fill_random(&mut buf, out * inp, std_dev, 0.0, seed)?;
        Ok(CudaMatrix {
            buf,
            out,
            inp,
            mxfp4: None,
        })
    }

    pub(super) fn fill_random(
        &self,
        buf: &mut CudaSlice<bf16>,
        n: usize,
        std_dev: f32,
        mean: f32,
        seed: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let f = self.kernels.get("elementwise", "fill_random_bf16")?;
        let n64 = n as i64;
        let mut b = self.launch_builder(&f);
        b.arg(buf).arg(&n64).arg(&seed).arg(&std_dev).arg(&mean);
        // SAFETY: kernel signature (bf16*, long long, u64, float, float); buf holds n elements.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks(n, 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("fill_random_bf16"))?;
        Ok(())
    }

    /// The raw bf16 values of a tensor (half the bytes of [`Backend::to_host`]).
    pub fn to_host_bf16(&self, t: &CudaTensor) -> Result<Vec<bf16>> {
        let n = t.rows * t.cols;
        let mut out = vec![bf16::ZERO; n];
        if n > 0 {
            self.stream
                .memcpy_dtoh(&t.buf.slice(0..n), &mut out)
                .map_err(derr("device-to-host copy"))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// `t`'s rows cut at `row_starts` (checked by the caller), each part its own vector: one
    /// copy into the page-locked staging buffer this backend keeps (grown as needed, at the host
    /// link's speed instead of a pageable copy's), then the parts copied out on all cores. A
    /// pageable download of the whole and a split after it cost two passes over fresh host
    /// memory on one core, per tap of a 16k-token pack of Qwen3-8B (timings:
    /// docs/benchmarks-cuda.md, "Session 13"). `None`: not worth staging (small, or one part) or
    /// no page-locked memory to be had; the caller downloads plainly.
    pub fn to_host_bf16_staged(
        &self,
        t: &CudaTensor,
        row_starts: &[usize],
    ) -> Result<Option<Vec<Vec<bf16>>>> {
        let n = t.rows * t.cols;
        if n == 0 || row_starts.len() == 2 && n < STAGE_MIN {
            return Ok(None);
        }
        let mut guard = self
            .tap_staging
            .lock()
            .map_err(|_| anyhow!("tap staging buffer poisoned"))?;
        if guard.as_ref().is_none_or(|b| b.len() < n) {
            *guard = None; // free the old one first
            match self.alloc_pinned_bf16(n) {
                Ok(b) => *guard = Some(b),
                Err(e) => {
                    // Page-locked memory is a limited resource: without it, the plain download.
                    tracing::warn!("tap download without a staging buffer: {e:#}");
                    return Ok(None);
                }
            }
        }
        let stage = guard.as_mut().expect("allocated above");
        self.copy_to_pinned(t, stage, 0)?;
        self.synchronize()?;
        let host = stage.as_slice().map_err(derr("pinned buffer"))?;
        let cols = t.cols;
        use rayon::prelude::*;
        Ok(Some(
            row_starts
                .par_windows(2)
                .map(|w| host[w[0] * cols..w[1] * cols].to_vec())
                .collect(),
        ))
    }

    /// Page-locked host memory for `n` bf16 values (fast device-to-host copies of taps).
    pub fn alloc_pinned_bf16(&self, n: usize) -> Result<cudarc::driver::PinnedHostSlice<bf16>> {
        // SAFETY: the memory is only written by device copies before it is read.
        unsafe { self.ctx.alloc_pinned::<bf16>(n.max(1)) }
            .map_err(derr("allocating pinned host memory"))
    }

    /// Queues a copy of `t` into `dst[offset..offset + rows·cols]` (page-locked, so the copy runs
    /// at the host link's speed and is asynchronous: call [`CudaBackend::synchronize`] before reading).
    pub fn copy_to_pinned(
        &self,
        t: &CudaTensor,
        dst: &mut cudarc::driver::PinnedHostSlice<bf16>,
        offset: usize,
    ) -> Result<()> {
        let n = t.rows * t.cols;
        ensure!(
            offset + n <= dst.len(),
            "pinned buffer of {} values is too small for {} at offset {offset}",
            dst.len(),
            n
        );
        if n == 0 {
            return Ok(());
        }
        let host = dst.as_mut_slice().map_err(derr("pinned buffer"))?;
        self.stream
            .memcpy_dtoh(&t.buf.slice(0..n), &mut host[offset..offset + n])
            .map_err(derr("device-to-host copy"))
    }

    /// A weight from raw bf16 values (checkpoint tensors already in bf16 skip the f32 round trip).
    pub fn matrix_bf16(&self, data: &[bf16], out: usize, inp: usize) -> Result<CudaMatrix> {
        ensure!(
            data.len() == out * inp,
            "weight data has {} values, shape [{out}, {inp}] needs {}",
            data.len(),
            out * inp
        );
        Ok(CudaMatrix {
            buf: self.upload(data)?,
            out,
            inp,
            mxfp4: None,
        })
    }

    /// A copy of a tensor on the device (hidden-state taps: the residual stream is updated in place).
    pub fn clone_tensor(&self, t: &CudaTensor) -> Result<CudaTensor> {
        let mut o = self.new_tensor(t.rows, t.cols)?;
        let n = t.rows * t.cols;
        if n > 0 {
            self.stream
                .memcpy_dtod(&t.buf.slice(0..n), &mut o.buf.slice_mut(0..n))
                .map_err(derr("device copy"))?;
        }
        Ok(o)
    }

    /// Stacks weights `[out_i, in]` into one `[Σ out_i, in]` matrix (fused QKV or gate|up
    /// projections: one large GEMM instead of several narrow ones).
    pub fn concat_matrices(&self, parts: &[&CudaMatrix]) -> Result<CudaMatrix> {
        let inp = parts.first().map(|p| p.inp).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| p.inp == inp),
            "concat_matrices: input widths differ"
        );
        let out: usize = parts.iter().map(|p| p.out).sum();
        let mut buf = self.alloc::<bf16>(out * inp)?;
        let mut off = 0;
        for p in parts {
            let n = p.out * p.inp;
            if n > 0 {
                self.stream
                    .memcpy_dtod(&p.buf.slice(0..n), &mut buf.slice_mut(off..off + n))
                    .map_err(derr("device copy"))?;
            }
            off += n;
        }
        Ok(CudaMatrix {
            buf,
            out,
            inp,
            mxfp4: None,
        })
    }

    /// Copies `cols` columns of `rows` rows of `src` (all of them in order, or the rows whose u32
    /// ids are at device address `idx`) from `src_at` into `dst_at` of `dst`.
    pub(super) fn copy_rows(
        &self,
        (dst, dst_at): (&mut CudaSlice<bf16>, Cols),
        (src, src_at): (&CudaSlice<bf16>, Cols),
        idx: Option<u64>,
        (rows, cols): (usize, usize),
    ) -> Result<()> {
        let (
            Cols {
                ld: dst_ld,
                col0: dst_col0,
            },
            Cols {
                ld: src_ld,
                col0: src_col0,
            },
        ) = (dst_at, src_at);
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        ensure!(
            rows <= i32::MAX as usize,
            "copy of {rows} rows is too large for one launch"
        );
        let f = self.kernels.get("elementwise", "copy_rows_bf16")?;
        let (dst_ld, dst_col0, src_ld, src_col0, rows64, cols32) = (
            dst_ld as i64,
            dst_col0 as i64,
            src_ld as i64,
            src_col0 as i64,
            rows as i64,
            cols as i32,
        );
        let idx_ptr: u64 = idx.unwrap_or(0);
        let mut b = self.launch_builder(&f);
        b.arg(dst)
            .arg(&dst_ld)
            .arg(&dst_col0)
            .arg(src)
            .arg(&src_ld)
            .arg(&src_col0)
            .arg(&idx_ptr)
            .arg(&rows64)
            .arg(&cols32);
        // SAFETY: signature (bf16*, ll, ll, const bf16*, ll, ll, const u32*, ll, int); shapes checked by callers.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("copy_rows_bf16"))?;
        Ok(())
    }
}
