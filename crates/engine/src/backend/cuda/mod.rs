//! The CUDA backend: bf16 weights and activations, fp32 accumulation, fp32 norms and softmax.
//!
//! - Libraries are loaded at run time (cudarc `fallback-dynamic-loading`): a binary built on a
//!   machine without CUDA starts anywhere, and [`CudaBackend::new`] returns
//!   "CUDA unavailable: <reason>" when the driver, NVRTC or cuBLAS cannot be loaded or no device
//!   exists. The libraries are probed with `dlopen` first because a missing library panics inside
//!   cudarc; the context creation is additionally wrapped in `catch_unwind`.
//! - GEMMs: cuBLAS `cublasGemmEx`, bf16 operands, `CUBLAS_COMPUTE_32F`, reduced-precision split-K
//!   reductions disallowed.
//! - Everything else: own kernels in `kernels/*.cu`, compiled by NVRTC at first use
//!   ([`kernels::Kernels`]), one thread per module from the backend's creation.
//! - One stream; allocations are stream-ordered (`cuMemAllocAsync` from the device's pool, whose
//!   release threshold is raised so freed blocks are reused instead of returned to the driver).
//!
//! The precision of every intermediate is documented in `docs/cuda.md`.
//!
//! The files, by concern:
//!
//! | file | holds |
//! |---|---|
//! | `probe.rs` | finding the libraries and the device, [`CudaBackend::new`], "CUDA unavailable" |
//! | `kernels.rs` | kernel sources, NVRTC compilation (parallel, to CUBIN) and the on-disk cache |
//! | `launch.rs` | kernel launches: arguments, programmatic dependent launch |
//! | `nvml.rs` | GPU utilisation for the run timeline |
//! | `memory.rs` | allocation, host↔device copies, row/column copies |
//! | `upload.rs` | weight uploads from raw checkpoint bytes |
//! | `gemm.rs` | GEMMs: cuBLASLt plans and tuning, `cublasGemmEx` |
//! | `decode.rs` | the batch-invariant decode GEMM and decode attention |
//! | `lm_head.rs` | the LM head's top-K: unfused (logits, then top-K) and fused (`kernels/lm_head_topk.cu`) |
//! | `moe.rs`, `mxfp4.rs` | mixtures of experts routed on the device; MXFP4 experts kept packed |
//! | `elementwise.rs` | norms, RoPE, SwiGLU |
//! | `mask.rs` | attention masks as per-query key intervals |
//! | `attention.rs` | prefill attention launches |
//! | `gdn.rs` | the hybrid (Gated DeltaNet) layer ops |
//! | `step_graph.rs` | decode steps recorded as CUDA graphs and replayed |
//! | `backend_impl.rs` | `impl Backend for CudaBackend` |
//! | `bench.rs`, `bench_decode.rs`, `bench_lm_head.rs` | benchmark helpers (`kernel-lab` feature: docs/cuda.md, "The kernel lab") |

mod attention;
mod backend_impl;
#[cfg(feature = "kernel-lab")]
pub mod bench;
#[cfg(feature = "kernel-lab")]
pub mod bench_decode;
#[cfg(feature = "kernel-lab")]
pub mod bench_lm_head;
mod decode;
pub mod decode_lt;
pub mod elementwise;
pub mod gdn;
mod gemm;
pub mod gemm_choices;
mod kernel_images;
mod kernels;
mod launch;
mod lm_head;
mod mask;
mod memory;
mod moe;
mod mxfp4;
pub mod nvml;
mod probe;
mod step_graph;
mod upload;

pub use attention::ATTENTION_KERNEL_ENV;
pub use decode::{
    decode_attn_chunk_len, decode_attn_chunks, k_splits, DecodeGemmKernel, DECODE_ATTN_CHUNK_MIN,
    DECODE_ATTN_MAX_CHUNKS, MAX_DECODE_ROWS,
};
pub use decode_lt::DecodeChoiceRecord;
pub use gemm::{GemmMode, TuneRecord};
pub use kernel_images::{
    ship_kernel_images, shipped_images_against_nvrtc, shipped_kernel_images, KERNEL_IMAGES_ENV,
};
pub use kernels::compile_kernels_offline;
pub use lm_head::{LmHeadPath, LM_HEAD_ENV};
pub use probe::availability;

use anyhow::anyhow;
use attention::MaskUpload;
use cudarc::cublas::{result as blas_result, CudaBlas};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use kernels::Kernels;
use std::sync::{Arc, Mutex};

/// A row-major `[rows, cols]` bf16 activation in device memory.
pub struct CudaTensor {
    buf: CudaSlice<bf16>,
    rows: usize,
    cols: usize,
}

