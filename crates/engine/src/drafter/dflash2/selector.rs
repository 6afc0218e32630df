//! DFlash2's candidate selector (`dflash.model.CandidateSelector`, docs/dflash2.md §3): at
//! every drafted position the top `selector_top_k` tokens of the (scaled, soft-capped) logits
//! are re-scored with a rank-r bilinear term of the token chosen before it, the position's
//! hidden state and the candidate, and the best is chosen, left to right from the anchor token:
//!
//! ```text
//! s(c | prev, p) = unary_p(c) + Σ_r predecessor[prev, r] · (W h_p)[r] · successor[c, r]
//! d_1 = argmax_c s(c | y_a, 1),   d_p = argmax_c s(c | d_{p−1}, p)
//! ```
//! So the proposal at p depends on the path before it. A position's record is the candidates
//! ranked by s with log q = log softmax(s) over the candidates: the distribution the authors
//! sample from at T > 0 (softmax(s / T), each draw the next position's predecessor:
//! [`CandidateSelector::walk`]), and whose argmax is the greedy path.
//!
//! The scores need the unary *values* (the soft cap is not a shift), but the fused LM-head
//! top-K returns log-probabilities. A row's log-sum-exp is recovered from one raw logit (its
//! top-1's, a dot product with that LM-head row), so no full-vocabulary logits are formed.
//! The small per-anchor walk runs on the host; the codebooks are held there.

use super::config::DFlash2Config;
use crate::backend::{Backend, TopK};
use crate::model::EmbedHead;
use anyhow::{ensure, Result};

pub struct CandidateSelector<B: Backend> {
    /// `hidden_projection` `[rank, D]`.
    pub hidden_projection: B::Matrix,
    /// `predecessor_codebook` and `successor_codebook`, `[vocab, rank]` row-major on the host.
    pub predecessor: Vec<f32>,
    pub successor: Vec<f32>,
    pub rank: usize,
    pub top_k: usize,
}

/// What the walk needs of one drafted row: its candidates with their unary scores, and the
/// projected hidden state.
struct Row<'a> {
    candidates: &'a [u32],
    unary: Vec<f32>,
    projected: &'a [f32],
}

impl<B: Backend> CandidateSelector<B> {
    /// The selector over `hidden` (`[n·(B−1), D]`, the final-norm drafted rows of n blocks,
    /// block by block) whose anchors hold `anchor_tokens`: per row the candidates ranked by
    /// score, the first `keep` of them with log q (the first is the path's token).
    pub fn select(
        &self,
        be: &B,
        cfg: &DFlash2Config,
        target: &dyn EmbedHead<B>,
        hidden: &B::Tensor,
        anchor_tokens: &[u32],
        keep: usize,
    ) -> Result<TopK> {
        ensure!(
            keep <= self.top_k,
            "selector: {keep} kept of {} candidates",
            self.top_k
        );
        let rows = be.dims(hidden).0;
        let mut ids = Vec::with_capacity(rows * keep);
        let mut logprobs = Vec::with_capacity(rows * keep);
        self.walk(
            be,
            cfg,
            target,
            hidden,
            anchor_tokens,
            &mut |ranked, logq| {
                ids.extend_from_slice(&ranked[..keep]);
                logprobs.extend_from_slice(&logq[..keep]);
                Ok(ranked[0])
            },
        )?;
        Ok(TopK {
            rows,
            k: keep,
            ids,
            logprobs,
        })
    }

    /// Walks each block's path left to right from its anchor token: at every row, `choose` gets
    /// the candidates ranked by score given the token chosen before them, with log q =
    /// log softmax(score) (the first is the greedy path's token), and returns the token the path
    /// takes there, the next row's predecessor ([`Self::select`]: the best; live sampling at
    /// T > 0: a draw, as the authors' `select` with `temperature > 0`).
    pub fn walk(
        &self,
        be: &B,
        cfg: &DFlash2Config,
        target: &dyn EmbedHead<B>,
        hidden: &B::Tensor,
        anchor_tokens: &[u32],
        choose: &mut dyn FnMut(&[u32], &[f32]) -> Result<u32>,
    ) -> Result<()> {
        let (rows, d) = be.dims(hidden);
        let n = anchor_tokens.len();
        let per_block = cfg.backbone.block_size - 1;
        ensure!(
            rows == n * per_block,
            "selector: {rows} rows for {n} blocks of {per_block}"
        );
        let k = self.top_k;
        // The candidates: the output multiplier (> 0) and the soft cap keep the logits' order.
        let top = target.logits_topk(be, hidden, k)?;
        let top1: Vec<u32> = (0..rows).map(|r| top.row_ids(r)[0]).collect();
        let head_rows = be.to_host(&be.embed(target.head(), &top1)?)?;
        let h = be.to_host(hidden)?;
        let projected = be.to_host(&be.matmul(hidden, &self.hidden_projection)?)?;
        let vocab = self.predecessor.len() / self.rank;
        for blk in 0..n {
            let mut prev = anchor_tokens[blk];
            for p in 0..per_block {
                let r = blk * per_block + p;
                // Raw logit = log-prob + the row's log-sum-exp, read off the top-1.
                let raw_top1: f64 = h[r * d..(r + 1) * d]
                    .iter()
                    .zip(&head_rows[r * d..(r + 1) * d])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                let lse = raw_top1 - top.row_logprobs(r)[0] as f64;
                let candidates = top.row_ids(r);
                if let Some(&bad) = candidates
                    .iter()
                    .chain([&prev])
                    .find(|&&c| c as usize >= vocab)
                {
                    anyhow::bail!(
                        "selector: token {bad} has no codebook row (the codebooks have {vocab})"
                    );
                }
                let row = Row {
                    candidates,
                    unary: top
                        .row_logprobs(r)
                        .iter()
                        .map(|&lp| cfg.transform_logit((lp as f64 + lse) as f32))
                        .collect(),
                    projected: &projected[r * self.rank..(r + 1) * self.rank],
                };
                let (ranked, logq) = self.rank_candidates(&row, prev);
                prev = choose(&ranked, &logq)?;
            }
        }
        Ok(())
    }

    /// One row's candidates ranked by score given the token before them, with log q. Ties keep
    /// the candidates' order (the LM head's ranking).
    fn rank_candidates(&self, row: &Row, prev: u32) -> (Vec<u32>, Vec<f32>) {
        let rk = self.rank;
        let pred = &self.predecessor[prev as usize * rk..(prev as usize + 1) * rk];
        let scores: Vec<f32> = row
            .candidates
            .iter()
            .zip(&row.unary)
            .map(|(&c, &u)| {
                let succ = &self.successor[c as usize * rk..(c as usize + 1) * rk];
                let pair: f32 = (0..rk).map(|i| pred[i] * row.projected[i] * succ[i]).sum();
                u + pair
            })
            .collect();
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let max = scores[order[0]] as f64;
        let lse = max
            + scores
                .iter()
                .map(|&s| (s as f64 - max).exp())
                .sum::<f64>()
                .ln();
        (
            order.iter().map(|&i| row.candidates[i]).collect(),
            order
                .iter()
                .map(|&i| (scores[i] as f64 - lse) as f32)
                .collect(),
        )
    }
}
