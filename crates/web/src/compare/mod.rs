//! Comparison of runs against a baseline: every metric's value, Δ and Δ% over the prompts both
//! runs share (matched by prompt content hash), a paired bootstrap 95% CI, n and coverage,
//! direction-aware verdicts, the config diff, and the training-style vs deployment breakdown.
//!
//! Every metric is reduced to per-prompt (numerator, denominator) pairs so that one bootstrap
//! routine serves both conventions: a macro metric is (value, 1) per prompt, a pooled one is
//! (Σnum, Σden) per prompt, and the statistic on a resample is Σnum / Σden.
//!
//! This module holds the comparison itself (resolving runs, per-metric values, Δs, CIs and
//! verdicts); `config.rs` the config diff, `inflation.rs` the training-style vs deployment rows,
//! `history.rs` τ against checkpoint step, `text.rs` the terminal output, `trace_diff.rs` a
//! trace run against its reference drafter (`trace diff`).

mod config;
mod history;
mod inflation;
pub mod slices;
mod text;
pub mod trace_diff;
pub mod verdict;

pub use config::config_diff;
pub use history::{history, History, HistoryPoint, StepDelta};
use inflation::inflation_rows;
pub use text::{comparison_text, fmt_delta, fmt_value};

use crate::analysis::{accept_histogram, position_curve, Curve};
use crate::stats::{paired_interval, IntervalMethod, Resamples, Rng, MIN_SHARED_PROMPTS};
use anyhow::{bail, Context, Result};
use draftlens_results::metrics::{aggregate, Aggregation, PromptStats, RunStats, DERIVED, SOURCE};
use draftlens_results::store::{MetricKey, MetricScope, RunInfo, Store};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Bootstrap replicates for CIs.
pub const DEFAULT_REPS: usize = 1000;

#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// Baseline run id; default: the pinned baseline if it is among the runs, else the first run.
    pub baseline: Option<i64>,
    pub reps: usize,
    /// Compute per-position curves and histograms for charts.
    pub charts: bool,
}
impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            baseline: None,
            reps: DEFAULT_REPS,
            charts: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Better,
    Worse,
    NotSignificant,
    /// No CI could be computed (no per-prompt values, or fewer than 2 shared prompts).
    Unknown,
    /// Fewer than `MIN_SHARED_PROMPTS` shared prompts: an interval is shown but no verdict.
    TooFewPrompts,
    /// One run is train-style and the other deployment: the Δ measures the evaluation's
    /// inflation (docs/dflash.md §2.4), never a better or worse drafter.
    Inflation,
    /// The metric is a count (blocks, rounds, prompts), not a quality: never ranked.
    Count,
}

impl Verdict {
    /// What the comparison shows next to the Δ.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::NotSignificant => "not significant",
            Verdict::Unknown => "no CI",
            Verdict::TooFewPrompts => "too few prompts for a verdict",
            Verdict::Inflation => "train-style inflation, not a drafter difference",
            Verdict::Count => "a count, not ranked",
        }
    }
}

/// Units of metrics that count things rather than measure quality (never ranked with ↑/↓).
pub fn is_count_unit(unit: &str) -> bool {
    matches!(
        unit,
        "blocks" | "rounds" | "prompts" | "anchors" | "count" | "tokens counted"
    )
}

#[derive(Clone, Debug, Serialize)]
pub struct Delta {
    /// Paired point estimate over shared prompts (or the difference of run values when unpaired).
    pub delta: f64,
    pub delta_pct: Option<f64>,
    pub ci: Option<(f64, f64)>,
    /// How `ci` was computed (paired t below `MIN_SHARED_PROMPTS` prompts, else BCa).
    pub method: Option<IntervalMethod>,
    /// Prompts the paired estimate uses (0 when unpaired).
    pub n: usize,
    pub paired: bool,
    pub verdict: Verdict,
}

