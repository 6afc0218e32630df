//! `bench-load`: how fast a target's weights reach the backend, next to the floor measured in the
//! same run: reading the same weight files sequentially (`cat shards > /dev/null`).
//!
//! Order: the read pass runs first, so both numbers see the same (warm) page cache; the ratio
//! load / read says how far loading is from the I/O floor. For cold-cache numbers drop the page
//! cache before the run (`echo 3 > /proc/sys/vm/drop_caches`) and pass `--load-first`.

use crate::args::BackendArg;
use crate::common::Global;
use anyhow::{Context, Result};
use clap::Args;
use draftlens_engine::backend::{dispatch, Backend, BackendJob, DEFAULT_CUDA_DEVICE};
use draftlens_engine::model::{TargetFiles, TargetModel};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct BenchLoadArgs {
    /// A .gguf file or a Hugging Face model folder.
    pub model: PathBuf,
    /// Backend to upload to.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Load before reading the files (for cold-cache runs: the load then pays the disk reads).
    #[arg(long)]
    pub load_first: bool,
}

#[derive(Serialize)]
struct BenchLoadOut {
    model: PathBuf,
    backend: &'static str,
    dtype: &'static str,
    files: usize,
    bytes: u64,
    /// Reading every weight file once, sequentially, 8 MiB at a time.
    read_s: f64,
    read_gib_per_s: f64,
    /// `TargetFiles::open` (headers, tokenizer; no weight bytes).
    open_s: f64,
    /// `TargetModel::load` until the backend has finished every copy.
    upload_s: f64,
    load_gib_per_s: f64,
    /// (open + upload) / read: 1.0 means loading runs at the file-reading floor.
    ratio: f64,
    /// Peak resident set of the process (VmHWM) after the load, MiB.
    peak_rss_mib: Option<f64>,
}

struct Job<'a> {
    a: &'a BenchLoadArgs,
}

/// The files whose bytes make up the weights.
fn weight_files(path: &Path) -> Result<Vec<PathBuf>> {
    // A `random:DIR` target has no weight files: its weights are generated at load.
    if draftlens_engine::model::random_target::random_dir(path).is_some() {
        return Ok(Vec::new());
    }
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("{}: cannot list folder", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// Seconds to read `files` once (the `cat > /dev/null` floor) and the bytes read.
fn read_all(files: &[PathBuf]) -> Result<(f64, u64)> {
    let t = Instant::now();
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    for f in files {
        let mut h =
            std::fs::File::open(f).with_context(|| format!("{}: cannot open", f.display()))?;
        loop {
            let n = h
                .read(&mut buf)
                .with_context(|| format!("{}: read failed", f.display()))?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    Ok((t.elapsed().as_secs_f64(), total))
}

fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

impl BackendJob for Job<'_> {
    type Output = BenchLoadOut;
    fn run<B: Backend>(self, be: B) -> Result<BenchLoadOut> {
        let a = self.a;
        let files = weight_files(&a.model)?;
        let mut read = (0.0, 0);
        if !a.load_first {
            read = read_all(&files)?;
        }
        let t = Instant::now();
        let f = TargetFiles::open(&a.model)?;
        let open_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let model = TargetModel::load(&be, &f.spec, f.weights.as_ref())?;
        // Copies may still be queued (CUDA): reading one value back waits for all of them.
        be.to_host(&be.embed(&model.embed_tokens, &[0])?)?;
        let upload_s = t.elapsed().as_secs_f64();
        let peak = peak_rss_mib();
        drop(model);
        if a.load_first {
            read = read_all(&files)?;
        }
        let (read_s, mut bytes) = read;
        if f.random.is_some() {
            // Generated, not read: the rate is of the bytes generated and uploaded.
            bytes = f.weights.tensors().iter().map(|t| t.bytes).sum();
        }
        let gib = bytes as f64 / (1u64 << 30) as f64;
        Ok(BenchLoadOut {
            model: a.model.clone(),
            backend: be.name(),
            dtype: be.dtype(),
            files: files.len(),
            bytes,
            read_s,
            read_gib_per_s: gib / read_s.max(1e-9),
            open_s,
            upload_s,
            load_gib_per_s: gib / (open_s + upload_s).max(1e-9),
            ratio: (open_s + upload_s) / read_s.max(1e-9),
            peak_rss_mib: peak,
        })
    }
}

pub fn run(g: &Global, a: BenchLoadArgs) -> Result<()> {
    let out = dispatch(a.backend.select(g), DEFAULT_CUDA_DEVICE, Job { a: &a })?;
    g.emit(&out, || {
        format!(
            "{} on {} ({}): {} files, {:.2} GiB\n  read (cat floor)  {:>7.2} s  {:>6.2} GiB/s\n  open              {:>7.2} s\n  upload            {:>7.2} s\n  open + upload     {:>7.2} s  {:>6.2} GiB/s   {:.2}× the read floor\n  peak RSS          {}\n",
            out.model.display(),
            out.backend,
            out.dtype,
            out.files,
            out.bytes as f64 / (1u64 << 30) as f64,
            out.read_s,
            out.read_gib_per_s,
            out.open_s,
            out.upload_s,
            out.open_s + out.upload_s,
            out.load_gib_per_s,
            out.ratio,
            out.peak_rss_mib
                .map_or("unknown".to_string(), |m| format!("{m:.0} MiB")),
        )
    })
}
