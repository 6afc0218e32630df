//! EAGLE-3's dynamic draft tree, evaluated offline (docs/eagle3.md §3.1; `run --eagle3-tree
//! TOPK,TOTAL`): at each anchor the tree SGLang's EAGLE worker drafts with
//! `--speculative-eagle-topk TOPK --speculative-num-draft-tokens TOTAL` and
//! `--speculative-num-steps K` (the chain's depth), and the longest root-to-leaf path the
//! target's greedy continuation follows through it.
//!
//! ```text
//! depth 1: the top-k of step 1 (context row a − 1), each scored by its log-probability
//! depth m = 2..K: each of the k nodes kept at depth m − 1 runs the midlayer (its token, its
//!     parent's output, position a − 2 + m; attending to context rows < a and to the rows of its
//!     own ancestors only) and proposes its top-k children; a child's score is its parent's plus
//!     its own log-probability; the k best of the k² children are kept for depth m + 1
//! the tree: the TOTAL − 1 best-scored of all k + (K − 1)·k² candidates (the root, the verified
//!     token, is the TOTAL-th), ties to the earlier candidate, so a parent always precedes its child
//! ```
//! This is SGLang's `select_top_k_tokens` and `organize_draft_results`
//! (SGLang's sglang/srt/speculative/eagle_utils.py) with log-probabilities summed where SGLang
//! multiplies probabilities (the same order; EAGLE's `topK_genrate` sums them). Candidates are
//! numbered as SGLang's `score_list`: depth 1's k, then per depth m ≥ 2 the children of kept slot
//! j at k + (m − 2)·k² + j·k + c.
//!
//! Tree attention over the `Backend` seam, with no mask of its own: every kept node's ancestors'
//! rows are copied into a block of its own, so a node at depth m is one block of m rows (its
//! ancestors' rows, then its own) under the `Blocks` mask with `causal_in_block` — the chain's
//! mask, whose last row sees the context rows < a and exactly its block.

use super::config::Eagle3Config;
use super::model::{check_anchors, Eagle3Context, Eagle3Drafter, Projected};
use crate::backend::{AttnMask, Backend};
use crate::drafter::config::DrafterFamily;
use crate::drafter::eval::{select_anchors, EvalOptions, Sequence};
use crate::drafter::run_identity::DrafterSpec;
use crate::model::{EmbedHead, ModelSpec};
use crate::records::{next_anchor, replay, SequenceEnd};
use anyhow::{bail, Context, Result};
use draftlens_results::metrics::{PromptInfo, SOURCE};
use draftlens_results::store::{MetricRow, MetricScope};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The tree's shape (`--eagle3-tree TOPK,TOTAL`); its depth is the drafter's chain length K.
/// Stored with the run (`eval.eagle3_tree`), so it is part of the run's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeShape {
    /// Children proposed per expanded node and nodes kept per depth (SGLang's
    /// `--speculative-eagle-topk`).
    pub topk: usize,
    /// Tokens of one verify pass, the root included (SGLang's `--speculative-num-draft-tokens`):
    /// the tree holds `total_tokens − 1` drafts.
    pub total_tokens: usize,
}

impl TreeShape {
    /// The largest top-k accepted: 32, three times EAGLE's default of 10 (SGLang's automatic
    /// choices go up to 8).
    pub const MAX_TOPK: usize = 32;
    /// The largest TOTAL accepted: 512, eight times the 61 tokens of EAGLE's default tree (60
    /// drafts and the root).
    pub const MAX_TOTAL: usize = 512;

