//! `draftlens rescore RUN --plugin …`: score the stored records of a run with metric plugins and
//! add their metrics to it (no model is loaded), and the plugin step of `draftlens run --plugin`.
//!
//! Both go through [`score_stored_run`]: per-prompt and per-category values, one transaction per
//! plugin that replaces the rows an earlier scoring by the same plugin left, and every failed
//! plugin recorded with the run while the others' metrics are stored.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use draftlens_engine::drafter::run::RunOutcome;
use draftlens_plugin_host::{score_stored_run_prepared, PreparedPlugin, Runtime, StoredScoring};
use draftlens_results::store::{RunStatus, Store};
use serde::Serialize;

use crate::cmd_plugins::{render_stored, warn_stored, PluginArgs};
use crate::common::Global;

#[derive(Args)]
pub struct RescoreArgs {
    /// The run: its id, its uid or a unique uid prefix (as `draftlens compare` accepts).
    pub run: String,
    /// SQLite database of runs.
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
    #[command(flatten)]
    pub plugins: PluginArgs,
}

/// Plugins resolved, loaded once and their parameters checked (by the plugins themselves),
/// ready to score runs. Built before `run` loads any model, so a misspelt plugin or a bad
/// parameter value fails in a second, not after the evaluation.
pub struct Prepared {
    runtime: Runtime,
    plugins: Vec<PreparedPlugin>,
}

/// The user's log level (`-v`: 1, `-vv`: 2), as the logging set up from it says.
fn verbosity() -> u8 {
    if tracing::enabled!(tracing::Level::DEBUG) {
        2
    } else if tracing::enabled!(tracing::Level::INFO) {
        1
    } else {
        0
    }
}

impl Prepared {
    /// None when no `--plugin` is given.
    pub fn new(args: &PluginArgs) -> Result<Option<Prepared>> {
        if args.plugins.is_empty() {
            if let Some(p) = args.params.first() {
                bail!("--param {p}: no --plugin is given");
            }
            return Ok(None);
        }
        let runtime = args.sandbox.runtime()?;
        let plugins = args.prepare(&runtime)?;
        Ok(Some(Prepared { runtime, plugins }))
    }

    /// Score one stored run, store the results, and print the warnings (failed plugins, what
    /// plugins logged as warnings) on stderr.
    pub fn score(&self, store: &Store, run: i64) -> Result<StoredScoring> {
        let scored = score_stored_run_prepared(&self.runtime, store, run, &self.plugins)?;
        warn_stored(&scored, verbosity());
        Ok(scored)
    }
}

/// The plugin step of `run`: score every run just stored in `db` (nothing when no plugin was
/// given). A failing plugin is a warning, never an error: the run is complete and stored.
pub fn score_runs(
    plugins: Option<&Prepared>,
    db: &Path,
    runs: impl IntoIterator<Item = i64>,
) -> Result<Vec<StoredScoring>> {
    let Some(p) = plugins else {
        return Ok(Vec::new());
    };
    let store = Store::open(db)?;
    runs.into_iter().map(|run| p.score(&store, run)).collect()
}

/// A run's outcome with what its plugins stored, for `run --json` (the run's own fields stay
/// at the top level; `plugins` is absent when no plugin was given).
#[derive(Serialize)]
pub struct RunWithPlugins<'a> {
    #[serde(flatten)]
    pub run: &'a RunOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugins: Option<&'a StoredScoring>,
}

pub fn with_plugins<'a>(
    outs: &'a [RunOutcome],
    scored: &'a [StoredScoring],
) -> Vec<RunWithPlugins<'a>> {
    outs.iter()
        .map(|run| RunWithPlugins {
            run,
            plugins: scored.iter().find(|s| s.run == run.run_id),
        })
        .collect()
}

#[derive(Serialize)]
struct Rescored<'a> {
    uid: &'a str,
    name: &'a str,
    #[serde(flatten)]
    scoring: &'a StoredScoring,
}

pub fn run(g: &Global, a: RescoreArgs) -> Result<()> {
    if a.plugins.plugins.is_empty() {
        bail!(
            "rescore needs at least one --plugin (a name from the plugin folders, or a .wasm file)"
        );
    }
    // Store::open would create a missing database: say it is missing instead.
    if !a.db.is_file() {
        bail!(
            "{}: no such run database (pass --db with the database the run is stored in)",
            a.db.display()
        );
    }
    let store = Store::open(&a.db)?;
    let id = draftlens_web::compare::resolve_run(&store, &a.run)?;
    let detail = store
        .run(id)?
        .with_context(|| format!("{}: no run {}", a.db.display(), a.run))?;
    let info = &detail.run;
    match info.status {
        RunStatus::Running => bail!(
            "{}: run {id} ({}) has not finished (it is still running, or its process died): its records may \
             be incomplete, so it is not rescored",
            a.db.display(),
            info.name
        ),
        RunStatus::Failed => eprintln!(
            "warning: run {id} ({}) failed: scoring the records it stored before it failed",
            info.name
        ),
        RunStatus::Complete => {}
    }
    let prepared = Prepared::new(&a.plugins)?.expect("at least one --plugin");
    let scored = prepared
        .score(&store, id)
        .with_context(|| format!("rescoring run {id} ({})", info.name))?;
    g.emit(
        &Rescored {
            uid: &info.uid,
            name: &info.name,
            scoring: &scored,
        },
        || {
            format!(
                "run {id} · {} ({})\n{}",
                info.name,
                info.uid,
                render_stored(&scored)
            )
        },
    )?;
    let failed: Vec<String> = scored
        .plugins
        .iter()
        .filter_map(|p| {
            p.failure
                .as_ref()
                .map(|f| format!("{} [{}]", p.plugin, f.kind))
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} plugins failed on run {id}: {} (recorded with the run; the other plugins' metrics are stored)",
            failed.len(),
            scored.plugins.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
