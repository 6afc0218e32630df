//! Batch-invariant GEMMs for few rows (decode steps): `kernels/decode_gemm.cu`.
//!
//! Length (~930 lines, of which ~60 are its unit tests): the launch rules of the batch-invariant
//! decode GEMMs and their fixed K split are one contract and are kept together.
//!
//! cuBLAS chooses its algorithm (tile shape, split-K) by the GEMM's shape, so the bits of a row
//! of `x · Wᵀ` depend on how many rows share the call, and a prompt's greedy continuation would
//! depend on its batch-mates. For at most [`MAX_DECODE_ROWS`] rows the backend instead runs its
//! own tensor-core kernel whose order of summation for every output element is fixed by the
//! weight's shape alone ([`k_splits`]): batched greedy decoding is then bit-identical to decoding
//! each prompt alone (`crates/engine/tests/cuda_decode.rs`). The design is in docs/cuda.md
//! ("Batch-invariant decode"), its measured bandwidth in docs/benchmarks-cuda.md.
//!
//! The attention of a decode step is batched too ([`CudaBackend::attention_decode_batched`]):
//! one launch for all sequences, each over its own KV cache, which grows in place.

use super::gemm::GemmOperands;
use super::{derr, CudaBackend, CudaMatrix, CudaTensor};
use crate::backend::compose::attention_decode_per_row_ext;
use crate::backend::{AttnExtras, AttnShape, KvSlot, QkNorm, Rope, RopeFreqs, RopeStyle};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;
use std::collections::HashMap;
use std::sync::Mutex;

/// Most rows whose GEMMs go through the batch-invariant kernel: its n8 row tiles cover at most
/// 64 rows (8 tiles of 8) in one block, and up to 64 rows a decode step is still bound by reading
/// the weights.
pub const MAX_DECODE_ROWS: usize = 64;

/// Features per block at 1..=16 rows (4 warps × one 16-feature tile); 128 above (two tiles per
/// warp, so each row of x read from L2 serves twice as many weights).
const FEATURES_PER_WARP_TILE: usize = 16;
const WARPS: usize = 4;

/// What the epilogue does with the fp32 sum (the kernel's `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Epilogue {
    /// `y = bf16(sum)`.
    Bf16 = 0,
    /// `y = bf16(y + bf16(sum))`: the residual add of `matmul_acc`, bit-identical to `matmul`
    /// followed by `add_inplace` (cuBLASLt's beta = 1 epilogue, on the pinned route, rounds
    /// `y + sum` once instead).
    AddBf16 = 1,
    /// `y = sum` in fp32 (LM-head logits).
    F32 = 2,
}

/// The register kernel's tiling of `rows` rows (≥ 1): (row tiles of 8, 16-feature tiles per
/// warp). Two feature tiles per warp above 16 rows halve the L2 reads of x per weight byte. The
/// tiling changes no element's order of summation (`kernels/decode_gemm.cu`). The decode GEMM and
/// the mixture of experts' grouped GEMM (`moe.rs`) launch by it.
pub(super) fn row_tiling(rows: usize) -> (usize, usize) {
    (rows.div_ceil(8), if rows > 16 { 2 } else { 1 })
}

/// Output features a block of the register kernel covers with `mt` feature tiles per warp.
pub(super) fn features_per_block(mt: usize) -> usize {
    WARPS * mt * FEATURES_PER_WARP_TILE
}

/// Into how many K slices a `[n, k]` weight's reduction is cut: a function of the shape alone,
/// never of the row count, because it fixes the order of summation. Enough slices for about 256
/// blocks at 128 features per block (two blocks per multiprocessor of an H100/H200 at the largest
/// row counts), a power of two, at most 16, and each slice at least 8 chunks of 32 values.
///
/// Qwen3-8B: qkv 6144×4096 and o_proj/down 4096×4096/12288 → 8, gate|up 24576×4096 → 2,
/// LM head 151936×4096 → 1.
pub fn k_splits(n: usize, k: usize) -> usize {
    let feature_blocks = n.div_ceil(128).max(1);
    let max_by_k = (k.div_ceil(32) / 8).max(1);
    let mut s = 1;
    while s < 16 && feature_blocks * s < 256 && s * 2 <= max_by_k {
        s *= 2;
    }
    s
}

/// Which kernel runs the decode GEMMs. The backend's own two (`kernels/decode_gemm.cu`) run the
/// same tensor-core steps on the same registers in the same order, so their outputs are
/// bit-identical (`cuda_decode` checks every row count); only the speed differs. A pinned
/// cuBLASLt algorithm sums in its own order, the same for every row count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeGemmKernel {
    /// Per weight shape, the faster of a pinned cuBLASLt algorithm proven row-invariant on this
    /// GPU (`decode_lt.rs`; only in [`super::GemmMode::LtTuned`]) and [`DecodeGemmKernel::Own`].
    #[default]
    Auto,
    /// The backend's own kernels only, the faster of the two for the row count
    /// (docs/benchmarks-cuda.md, "Session 8"): pipelined from [`PIPE_FROM_ROW_TILES`] row tiles
    /// of 8, registers below.
    Own,
    /// `decode_gemm_n*_m*`: each warp loads a few chunks of weights into registers, then
    /// computes them, and reads every row of x itself.
    Registers,
    /// `decode_gemm_pipe_n*_m*`: the block copies weights and x into shared memory with
    /// `cp.async`, several chunks ahead of the one being computed.
    Pipelined,
    /// The pinned cuBLASLt algorithm wherever one was proven row-invariant, even when the own
    /// kernel timed faster (tests of that path, with no remembered choices); the own kernels
    /// elsewhere, and for shapes whose remembered choice is the own kernel (nothing is proven).
    PinnedLt,
}

/// Row tiles (of 8 rows) from which [`DecodeGemmKernel::Auto`] takes the pipelined kernel: faster
/// than the register kernel at 64 rows (8 tiles) on all five Qwen3-8B shapes, slower at 1, 8 and
/// 32 rows (docs/benchmarks-cuda.md, "Session 8"); 57–63 rows share its 8-tile instance.
pub const PIPE_FROM_ROW_TILES: usize = 8;

impl DecodeGemmKernel {
    /// Whether this choice runs the pipelined kernel for `rows` rows.
    pub fn pipelined_for(self, rows: usize) -> bool {
        match self {
            DecodeGemmKernel::Auto | DecodeGemmKernel::Own | DecodeGemmKernel::PinnedLt => {
                rows.div_ceil(8) >= PIPE_FROM_ROW_TILES
            }
            DecodeGemmKernel::Registers => false,
            DecodeGemmKernel::Pipelined => true,
        }
    }
}

