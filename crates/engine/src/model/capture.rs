//! Which hidden states a forward pass keeps — the one definition of hidden-state indices in
//! draftlens (docs/hidden-states.md repeats it).
//!
//! Hugging Face convention (`output_hidden_states=True`), for a model with L decoder layers:
//!
//! | index | content |
//! |---|---|
//! | 0 | embedding output (= input of layer 0) |
//! | i, 1 ≤ i ≤ L−1 | residual stream after decoder layer i−1 (un-normalised) |
//! | L | output of layer L−1 **after the final RMSNorm** (= `last_hidden_state`) |
//!
//! plus `prenorm`: the output of layer L−1 *before* the final norm (what vLLM's extractor
//! returns for id = L). Drafter taps (`target_layer_ids`, 0-based decoder-layer outputs) map to
//! index `id + 1`: see [`Capture::for_layer_ids`].

use crate::backend::Backend;
use anyhow::{bail, Result};

/// The hidden states to keep.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capture {
    /// Hugging Face `hidden_states` indices, each in `0..=L`, sorted and unique.
    pub indices: Vec<usize>,
    /// Also keep the last layer's output before the final norm.
    pub prenorm: bool,
}

impl Capture {
    pub fn none() -> Self {
        Capture::default()
    }
    /// Hugging Face indices, validated against the model depth.
    pub fn hf_indices(mut indices: Vec<usize>, num_layers: usize) -> Result<Self> {
        indices.sort_unstable();
        indices.dedup();
        if let Some(&bad) = indices.iter().find(|&&i| i > num_layers) {
            bail!("hidden-state index {bad} is out of range: the model has {num_layers} layers, so indices are 0..={num_layers}");
        }
        Ok(Capture {
            indices,
            prenorm: false,
        })
    }
    /// Decoder-layer output ids (DFlash `target_layer_ids`, `extract --layers`): id → index id+1.
    pub fn for_layer_ids(ids: &[usize], num_layers: usize) -> Result<Self> {
        if let Some(&bad) = ids.iter().find(|&&i| i >= num_layers) {
            bail!("layer id {bad} is out of range: the model has {num_layers} decoder layers (ids 0..{})", num_layers - 1);
        }
        Capture::hf_indices(ids.iter().map(|i| i + 1).collect(), num_layers)
    }
    pub fn wants(&self, index: usize) -> bool {
        self.indices.binary_search(&index).is_ok()
    }
}

/// Hidden states kept by one forward pass, in increasing index order.
pub struct Captured<B: Backend> {
    pub states: Vec<(usize, B::Tensor)>,
    pub prenorm: Option<B::Tensor>,
}

impl<B: Backend> Default for Captured<B> {
    fn default() -> Self {
        Captured {
            states: Vec::new(),
            prenorm: None,
        }
    }
}

impl<B: Backend> Captured<B> {
    /// Keep a copy of `h` if `capture` wants `index`.
    pub(crate) fn offer(
        &mut self,
        be: &B,
        capture: &Capture,
        index: usize,
        h: &B::Tensor,
    ) -> Result<()> {
        if capture.wants(index) {
            let rows = be.dims(h).0;
            self.states.push((index, be.slice_rows(h, 0, rows)?));
        }
        Ok(())
    }
    pub fn get(&self, index: usize) -> Option<&B::Tensor> {
        self.states
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, t)| t)
    }
}
