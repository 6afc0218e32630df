//! Kernel images that ship with the binary (docs/cuda.md, "Kernel images that ship"): every
//! module's CUBIN for the architectures in [`SHIPPED`], compiled by NVRTC on the build machine
//! (`tools/ship_kernel_images.sh`), so that a fresh machine with such a GPU loads machine code at
//! once instead of waiting seconds for NVRTC (issue 38 item 6: ~7 s of an 8B `extract`'s cold
//! start). An image is used only when its key equals the key the module has now (source,
//! options, crate version: `kernels::module_key`); a stale or missing one falls back to NVRTC,
//! and `DRAFTLENS_KERNEL_IMAGES=nvrtc` always compiles (the A/B switch).
//!
//! Format: `kernel_images/<arch>.json`, the manifest (the NVRTC that compiled the images, and per
//! module its key, the byte range of its gzip member in `<arch>.bin`, the CUBIN's length and
//! SHA-256), and `kernel_images/<arch>.bin`, the gzip members one after another.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

/// (architecture, manifest, images) of every architecture whose images ship.
const SHIPPED: &[(&str, &str, &[u8])] = &[(
    "sm_90",
    include_str!("kernel_images/sm_90.json"),
    include_bytes!("kernel_images/sm_90.bin"),
)];

/// `DRAFTLENS_KERNEL_IMAGES=nvrtc`: compile every module with NVRTC even where an image ships.
pub const KERNEL_IMAGES_ENV: &str = "DRAFTLENS_KERNEL_IMAGES";

#[derive(Serialize, Deserialize)]
pub(super) struct Manifest {
    /// The NVRTC that compiled the images (the wheel's version, e.g. `13.0.88`).
    pub nvrtc: String,
    pub modules: BTreeMap<String, ShippedModule>,
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct ShippedModule {
    /// `kernels::module_key` of the source the image was compiled from.
    pub key: String,
    /// Byte range of the module's gzip member in `<arch>.bin`.
    pub offset: usize,
    pub len: usize,
    /// Length and SHA-256 (hex) of the CUBIN.
    pub cubin_len: usize,
    pub cubin_sha256: String,
}

/// Whether the shipped images may be used (not `DRAFTLENS_KERNEL_IMAGES=nvrtc`).
fn enabled() -> bool {
    std::env::var(KERNEL_IMAGES_ENV).map_or(true, |v| v != "nvrtc")
}

impl Manifest {
    /// Module `name`'s entry if it was made from the source whose key is `key`.
    fn current(&self, name: &str, key: &str) -> Option<&ShippedModule> {
        self.modules.get(name).filter(|e| e.key == key)
    }
}

/// The manifest and images of `arch`, if any ship; each manifest parsed once per process.
pub(super) fn shipped_for(arch: &str) -> Option<(&'static Manifest, &'static [u8])> {
    static PARSED: std::sync::OnceLock<Vec<Option<Manifest>>> = std::sync::OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        SHIPPED
            .iter()
            .map(
                |(arch, manifest, _)| match serde_json::from_str::<Manifest>(manifest) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::warn!("kernel_images/{arch}.json: {e}; compiling with NVRTC");
                        None
                    }
                },
            )
            .collect()
    });
    let i = SHIPPED.iter().position(|(a, _, _)| *a == arch)?;
    Some((parsed[i].as_ref()?, SHIPPED[i].2))
}

/// The shipped CUBIN of module `name` for `arch` made from the source whose key is `key`, or
/// `None` (none ships or it is stale). A damaged image is reported and not used.
fn current_image(name: &str, arch: &str, key: &str) -> Option<Vec<u8>> {
    let (manifest, bin) = shipped_for(arch)?;
    match unpack(manifest.current(name, key)?, bin) {
        Ok(cubin) => Some(cubin),
        Err(e) => {
            tracing::warn!("kernel_images/{arch}.bin, module {name}: {e:#}; compiling with NVRTC");
            None
        }
    }
}

/// [`current_image`], unless `DRAFTLENS_KERNEL_IMAGES=nvrtc`: what the backend loads.
pub(super) fn shipped_image(name: &str, arch: &str, key: &str) -> Option<Vec<u8>> {
    enabled().then(|| current_image(name, arch, key)).flatten()
}

/// The CUBIN of one manifest entry, checked against its length and SHA-256.
pub(super) fn unpack(entry: &ShippedModule, bin: &[u8]) -> Result<Vec<u8>> {
    let member = bin
        .get(entry.offset..entry.offset + entry.len)
        .ok_or_else(|| anyhow!("bytes {}..+{} lie past its end", entry.offset, entry.len))?;
    let mut cubin = Vec::with_capacity(entry.cubin_len);
    flate2::read::GzDecoder::new(member)
        .read_to_end(&mut cubin)
        .context("not a gzip member")?;
    let sha = hex::encode(Sha256::digest(&cubin));
    if cubin.len() != entry.cubin_len || sha != entry.cubin_sha256 {
        bail!(
            "{} bytes of SHA-256 {sha}, the manifest says {} bytes of {}",
            cubin.len(),
            entry.cubin_len,
            entry.cubin_sha256
        );
    }
    Ok(cubin)
}

