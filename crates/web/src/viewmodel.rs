//! View models built from a run's statistics: the headline numbers, the category table, the
//! prompt table and the per-position curves. Shared by the live pages (`server`) and the static
//! report (`report`).

use crate::analysis;
use crate::compare::RunCurves;
use crate::views;
use draftlens_results::metrics::{aggregate, derived, PromptStats, RunStats, SOURCE};
use draftlens_results::store::MetricKey;
use std::collections::HashMap;

/// The run list's default metric columns: replayed τ (macro), first-position acceptance and flat
/// accuracy (docs/ui.md §1). Runs stored before those names existed carry the same numbers as
/// the first value of `survival` and of `acc_top1`, which stand in when the database has no
/// run with the newer name. Only columns some run has are shown.
pub(crate) fn default_columns(keys: &[(MetricKey, usize, bool)]) -> Vec<MetricKey> {
    let mut out: Vec<MetricKey> = Vec::new();
    for names in [
        &["tau_replayed_macro"][..],
        &["first_position_acceptance", "survival"][..],
        &["flat_accuracy", "acc_top1"][..],
    ] {
        if let Some(k) = names
            .iter()
            .find_map(|n| keys.iter().find(|k| k.0.source == SOURCE && k.0.name == *n))
        {
            out.push(k.0.clone());
        }
    }
    out
}

pub(crate) fn curves_of(stats: &RunStats, seed: &str) -> RunCurves {
    RunCurves {
        accuracy: analysis::position_curve(stats, false, 400, seed),
        acceptance: analysis::position_curve(stats, true, 400, seed),
        hist_replayed: analysis::accept_histogram(stats, true),
        hist_uniform: analysis::accept_histogram(stats, false),
    }
}

pub(crate) fn cmp_opt(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    // Missing values last; otherwise ascending (worst first for ↑ metrics).
    match (a, b) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

pub(crate) fn headline_of(st: &RunStats) -> views::run::Headline {
    let all: Vec<&PromptStats> = st.evaluated().collect();
    let get = |name: &str| aggregate(derived(name), &all);
    views::run::Headline {
        tau_replayed: get("tau_replayed_macro"),
        tau_replayed_pooled: get("tau_replayed_pooled"),
        tau_uniform: get("tau_uniform"),
        flat_accuracy: get("flat_accuracy"),
        rounds: all.iter().map(|p| p.rounds.len() as u64).sum(),
        blocks: st.total_blocks(),
    }
}

pub(crate) fn categories_of(st: &RunStats) -> Vec<views::run::CategoryRow> {
    let mut by: std::collections::BTreeMap<String, Vec<&PromptStats>> = Default::default();
    for p in st.evaluated() {
        if let Some(c) = &p.category {
            by.entry(c.clone()).or_default().push(p);
        }
    }
    let get = |name: &str, ps: &[&PromptStats]| aggregate(derived(name), ps);
    by.into_iter()
        .map(|(name, ps)| views::run::CategoryRow {
            prompts: ps.len(),
            tau_replayed: get("tau_replayed_macro", &ps),
            tau_uniform: get("tau_uniform", &ps),
            flat_accuracy: get("flat_accuracy", &ps),
            name,
        })
        .collect()
}

pub(crate) fn prompt_rows(
    metas: &[draftlens_results::store::PromptMeta],
    stats: Option<&RunStats>,
) -> Vec<views::run::PromptRow> {
    let by: HashMap<u32, &PromptStats> = stats
        .map(|s| s.prompts.iter().map(|p| (p.index, p)).collect())
        .unwrap_or_default();
    metas
        .iter()
        .map(|m| {
            let ps = by.get(&m.index);
            views::run::PromptRow {
                index: m.index,
                id: m.id.clone(),
                category: m.category.clone(),
                tokens: m.num_tokens,
                prompt_len: m.prompt_len,
                blocks: ps.map(|p| p.blocks).unwrap_or(0),
                tau_replayed: ps.and_then(|p| p.replayed_tau()),
                tau_uniform: ps.and_then(|p| p.uniform_tau()),
                flat_accuracy: ps.and_then(|p| aggregate(derived("flat_accuracy"), &[p])),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_columns_prefer_headline_metrics() {
        let k = |s: &str, n: &str| (MetricKey::new(s, n), 1, true);
        let keys = vec![
            k("plugin", "zzz"),
            k(SOURCE, "flat_accuracy"),
            k(SOURCE, "acc_top1"),
            k(SOURCE, "tau_replayed_macro"),
            k(SOURCE, "survival"),
            k("p", "a"),
        ];
        let cols: Vec<String> = default_columns(&keys).into_iter().map(|c| c.name).collect();
        assert_eq!(cols, ["tau_replayed_macro", "survival", "flat_accuracy"]);
        assert!(default_columns(&[k("p", "a")]).is_empty());
    }
}
