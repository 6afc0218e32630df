//! The LM head's top-K ([`Backend::lm_head_topk`](crate::backend::Backend::lm_head_topk)): per row,
//! the k best token ids of `x · headᵀ` and their log-softmax values, k ≤ 64.
//!
//! Two paths (docs/cuda.md, "The LM head's top-K"):
//! - **unfused**: fp32 logits, at most 1 GiB of them at a time, into a scratch buffer, then
//!   `kernels/topk.cu`. Up to [`MAX_DECODE_ROWS`] rows the logits come from the batch-invariant
//!   decode GEMM and the top-K is sliced over many blocks then merged: decoding's bits depend on
//!   this, and every call of ≤ 64 rows takes it whatever the switch says. More rows: cuBLAS, then
//!   one block per row.
//! - **fused** (more than 64 rows, [`LmHeadPath::Fused`]): `kernels/lm_head_topk.cu` computes the
//!   logits tile by tile on the tensor cores and keeps, per vocabulary slice, only each row's best k
//!   and its log-sum-exp; `topk_merge` (`kernels/topk.cu`) combines the slices. The logits never
//!   reach memory: the unfused path writes and reads ~2.5 GB of them per 4 096 rows of a 152k
//!   vocabulary.
//!
//! `DRAFTLENS_LM_HEAD=fused|unfused` picks the path of more than 64 rows, read once when the
//! backend is created ([`LmHeadPath::parse`]); tests and benchmarks switch it with
//! [`CudaBackend::set_lm_head_path`]. The default is unfused: measured in `run` on an H100, the
//! fused kernel's `mma.sync` tiles (≈ 210 TFLOP/s) lose to cuBLASLt's `wgmma` GEMM (≈ 390 TFLOP/s
//! with the top-K's read of the logits; docs/cuda.md, "The LM head's top-K").

use super::decode::{self, TOPK_MERGE_MAX_SLICES, TOPK_SLICE};
use super::gemm::GemmOperands;
use super::{derr, CudaBackend, CudaMatrix, CudaTensor, MAX_DECODE_ROWS};
use crate::backend::TopK;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{sys, CudaSlice, LaunchConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The environment variable that picks the path of more than 64 rows.
pub const LM_HEAD_ENV: &str = "DRAFTLENS_LM_HEAD";

/// How `lm_head_topk` of more than [`MAX_DECODE_ROWS`] rows runs (fewer rows always take the
/// unfused, batch-invariant path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmHeadPath {
    /// `kernels/lm_head_topk.cu` + `topk_merge`: no logits in memory.
    Fused,
    /// cuBLAS fp32 logits into a scratch buffer, then the one-block-per-row top-K.
    Unfused,
}

impl LmHeadPath {
    /// Unfused: faster on Hopper (the module doc).
    pub const DEFAULT: LmHeadPath = LmHeadPath::Unfused;

    /// The path named by the value of [`LM_HEAD_ENV`] (unset or empty: [`LmHeadPath::DEFAULT`]).
    pub fn parse(value: Option<&str>) -> Result<LmHeadPath> {
        match value.map(str::trim) {
            None | Some("") => Ok(Self::DEFAULT),
            Some("fused") => Ok(LmHeadPath::Fused),
            Some("unfused") => Ok(LmHeadPath::Unfused),
            Some(other) => bail!("{LM_HEAD_ENV}={other}: expected fused or unfused"),
        }
    }
}

/// The backend's LM-head state: the chosen path (or the environment's bad value, reported by the
/// first call that needs it) and how many calls the fused kernel has served (tests check that the
/// fused path ran rather than fell back).
pub(crate) struct LmHeadState {
    path: Mutex<std::result::Result<LmHeadPath, String>>,
    fused_calls: AtomicUsize,
}

impl Default for LmHeadState {
    fn default() -> Self {
        let path = LmHeadPath::parse(std::env::var(LM_HEAD_ENV).ok().as_deref());
        LmHeadState {
            path: Mutex::new(path.map_err(|e| e.to_string())),
            fused_calls: AtomicUsize::new(0),
        }
    }
}

/// The kernel instances of one k bucket.
struct Instances {
    /// The instances' list capacity K (k ≤ K).
    cap: usize,
    /// `topk_logsoftmax_k*`: one block per row over fp32 logits.
    per_row: &'static str,
    /// `topk_partial_k*`: the sliced first pass (≤ 64 rows).
    sliced: &'static str,
    /// `lm_head_topk_partial_k*`: the fused kernel.
    fused: &'static str,
}