    /// `TOPK,TOTAL` as `--eagle3-tree` takes it, checked as far as it can be without the
    /// drafter (the depth-dependent checks are [`TreeShape::check`]'s).
    pub fn parse(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let [topk, total] = parts[..] else {
            bail!("--eagle3-tree {s:?}: expected TOPK,TOTAL (e.g. 4,8)");
        };
        let num = |what: &str, v: &str| -> Result<usize> {
            v.parse()
                .with_context(|| format!("--eagle3-tree {s:?}: {what} {v:?} is not a whole number"))
        };
        let shape = TreeShape {
            topk: num("TOPK", topk)?,
            total_tokens: num("TOTAL", total)?,
        };
        shape.check_bounds()?;
        Ok(shape)
    }

    /// The rules that hold whatever the drafter.
    fn check_bounds(&self) -> Result<()> {
        let (k, total) = (self.topk, self.total_tokens);
        if k == 0 {
            bail!("--eagle3-tree: TOPK 0: every expanded node needs at least one child (TOPK ≥ 1, SGLang's --speculative-eagle-topk)");
        }
        if k > Self::MAX_TOPK {
            bail!(
                "--eagle3-tree: TOPK {k} is above the cap of {} children per node",
                Self::MAX_TOPK
            );
        }
        if total > Self::MAX_TOTAL {
            bail!(
                "--eagle3-tree: TOTAL {total} is above the cap of {} tokens per tree",
                Self::MAX_TOTAL
            );
        }
        Ok(())
    }

    /// Candidates scored over a tree of `depth`: k at depth 1, k² at each later depth.
    pub fn candidates(&self, depth: usize) -> usize {
        self.topk + depth.saturating_sub(1) * self.topk * self.topk
    }

    /// Every rule for a drafter of chain length `depth` and `draft_vocab` draft ids, one error
    /// each: TOPK in 1..=min(cap, draft vocabulary), TOTAL in K + 1 ..= min(cap, 1 + candidates).
    pub fn check(&self, depth: usize, draft_vocab: usize) -> Result<()> {
        self.check_bounds()?;
        let (k, total) = (self.topk, self.total_tokens);
        if k > draft_vocab {
            bail!("--eagle3-tree: TOPK {k} is more than the drafter's {draft_vocab} draft ids (draft_vocab_size)");
        }
        if total < depth + 1 {
            bail!(
                "--eagle3-tree: TOTAL {total} is less than the depth K + 1 = {}: TOTAL counts the root (the verified token), so the tree would hold fewer drafts than the chain's K = {depth} (SGLang sets TOTAL = K + 1 for TOPK 1)",
                depth + 1
            );
        }
        let most = 1 + self.candidates(depth);
        if total > most {
            bail!("--eagle3-tree: TOTAL {total} is more than the root and the {} candidates a tree of TOPK {k} and depth {depth} scores ({k} + ({depth} − 1)·{k}²)", most - 1);
        }
        Ok(())
    }

    fn describe(&self, depth: usize) -> String {
        format!(
            "EAGLE-3 dynamic tree: top-{} per depth, {} tokens with the root, depth {depth}",
            self.topk, self.total_tokens
        )
    }
}

/// Whether a run may evaluate the tree, before it is created: an EAGLE-3 checkpoint, greedy,
/// and a shape that fits its depth and draft vocabulary.
pub fn check_run(
    shape: &TreeShape,
    family: DrafterFamily,
    spec: &DrafterSpec,
    target: &ModelSpec,
    eval: &EvalOptions,
) -> Result<()> {
    let DrafterSpec::Checkpoint { dir, .. } = spec else {
        bail!("--eagle3-tree needs an EAGLE-3 checkpoint; the built-in and MTP drafters draft no tree");
    };
    if family != DrafterFamily::Eagle3 {
        bail!(
            "--eagle3-tree needs an EAGLE-3 checkpoint; {} is a {family:?} drafter",
            dir.display()
        );
    }
    if eval.sampling.is_some() {
        bail!("--eagle3-tree is evaluated greedily (the longest path of the target's greedy tokens); it cannot be combined with --temperature > 0");
    }
    let cfg = Eagle3Config::load(dir, target.num_layers)?;
    shape.check(cfg.steps, cfg.draft_vocab(target.vocab_size))
}

