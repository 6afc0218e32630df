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

use std::path::Path;

use anyhow::{bail, Context};
use draftlens_results::store::{MetricRow, MetricScope, PluginProvenance, Store};
use serde::Serialize;

use crate::failure::{FailureKind, PluginFailure};
use crate::score::{Grouping, PluginOutcome, PluginRequest, Scores};
use crate::types::{Metadata, MetricResult};
use crate::{LoadedPlugin, Runtime};

/// Metric sources draftlens writes itself (the native metrics of `run`, and what the web UI
/// derives from records). A plugin calling itself one of these is refused: storing its rows
/// would replace draftlens' own. The built-in plugins' names are reserved the same way, for
/// the built-ins themselves, and so are look-alikes of all of them ([`reserved_for`]).
/// `speed` holds `live --baseline`'s timings (`draftlens_results::speed`), `cost_bench` the costs
/// `bench-costs` measures apart from live decoding (`draftlens_results::cost_bench`).
pub const RESERVED_SOURCES: &[&str] = &[
    "native",
    "records",
    draftlens_results::speed::SOURCE,
    draftlens_results::cost_bench::SOURCE,
];

/// What scoring a stored run did with one plugin.
#[derive(Clone, Debug, Serialize)]
pub struct StoredOutcome {
    /// The metric source its rows are stored under: the plugin's own name, or the file stem
    /// when it failed before saying its name (made unambiguous when that is a reserved name).
    pub plugin: String,
    /// sha256 of the file that produced the rows (None when it could not be read).
    pub sha256: Option<String>,
    /// The plugin's outcome (failure, logs, timings; its scores are dropped once stored).
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
    /// When it failed: rows an earlier scoring by this source left, now marked stale.
    pub stale_rows: usize,
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

/// The reserved name (a source draftlens writes itself, or a built-in plugin's) that `name` is
/// or looks like: `_` and `-` are the same and do not count at either end, so `accept_length`,
/// `native-` and `_records` read as the names they imitate, in a table as on a command line.
fn reserved_for(name: &str) -> Option<&'static str> {
    let canonical = |s: &str| s.replace('_', "-").trim_matches('-').to_string();
    let c = canonical(name);
    RESERVED_SOURCES
        .iter()
        .copied()
        .chain(crate::builtins::builtins().iter().map(|b| b.name))
        .find(|r| canonical(r) == c)
}

/// Whether a plugin may store rows under `name`: not a source draftlens writes itself, and a
/// built-in's name only for that built-in (same bytes), under exactly that name; nobody may
/// use a look-alike of either ([`reserved_for`]).
fn name_allowed(name: &str, builtin: Option<&str>) -> bool {
    match reserved_for(name) {
        None => true,
        Some(owner) => {
            !RESERVED_SOURCES.contains(&owner) && name == owner && builtin == Some(owner)
        }
    }
}

/// The name a plugin's failure is recorded under: its own name, else its file stem; a reserved
/// name it may not use gets its file's short hash appended, so that a spoofing or broken file
/// never marks a built-in's rows as stale or fills its failure list.
fn failure_source(
    path: &Path,
    meta: Option<&Metadata>,
    builtin: Option<&str>,
    sha256: Option<&str>,
) -> String {
    let name = match meta {
        Some(m) => m.name.clone(),
        None => crate::text::clean(
            &path
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_else(|| path.display().to_string()),
            64,
        )
        .replace('/', "_"),
    };
    if name_allowed(&name, builtin) {
        name
    } else {
        let short = sha256.map_or("unread", |h| &h[..h.len().min(12)]);
        format!("{name}~{short}")
    }
}

/// A plugin request with its loaded plugin (or why it could not be loaded): load once, then
/// check parameters and score as many runs as needed.
#[derive(Debug)]
pub struct PreparedPlugin {
    pub request: PluginRequest,
    pub plugin: Result<LoadedPlugin, PluginFailure>,
}

