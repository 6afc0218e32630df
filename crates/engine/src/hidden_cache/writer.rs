//! Writes cache entries on a background thread, so that encoding, checksumming and fsyncing the
//! hidden states of one pack overlap the GPU's work on the next (issue 11, "overlap").
//!
//! Each entry is still written by [`HiddenCache::put`] (temp file, fsync, atomic rename): a
//! process killed with writes queued loses those entries, never corrupts one, and a later run
//! recomputes what is missing. Errors are kept and returned by the next [`CacheWriter::put`] or by
//! [`CacheWriter::flush`], which a command calls before it reports success.
//!
//! The queue is bounded by bytes ([`CacheWriter::QUEUE_BYTES`] of entries announced with
//! [`CacheWriter::put_sized`]) and by count ([`CacheWriter::DEPTH`]), so a disk slower than the
//! GPU slows the producer instead of holding every pending hidden state in host memory. A bound
//! by count alone stalled the producer behind a pack's hidden states: a `run` queues one entry
//! per prompt of a pack (~12 MB each for an 8B target), then one small records entry per prompt
//! drafted, and with 32 slots each records entry waited ~5 ms for a slot, the GPU idle
//! (docs/benchmarks-cuda.md, "Session 13").

use crate::hidden_cache::{CacheKey, CachedTensor, HiddenCache};
use anyhow::{anyhow, Result};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// One entry to store: the key, and the closure that builds its tensors (run on a writer thread:
/// converting and copying them is part of the work moved off the main thread).
type Job = (CacheKey, Box<dyn FnOnce() -> Vec<CachedTensor> + Send>);

/// A job with its announced bytes and its key's digest.
type Queued = (Job, usize, String);

/// What the writers share with the producer.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever an entry is done (the pending count or bytes went down).
    idle: Condvar,
}

#[derive(Default)]
struct State {
    /// Entries queued or being written.
    pending: usize,
    /// Their announced bytes.
    bytes: usize,
    /// Their keys ([`CacheKey::digest`]), counted: a lookup waits only for its own keys.
    keys: std::collections::HashMap<String, usize>,
    /// The first error not yet reported.
    error: Option<anyhow::Error>,
}

impl State {
    /// Grow (`delta` > 0) or shrink the announced bytes, and the process-wide figure the
    /// timeline subtracts from host memory (`timeline::queued_cache_bytes`).
    fn queued_bytes(&mut self, delta: i64) {
        if delta >= 0 {
            self.bytes += delta as usize;
        } else {
            self.bytes -= delta.unsigned_abs() as usize;
        }
        crate::timeline::queued_cache_bytes(delta);
    }
}

