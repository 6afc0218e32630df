//! What the UI derives from a run's stored records: per-prompt counts (per-position accuracy,
//! acceptance, histogram of accepted lengths, the replayed rounds) from which every chart and
//! the per-prompt values of the native metrics (for CIs and paired Δs) are computed.
//!
//! Definitions (docs/metrics.md §2–§5); γ = B−1 drafted positions per block:
//! - A(a): leading positions whose draft top-1 equals the target token (an invalid position,
//!   past the end of the sequence, stops the streak) — `RecordBatch::accepted_len`.
//! - uniform-anchor τ: Σ(A+1) / Σ blocks over every evaluated completion anchor (pooled).
//! - replayed τ: tokens per round over the anchors a real greedy decode visits:
//!   a₀ = first completion anchor, a_{i+1} = a_i + A(a_i) + 1, A+1 tokens per round (bonus
//!   included) but none past the end of the sequence — `draftlens_records::replay`, the same
//!   function as the native metrics and the `replayed-tau` plugin.
//! - macro = mean of per-prompt values; pooled = Σ numerators / Σ denominators.
//! - per-position top-1 accuracy a_k = #(valid ∧ top-1 = t_k) / #valid_k (flat, marginal).
//! - conditional acceptance c_k = #(A ≥ k) / #(A ≥ k−1 ∧ position k valid).
//!
//! Only completion-region anchors count (what deployment drafts from); prompt-region anchors
//! are kept in the records but not in these statistics.

use crate::stats::{mean, Resamples, Rng};
use anyhow::{Context, Result};
use draftlens_records::{replay, RecordBatch, Region, Round, SequenceEnd};
use draftlens_results::store::{Derived, PromptMeta, RunInfo, Store};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

pub const STATS_KIND: &str = "prompt-stats";
/// Bump when the meaning of a field changes (cached values of other versions are recomputed).
/// 2: the last replayed round yields no bonus token past the end of the sequence.
pub const STATS_VERSION: i64 = 2;
/// Source of the metrics of [`DERIVED`]: they are the engine's native metrics
/// (`crates/engine/src/drafter/metrics.rs`, stored by `draftlens run`) under the same names and
/// definitions. The UI recomputes them per prompt from records only to get per-prompt values
/// for CIs and paired Δs; `crates/web/tests/tau_agreement.rs` checks both agree to the last bit.
pub const SOURCE: &str = "native";

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
    /// Σ −log q(top-1) over valid positions (drafter confidence; lower = more confident).
    pub nll_sum: f64,
    /// A of each replayed round, in decode order.
    pub rounds: Vec<u16>,
    /// Tokens the replayed rounds yield (Σ A+1, less the bonus of a last round that reaches the
    /// end of the sequence). Absent in statistics of older bundles: Σ A+1 is used then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_tokens: Option<u64>,
}

impl PromptStats {
    pub fn uniform_tau(&self) -> Option<f64> {
        (self.blocks > 0).then(|| {
            let s: u64 = self
                .hist
                .iter()
                .enumerate()
                .map(|(n, c)| (n as u64 + 1) * *c as u64)
                .sum();
            s as f64 / self.blocks as f64
        })
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
}

/// Per-prompt statistics of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// γ = B − 1.
    pub positions: usize,
    pub top_k: u32,
    pub prompts: Vec<PromptStats>,
}

impl RunStats {
    /// Prompts that had at least one completion anchor.
    pub fn evaluated(&self) -> impl Iterator<Item = &PromptStats> {
        self.prompts.iter().filter(|p| p.blocks > 0)
    }
    pub fn total_blocks(&self) -> u64 {
        self.prompts.iter().map(|p| p.blocks as u64).sum()
    }
}

