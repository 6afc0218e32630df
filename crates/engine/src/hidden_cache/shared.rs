//! What makes the hidden-state cache ([`crate::hidden_cache`]) safe to share between many jobs on a
//! network filesystem: temp names unique across machines, a publish that never replaces an
//! entry, reads that treat an entry deleted under them as a miss, the LRU clock (an entry's
//! modification time, refreshed at most once per [`TOUCH_INTERVAL`]) and size-budget eviction
//! ([`HiddenCache::gc`]). The design and its measurements: docs/scale-out.md, "Shared cache".

use crate::hidden_cache::{HiddenCache, STALE_TEMP_AGE, TOUCH_INTERVAL};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// Per-process counter of temp names (with the host, pid and random bits: unique everywhere).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What [`HiddenCache::put_outcome`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    pub path: PathBuf,
    /// This call published the entry; `false`: a valid entry was already there (written
    /// earlier, or by a concurrent writer that published first).
    pub published: bool,
    /// Publishes repeated because the shard directory vanished under them.
    pub retries: u32,
}

/// A temp-file name in a cache folder, unique across the machines sharing it:
/// `.<stem>.tmp.<host>.<pid>.<counter>.<random>`. Never matches an entry's name (leading dot).
pub(crate) fn unique_temp_name(stem: &str) -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let host = HOST.get_or_init(|| {
        let raw = fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        let h: String = raw
            .trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(32)
            .collect();
        if h.is_empty() {
            "host".into()
        } else {
            h
        }
    });
    format!(
        ".{stem}.tmp.{host}.{}.{}.{:016x}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u64>()
    )
}

/// Has `write` create and fsync a fresh temp file in `dir`, and publishes it as `path` without replacing an
/// existing entry. `Ok(false)`: an entry was already there (our copy is discarded).
pub(crate) fn publish(
    dir: &Path,
    path: &Path,
    digest: &str,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<bool> {
    fs::create_dir_all(dir)
        .with_context(|| format!("{}: cannot create cache directory", dir.display()))?;
    let tmp = dir.join(unique_temp_name(digest));
    let result = write(&tmp).and_then(|()| match fs::hard_link(&tmp, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(anyhow::Error::from(e)
            .context(format!("{}: cannot publish cache entry", path.display()))),
        // No hard links here (some FUSE and SMB mounts): an atomic rename, which replaces an
        // entry a concurrent writer published with identical content.
        Err(_) => fs::rename(&tmp, path).map(|()| true).with_context(|| {
            format!(
                "{}: cannot rename {} into place",
                path.display(),
                tmp.display()
            )
        }),
    });
    // After a link the temp name is a second name of the entry; after a rename it is gone.
    let _ = fs::remove_file(&tmp);
    if result.as_ref().is_ok_and(|&p| p) {
        // Make the publish itself durable; a failure here does not lose data already linked.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    result
}

pub(crate) fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
    })
}

/// `ESTALE`: on NFS, the file was removed by another client while we held it open.
fn is_stale_handle(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(116)
}

/// The whole entry file and its metadata (from the open file, so they describe the same
/// version); `None` if there is none (or it vanished while being read).
pub(crate) fn read_entry(path: &Path) -> std::io::Result<Option<(Vec<u8>, fs::Metadata)>> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound || is_stale_handle(e);
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let read = f.metadata().and_then(|meta| {
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        f.read_to_end(&mut bytes)?;
        Ok((bytes, meta))
    });
    match read {
        Ok(x) => Ok(Some(x)),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `path` still names the file `meta` was taken from (not deleted or replaced since).
pub(crate) fn same_file(path: &Path, meta: &fs::Metadata) -> bool {
    let Ok(now) = fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        now.dev() == meta.dev() && now.ino() == meta.ino()
    }
    #[cfg(not(unix))]
    {
        now.len() == meta.len() && now.modified().ok() == meta.modified().ok()
    }
}

/// Sets the entry's modification time (its LRU clock) to now when it is older than
/// [`TOUCH_INTERVAL`]. Best effort: a read-only cache simply keeps its times.
pub(crate) fn touch_if_old(path: &Path, meta: &fs::Metadata) {
    let old = meta
        .modified()
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age >= TOUCH_INTERVAL);
    if !old {
        return;
    }
    #[cfg(unix)]
    {
        // utimensat with null times ("now") needs only write permission, not ownership, so
        // every user of a group-writable shared cache can refresh entries others wrote.
        use std::os::unix::ffi::OsStrExt;
        if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) {
            // SAFETY: `c` is a valid NUL-terminated path; a null `times` means "now".
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) };
        }
    }
    #[cfg(not(unix))]
    if let Ok(f) = OpenOptions::new().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// What [`HiddenCache::gc`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// The budget, in bytes.
    pub max_bytes: u64,
    /// Entries and their bytes before eviction.
    pub entries_before: usize,
    pub bytes_before: u64,
    /// Entries evicted (least recently used first) and their bytes.
    pub evicted: usize,
    pub evicted_bytes: u64,
    /// Entries and bytes left.
    pub entries_after: usize,
    pub bytes_after: u64,
    /// Stale temp files of killed writers removed.
    pub temp_files: usize,
}

