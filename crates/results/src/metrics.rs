//! The native metrics of a run (docs/metrics.md), defined once. Every row `draftlens run` and
//! `draftlens merge` store ([`summarize`]) is a fold of one per-prompt statistics type
//! ([`PromptStats`], computed from records by [`compute_stats`]); the web UI folds the same
//! statistics for its headline numbers, charts, bootstrap CIs and paired Δs. The metric plugins
//! (`plugins/replayed-tau`, …) compute some of the same definitions in WASM, an independent
//! implementation checked against these (`crates/web/tests/tau_agreement.rs`).
//!
//! - [`prompt_stats`]: per-prompt counts and the replayed chain of each prompt;
//! - [`sampled`]: the expected acceptance of a run sampled at T > 0 (`run --temperature`), from
//!   the stored p and q after the run's transform;
//! - [`derived`]: the metrics with a per-prompt form ([`DERIVED`]: name, unit, description,
//!   direction, macro or pooled) and their aggregation over prompts;
//! - this file: the stored rows, scopes and series.
//!
//! Conventions (defined in `docs/metrics.md`; A, the tokens of a round and the replay chain come
//! from `draftlens-records`):
//! - τ counts the bonus token: a round at anchor a yields min(A+1, T−1−a) tokens (the last round
//!   of a sequence has no bonus past the end).
//! - replayed τ: anchors a₀ = first completion position, a_{i+1} = a_i + A(a_i) + 1; macro = mean
//!   of per-prompt τ, pooled = Σ tokens / Σ rounds.
//! - uniform τ and per-position metrics use completion-region blocks only.

pub mod derived;
pub mod prompt_stats;
pub mod sampled;

pub use derived::{
    aggregate, aggregate_counted, derived, derived_values, Aggregation, DerivedMetric, DERIVED,
};
pub use prompt_stats::{
    compute_stats, prompt_chain, replay, replay_chain, PromptStats, RunStats, STATS_KIND,
    STATS_VERSION,
};
pub use sampled::{run_sampling, sampled_rows};

use crate::store::{MetricRow, MetricScope, PromptMeta};
use draftlens_records::RecordBatch;
use std::collections::{BTreeMap, HashMap};

/// The source of the native metric rows.
pub const SOURCE: &str = "native";

/// What the metrics need to know about each prompt of a run.
#[derive(Clone, Debug)]
pub struct PromptInfo {
    pub index: u32,
    pub prompt_len: usize,
    pub seq_len: usize,
    pub category: Option<String>,
}

impl PromptInfo {
    /// The prompt row [`compute_stats`] reads (no id or hash: stored rows are not paired).
    fn meta(&self) -> PromptMeta {
        PromptMeta {
            index: self.index,
            id: String::new(),
            sha256: String::new(),
            category: self.category.clone(),
            prompt_len: self.prompt_len as u32,
            num_tokens: self.seq_len as u32,
        }
    }
}

fn row(
    name: &str,
    scope: MetricScope,
    value: f64,
    count: u64,
    unit: &str,
    desc: &str,
    series: Option<serde_json::Value>,
) -> MetricRow {
    let mut r = MetricRow::scalar(SOURCE, name, scope, value, count, true);
    r.unit = unit.into();
    r.description = desc.into();
    r.series = series;
    r
}

/// The row of the [`DERIVED`] metric `name` over `prompts` under `scope`; None when no prompt
/// counts.
fn derived_row(name: &str, scope: MetricScope, prompts: &[&PromptStats]) -> Option<MetricRow> {
    let m = derived(name);
    let (value, count) = aggregate_counted(m, prompts)?;
    let mut r = row(m.name, scope, value, count, m.unit, m.description, None);
    r.higher_is_better = m.higher_is_better;
    Some(r)
}

/// `r` under the name and description a narrower scope (a prompt, a category) stores it with.
fn relabel(mut r: MetricRow, name: &str, description: &str) -> MetricRow {
    r.name = name.into();
    r.description = description.into();
    r
}

