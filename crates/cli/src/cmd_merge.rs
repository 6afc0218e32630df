//! `draftlens merge`: the shard runs of one evaluation into one run (the logic and its
//! guarantees are in `draftlens_results::merge`, docs/scale-out.md §3). This file opens the databases,
//! loads the plugins the shards were scored with (before anything is written) and re-scores the
//! merged run with them.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use draftlens_plugin_host::{
    builtins, score_stored_run_prepared, PluginRequest, PreparedPlugin, Runtime, StoredScoring,
};
use draftlens_results::merge::{self, MergeOutcome, Source};
use draftlens_results::store::{PluginProvenance, Store};
use serde::Serialize;

use crate::cmd_plugins::SandboxArgs;
use crate::common::Global;

#[derive(Args)]
pub struct MergeArgs {
    /// Databases holding the shard runs (several files, or one) [default: --db itself].
    pub sources: Vec<PathBuf>,
    /// Database the merged run is written to (created when missing; may be one of the sources).
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Merge only the evaluation whose identity (sha256) starts with this, when the sources hold
    /// shards of several.
    #[arg(long, value_name = "PREFIX")]
    pub identity: Option<String>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

#[derive(Serialize)]
struct Out<'a> {
    #[serde(flatten)]
    merge: &'a MergeOutcome,
    identity: &'a str,
    /// Failed or unfinished shard runs left out because their shard has a complete run.
    superseded: &'a [String],
    /// Plugin values re-scored on the merged records (absent when the shards had none, or the
    /// merged run had them already).
    #[serde(skip_serializing_if = "Option::is_none")]
    plugins: Option<&'a StoredScoring>,
    /// The merged run's run-level metrics, keyed source → name as `run --json` and `runs show
    /// --json` give them (docs/json.md).
    metrics: crate::metrics_json::BySource,
    schema_version: u32,
}

/// The plugin of a provenance row, loaded: a built-in by name, another from its file, which must
/// still be the file that scored the shards (same sha256).
fn load_plugin(runtime: &Runtime, p: &PluginProvenance) -> Result<PreparedPlugin> {
    let mut req = if p.builtin {
        let name = p.file.strip_prefix("builtin:").unwrap_or(&p.source);
        let b = builtins::find(name).with_context(|| {
            format!("the shards were scored with the built-in plugin {name}, which this draftlens lacks")
        })?;
        PluginRequest::builtin(b)
    } else {
        PluginRequest::new(&p.file)
    };
    req.params = serde_json::from_str(&p.params_json).with_context(|| {
        format!(
            "plugin {}: bad stored parameters {}",
            p.source, p.params_json
        )
    })?;
    let prepared = PreparedPlugin::load(runtime, req);
    match &prepared.plugin {
        Err(f) => bail!(
            "cannot merge: the shards were scored with plugin {} from {}, which does not load now: {}",
            p.source,
            p.file,
            f.message
        ),
        Ok(l) if !p.sha256.is_empty() && l.sha256 != p.sha256 => bail!(
            "cannot merge: the shards were scored with plugin {} of sha256 {}, but {} is now {}; \
             rescore the shards with the same file first",
            p.source,
            p.sha256,
            p.file,
            l.sha256
        ),
        Ok(_) => Ok(prepared),
    }
}

/// The plugin host for the merges a team server does (`draftlens serve`, docs/scale-out.md §9):
/// the shards' plugins loaded as [`load_plugin`] loads them for `draftlens merge`, run with the
/// default sandbox limits.
#[derive(Debug, Default)]
pub struct ServerMergeScorer;

impl merge::PluginScorer for ServerMergeScorer {
    fn check(&self, plugins: &[PluginProvenance]) -> Result<()> {
        let rt = SandboxArgs::default().runtime()?;
        for p in plugins {
            load_plugin(&rt, p)?;
        }
        Ok(())
    }

