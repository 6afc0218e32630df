//! The identity store: sha256 hashes of weight files, remembered so a model's identity is
//! computed once instead of on every command.
//!
//! A target's identity (part of every cache key, stored with every run) is a sha256 over its
//! weight files (`docs/loading.md`). Hashing a 16 GB checkpoint takes ~40 s, so each file's hash is
//! remembered in `<cache root>/identity/<sha256 of the canonical path>.json` together with the
//! file's *stamp*: canonical path, size, modification time (ns) and inode. A later open whose
//! stamp matches reuses the hash without reading the file; any change of size, mtime or inode
//! (a rewrite, `touch`, a copy over it) re-hashes it.
//!
//! What a stamp cannot see: bytes changed in place by a writer that then restores the mtime.
//! `draftlens cache verify` re-hashes every remembered file and repairs (rewrites) a stale
//! record ([`IdentityStore::verify`]).
//!
//! Records are one small JSON file per weight file, written atomically (temp file + rename), so
//! concurrent processes never see a torn record; a record that cannot be read is ignored and
//! rewritten. A cache directory that cannot be written only costs the re-hash next time.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// Sub-folder of the cache root holding the records.
pub const IDENTITY_DIR: &str = "identity";

/// Weight files hashed by this process (through [`IdentityStore`] or [`hash_file`]): lets tests
/// and `-v` logs show that an open reused a remembered hash.
pub static FILES_HASHED: AtomicU64 = AtomicU64::new(0);

/// sha256 of a weight file, counted in [`FILES_HASHED`].
pub fn hash_file(path: &Path) -> Result<String> {
    let t = std::time::Instant::now();
    let h = crate::util::sha256_file(path)?;
    FILES_HASHED.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        "hashed {} in {:.1} s (identity)",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(h)
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// Canonical (absolute, symlinks resolved) path.
    pub path: PathBuf,
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: u128,
    /// Inode number (0 where the platform has none).
    pub inode: u64,
}

impl FileStamp {
    pub fn of(path: &Path) -> Result<FileStamp> {
        let canonical = fs::canonicalize(path)
            .with_context(|| format!("{}: cannot resolve the path", path.display()))?;
        let meta = fs::metadata(&canonical)
            .with_context(|| format!("{}: cannot stat", canonical.display()))?;
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Ok(FileStamp {
            path: canonical,
            size: meta.len(),
            mtime_ns,
            inode: inode(&meta),
        })
    }
}

#[cfg(unix)]
fn inode(meta: &fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(meta)
}

#[cfg(not(unix))]
fn inode(_meta: &fs::Metadata) -> u64 {
    0
}

/// One remembered hash.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    stamp: FileStamp,
    sha256: String,
    hashed_unix: u64,
}

/// Outcome of re-hashing one remembered file ([`IdentityStore::verify`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum IdentityStatus {
    /// The file's bytes still hash to the remembered value.
    Ok,
    /// The remembered hash was stale (bytes changed without a stamp change, or the stamp
    /// changed); the record now holds the new hash.
    Repaired { old: String, new: String },
    /// The file is gone; its record was removed.
    Missing,
    /// The file could not be read; the record is kept.
    Unreadable { problem: String },
}

/// One line of [`IdentityStore::verify`].
#[derive(Clone, Debug, Serialize)]
pub struct IdentityCheck {
    pub path: PathBuf,
    #[serde(flatten)]
    pub status: IdentityStatus,
}

/// Remembered weight-file hashes under one cache root.
#[derive(Clone, Debug)]
pub struct IdentityStore {
    dir: PathBuf,
    /// Files this store (and its clones) hashed: how tests see that an open reused a hash.
    hashed: Arc<AtomicU64>,
}