impl HiddenCache {
    /// Evicts entries, least recently used first (oldest modification time: see
    /// [`TOUCH_INTERVAL`]), until the entries take at most `max_bytes`, and removes stale temp
    /// files. Safe while other jobs read and write: an entry evicted under a reader is a miss
    /// there, and an entry published during the scan is not counted (the next gc sees it).
    pub fn gc(&self, max_bytes: u64) -> Result<GcReport> {
        let mut report = GcReport {
            max_bytes,
            ..Default::default()
        };
        let mut entries: Vec<(SystemTime, PathBuf, u64)> = Vec::new();
        for (path, _) in self.entry_files()? {
            // Only the metadata: gc never reads an entry's bytes.
            let meta = match fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("{}: cannot stat", path.display()))
                }
            };
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            entries.push((used, path, meta.len()));
        }
        report.entries_before = entries.len();
        report.bytes_before = entries.iter().map(|e| e.2).sum();
        // Oldest use first; the path breaks ties so that the order is deterministic.
        entries.sort();
        let mut total = report.bytes_before;
        for (_, path, size) in &entries {
            if total <= max_bytes {
                break;
            }
            match fs::remove_file(path) {
                Ok(()) => {
                    report.evicted += 1;
                    report.evicted_bytes += size;
                }
                // Evicted by a concurrent gc: gone all the same.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("{}: cannot evict cache entry", path.display()))
                }
            }
            total -= size;
        }
        report.entries_after = report.entries_before - report.evicted;
        report.bytes_after = total;
        report.temp_files = self.remove_stale_temps()?;
        Ok(report)
    }

    /// Removes temp files not modified for [`STALE_TEMP_AGE`] (their writer was killed), in the
    /// shard directories and the identity folder; returns how many.
    pub(crate) fn remove_stale_temps(&self) -> Result<usize> {
        let now = SystemTime::now();
        let mut temps = self.temp_files()?;
        let ident = self.root().join(crate::identity::IDENTITY_DIR);
        if let Ok(rd) = fs::read_dir(&ident) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && name.contains(".tmp.") {
                    temps.push(e.path());
                }
            }
        }
        let mut removed = 0;
        for tmp in temps {
            let stale = fs::metadata(&tmp)
                .and_then(|m| m.modified())
                .map(|t| now.duration_since(t).unwrap_or_default() >= STALE_TEMP_AGE)
                .unwrap_or(false);
            if stale {
                match fs::remove_file(&tmp) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("{}: cannot delete stale temp file", tmp.display())
                        })
                    }
                }
            }
        }
        Ok(removed)
    }
}

/// Parses a size: a number with an optional unit, `K`/`M`/`G`/`T` (also `KiB`… : powers of
/// 1024) or `KB`/`MB`/`GB`/`TB` (powers of 1000), case-insensitive; `B` or no unit is bytes.
/// Examples: `500M`, `1.5GiB`, `200GB`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .with_context(|| {
            format!("size {s:?}: expected a number with an optional unit, like 500M or 20GiB")
        })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => bail!("size {s:?}: unknown unit {other:?} (use K, M, G, T, KiB…, KB…)"),
    };
    let bytes = n * mult;
    if bytes > u64::MAX as f64 / 2.0 {
        bail!("size {s:?} is too large");
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("500M").unwrap(), 500 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("2gb").unwrap(), 2_000_000_000);
        assert_eq!(parse_size(" 3 K ").unwrap(), 3072);
        assert_eq!(parse_size("0").unwrap(), 0);
        for bad in ["", "M", "-1G", "12X", "1.2.3G", "nan"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("size"), "{bad}: {e}");
        }
    }

    #[test]
    fn temp_names_are_unique_and_hidden() {
        let a = unique_temp_name("abc");
        let b = unique_temp_name("abc");
        assert_ne!(a, b);
        assert!(a.starts_with(".abc.tmp."), "{a}");
    }
}
