//! Live greedy speculative decoding: the real draft → verify loop with the target's KV cache,
//! cropping after each round, and the bonus token: one loop for every drafter family
//! ([`LiveDrafter`], drafter/live_drafter.rs, says what each proposes and keeps). Lossless: the
//! output equals plain greedy decoding; its τ must equal the replayed τ of the per-anchor
//! evaluation.
//!
//! Round at anchor a (the last committed token, not yet in the target's cache): the drafter
//! proposes d_1..d_{B−1} from its state over positions < a and y_a; verify `[y_a, d_1..d_{B−1}]`
//! in one target pass; A = leading i with d_i = argmax(row i−1); commit d_1..d_A and the bonus
//! argmax(row A); crop the cache to a+A+1; the drafter grows its state from the verify pass's
//! taps of positions a..a+A and the committed tokens. Tokens counted per round = tokens committed
//! (the bonus is not counted when the budget or an EOS ends the sequence first), the same
//! convention as [`draftlens_results::metrics::replay`].
//!
//! Lossless holds exactly where the verify pass over B tokens computes each row with the bits of
//! the one-token decode step: [`TargetModel::forward_verify`] does so on every backend (up to
//! [`Backend::max_independent_rows`] tokens per block; docs/live.md, "Verify equals decoding").
//! Where a computation of the block differs from decoding (a block beyond that bound), a
//! near-tie between two logits may round either way and the outputs part there:
//! [`first_divergence`] says where, which two tokens, and by how much the target preferred one.

use crate::backend::{Backend, HostRows};
use crate::model::{Capture, TargetModel};
use anyhow::{bail, Result};
use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize)]
pub struct LiveResult {
    /// Generated ids (the prefill's first token included), EOS included if reached.
    pub ids: Vec<u32>,
    /// Tokens committed by each verify round.
    pub round_tokens: Vec<u32>,
    /// Accepted drafted tokens A of each round.
    pub accepted: Vec<u32>,
    /// The B − 1 proposals of each round, round after round (what tests compare with the
    /// replay's drafts at the same anchors). Not serialised.
    #[serde(skip)]
    pub drafts: Vec<u32>,
}

impl LiveResult {
    /// Mean tokens per verify round (bonus included).
    pub fn tau(&self) -> f64 {
        if self.round_tokens.is_empty() {
            return 0.0;
        }
        self.round_tokens.iter().map(|&t| t as f64).sum::<f64>() / self.round_tokens.len() as f64
    }
}

/// Captured taps of `out` rows `0..n` as host vectors, in the drafter's tap order.
pub(super) fn taps_rows<B: Backend>(
    be: &B,
    cap: &crate::model::Captured<B>,
    indices: &[usize],
    n: usize,
) -> Result<Vec<HostRows>> {
    indices
        .iter()
        .map(|&i| {
            let t = cap
                .get(i)
                .ok_or_else(|| anyhow::anyhow!("tap hidden_states[{i}] was not captured"))?;
            be.to_host_rows(&be.slice_rows(t, 0, n)?)
        })
        .collect()
}

/// Wall time of one live decoding after the target's prefill, split as the cost model reads it
/// (`draftlens_results::speed`, docs/verdict.md). Each phase ends on a read to the host (the
/// drafts, the verify pass's top-1), so a device's queued work is inside the phase that queued it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LiveTimes {
    /// From the first token (after the prefill) to the end: the drafter's context over the
    /// prompt, then every round.
    pub decode_s: f64,
    /// Draft rounds: the proposals for one anchor and the drafter's context update.
    pub draft_s: f64,
    /// Verify passes over B tokens, their top-1 and the cache crop.
    pub verify_s: f64,
}

pub fn live_decode<'d, B: Backend + 'd>(
    be: &B,
    target: &TargetModel<B>,
    drafter: impl Into<LiveDrafter<'d, B>>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
) -> Result<LiveResult> {
    live_decode_timed(
        be,
        target,
        drafter,
        prompt,
        max_new,
        eos,
        &mut LiveTimes::default(),
    )
}