fn instances(k: usize) -> Result<Instances> {
    let (cap, per_row, sliced, fused) = match k {
        1..=8 => (
            8,
            "topk_logsoftmax_k8",
            "topk_partial_k8",
            "lm_head_topk_partial_k8",
        ),
        9..=16 => (
            16,
            "topk_logsoftmax_k16",
            "topk_partial_k16",
            "lm_head_topk_partial_k16",
        ),
        17..=32 => (
            32,
            "topk_logsoftmax_k32",
            "topk_partial_k32",
            "lm_head_topk_partial_k32",
        ),
        33..=64 => (
            64,
            "topk_logsoftmax_k64",
            "topk_partial_k64",
            "lm_head_topk_partial_k64",
        ),
        _ => bail!("lm_head_topk: k = {k} is above the CUDA kernel's limit of 64"),
    };
    Ok(Instances {
        cap,
        per_row,
        sliced,
        fused,
    })
}

// The fused kernel's geometry (`LH_*` in kernels/lm_head_topk.cu).
/// Rows per block (`LH_BM`).
const FUSED_ROWS: usize = 128;
/// Vocabulary ids per tile (`LH_BN`).
const FUSED_TILE: usize = 256;
/// Threads per block (`LH_THREADS`).
const FUSED_THREADS: u32 = 256;
/// Tiles per vocabulary slice, at least: 4 096 ids (the unfused sliced pass's [`TOPK_SLICE`]), 38
/// slices for Qwen3's 151 936 ids. A function of the vocabulary only, so a row's result does not
/// depend on how many rows share the call.
const FUSED_TILES_PER_SLICE: usize = TOPK_SLICE / FUSED_TILE;
/// Most bytes of slice partials per launch; more rows go in several launches.
const FUSED_PARTIAL_BYTES: usize = 256 << 20;

/// Dynamic shared memory of the fused instance with capacity `cap` (`LH_SMEM_BYTES(K)`): 4 stages
/// of 384 rows × 64 bytes, the round buffer (64 × 132 fp32), the log-sum-exp states (4 × 128
/// float2) and the lists (cap × 128 values and ids).
fn fused_smem_bytes(cap: usize) -> usize {
    4 * (FUSED_ROWS + FUSED_TILE) * 64 + 64 * 132 * 4 + 4 * FUSED_ROWS * 8 + cap * FUSED_ROWS * 8
}

/// (tiles per slice, slices) of a vocabulary: at least [`FUSED_TILES_PER_SLICE`] tiles per slice,
/// more when that would make more slices than `topk_merge` takes.
fn fused_slices(vocab: usize) -> (usize, usize) {
    let tiles = vocab.div_ceil(FUSED_TILE);
    let per = FUSED_TILES_PER_SLICE.max(tiles.div_ceil(TOPK_MERGE_MAX_SLICES));
    (per, tiles.div_ceil(per))
}

impl CudaBackend {
    /// [`Backend::lm_head_topk_impl`](crate::backend::Backend::lm_head_topk_impl): the fused path
    /// for more than [`MAX_DECODE_ROWS`] rows when it is chosen and fits (hidden size a multiple
    /// of 8, 16-byte aligned operands, a bf16 head, the device's shared memory), else the unfused
    /// one.
    pub(super) fn lm_head_topk_on_device(
        &self,
        x: &CudaTensor,
        head: &CudaMatrix,
        k: usize,
    ) -> Result<TopK> {
        let vocab = head.out;
        ensure!(
            vocab > 0 && vocab < i32::MAX as usize,
            "lm_head: vocabulary of {vocab} rows"
        );
        let k = k.clamp(1, vocab);
        let inst = instances(k)?;
        if x.rows == 0 {
            return Ok(TopK {
                rows: 0,
                k,
                ids: vec![],
                logprobs: vec![],
            });
        }
        if x.rows > MAX_DECODE_ROWS
            && self.lm_head_path()? == LmHeadPath::Fused
            && self.fused_fits(x, head, inst.cap)?
        {
            return self.lm_head_topk_fused(x, head, k, &inst);
        }
        self.lm_head_topk_unfused(x, head, k, &inst)
    }

    /// The path of more than 64 rows: [`CudaBackend::set_lm_head_path`]'s, else `DRAFTLENS_LM_HEAD`'s
    /// (an error if its value is neither `fused` nor `unfused`).
    pub fn lm_head_path(&self) -> Result<LmHeadPath> {
        self.lm_head
            .path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map_err(|e| anyhow!(e))
    }

