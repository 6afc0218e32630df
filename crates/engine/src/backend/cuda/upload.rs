//! Raw weight upload: stored checkpoint bytes → bf16 device matrix, without an f32 (or any full)
//! host copy of the model.
//!
//! [`CudaBackend::upload_stacked`] backs `Backend::matrix_stacked_raw` (and so `matrix_raw`):
//!
//! 1. the device matrix `[Σ rows_i, cols]` is allocated once (stream-ordered);
//! 2. each part's bytes (borrowed from the safetensors mmap) are cut into chunks of at most
//!    [`STAGE_BYTES`]; each chunk is copied by the host — several threads at once, so page
//!    faults on a cold file become parallel disk reads — into one of [`STAGES`] page-locked
//!    staging buffers, then queued as an asynchronous host-to-device copy on the backend's stream;
//! 3. bf16 chunks land directly at their row offset in the matrix (stacked parts at theirs);
//!    f16/f32 chunks land in a device scratch buffer of the stage and `kernels/convert.cu`
//!    converts them into the matrix (bit-identical to `half`'s host conversions);
//! 4. each stage records an event after its copy (and conversion); a stage is refilled only after
//!    its event completed. The call returns without waiting, so the next tensor's host copy
//!    overlaps this one's transfer: with 3 stages, two chunks are in flight while the host fills
//!    the third, across tensor and shard boundaries.
//!
//! [`CudaBackend::upload_transposed`] backs `Backend::matrix_raw_transposed` (gpt-oss's bf16
//! expert stacks, stored `[inp, out]`): the same staging, whole stored rows per chunk, and
//! `transpose_bf16_rows` (`kernels/convert.cu`) writes each chunk as columns of the `[out, inp]`
//! matrix, so the host copies bytes instead of transposing them value by value.
//!
//! Host memory: the staging buffers (3 × 32 MiB pinned + 3 × 32 MiB device scratch), whatever
//! pages of the mmap are resident (a part's pages are dropped every 256 MiB copied,
//! `raw::release_mapped_pages`, and the loader drops the rest after each tensor,
//! `WeightSource::release`), nothing else. The staging buffers are allocated once per CUDA
//! context and kept for the process (allocating pinned memory costs milliseconds per call; a
//! model has hundreds of matrices). They live in a process-wide table because the backend struct
//! (`cuda/mod.rs`) is not this file's to extend.

use super::{derr, CudaBackend, CudaMatrix};
use crate::backend::raw::{RawDtype, RawPart};
use anyhow::{ensure, Result};
use cudarc::driver::{sys, CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice};
use half::bf16;
use rayon::prelude::*;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Bytes per staging buffer (a multiple of 4, so chunks never split an element).
pub const STAGE_BYTES: usize = 32 << 20;
/// Staging buffers per context: one being filled by the host, two copying.
pub const STAGES: usize = 3;
/// Bytes each host thread copies into a staging buffer at once: small enough that a drafter's
/// context tap (~2.5 MB for 300 tokens of an 8B target) is copied by several threads.
const HOST_PIECE: usize = 512 << 10;

/// One staging slot: page-locked host memory, device scratch for conversions, and the event that
/// says the last copy (and conversion) reading them has finished.
struct Stage {
    host: PinnedHostSlice<u8>,
    /// `host`'s address (fetched once; `PinnedHostSlice::as_mut_ptr` would wait on its own event).
    host_ptr: usize,
    scratch: CudaSlice<u8>,
    done: CudaEvent,
    /// Whether `done` has been recorded (an unrecorded event must not gate anything).
    pending: bool,
}

/// The staging slots of one CUDA context.
struct Staging {
    ctx: Arc<cudarc::driver::CudaContext>,
    stages: Vec<Stage>,
    next: usize,
}

// SAFETY: every field is only touched while the table's mutex is held; the raw host address is
// page-locked memory owned by `host`, valid for the process.
unsafe impl Send for Staging {}

static STAGING: Mutex<Vec<Staging>> = Mutex::new(Vec::new());

/// A piece of the matrix to fill: `bytes` of a part, landing where `dest` says.
struct Chunk<'a> {
    dtype: RawDtype,
    bytes: &'a [u8],
    dest: Dest,
    /// Mapped bytes of the part ([`RawPart::mapped`]) to drop from the process once this chunk
    /// is copied: the chunks since the last drop, every [`RELEASE_CHUNKS`] chunks and at the
    /// part's end.
    release: Option<&'a [u8]>,
}

