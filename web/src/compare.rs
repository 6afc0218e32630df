//! Comparison of runs against a baseline: every metric's value, Δ and Δ% over the prompts both
//! runs share (matched by prompt content hash), a paired bootstrap 95% CI, n and coverage,
//! direction-aware verdicts, the config diff, and the training-style vs deployment breakdown.
//!
//! Every metric is reduced to per-prompt (numerator, denominator) pairs so that one bootstrap
//! routine serves both conventions: a macro metric is (value, 1) per prompt, a pooled one is
//! (Σnum, Σden) per prompt, and the statistic on a resample is Σnum / Σden.

use crate::analysis::{
    self, accept_histogram, position_curve, Aggregation, Curve, RunStats, DERIVED, SOURCE,
};
use crate::stats::{paired_interval, IntervalMethod, Resamples, Rng, MIN_SHARED_PROMPTS};
use anyhow::{bail, Context, Result};
use draftlens::store::{MetricKey, MetricScope, RunInfo, RunMode, Store};
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
        let (hits, _) = store.runs(&draftlens::store::RunFilter {
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
            let all: Vec<&analysis::PromptStats> = st.evaluated().collect();
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
                    value: analysis::aggregate(m, &all),
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
                Option<&draftlens::store::MetricRow>,
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
    Ok(Comparison {
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
            let v = if n < MIN_SHARED_PROMPTS {
                if ci.is_some() {
                    Verdict::TooFewPrompts
                } else {
                    Verdict::Unknown
                }
            } else {
                verdict(ci, higher_is_better)
            };
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

/// Identity fields and the flattened config, per run; rows that differ first.
pub fn config_diff(runs: &[RunInfo]) -> Vec<ConfigRow> {
    let mut keys: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        let mut flat: Vec<(String, String)> = vec![
            ("mode".into(), r.mode.to_string()),
            ("target.arch".into(), r.target_arch.clone()),
            ("target.path".into(), r.target_path.clone()),
            ("target.sha256".into(), short(&r.target_sha256)),
            ("drafter.series".into(), r.drafter_series.clone()),
            (
                "drafter.step".into(),
                r.drafter_step.map(|s| s.to_string()).unwrap_or_default(),
            ),
            ("drafter.path".into(), r.drafter_path.clone()),
            ("drafter.sha256".into(), short(&r.drafter_sha256)),
            ("prompt_set.name".into(), r.prompt_set_name.clone()),
            ("prompt_set.sha256".into(), short(&r.prompt_set_sha256)),
            ("backend".into(), r.backend.clone()),
            ("dtype".into(), r.dtype.clone()),
            ("block_size".into(), r.block_size.to_string()),
            ("top_k".into(), r.top_k.to_string()),
        ];
        if let Some(t) = &r.train_style {
            flat.push(("train_style.labels".into(), t.labels.clone()));
            flat.push(("train_style.mask_rule".into(), t.mask_rule.clone()));
        }
        flatten_json("config", &r.config, &mut flat);
        for (k, v) in flat {
            keys.entry(k).or_insert_with(|| vec![None; runs.len()])[i] = Some(v);
        }
    }
    let mut rows: Vec<ConfigRow> = keys
        .into_iter()
        .map(|(key, values)| {
            let differs = values.iter().any(|v| v != &values[0]);
            ConfigRow {
                key,
                values,
                differs,
            }
        })
        .collect();
    rows.sort_by_key(|r| !r.differs);
    rows
}

fn short(s: &str) -> String {
    s.chars().take(12).collect()
}

fn flatten_json(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                flatten_json(&format!("{prefix}.{k}"), x, out);
            }
        }
        serde_json::Value::String(s) => out.push((prefix.into(), s.clone())),
        other => out.push((prefix.into(), other.to_string())),
    }
}

