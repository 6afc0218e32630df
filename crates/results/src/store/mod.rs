//! The run store: every evaluation run, its prompts, evaluated records, metrics and plugin
//! failures, in one SQLite file (WAL mode, foreign keys, busy timeout, versioned migrations).
//!
//! Raw data is kept so that every metric convention can be derived later: the records are the
//! columnar [`RecordBatch`] columns as little-endian BLOBs (one row per prompt per chunk), and
//! metric rows carry their denominator (`count`).
//!
//! Integrity rules:
//! - a run is created `running` and only [`Store::finish_run`] marks it `complete` or `failed`;
//!   a process that dies in between leaves it `running`, never `complete`, until the database is
//!   next opened by a process that finds no other process has it open: then it is marked
//!   `failed` with an error starting "interrupted" (see [`liveness`]); only a `complete` run can
//!   be a pinned baseline;
//! - records, prompts, metrics and imports are each written in one transaction, so a reader sees
//!   either none or all of one call's rows;
//! - records of a finished run are immutable (metrics may be re-scored at any time).
//!
//! Concurrency: one writer connection behind a mutex plus a small pool of read-only connections
//! (WAL lets readers proceed while the writer writes). `Store` is `Send + Sync`.
//!
//! One file per concern, each adding its methods to [`Store`]: `runs` (runs and the run list),
//! `records` (prompts and records), `metrics` (metric rows, plugin failures), `vocab`
//! (vocabularies, derived caches), `sharing` (baselines, share links, API tokens), `exchange`
//! (export and import), `evals` (a run's evaluation identity and shard, docs/scale-out.md),
//! `trace_diff` (`trace diff` results, docs/traces.md §6);
//! `schema` holds the migrations, `codec` the BLOB encodings, `liveness` who has the file open.
//! Rows are read by column name. This file: opening, connections, identifiers and time.

mod codec;
mod evals;
mod exchange;
mod liveness;
mod metrics;
mod records;
mod runs;
mod schema;
mod sharing;
mod slices;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_family;
#[cfg(test)]
mod tests_hostile;
#[cfg(test)]
mod tests_trace_diff;
mod trace_diff;
mod vocab;
mod watch;

pub use codec::{column_to_le, f32s_to_le, le_to_column, le_to_f32s, le_to_u32s, u32s_to_le};
pub use evals::*;
pub use exchange::*;
pub use metrics::*;
pub use records::*;
pub use runs::*;
pub use sharing::*;
pub use trace_diff::*;
pub use vocab::*;
pub use watch::*;

use anyhow::{anyhow, bail, Context, Result};
use draftlens_records::RecordBatch;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, Transaction};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Read-only connections kept open for reuse.
const READER_POOL: usize = 16;

/// What opening a database found left behind by a process that died (see `liveness`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Runs it had left `running`, now marked failed (interrupted): (id, name).
    pub interrupted: Vec<(i64, String)>,
    /// Bytes of the write-ahead log it had left (0: none). SQLite keeps what it had committed
    /// and discards the rest.
    pub leftover_wal_bytes: u64,
}

pub struct Store {
    path: PathBuf,
    // Fields drop in this order: the read-only connections first, so that the writer is the
    // last connection to close, which checkpoints the write-ahead log and deletes it (a
    // read-only connection closing last cannot, and left the log behind after every use).
    readers: Mutex<Vec<Connection>>,
    writer: Mutex<Connection>,
    recovered: Recovered,
    /// This process's hold on the file, shared with other processes while the store is open
    /// (declared last: dropped after every connection is closed).
    _open: Option<liveness::OpenHold>,
}

fn configure(conn: &Connection, what: &str) -> Result<()> {
    // journal_mode=WAL persists in the file; the others are per connection.
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .with_context(|| format!("{what}: cannot set busy timeout"))?;
    // A checkpoint every 16k pages (64 MiB of WAL) instead of SQLite's 1000 (4 MiB): a run's
    // records are ~250 KB per prompt, and each checkpoint fsyncs. Behind the cache writer's
    // fsyncs of gigabytes of hidden states, the default's checkpoint every ~16 prompts made
    // storing records take 10.2 s of a 44 s CUDA run; with this, 0.9 s (docs/benchmarks-cuda.md,
    // "End to end, third round").
    conn.execute_batch(
        "PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL; PRAGMA temp_store=MEMORY; PRAGMA cache_size=-65536; PRAGMA wal_autocheckpoint=16384;",
    )
    .with_context(|| format!("{what}: cannot configure connection"))?;
    Ok(())
}

