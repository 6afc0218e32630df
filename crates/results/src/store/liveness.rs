//! Who has a run database open: what tells a run another process is still running apart from
//! a run whose process was killed (kill -9, the OOM killer, a crash, a power cut), which would
//! otherwise stay `running` for ever.
//!
//! The store records no pid, host or heartbeat, and none is needed: every open [`Store`] holds a
//! shared `flock` on the database file, which the kernel drops when its process dies, however it
//! dies. Opening first tries to take that lock exclusively, without waiting. Getting it means no
//! other process has the database open through draftlens, so none can be running its runs: every
//! run still `running` (of origin `local`; an imported run is a copy of another database's) was
//! left by a process that is gone, and is marked `failed` with an error that starts
//! "interrupted". Not getting it leaves every run as it is, since its process may be alive; the
//! next open that finds the file free marks it. A killed run's caches stay valid, so running the
//! same command again resumes it (as a new run).
//!
//! Limits of the rule: Linux only (elsewhere nothing is marked); a process that opens the file
//! without draftlens (sqlite3, Python) holds no lock, but it cannot be running a draftlens run
//! either; an older draftlens that takes no lock counts as gone. The database must be on a local
//! disk anyway (WAL needs shared memory, docs/ui.md §5.4).
//!
//! SQLite locks the file with fcntl locks, which a process loses when it closes *any* descriptor
//! of the file. So each process opens the file once for all its stores (a process-wide table,
//! counted) and closes that descriptor only when its last store is dropped, after the store's
//! connections.

use std::path::Path;

/// Bytes in `<db>-wal`, 0 when there is none.
pub(super) fn wal_bytes(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// This process's hold on one database file (see the module doc); dropping the last one of a
/// file releases it.
pub(super) struct OpenHold {
    #[cfg(target_os = "linux")]
    key: (u64, u64),
}

#[cfg(target_os = "linux")]
mod imp {
    use super::OpenHold;
    use std::collections::BTreeMap;
    use std::fs::File;
    use std::path::Path;
    use std::sync::Mutex;

    /// (device, inode) of each database file this process has open → its descriptor (holding
    /// the shared lock) and how many stores use it.
    static OPEN: Mutex<BTreeMap<(u64, u64), (File, usize)>> = Mutex::new(BTreeMap::new());

    impl OpenHold {
        /// Registers a store of `db` (just opened by SQLite). `alone(true)` runs while this
        /// process holds the exclusive lock, i.e. no other process has the file open;
        /// `alone(false)` otherwise. Errors only when the file cannot be looked at.
        pub(in crate::store) fn take(
            db: &Path,
            alone: impl FnOnce(bool),
        ) -> std::io::Result<Option<OpenHold>> {
            use std::os::unix::fs::MetadataExt;
            let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
            let m = std::fs::metadata(db)?;
            let key = (m.dev(), m.ino());
            if let Some((_, stores)) = open.get_mut(&key) {
                *stores += 1;
                drop(open);
                alone(false);
                return Ok(Some(OpenHold { key }));
            }
            let file = File::open(db)?;
            let exclusive = file.try_lock().is_ok();
            alone(exclusive);
            if exclusive {
                file.unlock()?;
            }
            // Waits only while another process is opening (it holds the exclusive lock for
            // that long). Without the lock (a file system without flock), other processes will
            // take this one for gone: say so.
            if let Err(e) = file.lock_shared() {
                tracing::warn!(
                    "{}: cannot lock the database file ({e}): another draftlens opening it will take runs \
                     this process is running for interrupted ones",
                    db.display()
                );
            }
            open.insert(key, (file, 1));
            Ok(Some(OpenHold { key }))
        }
    }

    impl Drop for OpenHold {
        fn drop(&mut self) {
            let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, stores)) = open.get_mut(&self.key) {
                *stores -= 1;
                if *stores == 0 {
                    // Closing the descriptor releases the shared lock.
                    open.remove(&self.key);
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl OpenHold {
    /// Elsewhere than on Linux, no process is known to be alone: nothing is ever marked.
    pub(in crate::store) fn take(
        _db: &Path,
        alone: impl FnOnce(bool),
    ) -> std::io::Result<Option<OpenHold>> {
        alone(false);
        Ok(None)
    }
}
