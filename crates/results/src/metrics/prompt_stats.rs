//! Per-prompt statistics of a run: the counts every native metric is a fold of (docs/metrics.md
//! §2–§6); γ = B−1 drafted positions per block:
//! - A(a): leading positions whose draft top-1 equals the target token (an invalid position,
//!   past the end of the sequence, stops the streak) — `RecordBatch::accepted_len`.
//! - the replayed rounds: the anchors a real greedy decode visits, a₀ = first completion anchor,
//!   a_{i+1} = a_i + A(a_i) + 1, A+1 tokens per round (bonus included) but none past the end of
//!   the sequence — `draftlens_records::replay`, the function the `replayed-tau` plugin calls too.
//! - per position k: valid, top-1 correct, target within the top-K, reached (A ≥ k−1 with k
//!   valid) and accepted (A ≥ k).
//!
//! Only completion-region anchors count (what deployment drafts from); prompt-region anchors are
//! kept in the records but not in these statistics. The web UI caches [`RunStats`] and bundles
//! carry it, so its serialised form is a format: change a field's meaning only with
//! [`STATS_VERSION`].

use crate::store::PromptMeta;
use draftlens_records::{RecordBatch, Region, Round, SequenceEnd};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Bump when the meaning of a field of [`PromptStats`] changes (statistics cached with another
/// version are recomputed).
/// 2: the last replayed round yields no bonus token past the end of the sequence.
pub const STATS_VERSION: i64 = 2;

/// Kind of a run's [`RunStats`] in the store's derived cache (and in bundles). For a run without
/// records (a serving engine's trace, `crate::trace`) they are the run's per-prompt data.
pub const STATS_KIND: &str = "prompt-stats";

/// Counts for one prompt. Vectors indexed by position k−1 have γ entries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptStats {
    pub index: u32,
    pub sha256: String,
    pub category: Option<String>,
    /// Completion anchors evaluated.
    pub blocks: u32,
    pub valid: Vec<u32>,
    pub correct: Vec<u32>,
    /// Target token anywhere in the drafter's top-K.
    pub topk_correct: Vec<u32>,
    /// Blocks with A ≥ k−1 whose position k is valid (conditional-acceptance denominator).
    pub reached: Vec<u32>,
    /// Blocks with A ≥ k.
    pub accepted: Vec<u32>,
    /// γ+1 entries: blocks with A = n.
    pub hist: Vec<u32>,
    /// Σ −log q(top-1) over valid positions, in the order the blocks are stored (drafter
    /// confidence; lower = more confident).
    pub nll_sum: f64,
    /// A of each replayed round, in decode order.
    pub rounds: Vec<u16>,
    /// Tokens the replayed rounds yield (Σ A+1, less the bonus of a last round that reaches the
    /// end of the sequence). Absent in statistics of older bundles: Σ A+1 is used then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_tokens: Option<u64>,
}

impl PromptStats {
    /// Σ(A+1) over the prompt's completion blocks.
    pub fn uniform_tokens(&self) -> u64 {
        self.hist
            .iter()
            .enumerate()
            .map(|(n, c)| (n as u64 + 1) * *c as u64)
            .sum()
    }
    /// Σ A over the prompt's completion blocks.
    pub fn accepted_tokens(&self) -> u64 {
        self.hist
            .iter()
            .enumerate()
            .map(|(n, c)| n as u64 * *c as u64)
            .sum()
    }
    pub fn uniform_tau(&self) -> Option<f64> {
        (self.blocks > 0).then(|| self.uniform_tokens() as f64 / self.blocks as f64)
    }
    pub fn replay_tokens(&self) -> u64 {
        self.replay_tokens
            .unwrap_or_else(|| self.rounds.iter().map(|&a| a as u64 + 1).sum())
    }
    pub fn replayed_tau(&self) -> Option<f64> {
        (!self.rounds.is_empty()).then(|| self.replay_tokens() as f64 / self.rounds.len() as f64)
    }
    pub fn valid_total(&self) -> u64 {
        self.valid.iter().map(|&x| x as u64).sum()
    }
    pub fn correct_total(&self) -> u64 {
        self.correct.iter().map(|&x| x as u64).sum()
    }
    pub fn topk_correct_total(&self) -> u64 {
        self.topk_correct.iter().map(|&x| x as u64).sum()
    }
}

/// Per-prompt statistics of a run, in prompt-index order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// γ = B − 1.
    pub positions: usize,
    pub top_k: u32,
    pub prompts: Vec<PromptStats>,
}

