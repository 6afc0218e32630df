//! Decode steps recorded once and replayed while a batch stays the same ([`StepRecorder`]).
//!
//! Why: a decode step of a few rows is many small kernels, and issuing them from the host takes
//! longer than running them, so the GPU waits between launches; a replayed step is one copy and
//! one launch (the CUDA backend's graphs: docs/cuda.md, "Recorded decode steps"). A replay gives
//! the bits the step would give run as usual (`cuda_step_graph` asserts it), so callers do not
//! choose: [`crate::generate::greedy_batch`] decodes through a recorder on every backend, and a
//! backend that records nothing ([`Backend::records_steps`]) runs every step as usual. Greedy
//! decoding goes through [`StepRecorder::greedy_step`], whose recordings feed themselves: the
//! next step is launched before this one's tokens are read, so the GPU does not wait on the host
//! between steps either.

use super::{KvCache, TargetModel};
use crate::backend::Backend;
use anyhow::{ensure, Context, Result};

/// Steps one recording serves: the batch's caches are reserved for this many more rows before
/// it, and a new recording is made after them.
pub const RECORDED_STEPS: usize = 64;

/// Runs a batch's decode steps, recording one step and replaying it for the next ones while the
/// batch is the same sequences with one more token each.
pub struct StepRecorder<'b, B: Backend> {
    be: &'b B,
    current: Option<Recorded>,
    /// Batch sizes that have run a step as usual: a recording comes after one, so that first-use
    /// work (a GEMM's algorithm choice, a table's upload) is never part of it.
    warmed: Vec<usize>,
    /// Set when a recording did not take (the backend logs why): every later step runs as usual.
    refused: bool,
    /// Steps recorded and steps replayed (for tests and benchmarks).
    pub recorded: usize,
    pub replayed: usize,
}

/// The recording in use, the batch it serves (the caller's ids of its sequences) and how many
/// more steps it may replay.
struct Recorded {
    id: u64,
    batch: Vec<usize>,
    left: usize,
    /// It feeds itself ([`StepRecorder::greedy_step`]).
    fed: bool,
    /// The tokens of the step launched ahead of the caller, while one is.
    ahead: Option<Vec<u32>>,
}

impl<'b, B: Backend> StepRecorder<'b, B> {
    pub fn new(be: &'b B) -> Self {
        StepRecorder {
            be,
            current: None,
            warmed: Vec::new(),
            refused: false,
            recorded: 0,
            replayed: 0,
        }
    }

    /// [`TargetModel::forward_decode`] of `ids` (one token per cache), replayed from a recording
    /// when `batch` — the caller's ids of the sequences, in the order of `caches` — is the batch
    /// of the last step, else recorded (or run as usual). The caches must change only through
    /// this recorder while its batch lasts.
    pub fn step(
        &mut self,
        model: &TargetModel<B>,
        ids: &[u32],
        batch: &[usize],
        caches: &mut [&mut KvCache<B>],
    ) -> Result<B::Tensor> {
        self.ensure_nothing_ahead()?;
        Ok(self.run_step(model, ids, batch, caches, false)?.0)
    }

    /// One greedy decode step of the batch: each row's next token, the top-1 of `model`'s logits
    /// for the step's hidden state ([`TargetModel::logits_topk`] with k = 1). Through a
    /// recording that feeds itself ([`Backend::feed_greedy`]) the next step is launched before
    /// this one's tokens are read, so the GPU does not wait on the host between steps. That step
    /// was given the tokens returned here: while [`StepRecorder::replays_left`] is positive the
    /// caller passes the same batch and exactly these tokens, for every row (a finished
    /// sequence's included); anything else is an error.
    pub fn greedy_step(
        &mut self,
        model: &TargetModel<B>,
        ids: &[u32],
        batch: &[usize],
        caches: &mut [&mut KvCache<B>],
    ) -> Result<Vec<u32>> {
        let be = self.be;
        if let Some(cur) = self.current.as_mut() {
            if let Some(fed) = cur.ahead.take() {
                ensure!(
                    cur.batch == batch && fed == ids,
                    "greedy_step: the step launched ahead was given batch {:?} and tokens {fed:?}, \
                     not batch {batch:?} and tokens {ids:?}",
                    cur.batch
                );
                // This step is running already.
                return self.launch_ahead_and_take(caches);
            }
        }
        let feed = be.feeds_steps();
        let (hidden, from_recording) = self.run_step(model, ids, batch, caches, feed)?;
        if from_recording && self.current.as_ref().is_some_and(|c| c.fed) {
            return self.launch_ahead_and_take(caches);
        }
        Ok(model.logits_topk(be, &hidden, 1)?.argmax())
    }

    /// After a launch of the self-feeding recording in use: launches its next step (while it
    /// has one left), then reads the tokens of the launch before.
    fn launch_ahead_and_take(&mut self, caches: &mut [&mut KvCache<B>]) -> Result<Vec<u32>> {
        let be = self.be;
        let cur = self.current.as_mut().context("no recording in use")?;
        let ahead = cur.left > 0;
        if ahead {
            be.replay_step_fed(cur.id)?;
            cur.left -= 1;
            self.replayed += 1;
            for c in caches.iter_mut() {
                grow_attention_rows(be, c)?;
            }
        }
        let tokens = be.take_fed_tokens(cur.id)?;
        if ahead {
            cur.ahead = Some(tokens.clone());
        }
        Ok(tokens)
    }