/// Computes per-prompt statistics from records. `prompts` supplies hashes and categories
/// (prompts with records but no prompt row get an empty hash and are never paired).
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
    replay(first, end, |a| {
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

/// Statistics of a run: from the derived cache when current, else computed from records and
/// cached. `Ok(None)` when the run has neither records nor imported statistics.
pub fn load_stats(store: &Store, run: &RunInfo) -> Result<Option<RunStats>> {
    if let Some(d) = store.derived(run.id, STATS_KIND)? {
        // Imported runs may carry statistics without records: keep those whatever the version.
        if d.version == STATS_VERSION || run.num_blocks == 0 {
            let s: RunStats = serde_json::from_slice(&d.data).with_context(|| {
                format!(
                    "{}: run {}: cached statistics are corrupt",
                    store.path().display(),
                    run.id
                )
            })?;
            return Ok(Some(s));
        }
    }
    if run.num_blocks == 0 {
        return Ok(None);
    }
    // Prompt by prompt, so memory is bounded by the largest prompt, not the run (a run can
    // hold a million blocks).
    let metas = store.prompt_metas(run.id)?;
    let mut stats = compute_stats(&RecordBatch::new(run.block_size, run.top_k), &metas);
    let mut by_index: HashMap<u32, usize> = stats
        .prompts
        .iter()
        .enumerate()
        .map(|(i, p)| (p.index, i))
        .collect();
    let meta_of: HashMap<u32, &PromptMeta> = metas.iter().map(|m| (m.index, m)).collect();
    for pi in store.record_prompts(run.id)? {
        let meta: Vec<PromptMeta> = meta_of
            .get(&pi)
            .map(|m| vec![(*m).clone()])
            .unwrap_or_default();
        let one = compute_stats(&store.prompt_records(run.id, pi)?, &meta);
        for p in one.prompts.into_iter().filter(|p| p.index == pi) {
            match by_index.get(&pi) {
                Some(&i) => stats.prompts[i] = p,
                None => {
                    by_index.insert(pi, stats.prompts.len());
                    stats.prompts.push(p);
                }
            }
        }
    }
    stats.prompts.sort_by_key(|p| p.index);
    // Only finished runs are cached: a running run's records still grow.
    if run.status != draftlens_results::store::RunStatus::Running {
        let data = serde_json::to_vec(&stats)?;
        // A read-only database (or a race with delete) is not an error for a cache.
        let _ = store.put_derived(
            run.id,
            &Derived {
                kind: STATS_KIND.into(),
                version: STATS_VERSION,
                data,
            },
        );
    }
    Ok(Some(stats))
}

// ---------------------------------------------------------------------------------------------
// Records-derived metrics
// ---------------------------------------------------------------------------------------------

/// How a metric aggregates over prompts (decides the bootstrap statistic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregation {
    /// Mean of per-prompt values (each prompt weighs the same).
    Macro,
    /// Σ numerators / Σ denominators over prompts.
    Pooled,
}

/// A records-derived metric: per-prompt (numerator, denominator) pairs plus its aggregation.
pub struct DerivedMetric {
    pub name: &'static str,
    pub description: &'static str,
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub aggregation: Aggregation,
    pub per_prompt: fn(&PromptStats) -> Option<(f64, f64)>,
}

fn ratio(n: u64, d: u64) -> Option<(f64, f64)> {
    (d > 0).then_some((n as f64, d as f64))
}

/// Σ(A+1) over a prompt's completion blocks.
fn uniform_tokens(p: &PromptStats) -> u64 {
    p.hist
        .iter()
        .enumerate()
        .map(|(n, c)| (n as u64 + 1) * *c as u64)
        .sum()
}

/// The native metrics the UI recomputes per prompt from records (names, units, directions and
/// aggregation as `crates/engine/src/drafter/metrics.rs` stores them; definitions in docs/metrics.md).
pub const DERIVED: &[DerivedMetric] = &[
    DerivedMetric {
        name: "tau_replayed_macro",
        description: "replayed τ: mean over prompts of per-prompt mean tokens per verify round (bonus included)",
        unit: "tokens/round",
        higher_is_better: true,
        aggregation: Aggregation::Macro,
        per_prompt: |p| ratio(p.replay_tokens(), p.rounds.len() as u64),
    },
    DerivedMetric {
        name: "tau_replayed_pooled",
        description: "replayed τ: Σ tokens / Σ verify rounds over all prompts (bonus included)",
        unit: "tokens/round",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| ratio(p.replay_tokens(), p.rounds.len() as u64),
    },
    DerivedMetric {
        name: "tau_uniform",
        description: "uniform-anchor τ: Σ(A+1) / Σ blocks over every completion anchor (pooled, bonus included)",
        unit: "tokens/round",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| ratio(uniform_tokens(p), p.blocks as u64),
    },
    DerivedMetric {
        name: "first_position_acceptance",
        description: "P(A ≥ 1): the first drafted token is accepted; pooled over completion anchors",
        unit: "fraction",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| ratio(p.accepted.first().copied().unwrap_or(0) as u64, p.blocks as u64),
    },
    DerivedMetric {
        name: "flat_accuracy",
        description: "flat top-1 accuracy over all valid drafted completion positions (what training logs as acc); pooled",
        unit: "fraction",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| ratio(p.correct_total(), p.valid_total()),
    },
    DerivedMetric {
        name: "mean_streak",
        description: "mean accepted length A over completion anchors (bonus excluded)",
        unit: "tokens",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| {
            let s: u64 = p.hist.iter().enumerate().map(|(n, c)| n as u64 * *c as u64).sum();
            ratio(s, p.blocks as u64)
        },
    },
    DerivedMetric {
        name: "topk_accuracy",
        description: "target token within the drafter's top-K, over all valid drafted completion positions; pooled",
        unit: "fraction",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| ratio(p.topk_correct.iter().map(|&x| x as u64).sum(), p.valid_total()),
    },
    DerivedMetric {
        name: "draft_nll",
        description: "mean −log q of the drafter's top-1 over valid completion positions (confidence, lower = more confident); pooled",
        unit: "nats",
        higher_is_better: false,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| {
            let d = p.valid_total();
            (d > 0).then_some((p.nll_sum, d as f64))
        },
    },
];

/// The [`DERIVED`] metric called `name` (panics on a name not in the list: a programming error).
pub fn derived(name: &str) -> &'static DerivedMetric {
    DERIVED
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no derived metric {name}"))
}

