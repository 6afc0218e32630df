//! Metric rows (one per run, source, name and scope, with their denominator) and plugin
//! failures.

use super::*;

/// What a metric value summarises.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetricScope {
    Run,
    Prompt(u32),
    Category(String),
}

impl fmt::Display for MetricScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricScope::Run => f.write_str("run"),
            MetricScope::Prompt(i) => write!(f, "prompt:{i}"),
            MetricScope::Category(c) => write!(f, "category:{c}"),
        }
    }
}

impl FromStr for MetricScope {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        if s == "run" {
            Ok(MetricScope::Run)
        } else if let Some(i) = s.strip_prefix("prompt:") {
            Ok(MetricScope::Prompt(i.parse().map_err(|_| {
                anyhow!("bad metric scope {s:?}: prompt index is not a number")
            })?))
        } else if let Some(c) = s.strip_prefix("category:") {
            Ok(MetricScope::Category(c.to_string()))
        } else {
            bail!("bad metric scope {s:?} (expected run, prompt:<index> or category:<name>)")
        }
    }
}

impl Serialize for MetricScope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MetricScope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One metric value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricRow {
    /// Plugin (or "native") that computed it.
    pub source: String,
    pub name: String,
    pub scope: MetricScope,
    /// NaN means "missing" (stored as NULL).
    pub value: f64,
    /// Denominator: how many items (blocks, rounds, prompts) the value was computed over.
    pub count: u64,
    /// Optional series (e.g. per-position values), any JSON.
    pub series: Option<serde_json::Value>,
    pub unit: String,
    pub description: String,
    pub higher_is_better: bool,
}

impl MetricRow {
    /// A run-scope scalar with no series, unit or description.
    pub fn scalar(
        source: &str,
        name: &str,
        scope: MetricScope,
        value: f64,
        count: u64,
        higher_is_better: bool,
    ) -> Self {
        MetricRow {
            source: source.into(),
            name: name.into(),
            scope,
            value,
            count,
            series: None,
            unit: String::new(),
            description: String::new(),
            higher_is_better,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginFailure {
    pub plugin: String,
    pub kind: String,
    pub message: String,
    pub created_at: String,
}

/// Which plugin file produced the rows of one source of a run, and whether they are stale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginProvenance {
    /// The metric source (the plugin's name).
    pub source: String,
    /// sha256 (hex) of the `.wasm` that produced the rows; empty when unknown.
    pub sha256: String,
    pub version: String,
    /// Where it was loaded from (`builtin:NAME` for a plugin embedded in draftlens).
    pub file: String,
    /// An embedded built-in plugin.
    pub builtin: bool,
    /// The parameters it ran with (JSON array).
    pub params_json: String,
    pub scored_at: String,
    /// Set (RFC 3339) when a later scoring by this source failed: the rows are from this
    /// earlier file and parameters, not from what was asked last.
    pub stale_since: Option<String>,
}

/// (source, name) of a metric.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MetricKey {
    pub source: String,
    pub name: String,
}

impl MetricKey {
    pub fn new(source: &str, name: &str) -> Self {
        MetricKey {
            source: source.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for MetricKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source, self.name)
    }
}

impl FromStr for MetricKey {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let (a, b) = s
            .split_once('/')
            .ok_or_else(|| anyhow!("bad metric key {s:?} (expected source/name)"))?;
        Ok(MetricKey::new(a, b))
    }
}

