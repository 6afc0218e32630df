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
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// One entry to store: the key, and the closure that builds its tensors (run on a writer thread:
/// converting and copying them is part of the work moved off the main thread).
type Job = (CacheKey, Box<dyn FnOnce() -> Vec<CachedTensor> + Send>);

/// What the writers share with the producer.
#[derive(Default)]
struct Shared {
    /// Entries queued or being written, and the first error not yet reported.
    state: Mutex<(usize, Option<anyhow::Error>)>,
    /// Signalled when the pending count reaches zero.
    idle: Condvar,
}

pub struct CacheWriter {
    tx: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl CacheWriter {
    /// Entries queued before [`CacheWriter::put`] blocks (an 8B target's entry with 5 taps of a
    /// 300-token sequence is about 12 MB in bf16).
    pub const DEPTH: usize = 32;
    /// Writer threads: each entry ends with two fsyncs, which a single thread waits for one
    /// after another (the H200 host's disk left a 1–2 s tail after the GPU work with one).
    pub const THREADS: usize = 4;

    pub fn new(cache: HiddenCache) -> CacheWriter {
        let (tx, rx) = sync_channel::<Job>(Self::DEPTH);
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(Shared::default());
        let threads: Vec<JoinHandle<()>> = (0..Self::THREADS)
            .filter_map(|i| {
                let (cache, rx, shared) = (cache.clone(), rx.clone(), shared.clone());
                std::thread::Builder::new()
                    .name(format!("cache-writer-{i}"))
                    .spawn(move || work(cache, rx, shared))
                    .ok()
            })
            .collect();
        CacheWriter {
            // No thread could start: every put is written by the caller (see `put`).
            tx: (!threads.is_empty()).then_some(tx),
            threads,
            shared,
        }
    }

    fn take_error(&self) -> Result<()> {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.1.take() {
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
        let Some(tx) = &self.tx else {
            return cache.put(&key, &tensors()).map(|_| ());
        };
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0 += 1;
        tx.send((key, Box::new(tensors))).map_err(|_| {
            self.shared
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .0 -= 1;
            anyhow!("the cache writer threads stopped")
        })
    }

    /// Wait until every queued entry is written (or failed), leaving any error for
    /// [`CacheWriter::flush`]: a lookup after this sees every entry queued before it.
    pub fn wait(&self) {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.0 > 0 {
            st = self.shared.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wait until every queued entry is written; the first error of any of them.
    pub fn flush(&self) -> Result<()> {
        self.wait();
        self.take_error()
    }
}

fn work(cache: HiddenCache, rx: Arc<Mutex<Receiver<Job>>>, shared: Arc<Shared>) {
    loop {
        // The lock is held only to take the next job, not while writing it.
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok((key, tensors)) = job else { return };
        let result = {
            let _t = crate::timeline::background("cache write");
            cache.put(&key, &tensors())
        };
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = result {
            // Keep the first error; later ones are usually the same disk problem.
            st.1.get_or_insert(e);
        }
        st.0 -= 1;
        if st.0 == 0 {
            shared.idle.notify_all();
        }
    }
}

impl Drop for CacheWriter {
    /// Finishes the queued writes (a session dropped on an error path still stores what it
    /// computed); an error here can only be logged.
    fn drop(&mut self) {
        drop(self.tx.take());
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        if let Err(e) = self.take_error() {
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
        // Reported once; the writers keep working.
        w.put(&cache, key(2), || vec![]).unwrap();
        w.flush().unwrap();
    }
}