/// Run-level value of every [`DERIVED`] metric.
pub fn derived_values(stats: &RunStats) -> Vec<(&'static str, Option<f64>)> {
    let all: Vec<&PromptStats> = stats.evaluated().collect();
    DERIVED
        .iter()
        .map(|m| (m.name, aggregate(m, &all)))
        .collect()
}

/// Value of a derived metric over a set of prompts.
pub fn aggregate(m: &DerivedMetric, prompts: &[&PromptStats]) -> Option<f64> {
    let pairs: Vec<(f64, f64)> = prompts.iter().filter_map(|p| (m.per_prompt)(p)).collect();
    if pairs.is_empty() {
        return None;
    }
    Some(match m.aggregation {
        Aggregation::Macro => mean(&pairs.iter().map(|(n, d)| n / d).collect::<Vec<_>>()),
        Aggregation::Pooled => {
            pairs.iter().map(|p| p.0).sum::<f64>() / pairs.iter().map(|p| p.1).sum::<f64>()
        }
    })
}

/// Per-position curve with a bootstrap CI over prompts: (value, lo, hi) per position.
#[derive(Clone, Debug, Serialize)]
pub struct Curve {
    pub value: Vec<Option<f64>>,
    pub lo: Vec<Option<f64>>,
    pub hi: Vec<Option<f64>>,
    /// Denominator per position (blocks counted), so sparse positions can be flagged.
    pub den: Vec<f64>,
}

/// Per-position top-1 accuracy (`conditional` = false) or conditional acceptance (true).
pub fn position_curve(stats: &RunStats, conditional: bool, reps: usize, seed: &str) -> Curve {
    let ps: Vec<&PromptStats> = stats.evaluated().collect();
    let mut rng = Rng::from_str_seed(seed);
    let rs = Resamples::new(ps.len(), reps, &mut rng);
    let mut c = Curve {
        value: vec![],
        lo: vec![],
        hi: vec![],
        den: vec![],
    };
    for k in 0..stats.positions {
        let (num, den): (Vec<f64>, Vec<f64>) = if conditional {
            ps.iter()
                .map(|p| (p.accepted[k] as f64, p.reached[k] as f64))
                .unzip()
        } else {
            ps.iter()
                .map(|p| (p.correct[k] as f64, p.valid[k] as f64))
                .unzip()
        };
        let d: f64 = den.iter().sum();
        c.den.push(d);
        c.value.push((d > 0.0).then(|| num.iter().sum::<f64>() / d));
        let ci = if d > 0.0 {
            rs.ratio_ci(&num, &den)
        } else {
            None
        };
        c.lo.push(ci.map(|x| x.0));
        c.hi.push(ci.map(|x| x.1));
    }
    c
}

/// Distribution of A+1 over replayed rounds (`replayed`) or over all anchors: fractions for
/// n = 1..=γ+1.
pub fn accept_histogram(stats: &RunStats, replayed: bool) -> Vec<f64> {
    let mut h = vec![0u64; stats.positions + 1];
    for p in stats.evaluated() {
        if replayed {
            for &a in &p.rounds {
                if (a as usize) < h.len() {
                    h[a as usize] += 1;
                }
            }
        } else {
            for (n, c) in p.hist.iter().enumerate() {
                h[n] += *c as u64;
            }
        }
    }
    let total: u64 = h.iter().sum();
    h.iter()
        .map(|&c| {
            if total > 0 {
                c as f64 / total as f64
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch for one prompt of `len` tokens (prompt_len 2) with B = 4, K = 2, where the drafter
    /// accepts exactly `acc[a]` tokens at completion anchor a (then misses).
    fn scripted(len: u32, acc: &dyn Fn(u32) -> usize) -> RecordBatch {
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

    fn meta() -> Vec<PromptMeta> {
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
        let cond = position_curve(&anti, true, 0, "");
        assert_eq!(cond.value[0], Some(0.0));
        // Nothing reaches position 2, so its conditional acceptance is undefined.
        assert_eq!(cond.value[1], None);
    }

    #[test]
    fn conditional_acceptance_from_counts() {
        // A alternates 1 and 2 over anchors (all positions valid for anchors < len-3).
        let st = compute_stats(&scripted(203, &|a| 1 + (a as usize % 2)), &meta());
        let c = position_curve(&st, true, 200, "t");
        // P(accept 1) = 1, P(accept 2 | 1) ≈ 1/2, P(accept 3 | 2) = 0.
        assert_eq!(c.value[0], Some(1.0));
        assert!((c.value[1].unwrap() - 0.5).abs() < 0.01);
        assert_eq!(c.value[2], Some(0.0));
        let acc = position_curve(&st, false, 0, "");
        assert!((acc.value[1].unwrap() - 0.5).abs() < 0.01);
        let h = accept_histogram(&st, false);
        assert!((h[1] - 0.5).abs() < 0.02 && (h[2] - 0.5).abs() < 0.02);
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