impl IdentityStore {
    /// The store of the cache rooted at `cache_root` (created on first write).
    pub fn new(cache_root: &Path) -> IdentityStore {
        IdentityStore {
            dir: cache_root.join(IDENTITY_DIR),
            hashed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Weight files hashed through this store (or a clone of it) so far.
    pub fn files_hashed(&self) -> u64 {
        self.hashed.load(Ordering::Relaxed)
    }

    fn hash(&self, path: &Path) -> Result<String> {
        let h = hash_file(path)?;
        self.hashed.fetch_add(1, Ordering::Relaxed);
        Ok(h)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, canonical: &Path) -> PathBuf {
        let key = crate::util::sha256_bytes(canonical.to_string_lossy().as_bytes());
        self.dir.join(format!("{key}.json"))
    }

    fn read(&self, canonical: &Path) -> Option<Record> {
        let text = fs::read_to_string(self.record_path(canonical)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The remembered hash of `path` when its stamp still matches; never reads the file.
    pub fn remembered(&self, path: &Path) -> Result<Option<String>> {
        let stamp = FileStamp::of(path)?;
        Ok(self
            .read(&stamp.path)
            .filter(|r| r.stamp == stamp)
            .map(|r| r.sha256))
    }

    /// sha256 of `path`: the remembered value when the stamp matches, else hashed now and
    /// remembered.
    pub fn file_sha256(&self, path: &Path) -> Result<String> {
        let stamp = FileStamp::of(path)?;
        if let Some(r) = self.read(&stamp.path).filter(|r| r.stamp == stamp) {
            return Ok(r.sha256);
        }
        let sha = self.hash(&stamp.path)?;
        // The file may have changed while it was read; remember the hash only if it did not.
        if FileStamp::of(path).ok().as_ref() == Some(&stamp) {
            self.write(&stamp, &sha);
        }
        Ok(sha)
    }

    /// Store a record; failures (read-only cache) are logged, never fatal: they only cost a
    /// re-hash next time.
    fn write(&self, stamp: &FileStamp, sha: &str) {
        let rec = Record {
            stamp: stamp.clone(),
            sha256: sha.to_string(),
            hashed_unix: std::time::SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        if let Err(e) = self.write_record(&rec) {
            tracing::warn!(
                "{}: cannot remember the hash of {}: {e:#}",
                self.dir.display(),
                stamp.path.display()
            );
        }
    }

    fn write_record(&self, rec: &Record) -> Result<()> {
        fs::create_dir_all(&self.dir)
            .with_context(|| format!("{}: cannot create", self.dir.display()))?;
        let path = self.record_path(&rec.stamp.path);
        // Unique across the machines sharing the cache folder (a pid alone is not).
        let tmp = self.dir.join(crate::hidden_cache::shared::unique_temp_name(
            &path.file_name().unwrap_or_default().to_string_lossy(),
        ));
        let body = serde_json::to_vec_pretty(rec)?;
        let written = (|| -> Result<()> {
            let mut f = fs::File::options()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            Ok(())
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.with_context(|| format!("{}: cannot write", path.display()))
    }

    /// Every remembered file re-hashed: stale records are repaired, records of vanished files
    /// removed. Sorted by path.
    pub fn verify(&self) -> Result<Vec<IdentityCheck>> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => {
                return Err(e).with_context(|| format!("{}: cannot list", self.dir.display()))
            }
        };
        for e in entries {
            let e = e.with_context(|| format!("{}: cannot list", self.dir.display()))?;
            let file = e.path();
            if file.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let rec: Record = match fs::read_to_string(&file)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
            {
                Some(r) => r,
                None => {
                    // Unreadable record: it is only a memo, drop it.
                    let _ = fs::remove_file(&file);
                    continue;
                }
            };
            let path = rec.stamp.path.clone();
            let status = if !path.exists() {
                let _ = fs::remove_file(&file);
                IdentityStatus::Missing
            } else {
                match FileStamp::of(&path).and_then(|s| Ok((self.hash(&path)?, s))) {
                    Err(err) => IdentityStatus::Unreadable {
                        problem: format!("{err:#}"),
                    },
                    Ok((sha, stamp)) => {
                        if sha == rec.sha256 && stamp == rec.stamp {
                            IdentityStatus::Ok
                        } else {
                            self.write(&stamp, &sha);
                            if sha == rec.sha256 {
                                // Same bytes, new stamp (touched): refreshed, nothing was stale.
                                IdentityStatus::Ok
                            } else {
                                IdentityStatus::Repaired {
                                    old: rec.sha256.clone(),
                                    new: sha,
                                }
                            }
                        }
                    }
                }
            };
            out.push(IdentityCheck { path, status });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}
