//! Resumable, verified HTTP downloads for `draftlens setup` (docs/install.md §3).
//!
//! A download goes to `<dest>.part`. When a transfer stops early (connection closed, timeout), the
//! next attempt asks for the rest with an HTTP `Range` request and appends, so an interrupted
//! `setup` (or one that is run again after Ctrl-C) continues where it stopped. Once the part file
//! has the pinned size its sha256 is computed; a mismatch deletes it and downloads it again from
//! the start. Only a verified file is renamed to `dest`, so `dest` is never partial or wrong.

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Attempts per file: each resumes or restarts after a truncated or corrupted transfer.
pub const MAX_ATTEMPTS: usize = 4;

/// One file to fetch: where from, its pinned size and sha256, where to put it.
pub struct Fetch<'a> {
    pub url: &'a str,
    pub size: u64,
    pub sha256: &'a str,
    pub dest: &'a Path,
    /// Progress bar label.
    pub label: &'a str,
}

/// What [`fetch`] did, for the summary.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Fetched {
    /// Bytes received over the network.
    pub bytes: u64,
    /// HTTP requests made.
    pub requests: usize,
    /// Transfers that stopped early and were resumed.
    pub resumed: usize,
    /// Complete downloads whose sha256 was wrong and were fetched again.
    pub refetched: usize,
}

/// The HTTP client: rustls with the system's certificate store (so a TLS-inspecting proxy
/// whose CA the system trusts works, as it does for pip), proxies from the environment.
pub fn agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    ureq::Agent::config_builder()
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::PlatformVerifier)
                .build(),
        )
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .user_agent(concat!("draftlens/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// `path` + ".part".
pub fn part_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// sha256 (lowercase hex) of a file, read in 1 MiB blocks.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("{}: read error", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// How one transfer ended.
enum Transfer {
    /// The response ended (complete or not: the caller checks the size).
    Ended,
    /// A network error after some bytes: worth resuming.
    Interrupted(String),
}

/// Downloads `f.url` to `f.dest`, resuming and re-fetching as the module doc says. `pb` shows the
/// bytes present out of the pinned size.
pub fn fetch(agent: &ureq::Agent, f: &Fetch, pb: &indicatif::ProgressBar) -> Result<Fetched> {
    let part = part_path(f.dest);
    if let Some(dir) = f.dest.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create folder", dir.display()))?;
    }
    let mut done = Fetched::default();
    let mut last_problem = String::new();
    pb.set_length(f.size);
    for attempt in 1..=MAX_ATTEMPTS {
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        if have > f.size {
            remove(&part)?;
            continue;
        }
        pb.set_position(have);
        if have < f.size {
            if attempt > 1 && have > 0 {
                done.resumed += 1;
            }
            match transfer(agent, f, &part, have, pb, &mut done)? {
                Transfer::Ended => {}
                Transfer::Interrupted(why) => {
                    let now = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
                    last_problem =
                        format!("transfer interrupted at {now} of {} bytes: {why}", f.size);
                    pb.suspend(|| eprintln!("setup: {}: {last_problem}; resuming", f.label));
                    continue;
                }
            }
        }
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        if have < f.size {
            last_problem = format!("the server sent {have} of {} bytes", f.size);
            pb.suspend(|| eprintln!("setup: {}: {last_problem}; resuming", f.label));
            continue;
        }
        if have > f.size {
            last_problem = format!("the server sent {have} bytes, {} expected", f.size);
            pb.suspend(|| eprintln!("setup: {}: {last_problem}; downloading again", f.label));
            remove(&part)?;
            continue;
        }
        let got = sha256_file(&part)?;
        if got != f.sha256 {
            last_problem = format!("sha256 {got} differs from the pinned {}", f.sha256);
            pb.suspend(|| eprintln!("setup: {}: {last_problem}; downloading again", f.label));
            remove(&part)?;
            done.refetched += 1;
            continue;
        }
        std::fs::rename(&part, f.dest)
            .with_context(|| format!("{}: cannot move into place", f.dest.display()))?;
        return Ok(done);
    }
    bail!(
        "{}: download failed after {MAX_ATTEMPTS} attempts: {last_problem}",
        f.url
    )
}

fn remove(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow!("{}: cannot remove: {e}", p.display())),
    }
}

/// One HTTP request for bytes `have..` of `f.url`, appended to `part`. Errors that retrying
/// cannot fix (404, a refused TLS certificate, a full disk) end the whole fetch.
fn transfer(
    agent: &ureq::Agent,
    f: &Fetch,
    part: &Path,
    have: u64,
    pb: &indicatif::ProgressBar,
    done: &mut Fetched,
) -> Result<Transfer> {
    let mut req = agent.get(f.url);
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    done.requests += 1;
    let resp = match req.call() {
        Ok(r) => r,
        Err(e) if retryable(&e) => return Ok(Transfer::Interrupted(e.to_string())),
        Err(e) => bail!("{}: {e}", f.url),
    };
    let status = resp.status().as_u16();
    let append = match status {
        206 => {
            // Content-Range: bytes START-END/TOTAL: the rest must start where the file ends.
            let start = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.parse::<u64>().ok());
            if start != Some(have) {
                // Not the range asked for: start again from the beginning.
                remove(part)?;
                pb.set_position(0);
                return Ok(Transfer::Interrupted(format!(
                    "the server answered a range request for byte {have} with {start:?}"
                )));
            }
            true
        }
        200 => false, // no range support: the whole file again
        416 => {
            remove(part)?;
            return Ok(Transfer::Interrupted("range not satisfiable".into()));
        }
        500..=599 | 408 | 429 => {
            return Ok(Transfer::Interrupted(format!("HTTP {status}")));
        }
        _ => bail!("{}: HTTP {status}", f.url),
    };
    if !append {
        pb.set_position(0);
    }
    let mut out = OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(part)
        .with_context(|| format!("{}: cannot write", part.display()))?;
    let mut body = resp
        .into_body()
        .into_with_config()
        .limit(f.size.saturating_add(1))
        .reader();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                out.flush().ok();
                return Ok(Transfer::Interrupted(e.to_string()));
            }
        };
        out.write_all(&buf[..n])
            .with_context(|| format!("{}: cannot write", part.display()))?;
        done.bytes += n as u64;
        pb.inc(n as u64);
    }
    out.flush()
        .with_context(|| format!("{}: cannot write", part.display()))?;
    Ok(Transfer::Ended)
}

/// Errors a later attempt may not meet again (the network, the server), as opposed to a bad
/// address or a refused certificate.
fn retryable(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::Protocol(_)
    )
}