impl RunStats {
    /// Prompts that had at least one completion anchor, or verify rounds without blocks (a
    /// serving engine's trace, which records rounds but no drafter candidates). With records, a
    /// prompt with rounds always has blocks.
    pub fn evaluated(&self) -> impl Iterator<Item = &PromptStats> {
        self.prompts
            .iter()
            .filter(|p| p.blocks > 0 || !p.rounds.is_empty())
    }
    pub fn total_blocks(&self) -> u64 {
        self.prompts.iter().map(|p| p.blocks as u64).sum()
    }
    /// Completion blocks with A = n, n = 0..=γ, over every prompt.
    pub fn accept_hist(&self) -> Vec<u64> {
        let mut h = vec![0u64; self.positions + 1];
        for p in self.evaluated() {
            for (t, &c) in h.iter_mut().zip(&p.hist) {
                *t += c as u64;
            }
        }
        h
    }
    /// One per-position count (`valid`, `correct`, …) summed over every prompt: γ entries.
    pub fn position_totals(&self, count: impl Fn(&PromptStats) -> &[u32]) -> Vec<u64> {
        let mut totals = vec![0u64; self.positions];
        for p in self.evaluated() {
            for (t, &c) in totals.iter_mut().zip(count(p)) {
                *t += c as u64;
            }
        }
        totals
    }
}

/// Computes per-prompt statistics from records. `prompts` supplies hashes, categories and the
/// lengths the replay needs (prompts with records but no prompt row get an empty hash, so they
/// are never paired, and a chain whose end is read off the blocks).
pub fn compute_stats(batch: &RecordBatch, prompts: &[PromptMeta]) -> RunStats {
    let g = batch.positions_per_block();
    let kk = batch.top_k as usize;
    let mut by_prompt: BTreeMap<u32, PromptStats> = BTreeMap::new();
    let meta: HashMap<u32, &PromptMeta> = prompts.iter().map(|p| (p.index, p)).collect();
    let fresh = |i: u32| {
        let m = meta.get(&i);
        PromptStats {
            index: i,
            sha256: m.map(|m| m.sha256.clone()).unwrap_or_default(),
            category: m.and_then(|m| m.category.clone()),
            valid: vec![0; g],
            correct: vec![0; g],
            topk_correct: vec![0; g],
            reached: vec![0; g],
            accepted: vec![0; g],
            hist: vec![0; g + 1],
            ..Default::default()
        }
    };
    for p in prompts {
        by_prompt.insert(p.index, fresh(p.index));
    }
    // anchor -> block per prompt, for the replay.
    let mut anchors: HashMap<u32, HashMap<u32, usize>> = HashMap::new();
    for b in 0..batch.num_blocks() {
        if batch.region[b] != Region::Completion as u8 {
            continue;
        }
        let pi = batch.prompt_index[b];
        let st = by_prompt.entry(pi).or_insert_with(|| fresh(pi));
        anchors.entry(pi).or_default().insert(batch.anchor[b], b);
        let a = batch.accepted_len(b);
        st.blocks += 1;
        st.hist[a] += 1;
        for k in 1..=g {
            let i = batch.pos_index(b, k);
            if batch.valid[i] == 0 {
                continue;
            }
            st.valid[k - 1] += 1;
            let cands = &batch.draft_ids[i * kk..(i + 1) * kk];
            if cands[0] == batch.target[i] {
                st.correct[k - 1] += 1;
            }
            if cands.contains(&batch.target[i]) {
                st.topk_correct[k - 1] += 1;
            }
            if a >= k - 1 {
                st.reached[k - 1] += 1;
            }
            if a >= k {
                st.accepted[k - 1] += 1;
            }
            st.nll_sum += -(batch.draft_logprobs[i * kk] as f64);
        }
    }
    for (pi, map) in &anchors {
        let st = by_prompt.get_mut(pi).expect("prompt entry exists");
        let m = meta.get(pi);
        let chain = prompt_chain(batch, map, m.map(|m| (m.prompt_len, m.num_tokens)));
        st.rounds = chain.iter().map(|r| r.accepted as u16).collect();
        st.replay_tokens = Some(chain.iter().map(|r| r.tokens as u64).sum());
    }
    RunStats {
        positions: g,
        top_k: batch.top_k,
        prompts: by_prompt.into_values().collect(),
    }
}