/// Every native metric of a run: run scope, per prompt, per category. `prompts` is the run's
/// prompt list: its order is the order of the per-prompt replayed τ rows and of the sums of the
/// macro τ; a prompt with records but no entry has no sequence length and so no replayed τ.
pub fn summarize(batch: &RecordBatch, prompts: &[PromptInfo]) -> Vec<MetricRow> {
    let metas: Vec<PromptMeta> = prompts.iter().map(PromptInfo::meta).collect();
    let stats = compute_stats(batch, &metas);
    let by_index: HashMap<u32, &PromptStats> = stats.prompts.iter().map(|p| (p.index, p)).collect();
    let listed: Vec<&PromptStats> = prompts
        .iter()
        .filter_map(|i| by_index.get(&i.index).copied())
        .collect();
    let mut out = Vec::new();
    replayed_rows(&listed, &mut out);
    uniform_rows(&stats, &mut out);
    // Loss-mask positions of every block, prompt region included: not a completion statistic, so
    // not in PromptStats (whose serialised form the web's cache and bundles carry).
    let (mut masked_ok, mut masked_n) = (0u64, 0u64);
    for b in 0..batch.num_blocks() {
        for k in 1..=batch.positions_per_block() {
            let i = batch.pos_index(b, k);
            if batch.loss_mask[i] == 1 {
                masked_n += 1;
                masked_ok += (batch.draft_top1(b, k) == batch.target[i]) as u64;
            }
        }
    }
    if masked_n > 0 {
        out.push(row(
            "acc_flat_masked",
            MetricScope::Run,
            masked_ok as f64 / masked_n as f64,
            masked_n,
            "fraction",
            "flat top-1 accuracy over loss-mask positions (what training logs as acc)",
            None,
        ));
    }
    out
}

/// The replayed-τ rows of prompts whose verify rounds are known without records (a serving
/// engine's trace, [`crate::trace`]): the rows [`summarize`] stores for the same rounds (per
/// prompt, run, category), over `listed` in its order.
pub fn summarize_rounds(listed: &[&PromptStats]) -> Vec<MetricRow> {
    let mut out = Vec::new();
    replayed_rows(listed, &mut out);
    out
}

/// Replayed τ per prompt, macro and pooled over the run, and per category, over `listed` in
/// its order.
fn replayed_rows(listed: &[&PromptStats], out: &mut Vec<MetricRow>) {
    for &p in listed {
        // Over one prompt, pooled τ (tokens / rounds, counting rounds) is the prompt's τ.
        out.extend(
            derived_row("tau_replayed_pooled", MetricScope::Prompt(p.index), &[p]).map(|r| {
                relabel(
                    r,
                    "tau_replayed",
                    "replayed τ of this prompt (bonus included)",
                )
            }),
        );
    }
    out.extend(derived_row("tau_replayed_macro", MetricScope::Run, listed));
    out.extend(derived_row("tau_replayed_pooled", MetricScope::Run, listed));
    let mut by_category: BTreeMap<&str, Vec<&PromptStats>> = BTreeMap::new();
    for &p in listed {
        if let Some(c) = &p.category {
            by_category.entry(c).or_default().push(p);
        }
    }
    for (c, ps) in by_category {
        let scope = MetricScope::Category(c.to_string());
        for (name, description) in [
            (
                "tau_replayed_macro",
                "replayed τ, macro over the category's prompts",
            ),
            (
                "tau_replayed_pooled",
                "replayed τ, pooled over the category's prompts",
            ),
        ] {
            out.extend(
                derived_row(name, scope.clone(), &ps).map(|r| relabel(r, name, description)),
            );
        }
    }
}

