//! The attention of one step of a K-step draft chain (EAGLE-3 and native MTP heads draft
//! autoregressively from each anchor: step s attends to the context and to the chain's own rows of
//! steps 2..s). Written once for both families.

use crate::backend::{AttnMask, AttnShape, Backend};
use anyhow::Result;

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
