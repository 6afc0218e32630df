//! Scoring a stored run: its records go through the plugins (grouped per prompt and per
//! category), each plugin's values are stored as metric rows under the plugin's name, and each
//! failed plugin is recorded with the run. Used by `draftlens run --plugin` after the evaluation
//! and by `draftlens rescore`.
//!
//! Storage rules: one transaction per plugin, replacing the rows an earlier scoring by a plugin
//! of the same name left ([`Store::replace_metrics`]), so re-scoring never duplicates rows and a
//! plugin's rows are never half written. A failed plugin writes no rows: its earlier rows (from a
//! version that worked) stay, and the failure is recorded next to them.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context};
use draftlens::store::{MetricRow, MetricScope, Store};
use serde::Serialize;

use crate::failure::{FailureKind, PluginFailure};
use crate::score::{score_batch_with, Grouping, PluginOutcome, PluginRequest, Scores};
use crate::types::{Metadata, MetricResult};
use crate::Runtime;

/// Metric sources draftlens writes itself (the native metrics of `run`, and what the web UI
/// derives from records). A plugin calling itself one of these is refused: storing its rows
/// would replace draftlens' own.
pub const RESERVED_SOURCES: &[&str] = &["native", "records"];

/// What scoring a stored run did with one plugin.
#[derive(Clone, Debug, Serialize)]
pub struct StoredOutcome {
    /// The metric source its rows are stored under: the plugin's own name, or the file stem
    /// when it failed before saying its name.
    pub plugin: String,
    /// The plugin's outcome (scores, failure, logs, timings).
    #[serde(skip)]
    pub outcome: PluginOutcome,
    /// Set when the plugin failed (also recorded with the run).
    pub failure: Option<PluginFailure>,
    /// Its run-scope rows, as stored.
    pub metrics: Vec<MetricRow>,
    /// Rows stored over every scope (run, prompts, categories).
    pub rows: usize,
    /// Rows of an earlier scoring by a plugin of this name that these replaced.
    pub replaced: usize,
}

impl StoredOutcome {
    pub fn is_ok(&self) -> bool {
        self.failure.is_none()
    }
}

/// The result of [`score_stored_run`].
#[derive(Clone, Debug, Serialize)]
pub struct StoredScoring {
    pub run: i64,
    pub blocks: usize,
    /// Prompts with records (each scored on its own too).
    pub prompts: usize,
    /// Categories scored on their own.
    pub categories: Vec<String>,
    pub plugins: Vec<StoredOutcome>,
}

/// The name a plugin's rows and failures are stored under.
fn source_name(o: &PluginOutcome) -> String {
    match &o.metadata {
        Some(m) => m.name.clone(),
        None => o
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| o.path.display().to_string()),
    }
}

/// The per-category grouping of a stored run (prompt index → category).
pub fn run_grouping(store: &Store, run: i64) -> anyhow::Result<Grouping> {
    let categories = store
        .prompt_metas(run)?
        .into_iter()
        .filter_map(|p| p.category.map(|c| (p.index, c)))
        .collect();
    Ok(Grouping {
        per_prompt: true,
        categories,
    })
}

/// One value as a metric row of `source`: unit, description and direction come from the
/// plugin's declaration (families included); an undefined value is NaN (stored as NULL); a
/// series is stored as the JSON array of its values (null where undefined), the same shape as
/// the native per-position rows, so the run page draws it.
fn row(source: &str, meta: &Metadata, scope: MetricScope, v: &MetricResult) -> MetricRow {
    let spec = meta.spec_for(&v.name);
    MetricRow {
        source: source.to_string(),
        name: v.name.clone(),
        scope,
        value: v.value.unwrap_or(f64::NAN),
        count: v.count,
        series: v.series.as_ref().map(|s| serde_json::json!(s.values)),
        unit: spec.map(|s| s.unit.clone()).unwrap_or_default(),
        description: spec.map(|s| s.description.clone()).unwrap_or_default(),
        higher_is_better: spec.is_none_or(|s| s.higher_is_better),
    }
}

/// Every metric row of one plugin's scores: run scope, per category, per prompt.
pub fn metric_rows(source: &str, meta: &Metadata, scores: &Scores) -> Vec<MetricRow> {
    let mut out = Vec::new();
    for v in &scores.overall {
        out.push(row(source, meta, MetricScope::Run, v));
    }
    for (cat, vs) in &scores.per_category {
        for v in vs {
            out.push(row(source, meta, MetricScope::Category(cat.clone()), v));
        }
    }
    for (prompt, vs) in &scores.per_prompt {
        for v in vs {
            out.push(row(source, meta, MetricScope::Prompt(*prompt), v));
        }
    }
    out
}