/// Uniform-anchor statistics over every completion block of the run: τ, streak, survival,
/// conditional acceptance, the accepted-length histogram, per-position and flat accuracy,
/// top-K accuracy, NLL, and τ per prompt.
fn uniform_rows(stats: &RunStats, out: &mut Vec<MetricRow>) {
    let evaluated: Vec<&PromptStats> = stats.evaluated().collect();
    if evaluated.is_empty() {
        return;
    }
    let p = stats.positions;
    let hist = stats.accept_hist();
    let blocks: u64 = hist.iter().sum();
    out.extend(derived_row("tau_uniform", MetricScope::Run, &evaluated));
    out.extend(derived_row("mean_streak", MetricScope::Run, &evaluated));
    // Survival P(A ≥ k) and conditional acceptance c_k = P(A ≥ k) / P(A ≥ k−1).
    let at_least: Vec<u64> = (0..=p).map(|a| hist[a..].iter().sum()).collect();
    let survival: Vec<f64> = (1..=p)
        .map(|k| at_least[k] as f64 / blocks as f64)
        .collect();
    let cond: Vec<Option<f64>> = (1..=p)
        .map(|k| (at_least[k - 1] > 0).then(|| at_least[k] as f64 / at_least[k - 1] as f64))
        .collect();
    out.push(row(
        "survival",
        MetricScope::Run,
        survival[0],
        blocks,
        "probability",
        "P(A ≥ k) per position k (value: k = 1)",
        Some(serde_json::json!(survival)),
    ));
    out.push(row(
        "cond_accept",
        MetricScope::Run,
        cond[0].unwrap_or(0.0),
        blocks,
        "probability",
        "P(d_k = t_k | all earlier accepted) per position k (value: k = 1)",
        Some(serde_json::json!(cond)),
    ));
    out.push(row(
        "accept_hist",
        MetricScope::Run,
        blocks as f64,
        blocks,
        "blocks",
        "histogram of accepted length A = 0..B−1 over completion anchors",
        Some(serde_json::json!(hist)),
    ));
    let valid = stats.position_totals(|p| &p.valid);
    let correct = stats.position_totals(|p| &p.correct);
    let acc: Vec<Option<f64>> = (0..p)
        .map(|k| (valid[k] > 0).then(|| correct[k] as f64 / valid[k] as f64))
        .collect();
    let n_valid: u64 = valid.iter().sum();
    let flat = correct.iter().sum::<u64>() as f64 / n_valid.max(1) as f64;
    out.push(row(
        "acc_top1",
        MetricScope::Run,
        flat,
        n_valid,
        "fraction",
        "top-1 accuracy per position k over completion anchors (value: flat over all valid positions)",
        Some(serde_json::json!(acc)),
    ));
    // The headline scalars (docs/metrics.md §5, §6): the values the UI's run list and
    // comparisons show.
    for name in [
        "first_position_acceptance",
        "flat_accuracy",
        "topk_accuracy",
        "draft_nll",
    ] {
        out.extend(derived_row(name, MetricScope::Run, &evaluated));
    }
    for &p in &evaluated {
        out.extend(
            derived_row("tau_uniform", MetricScope::Prompt(p.index), &[p]).map(|r| {
                relabel(
                    r,
                    "tau_uniform",
                    "mean(A+1) over this prompt's completion anchors",
                )
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prompt_stats::tests::scripted;

    #[test]
    fn every_run_level_name_is_stored_once_and_every_derived_metric_is_stored() {
        let infos = [PromptInfo {
            index: 0,
            prompt_len: 2,
            seq_len: 40,
            category: Some("code".into()),
        }];
        let rows = summarize(&scripted(40, &|a| (a as usize * 7) % 4), &infos);
        let mut names: Vec<&str> = rows
            .iter()
            .filter(|r| r.scope == MetricScope::Run)
            .map(|r| r.name.as_str())
            .collect();
        for d in DERIVED {
            let r = rows
                .iter()
                .find(|r| r.name == d.name && r.scope == MetricScope::Run)
                .unwrap_or_else(|| panic!("{} not stored", d.name));
            assert_eq!(
                (r.unit.as_str(), r.higher_is_better),
                (d.unit, d.higher_is_better)
            );
        }
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len(), "a native metric is stored twice: {names:?}");
        // Per prompt and per category, τ has its own name and description.
        let per_prompt: Vec<&str> = rows
            .iter()
            .filter(|r| r.scope == MetricScope::Prompt(0))
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(per_prompt, ["tau_replayed", "tau_uniform"]);
    }
}
