//! Decode steps recorded once and replayed while a batch stays the same ([`StepRecorder`]).
//!
//! Why: a decode step of a few rows is many small kernels, and issuing them from the host takes
//! longer than running them, so the GPU waits between launches; a replayed step is one copy and
//! one launch (the CUDA backend's graphs: docs/cuda.md, "Recorded decode steps"). A replay gives
//! the bits the step would give run as usual (`cuda_step_graph` asserts it), so callers do not
//! choose: [`crate::generate::greedy_batch`] decodes through a recorder on every backend, and a
//! backend that records nothing ([`Backend::records_steps`]) runs every step as usual.

use super::{KvCache, TargetModel};
use crate::backend::Backend;
use anyhow::Result;

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
        let be = self.be;
        if !be.records_steps() || self.refused || model.is_hybrid() || ids.len() != caches.len() {
            return model.forward_decode(be, ids, caches);
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
            return Ok(out);
        }
        self.forget();
        if !self.warmed.contains(&ids.len()) {
            self.warmed.push(ids.len());
            return model.forward_decode(be, ids, caches);
        }
        let limit = model.spec.max_position_embeddings;
        let longest = caches.iter().map(|c| c.len).max().unwrap_or(0);
        let steps = RECORDED_STEPS.min(limit.saturating_sub(longest));
        if steps < 2 {
            return model.forward_decode(be, ids, caches);
        }
        let before: Vec<(usize, Vec<usize>)> = caches
            .iter_mut()
            .map(|c| reserve_attention_rows(be, c, steps).map(|rows| (c.len, rows)))
            .collect::<Result<_>>()?;
        let dims = (ids.len(), model.spec.hidden_size);
        let recorded =
            be.record_step(dims, steps, &mut || model.forward_decode(be, ids, caches))?;
        match recorded {
            Some((id, out)) => {
                self.current = Some(Recorded {
                    id,
                    batch: batch.to_vec(),
                    left: steps - 1,
                });
                self.recorded += 1;
                Ok(out)
            }
            None => {
                // Nothing ran; the host side of the attempt counted rows that were never
                // written: put the counts back and run the step as usual.
                for (c, (len, rows)) in caches.iter_mut().zip(before) {
                    c.len = len;
                    set_attention_rows(be, c, &rows)?;
                }
                self.refused = true;
                model.forward_decode(be, ids, caches)
            }
        }
    }

    /// How many more steps the recording in use may replay (0: none in use). While it is
    /// positive the caller keeps the batch as it is, finished sequences included
    /// ([`crate::generate::greedy_batch`]).
    pub fn replays_left(&self) -> usize {
        self.current.as_ref().map_or(0, |c| c.left)
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