    /// Which path `lm_head_topk` of more than 64 rows takes from now on (tests and A/B
    /// benchmarks; `DRAFTLENS_LM_HEAD` sets it when the backend is created).
    pub fn set_lm_head_path(&self, path: LmHeadPath) {
        *self.lm_head.path.lock().unwrap_or_else(|e| e.into_inner()) = Ok(path);
    }

    /// How many `lm_head_topk` calls the fused kernel has served so far.
    pub fn lm_head_fused_calls(&self) -> usize {
        self.lm_head.fused_calls.load(Ordering::Relaxed)
    }

    /// Whether the fused kernel takes these operands: a bf16 head, a hidden size that is a positive
    /// multiple of 8 and operands on 16-byte boundaries (its cp.async copies move 16-byte pieces of rows),
    /// sizes within its `int` arguments, and the instance's shared memory on this device.
    fn fused_fits(&self, x: &CudaTensor, head: &CudaMatrix, cap: usize) -> Result<bool> {
        let optin = self
            .ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(derr("shared memory per block"))?;
        Ok(head.mxfp4.is_none()
            && head.inp > 0
            && head.inp.is_multiple_of(8)
            && head.inp < i32::MAX as usize / 2
            && x.rows < i32::MAX as usize
            && self.ptr(&x.buf).is_multiple_of(16)
            && self.ptr(&head.buf).is_multiple_of(16)
            && fused_smem_bytes(cap) <= optin.max(0) as usize)
    }