/// Pipeline depth of `decode_gemm_pipe_*` (its `STAGES`): 8 chunks with one 16-feature tile
/// per warp, 4 with two. Must match the DG_PIPE_ENTRY instances.
fn pipe_stages(mt: usize) -> usize {
    if mt == 1 {
        8
    } else {
        4
    }
}

/// Dynamic shared memory of `decode_gemm_pipe_*`: per stage the block's weight tile (64·mt
/// features × 32 values) and x (8·nt rows × 32 values), bf16 (`DgStage` in the kernel).
fn pipe_shared_bytes(nt: usize, mt: usize) -> usize {
    pipe_stages(mt) * (features_per_block(mt) * 64 + nt * 8 * 64)
}

/// Scratch of the split-K launches: fp32 partials and one arrival counter per feature block
/// (zeroed once; the last block of each feature block resets its counter).
#[derive(Default)]
pub(crate) struct DecodeScratch {
    partials: Option<CudaSlice<f32>>,
    counters: Option<CudaSlice<u32>>,
    /// The decode attention's arrival counters (one per sequence and KV head of a launch).
    attn_counters: Option<CudaSlice<u32>>,
    /// The kernel lab's K split of every decode GEMM (`set_decode_splits_override`).
    #[cfg(feature = "kernel-lab")]
    splits_override: Option<usize>,
    /// Benchmarks and tests ([`CudaBackend::set_decode_gemm_kernel`]).
    kernel: DecodeGemmKernel,
    /// The kernel lab's blocks per (sequence, KV head) of every decode-attention launch
    /// (`set_decode_attention_blocks`).
    #[cfg(feature = "kernel-lab")]
    attn_blocks_override: Option<usize>,
    /// Decode-attention blocks resident per multiprocessor, by (entry function, group size).
    attn_resident: HashMap<(&'static str, usize), usize>,
}

pub(crate) type DecodeState = Mutex<DecodeScratch>;

impl CudaBackend {
    /// `y = x · Wᵀ` (see [`Epilogue`]) for `rows ≤ MAX_DECODE_ROWS` rows, batch-invariantly:
    /// through the weight shape's pinned cuBLASLt algorithm when one was proven row-invariant on
    /// this GPU and timed faster than the backend's own kernel (`decode_lt.rs`, only with
    /// [`DecodeGemmKernel::Auto`]), else through the own kernel. `x` is `[rows, inp]`
    /// contiguous, `w` `[out, inp]`, `y` `[rows, out]` contiguous. Raw pointers so the LM head
    /// can write fp32 logits.
    pub(crate) fn decode_gemm_raw(&self, g: GemmOperands, epilogue: Epilogue) -> Result<()> {
        let kernel = self.decode.lock().unwrap_or_else(|e| e.into_inner()).kernel;
        let lt = matches!(kernel, DecodeGemmKernel::Auto | DecodeGemmKernel::PinnedLt);
        if lt
            && g.rows > 0
            && self.decode_gemm_lt(g, epilogue, kernel == DecodeGemmKernel::PinnedLt)?
        {
            return Ok(());
        }
        self.decode_gemm_own(g, epilogue)
    }

    /// [`CudaBackend::decode_gemm_raw`] on the backend's own kernel (`kernels/decode_gemm.cu`),
    /// whose order of summation is fixed by the weight's shape ([`k_splits`]).
    pub(crate) fn decode_gemm_own(&self, g: GemmOperands, epilogue: Epilogue) -> Result<()> {
        let GemmOperands {
            x,
            rows,
            w,
            out,
            inp,
            y,
        } = g;
        ensure!(
            rows <= MAX_DECODE_ROWS,
            "decode GEMM: {rows} rows (at most {MAX_DECODE_ROWS})"
        );
        if rows == 0 || out == 0 {
            return Ok(());
        }
        ensure!(
            out < i32::MAX as usize && inp < i32::MAX as usize / 2,
            "decode GEMM: weight [{out}, {inp}] too large"
        );
        let (nt, mt) = row_tiling(rows);
        let feature_blocks = out.div_ceil(features_per_block(mt));
        let mut scratch = self.decode.lock().unwrap_or_else(|e| e.into_inner());
        let pipelined = scratch.kernel.pipelined_for(rows);
        let (func, shared) = if pipelined {
            (pipe_kernel_name(nt, mt), pipe_shared_bytes(nt, mt))
        } else {
            (decode_kernel_name(nt, mt), 0)
        };
        // 4 stages of 12 KiB at 64 rows plus the static counter flag pass the 48 KiB that needs
        // no opt-in.
        let f = self.kernels.get_with_smem("decode", func, shared)?;
        let splits = k_splits(out, inp);
        #[cfg(feature = "kernel-lab")]
        let splits = scratch.splits_override.unwrap_or(splits);
        let splits = splits.clamp(1, 64);
        let (ws, cnt) = if splits > 1 {
            // One float4 per (warp, feature tile, row tile, lane) and split.
            let need = feature_blocks * splits * WARPS * mt * nt * 32 * 4;
            if scratch
                .partials
                .as_ref()
                .map(|p| p.len() < need)
                .unwrap_or(true)
            {
                self.not_recording("growing the decode GEMM's scratch")?;
                scratch.partials = Some(self.alloc::<f32>(need)?);
            }
            let cnt = self.zeroed_counters(
                &mut scratch.counters,
                feature_blocks,
                "decode GEMM counters",
            )?;
            (
                self.ptr(scratch.partials.as_ref().expect("allocated above")),
                cnt,
            )
        } else {
            (0u64, 0u64)
        };
        let (r32, n32, k32, ld64, mode) = (
            rows as i32,
            out as i32,
            inp as i32,
            out as i64,
            epilogue as i32,
        );
        let mut b = self.launch_builder(&f);
        b.arg(&x)
            .arg(&w)
            .arg(&y)
            .arg(&r32)
            .arg(&n32)
            .arg(&k32)
            .arg(&ld64)
            .arg(&mode)
            .arg(&ws)
            .arg(&cnt);
        // SAFETY: signature (const bf16*, const bf16*, void*, int, int, int, ll, int, float*, u32*)
        // of DG_ENTRY in kernels/decode_gemm.cu; x holds rows × inp, w out × inp values, y rows
        // rows of stride out (bf16 or fp32 as the epilogue says); the partials hold
        // feature_blocks × splits tiles and the counters ≥ feature_blocks zeroed words.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (feature_blocks as u32, splits as u32, 1),
                block_dim: ((WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: shared as u32,
            })
        }
        .map_err(derr(func))?;
        Ok(())
    }
}