/// Score the stored records of `run` with `plugins` and store the results: each plugin's rows
/// in one transaction (replacing that plugin's earlier rows), each failure with
/// [`Store::add_plugin_failure`]. A failing plugin never stops the others. Errors only for
/// problems of the run or the store: the run does not exist, has no records, or writing fails;
/// or two plugins share a name (their rows would overwrite each other).
pub fn score_stored_run(
    runtime: &Runtime,
    store: &Store,
    run: i64,
    plugins: &[PluginRequest],
) -> anyhow::Result<StoredScoring> {
    let db = store.path().display().to_string();
    let batch = store
        .records(run)
        .with_context(|| format!("{db}: cannot read the records of run {run}"))?;
    if batch.num_blocks() == 0 {
        bail!("{db}: run {run} has no stored records, so there is nothing for plugins to score");
    }
    let groups = run_grouping(store, run)?;
    let outcomes = score_batch_with(runtime, plugins, &batch, &groups)?;

    // Two plugins with one name would overwrite each other's rows: refuse before storing.
    let mut seen = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.is_ok()) {
        let name = source_name(o);
        if let Some(first) = seen.insert(name.clone(), o.path.clone()) {
            bail!(
                "{} and {} are both the plugin {name}: their metrics would overwrite each other; score them \
                 in separate calls",
                first.display(),
                o.path.display()
            );
        }
    }

    let mut stored = Vec::with_capacity(outcomes.len());
    for mut o in outcomes {
        let plugin = source_name(&o);
        if o.failure.is_none() && RESERVED_SOURCES.contains(&plugin.as_str()) {
            o.scores = None;
            o.failure = Some(PluginFailure::new(
                FailureKind::BadOutput,
                &o.path,
                format!(
                    "calls itself {plugin:?}, a metric source reserved for draftlens' own metrics; rename the plugin"
                ),
            ));
        }
        let (rows, replaced, metrics) = match (&o.scores, &o.metadata, &o.failure) {
            (Some(scores), Some(meta), None) => {
                let rows = metric_rows(&plugin, meta, scores);
                let replaced = store.replace_metrics(run, &plugin, &rows)?;
                let run_rows = rows
                    .iter()
                    .filter(|r| r.scope == MetricScope::Run)
                    .cloned()
                    .collect();
                (rows.len(), replaced, run_rows)
            }
            _ => {
                let f = o.failure.clone().unwrap_or_else(|| {
                    PluginFailure::new(FailureKind::BadOutput, &o.path, "returned no scores")
                });
                store.add_plugin_failure(
                    run,
                    &plugin,
                    f.kind.label(),
                    &format!("{}: {}", f.path.display(), f.message),
                )?;
                o.failure = Some(f);
                (0, 0, Vec::new())
            }
        };
        stored.push(StoredOutcome {
            plugin,
            failure: o.failure.clone(),
            outcome: o,
            metrics,
            rows,
            replaced,
        });
    }
    let prompts: BTreeSet<u32> = batch.prompt_index.iter().copied().collect();
    let categories: BTreeSet<String> = prompts
        .iter()
        .filter_map(|p| groups.categories.get(p).cloned())
        .collect();
    Ok(StoredScoring {
        run,
        blocks: batch.num_blocks(),
        prompts: prompts.len(),
        categories: categories.into_iter().collect(),
        plugins: stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{MetricSpec, SeriesKind, SeriesResult};

    fn meta() -> Metadata {
        Metadata {
            name: "m".into(),
            metrics: vec![
                MetricSpec {
                    name: "tau".into(),
                    unit: "tokens".into(),
                    description: "τ".into(),
                    higher_is_better: true,
                },
                MetricSpec {
                    name: "miss_*".into(),
                    unit: "fraction".into(),
                    description: "misses".into(),
                    higher_is_better: false,
                },
            ],
            ..Metadata::default()
        }
    }

    fn value(name: &str, v: Option<f64>, n: u64) -> MetricResult {
        MetricResult::scalar(name, v, n)
    }

    #[test]
    fn scores_become_rows_of_every_scope() {
        let mut s = Scores::default();
        let mut tau = value("tau", Some(2.5), 10);
        tau.series = Some(SeriesResult {
            kind: SeriesKind::PerPosition,
            values: vec![Some(0.5), None],
            counts: vec![10, 0],
        });
        s.overall = vec![tau, value("miss_8", None, 0)];
        s.per_category
            .insert("code".into(), vec![value("tau", Some(3.0), 4)]);
        s.per_prompt.insert(7, vec![value("tau", Some(1.0), 2)]);
        let rows = metric_rows("m", &meta(), &s);
        assert_eq!(rows.len(), 4);
        let r = &rows[0];
        assert_eq!(
            (
                r.source.as_str(),
                r.name.as_str(),
                &r.scope,
                r.value,
                r.count
            ),
            ("m", "tau", &MetricScope::Run, 2.5, 10)
        );
        assert_eq!(
            (r.unit.as_str(), r.description.as_str(), r.higher_is_better),
            ("tokens", "τ", true)
        );
        assert_eq!(r.series, Some(serde_json::json!([0.5, null])));
        // A family member takes the family's declaration; undefined is NaN (stored as NULL).
        let miss = &rows[1];
        assert!(miss.value.is_nan());
        assert_eq!(
            (miss.unit.as_str(), miss.higher_is_better),
            ("fraction", false)
        );
        assert_eq!(rows[2].scope, MetricScope::Category("code".into()));
        assert_eq!(
            (rows[3].scope.clone(), rows[3].value),
            (MetricScope::Prompt(7), 1.0)
        );
    }

    #[test]
    fn the_source_is_the_plugin_name_else_the_file_stem() {
        let mut o = PluginOutcome {
            path: "/x/my_metric.wasm".into(),
            sha256: None,
            metadata: None,
            params: vec![],
            scores: None,
            failure: None,
            logs: vec![],
            logs_dropped: 0,
            fuel_used: None,
            load_ms: 0.0,
            run_ms: 0.0,
        };
        assert_eq!(source_name(&o), "my_metric");
        o.metadata = Some(meta());
        assert_eq!(source_name(&o), "m");
    }
}
