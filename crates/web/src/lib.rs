//! draftlens web UI: run list, comparisons against a pinned baseline with paired bootstrap CIs,
//! charts, token-level drill-down, single-file HTML reports and idempotent import.
//!
//! Server-rendered HTML (maud) with a vendored chart library (uPlot 1.6.32, MIT); the same view
//! functions render the live pages and the static report. The URL is the state of every page.
//!
//! Entry points for the `draftlens` binary: [`serve`], [`compare_text`], [`compare_json`],
//! [`render_report`], [`import_bundle`], [`tokens_cmd`], and the clap structs in [`cli`].

pub mod analysis;
pub mod bundle;
pub mod cli;
pub mod compare;
#[cfg(feature = "demo")]
pub mod demo;
pub mod push;
pub mod qs;
pub mod report;
pub mod server;
pub mod stats;
pub(crate) mod viewmodel;
pub mod views;

pub use bundle::ImportSummary;
pub use report::ReportOptions;
pub use server::{app, app_bound, app_with, serve, serve_with, tokens_hint, ServeOptions};

use anyhow::Result;
use draftlens_results::store::{RunInfo, Store};
use std::path::Path;
use std::sync::Arc;

fn resolve_all(
    store: &Store,
    runs: &[String],
    baseline: Option<&str>,
) -> Result<(Vec<i64>, Option<i64>)> {
    let ids = runs
        .iter()
        .map(|r| compare::resolve_run(store, r))
        .collect::<Result<Vec<_>>>()?;
    let base = baseline
        .map(|b| compare::resolve_run(store, b))
        .transpose()?;
    Ok((ids, base))
}

fn comparison(
    store: &Store,
    runs: &[String],
    baseline: Option<&str>,
    charts: bool,
) -> Result<compare::Comparison> {
    let (ids, baseline) = resolve_all(store, runs, baseline)?;
    let stats_of = |r: &RunInfo| -> Result<Option<Arc<analysis::RunStats>>> {
        Ok(analysis::load_stats(store, r)?.map(Arc::new))
    };
    compare::compare(
        store,
        &ids,
        &compare::CompareOptions {
            baseline,
            charts,
            ..Default::default()
        },
        &stats_of,
    )
}

/// `draftlens compare` as text: runs are ids, uids or uid prefixes; the baseline defaults to
/// the pinned one if it is among them, else the first.
pub fn compare_text(store: &Store, runs: &[String], baseline: Option<&str>) -> Result<String> {
    Ok(compare::comparison_text(&comparison(
        store, runs, baseline, false,
    )?))
}

/// `draftlens compare` with `--where` / `--group-by` (docs/slices.md): the runs filtered by their
/// workload slice, compared as usual, then the slices section (text) or a `slices` key (JSON).
pub fn compare_sliced(store: &Store, a: &cli::CompareArgs) -> Result<()> {
    let (ids, baseline) = resolve_all(store, &a.runs, a.baseline.as_deref())?;
    let ids = compare::slices::filter_runs(store, &ids, &a.filters)?;
    if let Some(b) = baseline.filter(|b| !ids.contains(b)) {
        anyhow::bail!("--baseline run {b} is not among the runs --where keeps ({ids:?})");
    }
    let stats_of = |r: &RunInfo| -> Result<Option<Arc<analysis::RunStats>>> {
        Ok(analysis::load_stats(store, r)?.map(Arc::new))
    };
    let c = compare::compare(
        store,
        &ids,
        &compare::CompareOptions {
            baseline,
            charts: a.json,
            ..Default::default()
        },
        &stats_of,
    )?;
    let section = compare::slices::slice_section(&c, a.group_by);
    if a.json {
        let mut v = serde_json::to_value(&c)?;
        v["slices"] = serde_json::to_value(&section)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!(
            "{}{}",
            compare::comparison_text(&c),
            compare::slices::slice_text(&section)
        );
    }
    Ok(())
}

/// `draftlens compare --json`.
pub fn compare_json(
    store: &Store,
    runs: &[String],
    baseline: Option<&str>,
) -> Result<serde_json::Value> {
    Ok(serde_json::to_value(comparison(
        store, runs, baseline, true,
    )?)?)
}

/// A self-contained HTML report of runs (ids, uids or uid prefixes).
pub fn render_report(store: &Store, runs: &[String], opts: &ReportOptions) -> Result<String> {
    let (ids, _) = resolve_all(store, runs, None)?;
    report::render_report(store, &ids, opts)
}

/// Imports a report (.html) or bundle (.json) with the default size limit; idempotent, one
/// transaction.
pub fn import_bundle(store: &Store, path: &Path) -> Result<ImportSummary> {
    bundle::import_file(store, path, bundle::DEFAULT_MAX_IMPORT_BYTES)
}

/// `draftlens tokens ...`; returns what to print.
pub fn tokens_cmd(store: &Store, cmd: &cli::TokensCommand) -> Result<String> {
    cli::tokens(store, cmd)
}