/// Compiles every module for `arch` (`sm_90`) with the NVRTC on the library path and writes
/// `<dir>/<arch>.json` and `<dir>/<arch>.bin`; `nvrtc` names that NVRTC's version for the
/// manifest. Needs no driver or device. Returns (module, CUBIN bytes, gzip bytes).
pub fn ship_kernel_images(
    arch: &str,
    nvrtc: &str,
    dir: &Path,
) -> Result<Vec<(String, usize, usize)>> {
    super::probe::preload("NVRTC", &["libnvrtc.so.13", "libnvrtc.so"])
        .map_err(super::probe::unavailable)?;
    let mut manifest = Manifest {
        nvrtc: nvrtc.to_string(),
        modules: BTreeMap::new(),
    };
    // A module whose source and NVRTC are those of the image already written keeps that image
    // (no compile, and no churn in the repository for the modules a change did not touch).
    let previous = read_dir_images(dir, arch).filter(|(m, _)| m.nvrtc == nvrtc);
    let (mut bin, mut sizes) = (Vec::new(), Vec::new());
    for name in super::kernels::module_names() {
        let key = super::kernels::module_key(name, arch)?;
        let kept = previous
            .as_ref()
            .and_then(|(m, bin)| unpack(m.current(name, &key)?, bin).ok());
        let cubin = match kept {
            Some(cubin) => cubin,
            None => super::kernels::compile_cubin_uncached(name, arch)?,
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&cubin)?;
        let member = gz.finish()?;
        manifest.modules.insert(
            name.to_string(),
            ShippedModule {
                key,
                offset: bin.len(),
                len: member.len(),
                cubin_len: cubin.len(),
                cubin_sha256: hex::encode(Sha256::digest(&cubin)),
            },
        );
        sizes.push((name.to_string(), cubin.len(), member.len()));
        bin.extend_from_slice(&member);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(&manifest)? + "\n";
    for (file, bytes) in [("json", json.as_bytes()), ("bin", &bin[..])] {
        let path = dir.join(format!("{arch}.{file}"));
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(sizes)
}

/// The manifest and images of `arch` written in `dir`, if both are there and the manifest parses.
fn read_dir_images(dir: &Path, arch: &str) -> Option<(Manifest, Vec<u8>)> {
    let json = std::fs::read_to_string(dir.join(format!("{arch}.json"))).ok()?;
    let bin = std::fs::read(dir.join(format!("{arch}.bin"))).ok()?;
    Some((serde_json::from_str(&json).ok()?, bin))
}

/// What ships, for `draftlens doctor`: per architecture, the NVRTC that made its images, how
/// many modules' images are current (their key equals the module's now) and how many modules
/// there are.
pub fn shipped_kernel_images() -> Vec<(String, String, usize, usize)> {
    SHIPPED
        .iter()
        .filter_map(|(arch, _, _)| {
            let (manifest, _) = shipped_for(arch)?;
            let modules: Vec<&str> = super::kernels::module_names().collect();
            let current = modules
                .iter()
                .filter(|name| {
                    let key = super::kernels::module_key(name, arch).ok();
                    manifest
                        .modules
                        .get(**name)
                        .map(|e| Some(&e.key) == key.as_ref())
                        == Some(true)
                })
                .count();
            Some((
                arch.to_string(),
                manifest.nvrtc.clone(),
                current,
                modules.len(),
            ))
        })
        .collect()
}

/// For each module shipped for `arch`: whether its image equals the CUBIN the NVRTC on this
/// machine compiles from the same source (`None`: no current image ships for it). The GPU test
/// `cuda_kernel_images` reports it: equal images mean this machine runs exactly what it would
/// have compiled.
pub fn shipped_images_against_nvrtc(arch: &str) -> Result<Vec<(String, Option<bool>)>> {
    let mut out = Vec::new();
    for name in super::kernels::module_names() {
        let key = super::kernels::module_key(name, arch)?;
        let shipped = current_image(name, arch, &key);
        let equal = match shipped {
            Some(image) => Some(super::kernels::compile_cubin_uncached(name, arch)? == image),
            None => None,
        };
        out.push((name.to_string(), equal));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{shipped_for, unpack, SHIPPED};
    use crate::backend::cuda::kernels::{module_key, module_names};

    /// Every module ships for every shipped architecture, from the source it has now: a kernel
    /// changed without `tools/ship_kernel_images.sh` would silently cost a fresh machine its
    /// NVRTC wait again. Each image unpacks to the CUBIN the manifest describes (an ELF file).
    #[test]
    fn shipped_kernel_images_are_current_and_whole() {
        for (arch, _, _) in SHIPPED {
            let (manifest, bin) = shipped_for(arch).expect("the manifest parses");
            let mut names: Vec<&str> = manifest.modules.keys().map(String::as_str).collect();
            let mut modules: Vec<&str> = module_names().collect();
            names.sort_unstable();
            modules.sort_unstable();
            assert_eq!(
                names, modules,
                "kernel_images/{arch}.json lists other modules"
            );
            for (name, entry) in &manifest.modules {
                assert_eq!(
                    entry.key,
                    module_key(name, arch).unwrap(),
                    "kernels/{name}.cu changed since its {arch} image was made: run tools/ship_kernel_images.sh"
                );
                let cubin = unpack(entry, bin).unwrap_or_else(|e| panic!("{name}: {e:#}"));
                assert_eq!(&cubin[..4], b"\x7fELF", "{name}: not an ELF image");
            }
        }
    }

    /// A damaged image is refused by its length and hash, never loaded.
    #[test]
    fn a_damaged_image_is_refused() {
        let (manifest, bin) = shipped_for("sm_90").unwrap();
        let entry = manifest.modules.values().next().unwrap();
        let mut bad = bin.to_vec();
        bad[entry.offset + entry.len - 5] ^= 0xff; // the gzip trailer's CRC or length
        assert!(unpack(entry, &bad).is_err());
        let mut short = entry.clone();
        short.len = bin.len() + 1;
        assert!(unpack(&short, bin).is_err());
    }
}