    fn ensure_nothing_ahead(&self) -> Result<()> {
        ensure!(
            self.current.as_ref().is_none_or(|c| c.ahead.is_none()),
            "a greedy step was launched ahead: continue with greedy_step"
        );
        Ok(())
    }

    /// A step replayed, recorded (feeding itself when `feed`) or run as usual; with whether it
    /// was a launch of the recording in use.
    fn run_step(
        &mut self,
        model: &TargetModel<B>,
        ids: &[u32],
        batch: &[usize],
        caches: &mut [&mut KvCache<B>],
        feed: bool,
    ) -> Result<(B::Tensor, bool)> {
        let be = self.be;
        if !be.records_steps() || self.refused || model.is_hybrid() || ids.len() != caches.len() {
            return Ok((model.forward_decode(be, ids, caches)?, false));
        }
        if let Some(cur) = self
            .current
            .as_mut()
            .filter(|c| c.batch == batch && c.left > 0)
        {
            let out = be.replay_step(cur.id, ids)?;
            cur.left -= 1;
            self.replayed += 1;
            for c in caches.iter_mut() {
                grow_attention_rows(be, c)?;
            }
            return Ok((out, true));
        }
        self.forget();
        if !self.warmed.contains(&ids.len()) {
            self.warmed.push(ids.len());
            return Ok((model.forward_decode(be, ids, caches)?, false));
        }
        let limit = model.spec.max_position_embeddings;
        let longest = caches.iter().map(|c| c.len).max().unwrap_or(0);
        let steps = RECORDED_STEPS.min(limit.saturating_sub(longest));
        if steps < 2 {
            return Ok((model.forward_decode(be, ids, caches)?, false));
        }
        let before: Vec<(usize, Vec<usize>)> = caches
            .iter_mut()
            .map(|c| reserve_attention_rows(be, c, steps).map(|rows| (c.len, rows)))
            .collect::<Result<_>>()?;
        let dims = (ids.len(), model.spec.hidden_size);
        let recorded = be.record_step(dims, steps, &mut || {
            let hidden = model.forward_decode(be, ids, caches)?;
            if feed {
                be.feed_greedy(&hidden, model.head())?;
            }
            Ok(hidden)
        })?;
        match recorded {
            Some((id, out)) => {
                self.current = Some(Recorded {
                    id,
                    batch: batch.to_vec(),
                    left: steps - 1,
                    fed: feed,
                    ahead: None,
                });
                self.recorded += 1;
                Ok((out, true))
            }
            None => {
                // Nothing ran; the host side of the attempt counted rows that were never
                // written: put the counts back and run the step as usual.
                for (c, (len, rows)) in caches.iter_mut().zip(before) {
                    c.len = len;
                    set_attention_rows(be, c, &rows)?;
                }
                self.refused = true;
                Ok((model.forward_decode(be, ids, caches)?, false))
            }
        }
    }

    /// How many more steps the recording in use serves, a step launched ahead of the caller
    /// included (0: none in use). While it is positive the caller keeps the batch as it is,
    /// finished sequences included ([`crate::generate::greedy_batch`]).
    pub fn replays_left(&self) -> usize {
        self.current
            .as_ref()
            .map_or(0, |c| c.left + c.ahead.is_some() as usize)
    }

    fn forget(&mut self) {
        if let Some(cur) = self.current.take() {
            self.be.forget_step(cur.id);
        }
    }
}

impl<B: Backend> Drop for StepRecorder<'_, B> {
    fn drop(&mut self) {
        self.forget();
    }
}

/// The K and V tensors of a cache's attention layers, in layer order.
fn attention_tensors<B: Backend>(c: &mut KvCache<B>) -> impl Iterator<Item = &mut B::Tensor> {
    c.layers
        .iter_mut()
        .flat_map(|l| [l.k.as_mut(), l.v.as_mut()])
        .flatten()
}

/// Reserves `extra` rows in every K and V tensor of `c`; returns their row counts.
fn reserve_attention_rows<B: Backend>(
    be: &B,
    c: &mut KvCache<B>,
    extra: usize,
) -> Result<Vec<usize>> {
    attention_tensors(c)
        .map(|t| {
            be.reserve_rows(t, extra)?;
            Ok(be.dims(t).0)
        })
        .collect()
}

fn set_attention_rows<B: Backend>(be: &B, c: &mut KvCache<B>, rows: &[usize]) -> Result<()> {
    for (t, &r) in attention_tensors(c).zip(rows) {
        be.set_rows(t, r)?;
    }
    Ok(())
}

/// What a decode step does to a cache besides its device writes: one more row in every K and V
/// tensor, one more token.
fn grow_attention_rows<B: Backend>(be: &B, c: &mut KvCache<B>) -> Result<()> {
    for t in attention_tensors(c) {
        let rows = be.dims(t).0;
        be.set_rows(t, rows + 1)?;
    }
    c.took_decode_step();
    Ok(())
}