/// [`live_decode`], adding its wall times to `times`.
pub fn live_decode_timed<'d, B: Backend + 'd>(
    be: &B,
    target: &TargetModel<B>,
    drafter: impl Into<LiveDrafter<'d, B>>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
    times: &mut LiveTimes,
) -> Result<LiveResult> {
    use std::time::Instant;
    let drafter = drafter.into();
    if prompt.is_empty() {
        bail!("empty prompt");
    }
    let capture =
        Capture::for_layer_ids(&drafter.tap_layer_ids(&target.spec), target.spec.num_layers)?;
    let b = drafter.block_size();
    let mut cache = target.new_cache();
    let out = target.forward(be, prompt, &mut cache, &capture)?;
    let p = prompt.len();
    let first = target
        .logits_topk(be, &be.slice_rows(&out.last_hidden, p - 1, p)?, 1)?
        .ids[0];
    let mut res = LiveResult {
        ids: vec![first],
        ..LiveResult::default()
    };
    if max_new == 0 {
        res.ids.clear();
        return Ok(res);
    }
    let decode_start = Instant::now();
    let mut state = drafter.start(be, target, &out.captured, prompt, first)?;
    // The prompt and the generated ids: what the drafter proposes after.
    let mut committed = prompt.to_vec();
    committed.push(first);
    while !eos.contains(res.ids.last().expect("non-empty")) && res.ids.len() < max_new {
        let a = p + res.ids.len() - 1;
        let y_a = *res.ids.last().expect("non-empty");
        let remaining = max_new - res.ids.len();
        let draft_start = Instant::now();
        let drafts = drafter.propose(be, target, &state, &committed)?;
        times.draft_s += draft_start.elapsed().as_secs_f64();
        res.drafts.extend_from_slice(&drafts);
        let mut block = vec![y_a];
        block.extend(&drafts);
        if cache.len + block.len() > target.spec.max_position_embeddings {
            break;
        }
        let verify_start = Instant::now();
        let v = target.forward_verify(be, &block, &mut cache, &capture)?;
        let post = target.logits_topk(be, &v.last_hidden, 1)?.argmax();
        let mut verify_s = verify_start.elapsed().as_secs_f64();
        let acc = accepted_drafts(&drafts, &post, (b - 1).min(remaining), eos);
        let before = res.ids.len();
        res.ids.extend_from_slice(&drafts[..acc]);
        let ended = acc > 0 && eos.contains(&drafts[acc - 1]);
        if !ended && res.ids.len() < max_new {
            res.ids.push(post[acc]);
        }
        let new_tokens = &res.ids[before..];
        committed.extend_from_slice(new_tokens);
        res.round_tokens.push(new_tokens.len() as u32);
        res.accepted.push(acc as u32);
        // Keep y_a and the accepted drafts in the cache; the bonus enters with the next verify.
        let crop_start = Instant::now();
        target.crop(be, &mut cache, a + acc + 1)?;
        verify_s += crop_start.elapsed().as_secs_f64();
        times.verify_s += verify_s;
        let update_start = Instant::now();
        drafter.extend(be, target, &mut state, &v.captured, acc + 1, new_tokens)?;
        times.draft_s += update_start.elapsed().as_secs_f64();
    }
    times.decode_s += decode_start.elapsed().as_secs_f64();
    Ok(res)
}

/// Drafts a greedy verify pass accepts: the leading d_i equal to the target's argmax of the row
/// before (`post[i]`, row 0 the anchor's), at most `limit`, stopping after an accepted EOS.
pub(crate) fn accepted_drafts(drafts: &[u32], post: &[u32], limit: usize, eos: &[u32]) -> usize {
    let mut acc = 0;
    while acc < limit.min(drafts.len()) && drafts[acc] == post[acc] {
        acc += 1;
        if eos.contains(&drafts[acc - 1]) {
            break;
        }
    }
    acc
}

/// Where a live output first departs from plain greedy decoding, and how close the target's
/// call between the two tokens was there.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Divergence {
    /// Index into the generated tokens (0 = the first token after the prompt) of the first
    /// token where the two outputs differ; the tokens before it are the same.
    pub position: usize,
    /// The token live decoding produced there; `None` where the live output ended first.
    pub live_token: Option<u32>,
    /// The token plain greedy decoding produced there; `None` where it ended first.
    pub greedy_token: Option<u32>,
    /// `logit(live_token) − logit(greedy_token)` of the target's next-token row after the prompt
    /// and the shared tokens, from one more forward over them on the same backend (summed in
    /// f64 over the backend's final hidden state and LM-head rows): near zero is a near-tie that
    /// two computations may round either way; positive means this pass, like the verify pass,
    /// prefers the live token. `None` where one output ended first.
    pub logit_margin: Option<f32>,
}

/// The first place where `live` (the ids [`live_decode`] gave for `prompt`) and `greedy` (plain
/// greedy decoding of the same prompt and budget) differ, with the target's logit margin there;
/// `None` when they are the same.
pub fn first_divergence<B: Backend>(
    be: &B,
    target: &TargetModel<B>,
    prompt: &[u32],
    live: &[u32],
    greedy: &[u32],
) -> Result<Option<Divergence>> {
    let Some(position) = live
        .iter()
        .zip(greedy)
        .position(|(l, g)| l != g)
        .or_else(|| (live.len() != greedy.len()).then(|| live.len().min(greedy.len())))
    else {
        return Ok(None);
    };
    let (live_token, greedy_token) = (live.get(position).copied(), greedy.get(position).copied());
    let logit_margin = match (live_token, greedy_token) {
        (Some(l), Some(g)) => {
            let mut context = prompt.to_vec();
            context.extend_from_slice(&live[..position]);
            let [ll, lg] = next_token_logits(be, target, &context, [l, g])?;
            Some((ll - lg) as f32)
        }
        _ => None,
    };
    Ok(Some(Divergence {
        position,
        live_token,
        greedy_token,
        logit_margin,
    }))
}

/// The target's logits of `tokens` as the token after `context`: one forward over `context`,
/// then the dot products of its last final-norm row with those tokens' LM-head rows (read with
/// [`Backend::embed`], which gathers rows of any `[vocab, dim]` matrix), so no op beyond the
/// ones every backend has is needed and the full vocabulary's logits never leave the device.
fn next_token_logits<B: Backend, const N: usize>(
    be: &B,
    target: &TargetModel<B>,
    context: &[u32],
    tokens: [u32; N],
) -> Result<[f64; N]> {
    let n = context.len();
    if n == 0 {
        bail!("empty prompt");
    }
    let out = target.forward(be, context, &mut target.new_cache(), &Capture::none())?;
    let hidden = be.to_host(&be.slice_rows(&out.last_hidden, n - 1, n)?)?;
    let rows = be.to_host(&be.embed(target.head(), &tokens)?)?;
    let d = hidden.len();
    Ok(std::array::from_fn(|t| {
        rows[t * d..(t + 1) * d]
            .iter()
            .zip(&hidden)
            .map(|(&w, &h)| w as f64 * h as f64)
            .sum()
    }))
}

#[path = "live_drafter.rs"]
mod family;
pub use family::{load_drafter, LiveDrafter};

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
