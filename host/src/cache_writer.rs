//! Writes cache entries on a background thread, so that encoding, checksumming and fsyncing the
//! hidden states of one pack overlap the GPU's work on the next (issue 11, "overlap").
//!
//! Each entry is still written by [`HiddenCache::put`] (temp file, fsync, atomic rename): a
//! process killed with writes queued loses those entries, never corrupts one, and a later run
//! recomputes what is missing. Errors are kept and returned by the next [`CacheWriter::put`] or by
//! [`CacheWriter::flush`], which a command calls before it reports success.
//!
//! The queue is bounded ([`CacheWriter::DEPTH`] entries), so a disk slower than the GPU slows the
//! producer instead of holding every pending hidden state in host memory.

use crate::cache::{CacheKey, CachedTensor, HiddenCache};
use anyhow::{anyhow, Result};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What the writer thread is asked to do.
enum Job {
    /// Build the tensors (on the writer thread: converting and copying them is part of the work
    /// moved off the main thread) and store them under the key.
    Put(CacheKey, Box<dyn FnOnce() -> Vec<CachedTensor> + Send>),
    /// Reply once every earlier job is done.
    Flush(SyncSender<()>),
}

pub struct CacheWriter {
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// The first error of the writer thread, not yet reported.
    error: Arc<Mutex<Option<anyhow::Error>>>,
}

impl CacheWriter {
    /// Entries queued before [`CacheWriter::put`] blocks (an 8B target's entry with 5 taps of a
    /// 300-token sequence is about 12 MB in bf16).
    pub const DEPTH: usize = 32;

    pub fn new(cache: HiddenCache) -> CacheWriter {
        let (tx, rx) = sync_channel::<Job>(Self::DEPTH);
        let error = Arc::new(Mutex::new(None));
        let err = error.clone();
        let thread = std::thread::Builder::new()
            .name("cache-writer".into())
            .spawn(move || work(cache, rx, err));
        match thread {
            Ok(h) => CacheWriter {
                tx: Some(tx),
                thread: Some(h),
                error,
            },
            // No thread: every put is written by the caller (see `put`).
            Err(_) => CacheWriter {
                tx: None,
                thread: None,
                error,
            },
        }
    }

    fn take_error(&self) -> Result<()> {
        match self.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Queue the entry `tensors()` under `key`. Returns an earlier write's error, if any.
    pub fn put(
        &self,
        cache: &HiddenCache,
        key: CacheKey,
        tensors: impl FnOnce() -> Vec<CachedTensor> + Send + 'static,
    ) -> Result<()> {
        self.take_error()?;
        match &self.tx {
            Some(tx) => tx
                .send(Job::Put(key, Box::new(tensors)))
                .map_err(|_| anyhow!("the cache writer thread stopped")),
            None => cache.put(&key, &tensors()).map(|_| ()),
        }
    }

    /// Wait until every queued entry is written; the first error of any of them.
    pub fn flush(&self) -> Result<()> {
        if let Some(tx) = &self.tx {
            let (done_tx, done_rx) = sync_channel(1);
            tx.send(Job::Flush(done_tx))
                .map_err(|_| anyhow!("the cache writer thread stopped"))?;
            done_rx
                .recv()
                .map_err(|_| anyhow!("the cache writer thread stopped"))?;
        }
        self.take_error()
    }
}

fn work(cache: HiddenCache, rx: Receiver<Job>, error: Arc<Mutex<Option<anyhow::Error>>>) {
    for job in rx {
        match job {
            Job::Put(key, tensors) => {
                let _t = crate::timeline::background("cache write");
                if let Err(e) = cache.put(&key, &tensors()) {
                    let mut slot = error.lock().unwrap_or_else(|e| e.into_inner());
                    // Keep the first error; later ones are usually the same disk problem.
                    slot.get_or_insert(e);
                }
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

impl Drop for CacheWriter {
    /// Finishes the queued writes (a session dropped on an error path still stores what it
    /// computed); an error here can only be logged.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
        if let Ok(Some(e)) = self.error.lock().map(|mut e| e.take()) {
            tracing::warn!("a cache entry was not written: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CachedData;

    fn key(n: u32) -> CacheKey {
        CacheKey {
            kind: "test".into(),
            weights: "w".into(),
            tokenizer: "t".into(),
            token_ids: vec![n],
            layers: vec![],
            backend: "cpu".into(),
            dtype: "f32".into(),
            kernel_version: "k".into(),
            extra: String::new(),
        }
    }

    #[test]
    fn queued_entries_are_all_stored_by_flush_and_read_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HiddenCache::open(dir.path()).unwrap();
        let w = CacheWriter::new(cache.clone());
        for n in 0..(CacheWriter::DEPTH as u32 * 2) {
            w.put(&cache, key(n), move || {
                vec![CachedTensor {
                    name: "x".into(),
                    shape: vec![2],
                    data: CachedData::F32(vec![n as f32, -1.5]),
                }]
            })
            .unwrap();
        }
        w.flush().unwrap();
        for n in 0..(CacheWriter::DEPTH as u32 * 2) {
            let t = cache.get(&key(n)).unwrap().expect("stored");
            assert_eq!(t[0].data, CachedData::F32(vec![n as f32, -1.5]));
        }
    }

    #[test]
    fn a_failed_write_is_reported_by_flush_and_the_entry_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HiddenCache::open(dir.path()).unwrap();
        let w = CacheWriter::new(cache.clone());
        // A tensor whose data does not match its shape cannot be encoded.
        w.put(&cache, key(1), || {
            vec![CachedTensor {
                name: "x".into(),
                shape: vec![3],
                data: CachedData::F32(vec![1.0]),
            }]
        })
        .unwrap();
        let err = w.flush().unwrap_err();
        assert!(format!("{err:#}").contains("cannot encode"), "{err:#}");
        assert!(cache.get(&key(1)).unwrap().is_none());
        // Reported once; the writer keeps working.
        w.put(&cache, key(2), || vec![]).unwrap();
        w.flush().unwrap();
    }
}