/// The kernel lab's knobs of the decode path (`kernel-lab` feature): benchmarks and the tests that
/// force a scheduling the device would not pick.
#[cfg(feature = "kernel-lab")]
impl CudaBackend {
    /// For benchmarks of the K split only: every decode GEMM uses `splits` K slices instead of
    /// [`k_splits`] (None restores it). The split fixes the order of summation, so results are
    /// still batch-invariant under one setting but differ between settings.
    pub fn set_decode_splits_override(&self, splits: Option<usize>) {
        self.decode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .splits_override = splits;
    }

    /// Blocks per (sequence, KV head) of every decode-attention launch from now on (None: as many
    /// as fill one wave, [`CudaBackend::decode_attention_blocks`]); returns the previous setting.
    /// Tests and A/B benchmarks only: which block walks a key chunk changes no arithmetic, so
    /// every setting gives the same bits.
    pub fn set_decode_attention_blocks(&self, blocks: Option<usize>) -> Option<usize> {
        let mut st = self.decode.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut st.attn_blocks_override, blocks.map(|b| b.max(1)))
    }
}

impl CudaBackend {
    /// Which decode GEMM kernel runs from now on (A/B benchmarks and the bit-identity test; the
    /// two give the same bits).
    pub fn set_decode_gemm_kernel(&self, kernel: DecodeGemmKernel) {
        self.decode.lock().unwrap_or_else(|e| e.into_inner()).kernel = kernel;
    }

    /// (Blocks per (sequence, KV head), wave) of a decode-attention launch of `rows` sequences.
    /// The wave is how many of the kernel's blocks are resident at once (the driver's occupancy
    /// times the multiprocessors); the blocks per (sequence, KV head) are as many as keep the
    /// launch within one wave, at least one (a one-sequence step gets a block per key chunk, a
    /// 64-sequence step of Qwen3-8B two). More would run one-tile blocks in several waves, each
    /// paying its loads and merge; fewer would leave multiprocessors idle.
    fn decode_attention_blocks(&self, shape: AttnShape, rows: usize) -> Result<(usize, usize)> {
        let func = decode_attention_func(shape.head_dim, false);
        let group = shape.heads / shape.kv_heads;
        let mut st = self.decode.lock().unwrap_or_else(|e| e.into_inner());
        let resident = match st.attn_resident.get(&(func, group)) {
            Some(&n) => n,
            None => {
                let f = self.kernels.get("decode_attention", func)?;
                let n = f
                    .occupancy_max_active_blocks_per_multiprocessor((group * 32) as u32, 0, None)
                    .map_err(derr(func))?
                    .max(1) as usize;
                st.attn_resident.insert((func, group), n);
                n
            }
        };
        let wave = self.info.multiprocessors.max(1) as usize * resident;
        let blocks = (wave / (rows * shape.kv_heads).max(1)).max(1);
        #[cfg(feature = "kernel-lab")]
        let blocks = st.attn_blocks_override.unwrap_or(blocks);
        Ok((blocks, wave))
    }

    /// `x · Wᵀ` through cuBLAS whatever the row count: the reference the decode kernel is
    /// tested and benchmarked against (not batch-invariant).
    pub fn matmul_cublas(&self, x: &CudaTensor, w: &CudaMatrix) -> Result<CudaTensor> {
        ensure!(
            x.cols == w.inp,
            "matmul: input has {} columns, weight expects {}",
            x.cols,
            w.inp
        );
        let y = self.new_tensor(x.rows, w.out)?;
        let g = self.operands(x, w, self.ptr(&y.buf));
        self.gemm_raw(g, cudarc::cublas::sys::cudaDataType::CUDA_R_16BF, 0.0)?;
        Ok(y)
    }
}

impl CudaBackend {
    /// Makes room for `extra` more rows in `t`'s buffer (capacity doubles, at least 64 rows),
    /// keeping its values: KV caches grow in place instead of being copied at every step.
    pub(crate) fn reserve_rows(&self, t: &mut CudaTensor, extra: usize) -> Result<()> {
        let need = (t.rows + extra) * t.cols;
        if t.buf.len() >= need.max(1) {
            return Ok(());
        }
        // A recorded step's caches were reserved before it: growing one inside the graph would
        // leave the cache in graph-owned memory.
        self.not_recording("growing a KV cache")?;
        let cap_rows = (t.rows + extra).max(2 * t.rows).max(64);
        let mut buf = self.alloc::<bf16>(cap_rows * t.cols)?;
        let n = t.rows * t.cols;
        if n > 0 {
            self.stream
                .memcpy_dtod(&t.buf.slice(0..n), &mut buf.slice_mut(0..n))
                .map_err(derr("device copy"))?;
        }
        t.buf = buf;
        Ok(())
    }

    /// [`Backend::append_rows`] in place (amortised by [`CudaBackend::reserve_rows`]).
    /// Column counts checked by [`crate::backend::Backend::append_rows`].
    pub(crate) fn append_rows_in_place(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        let n = y.rows * y.cols;
        if n == 0 {
            return Ok(());
        }
        self.reserve_rows(x, y.rows)?;
        let off = x.rows * x.cols;
        self.stream
            .memcpy_dtod(&y.buf.slice(0..n), &mut x.buf.slice_mut(off..off + n))
            .map_err(derr("device copy"))?;
        x.rows += y.rows;
        Ok(())
    }

    /// Whether [`CudaBackend::attention_decode_rows`] covers `shape`: head dims 64, 128 and 256
    /// with at most 8 query heads per KV head (one warp per query head: 256 threads, the
    /// kernel's launch bound, and the 8 q vectors its shared memory holds).
    pub(crate) fn decode_attention_fits(shape: AttnShape) -> bool {
        matches!(shape.head_dim, 64 | 128 | 256)
            && shape.kv_heads > 0
            && shape.heads.is_multiple_of(shape.kv_heads)
            && shape.heads / shape.kv_heads <= 8
    }