pub struct CacheWriter {
    tx: Option<Sender<Queued>>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl CacheWriter {
    /// Entries queued before a put blocks.
    pub const DEPTH: usize = 1024;
    /// Announced bytes queued before [`CacheWriter::put_sized`] blocks (an 8B target's entry with
    /// 5 taps of a 300-token sequence is about 12 MB in bf16); one larger entry is still taken
    /// when nothing else is queued.
    pub const QUEUE_BYTES: usize = 1 << 30;
    /// Writer threads: each entry ends with two fsyncs, which a single thread waits for one
    /// after another (the H200 host's disk left a 1–2 s tail after the GPU work with one).
    pub const THREADS: usize = 4;

    pub fn new(cache: HiddenCache) -> CacheWriter {
        let (tx, rx) = channel::<Queued>();
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

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_error(&self) -> Result<()> {
        match self.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Queue the small entry `tensors()` under `key` (continuations, drafter records). Returns
    /// an earlier write's error, if any.
    pub fn put(
        &self,
        cache: &HiddenCache,
        key: CacheKey,
        tensors: impl FnOnce() -> Vec<CachedTensor> + Send + 'static,
    ) -> Result<()> {
        self.put_sized(cache, key, 0, tensors)
    }

    /// Queue an entry of about `bytes` (hidden states), waiting while the queue holds more than
    /// [`CacheWriter::QUEUE_BYTES`] with it.
    pub fn put_sized(
        &self,
        cache: &HiddenCache,
        key: CacheKey,
        bytes: usize,
        tensors: impl FnOnce() -> Vec<CachedTensor> + Send + 'static,
    ) -> Result<()> {
        self.take_error()?;
        let Some(tx) = &self.tx else {
            return cache.put(&key, &tensors()).map(|_| ());
        };
        let digest = key.digest();
        {
            let mut st = self.lock();
            while st.pending > 0
                && (st.pending >= Self::DEPTH || st.bytes + bytes > Self::QUEUE_BYTES)
            {
                st = self.shared.idle.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.pending += 1;
            st.queued_bytes(bytes as i64);
            *st.keys.entry(digest.clone()).or_insert(0) += 1;
        }
        tx.send(((key, Box::new(tensors)), bytes, digest.clone()))
            .map_err(|_| {
                let mut st = self.lock();
                st.pending -= 1;
                st.queued_bytes(-(bytes as i64));
                forget_key(&mut st, &digest);
                anyhow!("the cache writer threads stopped")
            })
    }

    /// Wait until none of `keys` is queued or being written (entries of other keys may still
    /// be): a lookup of `keys` after this sees what this session queued for them.
    pub fn wait_for(&self, keys: &[CacheKey]) {
        let digests: Vec<String> = keys.iter().map(CacheKey::digest).collect();
        let mut st = self.lock();
        while digests.iter().any(|d| st.keys.contains_key(d)) {
            st = self.shared.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wait until every queued entry is written (or failed), leaving any error for
    /// [`CacheWriter::flush`]: a lookup after this sees every entry queued before it.
    pub fn wait(&self) {
        let mut st = self.lock();
        while st.pending > 0 {
            st = self.shared.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wait until every queued entry is written; the first error of any of them.
    pub fn flush(&self) -> Result<()> {
        self.wait();
        self.take_error()
    }
}

fn forget_key(st: &mut State, digest: &str) {
    if let Some(n) = st.keys.get_mut(digest) {
        *n -= 1;
        if *n == 0 {
            st.keys.remove(digest);
        }
    }
}

fn work(cache: HiddenCache, rx: Arc<Mutex<Receiver<Queued>>>, shared: Arc<Shared>) {
    loop {
        // The lock is held only to take the next job, not while writing it.
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(((key, tensors), bytes, digest)) = job else {
            return;
        };
        let result = {
            let _t = crate::timeline::background("cache write");
            cache.put(&key, &tensors())
        };
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = result {
            // Keep the first error; later ones are usually the same disk problem.
            st.error.get_or_insert(e);
        }
        st.pending -= 1;
        st.queued_bytes(-(bytes as i64));
        forget_key(&mut st, &digest);
        // A producer waiting for room, `wait` (for zero) and `wait_for` (for keys) listen.
        shared.idle.notify_all();
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
    use crate::hidden_cache::CachedData;

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

    /// An entry of one tensor "x" of `shape` holding `values`.
    fn entry(shape: usize, values: Vec<f32>) -> Vec<CachedTensor> {
        vec![CachedTensor {
            name: "x".into(),
            shape: vec![shape],
            data: CachedData::F32(values),
        }]
    }

    #[test]
    fn queued_entries_are_all_stored_by_flush_and_read_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HiddenCache::open(dir.path()).unwrap();
        let w = CacheWriter::new(cache.clone());
        for n in 0..64 {
            w.put(&cache, key(n), move || entry(2, vec![n as f32, -1.5]))
                .unwrap();
        }
        w.flush().unwrap();
        for n in 0..64 {
            let t = cache.get(&key(n)).unwrap().expect("stored");
            assert_eq!(t[0].data, CachedData::F32(vec![n as f32, -1.5]));
        }
    }

    /// Entries announced larger than the byte bound are taken one at a time (each waits for the
    /// queue to empty), never refused or deadlocked, and all are stored.
    #[test]
    fn entries_over_the_byte_bound_wait_their_turn_and_are_all_stored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HiddenCache::open(dir.path()).unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let c = cache.clone();
        std::thread::spawn(move || {
            let w = CacheWriter::new(c.clone());
            let sizes = [
                CacheWriter::QUEUE_BYTES,
                CacheWriter::QUEUE_BYTES / 2,
                3 << 29,
                0,
            ];
            for (n, bytes) in sizes.into_iter().enumerate() {
                w.put_sized(&c, key(n as u32), bytes, move || entry(1, vec![n as f32]))
                    .unwrap();
            }
            w.flush().unwrap();
            done_tx.send(()).unwrap();
        });
        done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the puts finished (no deadlock)");
        for n in 0..4 {
            let t = cache.get(&key(n)).unwrap().expect("stored");
            assert_eq!(t[0].data, CachedData::F32(vec![n as f32]));
        }
    }

    /// `wait_for` waits for its own keys only: another key's slow write does not hold it, and
    /// after it returns its key's entry is readable.
    #[test]
    fn wait_for_waits_for_its_own_keys_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HiddenCache::open(dir.path()).unwrap();
        let w = CacheWriter::new(cache.clone());
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        // Entry 1 is written only once the test releases it.
        w.put(&cache, key(1), move || {
            release_rx.recv().unwrap();
            entry(1, vec![1.0])
        })
        .unwrap();
        w.put(&cache, key(2), || entry(1, vec![2.0])).unwrap();
        // Returns while entry 1 is still held back (it would hang here if it waited for all).
        w.wait_for(&[key(2), key(3)]);
        assert!(
            cache.get(&key(2)).unwrap().is_some(),
            "entry 2 readable after wait_for"
        );
        assert!(
            cache.get(&key(1)).unwrap().is_none(),
            "entry 1 still held back"
        );
        release_tx.send(()).unwrap();
        w.wait_for(&[key(1)]);
        let t = cache
            .get(&key(1))
            .unwrap()
            .expect("entry 1 readable after wait_for");
        assert_eq!(t[0].data, CachedData::F32(vec![1.0]));
        w.flush().unwrap();
    }

    #[test]
    fn a_failed_write_is_reported_by_flush_and_the_entry_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HiddenCache::open(dir.path()).unwrap();
        let w = CacheWriter::new(cache.clone());
        // A tensor whose data does not match its shape cannot be encoded.
        w.put(&cache, key(1), || entry(3, vec![1.0])).unwrap();
        let err = w.flush().unwrap_err();
        assert!(format!("{err:#}").contains("cannot encode"), "{err:#}");
        assert!(cache.get(&key(1)).unwrap().is_none());
        // Reported once; the writers keep working.
        w.put(&cache, key(2), || vec![]).unwrap();
        w.flush().unwrap();
    }
}