/// The replayed rounds of one prompt (`docs/metrics.md` §3). `anchor_to_block` maps its
/// completion anchors to blocks of `batch`; `lens` = (prompt length, tokens of prompt +
/// continuation) when the prompt row is known. The chain starts at the prompt length (else at the
/// first completion anchor) and ends at the last position of the sequence (else where the blocks
/// cut by the end say it is). A chain that lands on an anchor without a block has no rounds.
pub fn prompt_chain(
    batch: &RecordBatch,
    anchor_to_block: &HashMap<u32, usize>,
    lens: Option<(u32, u32)>,
) -> Vec<Round> {
    let Some(&min_anchor) = anchor_to_block.keys().min() else {
        return Vec::new();
    };
    let view = batch.view();
    let end = match lens {
        Some((_, n)) => SequenceEnd::At(n.saturating_sub(1)),
        None => match anchor_to_block
            .values()
            .filter_map(|&b| view.cut_end(b))
            .max()
        {
            Some(e) => SequenceEnd::At(e),
            None => SequenceEnd::Unknown {
                last_anchor: *anchor_to_block.keys().max().expect("non-empty"),
            },
        },
    };
    let first = lens.map_or(min_anchor, |(p, _)| p);
    draftlens_records::replay(first, end, |a| {
        anchor_to_block
            .get(&a)
            .map(|&b| view.accepted_len(b) as u32)
    })
    .unwrap_or_default()
}

/// Replayed rounds of one prompt's records with their anchors (for the drill-down): (anchor,
/// block index, A). `lens` as in [`prompt_chain`].
pub fn replay_chain(batch: &RecordBatch, lens: Option<(u32, u32)>) -> Vec<(u32, usize, usize)> {
    let map: HashMap<u32, usize> = (0..batch.num_blocks())
        .filter(|&b| batch.region[b] == Region::Completion as u8)
        .map(|b| (batch.anchor[b], b))
        .collect();
    prompt_chain(batch, &map, lens)
        .into_iter()
        .map(|r| (r.anchor, map[&r.anchor], r.accepted as usize))
        .collect()
}