    /// The device address of at least `n` zeroed arrival counters in `slot` (allocated once and
    /// grown on demand; the last block of each launch that uses one leaves it zero again).
    fn zeroed_counters(
        &self,
        slot: &mut Option<CudaSlice<u32>>,
        n: usize,
        what: &str,
    ) -> Result<u64> {
        if slot.as_ref().map(|c| c.len() < n).unwrap_or(true) {
            self.not_recording(what)?;
            *slot = Some(
                self.stream
                    .alloc_zeros::<u32>(n.next_power_of_two().max(1024))
                    .map_err(|e| anyhow::anyhow!("cuda: allocating {what}: {e}"))?,
            );
        }
        Ok(self.ptr(slot.as_ref().expect("allocated above")))
    }

    /// The decode attention's arrival counters, at least `n` zeroed words.
    pub(super) fn decode_attention_counters(&self, n: usize) -> Result<u64> {
        let mut scratch = self.decode.lock().unwrap_or_else(|e| e.into_inner());
        self.zeroed_counters(&mut scratch.attn_counters, n, "decode attention counters")
    }

    /// [`Backend::attention_decode`] in one launch (`kernels/decode_attention.cu`): blocks per
    /// (key chunk, sequence, KV head), so a row's result does not depend on the others;
    /// the chunks of sequences longer than one ([`decode_attn_chunk_len`]) are merged by the last
    /// of their blocks to finish. Shapes [`CudaBackend::decode_attention_fits`] does not cover go one sequence at a
    /// time.
    pub(crate) fn attention_decode_batched(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, CudaTensor>],
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        if !Self::decode_attention_fits(shape) {
            return attention_decode_per_row_ext(self, q, k, v, shape, caches, extras);
        }
        let rows = self.decode_rows(q, k, v, shape)?;
        self.attention_decode_rows(rows, shape, caches, None, extras)
    }

    /// [`Backend::attention_verify`] in one launch: the T rows' k/v are appended to the one
    /// sequence's caches first, then row t runs as the decode step at length `len + t` would
    /// (the same chunks, a function of that length, and the same arithmetic), reading the keys
    /// before it from the cache and its own from its row; the kernel is told not to store them
    /// again. Shapes the kernel does not cover take the default (row after row).
    pub(crate) fn attention_verify_rows(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        mut slot: KvSlot<'_, CudaTensor>,
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        if !Self::decode_attention_fits(shape) {
            return crate::backend::compose::attention_verify_per_row(
                self, q, k, v, shape, slot, extras,
            );
        }
        let rows = self.decode_rows(q, k, v, shape)?;
        let kvd = shape.kv_heads * shape.head_dim;
        let (kc, vc) = self.kv_caches(&mut slot, kvd, 0)?;
        let len = kc.rows;
        self.append_rows_in_place(kc, k)?;
        self.append_rows_in_place(vc, v)?;
        let (kp, vp) = (self.ptr(&kc.buf), self.ptr(&vc.buf));
        let table: Vec<DaRow> = (0..q.rows)
            .map(|t| DaRow {
                k: kp,
                v: vp,
                len: len + t,
                pos: 0,
            })
            .collect();
        self.decode_attention_launch(rows, shape, &table, None, extras, true)
    }

    /// A fused QKV output `[R, (H + 2·Hkv)·hd]` (q | k | v columns) as the decode attention's
    /// rows: each part read at its column offset, rows the whole width apart.
    fn fused_rows(&self, qkv: &CudaTensor, shape: AttnShape) -> DecodeRows {
        let (qd, kvd) = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        let base = self.ptr(&qkv.buf);
        DecodeRows {
            rows: qkv.rows,
            q: base,
            k: base + (qd * 2) as u64,
            v: base + ((qd + kvd) * 2) as u64,
            ldq: qkv.cols,
            ldkv: qkv.cols,
        }
    }

    /// Separate q, k and v tensors as the decode attention's rows, checked against `shape`.
    fn decode_rows(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
    ) -> Result<DecodeRows> {
        shape.check((q.rows, q.cols), (k.rows, k.cols), (v.rows, v.cols))?;
        ensure!(
            k.rows == q.rows && v.rows == q.rows,
            "attention_decode: {} query rows, {} k rows, {} v rows",
            q.rows,
            k.rows,
            v.rows
        );
        Ok(DecodeRows {
            rows: q.rows,
            q: self.ptr(&q.buf),
            k: self.ptr(&k.buf),
            v: self.ptr(&v.buf),
            ldq: q.cols,
            ldkv: k.cols,
        })
    }

    /// [`Backend::attention_decode_qkv`] in one launch: the decode attention reads q, k and v
    /// straight from the fused QKV output's columns and applies the per-head q/k norm and RoPE
    /// itself (`DaNorm` in kernels/decode_attention.cu), with the arithmetic of
    /// [`CudaBackend::qk_norm_rope_packed`], so the result and the caches are bit-identical to the
    /// unfused composition. Steps of more than one wave of attention blocks, and shapes the
    /// vectorised norm does not cover, take the two-launch route (norm + RoPE in place, then the
    /// attention).
    pub(crate) fn attention_decode_packed(
        &self,
        mut qkv: CudaTensor,
        shape: AttnShape,
        norm: QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
        caches: &mut [KvSlot<'_, CudaTensor>],
    ) -> Result<CudaTensor> {
        // The norm costs each attention block two dependent loads (overlapping its first tile's
        // copies); one wave of blocks pays that once, several waves pay it per wave, where the
        // separate launch pays it once. The in-kernel route everywhere made a Qwen3-8B step
        // faster at batch 1 and slower at 64 sequences, when that step's attention ran ~6 waves of
        // one-chunk blocks (docs/benchmarks-cuda.md, "Session 12"); it now runs one wave
        // (`decode_attention_blocks`) wherever the sequences times KV heads fit in one. Both routes give the same bits, so the choice does not touch batch invariance.
        let longest = caches
            .iter()
            .map(|c| c.k.as_ref().map(|t| t.rows).unwrap_or(0))
            .max()
            .unwrap_or(0);
        let launch_rows = qkv.rows.min(DA_MAX_ROWS);
        let (per_sequence, wave) = self.decode_attention_blocks(shape, launch_rows)?;
        let blocks = launch_rows * shape.kv_heads * per_sequence.min(decode_attn_chunks(longest));
        let one_wave = blocks <= wave;
        let in_kernel =
            one_wave && Self::qk_norm_in_kernel_fits(&qkv, shape, &norm, positions, rope);
        let norm_args = if in_kernel {
            Some(DecodeNorm {
                args: DecodeNormArgs {
                    wq: self.ptr(&norm.q.buf),
                    wk: self.ptr(&norm.k.buf),
                    inv_freq: self.rope_inv_freq(rope)?,
                    eps: norm.eps,
                    rotary_dim: rope.rotary_dim as i32,
                    interleaved: matches!(rope.style, RopeStyle::Interleaved) as i32,
                },
                positions,
            })
        } else {
            // Checks every argument and reports what does not fit.
            self.qk_norm_rope_packed(&mut qkv, shape, norm, positions, rope)?;
            None
        };
        let rows = self.fused_rows(&qkv, shape);
        // `qkv` lives until the launch is queued; the stream orders its reuse after the kernel.
        self.attention_decode_rows(rows, shape, caches, norm_args, AttnExtras::NONE)
    }

    /// [`Backend::attention_decode_qkv_ext`] in two launches: q and k rotated in place in the
    /// fused QKV output (one `rope_bf16` over their heads, `v`'s columns untouched), then the
    /// decode attention reading q, k and v from its columns. Bit-identical to the split
    /// composition: the same rotation of each element and the same values read. Shapes the
    /// decode attention does not cover take that composition.
    #[allow(clippy::too_many_arguments)] // the trait method's arguments
    pub(crate) fn attention_decode_packed_ext(
        &self,
        mut qkv: CudaTensor,
        shape: AttnShape,
        positions: &[u32],
        freqs: &RopeFreqs,
        caches: &mut [KvSlot<'_, CudaTensor>],
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        if !Self::decode_attention_fits(shape) {
            return crate::backend::compose::attention_decode_qkv_ext_unfused(
                self, qkv, shape, positions, freqs, caches, extras,
            );
        }
        let hd = shape.head_dim;
        let (qd, kvd) = (shape.heads * hd, shape.kv_heads * hd);
        ensure!(
            qkv.cols == qd + 2 * kvd,
            "attention_decode: fused QKV rows of {} columns, expected q {qd} | k {kvd} | v {kvd}",
            qkv.cols
        );
        ensure!(
            freqs.head_dim == hd,
            "attention_decode: rotation of heads of {}, attention heads of {hd}",
            freqs.head_dim
        );
        freqs.check(qd + kvd, qkv.rows, positions.len())?;
        extras.check(shape, None)?;
        self.rope_heads_with_freqs(&mut qkv, shape.heads + shape.kv_heads, positions, freqs)?;
        let rows = self.fused_rows(&qkv, shape);
        // `qkv` lives until the launch is queued; the stream orders its reuse after the kernel.
        self.attention_decode_rows(rows, shape, caches, None, extras)
    }

    /// The decode attention over `src`'s rows, row r appended to `caches[r]` and attending over
    /// it (see [`DecodeRows`]); `shape` must be covered ([`CudaBackend::decode_attention_fits`]).
    fn attention_decode_rows(
        &self,
        src: DecodeRows,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, CudaTensor>],
        norm: Option<DecodeNorm<'_>>,
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        let kvd = shape.kv_heads * shape.head_dim;
        let rows = src.rows;
        ensure!(
            rows == caches.len(),
            "attention_decode: {rows} query rows for {} caches",
            caches.len()
        );
        if let Some(n) = &norm {
            ensure!(
                n.positions.len() == rows,
                "attention_decode: {} positions for {rows} rows",
                n.positions.len()
            );
            ensure!(
                n.positions.iter().all(|&p| p <= i32::MAX as u32),
                "attention_decode: position beyond 2^31"
            );
        }
        let mut table = Vec::with_capacity(rows);
        for (r, slot) in caches.iter_mut().enumerate() {
            let (kc, vc) = self.kv_caches(slot, kvd, r)?;
            self.reserve_rows(kc, 1)?;
            self.reserve_rows(vc, 1)?;
            table.push(DaRow {
                k: self.ptr(&kc.buf),
                v: self.ptr(&vc.buf),
                len: kc.rows,
                pos: norm.as_ref().map(|n| n.positions[r]).unwrap_or(0),
            });
        }
        let out =
            self.decode_attention_launch(src, shape, &table, norm.map(|n| n.args), extras, false)?;
        for slot in caches.iter_mut() {
            for t in [slot.k.as_mut(), slot.v.as_mut()].into_iter().flatten() {
                t.rows += 1;
            }
        }
        Ok(out)
    }

    /// A sequence's K and V caches (created empty `[0, kvd]` if absent), checked.
    fn kv_caches<'s>(
        &self,
        slot: &'s mut KvSlot<'_, CudaTensor>,
        kvd: usize,
        r: usize,
    ) -> Result<(&'s mut CudaTensor, &'s mut CudaTensor)> {
        for c in [&mut *slot.k, &mut *slot.v] {
            if c.is_none() {
                *c = Some(self.new_tensor(0, kvd)?);
            }
        }
        let (kc, vc) = match (slot.k.as_mut(), slot.v.as_mut()) {
            (Some(kc), Some(vc)) => (kc, vc),
            _ => unreachable!("both caches were just created"),
        };
        ensure!(
            kc.cols == kvd && vc.cols == kvd && kc.rows == vc.rows,
            "attention_decode: cache {r} is k [{}, {}], v [{}, {}], expected [len, {kvd}] each",
            kc.rows,
            kc.cols,
            vc.rows,
            vc.cols
        );
        ensure!(
            kc.rows < (i32::MAX as usize) / 2,
            "attention_decode: cache {r} too long"
        );
        Ok((kc, vc))
    }

    /// Queue the decode attention of `src`'s rows, row r over `table[r]` (one launch per
    /// [`DA_MAX_ROWS`] rows: the table travels as a kernel parameter). Each cache must have room
    /// for the row's new k/v at position `len`, which the kernel stores there unless `appended`
    /// says it already holds them (a verify pass: [`CudaBackend::attention_verify_rows`]).
    fn decode_attention_launch(
        &self,
        src: DecodeRows,
        shape: AttnShape,
        table: &[DaRow],
        norm: Option<DecodeNormArgs>,
        extras: AttnExtras<'_>,
        appended: bool,
    ) -> Result<CudaTensor> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        let group = heads / kv_heads;
        let rows = src.rows;
        ensure!(
            rows == table.len(),
            "attention_decode: {rows} query rows for {} caches",
            table.len()
        );
        let out = self.new_tensor(rows, heads * hd)?;
        if rows == 0 {
            return Ok(out);
        }
        let norm_args = norm.unwrap_or_default();
        let extra_args = DecodeExtrasArgs {
            sinks: match extras.sinks {
                Some(s) => self.f32_table(s)?,
                None => 0,
            },
            window: match extras.window {
                Some(w) => i32::try_from(w).unwrap_or(i32::MAX),
                None => 0,
            },
            appended: appended as i32,
        };
        let (h32, hk32, scale_log2) = (
            heads as i32,
            kv_heads as i32,
            std::f32::consts::LOG2_E / (hd as f32).sqrt(),
        );
        let (ldq, ldkv) = (src.ldq as i64, src.ldkv as i64);
        for (part, r0) in table
            .chunks(DA_MAX_ROWS)
            .zip((0..rows).step_by(DA_MAX_ROWS))
        {
            let n = part.len();
            let mut t = DecodeKvTable {
                k: [0; DA_MAX_ROWS],
                v: [0; DA_MAX_ROWS],
                len: [0; DA_MAX_ROWS],
                pos: [0; DA_MAX_ROWS],
            };
            for (i, row) in part.iter().enumerate() {
                t.k[i] = row.k;
                t.v[i] = row.v;
                t.len[i] = row.len as i32;
                t.pos[i] = row.pos as i32;
            }
            // A recorded step reads the table from its arena, where every row's length (and
            // position) grows by one per replay, up to `max_advance` steps.
            let (tabp, max_advance) = self
                .recording_table(t.words(), t.advancing(n, norm.is_some()))?
                .unwrap_or((0, 0));
            let func = decode_attention_func(hd, tabp != 0);
            let f = self.kernels.get("decode_attention", func)?;
            // The most key chunks of any sequence in this launch, at any length it will have
            // (sizes its scratch only).
            let nchunks = part
                .iter()
                .flat_map(|row| (0..=max_advance).map(|d| decode_attn_chunks(row.len + d)))
                .max()
                .unwrap_or(1);
            let (qp, kp, vp, op) = (
                src.q + (r0 * src.ldq * 2) as u64,
                src.k + (r0 * src.ldkv * 2) as u64,
                src.v + (r0 * src.ldkv * 2) as u64,
                self.ptr(&out.buf) + (r0 * heads * hd * 2) as u64,
            );
            // Split-KV partials, freed (stream-ordered) after the launch has merged them, and
            // the arrival counters (one per sequence and KV head, zero between launches).
            let scratch = if nchunks > 1 {
                let m = n * heads * nchunks;
                Some((self.alloc::<f32>(m * hd)?, self.alloc::<f32>(m * 2)?))
            } else {
                None
            };
            let (po, pml) = scratch
                .as_ref()
                .map(|(o, ml)| (self.ptr(o), self.ptr(ml)))
                .unwrap_or((0, 0));
            let cnt = if nchunks > 1 {
                self.decode_attention_counters(n * kv_heads)?
            } else {
                0
            };
            let nc32 = nchunks as i32;
            let bps = self.decode_attention_blocks(shape, n)?.0.min(nchunks);
            let bps32 = bps as i32;
            let mut b = self.launch_builder(&f);
            b.arg(&qp)
                .arg(&kp)
                .arg(&vp)
                .arg(&ldq)
                .arg(&ldkv)
                .arg(&op)
                .arg(&t)
                .arg(&norm_args)
                .arg(&extra_args)
                .arg(&h32)
                .arg(&hk32)
                .arg(&scale_log2)
                .arg(&nc32)
                .arg(&bps32)
                .arg(&po)
                .arg(&pml)
                .arg(&cnt)
                .arg(&tabp);
            // SAFETY: signature of DA_ENTRY in kernels/decode_attention.cu (const bf16* ×3,
            // ll, ll, bf16*, DaTable, DaNorm, DaExtras by value, int, int, float, int, int,
            // float*, float2*, u32*, const DaTable*); rows r0..r0+n of q/k/v (row strides ldq/ldkv) and out
            // exist; every cache has room for row `len` (the callers reserve or append it) and
            // the table holds (k, v, len, pos) of those rows; DaNorm's pointers are null or the
            // norm weights (hd values each) and the RoPE table (rotary_dim / 2 values);
            // DaExtras' sinks are null or `heads` floats (AttnExtras::check); with nchunks > 1
            // the partials hold n × heads × nchunks × (hd + 2) floats, the counters n × kv_heads
            // zeroed words, and no sequence has more than nchunks chunks; `tabp` is null or a
            // DaTable in device memory (a recorded step's arena) that stays valid as long as the
            // graph holding the launch.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (bps as u32, kv_heads as u32, n as u32),
                    block_dim: ((group * 32) as u32, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr(func))?;
        }
        Ok(out)
    }
}