    /// `kernels/lm_head_topk.cu` over row blocks of 128 × vocabulary slices, then `topk_merge`
    /// per row, in launches of at most [`FUSED_PARTIAL_BYTES`] of partials.
    fn lm_head_topk_fused(
        &self,
        x: &CudaTensor,
        head: &CudaMatrix,
        k: usize,
        inst: &Instances,
    ) -> Result<TopK> {
        let (rows, vocab, hidden) = (x.rows, head.out, head.inp);
        let (tiles_per_slice, slices) = fused_slices(vocab);
        let per_row = slices * (8 + 8 * k);
        let chunk = (FUSED_PARTIAL_BYTES / per_row / FUSED_ROWS * FUSED_ROWS)
            .max(FUSED_ROWS)
            .min(rows);
        let smem = fused_smem_bytes(inst.cap);
        let fp = self
            .kernels
            .get_with_smem("lm_head_topk", inst.fused, smem)?;
        let pms = self.alloc::<f32>(chunk * slices * 2)?;
        let pv = self.alloc::<f32>(chunk * slices * k)?;
        let pi = self.alloc::<u32>(chunk * slices * k)?;
        let ids = self.alloc::<u32>(rows * k)?;
        let lps = self.alloc::<f32>(rows * k)?;
        let (xp, wp) = (self.ptr(&x.buf), self.ptr(&head.buf));
        let (pmsp, pvp, pip) = (self.ptr(&pms), self.ptr(&pv), self.ptr(&pi));
        let (ip, lp) = (self.ptr(&ids), self.ptr(&lps));
        let (n32, h32, k32) = (vocab as i32, hidden as i32, k as i32);
        let (tps32, s32) = (tiles_per_slice as i32, slices as i32);
        let mut start = 0;
        while start < rows {
            let n = chunk.min(rows - start);
            let blocks = n.div_ceil(FUSED_ROWS) * slices;
            ensure!(
                blocks < i32::MAX as usize,
                "lm_head_topk: {blocks} blocks of the fused kernel"
            );
            let (xo, r32) = (xp + (start * hidden * 2) as u64, n as i32);
            let mut b = self.launch_builder(&fp);
            b.arg(&xo)
                .arg(&wp)
                .arg(&r32)
                .arg(&n32)
                .arg(&h32)
                .arg(&k32)
                .arg(&tps32)
                .arg(&s32)
                .arg(&pmsp)
                .arg(&pvp)
                .arg(&pip);
            // SAFETY: lm_head_topk_partial_k* (const bf16*, const bf16*, int R, int N, int H, int k,
            // int tiles_per_slice, int slices, float2*, float*, u32*): x holds n rows of `hidden`
            // values from row `start`, the head vocab × hidden; both 16-byte aligned with hidden a
            // multiple of 8 (fused_fits); the partials hold n × slices (max, sum) pairs and
            // n × slices × k values and ids; k ≤ the instance's K, whose shared memory is allowed.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (blocks as u32, 1, 1),
                    block_dim: (FUSED_THREADS, 1, 1),
                    shared_mem_bytes: smem as u32,
                })
            }
            .map_err(derr(inst.fused))?;
            let (ipo, lpo) = (ip + (start * k * 4) as u64, lp + (start * k * 4) as u64);
            self.topk_merge([pmsp, pvp, pip], slices, k, n, ipo, lpo)?;
            start += n;
        }
        let out = self.download_topk(&ids, &lps, rows, k)?;
        drop((pms, pv, pi));
        self.lm_head.fused_calls.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// fp32 logits of at most 1 GiB at a time into a scratch buffer, then the top-K kernels: the
    /// decode GEMM and the sliced top-K up to [`MAX_DECODE_ROWS`] rows (batch-invariant), cuBLAS and
    /// one block per row above.
    fn lm_head_topk_unfused(
        &self,
        x: &CudaTensor,
        head: &CudaMatrix,
        k: usize,
        inst: &Instances,
    ) -> Result<TopK> {
        let ids = self.alloc::<u32>(x.rows * k)?;
        let lps = self.alloc::<f32>(x.rows * k)?;
        self.lm_head_topk_unfused_to(x, head, k, inst, self.ptr(&ids), self.ptr(&lps))?;
        self.download_topk(&ids, &lps, x.rows, k)
    }

    /// The greedy next token of each row of `x` (top-1 of its logits under `head`: the ids
    /// [`CudaBackend::lm_head_topk_on_device`] gives for k = 1, by the same kernels), written as
    /// u32 to the device address `ids` and left there. Queues work only: a recorded step that
    /// feeds itself ends with it (`step_graph.rs`).
    pub(super) fn lm_head_top1_to(
        &self,
        x: &CudaTensor,
        head: &CudaMatrix,
        ids: u64,
    ) -> Result<()> {
        ensure!(
            x.rows <= MAX_DECODE_ROWS,
            "lm_head: a step's greedy tokens on the device are for at most {MAX_DECODE_ROWS} rows, not {}",
            x.rows
        );
        let lps = self.alloc::<f32>(x.rows.max(1))?;
        self.lm_head_topk_unfused_to(x, head, 1, &instances(1)?, ids, self.ptr(&lps))
    }

    /// The unfused path's work: the top `k` ids and log-probs of each row, written to the device
    /// addresses `ip` and `lp` (`rows × k` each).
    fn lm_head_topk_unfused_to(
        &self,
        x: &CudaTensor,
        head: &CudaMatrix,
        k: usize,
        inst: &Instances,
        ip: u64,
        lp: u64,
    ) -> Result<()> {
        let (rows, vocab) = (x.rows, head.out);
        // fp32 logits for at most `chunk` rows at a time (≤ 1 GiB of scratch).
        let chunk = rows.min(((1usize << 30) / (vocab * 4)).max(1));
        let scratch = self.alloc::<f32>(chunk * vocab)?;
        let f = self.kernels.get("topk", inst.per_row)?;
        let (xp, wp, sp) = (self.ptr(&x.buf), self.ptr(&head.buf), self.ptr(&scratch));
        let mut start = 0;
        while start < rows {
            let n = chunk.min(rows - start);
            let g = GemmOperands {
                x: xp + (start * x.cols * 2) as u64,
                rows: n,
                w: wp,
                out: vocab,
                inp: head.inp,
                y: sp,
            };
            if rows <= MAX_DECODE_ROWS {
                // Batch-invariant logits (decode.rs): decode steps of any batch size agree.
                self.decode_gemm_raw(g, decode::Epilogue::F32)?;
            } else {
                self.gemm_raw(g, blas_sys::cudaDataType::CUDA_R_32F, 0.0)?;
            }
            let (ld, v32, k32) = (vocab as i64, vocab as i32, k as i32);
            let (ipo, lpo) = (ip + (start * k * 4) as u64, lp + (start * k * 4) as u64);
            let slices = vocab.div_ceil(TOPK_SLICE);
            if rows <= MAX_DECODE_ROWS && slices <= TOPK_MERGE_MAX_SLICES {
                self.topk_sliced(sp, ld, vocab, k, n, inst.sliced, ipo, lpo)?;
            } else {
                let mut b = self.launch_builder(&f);
                b.arg(&sp).arg(&ld).arg(&v32).arg(&k32).arg(&ipo).arg(&lpo);
                // SAFETY: (const float*, ll, int, int, u32*, float*); n rows of `vocab` logits in
                // scratch, n*k outputs from offset start*k.
                unsafe {
                    b.launch(LaunchConfig {
                        grid_dim: (n as u32, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    })
                }
                .map_err(derr(inst.per_row))?;
            }
            start += n;
        }
        // The scratch's free is stream-ordered after the launches above.
        drop(scratch);
        Ok(())
    }

    /// The `rows × k` ids and log-probs, copied to the host once the stream has finished.
    fn download_topk(
        &self,
        ids: &CudaSlice<u32>,
        lps: &CudaSlice<f32>,
        rows: usize,
        k: usize,
    ) -> Result<TopK> {
        let mut out_ids = vec![0u32; rows * k];
        let mut out_lp = vec![0f32; rows * k];
        self.stream
            .memcpy_dtoh(&ids.slice(0..rows * k), &mut out_ids)
            .map_err(derr("device-to-host copy"))?;
        self.stream
            .memcpy_dtoh(&lps.slice(0..rows * k), &mut out_lp)
            .map_err(derr("device-to-host copy"))?;
        self.synchronize()?;
        Ok(TopK {
            rows,
            k,
            ids: out_ids,
            logprobs: out_lp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_reads_fused_unfused_or_nothing_and_refuses_the_rest() {
        assert_eq!(LmHeadPath::parse(None).unwrap(), LmHeadPath::DEFAULT);
        assert_eq!(LmHeadPath::parse(Some("")).unwrap(), LmHeadPath::DEFAULT);
        assert_eq!(LmHeadPath::parse(Some("fused")).unwrap(), LmHeadPath::Fused);
        assert_eq!(
            LmHeadPath::parse(Some(" unfused ")).unwrap(),
            LmHeadPath::Unfused
        );
        let err = LmHeadPath::parse(Some("Fused")).unwrap_err().to_string();
        assert!(
            err.contains("DRAFTLENS_LM_HEAD=Fused") && err.contains("fused or unfused"),
            "{err}"
        );
    }

    #[test]
    fn slices_depend_on_the_vocabulary_only_and_fit_the_merge() {
        // Qwen3: 594 tiles of 256 ids, 38 slices of 16 tiles (the last one 1.5 tiles).
        assert_eq!(fused_slices(151_936), (16, 38));
        assert_eq!(fused_slices(1003), (16, 1));
        assert_eq!(fused_slices(1), (16, 1));
        // Past 256 slices of 16 tiles (1 048 576 ids) the slices widen.
        for vocab in [1 << 20, (1 << 20) + 1, 3_000_000] {
            let (per, slices) = fused_slices(vocab);
            assert!(slices <= TOPK_MERGE_MAX_SLICES, "{vocab}: {slices} slices");
            assert!(per * slices * FUSED_TILE >= vocab, "{vocab}: not covered");
        }
    }

    /// The value of `#define NAME value` in kernels/lm_head_topk.cu.
    fn kernel_define(name: &str) -> usize {
        const SRC: &str = include_str!("../../../../../kernels/lm_head_topk.cu");
        SRC.lines()
            .find_map(|l| {
                let rest = l.strip_prefix("#define ")?.strip_prefix(name)?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no #define {name} in kernels/lm_head_topk.cu"))
    }

    #[test]
    fn the_geometry_and_shared_memory_match_the_kernel_and_fit_an_h100() {
        assert_eq!(kernel_define("LH_BM"), FUSED_ROWS);
        assert_eq!(kernel_define("LH_BN"), FUSED_TILE);
        assert_eq!(kernel_define("LH_THREADS"), FUSED_THREADS as usize);
        // LH_SMEM_BYTES(K), from the kernel's own constants.
        let stage = (kernel_define("LH_BM") + kernel_define("LH_BN")) * kernel_define("LH_BK") * 2;
        let fixed = kernel_define("LH_STAGES") * stage
            + kernel_define("LH_ROUND_IDS") * kernel_define("LH_BUF_LD") * 4
            + kernel_define("LH_WN") * FUSED_ROWS * 8;
        for cap in [8, 16, 32, 64] {
            assert_eq!(fused_smem_bytes(cap), fixed + cap * FUSED_ROWS * 8);
        }
        assert_eq!(fused_smem_bytes(8), 144_384);
        // sm_90's opt-in maximum per block: 227 KiB.
        assert!(fused_smem_bytes(64) <= 227 * 1024);
    }
}
