//! Finding CUDA: the libraries are `dlopen`ed before cudarc touches them (a missing library
//! panics inside cudarc), the device is counted, and [`CudaBackend::new`] opens it. Every failure
//! here is [`BackendError::CudaUnavailable`] ("CUDA unavailable: <reason>").

use super::gemm::Gemms;
use super::kernels::Kernels;
use super::{blas_err, derr, CudaBackend, DeviceInfo};
use crate::backend::BackendError;
use anyhow::Result;
use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// The error of a machine without usable CUDA.
pub(super) fn unavailable(reason: String) -> anyhow::Error {
    BackendError::CudaUnavailable(reason).into()
}

/// Directories tried when a library is not found by its plain name (LD_LIBRARY_PATH unset).
pub(super) fn library_dirs() -> Vec<String> {
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
pub(super) fn preload(what: &str, names: &[&str]) -> std::result::Result<String, String> {
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
pub(super) fn probe_libraries() -> std::result::Result<(), String> {
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

pub(super) fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
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

impl CudaBackend {
    /// Opens device `ordinal`. When the machine has no usable CUDA (no driver, no NVRTC/cuBLAS,
    /// no device) the error is [`BackendError::CudaUnavailable`] ("CUDA unavailable: <reason>"),
    /// which callers can print as is.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        availability(ordinal).map_err(unavailable)?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|p| {
                unavailable(format!(
                    "creating a context on device {ordinal} panicked: {}",
                    panic_text(p)
                ))
            })?
            .map_err(|e| unavailable(format!("creating a context on device {ordinal}: {e}")))?;
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
            .map_err(|p| unavailable(format!("cuBLAS initialisation panicked: {}", panic_text(p))))?
            .map_err(|e| unavailable(format!("cuBLAS initialisation failed: {:?}", e.0)))?;
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
        let dependent_launch = std::sync::atomic::AtomicBool::new(
            super::launch::dependent_launches(info.compute_capability),
        );
        let attn_wgmma = std::sync::atomic::AtomicBool::new(
            super::attention::wgmma_attention_from_env(info.compute_capability),
        );
        let kernels = Kernels::new(ctx.clone())?;
        let machine = format!(
            "{} sm_{}{} driver {}",
            info.name, info.compute_capability.0, info.compute_capability.1, info.driver_version
        );
        let gemm = Gemms::new(&stream, &machine, super::kernels::disk_cache_dir());
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            kernels,
            info,
            mask_cache: Mutex::new(None),
            attn_v1: std::sync::atomic::AtomicBool::new(false),
            attn_wgmma,
            gemm,
            pos_cache: Mutex::new(None),
            cs_cache: Mutex::new(None),
            q_norm_in_attention: std::sync::atomic::AtomicBool::new(true),
            freq_cache: Mutex::new(Vec::new()),
            f32_tables: Mutex::new(Vec::new()),
            decode: Default::default(),
            tap_staging: Mutex::new(None),
            moe: Default::default(),
            lm_head: Default::default(),
            step_graphs: Default::default(),
            dependent_launch,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
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
}