/// One row of a decode-attention launch: its K and V caches' addresses, the keys they hold
/// before the row (its new k/v go to position `len`), and its token's RoPE position (with
/// [`DecodeNorm`] only).
#[derive(Clone, Copy)]
struct DaRow {
    k: u64,
    v: u64,
    len: usize,
    pos: u32,
}

/// The q/k norm and RoPE the decode attention applies itself, with each row's position.
struct DecodeNorm<'a> {
    args: DecodeNormArgs,
    positions: &'a [u32],
}

/// Where a decode step's q, k and v rows live: device addresses of row 0 and row strides in
/// elements (separate tensors, or the columns of one fused QKV output).
#[derive(Clone, Copy)]
struct DecodeRows {
    rows: usize,
    q: u64,
    k: u64,
    v: u64,
    ldq: usize,
    ldkv: usize,
}

/// Fewest keys per block of the decode attention (split-KV), and the most chunks a sequence is
/// cut into: a sequence whose cache holds `len` keys (len + 1 with the new one) is cut into chunks
/// of [`decode_attn_chunk_len`]`(len)` keys, a function of its own length only, so the split
/// keeps decoding batch-invariant (docs/cuda.md, "Batch-invariant decode"). A block walks its
/// chunk in tiles of 32 keys (one per lane for the scores), each tile waiting on its loads, so a
/// step of few sequences needs short chunks to spread over many blocks: one sequence of 250 keys
/// as one 512-key chunk was several times slower (docs/benchmarks-cuda.md, "Session 11").
/// From 4 096 keys the chunk doubles so that a sequence never has more than 128 chunks (256 keys
/// at 32 k: 128 × 8 KV heads = 1 024 blocks), which bounds the partials' scratch. `DA_CHUNK_MIN`
/// and `DA_CHUNKS_MAX` in kernels/decode_attention.cu.
pub const DECODE_ATTN_CHUNK_MIN: usize = 32;
pub const DECODE_ATTN_MAX_CHUNKS: usize = 128;

