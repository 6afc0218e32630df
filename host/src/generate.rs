//! Greedy generation with a KV cache: the target's own continuation, which every drafter metric
//! is measured against.

use crate::backend::Backend;
use crate::model::{Capture, TargetModel};
use anyhow::Result;

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopReason {
    Eos,
    Length,
    /// The model's context window is full.
    Context,
}

/// The target's greedy continuation of a prompt.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Continuation {
    /// Generated ids, including the EOS token when generation stopped on it.
    pub ids: Vec<u32>,
    pub stop: StopReason,
}

/// Greedy decode: one prefill over the prompt, then one token per step with the KV cache.
pub fn greedy<B: Backend>(
    be: &B,
    model: &TargetModel<B>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
) -> Result<Continuation> {
    let mut cache = model.new_cache();
    let mut ids = Vec::with_capacity(max_new);
    if max_new == 0 || prompt.is_empty() {
        return Ok(Continuation {
            ids,
            stop: StopReason::Length,
        });
    }
    let limit = model.spec.max_position_embeddings;
    let out = model.forward(be, prompt, &mut cache, &Capture::none())?;
    let rows = be.dims(&out.last_hidden).0;
    let last = be.slice_rows(&out.last_hidden, rows - 1, rows)?;
    let mut next = model.logits_topk(be, &last, 1)?.ids[0];
    loop {
        ids.push(next);
        if eos.contains(&next) {
            return Ok(Continuation {
                ids,
                stop: StopReason::Eos,
            });
        }
        if ids.len() >= max_new {
            return Ok(Continuation {
                ids,
                stop: StopReason::Length,
            });
        }
        if cache.len + 1 > limit {
            return Ok(Continuation {
                ids,
                stop: StopReason::Context,
            });
        }
        let out = model.forward(be, &[next], &mut cache, &Capture::none())?;
        next = model.logits_topk(be, &out.last_hidden, 1)?.ids[0];
    }
}