/// Where a chunk's elements land in the matrix.
#[derive(Clone, Copy)]
enum Dest {
    /// In order from element `0` of the chunk to this element of the matrix (a part stored as the
    /// matrix is laid out).
    At(usize),
    /// Stored rows `i0 .. i0 + rows` of a bf16 part stored transposed (`[inp, out]`), written by
    /// `transpose_bf16_rows` (kernels/convert.cu) as columns `i0 ..` of the `[out, inp]` matrix.
    Transposed {
        i0: usize,
        rows: usize,
        out: usize,
        inp: usize,
        interleaved: bool,
    },
}

/// Chunks (of [`STAGE_BYTES`]) between two drops of a mapped part's pages: each drop flushes
/// every core's TLB for the process, and one per 32 MiB chunk made the whole Qwen3.6-27B load
/// markedly slower (docs/benchmarks-cuda.md, "Session 15", calls 3 and 4); one per 256 MiB keeps
/// the resident pages of a tensor that large at most.
const RELEASE_CHUNKS: usize = 8;

impl CudaBackend {
    /// `Backend::matrix_stacked_raw` on CUDA: see the module doc.
    pub(super) fn upload_stacked(&self, parts: &[RawPart<'_>]) -> Result<CudaMatrix> {
        let inp = parts.first().map(|p| p.cols).unwrap_or(0);
        for p in parts {
            p.check()?;
            ensure!(
                p.cols == inp,
                "stacked weight: a part has {} columns, the others {inp}",
                p.cols
            );
        }
        let out: usize = parts.iter().map(|p| p.rows).sum();
        let mut chunks = Vec::new();
        let mut elem = 0;
        for p in parts {
            let n = p.bytes.len().div_ceil(STAGE_BYTES);
            for (i, bytes) in p.bytes.chunks(STAGE_BYTES).enumerate() {
                let release =
                    (p.mapped && ((i + 1) % RELEASE_CHUNKS == 0 || i + 1 == n)).then(|| {
                        let from = (i - i % RELEASE_CHUNKS) * STAGE_BYTES;
                        &p.bytes[from..((i + 1) * STAGE_BYTES).min(p.bytes.len())]
                    });
                chunks.push(Chunk {
                    dtype: p.dtype,
                    bytes,
                    dest: Dest::At(elem + i * STAGE_BYTES / p.dtype.size()),
                    release,
                });
            }
            elem += p.len();
        }
        self.matrix_from_chunks(out, inp, &chunks)
    }

    /// `Backend::matrix_raw_transposed` on CUDA: a bf16 part stored `[inp, out]` is copied as
    /// stored, whole stored rows per staging buffer, and `transpose_bf16_rows` writes each
    /// chunk's rows as columns of the `[out, inp]` matrix (rows placed by
    /// `raw::transposed_row`): bit for bit the host transpose's matrix, without the host touching
    /// each value. Other dtypes (or a stored row larger than a staging buffer) take the default
    /// host transpose.
    pub(super) fn upload_transposed(
        &self,
        stored: RawPart<'_>,
        interleaved: bool,
    ) -> Result<CudaMatrix> {
        crate::backend::raw::check_transposable(&stored, interleaved)?;
        let (inp, out) = (stored.rows, stored.cols);
        let row_bytes = out * stored.dtype.size();
        if stored.dtype != RawDtype::BF16 || row_bytes > STAGE_BYTES || stored.is_empty() {
            return crate::backend::raw::with_host_transposed(stored, interleaved, |part| {
                self.upload_stacked(&[part])
            });
        }
        let rows_per_chunk = STAGE_BYTES / row_bytes;
        let n = inp.div_ceil(rows_per_chunk);
        let chunks: Vec<Chunk> = (0..n)
            .map(|c| {
                let i0 = c * rows_per_chunk;
                let rows = rows_per_chunk.min(inp - i0);
                let bytes = &stored.bytes[i0 * row_bytes..(i0 + rows) * row_bytes];
                Chunk {
                    dtype: stored.dtype,
                    bytes,
                    dest: Dest::Transposed {
                        i0,
                        rows,
                        out,
                        inp,
                        interleaved,
                    },
                    // An expert is a few chunks: drop its pages once all of them are copied.
                    release: (stored.mapped && c + 1 == n).then_some(stored.bytes),
                }
            })
            .collect();
        self.matrix_from_chunks(out, inp, &chunks)
    }

    /// A bf16 matrix `[out, inp]` filled by copying `chunks` through this context's staging
    /// slots.
    fn matrix_from_chunks(
        &self,
        out: usize,
        inp: usize,
        chunks: &[Chunk<'_>],
    ) -> Result<CudaMatrix> {
        let buf = self.alloc::<bf16>(out * inp)?;
        if !chunks.is_empty() {
            let base = self.ptr(&buf);
            self.ctx
                .bind_to_thread()
                .map_err(derr("binding the context"))?;
            let mut table = STAGING.lock().unwrap_or_else(|e| e.into_inner());
            let staging = self.staging(&mut table)?;
            for c in chunks {
                self.upload_chunk(staging, c, base)?;
            }
        }
        Ok(CudaMatrix {
            buf,
            out,
            inp,
            mxfp4: None,
        })
    }

    /// This context's staging slots, allocated on first use.
    fn staging<'t>(&self, table: &'t mut Vec<Staging>) -> Result<&'t mut Staging> {
        let pos = match table.iter().position(|s| *s.ctx == *self.ctx) {
            Some(p) => p,
            None => {
                let mut stages = Vec::with_capacity(STAGES);
                for _ in 0..STAGES {
                    // SAFETY: the host buffer is only read by copies queued after the host wrote
                    // the bytes they cover; the scratch is written by those copies before the
                    // conversion kernel reads it.
                    let mut host = unsafe { self.ctx.alloc_pinned::<u8>(STAGE_BYTES) }
                        .map_err(derr("allocating a pinned staging buffer"))?;
                    let host_ptr = host.as_mut_ptr().map_err(derr("pinned buffer"))? as usize;
                    stages.push(Stage {
                        host,
                        host_ptr,
                        scratch: self.alloc::<u8>(STAGE_BYTES)?,
                        done: self
                            .ctx
                            .new_event(None)
                            .map_err(derr("creating an event"))?,
                        pending: false,
                    });
                }
                table.push(Staging {
                    ctx: self.ctx.clone(),
                    stages,
                    next: 0,
                });
                table.len() - 1
            }
        };
        Ok(&mut table[pos])
    }