/// Keys per chunk of a sequence whose cache holds `len` keys: the smallest
/// [`DECODE_ATTN_CHUNK_MIN`]` · 2^i` that cuts its `len + 1` keys into at most
/// [`DECODE_ATTN_MAX_CHUNKS`] chunks (`da_chunk_len` in kernels/decode_attention.cu).
pub fn decode_attn_chunk_len(len: usize) -> usize {
    let mut c = DECODE_ATTN_CHUNK_MIN;
    while len + 1 > DECODE_ATTN_MAX_CHUNKS * c {
        c *= 2;
    }
    c
}

/// Key chunks of a sequence whose cache holds `len` keys before the step:
/// ⌈(len + 1) / decode_attn_chunk_len(len)⌉ (`da_chunks` in kernels/decode_attention.cu).
pub fn decode_attn_chunks(len: usize) -> usize {
    len / decode_attn_chunk_len(len) + 1
}

/// The decode attention's entry function for head dim `hd` (64, 128 or 256:
/// [`CudaBackend::decode_attention_fits`]), reading its table from device memory (a recorded
/// step) or from its parameter.
fn decode_attention_func(hd: usize, table_in_memory: bool) -> &'static str {
    match (hd, table_in_memory) {
        (64, false) => "decode_attention_hd64",
        (128, false) => "decode_attention_hd128",
        (_, false) => "decode_attention_hd256",
        (64, true) => "decode_attention_tabp_hd64",
        (128, true) => "decode_attention_tabp_hd128",
        (_, true) => "decode_attention_tabp_hd256",
    }
}

