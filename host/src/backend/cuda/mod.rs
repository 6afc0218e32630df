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
//!   ([`kernels::Kernels`]).
//! - One stream; allocations are stream-ordered (`cuMemAllocAsync` from the device's pool, whose
//!   release threshold is raised so freed blocks are reused instead of returned to the driver).
//!
//! The precision of every intermediate is documented in `docs/cuda.md`.

pub mod bench;
pub mod bench_decode;
mod decode;
pub mod gdn;
mod gemm;
mod kernels;
pub mod nvml;
mod upload;

pub use decode::{k_splits, MAX_DECODE_ROWS};
pub use gemm::{GemmMode, TuneRecord};

use super::{
    attention_varlen_qkv_unfused, AttnMask, AttnShape, Backend, KvSlot, QkNorm, Rope, RopeStyle,
    TopK,
};
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use half::bf16;
use kernels::Kernels;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// A row-major `[rows, cols]` bf16 activation in device memory.
pub struct CudaTensor {
    buf: CudaSlice<bf16>,
    rows: usize,
    cols: usize,
}

/// A bf16 weight `[out, in]` in device memory.
pub struct CudaMatrix {
    buf: CudaSlice<bf16>,
    out: usize,
    inp: usize,
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
    /// instead of `flash_attention2_hd{64,128}`: for A/B benchmarks only.
    attn_v1: std::sync::atomic::AtomicBool,
    /// GEMM path and per-shape algorithm cache (`gemm.rs`).
    gemm: gemm::Gemms,
    /// Last uploaded RoPE positions (q and k of every layer share them).
    pos_cache: Mutex<Option<(Vec<u32>, CudaSlice<u32>)>>,
    /// Inverse frequencies per (theta bits, rotary_dim).
    freq_cache: Mutex<Vec<(FreqKey, CudaSlice<f32>)>>,
    /// Split-K scratch of the batch-invariant decode GEMM (`decode.rs`).
    decode: decode::DecodeState,
}

/// (theta bits, rotary_dim) of a cached inverse-frequency table.
type FreqKey = (u32, usize);

#[derive(Clone, PartialEq)]
enum MaskKey {
    Mask(AttnMask, usize, usize),
    Varlen(Vec<usize>),
}

/// Device pointers and row strides (elements) of an attention's q, k, v.
struct AttnIo {
    q: u64,
    q_ld: usize,
    k: u64,
    v: u64,
    kv_ld: usize,
    tq: usize,
    tk: usize,
}

/// An uploaded attention mask: per-query key intervals (host copy and device copy) and, per query
/// block height (positions per block), the order in which the blocks are launched.
struct MaskUpload {
    key: MaskKey,
    host: Vec<i32>,
    ranges: CudaSlice<i32>,
    orders: Vec<(usize, CudaSlice<i32>)>,
}

/// Query blocks of `ppb` positions sorted by the number of keys they visit, heaviest first (ties
/// in position order): the launch order of `flash_attention2`, so that the longest blocks of a
/// causal prefill start in the first wave instead of trailing at the end.
fn heaviest_first(iv: &[i32], ppb: usize) -> Vec<i32> {
    let rows = iv.len() / 4;
    let nb = rows.div_ceil(ppb);
    let mut work: Vec<(i64, usize)> = (0..nb)
        .map(|b| {
            let (mut lo1, mut hi1, mut lo2, mut hi2) = (i64::MAX, i64::MIN, i64::MAX, i64::MIN);
            for r in b * ppb..((b + 1) * ppb).min(rows) {
                let x = &iv[4 * r..4 * r + 4];
                if x[0] < x[1] {
                    lo1 = lo1.min(x[0] as i64);
                    hi1 = hi1.max(x[1] as i64);
                }
                if x[2] < x[3] {
                    lo2 = lo2.min(x[2] as i64);
                    hi2 = hi2.max(x[3] as i64);
                }
            }
            let span = |lo: i64, hi: i64| if hi > lo { hi - lo } else { 0 };
            (-(span(lo1, hi1) + span(lo2, hi2)), b)
        })
        .collect();
    work.sort_unstable();
    work.into_iter().map(|(_, b)| b as i32).collect()
}

// ---------------------------------------------------------------------------------------------
// Probing: find the libraries before cudarc touches them.

/// Directories tried when a library is not found by its plain name (LD_LIBRARY_PATH unset).
fn library_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(d) = std::env::var(var) {
            dirs.push(format!("{d}/lib64"));
            dirs.push(format!("{d}/lib"));
        }
    }
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
            "/usr/local/nvidia/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib/wsl/lib",
        ]
        .map(String::from),
    );
    dirs
}

/// dlopen the first loadable of `names` (plain name, then each directory) and keep it loaded, so
/// that cudarc's later dlopen by soname finds it. Returns the error text listing what was tried.
fn preload(what: &str, names: &[&str]) -> std::result::Result<String, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    for d in library_dirs() {
        candidates.extend(names.iter().map(|n| format!("{d}/{n}")));
    }
    for c in candidates {
        // SAFETY: loading a shared library runs its initialisers; these are the vendor's CUDA
        // libraries, which is exactly what the backend is about to use.
        match unsafe { libloading::Library::new(&c) } {
            Ok(lib) => {
                std::mem::forget(lib); // stay loaded for the life of the process
                return Ok(c);
            }
            Err(e) => tried.push(format!("{c} ({e})")),
        }
    }
    let first = tried.first().cloned().unwrap_or_default();
    Err(format!("{what} library not found (tried {} locations; first: {first}); set LD_LIBRARY_PATH to the directory holding {}", tried.len(), names[0]))
}

/// Loads the driver, NVRTC, cuBLASLt and cuBLAS libraries once per process; the error says which
/// one is missing.
fn probe_libraries() -> std::result::Result<(), String> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            preload("CUDA driver", &["libcuda.so.1", "libcuda.so"])?;
            preload("NVRTC", &["libnvrtc.so.13", "libnvrtc.so"])?;
            preload("cuBLASLt", &["libcublasLt.so.13", "libcublasLt.so"])?;
            preload("cuBLAS", &["libcublas.so.13", "libcublas.so"])?;
            // cudarc's own check (the names it will dlopen) must now succeed too.
            let ok = std::panic::catch_unwind(|| unsafe {
                cudarc::driver::sys::is_culib_present()
                    && cudarc::nvrtc::sys::is_culib_present()
                    && cudarc::cublas::sys::is_culib_present()
                    && cudarc::cublaslt::sys::is_culib_present()
            });
            match ok {
                Ok(true) => Ok(()),
                Ok(false) => Err("the CUDA libraries load by path but not under the names cudarc looks for (libcuda.so.1, libnvrtc.so.13, libcublas.so.13)".into()),
                Err(_) => Err("probing the CUDA libraries panicked".into()),
            }
        })
        .clone()
}