/// The draft tree at one anchor.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftTree {
    /// Every candidate's target token id, in SGLang's `score_list` order (module doc).
    pub tokens: Vec<u32>,
    /// Every candidate's parent candidate (`None`: the root).
    pub parents: Vec<Option<u32>>,
    /// Every candidate's score: the sum of the log-probabilities on its path.
    pub scores: Vec<f64>,
    /// The tree: the `total_tokens − 1` best candidates, ascending.
    pub selected: Vec<u32>,
}

impl DraftTree {
    /// Depth 1: step 1's top-k.
    fn new(ids: &[u32], logprobs: &[f32]) -> Self {
        DraftTree {
            tokens: ids.to_vec(),
            parents: vec![None; ids.len()],
            scores: logprobs.iter().map(|&x| x as f64).collect(),
            selected: Vec::new(),
        }
    }

    /// Adds the children of the kept nodes `kept` (their candidate indices, slot by slot;
    /// `children(j)` = kept slot j's top-k ids and log-probabilities) and returns the k kept at
    /// the new depth as (parent slot, candidate index), best first.
    fn grow<'t>(
        &mut self,
        kept: &[u32],
        children: impl Fn(usize) -> (&'t [u32], &'t [f32]),
    ) -> Vec<(usize, u32)> {
        let first = self.tokens.len();
        for (j, &parent) in kept.iter().enumerate() {
            let (ids, lps) = children(j);
            let base = self.scores[parent as usize];
            for (&id, &lp) in ids.iter().zip(lps) {
                self.tokens.push(id);
                self.parents.push(Some(parent));
                self.scores.push(base + lp as f64);
            }
        }
        let k = kept.len();
        let best = self.best(first..self.tokens.len(), k);
        best.into_iter()
            .map(|c| ((c as usize - first) / k, c))
            .collect()
    }

    /// The `n` best of `range` by score, ties to the smaller index.
    fn best(&self, range: std::ops::Range<usize>, n: usize) -> Vec<u32> {
        let mut order: Vec<u32> = range.map(|i| i as u32).collect();
        order.sort_by(|&x, &y| {
            self.scores[y as usize]
                .total_cmp(&self.scores[x as usize])
                .then(x.cmp(&y))
        });
        order.truncate(n);
        order
    }

    /// The accepted length A: the depth of the deepest tree node on the path the target's
    /// tokens take, `label(m)` being the target's token at anchor + m (`None` past the end of
    /// the sequence). The children of one node are distinct tokens, so the path is unique.
    pub fn accepted_len(&self, label: impl Fn(usize) -> Option<u32>) -> usize {
        let (mut node, mut depth) = (None, 0);
        while let Some(want) = label(depth + 1) {
            let next = self
                .selected
                .iter()
                .copied()
                .find(|&c| self.parents[c as usize] == node && self.tokens[c as usize] == want);
            match next {
                Some(c) => (node, depth) = (Some(c), depth + 1),
                None => break,
            }
        }
        depth
    }
}