/// Sequences per decode-attention launch: the table is a kernel parameter (DA_MAX_ROWS in
/// kernels/decode_attention.cu).
const DA_MAX_ROWS: usize = 64;

/// `DaTable` of kernels/decode_attention.cu: per sequence the K and V cache addresses, the
/// cached length and the new token's RoPE position, passed by value (1536 bytes of the 4 KiB
/// parameter space).
#[repr(C)]
#[derive(Clone, Copy)]
struct DecodeKvTable {
    k: [u64; DA_MAX_ROWS],
    v: [u64; DA_MAX_ROWS],
    len: [i32; DA_MAX_ROWS],
    pos: [i32; DA_MAX_ROWS],
}

// SAFETY: plain-old-data with the C layout of DaTable (u64[64], u64[64], int[64], int[64]).
unsafe impl super::launch::KernelValue for DecodeKvTable {}

impl DecodeKvTable {
    /// The table as the 4-byte words of its C layout.
    fn words(&self) -> &[u32] {
        // SAFETY: repr(C) without padding (512 + 512 + 256 + 256 bytes, all 4-byte aligned), every
        // bit pattern a valid u32.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Self).cast::<u32>(),
                std::mem::size_of::<Self>() / 4,
            )
        }
    }

    /// The words of the first `rows` lengths, and with `positions` of their RoPE positions:
    /// what grows by one per decode step.
    fn advancing(&self, rows: usize, positions: bool) -> impl Iterator<Item = usize> {
        const LEN: usize = 4 * DA_MAX_ROWS; // after k and v: 2 · 64 u64
        const POS: usize = LEN + DA_MAX_ROWS;
        let pos_rows = if positions { rows } else { 0 };
        (LEN..LEN + rows).chain(POS..POS + pos_rows)
    }
}

/// `DaNorm` of kernels/decode_attention.cu: the q/k norm weights, RoPE table and settings the
/// kernel applies to q and the new k (`wq == 0`: none).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DecodeNormArgs {
    wq: u64,
    wk: u64,
    inv_freq: u64,
    eps: f32,
    rotary_dim: i32,
    interleaved: i32,
}

// SAFETY: plain-old-data with the C layout of DaNorm (three pointers, float, int, int).
unsafe impl super::launch::KernelValue for DecodeNormArgs {}

/// `DaExtras` of kernels/decode_attention.cu: gpt-oss's sink logits (one f32 per query head,
/// 0: none) and sliding window (keys; 0: none), and whether the caches already hold each row's
/// new k/v (1: a verify pass appended them before the launch; the kernel does not store them).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DecodeExtrasArgs {
    sinks: u64,
    window: i32,
    appended: i32,
}

// SAFETY: plain-old-data with the C layout of DaExtras (a pointer, two ints).
unsafe impl super::launch::KernelValue for DecodeExtrasArgs {}

/// The kernel instance for `nt` row tiles of 8 and `mt` 16-feature tiles per warp.
fn decode_kernel_name(nt: usize, mt: usize) -> &'static str {
    const M1: [&str; 2] = ["decode_gemm_n1_m1", "decode_gemm_n2_m1"];
    const M2: [&str; 6] = [
        "decode_gemm_n3_m2",
        "decode_gemm_n4_m2",
        "decode_gemm_n5_m2",
        "decode_gemm_n6_m2",
        "decode_gemm_n7_m2",
        "decode_gemm_n8_m2",
    ];
    if mt == 1 && nt <= 2 {
        M1[nt - 1]
    } else {
        M2[nt.clamp(3, 8) - 3]
    }
}

/// The pipelined instance for the same (`nt`, `mt`) as [`decode_kernel_name`].
fn pipe_kernel_name(nt: usize, mt: usize) -> &'static str {
    const M1: [&str; 2] = ["decode_gemm_pipe_n1_m1", "decode_gemm_pipe_n2_m1"];
    const M2: [&str; 6] = [
        "decode_gemm_pipe_n3_m2",
        "decode_gemm_pipe_n4_m2",
        "decode_gemm_pipe_n5_m2",
        "decode_gemm_pipe_n6_m2",
        "decode_gemm_pipe_n7_m2",
        "decode_gemm_pipe_n8_m2",
    ];
    if mt == 1 && nt <= 2 {
        M1[nt - 1]
    } else {
        M2[nt.clamp(3, 8) - 3]
    }
}

/// Logits per block of the sliced top-K (`TOPK_SLICE` in kernels/topk.cu) and the most slices
/// `topk_merge` takes (`TOPK_MERGE_MAX_SLICES`): vocabularies up to 1 048 576 ids.
pub(super) const TOPK_SLICE: usize = 4096;
pub(super) const TOPK_MERGE_MAX_SLICES: usize = 256;