/// Compiles every kernel module with NVRTC for `arch` (e.g. `compute_90`) without a driver or a
/// device, returning (module, PTX bytes). Lets a machine with only the NVRTC library check that
/// the kernels compile.
pub fn compile_kernels_offline(arch: &str) -> Result<Vec<(String, usize)>> {
    preload("NVRTC", &["libnvrtc.so.13", "libnvrtc.so"])
        .map_err(|e| anyhow!("CUDA unavailable: {e}"))?;
    let mut out = Vec::new();
    for name in kernels::module_names() {
        let ptx = std::panic::catch_unwind(|| kernels::ptx_for(name, arch))
            .map_err(|p| anyhow!("NVRTC panicked: {}", panic_text(p)))??;
        out.push((name.to_string(), ptx.len()));
    }
    Ok(out)
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// `Ok(())` when a CUDA device can be used, else the reason (without the "CUDA unavailable" prefix).
pub fn availability(ordinal: usize) -> std::result::Result<(), String> {
    probe_libraries()?;
    let count = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|p| format!("driver initialisation panicked: {}", panic_text(p)))?;
    let count = count.map_err(|e| format!("driver initialisation failed: {e}"))?;
    if count <= 0 {
        return Err("the driver reports no CUDA device".into());
    }
    if ordinal >= count as usize {
        return Err(format!(
            "device {ordinal} requested but only {count} device(s) exist"
        ));
    }
    Ok(())
}

fn derr<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> anyhow::Error + '_ {
    move |e| anyhow!("cuda: {what}: {e}")
}

fn blas_err(what: &str) -> impl FnOnce(blas_result::CublasError) -> anyhow::Error + '_ {
    move |e| anyhow!("cuBLAS: {what}: {:?}", e.0)
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

