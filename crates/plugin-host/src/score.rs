//! Scoring stored records with plugins: one job per plugin, batches streamed in chunks, and the
//! per-prompt / per-category values computed by the host (it feeds each group's blocks to a
//! separate accumulator), so plugins never group by themselves.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use draftlens_records::RecordBatch;
use serde::{Deserialize, Serialize};
use wasmtime::component::ResourceAny;

use crate::failure::{FailureKind, PluginFailure};
use crate::job::Job;
use crate::runtime::{LoadedPlugin, Runtime, RuntimeConfig};
use crate::types::{LogLine, Metadata, MetricResult, Param};
use crate::validate;
use crate::wit::{BatchRef, ProjectionBuf};

/// Which groups to score besides the whole batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Grouping {
    /// Also score every prompt on its own.
    pub per_prompt: bool,
    /// Category of each prompt (prompt index → category); prompts not listed belong to none.
    /// Every category present in the batch is scored on its own.
    pub categories: BTreeMap<u32, String>,
}

/// A plugin to run and its parameters (defaults for those not given).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PluginRequest {
    /// The file (`builtin:NAME` for an embedded built-in).
    pub path: PathBuf,
    pub params: Vec<Param>,
    /// The embedded built-in plugin to run instead of a file.
    #[serde(default)]
    pub builtin: Option<String>,
}

impl PluginRequest {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        PluginRequest {
            path: path.into(),
            params: Vec::new(),
            builtin: None,
        }
    }

    /// The embedded built-in plugin `b`.
    pub fn builtin(b: &crate::builtins::Builtin) -> Self {
        PluginRequest {
            path: b.path(),
            params: Vec::new(),
            builtin: Some(b.name.to_string()),
        }
    }
}

/// The values of one plugin over the batch and its groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub overall: Vec<MetricResult>,
    pub per_category: BTreeMap<String, Vec<MetricResult>>,
    pub per_prompt: BTreeMap<u32, Vec<MetricResult>>,
}

/// What happened to one plugin: its scores, or why it failed; always its logs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PluginOutcome {
    pub path: PathBuf,
    /// sha256 of the `.wasm` (None when the file could not be read).
    pub sha256: Option<String>,
    /// What the plugin says it is (None when it failed before `describe`).
    pub metadata: Option<Metadata>,
    pub params: Vec<Param>,
    /// Set when the plugin succeeded.
    pub scores: Option<Scores>,
    /// Set when the plugin failed; the other plugins are not affected.
    pub failure: Option<PluginFailure>,
    pub logs: Vec<LogLine>,
    /// Log lines dropped past the per-job limit.
    pub logs_dropped: u64,
    /// Fuel the job consumed, when the runtime has a fuel budget (deterministic: use it to
    /// calibrate `--plugin-fuel`).
    pub fuel_used: Option<u64>,
    /// Load (compile or cache) time, ms.
    pub load_ms: f64,
    /// Scoring time, ms.
    pub run_ms: f64,
}

impl PluginOutcome {
    pub fn is_ok(&self) -> bool {
        self.failure.is_none()
    }
    pub(crate) fn failed(path: &Path, params: &[Param], f: PluginFailure) -> Self {
        PluginOutcome {
            path: path.to_path_buf(),
            sha256: None,
            metadata: None,
            params: params.to_vec(),
            scores: None,
            failure: Some(f),
            logs: Vec::new(),
            logs_dropped: 0,
            fuel_used: None,
            load_ms: 0.0,
            run_ms: 0.0,
        }
    }
}

/// Candidates per chunk sent to a plugin (ids + log-probs ≈ 8 MiB): bounds the guest's memory
/// independently of the batch size while amortising the per-call cost (~2 µs).
pub const CHUNK_CANDIDATES: usize = 1 << 20;

/// Score `batch` with every plugin in `plugins` (default parameters), sandboxed with the default
/// limits and the default precompiled cache. One outcome per plugin, in order; a failing plugin
/// never stops the others. Errors only for problems of the host itself (an inconsistent batch,
/// the engine cannot start).
pub fn score_batch(
    plugins: &[PathBuf],
    batch: &RecordBatch,
    groups: &Grouping,
) -> anyhow::Result<Vec<PluginOutcome>> {
    let runtime = Runtime::new(RuntimeConfig::with_default_cache())?;
    let requests: Vec<PluginRequest> = plugins.iter().map(PluginRequest::new).collect();
    score_batch_with(&runtime, &requests, batch, groups)
}

