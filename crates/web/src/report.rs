//! Single-file HTML reports: the same views as the live pages, with CSS, chart code and data
//! inlined, a Content-Security-Policy that forbids every network request, and the versioned
//! JSON bundle embedded so that `draftlens import` (or the upload form) can load it.

use crate::analysis::RunStats;
use crate::bundle::{export_bundle, SCRIPT_ID};
use crate::compare::{self, CompareOptions, StatsCache};
use crate::qs::Query;
use crate::viewmodel::{categories_of, headline_of, prompt_rows};
use crate::views::{self, safe_json, Ctx};
use anyhow::{Context, Result};
use draftlens_results::store::{MetricScope, RunInfo, Store};
use std::sync::Arc;

#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    pub baseline: Option<i64>,
    /// Embed the records too (bigger file; an importer gets the token drill-down).
    pub with_records: bool,
    pub title: Option<String>,
}

/// Renders a report of `runs` (one run: the run page; several: the comparison).
pub fn render_report(store: &Store, runs: &[i64], opts: &ReportOptions) -> Result<String> {
    let stats_of = |r: &RunInfo| -> Result<Option<Arc<RunStats>>> {
        Ok(crate::analysis::load_stats(store, r)?.map(Arc::new))
    };
    render_report_with(store, runs, opts, &stats_of)
}

pub fn render_report_with(
    store: &Store,
    runs: &[i64],
    opts: &ReportOptions,
    stats_of: &StatsCache<'_>,
) -> Result<String> {
    let bundle = export_bundle(store, runs, opts.with_records)?;
    let ctx = Ctx::report();
    let page = if runs.len() == 1 {
        let detail = store.run(runs[0])?.with_context(|| {
            format!("{}: run {} does not exist", store.path().display(), runs[0])
        })?;
        let stats = stats_of(&detail.run)?;
        let metrics = store.metrics_in_scope(detail.run.id, &MetricScope::Run)?;
        let metas = store.prompt_metas(detail.run.id)?;
        let prompts = prompt_rows(&metas, stats.as_deref());
        let curves = stats.as_ref().map(|s| compare::RunCurves {
            accuracy: crate::analysis::position_curve(s, false, 400, &detail.run.uid),
            acceptance: crate::analysis::position_curve(s, true, 400, &detail.run.uid),
            hist_replayed: crate::analysis::accept_histogram(s, true),
            hist_uniform: crate::analysis::accept_histogram(s, false),
        });
        let q = Query::default();
        let v = views::run::RunView {
            detail: &detail,
            headline: stats.as_deref().map(headline_of),
            curves: curves.as_ref(),
            metrics: &metrics,
            categories: &stats.as_deref().map(categories_of).unwrap_or_default(),
            prompts: &prompts,
            prompt_total: prompts.len(),
            offset: 0,
            per_page: prompts.len().max(1),
            query: &q,
            is_baseline: false,
            series_runs: 0,
        };
        views::run::render(&ctx, &v)
    } else {
        let c = compare::compare(
            store,
            runs,
            &CompareOptions {
                baseline: opts.baseline,
                ..Default::default()
            },
            stats_of,
        )?;
        views::compare::render(&ctx, &c, &Query::default())
    };
    let mut html = page.into_string();
    // The bundle goes right before </body>; safe_json escapes every '<', so it cannot end early.
    let script = format!(
        "<script type=\"application/json\" id=\"{SCRIPT_ID}\">{}</script>",
        safe_json(&bundle)
    );
    match html.rfind("</body>") {
        Some(at) => html.insert_str(at, &script),
        None => html.push_str(&script),
    }
    if let Some(t) = &opts.title {
        if let (Some(a), Some(b)) = (html.find("<title>"), html.find("</title>")) {
            let escaped = maud::html! { (t) }.into_string();
            html.replace_range(a + 7..b, &escaped);
        }
    }
    Ok(html)
}
