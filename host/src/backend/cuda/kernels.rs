//! Kernel sources (embedded from `kernels/*.cu`), compiled by NVRTC at first use for the device's
//! architecture and cached per (module, arch, options): in memory for the life of the backend, and
//! as PTX on disk (`$DRAFTLENS_KERNEL_CACHE`, default `~/.cache/draftlens/kernels`) keyed by a
//! SHA-256 of source, arch and options, so a second process skips NVRTC.

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::CudaBackend;

const COMMON: &str = include_str!("../../../../kernels/common.cuh");

/// (module name, source) of every kernel module. `kernels/fused.cu` (the fused forward's SwiGLU) is
/// compiled as part of the `elementwise` module, `kernels/decode_attention.cu` as part of `decode`
/// (with `kernels/decode_gemm.cu`); their `#line` directives keep NVRTC's messages pointing at the
/// right file.
const SOURCES: &[(&str, &str)] = &[
    (
        "elementwise",
        concat!(
            include_str!("../../../../kernels/elementwise.cu"),
            "\n#line 1 \"kernels/fused.cu\"\n",
            include_str!("../../../../kernels/fused.cu")
        ),
    ),
    (
        "attention",
        include_str!("../../../../kernels/attention.cu"),
    ),
    ("topk", include_str!("../../../../kernels/topk.cu")),
    ("gdn", include_str!("../../../../kernels/gdn.cu")),
    ("convert", include_str!("../../../../kernels/convert.cu")),
    (
        "decode",
        concat!(
            include_str!("../../../../kernels/decode_gemm.cu"),
            "\n#line 1 \"kernels/decode_attention.cu\"\n",
            include_str!("../../../../kernels/decode_attention.cu")
        ),
    ),
];

pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    /// `compute_XY` of the device: NVRTC emits PTX for exactly this architecture and the driver
    /// turns it into the device's machine code when the module is loaded.
    arch: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
    smem_set: Mutex<Vec<(&'static str, usize)>>,
    /// Seconds spent in NVRTC + module loading (reported by the benchmarks and tests).
    compile_secs: Mutex<f64>,
}

fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-lineinfo".into(),
    ]
}

fn disk_cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("DRAFTLENS_KERNEL_CACHE") {
        return if d.is_empty() {
            None
        } else {
            Some(PathBuf::from(d))
        };
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/draftlens/kernels"))
}

impl Kernels {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| anyhow!("reading the compute capability: {e}"))?;
        Ok(Kernels {
            ctx,
            arch: format!("compute_{major}{minor}"),
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
            smem_set: Mutex::new(Vec::new()),
            compile_secs: Mutex::new(0.0),
        })
    }

    pub(crate) fn arch(&self) -> &str {
        &self.arch
    }

    pub(crate) fn compile_secs(&self) -> f64 {
        *self.compile_secs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn compile(&self, name: &'static str) -> Result<Arc<CudaModule>> {
        let t0 = std::time::Instant::now();
        let ptx_text = ptx_for(name, &self.arch)?;
        let module = self.ctx.load_module(Ptx::from_src(ptx_text)).map_err(|e| {
            anyhow!(
                "kernels/{name}.cu: loading the PTX for {} failed: {e}",
                self.arch
            )
        })?;
        *self.compile_secs.lock().unwrap_or_else(|e| e.into_inner()) += t0.elapsed().as_secs_f64();
        Ok(module)
    }

    /// The kernel `func` of module `module`, compiling the module on first use.
    pub(crate) fn get(&self, module: &'static str, func: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self
            .funcs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(func)
        {
            return Ok(f.clone());
        }
        let m = {
            let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match mods.get(module) {
                Some(m) => m.clone(),
                None => {
                    let m = self.compile(module)?;
                    mods.insert(module, m.clone());
                    m
                }
            }
        };
        let f = m
            .load_function(func)
            .map_err(|e| anyhow!("kernels/{module}.cu: no kernel {func}: {e}"))?;
        self.funcs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(func, f.clone());
        Ok(f)
    }

    /// Like [`Kernels::get`], and allows `smem` bytes of dynamic shared memory: static plus
    /// dynamic shared memory above 48 KiB needs an explicit opt-in per function, which is made
    /// once per (function, size).
    pub(crate) fn get_with_smem(
        &self,
        module: &'static str,
        func: &'static str,
        smem: usize,
    ) -> Result<CudaFunction> {
        let f = self.get(module, func)?;
        let mut done = self.smem_set.lock().unwrap_or_else(|e| e.into_inner());
        if !done.contains(&(func, smem)) {
            f.set_attribute(
                sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(|e| {
                anyhow!("{func}: cannot allow {smem} bytes of dynamic shared memory: {e}")
            })?;
            done.push((func, smem));
        }
        Ok(f)
    }

    /// Registers, local-memory bytes (spills) and static shared memory of a kernel, for diagnostics.
    pub(crate) fn resources(&self, module: &'static str, func: &'static str) -> Result<String> {
        let f = self.get(module, func)?;
        let regs = f.num_regs().context("num_regs")?;
        let local = f.local_size_bytes().context("local_size_bytes")?;
        let shared = f.shared_size_bytes().context("shared_size_bytes")?;
        Ok(format!(
            "{func}: {regs} registers, {local} B local (spill) memory, {shared} B static shared"
        ))
    }
}

/// Names of the kernel modules (`kernels/<name>.cu`).
pub(crate) fn module_names() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(n, _)| *n)
}