impl CudaBackend {
    /// Opens device `ordinal`. Errors start with "CUDA unavailable:" when the machine has no
    /// usable CUDA (no driver, no NVRTC/cuBLAS, no device), so callers can print them as is.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        availability(ordinal).map_err(|r| anyhow!("CUDA unavailable: {r}"))?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|p| {
                anyhow!(
                    "CUDA unavailable: creating a context on device {ordinal} panicked: {}",
                    panic_text(p)
                )
            })?
            .map_err(|e| {
                anyhow!("CUDA unavailable: creating a context on device {ordinal}: {e}")
            })?;
        // One stream only: cudarc's per-buffer events (for cross-stream ordering) are not needed.
        // SAFETY: every buffer of this backend is allocated, used and freed on `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(derr("creating a stream"))?;
        // Keep freed pool memory for reuse (the default threshold 0 returns it at every sync).
        // SAFETY: plain driver calls on this context's device with valid out-pointers.
        unsafe {
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                == sys::CUresult::CUDA_SUCCESS
            {
                let mut threshold: u64 = u64::MAX;
                let _ = sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut threshold as *mut u64 as *mut c_void,
                );
            }
        }
        let blas = std::panic::catch_unwind(|| CudaBlas::new(stream.clone()))
            .map_err(|p| {
                anyhow!(
                    "CUDA unavailable: cuBLAS initialisation panicked: {}",
                    panic_text(p)
                )
            })?
            .map_err(|e| anyhow!("CUDA unavailable: cuBLAS initialisation failed: {:?}", e.0))?;
        // SAFETY: valid handle; the mode only forbids reduced-precision split-K reductions.
        unsafe {
            blas_sys::cublasSetMathMode(
                *blas.handle(),
                blas_sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
        }
        .result()
        .map_err(blas_err("setting the math mode"))?;
        let mut driver_version = 0i32;
        // SAFETY: out-pointer to a local.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) };
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(derr("device name"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(derr("compute capability"))?,
            multiprocessors: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(derr("SM count"))?,
            total_mem_bytes: ctx.total_mem().map_err(derr("memory size"))?,
            driver_version,
        };
        let kernels = Kernels::new(ctx.clone())?;
        let gemm = gemm::Gemms::new(&stream);
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            kernels,
            info,
            mask_cache: Mutex::new(None),
            attn_v1: std::sync::atomic::AtomicBool::new(false),
            gemm,
            pos_cache: Mutex::new(None),
            freq_cache: Mutex::new(Vec::new()),
            decode: Default::default(),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// NVRTC target of the kernels (`compute_90` on an H100/H200).
    pub fn arch(&self) -> &str {
        self.kernels.arch()
    }

    /// Seconds spent compiling and loading kernels so far.
    pub fn kernel_compile_secs(&self) -> f64 {
        self.kernels.compile_secs()
    }

    /// Compiles every kernel module now and describes each kernel's registers and spills.
    pub fn kernel_report(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (m, f) in [
            ("elementwise", "rms_norm_bf16"),
            ("elementwise", "rope_bf16"),
            ("elementwise", "swiglu_bf16"),
            ("elementwise", "copy_rows_bf16"),
            ("attention", "flash_attention_hd64"),
            ("attention", "flash_attention_hd128"),
            ("attention", "flash_attention_hd256"),
            ("attention", "flash_attention2_hd64"),
            ("attention", "flash_attention2_hd128"),
            ("attention", "qk_norm_rope_bf16"),
            ("attention", "qk_norm_rope_vec_bf16"),
            ("elementwise", "rms_norm_rows_bf16"),
            ("elementwise", "swiglu_packed_rows_bf16"),
            ("topk", "topk_logsoftmax_k8"),
            ("topk", "topk_logsoftmax_k64"),
            ("decode", "decode_gemm_n1_m1"),
            ("decode", "decode_gemm_n8_m2"),
            ("decode", "decode_attention_hd128"),
        ] {
            out.push(self.kernels.resources(m, f)?);
        }
        Ok(out)
    }

    /// Waits for all queued work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(derr("synchronize"))
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device memory (free, total) in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(derr("memory info"))
    }

    fn alloc<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller writes all `n` elements before anything reads them. A zero-length
        // request allocates one element so that every buffer has a valid device address.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| {
            anyhow!(
                "cuda: allocating {} bytes: {e}",
                n * std::mem::size_of::<T>()
            )
        })
    }

    fn new_tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc(rows * cols)?,
            rows,
            cols,
        })
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let mut buf = self.alloc::<T>(data.len())?;
        if !data.is_empty() {
            self.stream
                .memcpy_htod(data, &mut buf.slice_mut(0..data.len()))
                .map_err(derr("host-to-device copy"))?;
        }
        Ok(buf)
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
        Ok(CudaMatrix { buf, out, inp })
    }

    fn fill_random(
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
        let mut b = self.stream.launch_builder(&f);
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

    /// How GEMMs run from now on (see [`GemmMode`]; the default is [`GemmMode::LtTuned`] when
    /// cuBLASLt loads, else [`GemmMode::GemmEx`]).
    pub fn set_gemm_mode(&self, mode: GemmMode) -> Result<()> {
        self.gemm.set_mode(mode)
    }

    pub fn gemm_mode(&self) -> GemmMode {
        self.gemm.mode()
    }

    /// cuBLASLt availability, shapes planned and fallbacks to `cublasGemmEx` (diagnostics).
    pub fn gemm_status(&self) -> String {
        self.gemm.lt_status()
    }

    /// The shapes tuned so far in [`GemmMode::LtTuned`] (first heuristic answer vs the chosen one).
    pub fn gemm_tune_records(&self) -> Vec<TuneRecord> {
        self.gemm.tune_records()
    }

    /// `y = x · Wᵀ (+ beta · y)` with bf16 operands and fp32 accumulation. Raw pointers so the
    /// LM head can write fp32 logits for a slice of rows.
    #[allow(clippy::too_many_arguments)]
    fn gemm_raw(
        &self,
        x: u64,
        rows: usize,
        w: u64,
        out: usize,
        inp: usize,
        y: u64,
        y_type: blas_sys::cudaDataType,
        beta: f32,
    ) -> Result<()> {
        if rows == 0 || out == 0 {
            return Ok(());
        }
        ensure!(
            rows <= i32::MAX as usize && out <= i32::MAX as usize && inp <= i32::MAX as usize,
            "matmul too large for cuBLAS: [{rows}, {inp}] x [{out}, {inp}]"
        );
        let out_type = if y_type == blas_sys::cudaDataType::CUDA_R_32F {
            gemm::OutType::F32
        } else {
            gemm::OutType::Bf16
        };
        // cuBLASLt (the tuner also times cublasGemmEx on the shape, into its own scratch output).
        let gemm_ex =
            |y_scratch: u64, b: f32| self.gemm_ex_raw(x, rows, w, out, inp, y_scratch, y_type, b);
        if self.gemm.run(
            &self.ctx,
            &self.stream,
            x,
            rows,
            w,
            out,
            inp,
            y,
            out_type,
            beta,
            &gemm_ex,
        )? {
            return Ok(());
        }
        self.gemm_ex_raw(x, rows, w, out, inp, y, y_type, beta)
    }

    /// `cublasGemmEx` for [`CudaBackend::gemm_raw`] (shapes checked there).
    #[allow(clippy::too_many_arguments)]
    fn gemm_ex_raw(
        &self,
        x: u64,
        rows: usize,
        w: u64,
        out: usize,
        inp: usize,
        y: u64,
        y_type: blas_sys::cudaDataType,
        beta: f32,
    ) -> Result<()> {
        let alpha = 1f32;
        // Column-major view: yᵀ[out, rows] = W[out, inp] · xᵀ[inp, rows]; W row-major [out, inp]
        // is column-major [inp, out] (lda = inp), hence op(A) = T.
        // SAFETY: the pointers address buffers of at least rows*inp, out*inp and rows*out elements.
        unsafe {
            blas_result::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                out as i32,
                rows as i32,
                inp as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16BF,
                inp as i32,
                x as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16BF,
                inp as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                y_type,
                out as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmEx"))
    }

    /// `acc += x · Wᵀ` in one cuBLAS call (beta = 1): the residual add fused into the GEMM
    /// epilogue, one bf16 rounding of `acc + fp32 product` instead of HF's two.
    pub fn matmul_acc(&self, x: &CudaTensor, w: &CudaMatrix, acc: &mut CudaTensor) -> Result<()> {
        ensure!(
            x.cols == w.inp,
            "matmul: input has {} columns, weight expects {}",
            x.cols,
            w.inp
        );
        ensure!(
            (acc.rows, acc.cols) == (x.rows, w.out),
            "matmul_acc: accumulator is [{}, {}], product is [{}, {}]",
            acc.rows,
            acc.cols,
            x.rows,
            w.out
        );
        if x.rows <= MAX_DECODE_ROWS {
            // Batch-invariant, the add in the epilogue as below (decode.rs).
            return self.decode_gemm_raw(
                self.ptr(&x.buf),
                x.rows,
                self.ptr(&w.buf),
                w.out,
                w.inp,
                self.ptr(&acc.buf),
                w.out,
                decode::Epilogue::AddBf16,
            );
        }
        self.gemm_raw(
            self.ptr(&x.buf),
            x.rows,
            self.ptr(&w.buf),
            w.out,
            w.inp,
            self.ptr(&acc.buf),
            blas_sys::cudaDataType::CUDA_R_16BF,
            1.0,
        )
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
        Ok(CudaMatrix { buf, out, inp })
    }

    /// Splits the columns of `x` into consecutive tensors of the given widths (the outputs of a
    /// fused projection).
    pub fn split_cols(&self, x: &CudaTensor, widths: &[usize]) -> Result<Vec<CudaTensor>> {
        ensure!(
            widths.iter().sum::<usize>() == x.cols,
            "split_cols: widths {widths:?} do not add up to {} columns",
            x.cols
        );
        let mut out = Vec::with_capacity(widths.len());
        let mut c0 = 0;
        for &w in widths {
            let mut t = self.new_tensor(x.rows, w)?;
            self.copy_rows(&mut t.buf, w, 0, &x.buf, x.cols, c0, None, x.rows, w)?;
            out.push(t);
            c0 += w;
        }
        Ok(out)
    }

    /// Runs `f` with the device tables RoPE needs — positions (u32) and the inverse frequencies
    /// of `rope` (f32, HF's `1 / θ^(2i / rotary_dim)`) — uploading each only when it changed
    /// (every layer of a forward shares them). The caches stay locked while `f` queues its launch.
    fn with_rope_tables<R>(
        &self,
        positions: &[u32],
        rope: &Rope,
        f: impl FnOnce(&CudaSlice<u32>, &CudaSlice<f32>) -> Result<R>,
    ) -> Result<R> {
        let half = rope.rotary_dim / 2;
        let mut fc = self.freq_cache.lock().unwrap_or_else(|e| e.into_inner());
        let fkey = (rope.theta.to_bits(), rope.rotary_dim);
        if !fc.iter().any(|(k, _)| *k == fkey) {
            // HF: inv_freq = 1 / theta^(2i / rotary_dim), in f32.
            let inv: Vec<f32> = (0..half)
                .map(|i| 1.0 / rope.theta.powf((2 * i) as f32 / rope.rotary_dim as f32))
                .collect();
            fc.push((fkey, self.upload(&inv)?));
        }
        let freqs = &fc
            .iter()
            .find(|(k, _)| *k == fkey)
            .expect("inserted above")
            .1;
        let mut pc = self.pos_cache.lock().unwrap_or_else(|e| e.into_inner());
        if pc
            .as_ref()
            .map(|(p, _)| p.as_slice() != positions)
            .unwrap_or(true)
        {
            *pc = Some((positions.to_vec(), self.upload(positions)?));
        }
        let pos = &pc.as_ref().expect("filled above").1;
        f(pos, freqs)
    }

    /// Per-head RMSNorm (q heads with `q_norm`, k heads with `k_norm`) and RoPE of the q and k
    /// columns of a fused QKV output `[T, (H + 2·Hkv)·hd]`, in place; the v columns are untouched.
    /// Bit-identical to `rms_norm(·, group = hd)` followed by `rope_inplace` on the split q and k,
    /// in one pass instead of four (plus the split copies).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_packed(
        &self,
        qkv: &mut CudaTensor,
        shape: AttnShape,
        q_norm: &CudaTensor,
        k_norm: &CudaTensor,
        eps: f32,
        positions: &[u32],
        rope: &Rope,
    ) -> Result<()> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        ensure!(
            qkv.cols == (heads + 2 * kv_heads) * hd,
            "qk_norm_rope_packed: {} columns, expected (heads {heads} + 2 × {kv_heads}) × {hd}",
            qkv.cols
        );
        ensure!(
            q_norm.rows * q_norm.cols == hd && k_norm.rows * k_norm.cols == hd,
            "qk_norm_rope_packed: norm weights must have head_dim = {hd} values"
        );
        ensure!(
            positions.len() == qkv.rows,
            "qk_norm_rope_packed: {} positions for {} rows",
            positions.len(),
            qkv.rows
        );
        ensure!(
            hd > 0 && hd <= 256 && rope.head_dim == hd,
            "qk_norm_rope_packed: head_dim {hd} (rope's {}) must be 1..=256",
            rope.head_dim
        );
        ensure!(
            rope.rotary_dim <= hd && rope.rotary_dim.is_multiple_of(2),
            "qk_norm_rope_packed: bad rotary_dim {}",
            rope.rotary_dim
        );
        let warps = qkv.rows * (heads + kv_heads);
        if warps == 0 {
            return Ok(());
        }
        // The vectorised kernel covers head dims that are whole 16-byte chunks and rotary parts
        // that whole chunks cover (rotate-half: pairs a power-of-two number of chunks apart).
        let rd = rope.rotary_dim;
        let vec_ok = hd.is_multiple_of(8)
            && qkv.cols.is_multiple_of(8)
            && match rope.style {
                RopeStyle::Interleaved => rd.is_multiple_of(8),
                RopeStyle::RotateHalf => {
                    rd.is_multiple_of(16) && (rd == 0 || (rd / 16).is_power_of_two())
                }
            };
        let func = if vec_ok {
            "qk_norm_rope_vec_bf16"
        } else {
            "qk_norm_rope_bf16"
        };
        let f = self.kernels.get("attention", func)?;
        let (ld, rows) = (qkv.cols as i64, qkv.rows as i64);
        let (hq, hk, hd32, rd) = (
            heads as i32,
            kv_heads as i32,
            hd as i32,
            rope.rotary_dim as i32,
        );
        let inter = matches!(rope.style, RopeStyle::Interleaved) as i32;
        self.with_rope_tables(positions, rope, |pos, freqs| {
            let mut b = self.stream.launch_builder(&f);
            b.arg(&mut qkv.buf)
                .arg(&ld)
                .arg(&rows)
                .arg(&hq)
                .arg(&hk)
                .arg(&hd32)
                .arg(&q_norm.buf)
                .arg(&k_norm.buf)
                .arg(&eps)
                .arg(pos)
                .arg(freqs)
                .arg(&rd)
                .arg(&inter);
            // SAFETY: (bf16*, ll, ll, int, int, int, const bf16*, const bf16*, float, const u32*,
            // const float*, int, int); shapes checked above.
            // One block per row (grid-stride past 65 535 rows).
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (qkv.rows.min(65535) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr(func))?;
            Ok(())
        })
    }

    /// Whether `rms_norm_rows_bf16` covers rows of `cols` values: a multiple of 256 up to 4096
    /// (the kernel's RMS_MAX_CHUNKS = 16 chunks of 8 values per lane of a warp).
    fn rows_kernel_fits(cols: usize) -> bool {
        cols.is_multiple_of(256) && cols > 0 && cols <= 256 * 16
    }

    /// [`Backend::rms_norm`] over whole rows (group = cols), bit-identical, with every load of a
    /// row in flight at once and one read of it (`kernels/fused.cu`); rows whose width is not a
    /// multiple of 256 up to 4096 go to the grouped kernel (as [`Backend::rms_norm`] routes them).
    pub fn rms_norm_rows(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        let cols = x.cols;
        if !Self::rows_kernel_fits(cols) {
            return self.rms_norm_groups(x, weight, eps, cols);
        }
        ensure!(
            weight.rows * weight.cols == cols,
            "rms_norm_rows: weight has {} values, rows have {cols}",
            weight.rows * weight.cols
        );
        let mut y = self.new_tensor(x.rows, cols)?;
        if x.rows == 0 {
            return Ok(y);
        }
        let f = self.kernels.get("elementwise", "rms_norm_rows_bf16")?;
        let (rows, c32) = (x.rows as i64, cols as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.buf)
            .arg(&weight.buf)
            .arg(&mut y.buf)
            .arg(&rows)
            .arg(&c32)
            .arg(&eps);
        // SAFETY: (const bf16*, const bf16*, bf16*, ll, int, float); one warp per row, 8 per block;
        // cols is a multiple of 256 up to 4096 (the kernel's RMS_MAX_CHUNKS = 16 chunks per lane).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks(x.rows, 8), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("rms_norm_rows_bf16"))?;
        Ok(y)
    }

    /// Causal attention over packed sequences (as [`Backend::attention_varlen`]) reading q, k and
    /// v straight from the columns of a fused QKV output `[T, (H + 2·Hkv)·hd]` (no split copies).
    /// Head dims 64 and 128.
    pub fn attention_varlen_packed(
        &self,
        qkv: &CudaTensor,
        shape: AttnShape,
        seq_starts: &[usize],
    ) -> Result<CudaTensor> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        ensure!(
            qkv.cols == (heads + 2 * kv_heads) * hd,
            "attention_varlen_packed: {} columns, expected (heads {heads} + 2 × {kv_heads}) × {hd}",
            qkv.cols
        );
        ensure!(
            matches!(hd, 64 | 128) && !self.attn_v1.load(std::sync::atomic::Ordering::Relaxed),
            "attention_varlen_packed: needs flash_attention2 (head_dim 64 or 128), got {hd}"
        );
        let base = self.ptr(&qkv.buf);
        let rows = qkv.rows;
        let io = AttnIo {
            q: base,
            q_ld: qkv.cols,
            k: base + (heads * hd * 2) as u64,
            v: base + ((heads + kv_heads) * hd * 2) as u64,
            kv_ld: qkv.cols,
            tq: rows,
            tk: rows,
        };
        self.attention_raw(
            io,
            shape,
            MaskKey::Varlen(seq_starts.to_vec()),
            || Self::varlen_intervals(seq_starts, rows),
            true,
        )
    }

    /// SwiGLU of a fused gate|up output `[T, 2·I]` → `[T, I]` (same arithmetic as
    /// [`Backend::swiglu`] on the two halves).
    pub fn swiglu_packed(&self, gu: &CudaTensor) -> Result<CudaTensor> {
        ensure!(
            gu.cols.is_multiple_of(2),
            "swiglu_packed: {} columns is not gate|up",
            gu.cols
        );
        let inter = gu.cols / 2;
        let mut y = self.new_tensor(gu.rows, inter)?;
        let n = gu.rows * inter;
        if n == 0 {
            return Ok(y);
        }
        // kernels/fused.cu: 2-D grid, rows on y (grid-stride past 65 535), 8 columns per thread.
        let f = self.kernels.get("elementwise", "swiglu_packed_rows_bf16")?;
        let cfg = LaunchConfig {
            grid_dim: (blocks(inter.div_ceil(8), 256), gu.rows.min(65535) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rows, i32c) = (gu.rows as i64, inter as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&gu.buf).arg(&mut y.buf).arg(&rows).arg(&i32c);
        // SAFETY: (const bf16*, bf16*, ll, int); gu holds rows × 2·inter values.
        unsafe { b.launch(cfg) }.map_err(derr("swiglu_packed_rows_bf16"))?;
        Ok(y)
    }

    /// Copies columns `src_col0..src_col0 + cols` of rows of `src` (all of them, or those listed in
    /// `idx`) into columns `dst_col0..dst_col0 + cols` of `dst`.
    #[allow(clippy::too_many_arguments)]
    fn copy_rows(
        &self,
        dst: &mut CudaSlice<bf16>,
        dst_ld: usize,
        dst_col0: usize,
        src: &CudaSlice<bf16>,
        src_ld: usize,
        src_col0: usize,
        idx: Option<&CudaSlice<u32>>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
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
        let idx_ptr: u64 = idx.map(|i| self.ptr(i)).unwrap_or(0);
        let mut b = self.stream.launch_builder(&f);
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

    /// Key intervals of each query row: `[lo1, hi1, lo2, hi2]` (the kernel's whole view of a mask).
    fn mask_intervals(mask: &AttnMask, tq: usize, tk: usize) -> Result<Vec<i32>> {
        let mut r = Vec::with_capacity(tq * 4);
        match mask {
            AttnMask::Causal { q_start } => {
                ensure!(
                    q_start + tq <= tk,
                    "attention: causal queries end at {} but only {tk} keys exist",
                    q_start + tq
                );
                for i in 0..tq {
                    r.extend_from_slice(&[0, (q_start + i + 1) as i32, 0, 0]);
                }
            }
            AttnMask::Blocks {
                ctx_len,
                block,
                anchors,
                ctx_inclusive,
                causal_in_block,
                window,
            } => {
                let (ctx_len, block, n) = (*ctx_len, *block, anchors.len());
                ensure!(block > 0, "attention: block size 0");
                ensure!(
                    tq == n * block,
                    "attention: {tq} query rows for {n} blocks of {block}"
                );
                ensure!(
                    tk == ctx_len + n * block,
                    "attention: {tk} keys, expected {ctx_len} context + {} block rows",
                    n * block
                );
                for (b, &a) in anchors.iter().enumerate() {
                    let ctx_hi = if *ctx_inclusive {
                        (a + 1).min(ctx_len)
                    } else {
                        a.min(ctx_len)
                    };
                    for o in 0..block {
                        let qpos = a + o;
                        let (mut lo1, hi1) = (0usize, ctx_hi);
                        let (mut olo, ohi) = (0usize, if *causal_in_block { o + 1 } else { block });
                        if let Some(w) = window {
                            // key position >= qpos - (w - 1)
                            lo1 = lo1.max((qpos + 1).saturating_sub(*w));
                            olo = olo.max((o + 1).saturating_sub(*w));
                        }
                        let (lo1, hi1) = if lo1 < hi1 { (lo1, hi1) } else { (0, 0) };
                        let base = ctx_len + b * block;
                        let (lo2, hi2) = if olo < ohi {
                            (base + olo, base + ohi)
                        } else {
                            (0, 0)
                        };
                        r.extend_from_slice(&[lo1 as i32, hi1 as i32, lo2 as i32, hi2 as i32]);
                    }
                }
            }
        }
        Ok(r)
    }

    fn varlen_intervals(seq_starts: &[usize], rows: usize) -> Result<Vec<i32>> {
        ensure!(
            seq_starts.first() == Some(&0) && seq_starts.last() == Some(&rows),
            "attention_varlen: sequence starts must run from 0 to {rows}, got {:?}..{:?}",
            seq_starts.first(),
            seq_starts.last()
        );
        let mut r = Vec::with_capacity(rows * 4);
        for w in seq_starts.windows(2) {
            ensure!(
                w[0] <= w[1],
                "attention_varlen: sequence starts are not increasing"
            );
            for i in w[0]..w[1] {
                r.extend_from_slice(&[w[0] as i32, (i + 1) as i32, 0, 0]);
            }
        }
        Ok(r)
    }

    /// Selects the attention kernel for head dims 64 and 128: `flash_attention2` (the default) or,
    /// with `v1 = true`, the first kernel (64-row blocks, single-buffered) — for A/B benchmarks.
    pub fn set_attention_v1(&self, v1: bool) {
        self.attn_v1.store(v1, std::sync::atomic::Ordering::Relaxed);
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_with(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        key: MaskKey,
        intervals: impl FnOnce() -> Result<Vec<i32>>,
        reverse: bool,
    ) -> Result<CudaTensor> {
        shape.check((q.rows, q.cols), (k.rows, k.cols), (v.rows, v.cols))?;
        let io = AttnIo {
            q: self.ptr(&q.buf),
            q_ld: q.cols,
            k: self.ptr(&k.buf),
            v: self.ptr(&v.buf),
            kv_ld: k.cols,
            tq: q.rows,
            tk: k.rows,
        };
        self.attention_raw(io, shape, key, intervals, reverse)
    }

    /// Attention over q/k/v given as device pointers with row strides (`q_ld`, `kv_ld` elements),
    /// so that they may be column slices of one fused QKV output. Output `[tq, heads·hd]`.
    fn attention_raw(
        &self,
        io: AttnIo,
        shape: AttnShape,
        key: MaskKey,
        intervals: impl FnOnce() -> Result<Vec<i32>>,
        reverse: bool,
    ) -> Result<CudaTensor> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        ensure!(
            kv_heads > 0 && heads % kv_heads == 0,
            "attention: {heads} heads not divisible by {kv_heads} KV heads"
        );
        let group = heads / kv_heads;
        ensure!(
            group <= 64,
            "attention: {group} query heads per KV head (at most 64 supported)"
        );
        ensure!(
            io.tk < i32::MAX as usize && io.tq < i32::MAX as usize,
            "attention: too many rows"
        );
        let v2 = matches!(hd, 64 | 128) && !self.attn_v1.load(std::sync::atomic::Ordering::Relaxed);
        let func = match (hd, v2) {
            (64, true) => "flash_attention2_hd64",
            (128, true) => "flash_attention2_hd128",
            (64, false) => "flash_attention_hd64",
            (128, false) => "flash_attention_hd128",
            (256, _) => "flash_attention_hd256",
            _ => {
                bail!("attention: head_dim {hd} is not supported by the CUDA kernel (64, 128, 256)")
            }
        };
        ensure!(
            v2 || (io.q_ld == heads * hd && io.kv_ld == kv_heads * hd),
            "attention: strided q/k/v need head_dim 64 or 128"
        );
        let mut out = self.new_tensor(io.tq, heads * hd)?;
        if io.tq == 0 {
            return Ok(out);
        }
        let mut cache = self.mask_cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.as_ref().map(|c| c.key != key).unwrap_or(true) {
            let iv = intervals()?;
            ensure!(
                iv.len() == io.tq * 4,
                "attention: mask covers {} rows, q has {}",
                iv.len() / 4,
                io.tq
            );
            let ranges = self.upload(&iv)?;
            *cache = Some(MaskUpload {
                key,
                host: iv,
                ranges,
                orders: Vec::new(),
            });
        }
        let up = cache.as_mut().expect("mask cache was just filled");
        let (tq, tk, h, hkv) = (io.tq as i32, io.tk as i32, heads as i32, kv_heads as i32);
        let scale_log2 = std::f32::consts::LOG2_E / (hd as f32).sqrt();
        if v2 {
            let ppb = 128 / group;
            if !up.orders.iter().any(|(p, _)| *p == ppb) {
                let order = heaviest_first(&up.host, ppb);
                let dev = self.upload(&order)?;
                up.orders.push((ppb, dev));
            }
            let order = &up
                .orders
                .iter()
                .find(|(p, _)| *p == ppb)
                .expect("inserted above")
                .1;
            let smem = (128 + 4 * 64) * hd * 2;
            let f = self.kernels.get_with_smem("attention", func, smem)?;
            let grid = io.tq.div_ceil(ppb) * kv_heads;
            ensure!(grid < i32::MAX as usize, "attention: grid too large");
            let (q_ld, kv_ld) = (io.q_ld as i64, io.kv_ld as i64);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&io.q)
                .arg(&io.k)
                .arg(&io.v)
                .arg(&mut out.buf)
                .arg(&up.ranges)
                .arg(order)
                .arg(&tq)
                .arg(&tk)
                .arg(&h)
                .arg(&hkv)
                .arg(&q_ld)
                .arg(&kv_ld)
                .arg(&scale_log2);
            // SAFETY: signature matches ATT2_ENTRY in kernels/attention.cu; q/k/v address tq/tk
            // rows of the given strides (checked by the callers); the intervals are clipped to
            // [0, tk]; `order` is a permutation of the tq.div_ceil(ppb) query blocks.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (grid as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: smem as u32,
                })
            }
            .map_err(derr(func))?;
            return Ok(out);
        }
        let smem = 3 * 64 * hd * 2;
        let f = self.kernels.get_with_smem("attention", func, smem)?;
        let ppb = 64 / group;
        let grid_x = io.tq.div_ceil(ppb);
        ensure!(
            grid_x < i32::MAX as usize && kv_heads < 65536,
            "attention: grid too large"
        );
        let rev = reverse as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&io.q)
            .arg(&io.k)
            .arg(&io.v)
            .arg(&mut out.buf)
            .arg(&up.ranges)
            .arg(&tq)
            .arg(&tk)
            .arg(&h)
            .arg(&hkv)
            .arg(&scale_log2)
            .arg(&rev);
        // SAFETY: signature matches ATT_ENTRY in kernels/attention.cu; contiguous q/k/v of the
        // shapes checked above; the intervals are clipped to [0, tk].
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (grid_x as u32, kv_heads as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(derr(func))?;
        Ok(out)
    }

    /// [`Backend::rms_norm`] with the grouped kernel (one warp per group of any width).
    fn rms_norm_groups(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        ensure!(
            group > 0 && x.cols.is_multiple_of(group),
            "rms_norm: {} columns are not a multiple of group {group}",
            x.cols
        );
        ensure!(
            weight.rows * weight.cols == group,
            "rms_norm: weight has {} values, group is {group}",
            weight.rows * weight.cols
        );
        ensure!(group < i32::MAX as usize, "rms_norm: group too large");
        let mut y = self.new_tensor(x.rows, x.cols)?;
        let n_groups = x.rows * (x.cols / group);
        if n_groups == 0 {
            return Ok(y);
        }
        let f = self.kernels.get("elementwise", "rms_norm_bf16")?;
        let (ng, g) = (n_groups as i64, group as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.buf)
            .arg(&weight.buf)
            .arg(&mut y.buf)
            .arg(&ng)
            .arg(&g)
            .arg(&eps);
        // SAFETY: (const bf16*, const bf16*, bf16*, ll, int, float); one warp per group, 8 per block.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks(n_groups, 8), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("rms_norm_bf16"))?;
        Ok(y)
    }

    fn unary_launch(
        &self,
        func: &'static str,
        n: usize,
        per_thread: usize,
    ) -> Result<(cudarc::driver::CudaFunction, LaunchConfig)> {
        let f = self.kernels.get("elementwise", func)?;
        Ok((
            f,
            LaunchConfig {
                grid_dim: (blocks(n.div_ceil(per_thread), 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
        ))
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Matrix = CudaMatrix;
    type F32Buf = gdn::CudaF32;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn dtype(&self) -> &'static str {
        "bf16"
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        ensure!(
            data.len() == rows * cols,
            "tensor data has {} values, shape [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        );
        let h: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
        Ok(CudaTensor {
            buf: self.upload(&h)?,
            rows,
            cols,
        })
    }
    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        Ok(self.to_host_bf16(t)?.into_iter().map(f32::from).collect())
    }
    fn dims(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }
    fn matrix(&self, data: &[f32], out: usize, inp: usize) -> Result<CudaMatrix> {
        ensure!(
            data.len() == out * inp,
            "weight data has {} values, shape [{out}, {inp}] needs {}",
            data.len(),
            out * inp
        );
        let h: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
        Ok(CudaMatrix {
            buf: self.upload(&h)?,
            out,
            inp,
        })
    }
    fn matrix_dims(&self, m: &CudaMatrix) -> (usize, usize) {
        (m.out, m.inp)
    }
    // Raw weight upload and free memory: upload.rs.
    fn matrix_stacked_raw(&self, parts: &[super::raw::RawPart<'_>]) -> Result<CudaMatrix> {
        self.upload_stacked(parts)
    }
    fn free_memory(&self) -> Option<u64> {
        self.free_device_memory()
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaMatrix) -> Result<CudaTensor> {
        ensure!(
            x.cols == w.inp,
            "matmul: input has {} columns, weight expects {}",
            x.cols,
            w.inp
        );
        let y = self.new_tensor(x.rows, w.out)?;
        if x.rows <= MAX_DECODE_ROWS {
            // Batch-invariant: a row's bits do not depend on its batch-mates (decode.rs).
            self.decode_gemm_raw(
                self.ptr(&x.buf),
                x.rows,
                self.ptr(&w.buf),
                w.out,
                w.inp,
                self.ptr(&y.buf),
                w.out,
                decode::Epilogue::Bf16,
            )?;
            return Ok(y);
        }
        self.gemm_raw(
            self.ptr(&x.buf),
            x.rows,
            self.ptr(&w.buf),
            w.out,
            w.inp,
            self.ptr(&y.buf),
            blas_sys::cudaDataType::CUDA_R_16BF,
            0.0,
        )?;
        Ok(y)
    }

    fn add_row_bias(&self, x: &mut CudaTensor, bias: &CudaTensor) -> Result<()> {
        ensure!(
            bias.rows * bias.cols == x.cols,
            "bias has {} values, rows have {}",
            bias.rows * bias.cols,
            x.cols
        );
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        let (f, cfg) = self.unary_launch("add_row_bias_bf16", n, 1)?;
        let (rows, cols) = (x.rows as i64, x.cols as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut x.buf).arg(&bias.buf).arg(&rows).arg(&cols);
        // SAFETY: (bf16*, const bf16*, ll, int), sizes checked.
        unsafe { b.launch(cfg) }.map_err(derr("add_row_bias_bf16"))?;
        Ok(())
    }

    fn add_inplace(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        ensure!(
            (x.rows, x.cols) == (y.rows, y.cols),
            "add: shapes [{}, {}] and [{}, {}] differ",
            x.rows,
            x.cols,
            y.rows,
            y.cols
        );
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        let (f, cfg) = self.unary_launch("add_bf16", n, 8)?;
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut x.buf).arg(&y.buf).arg(&n64);
        // SAFETY: (bf16*, const bf16*, ll), equal sizes.
        unsafe { b.launch(cfg) }.map_err(derr("add_bf16"))?;
        Ok(())
    }

    /// Whole-row norms (group = cols) go to [`CudaBackend::rms_norm_rows`] when its
    /// preconditions hold (bit-identical, one read of each row with every load in flight at once:
    /// the layer norms of every forward); per-head norms to the grouped kernel.
    fn rms_norm(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        if group == x.cols && Self::rows_kernel_fits(x.cols) {
            self.rms_norm_rows(x, weight, eps)
        } else {
            self.rms_norm_groups(x, weight, eps, group)
        }
    }

    fn rope_inplace(&self, x: &mut CudaTensor, positions: &[u32], rope: &Rope) -> Result<()> {
        ensure!(
            positions.len() == x.rows,
            "rope: {} positions for {} rows",
            positions.len(),
            x.rows
        );
        ensure!(
            rope.head_dim > 0 && x.cols.is_multiple_of(rope.head_dim),
            "rope: {} columns are not whole heads of {}",
            x.cols,
            rope.head_dim
        );
        ensure!(
            rope.rotary_dim <= rope.head_dim && rope.rotary_dim.is_multiple_of(2),
            "rope: bad rotary_dim {}",
            rope.rotary_dim
        );
        let half = rope.rotary_dim / 2;
        let n_heads = x.cols / rope.head_dim;
        let total = x.rows * n_heads * half;
        if total == 0 {
            return Ok(());
        }
        self.with_rope_tables(positions, rope, |pos, freqs| {
            let f = self.kernels.get("elementwise", "rope_bf16")?;
            let (rows, nh, hd, rd) = (
                x.rows as i32,
                n_heads as i32,
                rope.head_dim as i32,
                rope.rotary_dim as i32,
            );
            let inter = matches!(rope.style, RopeStyle::Interleaved) as i32;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&mut x.buf)
                .arg(pos)
                .arg(freqs)
                .arg(&rows)
                .arg(&nh)
                .arg(&hd)
                .arg(&rd)
                .arg(&inter);
            // SAFETY: (bf16*, const u32*, const float*, int x5); one thread per rotated pair.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (blocks(total, 256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("rope_bf16"))?;
            Ok(())
        })
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<CudaTensor> {
        let (tq, tk) = (q.rows, k.rows);
        let reverse = matches!(mask, AttnMask::Causal { .. });
        self.attention_with(
            q,
            k,
            v,
            shape,
            MaskKey::Mask(mask.clone(), tq, tk),
            || Self::mask_intervals(mask, tq, tk),
            reverse,
        )
    }

    fn attention_varlen(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        seq_starts: &[usize],
    ) -> Result<CudaTensor> {
        ensure!(
            q.rows == k.rows,
            "attention_varlen: q has {} rows, k/v {}",
            q.rows,
            k.rows
        );
        let rows = q.rows;
        self.attention_with(
            q,
            k,
            v,
            shape,
            MaskKey::Varlen(seq_starts.to_vec()),
            || Self::varlen_intervals(seq_starts, rows),
            true,
        )
    }

    /// Fused path ([`CudaBackend::qk_norm_rope_packed`] in place, then
    /// [`CudaBackend::attention_varlen_packed`] reading q/k/v from the QKV columns) when the
    /// model has q/k norms and flash_attention2 covers the head dim (64, 128); else the unfused
    /// composition.
    fn attention_varlen_qkv(
        &self,
        mut qkv: CudaTensor,
        shape: AttnShape,
        qk_norm: Option<QkNorm<'_, CudaTensor>>,
        positions: &[u32],
        rope: &Rope,
        seq_starts: &[usize],
    ) -> Result<CudaTensor> {
        let fused_attention = matches!(shape.head_dim, 64 | 128)
            && !self.attn_v1.load(std::sync::atomic::Ordering::Relaxed);
        match qk_norm {
            Some(n) if fused_attention => {
                self.qk_norm_rope_packed(&mut qkv, shape, n.q, n.k, n.eps, positions, rope)?;
                self.attention_varlen_packed(&qkv, shape, seq_starts)
            }
            _ => {
                attention_varlen_qkv_unfused(self, qkv, shape, qk_norm, positions, rope, seq_starts)
            }
        }
    }

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        ensure!(
            (gate.rows, gate.cols) == (up.rows, up.cols),
            "swiglu: gate and up shapes differ"
        );
        let mut y = self.new_tensor(gate.rows, gate.cols)?;
        let n = gate.rows * gate.cols;
        if n == 0 {
            return Ok(y);
        }
        let (f, cfg) = self.unary_launch("swiglu_bf16", n, 8)?;
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&gate.buf).arg(&up.buf).arg(&mut y.buf).arg(&n64);
        // SAFETY: (const bf16*, const bf16*, bf16*, ll), equal sizes.
        unsafe { b.launch(cfg) }.map_err(derr("swiglu_bf16"))?;
        Ok(y)
    }

    /// [`CudaBackend::swiglu_packed`]: reads gate and up from the fused output in place.
    fn swiglu_packed(&self, gu: &CudaTensor) -> Result<CudaTensor> {
        CudaBackend::swiglu_packed(self, gu)
    }

    /// [`CudaBackend::matmul_acc`]: the residual add in the GEMM epilogue.
    fn matmul_acc(&self, x: &CudaTensor, w: &CudaMatrix, acc: &mut CudaTensor) -> Result<()> {
        CudaBackend::matmul_acc(self, x, w, acc)
    }

    fn embed(&self, table: &CudaMatrix, ids: &[u32]) -> Result<CudaTensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.out) {
            bail!(
                "token id {bad} is outside the embedding table ({} rows)",
                table.out
            );
        }
        let mut y = self.new_tensor(ids.len(), table.inp)?;
        if ids.is_empty() {
            return Ok(y);
        }
        let idx = self.upload(ids)?;
        self.copy_rows(
            &mut y.buf,
            table.inp,
            0,
            &table.buf,
            table.inp,
            0,
            Some(&idx),
            ids.len(),
            table.inp,
        )?;
        Ok(y)
    }

    fn concat_rows(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let cols = parts.first().map(|p| p.cols).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| p.cols == cols),
            "concat_rows: column counts differ"
        );
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let mut y = self.new_tensor(rows, cols)?;
        let mut off = 0;
        for p in parts {
            let n = p.rows * p.cols;
            if n > 0 {
                self.stream
                    .memcpy_dtod(&p.buf.slice(0..n), &mut y.buf.slice_mut(off..off + n))
                    .map_err(derr("device copy"))?;
            }
            off += n;
        }
        Ok(y)
    }

    fn concat_cols(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let rows = parts.first().map(|p| p.rows).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| p.rows == rows),
            "concat_cols: row counts differ"
        );
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut y = self.new_tensor(rows, cols)?;
        let mut c0 = 0;
        for p in parts {
            self.copy_rows(&mut y.buf, cols, c0, &p.buf, p.cols, 0, None, rows, p.cols)?;
            c0 += p.cols;
        }
        Ok(y)
    }

    fn split_cols(&self, x: &CudaTensor, widths: &[usize]) -> Result<Vec<CudaTensor>> {
        CudaBackend::split_cols(self, x, widths)
    }

    /// [`MAX_DECODE_ROWS`]: up to 64 rows every GEMM runs on the batch-invariant decode kernel
    /// (decode.rs) and every other op already works row by row (one warp, block or thread per
    /// row or element; attention per sequence).
    fn max_independent_rows(&self) -> usize {
        MAX_DECODE_ROWS
    }

    /// In place, with spare capacity (KV caches): decode.rs.
    fn append_rows(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        self.append_rows_in_place(x, y)
    }

    /// All sequences in one launch (decode.rs, `kernels/decode_attention.cu`).
    fn attention_decode(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, CudaTensor>],
    ) -> Result<CudaTensor> {
        self.attention_decode_batched(q, k, v, shape, caches)
    }

    fn slice_rows(&self, x: &CudaTensor, start: usize, end: usize) -> Result<CudaTensor> {
        ensure!(
            start <= end && end <= x.rows,
            "slice_rows {start}..{end} out of {} rows",
            x.rows
        );
        let mut y = self.new_tensor(end - start, x.cols)?;
        let n = (end - start) * x.cols;
        if n > 0 {
            self.stream
                .memcpy_dtod(
                    &x.buf.slice(start * x.cols..end * x.cols),
                    &mut y.buf.slice_mut(0..n),
                )
                .map_err(derr("device copy"))?;
        }
        Ok(y)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[u32]) -> Result<CudaTensor> {
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= x.rows) {
            bail!("gather_rows: row {bad} out of {}", x.rows);
        }
        let mut y = self.new_tensor(rows.len(), x.cols)?;
        if rows.is_empty() {
            return Ok(y);
        }
        let idx = self.upload(rows)?;
        self.copy_rows(
            &mut y.buf,
            x.cols,
            0,
            &x.buf,
            x.cols,
            0,
            Some(&idx),
            rows.len(),
            x.cols,
        )?;
        Ok(y)
    }

    fn lm_head_topk(&self, x: &CudaTensor, head: &CudaMatrix, k: usize) -> Result<TopK> {
        ensure!(
            x.cols == head.inp,
            "lm_head: hidden has {} columns, head expects {}",
            x.cols,
            head.inp
        );
        let vocab = head.out;
        ensure!(
            vocab > 0 && vocab < i32::MAX as usize,
            "lm_head: vocabulary of {vocab} rows"
        );
        let k = k.clamp(1, vocab);
        let func = match k {
            1..=8 => "topk_logsoftmax_k8",
            9..=16 => "topk_logsoftmax_k16",
            17..=32 => "topk_logsoftmax_k32",
            33..=64 => "topk_logsoftmax_k64",
            _ => bail!("lm_head_topk: k = {k} is above the CUDA kernel's limit of 64"),
        };
        let rows = x.rows;
        if rows == 0 {
            return Ok(TopK {
                rows: 0,
                k,
                ids: vec![],
                logprobs: vec![],
            });
        }
        // fp32 logits for at most `chunk` rows at a time (≤ 1 GiB of scratch).
        let chunk = rows.min(((1usize << 30) / (vocab * 4)).max(1));
        let scratch = self.alloc::<f32>(chunk * vocab)?;
        let ids = self.alloc::<u32>(rows * k)?;
        let lps = self.alloc::<f32>(rows * k)?;
        let f = self.kernels.get("topk", func)?;
        let (xp, wp, sp, ip, lp) = (
            self.ptr(&x.buf),
            self.ptr(&head.buf),
            self.ptr(&scratch),
            self.ptr(&ids),
            self.ptr(&lps),
        );
        let mut start = 0;
        while start < rows {
            let n = chunk.min(rows - start);
            if rows <= MAX_DECODE_ROWS {
                // Batch-invariant logits (decode.rs): decode steps of any batch size agree.
                self.decode_gemm_raw(
                    xp + (start * x.cols * 2) as u64,
                    n,
                    wp,
                    vocab,
                    head.inp,
                    sp,
                    vocab,
                    decode::Epilogue::F32,
                )?;
            } else {
                self.gemm_raw(
                    xp + (start * x.cols * 2) as u64,
                    n,
                    wp,
                    vocab,
                    head.inp,
                    sp,
                    blas_sys::cudaDataType::CUDA_R_32F,
                    0.0,
                )?;
            }
            let (ld, v32, k32) = (vocab as i64, vocab as i32, k as i32);
            let (ipo, lpo) = (ip + (start * k * 4) as u64, lp + (start * k * 4) as u64);
            let mut b = self.stream.launch_builder(&f);
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
            .map_err(derr(func))?;
            start += n;
        }
        let mut out_ids = vec![0u32; rows * k];
        let mut out_lp = vec![0f32; rows * k];
        self.stream
            .memcpy_dtoh(&ids.slice(0..rows * k), &mut out_ids)
            .map_err(derr("device-to-host copy"))?;
        self.stream
            .memcpy_dtoh(&lps.slice(0..rows * k), &mut out_lp)
            .map_err(derr("device-to-host copy"))?;
        self.synchronize()?;
        drop(scratch);
        Ok(TopK {
            rows,
            k,
            ids: out_ids,
            logprobs: out_lp,
        })
    }

    // ---- Hybrid-layer ops: kernels/gdn.cu through gdn.rs (docs/gdn-cuda.md).
    fn f32_from_host(&self, data: &[f32]) -> Result<gdn::CudaF32> {
        self.gdn_f32_from_host(data)
    }
    fn f32_to_host(&self, b: &gdn::CudaF32) -> Result<Vec<f32>> {
        self.gdn_f32_to_host(b)
    }
    fn f32_copy(&self, b: &gdn::CudaF32) -> Result<gdn::CudaF32> {
        self.gdn_f32_copy(b)
    }
    fn rms_norm_zero_centred(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        self.gdn_rms_norm_zc(x, weight, eps, group)
    }
    fn gated_rms_norm(
        &self,
        x: &CudaTensor,
        z: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        self.gdn_gated_rms_norm(x, z, weight, eps, group)
    }
    fn sigmoid_gate_inplace(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<()> {
        self.gdn_sigmoid_gate(x, gate)
    }
    fn causal_conv1d_silu(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        seq_starts: &[usize],
        states: &mut [&mut CudaTensor],
    ) -> Result<CudaTensor> {
        self.gdn_conv1d_silu(x, weight, seq_starts, states)
    }
    fn gated_delta_rule(
        &self,
        qkv: &CudaTensor,
        a: &CudaTensor,
        b: &CudaTensor,
        params: &super::GdnParams<'_, Self>,
        seq_starts: &[usize],
        states: &mut [&mut gdn::CudaF32],
    ) -> Result<CudaTensor> {
        gdn::gated_delta_rule(self, qkv, a, b, params, seq_starts, states)
    }
}