/// [`score_batch`] with an explicit runtime (limits, cache) and parameters.
pub fn score_batch_with(
    runtime: &Runtime,
    plugins: &[PluginRequest],
    batch: &RecordBatch,
    groups: &Grouping,
) -> anyhow::Result<Vec<PluginOutcome>> {
    batch
        .check()
        .map_err(|e| anyhow::anyhow!("records to score are inconsistent: {e}"))?;
    let mut out = Vec::with_capacity(plugins.len());
    for req in plugins {
        let plugin = match runtime.load_request(req) {
            Ok(p) => p,
            Err(f) => {
                out.push(PluginOutcome::failed(&req.path, &req.params, f));
                continue;
            }
        };
        out.push(runtime.score(&plugin, &req.params, batch, groups));
    }
    Ok(out)
}

/// Contiguous runs of blocks with the same prompt inside `range`.
fn prompt_runs(batch: &RecordBatch, range: Range<usize>) -> Vec<(u32, Range<usize>)> {
    let mut runs = Vec::new();
    let mut start = range.start;
    for b in range.clone() {
        if batch.prompt_index[b] != batch.prompt_index[start] {
            runs.push((batch.prompt_index[start], start..b));
            start = b;
        }
    }
    if start < range.end {
        runs.push((batch.prompt_index[start], start..range.end));
    }
    runs
}

impl Runtime {
    /// Run one loaded plugin over `batch` (already checked) in a fresh job.
    pub fn score(
        &self,
        plugin: &LoadedPlugin,
        params: &[Param],
        batch: &RecordBatch,
        groups: &Grouping,
    ) -> PluginOutcome {
        let per_block = (batch.positions_per_block() * batch.top_k as usize).max(1);
        self.score_chunked(
            plugin,
            params,
            batch,
            groups,
            (CHUNK_CANDIDATES / per_block).max(1),
        )
    }

    /// [`Runtime::score`] with an explicit chunk size in blocks.
    pub fn score_chunked(
        &self,
        plugin: &LoadedPlugin,
        params: &[Param],
        batch: &RecordBatch,
        groups: &Grouping,
        chunk_blocks: usize,
    ) -> PluginOutcome {
        let started = Instant::now();
        let mut job = match Job::new(self, plugin) {
            Ok(j) => j,
            Err(f) => {
                let mut o = PluginOutcome::failed(&plugin.path, params, f);
                o.sha256 = Some(plugin.sha256.clone());
                o.metadata = Some(plugin.metadata.clone());
                return o;
            }
        };
        let result = self.run_groups(&mut job, plugin, params, batch, groups, chunk_blocks.max(1));
        let (logs, logs_dropped) = job.take_logs();
        let fuel_used = job.fuel_used();
        let (scores, failure) = match result {
            Ok(s) => (Some(s), None),
            Err(f) => (None, Some(f)),
        };
        PluginOutcome {
            path: plugin.path.clone(),
            sha256: Some(plugin.sha256.clone()),
            metadata: Some(plugin.metadata.clone()),
            params: params.to_vec(),
            scores,
            failure,
            logs,
            logs_dropped,
            fuel_used,
            load_ms: plugin.load_time.as_secs_f64() * 1e3,
            run_ms: started.elapsed().as_secs_f64() * 1e3,
        }
    }