/// PTX of module `name` for `arch` (`compute_90`, ...): from the disk cache, else from NVRTC.
/// Needs only the NVRTC library, no driver or device.
pub(crate) fn ptx_for(name: &str, arch: &str) -> Result<String> {
    let src = SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .ok_or_else(|| anyhow!("no kernel module named {name}"))?;
    let full = format!("{COMMON}\n#line 1 \"kernels/{name}.cu\"\n{src}");
    let opts = options(arch);
    let key = {
        let mut h = Sha256::new();
        h.update(full.as_bytes());
        h.update(opts.join(" ").as_bytes());
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        hex::encode(&h.finalize()[..16])
    };
    let cached = disk_cache_dir().map(|d| d.join(format!("{name}-{arch}-{key}.ptx")));
    if let Some(text) = cached
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        return Ok(text);
    }
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(
        &full,
        CompileOptions {
            options: opts.clone(),
            name: Some(format!("{name}.cu")),
            ..Default::default()
        },
    )
    .map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            anyhow!(
                "kernels/{name}.cu: NVRTC failed for {arch} ({}):\n{}",
                opts.join(" "),
                log.to_string_lossy()
            )
        }
        other => anyhow!("kernels/{name}.cu: NVRTC failed: {other:?}"),
    })?;
    let text = ptx.to_src();
    if let Some(p) = &cached {
        // The cache is an optimisation: a read-only home must not stop the backend.
        let _ = p.parent().map(std::fs::create_dir_all);
        let _ = std::fs::write(p, &text);
    }
    Ok(text)
}

/// Compiles every kernel module with NVRTC for `arch` (e.g. `compute_90`) without a driver or a
/// device, returning (module, PTX bytes). Lets a machine with only the NVRTC library check that
/// the kernels compile.
pub fn compile_kernels_offline(arch: &str) -> Result<Vec<(String, usize)>> {
    super::probe::preload("NVRTC", &["libnvrtc.so.13", "libnvrtc.so"])
        .map_err(super::probe::unavailable)?;
    let mut out = Vec::new();
    for name in module_names() {
        let ptx = std::panic::catch_unwind(|| ptx_for(name, arch))
            .map_err(|p| anyhow!("NVRTC panicked: {}", super::probe::panic_text(p)))??;
        out.push((name.to_string(), ptx.len()));
    }
    Ok(out)
}

impl CudaBackend {
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
}
