//! What the two K-step chain families (EAGLE-3 and native MTP heads draft autoregressively from
//! each anchor) share, written once for both:
//!
//! - [`ChainDrafter`]: the chain step by step, each step's token chosen by the caller: the
//!   greedy records ([`draft_topk`], each step's top-1 fed to the next) and live speculative
//!   sampling (`super::live`'s `propose_sampled`, each step's token drawn from its q) drive the
//!   same chain;
//! - [`attend_step`]: the attention of one step (step s attends to the context and to the
//!   chain's own rows of steps 2..s).

use super::sampling::ScoringHead;
use crate::backend::{AttnMask, AttnShape, Backend, TopK};
use crate::model::EmbedHead;
use anyhow::Result;

/// Chooses each anchor's token for the next step from a step's head-ready states (one row per
/// anchor; [`ChainDrafter::scoring_head`] scores them).
pub(crate) type Choose<'c, B> = dyn FnMut(&<B as Backend>::Tensor) -> Result<Vec<u32>> + 'c;

/// A family that drafts a chain of K steps per anchor.
pub(crate) trait ChainDrafter<B: Backend> {
    /// The family's state over one sequence (its context rows).
    type Context;

    /// Runs the chain at `anchors` (absolute positions a, 1 ≤ a ≤ the context's rows): after
    /// every step s = 1..K, `choose` reads the step's states and returns the tokens step s + 1
    /// embeds (ignored after step K). `target` is the target's embedding and LM head (`None`
    /// only for a family that needs neither).
    fn run_chain(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        ctx: &Self::Context,
        anchors: &[usize],
        choose: &mut Choose<'_, B>,
    ) -> Result<()>;

    /// The LM head the states [`ChainDrafter::run_chain`] hands out are scored with, over the
    /// target's vocabulary.
    fn scoring_head<'a>(
        &'a self,
        target: Option<&'a dyn EmbedHead<B>>,
    ) -> Result<ScoringHead<'a, B>>;
}

/// The greedy chain's records: every step's top-`top_k` (target ids, log-probabilities), each
/// step's top-1 fed to the next step; rows anchor-major (`anchors.len() · K`), as the records lay
/// out positions 1..K of each block.
pub(crate) fn draft_topk<B: Backend, C: ChainDrafter<B>>(
    chain: &C,
    be: &B,
    target: Option<&dyn EmbedHead<B>>,
    ctx: &C::Context,
    anchors: &[usize],
    top_k: usize,
) -> Result<TopK> {
    let head = chain.scoring_head(target)?;
    let mut per_step: Vec<TopK> = Vec::new();
    chain.run_chain(be, target, ctx, anchors, &mut |states| {
        let top = head.topk(be, states, top_k)?;
        let next = top.argmax();
        per_step.push(top);
        Ok(next)
    })?;
    let (n, steps) = (anchors.len(), per_step.len());
    let mut out = TopK {
        rows: n * steps,
        k: top_k,
        ids: Vec::with_capacity(n * steps * top_k),
        logprobs: Vec::with_capacity(n * steps * top_k),
    };
    for i in 0..n {
        for step in &per_step {
            out.ids.extend_from_slice(step.row_ids(i));
            out.logprobs.extend_from_slice(step.row_logprobs(i));
        }
    }
    Ok(out)
}

/// The chain's own rows so far (queries, keys, values of steps 2..s−1), anchor-major.
pub(crate) type ChainRows<B> = Option<(
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
)>;

/// The context a chain step attends to (its keys, values and length).
pub(crate) struct ChainContext<'a, B: Backend> {
    pub k: &'a B::Tensor,
    pub v: &'a B::Tensor,
    pub len: usize,
}

/// Step `s` (≥ 2) of the chain at `anchors`: appends this step's rows (`q`, `k`, `v`, one per
/// anchor) to `chain`, attends causally over the context and the chain, and returns each anchor's
/// new row. Earlier steps' queries are recomputed with it (their keys are the same, so are their
/// outputs); only each anchor's last row is kept: attention is a small part of a step next to the
/// projections, MLP and LM head, which run on the new rows only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_step<B: Backend>(
    be: &B,
    chain: &mut ChainRows<B>,
    (q, k, v): (B::Tensor, B::Tensor, B::Tensor),
    ctx: ChainContext<'_, B>,
    anchors: &[usize],
    s: usize,
    shape: AttnShape,
) -> Result<B::Tensor> {
    let n = anchors.len();
    // Rows per anchor before this step (steps 2..s−1), then this step's row.
    let before = s - 2;
    let (q, k, v) = match chain.take() {
        None => (q, k, v),
        Some((q0, k0, v0)) => {
            let order: Vec<u32> = (0..n)
                .flat_map(|i| {
                    (0..before)
                        .map(move |r| (i * before + r) as u32)
                        .chain(std::iter::once((n * before + i) as u32))
                })
                .collect();
            let merge = |old: &B::Tensor, new: &B::Tensor| -> Result<B::Tensor> {
                be.gather_rows(&be.concat_rows(&[old, new])?, &order)
            };
            (merge(&q0, &q)?, merge(&k0, &k)?, merge(&v0, &v)?)
        }
    };
    let keys = be.concat_rows(&[ctx.k, &k])?;
    let values = be.concat_rows(&[ctx.v, &v])?;
    let mask = AttnMask::Blocks {
        ctx_len: ctx.len,
        block: s - 1,
        anchors: anchors.to_vec(),
        ctx_inclusive: false,
        causal_in_block: true,
        window: None,
    };
    let o_all = be.attention(&q, &keys, &values, shape, &mask)?;
    let last: Vec<u32> = (0..n).map(|i| (i * (s - 1) + before) as u32).collect();
    *chain = Some((q, k, v));
    be.gather_rows(&o_all, &last)
}