impl CudaBackend {
    /// Log-softmax + top-`k` of `n` rows of fp32 logits (row stride `ld`) for a decode step: one
    /// block per slice of [`TOPK_SLICE`] logits and row (`topk_partial_k*`), then one warp per row
    /// merging the slices (`topk_merge`). A single block per row waits on a load latency every 256
    /// logits; the slices put a step's few rows on many multiprocessors. The slicing depends on
    /// the vocabulary only, so each row's result is the same at any row count. `partial` names
    /// the first pass's instance for k (`topk_partial_k*`); ids to `ids`, log-probs to `lps`
    /// (`n × k` each).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn topk_sliced(
        &self,
        logits: u64,
        ld: i64,
        vocab: usize,
        k: usize,
        n: usize,
        partial: &'static str,
        ids: u64,
        lps: u64,
    ) -> Result<()> {
        let slices = vocab.div_ceil(TOPK_SLICE);
        ensure!(
            slices <= TOPK_MERGE_MAX_SLICES && n > 0,
            "topk: {slices} slices of {n} rows"
        );
        let fp = self.kernels.get("topk", partial)?;
        let pms = self.alloc::<f32>(n * slices * 2)?;
        let pv = self.alloc::<f32>(n * slices * k)?;
        let pi = self.alloc::<u32>(n * slices * k)?;
        let (pmsp, pvp, pip) = (self.ptr(&pms), self.ptr(&pv), self.ptr(&pi));
        let (v32, k32) = (vocab as i32, k as i32);
        let mut b = self.launch_builder(&fp);
        b.arg(&logits)
            .arg(&ld)
            .arg(&v32)
            .arg(&k32)
            .arg(&pmsp)
            .arg(&pvp)
            .arg(&pip);
        // SAFETY: topk_partial_k* (const float*, ll, int, int, float2*, float*, u32*): n rows of
        // `vocab` logits at stride ld; the partials hold n × slices (max, sum) pairs and
        // n × slices × k values and ids; k ≤ K of the instance (`partial` was chosen for k).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (slices as u32, n as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("topk_partial"))?;
        self.topk_merge([pmsp, pvp, pip], slices, k, n, ids, lps)
    }

    /// The second pass of a sliced top-`k` (`topk_merge`, one warp per row): `partials` are the
    /// addresses of the n × `slices` (max, sum) pairs, values and ids the first pass wrote
    /// (`topk_partial_k*` or the fused LM head's); ids to `ids`, log-probs to `lps` (n × k each).
    pub(super) fn topk_merge(
        &self,
        partials: [u64; 3],
        slices: usize,
        k: usize,
        n: usize,
        ids: u64,
        lps: u64,
    ) -> Result<()> {
        ensure!(
            slices <= TOPK_MERGE_MAX_SLICES,
            "topk_merge: {slices} slices (at most {TOPK_MERGE_MAX_SLICES})"
        );
        let fm = self.kernels.get("topk", "topk_merge")?;
        let [pms, pv, pi] = partials;
        let (s32, k32) = (slices as i32, k as i32);
        let mut b = self.launch_builder(&fm);
        b.arg(&pms)
            .arg(&pv)
            .arg(&pi)
            .arg(&s32)
            .arg(&k32)
            .arg(&ids)
            .arg(&lps);
        // SAFETY: topk_merge (const float2*, const float*, const u32*, int, int, u32*, float*):
        // the partials hold n × slices pairs and n × slices × k values and ids (slices ≤
        // TOPK_MERGE_MAX_SLICES, checked); n × k outputs each.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("topk_merge"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_splits_depend_on_the_shape_only_and_fit_qwen3_8b() {
        assert_eq!(k_splits(6144, 4096), 8);
        assert_eq!(k_splits(4096, 4096), 8);
        assert_eq!(k_splits(4096, 12288), 8);
        assert_eq!(k_splits(24576, 4096), 2);
        assert_eq!(k_splits(151_936, 4096), 1);
        // Short reductions are not cut below 8 chunks of 32.
        assert_eq!(k_splits(64, 256), 1);
        assert_eq!(k_splits(64, 512), 2);
        assert_eq!(k_splits(64, 100_000), 16);
    }

    #[test]
    fn attention_chunks_depend_on_the_length_only() {
        // len cached keys + the new one.
        assert_eq!(decode_attn_chunks(0), 1);
        assert_eq!(decode_attn_chunks(31), 1);
        assert_eq!(decode_attn_chunks(32), 2);
        assert_eq!(decode_attn_chunks(249), 8);
        // 32-key chunks up to 128 chunks (4 096 keys with the new one), then the chunk doubles.
        assert_eq!(decode_attn_chunk_len(4095), 32);
        assert_eq!(decode_attn_chunks(4095), 128);
        assert_eq!(decode_attn_chunk_len(4096), 64);
        assert_eq!(decode_attn_chunks(4096), 65);
        assert_eq!(decode_attn_chunk_len(32_767), 256);
        assert_eq!(decode_attn_chunks(32_767), 128);
        for len in (0..200_000).step_by(97) {
            let (c, n) = (decode_attn_chunk_len(len), decode_attn_chunks(len));
            // Whole tiles of the kernel (32 keys), every key in exactly one chunk, never more
            // than the most chunks.
            assert_eq!(c % 32, 0);
            assert!(n * c > len && (n - 1) * c <= len, "len {len}");
            assert!(n <= DECODE_ATTN_MAX_CHUNKS, "len {len}: {n} chunks");
        }
    }

    #[test]
    fn every_row_count_has_a_kernel() {
        for rows in 1..=MAX_DECODE_ROWS {
            let (nt, mt) = row_tiling(rows);
            let name = decode_kernel_name(nt, mt);
            assert_eq!(name, format!("decode_gemm_n{nt}_m{mt}"));
            assert_eq!(
                pipe_kernel_name(nt, mt),
                format!("decode_gemm_pipe_n{nt}_m{mt}")
            );
            // Far below the 227 KiB a block may opt in to, so that 2–4 blocks share an SM.
            assert!(pipe_shared_bytes(nt, mt) <= 48 * 1024, "{rows} rows");
        }
        assert_eq!(pipe_shared_bytes(8, 2), 4 * (8192 + 4096));
        assert_eq!(pipe_shared_bytes(1, 1), 8 * (4096 + 512));
    }
}