/// Deployment runs first, then train-style runs ordered by how many mechanisms they turn on
/// (mask strict → inclusive, labels target → data). Each row says what changed.
fn inflation_rows(runs: &[RunInfo], stats: &[Option<Arc<RunStats>>]) -> Vec<InflationRow> {
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
        analysis::aggregate(analysis::derived(name), &st.evaluated().collect::<Vec<_>>())
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

// ---------------------------------------------------------------------------------------------
// τ against checkpoint step
// ---------------------------------------------------------------------------------------------

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
    let tau_r = analysis::derived("tau_replayed_macro");
    let tau_u = analysis::derived("tau_uniform");
    let flat = analysis::derived("flat_accuracy");
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
        let evaluated: Vec<&analysis::PromptStats> = st.evaluated().collect();
        let mut rng = Rng::from_str_seed(&r.uid);
        let rs = Resamples::new(evaluated.len(), 500, &mut rng);
        // CI of the metric's own statistic: per-prompt (numerator, denominator) pairs, so a
        // macro metric's CI is over per-prompt means and a pooled one's over Σ/Σ.
        let ci_of = |m: &analysis::DerivedMetric| -> Option<(f64, f64)> {
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
            tau_replayed: analysis::aggregate(tau_r, &evaluated),
            tau_replayed_ci: ci_of(tau_r),
            tau_uniform: analysis::aggregate(tau_u, &evaluated),
            tau_uniform_ci: ci_of(tau_u),
            flat_accuracy: analysis::aggregate(flat, &evaluated),
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
        let verdict = if shared.len() < MIN_SHARED_PROMPTS {
            if ci.is_some() {
                Verdict::TooFewPrompts
            } else {
                Verdict::Unknown
            }
        } else {
            verdict(ci, true)
        };
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

// ---------------------------------------------------------------------------------------------
// Terminal and JSON output
// ---------------------------------------------------------------------------------------------

pub fn fmt_value(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(x) if x.is_nan() => "—".into(),
        Some(x) if x.abs() >= 1000.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.2}"),
        Some(x) => format!("{x:.3}"),
    }
}

pub fn fmt_delta(d: f64) -> String {
    if d.abs() >= 10.0 {
        format!("{d:+.2}")
    } else {
        format!("{d:+.3}")
    }
}

