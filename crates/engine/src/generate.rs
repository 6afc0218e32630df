//! Greedy generation with a KV cache: the target's own continuation, which every drafter metric
//! is measured against.

use crate::backend::Backend;
use crate::model::{Capture, KvCache, StepRecorder, TargetModel};
use anyhow::{Context, Result};

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
    let mut out = greedy_batch(be, model, &[prompt], max_new, eos)?;
    out.pop().context("greedy: no continuation")
}

/// A prompt being decoded by [`greedy_batch`].
struct Decoding<B: Backend> {
    /// Index into the prompts.
    index: usize,
    cache: KvCache<B>,
    /// The token chosen last, not yet fed to the model.
    next: u32,
    /// The prompt has stopped but its row stays in the batch until the recorded step ends
    /// (see the loop in [`greedy_batch`]); its outputs are ignored.
    finished: bool,
}

/// Greedy decode of several prompts at once: each prompt is prefilled alone, then every decode
/// step feeds the next token of all unfinished prompts through one
/// [`TargetModel::forward_decode`]. A prompt leaves the batch when it stops (EOS, `max_new`,
/// context window). With at most [`Backend::max_independent_rows`] prompts each continuation is
/// bit-for-bit the one [`greedy`] gives for the prompt alone; callers group no more than that.
pub fn greedy_batch<B: Backend>(
    be: &B,
    model: &TargetModel<B>,
    prompts: &[&[u32]],
    max_new: usize,
    eos: &[u32],
) -> Result<Vec<Continuation>> {
    let mut done: Vec<Option<Continuation>> = vec![None; prompts.len()];
    let mut live: Vec<Decoding<B>> = Vec::new();
    let prefill = crate::timeline::phase("generate: prefill");
    for (index, prompt) in prompts.iter().enumerate() {
        if max_new == 0 || prompt.is_empty() {
            done[index] = Some(Continuation {
                ids: Vec::new(),
                stop: StopReason::Length,
            });
            continue;
        }
        let mut cache = model.new_cache();
        let out = model.forward(be, prompt, &mut cache, &Capture::none())?;
        let rows = be.dims(&out.last_hidden).0;
        let last = be.slice_rows(&out.last_hidden, rows - 1, rows)?;
        let next = model.logits_topk(be, &last, 1)?.ids[0];
        live.push(Decoding {
            index,
            cache,
            next,
            finished: false,
        });
    }
    drop(prefill);
    let _decode = crate::timeline::phase("generate: decode");
    let mut ids: Vec<Vec<u32>> = vec![Vec::with_capacity(max_new); prompts.len()];
    let limit = model.spec.max_position_embeddings;
    let mut recorder = StepRecorder::new(be);
    loop {
        // Take each prompt's pending token; the ones that stop are finished.
        for d in live.iter_mut().filter(|d| !d.finished) {
            let out = &mut ids[d.index];
            out.push(d.next);
            let stop = if eos.contains(&d.next) {
                Some(StopReason::Eos)
            } else if out.len() >= max_new {
                Some(StopReason::Length)
            } else if prompts[d.index].len() + out.len() > limit {
                // The next step's position is past the context (counted from the tokens, not
                // the cache, which may hold a step launched ahead).
                Some(StopReason::Context)
            } else {
                None
            };
            if let Some(stop) = stop {
                done[d.index] = Some(Continuation {
                    ids: std::mem::take(out),
                    stop,
                });
                d.finished = true;
            }
        }
        // A finished prompt leaves the batch once no recorded step serves it: while one does,
        // its row rides along (its outputs ignored, its cache within the rows reserved for the
        // recording) so that the batch stays the one recorded. Rows do not affect each other
        // (`Backend::max_independent_rows`), so the others' bits are the same either way.
        if recorder.replays_left() == 0 {
            live.retain(|d| !d.finished);
        }
        if live.iter().all(|d| d.finished) {
            break;
        }
        let step: Vec<u32> = live.iter().map(|d| d.next).collect();
        let batch: Vec<usize> = live.iter().map(|d| d.index).collect();
        let mut caches: Vec<&mut KvCache<B>> = live.iter_mut().map(|d| &mut d.cache).collect();
        // Every row takes its token, a finished one's too: the recorder may have launched the
        // next step with them already (its outputs for finished rows are ignored).
        let next = recorder.greedy_step(model, &step, &batch, &mut caches)?;
        for (d, next) in live.iter_mut().zip(next) {
            d.next = next;
        }
    }
    done.into_iter()
        .collect::<Option<Vec<_>>>()
        .context("greedy_batch: a prompt was left unfinished")
}