    fn run_groups(
        &self,
        job: &mut Job<'_>,
        plugin: &LoadedPlugin,
        params: &[Param],
        batch: &RecordBatch,
        groups: &Grouping,
        chunk: usize,
    ) -> Result<Scores, PluginFailure> {
        let nb = batch.num_blocks();

        let inputs = plugin.metadata.inputs;
        let mut buf = ProjectionBuf::default();
        let overall = job.begin(params)?;
        let mut cat_acc: BTreeMap<&str, ResourceAny> = BTreeMap::new();
        let mut prompt_acc: BTreeMap<u32, ResourceAny> = BTreeMap::new();
        let grouped = groups.per_prompt || !groups.categories.is_empty();

        let mut start = 0;
        while start < nb {
            let end = (start + chunk).min(nb);
            job.accumulate(
                overall,
                BatchRef::project(batch, start..end, &inputs, &mut buf),
            )?;
            if grouped {
                for (prompt, run) in prompt_runs(batch, start..end) {
                    if groups.per_prompt {
                        let acc = match prompt_acc.get(&prompt) {
                            Some(a) => *a,
                            None => {
                                let a = job.begin(params)?;
                                prompt_acc.insert(prompt, a);
                                a
                            }
                        };
                        job.accumulate(
                            acc,
                            BatchRef::project(batch, run.clone(), &inputs, &mut buf),
                        )?;
                    }
                    if let Some(cat) = groups.categories.get(&prompt) {
                        let acc = match cat_acc.get(cat.as_str()) {
                            Some(a) => *a,
                            None => {
                                let a = job.begin(params)?;
                                cat_acc.insert(cat, a);
                                a
                            }
                        };
                        job.accumulate(acc, BatchRef::project(batch, run, &inputs, &mut buf))?;
                    }
                }
            }
            start = end;
        }
        if nb == 0 {
            // An empty batch still gets one (empty) accumulate, so plugins see B and K.
            job.accumulate(overall, BatchRef::project(batch, 0..0, &inputs, &mut buf))?;
        }

        let limits = self.limits();
        // One budget for everything this plugin returns over the run, checked as each group's
        // values arrive: a plugin inside the per-call limits cannot multiply them by the number
        // of groups (the host's memory and the run database stay bounded).
        let mut budget = validate::OutputBudget::new(limits, &plugin.metadata);
        let mut check = |what: &str, v: Vec<crate::wit::MetricValue>| {
            // The per-call rules first (bad-output), then the run's budget (too-much-output).
            let r = validate::results(&plugin.metadata, v, limits).map_err(|m| {
                PluginFailure::new(
                    FailureKind::BadOutput,
                    &plugin.path,
                    format!("returned {m} ({what})"),
                )
            })?;
            budget.charge(&r).map_err(|m| {
                PluginFailure::new(
                    FailureKind::TooMuchOutput,
                    &plugin.path,
                    format!("returned {m} by the time it returned the values of {what}; nothing of it is stored"),
                )
            })?;
            Ok(r)
        };
        let mut scores = Scores::default();
        let v = job.finish(overall)?;
        scores.overall = check("the whole batch", v)?;
        for (cat, acc) in cat_acc {
            let v = job.finish(acc)?;
            let r = check(&format!("category {}", crate::text::preview(cat, 64)), v)?;
            scores.per_category.insert(cat.to_string(), r);
        }
        for (prompt, acc) in prompt_acc {
            let v = job.finish(acc)?;
            let r = check(&format!("prompt {prompt}"), v)?;
            scores.per_prompt.insert(prompt, r);
        }
        Ok(scores)
    }

    /// Check `params` with the plugin itself before any work depends on them: `begin(params)`
    /// in a fresh job (what `run` does before it loads a model, so that a bad value fails in
    /// a second instead of after the evaluation).
    pub fn check_params(
        &self,
        plugin: &LoadedPlugin,
        params: &[Param],
    ) -> Result<(), PluginFailure> {
        let mut job = Job::new(self, plugin)?;
        job.begin(params).map(drop)
    }

    /// One-shot `evaluate` of a whole batch in a fresh job (used by `plugins check` and tests).
    pub fn evaluate(
        &self,
        plugin: &LoadedPlugin,
        params: &[Param],
        batch: &RecordBatch,
    ) -> Result<Vec<MetricResult>, PluginFailure> {
        batch.check().map_err(|e| {
            PluginFailure::new(
                FailureKind::Io,
                &plugin.path,
                format!("host batch is inconsistent: {e}"),
            )
        })?;
        let mut job = Job::new(self, plugin)?;
        let mut buf = ProjectionBuf::default();
        let all = BatchRef::project(
            batch,
            0..batch.num_blocks(),
            &plugin.metadata.inputs,
            &mut buf,
        );
        let v = job.evaluate(params, all)?;
        let r = validate::results(&plugin.metadata, v, self.limits()).map_err(|m| {
            PluginFailure::new(
                FailureKind::BadOutput,
                &plugin.path,
                format!("returned {m}"),
            )
        })?;
        validate::OutputBudget::new(self.limits(), &plugin.metadata)
            .charge(&r)
            .map_err(|m| {
                PluginFailure::new(
                    FailureKind::TooMuchOutput,
                    &plugin.path,
                    format!("returned {m}"),
                )
            })?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_on_prompt_changes() {
        let mut b = RecordBatch::new(2, 1);
        b.prompt_index = vec![3, 3, 1, 1, 1, 3, 2];
        assert_eq!(
            prompt_runs(&b, 0..7),
            vec![(3, 0..2), (1, 2..5), (3, 5..6), (2, 6..7)]
        );
        assert_eq!(prompt_runs(&b, 1..4), vec![(3, 1..2), (1, 2..4)]);
        assert!(prompt_runs(&b, 4..4).is_empty());
    }
}
