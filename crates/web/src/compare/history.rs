//! τ against checkpoint step: one point per checkpoint run of a drafter series, with bootstrap
//! CIs over prompts and the paired Δ of replayed τ against the previous step.

use super::{paired_verdict, StatsCache, Verdict};
use crate::stats::{paired_interval, IntervalMethod, Resamples, Rng};
use anyhow::{bail, Result};
use draftlens_results::metrics::{aggregate, derived, Aggregation, DerivedMetric, PromptStats};
use draftlens_results::store::{RunMode, Store};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Debug, Serialize)]
pub struct HistoryPoint {
    pub run: i64,
    pub name: String,
    pub step: i64,
    pub status: String,
    pub tau_replayed: Option<f64>,
    pub tau_replayed_ci: Option<(f64, f64)>,
    pub tau_uniform: Option<f64>,
    pub tau_uniform_ci: Option<(f64, f64)>,
    pub flat_accuracy: Option<f64>,
    /// Paired Δ of the macro replayed τ against the previous step, over shared prompts.
    pub step_delta: Option<StepDelta>,
}

/// A paired Δ between two consecutive checkpoints.
#[derive(Clone, Debug, Serialize)]
pub struct StepDelta {
    pub delta: f64,
    pub ci: Option<(f64, f64)>,
    pub method: Option<IntervalMethod>,
    /// Shared prompts.
    pub n: usize,
    pub verdict: Verdict,
}

#[derive(Clone, Debug, Serialize)]
pub struct History {
    pub series: String,
    pub mode: RunMode,
    pub prompt_set: String,
    pub points: Vec<HistoryPoint>,
    /// Runs of the series left out (other mode or prompt set, no step, no records).
    pub left_out: usize,
}

/// One point per checkpoint run of a drafter series (same mode and prompt set), with bootstrap
/// CIs over prompts, and the paired Δ of replayed τ against the previous step.
pub fn history(
    store: &Store,
    series: &str,
    mode: RunMode,
    prompt_set: Option<&str>,
    stats_of: &StatsCache<'_>,
) -> Result<History> {
    let runs = store.series_runs(series)?;
    if runs.is_empty() {
        bail!(
            "{}: no runs in drafter series {series:?}",
            store.path().display()
        );
    }
    // Default prompt set: the one most runs of this mode used.
    let ps = match prompt_set {
        Some(p) => p.to_string(),
        None => {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for r in runs.iter().filter(|r| r.mode == mode) {
                *counts.entry(&r.prompt_set_sha256).or_default() += 1;
            }
            counts
                .into_iter()
                .max_by_key(|(_, c)| *c)
                .map(|(p, _)| p.to_string())
                .unwrap_or_default()
        }
    };
    let mut points = Vec::new();
    // Per point: prompt sha → replayed τ (for the paired step-to-step Δs).
    let mut shas: Vec<HashMap<String, f64>> = Vec::new();
    let mut left_out = 0;
    let tau_r = derived("tau_replayed_macro");
    let tau_u = derived("tau_uniform");
    let flat = derived("flat_accuracy");
    let mut ps_name = String::new();
    for r in &runs {
        let Some(step) = r.drafter_step else {
            left_out += 1;
            continue;
        };
        if r.mode != mode || (r.prompt_set_sha256 != ps && r.prompt_set_name != ps) {
            left_out += 1;
            continue;
        }
        let Some(st) = stats_of(r)? else {
            left_out += 1;
            continue;
        };
        ps_name = r.prompt_set_name.clone();
        let evaluated: Vec<&PromptStats> = st.evaluated().collect();
        let mut rng = Rng::from_str_seed(&r.uid);
        let rs = Resamples::new(evaluated.len(), 500, &mut rng);
        // CI of the metric's own statistic: per-prompt (numerator, denominator) pairs, so a
        // macro metric's CI is over per-prompt means and a pooled one's over Σ/Σ.
        let ci_of = |m: &DerivedMetric| -> Option<(f64, f64)> {
            let (num, den): (Vec<f64>, Vec<f64>) = evaluated
                .iter()
                .map(|p| match ((m.per_prompt)(p), m.aggregation) {
                    (Some((n, d)), Aggregation::Macro) => (n / d, 1.0),
                    (Some(nd), Aggregation::Pooled) => nd,
                    (None, _) => (0.0, 0.0),
                })
                .unzip();
            rs.ratio_ci(&num, &den)
        };
        shas.push(
            evaluated
                .iter()
                .filter_map(|p| {
                    (tau_r.per_prompt)(p)
                        .filter(|_| !p.sha256.is_empty())
                        .map(|(n, d)| (p.sha256.clone(), n / d))
                })
                .collect(),
        );
        points.push(HistoryPoint {
            run: r.id,
            name: r.name.clone(),
            step,
            status: r.status.to_string(),
            tau_replayed: aggregate(tau_r, &evaluated),
            tau_replayed_ci: ci_of(tau_r),
            tau_uniform: aggregate(tau_u, &evaluated),
            tau_uniform_ci: ci_of(tau_u),
            flat_accuracy: aggregate(flat, &evaluated),
            step_delta: None,
        });
    }
    // Paired Δ of the macro replayed τ between consecutive steps, over the prompts both share.
    for i in 1..points.len() {
        let (a, b) = (&shas[i - 1], &shas[i]);
        let shared: Vec<(f64, f64)> = a
            .iter()
            .filter_map(|(h, va)| b.get(h).map(|vb| (*va, *vb)))
            .collect();
        if shared.is_empty() {
            continue;
        }
        let (va, vb): (Vec<f64>, Vec<f64>) = shared.iter().copied().unzip();
        let ones = vec![1.0; shared.len()];
        let mut rng = Rng::from_str_seed(&format!("{}:{}", points[i - 1].run, points[i].run));
        let rs = Resamples::new(shared.len(), 1000, &mut rng);
        let iv = paired_interval(&rs, &va, &ones, &vb, &ones);
        let delta = crate::stats::mean(&vb) - crate::stats::mean(&va);
        let ci = iv.map(|i| (i.lo, i.hi));
        let verdict = paired_verdict(ci, shared.len(), true);
        points[i].step_delta = Some(StepDelta {
            delta,
            ci,
            method: iv.map(|i| i.method),
            n: shared.len(),
            verdict,
        });
    }
    Ok(History {
        series: series.into(),
        mode,
        prompt_set: if ps_name.is_empty() { ps } else { ps_name },
        points,
        left_out,
    })
}
