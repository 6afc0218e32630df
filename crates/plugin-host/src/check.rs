//! The conformance check behind `draftlens plugins check`: a loaded plugin is run on synthetic
//! records one-shot, then streamed in chunks with per-prompt and per-category groups, and
//! every group is evaluated again on its own in a fresh instance. The contract requires the
//! streamed values to equal the one-shot ones, and every group's accumulator to be independent
//! of the others (a plugin keeping state outside its accumulator, e.g. in a global, gives
//! different per-prompt values when the groups share an instance).

use std::collections::BTreeMap;

use draftlens_records::RecordBatch;
use serde::Serialize;

use crate::failure::PluginFailure;
use crate::runtime::{LoadedPlugin, Runtime};
use crate::score::{Grouping, PluginOutcome};
use crate::types::{MetricResult, Param};

/// Blocks per streamed chunk in the check (several chunks per prompt).
const CHUNK_BLOCKS: usize = 250;

/// What the check ran and found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub blocks: usize,
    pub one_shot: Vec<MetricResult>,
    pub streamed_chunks: usize,
    /// Groups evaluated again on their own (prompts and categories).
    pub groups_checked: usize,
    pub outcome: PluginOutcome,
}

/// Why a plugin fails the check.
#[derive(Debug)]
pub enum CheckError {
    /// The plugin failed (trap, bad output, ...).
    Failed(PluginFailure),
    /// It ran, but breaks the contract's rules on streaming or independent accumulators.
    Contract(String),
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckError::Failed(p) => p.fmt(f),
            CheckError::Contract(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CheckError {}

impl From<PluginFailure> for CheckError {
    fn from(f: PluginFailure) -> Self {
        CheckError::Failed(f)
    }
}

/// The synthetic records of the check: 8 prompts in 2 categories, prompt and completion
/// anchors, target top-K stored.
pub fn check_batch() -> (RecordBatch, Grouping) {
    let mut shape = crate::sdk::testdata::Shape::new(16, 8, 8, 16, 200);
    shape.prompt_anchors = true;
    shape.target_topk = true;
    let batch = crate::sdk::testdata::random(1, &shape, 0.7, 0.2);
    let groups = Grouping {
        per_prompt: true,
        categories: (0..8).map(|i| (i, format!("c{}", i % 2))).collect(),
    };
    (batch, groups)
}

/// Relative agreement of two results (summation order may differ in the last bits).
pub fn agree(a: &[MetricResult], b: &[MetricResult]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} values vs {} values", a.len(), b.len()));
    }
    let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (None, None) => true,
        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
        _ => false,
    };
    for (x, y) in a.iter().zip(b) {
        if x.name != y.name || x.count != y.count || !close(x.value, y.value) {
            return Err(format!(
                "{}: {:?} (n={}) vs {} {:?} (n={})",
                x.name, x.value, x.count, y.name, y.value, y.count
            ));
        }
    }
    Ok(())
}

/// Run the conformance check on `plugin` with `params`.
pub fn check_plugin(
    runtime: &Runtime,
    plugin: &LoadedPlugin,
    params: &[Param],
) -> Result<CheckReport, CheckError> {
    let (batch, groups) = check_batch();
    check_plugin_on(runtime, plugin, params, &batch, &groups)
}

/// [`check_plugin`] on given records and groups.
pub fn check_plugin_on(
    runtime: &Runtime,
    plugin: &LoadedPlugin,
    params: &[Param],
    batch: &RecordBatch,
    groups: &Grouping,
) -> Result<CheckReport, CheckError> {
    let file = plugin.path.display();
    let one_shot = runtime.evaluate(plugin, params, batch)?;
    let outcome = runtime.score_chunked(plugin, params, batch, groups, CHUNK_BLOCKS);
    if let Some(f) = &outcome.failure {
        return Err(f.clone().into());
    }
    let scores = outcome.scores.as_ref().expect("scores when no failure");
    agree(&one_shot, &scores.overall).map_err(|e| {
        CheckError::Contract(format!(
            "{file}: streaming disagrees with one-shot evaluation (the contract requires equal results): \
             one-shot vs streamed {e}"
        ))
    })?;

    // Every group alone, in a fresh instance: what its accumulator must have computed.
    let mut members: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (b, &p) in batch.prompt_index.iter().enumerate() {
        if groups.per_prompt {
            members.entry(format!("prompt {p}")).or_default().push(b);
        }
        if let Some(c) = groups.categories.get(&p) {
            members.entry(format!("category {c}")).or_default().push(b);
        }
    }
    for (group, blocks) in &members {
        let alone = runtime.evaluate(plugin, params, &batch.select(blocks))?;
        let shared = match group.split_once(' ') {
            Some(("prompt", p)) => p.parse().ok().and_then(|p: u32| scores.per_prompt.get(&p)),
            Some((_, c)) => scores.per_category.get(c),
            None => None,
        };
        let shared = shared.map(Vec::as_slice).unwrap_or_default();
        agree(&alone, shared).map_err(|e| {
            CheckError::Contract(format!(
                "{file}: the accumulators are not independent: {group} scored alongside the other groups in \
                 one instance differs from {group} scored alone (alone vs alongside {e}); keep all state in \
                 the accumulator (no globals, no state in the metric type), as the contract requires"
            ))
        })?;
    }
    Ok(CheckReport {
        blocks: batch.num_blocks(),
        one_shot,
        streamed_chunks: batch.num_blocks().div_ceil(CHUNK_BLOCKS),
        groups_checked: members.len(),
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(name: &str, v: Option<f64>, n: u64) -> MetricResult {
        MetricResult::scalar(name, v, n)
    }

    #[test]
    fn results_must_agree() {
        let a = vec![value("tau", Some(2.5), 10), value("acc", None, 0)];
        assert!(agree(&a, &a).is_ok());
        let close = vec![value("tau", Some(2.5 + 1e-13), 10), value("acc", None, 0)];
        assert!(
            agree(&a, &close).is_ok(),
            "float summation order may differ in the last bits"
        );
        let far = vec![value("tau", Some(2.6), 10), value("acc", None, 0)];
        assert!(agree(&a, &far).unwrap_err().contains("tau: Some(2.5)"));
        let count = vec![value("tau", Some(2.5), 11), value("acc", None, 0)];
        assert!(agree(&a, &count).is_err());
        assert!(agree(&a, &a[..1])
            .unwrap_err()
            .contains("2 values vs 1 values"));
    }
}
