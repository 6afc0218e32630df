//! The target's per-sequence cache: K/V of attention layers, and for hybrid models the
//! recurrent state (conv state + S) of Gated DeltaNet layers, with the snapshot that lets a
//! speculative-decoding verify pass be cropped ([`super::TargetModel::crop`]).

use super::gdn::GdnState;
use super::transformer::CachedRows;
use crate::backend::{AttnMask, AttnShape, Backend};
use anyhow::{bail, Result};

/// One layer's cache: K and V for positions `0..len` (attention layers), or the recurrent
/// state after position `len − 1` (Gated DeltaNet layers; `None` until the first token).
pub struct LayerCache<B: Backend> {
    pub k: Option<B::Tensor>,
    pub v: Option<B::Tensor>,
    pub gdn: Option<GdnState<B>>,
}

impl<B: Backend> LayerCache<B> {
    fn append(&mut self, be: &B, k: B::Tensor, v: B::Tensor) -> Result<()> {
        for (slot, new) in [(&mut self.k, k), (&mut self.v, v)] {
            match slot {
                Some(old) => be.append_rows(old, &new)?,
                None => *slot = Some(new),
            }
        }
        Ok(())
    }

    /// Append the new tokens' K/V, then attend `q` (those tokens, at positions `start..`) over
    /// every cached position, causally: the cached forward of one sequence and each row of a
    /// batched decode step.
    pub(crate) fn append_and_attend(
        &mut self,
        be: &B,
        q: &B::Tensor,
        k: B::Tensor,
        v: B::Tensor,
        shape: AttnShape,
        start: usize,
    ) -> Result<B::Tensor> {
        self.append(be, k, v)?;
        let (k_all, v_all) = (
            self.k.as_ref().expect("appended"),
            self.v.as_ref().expect("appended"),
        );
        be.attention(q, k_all, v_all, shape, &AttnMask::Causal { q_start: start })
    }
}

/// The recurrent states before the last cached forward, and that forward's tokens: a crop to a
/// length between `len` and the cache length restores the states and re-runs the kept tokens
/// (a recurrent state cannot be sliced like K/V).
pub(crate) struct Checkpoint<B: Backend> {
    pub len: usize,
    /// Per layer, a copy of its recurrent state (`None` for attention layers and before the
    /// first token).
    pub states: Vec<Option<GdnState<B>>>,
    pub ids: Vec<u32>,
    /// How that forward computed its rows: the replay computes the kept ones the same way.
    pub rows: CachedRows,
}

/// The target's cache: one [`LayerCache`] per layer, all holding positions `0..len`.
pub struct KvCache<B: Backend> {
    pub layers: Vec<LayerCache<B>>,
    pub len: usize,
    pub(crate) checkpoint: Option<Checkpoint<B>>,
}

impl<B: Backend> KvCache<B> {
    pub fn new(num_layers: usize) -> Self {
        KvCache {
            layers: (0..num_layers)
                .map(|_| LayerCache {
                    k: None,
                    v: None,
                    gdn: None,
                })
                .collect(),
            len: 0,
            checkpoint: None,
        }
    }

    /// The bookkeeping of a decode step that appended one token (its rows are the backend's).
    pub(crate) fn took_decode_step(&mut self) {
        self.len += 1;
        // The decode step moved the recurrent states past the last forward's snapshot.
        self.checkpoint = None;
    }

    /// Whether some layer holds a recurrent state (a hybrid model's cache after a forward).
    pub fn has_recurrent_state(&self) -> bool {
        self.layers.iter().any(|l| l.gdn.is_some())
    }

    /// Drop every position `>= len` of the attention layers (speculative decoding rejects the
    /// unaccepted tail). A hybrid cache's recurrent state cannot be cut this way: that is an
    /// error; use [`super::TargetModel::crop`].
    pub fn crop(&mut self, be: &B, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        if self.has_recurrent_state() {
            bail!(
                "cannot crop a hybrid model's cache from {} to {len} tokens by slicing: its recurrent state must be restored and recomputed (TargetModel::crop)",
                self.len
            );
        }
        self.crop_attention(be, len)
    }

    /// Slice every attention layer's K/V to `len` positions and set the length.
    pub(crate) fn crop_attention(&mut self, be: &B, len: usize) -> Result<()> {
        for l in &mut self.layers {
            if let (Some(k), Some(v)) = (&l.k, &l.v) {
                l.k = Some(be.slice_rows(k, 0, len)?);
                l.v = Some(be.slice_rows(v, 0, len)?);
            }
        }
        self.len = len;
        Ok(())
    }

    /// Remember the current recurrent states and the tokens about to be appended.
    pub(crate) fn take_checkpoint(&mut self, be: &B, ids: &[u32], rows: CachedRows) -> Result<()> {
        let states = self
            .layers
            .iter()
            .map(|l| l.gdn.as_ref().map(|s| s.copy(be)).transpose())
            .collect::<Result<Vec<_>>>()?;
        self.checkpoint = Some(Checkpoint {
            len: self.len,
            states,
            ids: ids.to_vec(),
            rows,
        });
        Ok(())
    }
}