impl<B: Backend> Eagle3Drafter<B> {
    /// The draft tree of `shape` at every anchor (1 ≤ a ≤ `ctx.len`), depth = the chain's K.
    /// All anchors' kept nodes of one depth share one forward.
    pub fn draft_trees(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        ctx: &Eagle3Context<B>,
        anchors: &[usize],
        shape: TreeShape,
    ) -> Result<Vec<DraftTree>> {
        let depth = self.cfg.steps;
        shape.check(depth, self.vocab.target_of.len())?;
        check_anchors(ctx, anchors)?;
        let (n, k) = (anchors.len(), shape.topk);
        let table = self.embedding(target)?;
        let _layers = crate::timeline::phase("drafter layers (tree)");
        let rows: Vec<u32> = anchors.iter().map(|&a| (a - 1) as u32).collect();
        let h1 = be.gather_rows(&ctx.hidden, &rows)?;
        let first = self.head_topk(be, &h1, k)?;
        let mut trees: Vec<DraftTree> = (0..n)
            .map(|i| DraftTree::new(first.row_ids(i), first.row_logprobs(i)))
            .collect();
        // Slot s = i·k + j: anchor i's j-th kept node. Depth 1 keeps all k of step 1.
        let mut kept: Vec<u32> = (0..n).flat_map(|_| 0..k as u32).collect();
        let slot_anchor: Vec<usize> = anchors
            .iter()
            .flat_map(|&a| std::iter::repeat_n(a, k))
            .collect();
        // What each kept node's forward reads: its parent's output (step 1's for depth 1) ...
        let per_anchor: Vec<u32> = (0..n as u32)
            .flat_map(|i| std::iter::repeat_n(i, k))
            .collect();
        let mut fed = be.gather_rows(&h1, &per_anchor)?;
        // ... and its ancestors' keys and values (m − 1 rows per slot at depth m).
        let mut ancestors: Option<(B::Tensor, B::Tensor)> = None;
        for m in 1..depth {
            let tokens: Vec<u32> = kept
                .iter()
                .enumerate()
                .map(|(s, &c)| trees[s / k].tokens[c as usize])
                .collect();
            let emb = be.embed(table, &tokens)?;
            let positions: Vec<u32> = slot_anchor.iter().map(|&a| (a - 1 + m) as u32).collect();
            let Projected {
                q,
                k: keys,
                v: values,
                residual,
            } = self.project(be, &emb, fed, &positions)?;
            let (o, blocks) = self.attend_ancestors(
                be,
                ctx,
                ancestors.take(),
                (q, keys, values),
                &slot_anchor,
                m,
            )?;
            let h = self.finish(be, &o, residual)?;
            let top = self.head_topk(be, &h, k)?;
            // Each anchor's k² children scored, its best k kept for the next depth.
            let mut parent_slot = Vec::with_capacity(n * k);
            for (i, tree) in trees.iter_mut().enumerate() {
                let slots = kept[i * k..(i + 1) * k].to_vec();
                let next = tree.grow(&slots, |j| {
                    (top.row_ids(i * k + j), top.row_logprobs(i * k + j))
                });
                for (s, (j, c)) in next.into_iter().enumerate() {
                    parent_slot.push((i * k + j) as u32);
                    kept[i * k + s] = c;
                }
            }
            // The new nodes read their parents' outputs, and their parents' blocks (the
            // parents' ancestors, then the parents) are their ancestors.
            fed = be.gather_rows(&h, &parent_slot)?;
            let block_rows: Vec<u32> = parent_slot
                .iter()
                .flat_map(|&s| (s * m as u32)..(s + 1) * m as u32)
                .collect();
            ancestors = Some((
                be.gather_rows(&blocks.0, &block_rows)?,
                be.gather_rows(&blocks.1, &block_rows)?,
            ));
        }
        for tree in &mut trees {
            let mut chosen = tree.best(0..tree.tokens.len(), shape.total_tokens - 1);
            chosen.sort_unstable();
            tree.selected = chosen;
        }
        Ok(trees)
    }