    /// Copy one chunk through the next staging slot into the matrix at `base`.
    fn upload_chunk(&self, staging: &mut Staging, c: &Chunk<'_>, base: u64) -> Result<()> {
        let slot = staging.next;
        staging.next = (slot + 1) % staging.stages.len();
        let stage = &mut staging.stages[slot];
        if stage.pending {
            // The copy (and conversion) that last used this slot must be done before the host
            // overwrites its buffer.
            stage
                .done
                .synchronize()
                .map_err(derr("waiting for a staging copy"))?;
        }
        let n = c.bytes.len();
        debug_assert!(n <= stage.host.len());
        // Host copy, several threads at once: a cold mmap turns into parallel disk reads.
        let dst_addr = stage.host_ptr;
        c.bytes
            .par_chunks(HOST_PIECE)
            .enumerate()
            .for_each(|(i, piece)| {
                // SAFETY: piece i lands at offset i·HOST_PIECE < n ≤ STAGE_BYTES of the page-locked
                // buffer; pieces are disjoint; no queued copy reads this slot (event waited above).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        piece.as_ptr(),
                        (dst_addr as *mut u8).add(i * HOST_PIECE),
                        piece.len(),
                    )
                };
            });
        if let Some(copied) = c.release {
            // SAFETY: a mapped part's bytes are a clean read-only file mapping (RawPart::mapped),
            // and this range's chunks have all been copied into staging buffers.
            unsafe { crate::backend::raw::release_mapped_pages(copied) };
        }
        let stream = self.stream.cu_stream();
        let host = stage.host_ptr as *const c_void;
        if let (Dest::At(e), RawDtype::BF16) = (c.dest, c.dtype) {
            // SAFETY: the chunk's n bytes lie inside the matrix from element e (chunks partition
            // it by element offsets); the source is page-locked memory held until `done` completes.
            unsafe { sys::cuMemcpyHtoDAsync_v2(base + (e * 2) as u64, host, n, stream) }
                .result()
                .map_err(derr("host-to-device copy of a weight chunk"))?;
        } else {
            // Through the stage's device scratch, then converted or transposed into the matrix.
            let scratch = self.ptr(&stage.scratch);
            // SAFETY: the scratch holds STAGE_BYTES ≥ n bytes; source as above.
            unsafe { sys::cuMemcpyHtoDAsync_v2(scratch, host, n, stream) }
                .result()
                .map_err(derr("host-to-device copy of a weight chunk"))?;
            self.scratch_into_matrix(scratch, c, base)?;
        }
        stage
            .done
            .record(&self.stream)
            .map_err(derr("recording a staging event"))?;
        stage.pending = true;
        Ok(())
    }

    /// The kernel that moves chunk `c`'s bytes, copied as stored to `scratch`, into the matrix at
    /// `base`: f16/f32 converted to bf16 in place order (`convert_*_to_bf16`), or a transposed
    /// part's rows written as columns (`transpose_bf16_rows`).
    fn scratch_into_matrix(&self, scratch: u64, c: &Chunk<'_>, base: u64) -> Result<()> {
        match c.dest {
            Dest::At(e) => {
                let name = match c.dtype {
                    RawDtype::F16 => "convert_f16_to_bf16",
                    RawDtype::F32 => "convert_f32_to_bf16",
                    RawDtype::BF16 => unreachable!("bf16 in place order is copied directly"),
                };
                let elems = c.bytes.len() / c.dtype.size();
                let f = self.kernels.get("convert", name)?;
                let (dst, n64) = (base + (e * 2) as u64, elems as i64);
                let mut b = self.launch_builder(&f);
                b.arg(&scratch).arg(&dst).arg(&n64);
                // Grid-stride kernel: enough blocks to fill the GPU, never more than the work.
                let grid = elems.div_ceil(256).clamp(1, 4096) as u32;
                // SAFETY: (const u32* | const u16*, bf16*, long long): scratch holds `elems`
                // source elements, dst has room for `elems` bf16 values.
                unsafe {
                    b.launch(LaunchConfig {
                        grid_dim: (grid, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    })
                }
                .map_err(derr(name))?;
            }
            Dest::Transposed {
                i0,
                rows,
                out,
                inp,
                interleaved,
            } => {
                let f = self.kernels.get("convert", "transpose_bf16_rows")?;
                let (rows32, out32, inp32, i032) = (rows as i32, out as i32, inp as i32, i0 as i32);
                let inter = interleaved as i32;
                let mut b = self.launch_builder(&f);
                b.arg(&scratch)
                    .arg(&base)
                    .arg(&rows32)
                    .arg(&out32)
                    .arg(&inp32)
                    .arg(&i032)
                    .arg(&inter);
                // SAFETY: (const bf16*, bf16*, int × 5): the scratch holds `rows · out` values,
                // the matrix `out · inp`; the kernel writes columns i0 .. i0 + rows of it only.
                unsafe {
                    b.launch(LaunchConfig {
                        grid_dim: (out.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1),
                        block_dim: (32, 8, 1),
                        shared_mem_bytes: 0,
                    })
                }
                .map_err(derr("transpose_bf16_rows"))?;
            }
        }
        Ok(())
    }

    /// `Backend::free_memory` on CUDA: the driver's free memory plus what this process's stream
    /// pool holds reserved but unused (the backend keeps freed blocks in the pool, which the
    /// driver counts as used).
    pub(super) fn free_device_memory(&self) -> Option<u64> {
        let (free, _) = self.mem_info().ok()?;
        let mut idle = 0u64;
        // SAFETY: plain driver queries on this context's default pool with valid out-pointers.
        unsafe {
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            if sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device())
                == sys::CUresult::CUDA_SUCCESS
            {
                let (mut reserved, mut used) = (0u64, 0u64);
                let r1 = sys::cuMemPoolGetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                    &mut reserved as *mut u64 as *mut c_void,
                );
                let r2 = sys::cuMemPoolGetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                    &mut used as *mut u64 as *mut c_void,
                );
                if r1 == sys::CUresult::CUDA_SUCCESS && r2 == sys::CUresult::CUDA_SUCCESS {
                    idle = reserved.saturating_sub(used);
                }
            }
        }
        Some(free as u64 + idle)
    }
}
