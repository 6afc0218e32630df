//! Taps kept on the device between the target pass that computed them and the drafters that read
//! them ([`super::Session::target_passes_for_drafting`]).
//!
//! Why: `run` evaluates a series' checkpoints one after another over the same prompts. Without
//! this, each checkpoint after the first reads every prompt's taps back from the disk cache and
//! every checkpoint uploads them again for its drafter's context: on the H200, an 8B run of 3
//! checkpoints spent ~1 s in cache reads and ~1.7 s in context uploads with the GPU mostly idle
//! (docs/benchmarks-cuda.md, "Session 14"). The hidden states on the device are the very values
//! the host copy holds (the host copy is downloaded from them), so a drafter's records do not
//! depend on which one it reads.
//!
//! The store is bounded by bytes and drops its oldest passes first. It is off on backends whose
//! "device" memory is the host's (the CPU: [`super::SessionOptions::resident_tap_bytes`] decides).

use crate::backend::TopK;
use std::collections::VecDeque;
use std::sync::Arc;

/// One sequence's taps on the device, with the target's top-K of the same pass (host memory:
/// a pass served from here needs nothing from the disk cache).
pub struct ResidentPass<T> {
    /// `(HF index, [T, D] tensor)` in the order the pass captured them.
    pub taps: Vec<(usize, T)>,
    pub topk: TopK,
    pub(super) bytes: usize,
}

impl<T> ResidentPass<T> {
    /// The tap of HF hidden-state index `index`.
    pub fn tap(&self, index: usize) -> Option<&T> {
        self.taps.iter().find(|(i, _)| *i == index).map(|(_, t)| t)
    }
}

/// Recent passes by cache-key digest, oldest first, within `budget` bytes.
pub(super) struct ResidentTaps<T> {
    /// None until the first insert decides it (the device's free memory is known only once the
    /// model is loaded).
    pub(super) budget: Option<usize>,
    used: usize,
    entries: VecDeque<(String, Arc<ResidentPass<T>>)>,
}

impl<T> Default for ResidentTaps<T> {
    fn default() -> Self {
        ResidentTaps {
            budget: None,
            used: 0,
            entries: VecDeque::new(),
        }
    }
}

impl<T> ResidentTaps<T> {
    pub(super) fn get(&self, digest: &str) -> Option<Arc<ResidentPass<T>>> {
        self.entries
            .iter()
            .find(|(d, _)| d == digest)
            .map(|(_, p)| p.clone())
    }

    /// Keep `pass` under `digest`, dropping the oldest passes until it fits, and return what is
    /// held under `digest`: a pass larger than the whole budget is not kept (None), and a pass
    /// already held keeps its place (that one is returned).
    pub(super) fn insert(
        &mut self,
        digest: String,
        pass: ResidentPass<T>,
    ) -> Option<Arc<ResidentPass<T>>> {
        let budget = self.budget.unwrap_or(0);
        if let Some(held) = self.get(&digest) {
            return Some(held);
        }
        if pass.bytes > budget {
            return None;
        }
        while self.used + pass.bytes > budget {
            match self.entries.pop_front() {
                Some((_, old)) => self.used -= old.bytes,
                None => break,
            }
        }
        self.used += pass.bytes;
        let pass = Arc::new(pass);
        self.entries.push_back((digest, pass.clone()));
        Some(pass)
    }

    pub(super) fn used(&self) -> usize {
        self.used
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(bytes: usize) -> ResidentPass<u8> {
        ResidentPass {
            taps: vec![(1, 0)],
            topk: TopK {
                rows: 0,
                k: 1,
                ids: vec![],
                logprobs: vec![],
            },
            bytes,
        }
    }

    #[test]
    fn the_oldest_passes_go_first_and_nothing_exceeds_the_budget() {
        let mut r = ResidentTaps::<u8> {
            budget: Some(100),
            ..Default::default()
        };
        r.insert("a".into(), pass(40));
        r.insert("b".into(), pass(40));
        assert_eq!(r.used(), 80);
        r.insert("c".into(), pass(40));
        assert!(r.get("a").is_none(), "the oldest pass must be dropped");
        assert!(r.get("b").is_some() && r.get("c").is_some());
        assert_eq!(r.used(), 80);
        // Larger than the whole budget: not kept, nothing dropped for it.
        r.insert("d".into(), pass(101));
        assert!(r.get("d").is_none() && r.get("b").is_some());
        // Inserting a held key again changes nothing.
        r.insert("b".into(), pass(40));
        assert_eq!(r.used(), 80);
        r.clear();
        assert_eq!(r.used(), 0);
        assert!(r.get("c").is_none());
        // No budget decided yet: nothing is kept.
        let mut off = ResidentTaps::<u8>::default();
        off.insert("a".into(), pass(1));
        assert!(off.get("a").is_none());
    }
}