    /// Tree attention of the kept nodes at depth `m` (one new row per slot in `q`, `k`, `v`): each slot's
    /// block is its m − 1 ancestors' rows (`ancestors`, slot-major) and its own, and only the
    /// block's last row is returned. Also returns the blocks' keys and values (`m` rows per slot),
    /// from which the next depth's ancestors are gathered. The earlier rows' queries are the
    /// node's own, repeated: their outputs are dropped.
    fn attend_ancestors(
        &self,
        be: &B,
        ctx: &Eagle3Context<B>,
        ancestors: Option<(B::Tensor, B::Tensor)>,
        (q, k, v): (B::Tensor, B::Tensor, B::Tensor),
        slot_anchor: &[usize],
        m: usize,
    ) -> Result<(B::Tensor, (B::Tensor, B::Tensor))> {
        let slots = slot_anchor.len();
        let (k, v) = match ancestors {
            None => (k, v),
            Some((ak, av)) => {
                let before = m - 1;
                let order: Vec<u32> = (0..slots)
                    .flat_map(|s| {
                        (0..before)
                            .map(move |r| (s * before + r) as u32)
                            .chain(std::iter::once((slots * before + s) as u32))
                    })
                    .collect();
                (
                    be.gather_rows(&be.concat_rows(&[&ak, &k])?, &order)?,
                    be.gather_rows(&be.concat_rows(&[&av, &v])?, &order)?,
                )
            }
        };
        let repeated: Vec<u32> = (0..slots as u32)
            .flat_map(|s| std::iter::repeat_n(s, m))
            .collect();
        let q = be.gather_rows(&q, &repeated)?;
        let mask = AttnMask::Blocks {
            ctx_len: ctx.len,
            block: m,
            anchors: slot_anchor.to_vec(),
            ctx_inclusive: false,
            causal_in_block: true,
            window: None,
        };
        let o = be.attention(
            &q,
            &be.concat_rows(&[&ctx.k, &k])?,
            &be.concat_rows(&[&ctx.v, &v])?,
            self.shape,
            &mask,
        )?;
        let last: Vec<u32> = (0..slots).map(|s| (s * m + m - 1) as u32).collect();
        Ok((be.gather_rows(&o, &last)?, (k, v)))
    }
}

/// The tree's accepted length at every completion anchor the run's policy picks and at every
/// anchor of the tree's own replay chain (a₀ = the prompt length, a_{i+1} = a_i + A_tree + 1),
/// which is drafted when the policy skipped it, as `evaluate_sequence` does for the chain.
pub fn tree_accepted<B: Backend>(
    be: &B,
    target: Option<&dyn EmbedHead<B>>,
    drafter: &Eagle3Drafter<B>,
    seq: &Sequence<B>,
    shape: TreeShape,
    opts: &EvalOptions,
) -> Result<BTreeMap<u32, u32>> {
    let mut accepted = BTreeMap::new();
    let end = seq.len().saturating_sub(1);
    if end <= seq.prompt_len {
        return Ok(accepted);
    }
    let ctx = seq
        .eagle3
        .as_ref()
        .context("an EAGLE-3 sequence carries its context rows")?;
    let draft = |anchors: &[usize], accepted: &mut BTreeMap<u32, u32>| -> Result<()> {
        let trees = drafter.draft_trees(be, target, ctx, anchors, shape)?;
        for (tree, &a) in trees.iter().zip(anchors) {
            let a_len = tree.accepted_len(|m| seq.labels.get(a + m).copied());
            accepted.insert(a as u32, a_len as u32);
        }
        Ok(())
    };
    let anchors: Vec<usize> = select_anchors(seq.prompt_len, seq.len(), &opts.anchors, false);
    // k nodes per anchor and depth: as many rows per forward as the chain's anchor batch.
    for chunk in anchors.chunks((opts.anchor_batch / shape.topk).max(1)) {
        draft(chunk, &mut accepted)?;
    }
    let mut a = seq.prompt_len;
    while a < end {
        if !accepted.contains_key(&(a as u32)) {
            draft(&[a], &mut accepted)?;
        }
        a = next_anchor(a as u32, accepted[&(a as u32)]) as usize;
    }
    Ok(accepted)
}

/// One prompt's tree results: the tree's accepted length per anchor.
#[derive(Clone, Debug, Default)]
pub struct PromptTree {
    /// The prompt's index in the run's prompt set.
    pub index: u32,
    pub accepted: BTreeMap<u32, u32>,
}