impl PreparedPlugin {
    pub fn load(runtime: &Runtime, request: PluginRequest) -> PreparedPlugin {
        let plugin = runtime.load_request(&request);
        PreparedPlugin { request, plugin }
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
/// in one transaction (replacing that plugin's earlier rows, recording the sha256 of its file),
/// each failure with [`Store::record_plugin_failure`] (which marks the earlier rows stale). A
/// failing plugin never stops the others. Errors only for problems of the run or the store:
/// the run does not exist, has no records, or writing fails; or two plugins share a name
/// (their rows would overwrite each other).
pub fn score_stored_run(
    runtime: &Runtime,
    store: &Store,
    run: i64,
    plugins: &[PluginRequest],
) -> anyhow::Result<StoredScoring> {
    let prepared: Vec<PreparedPlugin> = plugins
        .iter()
        .map(|r| PreparedPlugin::load(runtime, r.clone()))
        .collect();
    score_stored_run_prepared(runtime, store, run, &prepared)
}

/// [`score_stored_run`] with plugins loaded already (each file is loaded, and its `describe`
/// run, once however many runs it scores). Each plugin is scored and stored before the next one
/// runs, so what one plugin returns is never held next to another's.
pub fn score_stored_run_prepared(
    runtime: &Runtime,
    store: &Store,
    run: i64,
    plugins: &[PreparedPlugin],
) -> anyhow::Result<StoredScoring> {
    let db = store.path().display().to_string();
    let batch = store
        .records(run)
        .with_context(|| format!("{db}: cannot read the records of run {run}"))?;
    if batch.num_blocks() == 0 {
        bail!("{db}: run {run} has no stored records, so there is nothing for plugins to score");
    }
    batch
        .check()
        .map_err(|e| anyhow::anyhow!("{db}: the records of run {run} are inconsistent: {e}"))?;
    let groups = run_grouping(store, run)?;

    // Two plugins with one name would overwrite each other's rows: refuse before storing.
    let mut seen = BTreeMap::new();
    for p in plugins {
        if let Ok(l) = &p.plugin {
            if let Some(first) = seen.insert(l.metadata.name.clone(), l.path.clone()) {
                bail!(
                    "{} and {} are both the plugin {}: their metrics would overwrite each other; score them \
                     in separate calls",
                    crate::text::clean(&first.display().to_string(), 1024),
                    crate::text::clean(&l.path.display().to_string(), 1024),
                    l.metadata.name
                );
            }
        }
    }

    let mut stored = Vec::with_capacity(plugins.len());
    for p in plugins {
        let req = &p.request;
        let builtin = p.plugin.as_ref().ok().and_then(|l| l.builtin);
        let mut o = match &p.plugin {
            Err(f) => PluginOutcome::failed(&req.path, &req.params, f.clone()),
            Ok(l) if !name_allowed(&l.metadata.name, l.builtin) => {
                let name = &l.metadata.name;
                let reserved = reserved_for(name).unwrap_or_default();
                let owner = if RESERVED_SOURCES.contains(&reserved) {
                    "draftlens' own metrics".to_string()
                } else if builtin == Some(reserved) {
                    format!("the built-in plugin {reserved}, and only under that exact name")
                } else {
                    format!(
                        "the built-in plugin {reserved} (this file is not it: its sha256 differs)"
                    )
                };
                let looks = if name == reserved {
                    String::new()
                } else {
                    format!(", which reads as {reserved}")
                };
                let f = PluginFailure::new(
                    FailureKind::ReservedName,
                    &l.path,
                    format!("calls itself {name}{looks}, a name reserved for {owner}; rename the plugin"),
                );
                let mut o = PluginOutcome::failed(&l.path, &req.params, f);
                o.sha256 = Some(l.sha256.clone());
                o.metadata = Some(l.metadata.clone());
                o
            }
            Ok(l) => runtime.score(l, &req.params, &batch, &groups),
        };
        let (plugin, rows, replaced, metrics, stale_rows) =
            match (o.scores.take(), &o.metadata, &o.failure) {
                (Some(scores), Some(meta), None) => {
                    let plugin = meta.name.clone();
                    let rows = metric_rows(&plugin, meta, &scores);
                    drop(scores);
                    let prov = PluginProvenance {
                        source: plugin.clone(),
                        sha256: o.sha256.clone().unwrap_or_default(),
                        version: meta.version.clone(),
                        file: o.path.display().to_string(),
                        builtin: builtin == Some(meta.name.as_str()),
                        params_json: serde_json::to_string(&o.params)?,
                        scored_at: String::new(),
                        stale_since: None,
                    };
                    let replaced = store.replace_plugin_metrics(run, &prov, &rows)?;
                    let run_rows = rows
                        .iter()
                        .filter(|r| r.scope == MetricScope::Run)
                        .cloned()
                        .collect();
                    (plugin, rows.len(), replaced, run_rows, 0)
                }
                _ => {
                    let plugin =
                        failure_source(&o.path, o.metadata.as_ref(), builtin, o.sha256.as_deref());
                    let f = o.failure.clone().unwrap_or_else(|| {
                        PluginFailure::new(FailureKind::BadOutput, &o.path, "returned no scores")
                    });
                    let stale = store.record_plugin_failure(
                        run,
                        &plugin,
                        f.kind.label(),
                        &format!("{}: {}", f.file(), f.message),
                    )?;
                    o.failure = Some(f);
                    (plugin, 0, 0, Vec::new(), stale)
                }
            };
        stored.push(StoredOutcome {
            plugin,
            sha256: o.sha256.clone(),
            failure: o.failure.clone(),
            outcome: o,
            metrics,
            rows,
            replaced,
            stale_rows,
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
    fn reserved_names_are_for_their_owners_only() {
        assert!(name_allowed("my-metric", None));
        assert!(!name_allowed("native", None) && !name_allowed("records", Some("records")));
        assert!(!name_allowed("accept-length", None));
        assert!(!name_allowed("accept-length", Some("ddtree")));
        assert!(name_allowed("accept-length", Some("accept-length")));
        // Look-alikes of a reserved name are nobody's (issue 39).
        for fake in [
            "accept_length",
            "accept-length-",
            "_accept_length",
            "native-",
            "native_",
            "-records",
        ] {
            assert!(!name_allowed(fake, None), "{fake}");
            assert!(!name_allowed(fake, Some("accept-length")), "{fake}");
        }
        assert_eq!(reserved_for("native-"), Some("native"));
        assert_eq!(reserved_for("top1_accuracy"), Some("top1-accuracy"));
        assert!(name_allowed("accept-length-v2", None) && name_allowed("native-plus", None));
        let sha = "0123456789abcdef".repeat(4);
        let p = Path::new("/x/my_metric.wasm");
        assert_eq!(failure_source(p, None, None, None), "my_metric");
        let mut m = meta();
        assert_eq!(failure_source(p, Some(&m), None, Some(&sha)), "m");
        m.name = "accept-length".into();
        assert_eq!(
            failure_source(p, Some(&m), None, Some(&sha)),
            "accept-length~0123456789ab"
        );
        assert_eq!(
            failure_source(p, Some(&m), Some("accept-length"), Some(&sha)),
            "accept-length"
        );
        // A file named like a built-in that failed before describe().
        let p = Path::new("/x/ddtree.wasm");
        assert_eq!(failure_source(p, None, None, None), "ddtree~unread");
        // Control characters in a file name never reach the source name.
        let p = Path::new("/x/a\u{1b}[2Jb.wasm");
        assert_eq!(failure_source(p, None, None, None), "a [2Jb");
    }
}