/// A bf16 weight `[out, in]` in device memory, or an MXFP4 one kept packed (`mxfp4.rs`).
pub struct CudaMatrix {
    /// The bf16 values; one unused element when `mxfp4` holds the weight.
    buf: CudaSlice<bf16>,
    out: usize,
    inp: usize,
    /// The packed bytes of an MXFP4 weight (`Backend::matrix_mxfp4`: gpt-oss's experts). Only the
    /// grouped GEMM of the device-routed experts reads them; `matmul` and `matmul_acc` dequantise
    /// such a weight to bf16 first (`mxfp4.rs`), and nothing else is given one.
    mxfp4: Option<mxfp4::PackedMxfp4>,
}

impl CudaTensor {
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// Device facts shown in reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_mem_bytes: usize,
    pub driver_version: i32,
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    info: DeviceInfo,
    /// Last uploaded attention mask (as per-query key intervals, plus the heaviest-first order of
    /// the query blocks per block height): the model calls attention once per layer with the same
    /// mask, so it is uploaded once per forward.
    mask_cache: Mutex<Option<MaskUpload>>,
    /// Use the first attention kernel (`flash_attention_hd*`, 64-row blocks) for every head dim
    /// instead of `flash_attention2_hd{64,128,256}`: for A/B benchmarks only.
    attn_v1: std::sync::atomic::AtomicBool,
    /// The packed causal prefill at head dim 128 runs the wgmma flash attention
    /// (`kernels/attention_wgmma.cu`, sm_90a) instead of `flash_attention2_hd128`: opt-in,
    /// `DRAFTLENS_ATTENTION_KERNEL=wgmma` (read once here) or `set_attention_wgmma`; only on
    /// compute capability 9.0 (docs/cuda.md, "wgmma flash attention (opt-in)").
    attn_wgmma: std::sync::atomic::AtomicBool,
    /// GEMM path and per-shape algorithm cache (`gemm.rs`).
    gemm: gemm::Gemms,
    /// Last uploaded RoPE positions (q and k of every layer share them).
    pos_cache: Mutex<Option<(Vec<u32>, CudaSlice<u32>)>>,
    /// Inverse frequencies per (theta bits, rotary_dim).
    freq_cache: Mutex<Vec<(FreqKey, CudaSlice<f32>)>>,
    /// Small f32 tables uploaded once per content ([`CudaBackend::f32_table`]).
    f32_tables: Mutex<Vec<F32Table>>,
    /// RoPE's (cos, sin) table at the last positions (`with_rope_cs_table`).
    cs_cache: Mutex<Option<(Vec<u32>, FreqKey, CudaSlice<f32>)>>,
    /// flash_attention2 normalises and rotates q itself in the fused QKV prefill (default); off:
    /// the separate q/k pass does, for A/B benchmarks and tests.
    q_norm_in_attention: std::sync::atomic::AtomicBool,
    /// Split-K scratch of the batch-invariant decode GEMM (`decode.rs`).
    decode: decode::DecodeState,
    /// Page-locked staging of tap downloads ([`CudaBackend::to_host_bf16_staged`]), kept and
    /// grown to the largest tap seen (one pack's rows × hidden size).
    tap_staging: Mutex<Option<cudarc::driver::PinnedHostSlice<half::bf16>>>,
    /// Device routing of mixture-of-experts decode steps (`moe.rs`).
    moe: moe::MoeState,
    /// The LM head's top-K path of more than 64 rows (`lm_head.rs`: `DRAFTLENS_LM_HEAD`).
    lm_head: lm_head::LmHeadState,
    /// Recorded decode steps (CUDA graphs) and the recording in progress (`step_graph.rs`).
    step_graphs: step_graph::StepGraphs,
    /// Kernels are launched as programmatic dependent launches (`launch.rs`; opt-in).
    dependent_launch: std::sync::atomic::AtomicBool,
}

/// A table of [`CudaBackend::f32_table`]: its values' bits and their upload.
type F32Table = (Vec<u32>, CudaSlice<f32>);

/// (theta bits, rotary_dim) of a cached inverse-frequency table.
type FreqKey = (u32, usize);

pub(super) fn derr<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> anyhow::Error + '_ {
    move |e| anyhow!("cuda: {what}: {e}")
}

pub(super) fn blas_err(what: &str) -> impl FnOnce(blas_result::CublasError) -> anyhow::Error + '_ {
    move |e| anyhow!("cuBLAS: {what}: {:?}", e.0)
}

/// Thread blocks of `per` threads covering `n` items (at least one).
pub(super) fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}