/// The tree's τ per prompt (tokens, rounds) along its replay chain, under the one definition
/// of docs/metrics.md §2–§3 (bonus included, nothing past the end); `None` for a prompt with no
/// round.
pub fn replayed(info: &PromptInfo, tree: &PromptTree) -> Option<(u64, u64)> {
    let end = info.seq_len.checked_sub(1)? as u32;
    let rounds = replay(info.prompt_len as u32, SequenceEnd::At(end), |a| {
        tree.accepted.get(&a).copied()
    })
    .ok()?;
    let tokens: u64 = rounds.iter().map(|r| r.tokens as u64).sum();
    (!rounds.is_empty()).then_some((tokens, rounds.len() as u64))
}

/// The native rows of a tree run: per prompt `eagle3_tree_tau_replayed`; per run and category
/// `eagle3_tree_tau_replayed_macro` / `_pooled`; per run `eagle3_tree_tau_uniform` (Σ(A + 1)
/// over every anchor with a tree, as `tau_uniform`). `prompts` in the run's order.
pub fn tree_rows(
    shape: &TreeShape,
    depth: usize,
    prompts: &[PromptInfo],
    trees: &[PromptTree],
) -> Vec<MetricRow> {
    let what = shape.describe(depth);
    let row = |name: &str, scope: MetricScope, value: f64, count: u64, description: String| {
        let mut r = MetricRow::scalar(SOURCE, name, scope, value, count, true);
        r.unit = "tokens/round".into();
        r.description = description;
        r
    };
    let by_index: BTreeMap<u32, &PromptTree> = trees.iter().map(|t| (t.index, t)).collect();
    let mut out = Vec::new();
    let mut scopes: BTreeMap<MetricScope, Vec<(u64, u64)>> = BTreeMap::new();
    let (mut uniform_tokens, mut anchors) = (0u64, 0u64);
    for p in prompts {
        let Some(tree) = by_index.get(&p.index) else {
            continue;
        };
        uniform_tokens += tree.accepted.values().map(|&a| a as u64 + 1).sum::<u64>();
        anchors += tree.accepted.len() as u64;
        let Some((tokens, rounds)) = replayed(p, tree) else {
            continue;
        };
        out.push(row(
            "eagle3_tree_tau_replayed",
            MetricScope::Prompt(p.index),
            tokens as f64 / rounds as f64,
            rounds,
            format!("replayed τ of the {what}: tokens per verify round along the tree's own chain (bonus included)"),
        ));
        scopes
            .entry(MetricScope::Run)
            .or_default()
            .push((tokens, rounds));
        if let Some(cat) = &p.category {
            scopes
                .entry(MetricScope::Category(cat.clone()))
                .or_default()
                .push((tokens, rounds));
        }
    }
    for (scope, per_prompt) in scopes {
        let n = per_prompt.len() as u64;
        let macro_tau = per_prompt
            .iter()
            .map(|&(t, r)| t as f64 / r as f64)
            .sum::<f64>()
            / n as f64;
        let (tokens, rounds) = per_prompt
            .iter()
            .fold((0, 0), |(t, r), &(pt, pr)| (t + pt, r + pr));
        out.push(row(
            "eagle3_tree_tau_replayed_macro",
            scope.clone(),
            macro_tau,
            n,
            format!("replayed τ of the {what}: mean over prompts of per-prompt mean tokens per verify round (bonus included)"),
        ));
        out.push(row(
            "eagle3_tree_tau_replayed_pooled",
            scope,
            tokens as f64 / rounds as f64,
            rounds,
            format!("replayed τ of the {what}: Σ tokens / Σ verify rounds over all prompts (bonus included)"),
        ));
    }
    if anchors > 0 {
        out.push(row(
            "eagle3_tree_tau_uniform",
            MetricScope::Run,
            uniform_tokens as f64 / anchors as f64,
            anchors,
            format!("uniform-anchor τ of the {what}: Σ(A+1) / Σ anchors over every anchor with a tree (pooled, bonus included)"),
        ));
    }
    out
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