#[derive(Clone, Debug, Serialize)]
pub struct MetricCmp {
    pub key: MetricKey,
    pub unit: String,
    pub description: String,
    pub higher_is_better: bool,
    /// A count (blocks, rounds, …): shown without direction and never coloured.
    pub is_count: bool,
    /// "macro over prompts", "pooled over prompts" or "run value only".
    pub convention: String,
    /// Each run's own value (over all its prompts).
    pub values: Vec<Option<f64>>,
    /// Against the baseline; `None` for the baseline itself and for runs lacking the metric.
    pub deltas: Vec<Option<Delta>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Coverage {
    pub shared: usize,
    pub baseline_prompts: usize,
    pub prompts: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConfigRow {
    pub key: String,
    pub values: Vec<Option<String>>,
    pub differs: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunCurves {
    pub accuracy: Curve,
    pub acceptance: Curve,
    pub hist_replayed: Vec<f64>,
    pub hist_uniform: Vec<f64>,
}

/// One row of the training-style vs deployment breakdown.
#[derive(Clone, Debug, Serialize)]
pub struct InflationRow {
    pub run: usize,
    pub label: String,
    /// What changed from the previous row (the mechanism).
    pub mechanism: String,
    pub flat_accuracy: Option<f64>,
    pub tau_uniform: Option<f64>,
    pub tau_replayed: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub runs: Vec<RunInfo>,
    pub baseline: usize,
    /// Per run, against the baseline.
    pub coverage: Vec<Coverage>,
    pub metrics: Vec<MetricCmp>,
    pub config: Vec<ConfigRow>,
    /// Per run (None without records).
    pub curves: Vec<Option<RunCurves>>,
    pub inflation: Vec<InflationRow>,
    pub reps: usize,
    pub notes: Vec<String>,
    /// Drafter families side by side: τ, estimated and measured speed-up (docs/verdict.md).
    pub verdict: verdict::VerdictSection,
    /// The compared trace runs against their reference drafter (`trace diff`, docs/traces.md
    /// §6); left out of the JSON when no compared run has a stored diff.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace_diffs: Vec<trace_diff::TraceDiffSection>,
}

/// Per-prompt data of one metric of one run: sha → (num, den), plus the run value.
struct MetricData {
    value: Option<f64>,
    per_prompt: HashMap<String, (f64, f64)>,
    unit: String,
    description: String,
    higher_is_better: bool,
    aggregation: Option<Aggregation>,
}

/// What a run reference names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    Run(i64),
    /// A uid prefix that starts this many runs' uids.
    Ambiguous(usize),
    Missing,
}

/// Resolves "12" (id), a full uid or a unique uid prefix (≥ 6 hex characters).
pub fn resolve(store: &Store, s: &str) -> Result<Resolved> {
    let s = s.trim();
    if let Ok(id) = s.parse::<i64>() {
        if store.run(id)?.is_some() {
            return Ok(Resolved::Run(id));
        }
    }
    if let Some(id) = store.run_id_by_uid(s)? {
        return Ok(Resolved::Run(id));
    }
    if s.len() >= 6 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        let (hits, _) = store.runs(&draftlens_results::store::RunFilter {
            text: Some(s.into()),
            limit: 50,
            ..Default::default()
        })?;
        let hits: Vec<_> = hits
            .into_iter()
            .filter(|r| r.run.uid.starts_with(s))
            .collect();
        match hits.len() {
            0 => {}
            1 => return Ok(Resolved::Run(hits[0].run.id)),
            n => return Ok(Resolved::Ambiguous(n)),
        }
    }
    Ok(Resolved::Missing)
}

/// [`resolve`] as an error for the command line.
pub fn resolve_run(store: &Store, s: &str) -> Result<i64> {
    match resolve(store, s)? {
        Resolved::Run(id) => Ok(id),
        Resolved::Ambiguous(n) => bail!(
            "{}: run {s:?} is ambiguous (it starts {n} run uids; give more characters)",
            store.path().display()
        ),
        Resolved::Missing => bail!(
            "{}: no run {s:?} (give a run id, a uid or a uid prefix)",
            store.path().display()
        ),
    }
}

/// Loads runs and their statistics (from an in-memory cache when given).
pub type StatsCache<'a> = dyn Fn(&RunInfo) -> Result<Option<Arc<RunStats>>> + 'a;

pub fn compare(
    store: &Store,
    ids: &[i64],
    opts: &CompareOptions,
    stats_of: &StatsCache<'_>,
) -> Result<Comparison> {
    if ids.is_empty() {
        bail!("nothing to compare: give at least one run");
    }
    let mut runs = Vec::new();
    for &id in ids {
        let d = store
            .run(id)?
            .with_context(|| format!("{}: run {id} does not exist", store.path().display()))?;
        runs.push(d.run);
    }
    let baseline = match opts.baseline {
        Some(b) => ids
            .iter()
            .position(|&i| i == b)
            .with_context(|| format!("baseline run {b} is not among the compared runs"))?,
        None => {
            let pinned: Vec<i64> = store.baselines()?.into_iter().map(|(_, r)| r).collect();
            ids.iter().position(|i| pinned.contains(i)).unwrap_or(0)
        }
    };
    let stats: Vec<Option<Arc<RunStats>>> = runs.iter().map(stats_of).collect::<Result<_>>()?;
    let mut notes = Vec::new();

    // Prompt hashes of each run (from stored prompts, or from statistics of imported runs).
    let mut hashes: Vec<Vec<String>> = Vec::new();
    for (r, st) in runs.iter().zip(&stats) {
        let mut h: Vec<String> = store
            .prompt_metas(r.id)?
            .into_iter()
            .map(|p| p.sha256)
            .collect();
        if h.is_empty() {
            if let Some(st) = st {
                h = st.prompts.iter().map(|p| p.sha256.clone()).collect();
            }
        }
        h.retain(|s| !s.is_empty());
        hashes.push(h);
    }
    let coverage: Vec<Coverage> = hashes
        .iter()
        .map(|h| {
            let base: std::collections::HashSet<&String> = hashes[baseline].iter().collect();
            let shared = h
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .intersection(&base)
                .count();
            Coverage {
                shared,
                baseline_prompts: hashes[baseline].len(),
                prompts: h.len(),
            }
        })
        .collect();

    // ---- gather metric data per run
    let mut data: BTreeMap<MetricKey, Vec<Option<MetricData>>> = BTreeMap::new();
    for (ri, (r, st)) in runs.iter().zip(&stats).enumerate() {
        if let Some(st) = st {
            let all: Vec<&PromptStats> = st.evaluated().collect();
            for m in DERIVED {
                let mut per_prompt = HashMap::new();
                for p in &all {
                    if p.sha256.is_empty() {
                        continue;
                    }
                    if let Some((n, d)) = (m.per_prompt)(p) {
                        let nd = match m.aggregation {
                            Aggregation::Macro => (n / d, 1.0),
                            Aggregation::Pooled => (n, d),
                        };
                        per_prompt.entry(p.sha256.clone()).or_insert(nd);
                    }
                }
                let md = MetricData {
                    value: aggregate(m, &all),
                    per_prompt,
                    unit: m.unit.into(),
                    description: m.description.into(),
                    higher_is_better: m.higher_is_better,
                    aggregation: Some(m.aggregation),
                };
                data.entry(MetricKey::new(SOURCE, m.name))
                    .or_insert_with(|| (0..runs.len()).map(|_| None).collect())[ri] = Some(md);
            }
        }
        let rows = store.metrics(r.id)?;
        let metas = store.prompt_metas(r.id)?;
        let sha_of: HashMap<u32, &str> =
            metas.iter().map(|p| (p.index, p.sha256.as_str())).collect();
        let mut by_key: BTreeMap<
            MetricKey,
            (
                Option<&draftlens_results::store::MetricRow>,
                Vec<(String, f64, u64)>,
            ),
        > = BTreeMap::new();
        for m in &rows {
            let key = MetricKey::new(&m.source, &m.name);
            // Records-derived metrics are recomputed exactly from statistics when available.
            if st.is_some() && m.source == SOURCE && DERIVED.iter().any(|d| d.name == m.name) {
                continue;
            }
            if m.series.is_some() && m.source == SOURCE {
                continue; // the per-position charts show these
            }
            let e = by_key.entry(key).or_default();
            match &m.scope {
                MetricScope::Run => e.0 = Some(m),
                MetricScope::Prompt(i) => {
                    if let Some(sha) = sha_of.get(i).filter(|s| !s.is_empty()) {
                        if m.value.is_finite() {
                            e.1.push((sha.to_string(), m.value, m.count));
                        }
                    }
                }
                MetricScope::Category(_) => {}
            }
        }
        for (key, (run_row, prompts)) in by_key {
            let Some(run_row) = run_row else { continue };
            let value = run_row.value.is_finite().then_some(run_row.value);
            let (aggregation, per_prompt) = infer_aggregation(value, &prompts);
            let md = MetricData {
                value,
                per_prompt,
                unit: run_row.unit.clone(),
                description: run_row.description.clone(),
                higher_is_better: run_row.higher_is_better,
                aggregation,
            };
            data.entry(key)
                .or_insert_with(|| (0..runs.len()).map(|_| None).collect())[ri] = Some(md);
        }
    }

    // ---- deltas with paired bootstrap, one set of resamples per (baseline, run) pair
    let mut metrics = Vec::new();
    let mut pair_resamples: HashMap<usize, (Vec<String>, Resamples)> = HashMap::new();
    for j in 0..runs.len() {
        if j == baseline {
            continue;
        }
        let base: std::collections::HashSet<&String> = hashes[baseline].iter().collect();
        let mut shared: Vec<String> = hashes[j]
            .iter()
            .filter(|h| base.contains(h))
            .cloned()
            .collect();
        shared.sort();
        shared.dedup();
        let mut rng = Rng::from_str_seed(&format!("{}:{}", runs[baseline].uid, runs[j].uid));
        let rs = Resamples::new(shared.len(), opts.reps, &mut rng);
        pair_resamples.insert(j, (shared, rs));
    }
    for (key, per_run) in data {
        let Some(first) = per_run.iter().flatten().next() else {
            continue;
        };
        let convention = match first.aggregation {
            Some(Aggregation::Macro) => "macro over prompts",
            Some(Aggregation::Pooled) => "pooled over prompts",
            None => "run value only",
        }
        .to_string();
        let (unit, description, hib) = (
            first.unit.clone(),
            first.description.clone(),
            first.higher_is_better,
        );
        let values: Vec<Option<f64>> = per_run
            .iter()
            .map(|m| m.as_ref().and_then(|m| m.value))
            .collect();
        let mut deltas = Vec::new();
        for j in 0..runs.len() {
            if j == baseline {
                deltas.push(None);
                continue;
            }
            let (Some(a), Some(b)) = (&per_run[baseline], &per_run[j]) else {
                deltas.push(None);
                continue;
            };
            let mut d = delta(a, b, &pair_resamples[&j], hib);
            if let Some(d) = d.as_mut() {
                if is_count_unit(&unit) {
                    d.verdict = Verdict::Count;
                } else if runs[j].mode != runs[baseline].mode {
                    d.verdict = Verdict::Inflation;
                }
            }
            deltas.push(d);
        }
        metrics.push(MetricCmp {
            is_count: is_count_unit(&unit),
            key,
            unit,
            description,
            higher_is_better: hib,
            convention,
            values,
            deltas,
        });
    }
    // Records-derived first (the headline numbers), then plugin metrics alphabetically.
    metrics.sort_by_key(|m| {
        let pos = DERIVED
            .iter()
            .position(|d| m.key.source == SOURCE && d.name == m.key.name)
            .unwrap_or(usize::MAX);
        (pos, m.key.clone())
    });

    if stats.iter().any(|s| s.is_none()) {
        notes.push("runs without stored records have no records-derived metrics or charts".into());
    }
    for (j, c) in coverage.iter().enumerate() {
        if j == baseline {
            continue;
        }
        if c.shared == 0 {
            notes.push(format!(
                "run #{} shares no prompt with the baseline: no Δ is shown (compare runs of the same prompt set)",
                runs[j].id
            ));
        } else if c.shared < MIN_SHARED_PROMPTS {
            notes.push(format!(
                "too few prompts: run #{} shares {} prompts with the baseline (fewer than {MIN_SHARED_PROMPTS}), so its Δs get a paired t-interval and no verdict colour",
                runs[j].id, c.shared
            ));
        }
        if runs[j].mode != runs[baseline].mode {
            notes.push(format!(
                "run #{} is {} and the baseline {}: their Δs measure the train-style evaluation's inflation, not a better or worse drafter",
                runs[j].id, runs[j].mode, runs[baseline].mode
            ));
        }
        if c.shared > 0 && c.shared < c.prompts.max(c.baseline_prompts) {
            notes.push(format!(
                "run #{} shares {}/{} prompts with the baseline: Δ and CIs use the shared prompts only",
                runs[j].id,
                c.shared,
                c.prompts.max(c.baseline_prompts)
            ));
        }
    }

    let curves = if opts.charts {
        stats
            .iter()
            .zip(&runs)
            .map(|(s, r)| {
                s.as_ref().map(|s| RunCurves {
                    accuracy: position_curve(s, false, opts.reps.min(400), &r.uid),
                    acceptance: position_curve(s, true, opts.reps.min(400), &r.uid),
                    hist_replayed: accept_histogram(s, true),
                    hist_uniform: accept_histogram(s, false),
                })
            })
            .collect()
    } else {
        runs.iter().map(|_| None).collect()
    };
    let inflation = inflation_rows(&runs, &stats);
    let verdict = verdict::of_runs(store, &runs, &stats, baseline, opts.reps)?;
    let trace_diffs = trace_diff::of_runs(store, &runs)?;
    Ok(Comparison {
        verdict,
        trace_diffs,
        config: config_diff(&runs),
        runs,
        baseline,
        coverage,
        metrics,
        curves,
        inflation,
        reps: opts.reps,
        notes,
    })
}

/// Which convention reproduces the run value from the per-prompt rows: macro (plain mean) or
/// pooled (count-weighted). Neither → no paired CI (the per-prompt values are something else).
fn infer_aggregation(
    value: Option<f64>,
    prompts: &[(String, f64, u64)],
) -> (Option<Aggregation>, HashMap<String, (f64, f64)>) {
    let Some(v) = value else {
        return (None, HashMap::new());
    };
    if prompts.is_empty() {
        return (None, HashMap::new());
    }
    let close = |x: f64| (x - v).abs() <= 1e-6 * v.abs().max(1.0);
    let macro_mean = prompts.iter().map(|p| p.1).sum::<f64>() / prompts.len() as f64;
    let wsum: f64 = prompts.iter().map(|p| p.2 as f64).sum();
    let pooled = prompts.iter().map(|p| p.1 * p.2 as f64).sum::<f64>() / wsum;
    if close(macro_mean) {
        (
            Some(Aggregation::Macro),
            prompts.iter().map(|p| (p.0.clone(), (p.1, 1.0))).collect(),
        )
    } else if wsum > 0.0 && close(pooled) {
        (
            Some(Aggregation::Pooled),
            prompts
                .iter()
                .map(|p| (p.0.clone(), (p.1 * p.2 as f64, p.2 as f64)))
                .collect(),
        )
    } else {
        (None, HashMap::new())
    }
}

fn delta(
    a: &MetricData,
    b: &MetricData,
    pair: &(Vec<String>, Resamples),
    higher_is_better: bool,
) -> Option<Delta> {
    let (shared, rs) = pair;
    // Nothing shared: a difference of run values over different prompts is not a Δ.
    if shared.is_empty() {
        return None;
    }
    let paired =
        a.aggregation.is_some() && b.aggregation.is_some() && a.aggregation == b.aggregation;
    if paired {
        let get = |m: &MetricData| -> (Vec<f64>, Vec<f64>) {
            shared
                .iter()
                .map(|h| m.per_prompt.get(h).copied().unwrap_or((0.0, 0.0)))
                .unzip()
        };
        let (na, da) = get(a);
        let (nb, db) = get(b);
        let n = da
            .iter()
            .zip(&db)
            .filter(|(x, y)| **x > 0.0 && **y > 0.0)
            .count();
        let (sa, sb) = (da.iter().sum::<f64>(), db.iter().sum::<f64>());
        if sa > 0.0 && sb > 0.0 && n > 0 {
            let va = na.iter().sum::<f64>() / sa;
            let vb = nb.iter().sum::<f64>() / sb;
            let d = vb - va;
            let iv = if n >= 2 {
                paired_interval(rs, &na, &da, &nb, &db)
            } else {
                None
            };
            let ci = iv.map(|i| (i.lo, i.hi));
            let v = paired_verdict(ci, n, higher_is_better);
            return Some(Delta {
                delta: d,
                delta_pct: (va != 0.0).then(|| 100.0 * d / va.abs()),
                ci,
                method: iv.map(|i| i.method),
                n,
                paired: true,
                verdict: v,
            });
        }
    }
    let (va, vb) = (a.value?, b.value?);
    let d = vb - va;
    Some(Delta {
        delta: d,
        delta_pct: (va != 0.0).then(|| 100.0 * d / va.abs()),
        ci: None,
        method: None,
        n: 0,
        paired: false,
        verdict: Verdict::Unknown,
    })
}

/// The verdict of a paired Δ over `n` shared prompts: none below [`MIN_SHARED_PROMPTS`] (a CI,
/// if any, is then a paired t-interval, too weak for a verdict), else [`verdict`].
fn paired_verdict(ci: Option<(f64, f64)>, n: usize, higher_is_better: bool) -> Verdict {
    match (n < MIN_SHARED_PROMPTS, ci) {
        (true, Some(_)) => Verdict::TooFewPrompts,
        (true, None) => Verdict::Unknown,
        (false, _) => verdict(ci, higher_is_better),
    }
}

fn verdict(ci: Option<(f64, f64)>, higher_is_better: bool) -> Verdict {
    match ci {
        None => Verdict::Unknown,
        Some((lo, _)) if lo > 0.0 => {
            if higher_is_better {
                Verdict::Better
            } else {
                Verdict::Worse
            }
        }
        Some((_, hi)) if hi < 0.0 => {
            if higher_is_better {
                Verdict::Worse
            } else {
                Verdict::Better
            }
        }
        _ => Verdict::NotSignificant,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregation_is_inferred_from_the_run_value() {
        let p = vec![("a".to_string(), 1.0, 1u64), ("b".to_string(), 3.0, 3u64)];
        assert_eq!(infer_aggregation(Some(2.0), &p).0, Some(Aggregation::Macro));
        assert_eq!(
            infer_aggregation(Some(2.5), &p).0,
            Some(Aggregation::Pooled)
        );
        assert_eq!(infer_aggregation(Some(9.0), &p).0, None);
        assert_eq!(infer_aggregation(None, &p).0, None);
    }

    #[test]
    fn verdict_respects_direction() {
        assert_eq!(verdict(Some((0.1, 0.2)), true), Verdict::Better);
        assert_eq!(verdict(Some((0.1, 0.2)), false), Verdict::Worse);
        assert_eq!(verdict(Some((-0.2, -0.1)), false), Verdict::Better);
        assert_eq!(verdict(Some((-0.1, 0.2)), true), Verdict::NotSignificant);
        assert_eq!(verdict(None, true), Verdict::Unknown);
    }

    #[test]
    fn no_verdict_below_the_minimum_of_shared_prompts() {
        let (few, enough) = (MIN_SHARED_PROMPTS - 1, MIN_SHARED_PROMPTS);
        let ci = Some((0.1, 0.2));
        assert_eq!(paired_verdict(ci, few, true), Verdict::TooFewPrompts);
        assert_eq!(paired_verdict(None, few, true), Verdict::Unknown);
        assert_eq!(paired_verdict(ci, enough, true), Verdict::Better);
        assert_eq!(paired_verdict(ci, enough, false), Verdict::Worse);
        assert_eq!(paired_verdict(None, enough, true), Verdict::Unknown);
    }
}