impl Store {
    /// Opens the store of an existing database file, for commands that only read runs (`runs
    /// ls`, `runs show`, `compare`, `report`, `push`): a mistyped `--db` is an error naming the
    /// path, never a new empty database. Otherwise as [`Store::open`].
    pub fn open_existing(path: &Path) -> Result<Store> {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Store::open(path),
            Ok(_) => bail!("{}: not a run database (it is not a file)", path.display()),
            Err(e) => bail!(
                "{}: no such run database ({e}); commands that read runs never create one",
                path.display()
            ),
        }
    }

    /// Opens (creating if needed) the store at `path` and brings its schema up to date. When no
    /// other process has the database open, runs left `running` by a process that died are
    /// marked interrupted, and a write-ahead log such a process left is reported (a warning).
    pub fn open(path: &Path) -> Result<Store> {
        let what = path.display().to_string();
        // Before SQLite opens the file and recovers it: how much of a log is there.
        let wal_bytes = liveness::wal_bytes(path);
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("{}: cannot create directory", dir.display()))?;
            }
        }
        let mut conn =
            Connection::open(path).with_context(|| format!("{what}: cannot open database"))?;
        configure(&conn, &what)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .with_context(|| format!("{what}: not a SQLite database or not writable"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            bail!("{what}: cannot switch to WAL mode (journal_mode is {mode}); is it on a network file system?");
        }
        schema::migrate(&mut conn, &what)?;
        let mut recovered = Recovered::default();
        let open = liveness::OpenHold::take(path, |alone| {
            if !alone {
                return;
            }
            if wal_bytes > 0 {
                recovered.leftover_wal_bytes = wal_bytes;
                tracing::warn!(
                    "{what}-wal: a write-ahead log of {wal_bytes} bytes, left by a process that stopped without \
                     closing the database: SQLite kept the transactions it had committed and discarded the rest \
                     (a write that was cut short)"
                );
            }
            match runs::mark_interrupted(&mut conn) {
                Ok(marked) => {
                    for (id, name) in &marked {
                        tracing::warn!(
                            "{what}: run {id} ({}) was left running by a process that is gone: marked failed \
                             (interrupted)",
                            crate::text::printable(name)
                        );
                    }
                    recovered.interrupted = marked;
                }
                // Not a reason to refuse the database: the runs stay `running` until next time.
                Err(e) => tracing::warn!("{what}: cannot mark the runs of a process that is gone: {e:#}"),
            }
        })
        .with_context(|| format!("{what}: cannot lock the database file"))?;
        Ok(Store {
            path: path.to_path_buf(),
            readers: Mutex::new(Vec::new()),
            writer: Mutex::new(conn),
            recovered,
            _open: open,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What this open found left behind by a process that died (nothing when another process
    /// had the database open: see `liveness`).
    pub fn recovered(&self) -> &Recovered {
        &self.recovered
    }

    /// Schema version of the open database (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?))
    }

    fn what(&self) -> String {
        self.path.display().to_string()
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = self
            .readers
            .lock()
            .map_err(|_| anyhow!("{}: reader pool poisoned", self.what()))?
            .pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX
                        | OpenFlags::SQLITE_OPEN_URI,
                )
                .with_context(|| format!("{}: cannot open database for reading", self.what()))?;
                configure(&c, &self.what())?;
                c
            }
        };
        let out = f(&conn);
        if let Ok(mut pool) = self.readers.lock() {
            if pool.len() < READER_POOL {
                pool.push(conn);
            }
        }
        out
    }

    fn write<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut conn = self
            .writer
            .lock()
            .map_err(|_| anyhow!("{}: writer connection poisoned", self.what()))?;
        f(&mut conn)
    }

    /// Folds the write-ahead log into the database file and truncates it (`serve` calls this on
    /// shutdown, so the file is complete without its `-wal` companion).
    pub fn checkpoint(&self) -> Result<()> {
        self.write(|c| {
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .with_context(|| format!("{}: WAL checkpoint failed", self.what()))?;
            c.execute_batch("PRAGMA optimize")
                .with_context(|| format!("{}: PRAGMA optimize failed", self.what()))?;
            Ok(())
        })
    }

    /// Consistent copy of the database (safe while others write).
    pub fn snapshot(&self, to: &Path) -> Result<()> {
        let dest = to
            .to_str()
            .ok_or_else(|| anyhow!("{}: path is not UTF-8", to.display()))?;
        self.read(|c| {
            c.execute("VACUUM INTO ?1", [dest])
                .with_context(|| format!("{}: snapshot failed", to.display()))?;
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Identifiers and time
// ---------------------------------------------------------------------------------------------

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Hex of `nbytes` random bytes from the OS (/dev/urandom: token secrets and share ids must not
/// be guessable). Where that device is missing, falls back to sha256 of OS-seeded hasher keys,
/// the clock, the pid and a counter.
pub fn random_hex(nbytes: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; nbytes];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
    {
        return hex::encode(buf);
    }
    fallback_random_hex(nbytes)
}

fn fallback_random_hex(nbytes: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < nbytes * 2 {
        let mut h = Sha256::new();
        let rs = std::collections::hash_map::RandomState::new();
        let mut sh = rs.build_hasher();
        sh.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.update(sh.finish().to_le_bytes());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        h.update(nanos.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        out.push_str(&hex::encode(h.finalize()));
    }
    out.truncate(nbytes * 2);
    out
}

/// Time-ordered unique id: 12 hex digits of milliseconds since the epoch + 20 random hex digits.
pub fn new_uid() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{:012x}{}", ms as u64 & 0xffff_ffff_ffff, random_hex(10))
}

/// Current UTC time as RFC 3339 with seconds ("2026-11-29T10:11:12Z").
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    rfc3339_from_unix(secs)
}

pub fn rfc3339_from_unix(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
