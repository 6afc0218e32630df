//! Kernel sources (embedded from `kernels/*.cu`), compiled by NVRTC for the device's architecture
//! and cached per (module, arch, options): in memory for the life of the backend, and on disk
//! (`$DRAFTLENS_KERNEL_CACHE`, default `~/.cache/draftlens/kernels`) keyed by a SHA-256 of source,
//! arch and options, so a second process skips NVRTC. For a device the image is a CUBIN (machine
//! code: no driver JIT at load); the modules start compiling on four threads when the backend
//! is created, so the compile overlaps the model load instead of stalling the first launches.

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use super::CudaBackend;

const COMMON: &str = include_str!("../../../../../kernels/common.cuh");

/// (module name, source) of every kernel module. `kernels/fused.cu` (the fused forward's SwiGLU)
/// and `kernels/moe.cu` (the mixture of experts' routing and combine) are compiled as part of the
/// `elementwise` module, `kernels/moe_gemm.cu` (the experts' grouped GEMM) and `kernels/mxfp4.cu`
/// (its twin on packed MXFP4 experts) as part of `decode`, after `kernels/decode_gemm.cu` whose
/// device functions they use; their `#line` directives keep
/// NVRTC's messages pointing at the right file.
const SOURCES: &[(&str, &str)] = &[
    (
        "elementwise",
        concat!(
            include_str!("../../../../../kernels/elementwise.cu"),
            "\n#line 1 \"kernels/fused.cu\"\n",
            include_str!("../../../../../kernels/fused.cu"),
            "\n#line 1 \"kernels/moe.cu\"\n",
            include_str!("../../../../../kernels/moe.cu")
        ),
    ),
    (
        "attention",
        include_str!("../../../../../kernels/attention.cu"),
    ),
    ("topk", include_str!("../../../../../kernels/topk.cu")),
    ("gdn", include_str!("../../../../../kernels/gdn.cu")),
    ("convert", include_str!("../../../../../kernels/convert.cu")),
    // Two modules, so that an empty kernel cache compiles them on two prewarm threads at once.
    (
        "decode",
        concat!(
            include_str!("../../../../../kernels/decode_gemm.cu"),
            "\n#line 1 \"kernels/moe_gemm.cu\"\n",
            include_str!("../../../../../kernels/moe_gemm.cu"),
            "\n#line 1 \"kernels/mxfp4.cu\"\n",
            include_str!("../../../../../kernels/mxfp4.cu")
        ),
    ),
    (
        "decode_attention",
        include_str!("../../../../../kernels/decode_attention.cu"),
    ),
    (
        "lm_head_topk",
        include_str!("../../../../../kernels/lm_head_topk.cu"),
    ),
];

/// Modules for Hopper's arch-specific target only (`sm_90a`: the wgmma instructions), compiled
/// by NVRTC at their first use on a compute capability 9.0 device and cached on disk like the
/// others. They are not in [`module_names`]: no image ships for them (`kernel_images.rs` ships
/// the `sm_90` images of [`SOURCES`]), nothing prewarms them, and no other device loads them.
/// `kernels/attention_wgmma.cu`: the opt-in wgmma flash attention (`attention.rs`).
const SOURCES_SM90A: &[(&str, &str)] = &[(
    "attention_wgmma",
    include_str!("../../../../../kernels/attention_wgmma.cu"),
)];

/// The source of module `name`, from [`SOURCES`] or [`SOURCES_SM90A`].
fn source_of(name: &str) -> Option<&'static str> {
    SOURCES
        .iter()
        .chain(SOURCES_SM90A)
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
}

/// The NVRTC target of module `name` on a device of `arch` (`sm_XY`): `arch` itself, or for a
/// module of [`SOURCES_SM90A`] `sm_90a`, which only an `sm_90` device runs.
fn target_arch<'a>(name: &str, arch: &'a str) -> Result<&'a str> {
    if SOURCES_SM90A.iter().any(|(n, _)| *n == name) {
        anyhow::ensure!(
            arch == "sm_90",
            "kernels/{name}.cu needs sm_90a (compute capability 9.0), the device is {arch}"
        );
        return Ok("sm_90a");
    }
    Ok(arch)
}

/// How many modules compile at once when a backend starts.
const PREWARM_THREADS: usize = 4;

/// The order the prewarm threads take the modules in: what a model load and the first forward
/// launch first (dtype conversion, norms, prefill attention), then the longest compiles first
/// (gdn, decode_attention, decode, topk: the offline compile times in docs/benchmarks-cuda.md,
/// "Session 15", call 2), so four threads finish about when the slowest module alone would.
const PREWARM_ORDER: &[&str] = &[
    "convert",
    "elementwise",
    "attention",
    "gdn",
    "decode_attention",
    "decode",
    "topk",
    "lm_head_topk",
];