    fn score(&self, store: &Store, run: i64, plugins: &[PluginProvenance]) -> Result<Vec<String>> {
        let rt = SandboxArgs::default().runtime()?;
        let prepared = plugins
            .iter()
            .map(|p| load_plugin(&rt, p))
            .collect::<Result<Vec<_>>>()?;
        let s = score_stored_run_prepared(&rt, store, run, &prepared)?;
        Ok(s.plugins
            .iter()
            .filter(|p| p.failure.is_some())
            .map(|p| p.plugin.clone())
            .collect())
    }
}

pub fn run(g: &Global, a: MergeArgs) -> Result<()> {
    let paths = if a.sources.is_empty() {
        vec![a.db.clone()]
    } else {
        a.sources.clone()
    };
    // Store::open would create a missing file: say it is missing instead.
    for p in &paths {
        if !p.is_file() {
            bail!("{}: no such run database", p.display());
        }
    }
    let stores: Vec<Store> = paths
        .iter()
        .map(|p| Store::open(p))
        .collect::<Result<_>>()?;
    let sources: Vec<Source> = paths
        .iter()
        .zip(&stores)
        .map(|(p, store)| Source {
            name: p.display().to_string(),
            store,
        })
        .collect();
    // Every check, and every plugin loaded, before the destination is opened or written.
    let plan = merge::plan(&sources, a.identity.as_deref())?;
    let runtime = if plan.plugins.is_empty() {
        None
    } else {
        Some(a.sandbox.runtime()?)
    };
    let plugins: Vec<PreparedPlugin> = match &runtime {
        Some(rt) => plan
            .plugins
            .iter()
            .map(|p| load_plugin(rt, p))
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    let dest = Store::open(&a.db)?;
    let out = merge::execute(&sources, &plan, &dest)?;
    // Re-score unless the merged run already holds exactly these plugins' values (a second merge).
    let scored = match &runtime {
        Some(rt) if out.blocks > 0 && merge::needs_rescore(&dest, out.run_id, &plan.plugins)? => {
            let s = score_stored_run_prepared(rt, &dest, out.run_id, &plugins)?;
            crate::cmd_plugins::warn_stored(&s, 0);
            Some(s)
        }
        _ => None,
    };
    let metrics = merge::run_metrics(&dest, out.run_id)?;
    g.emit(
        &Out {
            merge: &out,
            identity: &plan.identity,
            superseded: &plan.superseded,
            plugins: scored.as_ref(),
            metrics: crate::metrics_json::by_source(&metrics),
            schema_version: crate::metrics_json::SCHEMA_VERSION,
        },
        || {
            let mut o = if out.created {
                format!(
                    "merged {} shards into run {} · {} ({} prompts, {} blocks, {:.2}s)\n",
                    out.shards, out.run_id, out.name, out.prompts, out.blocks, out.seconds
                )
            } else {
                format!(
                    "already merged: run {} · {} holds these {} shards (nothing written)\n",
                    out.run_id, out.name, out.shards
                )
            };
            o += &format!("  identity {}  uid {}\n", plan.identity, out.uid);
            for s in &plan.superseded {
                o += &format!("  left out (its shard has a complete run): {s}\n");
            }
            for m in metrics.iter().filter(|m| m.name != "accept_hist") {
                o += &format!("  {:<16} {:<26} {:.4}\n", m.source, m.name, m.value);
            }
            if let Some(s) = &scored {
                o += &crate::cmd_plugins::render_stored(s);
            }
            o += &format!("stored in {}\n", a.db.display());
            o
        },
    )?;
    if let Some(s) = &scored {
        let failed: Vec<&str> = s
            .plugins
            .iter()
            .filter(|p| p.failure.is_some())
            .map(|p| p.plugin.as_str())
            .collect();
        if !failed.is_empty() {
            bail!(
                "the merged run {} is stored, but re-scoring failed for plugins {} (recorded with the run)",
                out.run_id,
                failed.join(", ")
            );
        }
    }
    Ok(())
}
