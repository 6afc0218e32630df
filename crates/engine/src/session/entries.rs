//! The session's cache entries (a continuation, a target pass) as tensors and back, and the
//! packer that groups sequences into packed forwards. Apart from `mod.rs` so that the session
//! reads as the steps of an evaluation.

use super::TargetPass;
use crate::backend::{HostRows, TopK};
use crate::generate::{Continuation, StopReason};
use crate::hidden_cache::{CachedData, CachedTensor};
use crate::model::Capture;
use std::sync::Arc;

/// Groups consecutive items into packs of at most `budget` tokens; an item longer than the
/// budget forms a pack of its own. Order is kept, so packs are deterministic.
pub struct Packer<T> {
    budget: usize,
    tokens: usize,
    items: Vec<T>,
}

impl<T> Packer<T> {
    pub fn new(budget: usize) -> Self {
        Packer {
            budget,
            tokens: 0,
            items: Vec::new(),
        }
    }

    /// Add an item of `len` tokens. Returns the pack so far when the item does not fit in it
    /// (the item then starts the next pack).
    pub fn push(&mut self, item: T, len: usize) -> Option<Vec<T>> {
        let full =
            (!self.items.is_empty() && self.tokens + len > self.budget).then(|| self.finish());
        self.tokens += len;
        self.items.push(item);
        full
    }

    /// Take the pack being filled (possibly empty) and start a new one.
    pub fn finish(&mut self) -> Vec<T> {
        self.tokens = 0;
        std::mem::take(&mut self.items)
    }
}

/// What the cache entry of one pass is built from, owned so the cache writer thread can build it.
pub(super) struct PassEntry {
    rows: usize,
    hidden_size: usize,
    /// Shared with the pass until [`PassEntry::tensors`] runs (on the cache writer's thread).
    hidden: Vec<(usize, Arc<HostRows>)>,
    topk: TopK,
}

impl PassEntry {
    /// The hidden states in the dtype they were computed in (nothing is rounded).
    pub(super) fn of(p: &TargetPass) -> PassEntry {
        let hidden = p.hidden.iter().map(|(i, h)| (*i, Arc::clone(h))).collect();
        PassEntry::with_hidden(p, hidden)
    }

    /// [`PassEntry::of`] without copying the hidden states: they move into the entry and the
    /// pass is left without them (`extract` without `--out` needs only that they are cached).
    pub(super) fn take(p: &mut TargetPass) -> PassEntry {
        let hidden = std::mem::take(&mut p.hidden);
        PassEntry::with_hidden(p, hidden)
    }

    fn with_hidden(p: &TargetPass, hidden: Vec<(usize, Arc<HostRows>)>) -> PassEntry {
        PassEntry {
            rows: p.ids.len(),
            hidden_size: p.hidden_size,
            hidden,
            topk: p.topk.clone(),
        }
    }

    /// The hidden states' bytes (what the entry holds in memory while it is queued).
    pub(super) fn bytes(&self) -> usize {
        self.hidden.iter().map(|(_, h)| h.byte_len()).sum()
    }

    /// The entry's tensors (the layout [`decode_pass`] reads).
    pub(super) fn tensors(self) -> Vec<CachedTensor> {
        let (t, d, k) = (self.rows, self.hidden_size, self.topk.k);
        let mut tensors: Vec<CachedTensor> = self
            .hidden
            .into_iter()
            .map(|(i, h)| CachedTensor {
                name: format!("hs.{i}"),
                shape: vec![t, d],
                // Moved when the pass is gone, copied (here, off the main thread) while it lives.
                data: data_of(Arc::try_unwrap(h).unwrap_or_else(|shared| (*shared).clone())),
            })
            .collect();
        tensors.push(CachedTensor {
            name: "topk_ids".into(),
            shape: vec![t, k],
            data: CachedData::U32(self.topk.ids),
        });
        tensors.push(CachedTensor {
            name: "topk_logprobs".into(),
            shape: vec![t, k],
            data: CachedData::F32(self.topk.logprobs),
        });
        tensors
    }
}

fn data_of(h: HostRows) -> CachedData {
    match h {
        HostRows::BF16(v) => CachedData::BF16(v),
        HostRows::F32(v) => CachedData::F32(v),
    }
}

fn find<'a>(t: &'a [CachedTensor], name: &str) -> Option<&'a CachedTensor> {
    t.iter().find(|x| x.name == name)
}

/// The cache entry of a continuation: its ids and the stop reason (0 EOS, 1 length, 2 context).
pub(super) fn continuation_tensors(c: &Continuation) -> Vec<CachedTensor> {
    let stop = match c.stop {
        StopReason::Eos => 0u32,
        StopReason::Length => 1,
        StopReason::Context => 2,
    };
    vec![
        CachedTensor {
            name: "ids".into(),
            shape: vec![c.ids.len()],
            data: CachedData::U32(c.ids.clone()),
        },
        CachedTensor {
            name: "stop".into(),
            shape: vec![1],
            data: CachedData::U32(vec![stop]),
        },
    ]
}

pub(super) fn decode_continuation(t: &[CachedTensor]) -> Option<Continuation> {
    let ids = match &find(t, "ids")?.data {
        CachedData::U32(v) => v.clone(),
        _ => return None,
    };
    let stop = match &find(t, "stop")?.data {
        CachedData::U32(v) => match v.first()? {
            0 => StopReason::Eos,
            1 => StopReason::Length,
            _ => StopReason::Context,
        },
        _ => return None,
    };
    Some(Continuation { ids, stop })
}

pub(super) fn decode_pass(
    t: Vec<CachedTensor>,
    ids: &[u32],
    capture: &Capture,
    d: usize,
    k: usize,
) -> Option<TargetPass> {
    // The tensors are moved out of the entry: a pass's hidden states are megabytes.
    let mut by_name: std::collections::HashMap<String, CachedData> =
        t.into_iter().map(|x| (x.name, x.data)).collect();
    let mut hidden = Vec::new();
    for &i in &capture.indices {
        match by_name.remove(&format!("hs.{i}"))? {
            CachedData::F32(v) if v.len() == ids.len() * d => {
                hidden.push((i, Arc::new(HostRows::F32(v))))
            }
            CachedData::BF16(v) if v.len() == ids.len() * d => {
                hidden.push((i, Arc::new(HostRows::BF16(v))))
            }
            _ => return None,
        }
    }
    let tid = match by_name.remove("topk_ids")? {
        CachedData::U32(v) => v,
        _ => return None,
    };
    let tlp = match by_name.remove("topk_logprobs")? {
        CachedData::F32(v) => v,
        _ => return None,
    };
    if tid.len() != ids.len() * k || tlp.len() != tid.len() {
        return None;
    }
    Some(TargetPass {
        ids: ids.to_vec(),
        hidden,
        hidden_size: d,
        topk: TopK {
            rows: ids.len(),
            k,
            ids: tid,
            logprobs: tlp,
        },
        cached: true,
    })
}