/// What NVRTC emits for a module: PTX for a virtual architecture (`compute_XY`, which needs no
/// device and is what [`compile_kernels_offline`](super::compile_kernels_offline) checks), or a
/// CUBIN for the device's real architecture (`sm_XY`). A CUBIN loads without the driver's PTX
/// JIT, which on an 8B `extract` with an empty driver cache cost seconds per module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageKind {
    Ptx,
    Cubin,
}

/// The compiled image of one module, shared between the prewarm thread that made it and the
/// launches that load it; the error is a message because it is reported by whoever asks first.
type ImageSlot = OnceLock<std::result::Result<Arc<Vec<u8>>, String>>;

pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    /// `sm_XY` of the device: NVRTC emits machine code for exactly this architecture.
    arch: String,
    /// One slot per entry of [`SOURCES`], filled by the prewarm threads started in
    /// [`Kernels::new`] (or by the first launch that needs the module, whichever comes first).
    images: Arc<Vec<ImageSlot>>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
    smem_set: Mutex<Vec<(&'static str, usize)>>,
    /// Seconds the launching thread spent waiting for images and loading modules (reported by the
    /// benchmarks and tests; the prewarm threads' own work overlaps the model load).
    compile_secs: Mutex<f64>,
    /// The prewarm threads, joined when the kernels are dropped: a process that exits while one
    /// of them is inside NVRTC tears the library down under it and dies of a segfault after its
    /// work is done (`cuda_decode`, whose tests never load the Gated DeltaNet module that takes
    /// longest to compile, did so on every cold kernel cache).
    prewarm: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for Kernels {
    fn drop(&mut self) {
        let threads = std::mem::take(&mut *self.prewarm.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-lineinfo".into(),
    ]
}

/// The kernel cache folder (`$DRAFTLENS_KERNEL_CACHE`; empty: none), also home of the
/// remembered GEMM choices (`gemm_choices`).
pub(super) fn disk_cache_dir() -> Option<PathBuf> {
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
    /// Starts compiling every module at once, one thread each: NVRTC is single-threaded per
    /// program, the modules are independent, and the model load that follows leaves the CPU
    /// mostly idle, so a cold kernel cache costs the slowest module instead of the sum of all
    /// seven (docs/benchmarks-cuda.md, "End to end, first round" and "End to end, second round").
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| anyhow!("reading the compute capability: {e}"))?;
        let arch = format!("sm_{major}{minor}");
        // One slot per module of SOURCES, then one per module of SOURCES_SM90A.
        let images: Arc<Vec<ImageSlot>> = Arc::new(
            SOURCES
                .iter()
                .chain(SOURCES_SM90A)
                .map(|_| OnceLock::new())
                .collect(),
        );
        // PREWARM_THREADS threads take the modules in PREWARM_ORDER. All seven at once held
        // every compile's working memory together while the model loaded (the fresh-machine
        // 8B `run` peaked at 2.07 GB of host memory against 1.76 GB with a warm kernel cache).
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut prewarm = Vec::new();
        for t in 0..PREWARM_THREADS {
            let (images, arch, next) = (images.clone(), arch.clone(), next.clone());
            // A thread that cannot start only loses the overlap: the first launch compiles.
            let spawned = std::thread::Builder::new()
                .name(format!("nvrtc-{t}"))
                .spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&name) = PREWARM_ORDER.get(i) else {
                        break;
                    };
                    if let Some(slot) = SOURCES.iter().position(|(n, _)| *n == name) {
                        images[slot].get_or_init(|| image_slot(name, &arch));
                        release_freed_heap();
                    }
                });
            prewarm.extend(spawned.ok());
        }
        Ok(Kernels {
            ctx,
            arch,
            images,
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
            smem_set: Mutex::new(Vec::new()),
            compile_secs: Mutex::new(0.0),
            prewarm: Mutex::new(prewarm),
        })
    }

    pub(crate) fn arch(&self) -> &str {
        &self.arch
    }

    pub(crate) fn compile_secs(&self) -> f64 {
        *self.compile_secs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn compile(&self, name: &'static str) -> Result<Arc<CudaModule>> {
        // Shown apart in `--timeline`: on a cold kernel cache the first forward waits here for
        // the slowest module's compile, not for the GPU.
        let _phase = crate::timeline::phase("kernel compile (wait)");
        let t0 = std::time::Instant::now();
        let slot = SOURCES
            .iter()
            .chain(SOURCES_SM90A)
            .position(|(n, _)| *n == name)
            .ok_or_else(|| anyhow!("no kernel module named {name}"))?;
        let arch = target_arch(name, &self.arch)?;
        // Waits for the prewarm thread if it is still compiling this module.
        let image = self.images[slot]
            .get_or_init(|| image_slot(name, arch))
            .clone()
            .map_err(|e| anyhow!(e))?;
        let load = |bytes: Vec<u8>| {
            self.ctx
                .load_module(Ptx::from_binary(bytes))
                .map_err(|e| anyhow!("kernels/{name}.cu: loading the CUBIN for {arch} failed: {e}"))
        };
        let module = match load(image.as_ref().clone()) {
            Ok(m) => m,
            // A shipped image this driver cannot load (one older than the NVRTC that made it):
            // the library here compiles the module instead.
            Err(e) => match compile_cubin_uncached(name, arch) {
                Ok(fresh) if fresh != *image => load(fresh)?,
                _ => return Err(e),
            },
        };
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
    /// dynamic shared memory above 48 KiB needs an explicit opt-in per function. The opt-in is
    /// one value per function, a ceiling, so it is raised to the largest size asked for so far and
    /// never lowered (lowering it would fail a later launch of a size allowed before).
    pub(crate) fn get_with_smem(
        &self,
        module: &'static str,
        func: &'static str,
        smem: usize,
    ) -> Result<CudaFunction> {
        let f = self.get(module, func)?;
        let mut allowed = self.smem_set.lock().unwrap_or_else(|e| e.into_inner());
        let entry = allowed.iter_mut().find(|(name, _)| *name == func);
        if entry.as_ref().is_none_or(|(_, max)| *max < smem) {
            f.set_attribute(
                sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(|e| {
                anyhow!("{func}: cannot allow {smem} bytes of dynamic shared memory: {e}")
            })?;
            match entry {
                Some((_, max)) => *max = smem,
                None => allowed.push((func, smem)),
            }
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

/// PTX of module `name` for a virtual architecture (`compute_90`, ...): from the disk cache, else
/// from NVRTC. Needs only the NVRTC library, no driver or device.
pub(crate) fn ptx_for(name: &str, arch: &str) -> Result<String> {
    let image = image_for(name, arch, ImageKind::Ptx)?;
    // NVRTC's PTX ends with a NUL.
    let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
    String::from_utf8(image[..end].to_vec())
        .map_err(|_| anyhow!("kernels/{name}.cu: NVRTC returned PTX that is not UTF-8"))
}

fn image_slot(name: &str, arch: &str) -> std::result::Result<Arc<Vec<u8>>, String> {
    image_for(name, arch, ImageKind::Cubin)
        .map(Arc::new)
        .map_err(|e| format!("{e:#}"))
}

/// The full source NVRTC compiles for module `name` (the common header first), its options for
/// `arch`, and its key: a SHA-256 of source, options and crate version, which names its images in
/// the disk cache and ties a shipped image to the source it was made from (`kernel_images.rs`).
fn module_source(name: &str, arch: &str) -> Result<(String, Vec<String>, String)> {
    let src = source_of(name).ok_or_else(|| anyhow!("no kernel module named {name}"))?;
    let full = format!("{COMMON}\n#line 1 \"kernels/{name}.cu\"\n{src}");
    let opts = options(arch);
    let key = {
        let mut h = Sha256::new();
        h.update(full.as_bytes());
        h.update(opts.join(" ").as_bytes());
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        hex::encode(&h.finalize()[..16])
    };
    Ok((full, opts, key))
}

/// [`module_source`]'s key of module `name` for `arch`.
pub(super) fn module_key(name: &str, arch: &str) -> Result<String> {
    module_source(name, arch).map(|(_, _, key)| key)
}

/// The CUBIN of module `name` for `arch` from NVRTC itself: no shipped image, no disk cache
/// (`tools/ship_kernel_images.sh` makes the shipped images with it).
pub(super) fn compile_cubin_uncached(name: &str, arch: &str) -> Result<Vec<u8>> {
    let (full, opts, _) = module_source(name, arch)?;
    nvrtc_compile(&full, name, &opts, ImageKind::Cubin)
}

/// The compiled image of module `name` for `arch` (`compute_XY` with [`ImageKind::Ptx`], `sm_XY`
/// with [`ImageKind::Cubin`]): the image that ships with the binary for this source and arch
/// (`kernel_images.rs`), else from the disk cache, else from NVRTC (then written to the cache).
pub(crate) fn image_for(name: &str, arch: &str, kind: ImageKind) -> Result<Vec<u8>> {
    let (full, opts, key) = module_source(name, arch)?;
    if kind == ImageKind::Cubin {
        if let Some(image) = super::kernel_images::shipped_image(name, arch, &key) {
            return Ok(image);
        }
    }
    let ext = match kind {
        ImageKind::Ptx => "ptx",
        ImageKind::Cubin => "cubin",
    };
    let cached = disk_cache_dir().map(|d| d.join(format!("{name}-{arch}-{key}.{ext}")));
    if let Some(bytes) = cached.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if !bytes.is_empty() {
            return Ok(bytes);
        }
    }
    let image = nvrtc_compile(&full, name, &opts, kind)?;
    if let Some(p) = &cached {
        // The cache is an optimisation: a read-only home must not stop the backend. Written to a
        // temp file and renamed, so a concurrent reader never sees half an image.
        let _ = p.parent().map(std::fs::create_dir_all);
        let tmp = p.with_extension(format!("{ext}.tmp.{}", std::process::id()));
        if std::fs::write(&tmp, &image).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(image)
}

/// One NVRTC compilation of `src` (named `kernels/<name>.cu` in messages) to PTX or CUBIN.
fn nvrtc_compile(src: &str, name: &str, opts: &[String], kind: ImageKind) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys as nv};
    use std::ffi::{CStr, CString};
    let c_src = CString::new(src).map_err(|_| anyhow!("kernels/{name}.cu contains a NUL byte"))?;
    let c_name = CString::new(format!("{name}.cu")).expect("module names have no NUL");
    let prog = result::create_program(&c_src, Some(&c_name))
        .map_err(|e| anyhow!("kernels/{name}.cu: NVRTC cannot create the program: {e:?}"))?;
    // SAFETY: `prog` was created above from `c_src` / `c_name`, which outlive it, and is
    // destroyed exactly once below, after its last use.
    let out = unsafe {
        let compiled = match result::compile_program(prog, opts) {
            Ok(()) => Ok(()),
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(anyhow!(
                    "kernels/{name}.cu: NVRTC failed ({e:?}, {}):\n{log}",
                    opts.join(" ")
                ))
            }
        };
        compiled.and_then(|()| match kind {
            ImageKind::Ptx => result::get_ptx(prog)
                .map(|p| p.into_iter().map(|c| c as u8).collect())
                .map_err(|e| anyhow!("kernels/{name}.cu: reading the PTX failed: {e:?}")),
            ImageKind::Cubin => {
                let mut size = 0usize;
                nv::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .and_then(|()| {
                        let mut buf = vec![0u8; size];
                        nv::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map(|()| buf)
                    })
                    .map_err(|e| anyhow!("kernels/{name}.cu: reading the CUBIN failed: {e:?}"))
            }
        })
    };
    // SAFETY: see above; `prog` is not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Returns the heap a compile freed to the OS. NVRTC's working memory (hundreds of MB for the
/// larger modules) is freed by the time a compile ends, but glibc keeps it in the compiling
/// thread's arena: on a machine whose kernel cache was empty, a run's host RSS stayed ~0.45 GB
/// above the same run with the cache warm from the compile to the end (docs/benchmarks-cuda.md,
/// "Session 14").
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
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
    /// NVRTC target of the kernels (`sm_90` on an H100/H200: CUBINs for the device itself).
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
            ("attention", "flash_attention2_hd256"),
            ("attention", "flash_attention2_sinks_hd64"),
            ("attention", "qk_norm_rope_bf16"),
            ("attention", "qk_norm_rope_vec_bf16"),
            ("elementwise", "rms_norm_rows_bf16"),
            ("elementwise", "rms_norm_rows_wide_bf16"),
            ("elementwise", "rms_norm_many_rows_bf16"),
            ("elementwise", "rms_norm_many_rows_wide_bf16"),
            ("elementwise", "swiglu_packed_rows_bf16"),
            ("topk", "topk_logsoftmax_k8"),
            ("topk", "topk_logsoftmax_k64"),
            ("lm_head_topk", "lm_head_topk_partial_k8"),
            ("lm_head_topk", "lm_head_topk_partial_k64"),
            ("decode", "decode_gemm_n1_m1"),
            ("decode", "decode_gemm_n8_m2"),
            ("decode", "moe_grouped_gemm_n1_m1"),
            ("decode", "moe_grouped_gemm_n8_m2"),
            ("decode", "moe_grouped_gemm_mxfp4_n1_m1"),
            ("decode", "moe_grouped_gemm_mxfp4_n8_m2"),
            ("decode", "mxfp4_dequant_bf16"),
            ("elementwise", "moe_route"),
            ("elementwise", "moe_plan_fill"),
            ("elementwise", "clamped_swiglu_packed_bf16"),
            ("decode_attention", "decode_attention_hd64"),
            ("decode_attention", "decode_attention_hd128"),
        ] {
            out.push(self.kernels.resources(m, f)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{PREWARM_ORDER, SOURCES};

    /// A module missing from the prewarm order would compile only at its first launch, with the
    /// GPU waiting; one listed twice, or unknown, points at a renamed module.
    #[test]
    fn the_prewarm_order_names_every_module_once() {
        let mut order: Vec<&str> = PREWARM_ORDER.to_vec();
        let mut modules: Vec<&str> = SOURCES.iter().map(|(n, _)| *n).collect();
        order.sort_unstable();
        modules.sort_unstable();
        assert_eq!(order, modules);
    }
}
