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
//!
//! [`BackgroundHash`] runs the same hashes on background threads (a session starts it when it
//! opens weights never seen, so that the hash overlaps their upload) and refuses, when joined, a
//! file whose stamp changed since it started (docs/loading.md §2).

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// Sub-folder of the cache root holding the records.
pub const IDENTITY_DIR: &str = "identity";

/// Weight files hashed by this process (through [`IdentityStore`] or [`hash_file`]): lets tests
/// and `-v` logs show that an open reused a remembered hash.
pub static FILES_HASHED: AtomicU64 = AtomicU64::new(0);

/// sha256 of a weight file, counted in [`FILES_HASHED`].
pub fn hash_file(path: &Path) -> Result<String> {
    let never = AtomicBool::new(false);
    Ok(hash_file_unless(path, &never)?.expect("a hash nothing stops runs to the end"))
}

/// [`hash_file`], given up once `stop` is set (`Ok(None)`, not counted).
fn hash_file_unless(path: &Path, stop: &AtomicBool) -> Result<Option<String>> {
    let t = std::time::Instant::now();
    let Some(h) = crate::util::sha256_file_unless(path, stop)? else {
        return Ok(None);
    };
    FILES_HASHED.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        "hashed {} in {:.1} s (identity)",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(Some(h))
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
        let never = AtomicBool::new(false);
        Ok(self
            .hash_unless(path, &never)?
            .expect("a hash nothing stops runs to the end"))
    }

    fn hash_unless(&self, path: &Path, stop: &AtomicBool) -> Result<Option<String>> {
        let h = hash_file_unless(path, stop)?;
        if h.is_some() {
            self.hashed.fetch_add(1, Ordering::Relaxed);
        }
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
        let never = AtomicBool::new(false);
        Ok(self
            .sha256_as_stamped(&FileStamp::of(path)?, &never)?
            .expect("a hash nothing stops runs to the end"))
    }

    /// sha256 of the file `stamp` was taken of: the remembered value when the record's stamp is
    /// `stamp`, else hashed now and remembered, unless the file's stamp is no longer `stamp` once
    /// read (it changed meanwhile: the bytes hashed may be neither version). `Ok(None)`: `stop`
    /// was set before the hash ended.
    pub fn sha256_as_stamped(
        &self,
        stamp: &FileStamp,
        stop: &AtomicBool,
    ) -> Result<Option<String>> {
        if let Some(r) = self.read(&stamp.path).filter(|r| r.stamp == *stamp) {
            return Ok(Some(r.sha256));
        }
        let Some(sha) = self.hash_unless(&stamp.path, stop)? else {
            return Ok(None);
        };
        if FileStamp::of(&stamp.path).ok().as_ref() == Some(stamp) {
            self.write(stamp, &sha);
        }
        Ok(Some(sha))
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

/// Name of the background hash in `--timeline` (docs/loading.md §2).
pub const BACKGROUND_PHASE: &str = "weights hashed (background)";
/// The main thread's phase while it waits for that hash.
pub const WAIT_PHASE: &str = "weights hash (wait)";

/// Weight files being hashed on background threads while the main thread does other work
/// (`TargetIdentity::hash_in_background`: the target's weights are read and uploaded meanwhile;
/// the bytes come through the page cache either way). [`BackgroundHash::join`] gives the files'
/// hashes, the same values [`IdentityStore::file_sha256`] gives, or an error when a file changed
/// while it was being read. Dropped without a join, it stops the threads at their next read.
#[derive(Debug)]
pub struct BackgroundHash {
    /// Each file's stamp when hashing began, in the order given.
    stamps: Vec<FileStamp>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<Option<Vec<String>>>>>,
}

impl BackgroundHash {
    /// Stamp `files` now (on the calling thread, so that any later change is seen by the join)
    /// and hash them on background threads, at most one a core, through `store` when given (a
    /// file whose record matches is not read). Errors: a file that cannot be stat'ed, a thread
    /// that cannot be spawned.
    pub fn start(files: &[PathBuf], store: Option<IdentityStore>) -> Result<BackgroundHash> {
        let stamps = files
            .iter()
            .map(|f| FileStamp::of(f))
            .collect::<Result<Vec<_>>>()?;
        let stop = Arc::new(AtomicBool::new(false));
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(stamps.len())
            .max(1);
        let (todo, flag) = (stamps.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("identity-hash".into())
            .spawn(move || {
                let _timed = crate::timeline::background(BACKGROUND_PHASE);
                hash_all(&todo, store.as_ref(), &flag, workers)
            })
            .context("cannot start the weights hash thread")?;
        Ok(BackgroundHash {
            stamps,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether the hashing threads are done: [`BackgroundHash::join`] would not wait for them.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Wait for the hashes (in the order of the files given to [`BackgroundHash::start`]),
    /// timed as the main thread's [`WAIT_PHASE`]. An error names the file: one that could not
    /// be read, or one whose stamp (size, modification time, inode) is no longer what it was
    /// when hashing began: whatever read it meanwhile (the loader) may have seen other bytes
    /// than the hash did, so no identity is given for it.
    pub fn join(mut self) -> Result<Vec<String>> {
        let _wait = crate::timeline::phase(WAIT_PHASE);
        let t = std::time::Instant::now();
        let thread = self.thread.take().context("weights hash joined twice")?;
        let hashes = match thread.join() {
            Ok(r) => r?.context("the weights hash was stopped")?,
            Err(_) => anyhow::bail!("the weights hash thread panicked"),
        };
        for before in &self.stamps {
            let now = FileStamp::of(&before.path)?;
            if now != *before {
                anyhow::bail!(
                    "{}: the file changed while draftlens was reading it ({}): the bytes hashed for its identity and the bytes loaded may differ, so nothing is computed or stored under either; run the command again once it no longer changes",
                    before.path.display(),
                    describe_change(before, &now)
                );
            }
        }
        tracing::info!(
            "target identity: {} file(s) hashed in the background; waited {:.2} s for them",
            hashes.len(),
            t.elapsed().as_secs_f64()
        );
        Ok(hashes)
    }
}

impl Drop for BackgroundHash {
    fn drop(&mut self) {
        // Nobody will join: the threads stop at their next read instead of reading the rest.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Hash every stamped file on `workers` threads, each taking the next file not yet taken.
/// `Ok(None)` when stopped; otherwise the hashes in order, or the first file's error in order.
fn hash_all(
    stamps: &[FileStamp],
    store: Option<&IdentityStore>,
    stop: &AtomicBool,
    workers: usize,
) -> Result<Option<Vec<String>>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let one = |stamp: &FileStamp| match store {
        Some(s) => s.sha256_as_stamped(stamp, stop),
        None => hash_file_unless(&stamp.path, stop),
    };
    let mut done: Vec<(usize, Result<Option<String>>)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= stamps.len() {
                            return mine;
                        }
                        mine.push((i, one(&stamps[i])));
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap_or_default())
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    if done.len() != stamps.len() {
        anyhow::bail!("a weights hash thread panicked");
    }
    let mut hashes = Vec::with_capacity(done.len());
    for (_, r) in done {
        match r? {
            Some(h) => hashes.push(h),
            None => return Ok(None),
        }
    }
    Ok(Some(hashes))
}

/// What differs between two stamps of one file, for an error message.
fn describe_change(before: &FileStamp, now: &FileStamp) -> String {
    let mut what = Vec::new();
    if before.size != now.size {
        what.push(format!("size {} → {} bytes", before.size, now.size));
    }
    if before.mtime_ns != now.mtime_ns {
        what.push("modification time".to_string());
    }
    if before.inode != now.inode {
        what.push("inode: replaced by another file".to_string());
    }
    what.join(", ")
}