/// The comparison as a plain-text table (for `draftlens compare`).
pub fn comparison_text(c: &Comparison) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let b = &c.runs[c.baseline];
    let _ = writeln!(s, "baseline: #{} {} ({})", b.id, b.name, &b.uid);
    for (j, r) in c.runs.iter().enumerate() {
        if j != c.baseline {
            let cv = &c.coverage[j];
            let _ = writeln!(
                s,
                "run #{}: {} ({}) · {}/{} prompts shared with the baseline",
                r.id,
                r.name,
                &r.uid,
                cv.shared,
                cv.prompts.max(cv.baseline_prompts)
            );
        }
    }
    let _ = writeln!(s);
    let mut header = vec!["metric".to_string()];
    for (j, r) in c.runs.iter().enumerate() {
        header.push(if j == c.baseline {
            format!("#{} (base)", r.id)
        } else {
            format!("#{}", r.id)
        });
        if j != c.baseline {
            header.push("Δ".into());
            header.push("Δ%".into());
            header.push("95% CI".into());
            header.push("n".into());
            header.push("verdict".into());
        }
    }
    let mut rows = vec![header];
    for m in &c.metrics {
        let mut row = vec![format!(
            "{} {}",
            m.key,
            if m.is_count {
                "(count)"
            } else if m.higher_is_better {
                "↑"
            } else {
                "↓"
            }
        )];
        for j in 0..c.runs.len() {
            row.push(fmt_value(m.values[j]));
            if j == c.baseline {
                continue;
            }
            match &m.deltas[j] {
                None => row.extend(["—".into(), "—".into(), "—".into(), "—".into(), "—".into()]),
                Some(d) => {
                    row.push(fmt_delta(d.delta));
                    row.push(
                        d.delta_pct
                            .map(|p| format!("{p:+.1}%"))
                            .unwrap_or("—".into()),
                    );
                    row.push(
                        d.ci.map(|(lo, hi)| format!("[{}, {}]", fmt_delta(lo), fmt_delta(hi)))
                            .unwrap_or("—".into()),
                    );
                    row.push(if d.paired {
                        d.n.to_string()
                    } else {
                        "unpaired".into()
                    });
                    row.push(d.verdict.label().into());
                }
            }
        }
        rows.push(row);
    }
    s.push_str(&table(&rows));
    let diff: Vec<&ConfigRow> = c.config.iter().filter(|r| r.differs).collect();
    if !diff.is_empty() && c.runs.len() > 1 {
        let _ = writeln!(s, "\nconfig (differing keys only):");
        let mut rows = vec![std::iter::once("key".to_string())
            .chain(c.runs.iter().map(|r| format!("#{}", r.id)))
            .collect::<Vec<_>>()];
        for r in diff {
            rows.push(
                std::iter::once(r.key.clone())
                    .chain(r.values.iter().map(|v| v.clone().unwrap_or("—".into())))
                    .collect(),
            );
        }
        s.push_str(&table(&rows));
    }
    if !c.inflation.is_empty() {
        let _ = writeln!(s, "\ntraining-style vs deployment (by mechanism):");
        let mut rows = vec![vec![
            "run".into(),
            "evaluation".into(),
            "flat acc".into(),
            "τ uniform".into(),
            "τ replayed".into(),
            "what changed".into(),
        ]];
        for r in &c.inflation {
            rows.push(vec![
                format!("#{}", c.runs[r.run].id),
                r.label.clone(),
                fmt_value(r.flat_accuracy),
                fmt_value(r.tau_uniform),
                fmt_value(r.tau_replayed),
                r.mechanism.clone(),
            ]);
        }
        s.push_str(&table(&rows));
    }
    for n in &c.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let _ = writeln!(
        s,
        "\nΔ = run − baseline over shared prompts (matched by prompt sha256); 95% CI over prompts: BCa bootstrap ({} replicates) from {MIN_SHARED_PROMPTS} shared prompts on, paired t-interval below (no verdict then).",
        c.reps
    );
    s
}

fn table(rows: &[Vec<String>]) -> String {
    let ncol = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut w = vec![0; ncol];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c}{}", " ".repeat(w[i] - c.chars().count())))
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
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
    fn config_diff_puts_differences_first() {
        let mut a = RunInfo {
            id: 1,
            uid: "u1".into(),
            name: "a".into(),
            mode: RunMode::Deployment,
            status: draftlens::store::RunStatus::Complete,
            error: None,
            created_at: String::new(),
            finished_at: None,
            timings: serde_json::json!({}),
            config: serde_json::json!({"drafter": {"layers": 5, "k": [1, 2]}, "seed": 1}),
            target_path: "t".into(),
            target_sha256: String::new(),
            target_arch: "qwen3".into(),
            drafter_path: String::new(),
            drafter_sha256: String::new(),
            drafter_series: String::new(),
            drafter_step: Some(1),
            prompt_set_name: String::new(),
            prompt_set_sha256: String::new(),
            backend: "cpu".into(),
            dtype: "f32".into(),
            block_size: 16,
            top_k: 8,
            train_style: None,
            tokenizer_sha256: None,
            origin: "local".into(),
            num_prompts: 0,
            num_blocks: 0,
        };
        let mut b = a.clone();
        b.config =
            serde_json::json!({"drafter": {"layers": 3, "k": [1, 2]}, "seed": 1, "extra": "x"});
        b.drafter_step = Some(2);
        a.id = 1;
        let rows = config_diff(&[a, b]);
        let differing: Vec<&str> = rows
            .iter()
            .filter(|r| r.differs)
            .map(|r| r.key.as_str())
            .collect();
        assert_eq!(
            differing,
            ["config.drafter.layers", "config.extra", "drafter.step"]
        );
        assert!(rows.iter().take(3).all(|r| r.differs));
        let k = rows.iter().find(|r| r.key == "config.drafter.k").unwrap();
        assert_eq!(k.values[0].as_deref(), Some("[1,2]"));
    }
}
