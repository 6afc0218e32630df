//! The native metrics that have a per-prompt form ([`DERIVED`]): each is a per-prompt
//! (numerator, denominator) pair of [`PromptStats`] and an aggregation over prompts, macro or
//! pooled. [`summarize`](super::summarize) stores their value over a run's prompts (and, for τ,
//! per prompt and per category); the web UI folds the same pairs for its headline numbers and
//! resamples them for bootstrap CIs and paired Δs.

use super::PromptStats;
use super::RunStats;
use serde::Serialize;

/// How a metric aggregates over prompts (also decides the bootstrap statistic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregation {
    /// Mean of per-prompt values (each prompt weighs the same).
    Macro,
    /// Σ numerators / Σ denominators over prompts.
    Pooled,
}

/// A native metric with a per-prompt form: per-prompt (numerator, denominator) pairs plus its
/// aggregation, and how its rows are stored (name, unit, description, direction).
pub struct DerivedMetric {
    pub name: &'static str,
    pub description: &'static str,
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub aggregation: Aggregation,
    /// None when the prompt has nothing to count (it is left out of the aggregate).
    pub per_prompt: fn(&PromptStats) -> Option<(f64, f64)>,
}

fn ratio(n: u64, d: u64) -> Option<(f64, f64)> {
    (d > 0).then_some((n as f64, d as f64))
}

/// The native metrics with a per-prompt form (definitions in docs/metrics.md), in the order the
/// comparison lists them.
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
        per_prompt: |p| ratio(p.uniform_tokens(), p.blocks as u64),
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
        per_prompt: |p| ratio(p.accepted_tokens(), p.blocks as u64),
    },
    DerivedMetric {
        name: "topk_accuracy",
        description: "target token within the drafter's top-K, over all valid drafted completion positions; pooled",
        unit: "fraction",
        higher_is_better: true,
        aggregation: Aggregation::Pooled,
        per_prompt: |p| ratio(p.topk_correct_total(), p.valid_total()),
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

/// Run-level value of every [`DERIVED`] metric over the run's evaluated prompts.
pub fn derived_values(stats: &RunStats) -> Vec<(&'static str, Option<f64>)> {
    let all: Vec<&PromptStats> = stats.evaluated().collect();
    DERIVED
        .iter()
        .map(|m| (m.name, aggregate(m, &all)))
        .collect()
}

/// Value of a derived metric over a set of prompts; None when no prompt counts.
pub fn aggregate(m: &DerivedMetric, prompts: &[&PromptStats]) -> Option<f64> {
    aggregate_counted(m, prompts).map(|(value, _)| value)
}

/// Value of a derived metric over a set of prompts, in their order, with what it was computed
/// over (the count a metric row stores): the prompts that count for a macro metric, Σ
/// denominators (rounds, blocks, positions) for a pooled one. None when no prompt counts.
///
/// Sums are over the prompts in the order given, so the value is the same to the last bit
/// wherever it is computed. Denominators are counts, exact in an f64 below 2⁵³.
pub fn aggregate_counted(m: &DerivedMetric, prompts: &[&PromptStats]) -> Option<(f64, u64)> {
    let pairs: Vec<(f64, f64)> = prompts.iter().filter_map(|p| (m.per_prompt)(p)).collect();
    if pairs.is_empty() {
        return None;
    }
    Some(match m.aggregation {
        Aggregation::Macro => {
            let sum: f64 = pairs.iter().map(|(n, d)| n / d).sum();
            (sum / pairs.len() as f64, pairs.len() as u64)
        }
        Aggregation::Pooled => {
            let den: f64 = pairs.iter().map(|p| p.1).sum();
            (pairs.iter().map(|p| p.0).sum::<f64>() / den, den as u64)
        }
    })
}
