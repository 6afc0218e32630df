//! The training-style vs deployment breakdown of a comparison: one row per run, ordered by how
//! many evaluation mechanisms it turns on, saying what changed from the row above.

use super::InflationRow;
use draftlens_results::metrics::{aggregate, derived, RunStats};
use draftlens_results::store::{RunInfo, RunMode};
use std::sync::Arc;

/// Deployment runs first, then train-style runs ordered by how many mechanisms they turn on
/// (mask strict → inclusive, labels target → data). Each row says what changed.
pub(super) fn inflation_rows(
    runs: &[RunInfo],
    stats: &[Option<Arc<RunStats>>],
) -> Vec<InflationRow> {
    let has_dep = runs.iter().any(|r| r.mode == RunMode::Deployment);
    let has_ts = runs.iter().any(|r| r.mode == RunMode::TrainStyle);
    if !(has_dep && has_ts) {
        return Vec::new();
    }
    let rank = |r: &RunInfo| match &r.train_style {
        None => (0, 0, 0),
        Some(t) => (
            1,
            (t.mask_rule == "inclusive") as u8,
            (t.labels == "data") as u8,
        ),
    };
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| (rank(&runs[i]), i));
    let get = |i: usize, name: &str| -> Option<f64> {
        let st = stats[i].as_ref()?;
        aggregate(derived(name), &st.evaluated().collect::<Vec<_>>())
    };
    let mut rows = Vec::new();
    let mut prev: Option<usize> = None;
    for i in order {
        let r = &runs[i];
        let label = match &r.train_style {
            None => "deployment (isolated per-anchor)".to_string(),
            Some(t) => format!("train-style · mask {} · labels {}", t.mask_rule, t.labels),
        };
        let mechanism = match prev.map(|p| &runs[p]) {
            None => "reference: what a real greedy decode sees".to_string(),
            Some(p) => {
                let mut what = Vec::new();
                if p.drafter_sha256 != r.drafter_sha256 {
                    what.push("a different drafter checkpoint (not an evaluation mechanism)");
                }
                if p.mode != r.mode {
                    what.push("shared forward over all anchors with the training block mask, uniform anchors (mechanisms 2, 7)");
                }
                let (pm, pl) = p
                    .train_style
                    .as_ref()
                    .map(|t| (t.mask_rule.as_str(), t.labels.as_str()))
                    .unwrap_or(("strict", "target"));
                if let Some(t) = &r.train_style {
                    if t.mask_rule != pm && t.mask_rule == "inclusive" {
                        what.push("context ≤ anchor: the anchor's own tap leaks the next token (mechanism 1)");
                    }
                    if t.labels != pl && t.labels == "data" {
                        what.push("labels from data tokens instead of the target's greedy tokens (mechanism 3)");
                    }
                }
                if what.is_empty() {
                    "same settings as the row above".to_string()
                } else {
                    what.join("; ")
                }
            }
        };
        rows.push(InflationRow {
            run: i,
            label,
            mechanism,
            flat_accuracy: get(i, "flat_accuracy"),
            tau_uniform: get(i, "tau_uniform"),
            tau_replayed: get(i, "tau_replayed_macro"),
        });
        prev = Some(i);
    }
    rows
}
