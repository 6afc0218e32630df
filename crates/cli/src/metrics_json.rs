//! The one `--json` shape of a run's stored metrics (docs/json.md): `run --json` and
//! `runs show --json` both report them through [`by_source`], keyed source → metric name, with
//! [`SCHEMA_VERSION`] next to them.

use draftlens_results::store::{MetricRow, MetricScope};
use serde::Serialize;
use std::collections::BTreeMap;

/// The version of the `--json` shape of `run` and `runs show` (`schema_version`). It changes
/// when a key a script may read is renamed, moved or removed, or its meaning changes; a new key
/// leaves it as it is. 1: metrics keyed source → name in both commands (before, `runs show`
/// listed them).
pub const SCHEMA_VERSION: u32 = 1;

/// One metric value with its unit and convention.
#[derive(Debug, PartialEq, Serialize)]
pub struct MetricJson {
    /// `null` when undefined (NaN).
    pub value: f64,
    pub unit: String,
    /// What is counted: macro or pooled, bonus included or not, which anchors (docs/metrics.md).
    pub description: String,
    /// The denominator behind the value (prompts, rounds, blocks or positions).
    pub count: u64,
    pub higher_is_better: bool,
    /// Values beyond the scalar (per-position values, histogram bins); `null` when none.
    pub series: Option<serde_json::Value>,
}

/// Metrics of one scope: source (`native` or a plugin's name) → metric name → metric.
pub type BySource = BTreeMap<String, BTreeMap<String, MetricJson>>;

/// `rows` keyed source → name (rows of one scope: a later row of the same source and name
/// would replace an earlier one).
pub fn by_source<'a>(rows: impl IntoIterator<Item = &'a MetricRow>) -> BySource {
    let mut out = BySource::new();
    for m in rows {
        out.entry(m.source.clone()).or_default().insert(
            m.name.clone(),
            MetricJson {
                value: m.value,
                unit: m.unit.clone(),
                description: m.description.clone(),
                count: m.count,
                higher_is_better: m.higher_is_better,
                series: m.series.clone(),
            },
        );
    }
    out
}

/// Every stored metric of a run, by scope, each scope in the [`BySource`] shape.
#[derive(Debug, PartialEq, Serialize)]
pub struct ScopedMetrics {
    /// Run-level metrics (what `run --json` reports as `metrics`).
    pub metrics: BySource,
    /// Per prompt, keyed by the prompt's index in the run.
    pub prompt_metrics: BTreeMap<u32, BySource>,
    /// Per prompt category.
    pub category_metrics: BTreeMap<String, BySource>,
}

pub fn scoped(rows: &[MetricRow]) -> ScopedMetrics {
    let mut run = Vec::new();
    let mut prompts: BTreeMap<u32, Vec<&MetricRow>> = BTreeMap::new();
    let mut categories: BTreeMap<String, Vec<&MetricRow>> = BTreeMap::new();
    for m in rows {
        match &m.scope {
            MetricScope::Run => run.push(m),
            MetricScope::Prompt(i) => prompts.entry(*i).or_default().push(m),
            MetricScope::Category(c) => categories.entry(c.clone()).or_default().push(m),
        }
    }
    ScopedMetrics {
        metrics: by_source(run),
        prompt_metrics: prompts
            .into_iter()
            .map(|(i, r)| (i, by_source(r)))
            .collect(),
        category_metrics: categories
            .into_iter()
            .map(|(c, r)| (c, by_source(r)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(source: &str, name: &str, scope: MetricScope, value: f64) -> MetricRow {
        MetricRow {
            source: source.into(),
            name: name.into(),
            scope,
            value,
            count: 3,
            series: None,
            unit: "tokens/round".into(),
            description: "d".into(),
            higher_is_better: true,
        }
    }

    #[test]
    fn every_scope_is_keyed_source_then_name() {
        let rows = vec![
            row("native", "tau", MetricScope::Run, 2.5),
            row("native", "tau", MetricScope::Prompt(10), 2.0),
            row("native", "tau", MetricScope::Prompt(2), 3.0),
            row("plug", "x", MetricScope::Category("code".into()), f64::NAN),
            row("plug", "x", MetricScope::Run, 1.0),
        ];
        let v = serde_json::to_value(scoped(&rows)).unwrap();
        assert_eq!(v["metrics"]["native"]["tau"]["value"], 2.5);
        assert_eq!(v["metrics"]["plug"]["x"]["count"], 3);
        assert!(v["metrics"]["plug"]["x"]["series"].is_null());
        assert_eq!(v["prompt_metrics"]["2"]["native"]["tau"]["value"], 3.0);
        assert_eq!(v["prompt_metrics"]["10"]["native"]["tau"]["value"], 2.0);
        // Undefined values are null, as in the rest of the --json output.
        assert!(v["category_metrics"]["code"]["plug"]["x"]["value"].is_null());
        assert_eq!(
            v["prompt_metrics"].as_object().unwrap().len(),
            2,
            "{}",
            v["prompt_metrics"]
        );
        assert_eq!(v["metrics"].as_object().unwrap().len(), 2);
    }
}