/// The replayed chain of one prompt as (rounds, tokens), or None when a chain anchor has no
/// block: the chain of [`prompt_chain`] from the prompt length to the end of a sequence of
/// `seq_len` tokens, over the blocks `blocks_by_anchor` names (for callers that hold a prompt's
/// blocks by anchor and need to know whether the chain was complete).
pub fn replay(
    batch: &RecordBatch,
    blocks_by_anchor: &HashMap<u32, usize>,
    prompt_len: usize,
    seq_len: usize,
) -> Option<(u64, u64)> {
    let end = SequenceEnd::At(seq_len.saturating_sub(1) as u32);
    let chain = draftlens_records::replay(prompt_len as u32, end, |a| {
        blocks_by_anchor
            .get(&a)
            .map(|&b| batch.accepted_len(b) as u32)
    })
    .ok()?;
    let tokens = chain.iter().map(|r| r.tokens as u64).sum();
    Some((chain.len() as u64, tokens))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::metrics::{aggregate, derived};

    /// A batch for one prompt of `len` tokens (prompt_len 2) with B = 4, K = 2, where the drafter
    /// accepts exactly `acc[a]` tokens at completion anchor a (then misses).
    pub(crate) fn scripted(len: u32, acc: &dyn Fn(u32) -> usize) -> RecordBatch {
        let mut b = RecordBatch::new(4, 2);
        let y = |pos: u32| 100 + pos; // the sequence's tokens
        for a in 2..len {
            b.prompt_index.push(0);
            b.anchor.push(a);
            b.region.push(0);
            let n = acc(a);
            for k in 1..=3u32 {
                let valid = a + k < len;
                b.target.push(if valid { y(a + k) } else { 0 });
                b.valid.push(valid as u8);
                b.loss_mask.push(1);
                let top1 = if (k as usize) <= n { y(a + k) } else { 7 };
                b.draft_ids.extend([top1, y(a + k)]);
                b.draft_logprobs.extend([-0.5, -2.0]);
            }
        }
        b
    }

    pub(crate) fn meta() -> Vec<PromptMeta> {
        vec![PromptMeta {
            index: 0,
            id: "p0".into(),
            sha256: "s0".into(),
            category: Some("code".into()),
            prompt_len: 2,
            num_tokens: 12,
        }]
    }

    #[test]
    fn replay_follows_accepted_lengths_by_hand() {
        // len 12, anchors 2..11. Scripted A: anchor 2 → 3, 6 → 0, 7 → 1, 9 → 2 (capped by validity).
        let acc = |a: u32| match a {
            2 => 3,
            6 => 0,
            7 => 1,
            _ => 3,
        };
        let b = scripted(12, &acc);
        // Chain: a0=2 (A=3) → 6 (A=0) → 7 (A=1) → 9: positions 10, 11 valid, 12 invalid → A=2 → 12: no block.
        let chain = replay_chain(&b, Some((2, 12)));
        assert_eq!(
            chain.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
            vec![(2, 3), (6, 0), (7, 1), (9, 2)]
        );
        // Without the prompt row the end is found from the blocks it cuts: the same chain.
        assert_eq!(replay_chain(&b, None), chain);
        let st = compute_stats(&b, &meta());
        let p = &st.prompts[0];
        assert_eq!(p.rounds, vec![3, 0, 1, 2]);
        // The last round at 9 accepts 10 and 11, the last position: no bonus token past the end,
        // so it yields 2 tokens, not 3. Replayed τ = (4 + 1 + 2 + 2) / 4 = 2.25. (Before the web
        // shared the replay with the native metrics it counted 3 and showed 2.5.)
        assert_eq!(p.replay_tokens(), 9);
        assert_eq!(p.replayed_tau(), Some(2.25));
        assert_eq!(p.blocks, 10);
        // Anchor 11 has no valid position: A = 0. Anchor 10: one valid position, A = 1.
        assert_eq!(p.hist.iter().sum::<u32>(), 10);
        assert_eq!(p.valid, vec![9, 8, 7]);
        // Top-2 always contains the target.
        assert_eq!(p.topk_correct, p.valid);
        // The same rounds as the (rounds, tokens) of the whole chain.
        let by_anchor: HashMap<u32, usize> =
            (0..b.num_blocks()).map(|i| (b.anchor[i], i)).collect();
        assert_eq!(replay(&b, &by_anchor, 2, 12), Some((4, 9)));
    }

    #[test]
    fn oracle_and_anti_oracle_known_answers() {
        let oracle = compute_stats(&scripted(40, &|_| 3), &meta());
        let p = &oracle.prompts[0];
        // Replay: every round accepts 3 + bonus, except near the end.
        assert!(p.rounds[..p.rounds.len() - 1].iter().all(|&a| a == 3));
        let get = |st: &RunStats, n: &str| {
            aggregate(derived(n), &st.evaluated().collect::<Vec<_>>()).unwrap()
        };
        assert_eq!(get(&oracle, "flat_accuracy"), 1.0);
        assert_eq!(get(&oracle, "first_position_acceptance"), 37.0 / 38.0); // anchor 39: nothing to draft
        assert!((get(&oracle, "draft_nll") - 0.5).abs() < 1e-12);

        let anti = compute_stats(&scripted(40, &|_| 0), &meta());
        assert_eq!(get(&anti, "tau_replayed_macro"), 1.0);
        assert_eq!(get(&anti, "tau_uniform"), 1.0);
        assert_eq!(get(&anti, "flat_accuracy"), 0.0);
        assert_eq!(anti.accept_hist(), vec![38, 0, 0, 0]);
    }

    #[test]
    fn run_totals_add_up_the_prompts() {
        // A alternates 1 and 2 over anchors 2..=20 (anchors 20 and 21 are cut by the end).
        let st = compute_stats(&scripted(22, &|a| 1 + (a as usize % 2)), &meta());
        let p = &st.prompts[0];
        assert_eq!(
            st.accept_hist(),
            p.hist.iter().map(|&c| c as u64).collect::<Vec<_>>()
        );
        assert_eq!(st.accept_hist().iter().sum::<u64>(), 20);
        assert_eq!(st.position_totals(|p| &p.valid), vec![19, 18, 17]);
        assert_eq!(p.accepted_tokens() + p.blocks as u64, p.uniform_tokens());
    }

    #[test]
    fn prompt_region_anchors_are_not_counted() {
        let mut b = scripted(10, &|_| 3);
        for r in b.region.iter_mut().take(3) {
            *r = Region::Prompt as u8;
        }
        let st = compute_stats(&b, &meta());
        assert_eq!(st.prompts[0].blocks, 5);
        assert_eq!(replay_chain(&b, None)[0].0, 5);
    }
}