pub(super) fn failures_of(c: &Connection, run: i64) -> Result<Vec<PluginFailure>> {
    let mut stmt =
        c.prepare_cached("SELECT plugin, kind, message, created_at FROM plugin_failure WHERE run_id = ?1 ORDER BY id")?;
    let v = stmt
        .query_map([run], |r| {
            Ok(PluginFailure {
                plugin: r.get("plugin")?,
                kind: r.get("kind")?,
                message: r.get("message")?,
                created_at: r.get("created_at")?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(v)
}

pub(super) fn insert_metrics(
    tx: &Transaction,
    run: i64,
    metrics: &[MetricRow],
    what: &str,
) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT OR REPLACE INTO metric (run_id, source, name, scope, value, count, series_json, unit, description, higher_is_better) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for m in metrics {
        if m.source.is_empty() || m.name.is_empty() {
            bail!("{what}: run {run}: metric with an empty source or name");
        }
        if m.source.contains('/') {
            bail!(
                "{what}: run {run}: metric source {:?} must not contain '/'",
                m.source
            );
        }
        let value = if m.value.is_nan() {
            None
        } else {
            Some(m.value)
        };
        stmt.execute(params![
            run,
            m.source,
            m.name,
            m.scope.to_string(),
            value,
            m.count as i64,
            m.series.as_ref().map(|s| s.to_string()),
            m.unit,
            m.description,
            m.higher_is_better as i64,
        ])
        .with_context(|| {
            format!(
                "{what}: run {run}: cannot store metric {}/{}",
                m.source, m.name
            )
        })?;
    }
    Ok(())
}

impl Store {
    /// Inserts or replaces metric rows (keyed by source, name, scope) in one transaction.
    /// Allowed on finished runs: a new plugin can re-score old records.
    pub fn add_metrics(&self, run: i64, metrics: &[MetricRow]) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_exists(&tx, run, &what)?;
            insert_metrics(&tx, run, metrics, &what)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Replaces every metric row of `source` for `run` with `metrics` and clears the failures
    /// recorded for a plugin of that name, in one transaction: re-scoring a run with a plugin
    /// never duplicates rows nor leaves old and new values mixed (a changed parameter can change
    /// which metric names a plugin produces), and a reader sees the old rows or the new ones.
    /// Every row must have `source`. Returns how many old rows were replaced.
    pub fn replace_metrics(&self, run: i64, source: &str, metrics: &[MetricRow]) -> Result<usize> {
        let what = self.what();
        if let Some(m) = metrics.iter().find(|m| m.source != source) {
            bail!(
                "{what}: run {run}: replacing the metrics of {source:?} with a row of source {:?} ({})",
                m.source,
                m.name
            );
        }
        self.write(|c| {
            let tx = c.transaction()?;
            require_exists(&tx, run, &what)?;
            let replaced = tx.execute(
                "DELETE FROM metric WHERE run_id = ?1 AND source = ?2",
                params![run, source],
            )?;
            tx.execute(
                "DELETE FROM plugin_failure WHERE run_id = ?1 AND plugin = ?2",
                params![run, source],
            )?;
            insert_metrics(&tx, run, metrics, &what)?;
            tx.commit()?;
            Ok(replaced)
        })
    }

    /// [`Store::replace_metrics`] that also records which file produced the rows
    /// (`prov.source` is the source), in the same transaction.
    pub fn replace_plugin_metrics(
        &self,
        run: i64,
        prov: &PluginProvenance,
        metrics: &[MetricRow],
    ) -> Result<usize> {
        let what = self.what();
        let source = prov.source.as_str();
        if let Some(m) = metrics.iter().find(|m| m.source != source) {
            bail!(
                "{what}: run {run}: replacing the metrics of {source:?} with a row of source {:?} ({})",
                m.source,
                m.name
            );
        }
        self.write(|c| {
            let tx = c.transaction()?;
            require_exists(&tx, run, &what)?;
            let replaced = tx.execute(
                "DELETE FROM metric WHERE run_id = ?1 AND source = ?2",
                params![run, source],
            )?;
            tx.execute(
                "DELETE FROM plugin_failure WHERE run_id = ?1 AND plugin = ?2",
                params![run, source],
            )?;
            insert_metrics(&tx, run, metrics, &what)?;
            tx.execute(
                "INSERT OR REPLACE INTO plugin_run (run_id, source, sha256, version, file, builtin, params_json, scored_at, stale_since) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL)",
                params![run, source, prov.sha256, prov.version, prov.file, prov.builtin as i64, prov.params_json, now_rfc3339()],
            )
            .with_context(|| format!("{what}: run {run}: cannot record which plugin produced {source}"))?;
            tx.commit()?;
            Ok(replaced)
        })
    }

    /// Records a failure of `plugin` and, in the same transaction, marks the rows an earlier
    /// scoring by that source left as stale (they stay: they are the last values that worked).
    /// Returns how many such stale rows there are.
    pub fn record_plugin_failure(
        &self,
        run: i64,
        plugin: &str,
        kind: &str,
        message: &str,
    ) -> Result<usize> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_exists(&tx, run, &what)?;
            let now = now_rfc3339();
            tx.execute(
                "INSERT INTO plugin_failure (run_id, plugin, kind, message, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![run, plugin, kind, message, now],
            )?;
            let stale: i64 = tx.query_row(
                "SELECT count(*) FROM metric WHERE run_id = ?1 AND source = ?2",
                params![run, plugin],
                |r| r.get(0),
            )?;
            if stale > 0 {
                // Rows from before provenance was recorded get a row saying so.
                tx.execute(
                    "INSERT OR IGNORE INTO plugin_run (run_id, source, sha256, scored_at) VALUES (?1, ?2, '', ?3)",
                    params![run, plugin, now],
                )?;
                tx.execute(
                    "UPDATE plugin_run SET stale_since = coalesce(stale_since, ?3) WHERE run_id = ?1 AND source = ?2",
                    params![run, plugin, now],
                )?;
            }
            tx.commit()?;
            Ok(stale as usize)
        })
    }

    /// Which plugin file produced each plugin source's rows of a run, by source.
    pub fn plugin_runs(&self, run: i64) -> Result<Vec<PluginProvenance>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT source, sha256, version, file, builtin, params_json, scored_at, stale_since FROM plugin_run \
                 WHERE run_id = ?1 ORDER BY source",
            )?;
            let v = stmt
                .query_map([run], |r| {
                    Ok(PluginProvenance {
                        source: r.get(0)?,
                        sha256: r.get(1)?,
                        version: r.get(2)?,
                        file: r.get(3)?,
                        builtin: r.get::<_, i64>(4)? != 0,
                        params_json: r.get(5)?,
                        scored_at: r.get(6)?,
                        stale_since: r.get(7)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    pub fn add_plugin_failure(
        &self,
        run: i64,
        plugin: &str,
        kind: &str,
        message: &str,
    ) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            require_exists(c, run, &what)?;
            c.execute(
                "INSERT INTO plugin_failure (run_id, plugin, kind, message, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![run, plugin, kind, message, now_rfc3339()],
            )?;
            Ok(())
        })
    }

    /// Run-scope metric keys with the number of runs that have each, most common first.
    pub fn metric_keys(&self) -> Result<Vec<(MetricKey, usize, bool)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT source, name, count(*), max(higher_is_better) FROM metric WHERE scope = 'run' \
                 GROUP BY source, name ORDER BY count(*) DESC, source, name",
            )?;
            let v = stmt
                .query_map([], |r| {
                    Ok((MetricKey { source: r.get(0)?, name: r.get(1)? }, r.get::<_, i64>(2)? as usize, r.get::<_, i64>(3)? != 0))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    /// All metric rows of a run (every scope), sorted by source, name, scope.
    pub fn metrics(&self, run: i64) -> Result<Vec<MetricRow>> {
        self.metrics_where(run, None)
    }

    /// Metric rows of one scope.
    pub fn metrics_in_scope(&self, run: i64, scope: &MetricScope) -> Result<Vec<MetricRow>> {
        self.metrics_where(run, Some(scope.to_string()))
    }

    fn metrics_where(&self, run: i64, scope: Option<String>) -> Result<Vec<MetricRow>> {
        let what = self.what();
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT source, name, scope, value, count, series_json, unit, description, higher_is_better FROM metric \
                 WHERE run_id = ?1 AND (?2 IS NULL OR scope = ?2) ORDER BY source, name, scope",
            )?;
            let mut rows = stmt.query(params![run, scope])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let scope: String = r.get("scope")?;
                let series: Option<String> = r.get("series_json")?;
                out.push(MetricRow {
                    source: r.get("source")?,
                    name: r.get("name")?,
                    scope: scope.parse().with_context(|| format!("{what}: run {run}"))?,
                    value: r.get::<_, Option<f64>>("value")?.unwrap_or(f64::NAN),
                    count: r.get::<_, i64>("count")? as u64,
                    series: series
                        .map(|s| serde_json::from_str(&s))
                        .transpose()
                        .with_context(|| format!("{what}: run {run}: bad metric series JSON"))?,
                    unit: r.get("unit")?,
                    description: r.get("description")?,
                    higher_is_better: r.get::<_, i64>("higher_is_better")? != 0,
                });
            }
            Ok(out)
        })
    }

    /// Changes whenever a run's metric rows change (count and sums of values and counts): lets
    /// callers cache what they derive from metrics.
    pub fn metrics_fingerprint(&self, run: i64) -> Result<String> {
        self.read(|c| {
            let (n, v, k): (i64, f64, f64) = c.query_row(
                "SELECT count(*), total(value), total(count) FROM metric WHERE run_id = ?1",
                [run],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            Ok(format!("{n}:{v:e}:{k:e}"))
        })
    }

    pub fn plugin_failures(&self, run: i64) -> Result<Vec<PluginFailure>> {
        self.read(|c| failures_of(c, run))
    }
}
