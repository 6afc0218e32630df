//! The page handlers: one async function per route, each reading the store on a blocking thread
//! and rendering a view with the view models of `crate::viewmodel`.

use super::*;

pub(super) const PER_PAGE: usize = 50;
/// Most metric columns the run list shows at once.
pub(super) const MAX_COLUMNS: usize = 12;

/// The ids of the runs whose workload slice matches the run list's `slice_FACET=VALUE`
/// parameters (docs/slices.md); `None` when it asks for no slice facet.
fn slice_ids(store: &Store, q: &Query) -> anyhow::Result<Option<Vec<i64>>> {
    let filters: Vec<draftlens_results::slice::FacetFilter> = draftlens_results::slice::FACETS
        .iter()
        .filter_map(|f| {
            let value = q.get(&format!("slice_{f}"))?;
            Some(draftlens_results::slice::FacetFilter {
                facet: f,
                value: value.to_string(),
            })
        })
        .collect();
    if filters.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        store
            .run_slices()?
            .into_iter()
            .filter(|(_, slice)| filters.iter().all(|f| f.matches(slice)))
            .map(|(id, _)| id)
            .collect(),
    ))
}

/// Each slice facet with the values the stored runs show, for the run list's facet menus.
fn slice_menus(store: &Store) -> anyhow::Result<Vec<(&'static str, Vec<String>)>> {
    let slices = store.run_slices()?;
    Ok(draftlens_results::slice::FACETS
        .iter()
        .map(|f| {
            let mut values: Vec<String> = slices.iter().map(|(_, s)| s.facet(f)).collect();
            values.sort();
            values.dedup();
            (*f, values)
        })
        .collect())
}

pub(super) async fn runs_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Runs);
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref()).without(&["token"]);
        let (facets, keys) = s.menus()?;
        // Asked columns: known metrics only, each once, at most MAX_COLUMNS (a long `cols=`
        // query must not multiply into a huge page: every header link repeats the query).
        let asked: Vec<MetricKey> = {
            let mut out: Vec<MetricKey> = Vec::new();
            for k in q
                .all("cols")
                .iter()
                .flat_map(|v| v.split(','))
                .filter_map(|k| k.trim().parse::<MetricKey>().ok())
            {
                if out.len() < MAX_COLUMNS && !out.contains(&k) && keys.iter().any(|x| x.0 == k)
                {
                    out.push(k);
                }
            }
            out
        };
        let q = if q.all("cols").is_empty() {
            q
        } else {
            let canonical = asked
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(",");
            q.without(&["cols"]).with("cols", Some(&canonical))
        };
        // The share form saves the canonical state, not the raw query.
        let mut ctx = ctx;
        ctx.current = format!("/{}", q.to_string_with_qmark());
        let columns: Vec<(MetricKey, bool)> = {
            let chosen = if asked.is_empty() {
                default_columns(&keys)
            } else {
                asked
            };
            chosen
                .into_iter()
                .map(|k| {
                    let hib = keys.iter().find(|x| x.0 == k).map(|x| x.2).unwrap_or(true);
                    (k, hib)
                })
                .collect()
        };
        let page = q.get_usize("page").unwrap_or(1).max(1);
        let Some(offset) = (page - 1)
            .checked_mul(PER_PAGE)
            .filter(|&o| o <= i64::MAX as usize / 2)
        else {
            return Ok(Out::NotFound(format!("There is no page {page} of the run list.")));
        };
        let sort_key = q.get("sort").unwrap_or("created");
        let sort = match sort_key {
            "name" => RunSort::Name,
            "step" => RunSort::Step,
            "status" => RunSort::Status,
            s if s.starts_with('m') => match s[1..].parse::<usize>() {
                Ok(i) if i < columns.len() => RunSort::Metric(i),
                _ => RunSort::Created,
            },
            _ => RunSort::Created,
        };
        let filter = RunFilter {
            text: q.get("q").map(String::from),
            target: q.get("target").map(String::from),
            drafter: q.get("drafter").map(String::from),
            step: q.get_i64("step"),
            prompt_set: q.get("prompts").map(String::from),
            backend: q.get("backend").map(String::from),
            mode: q.get("mode").and_then(|m| m.parse().ok()),
            status: q.get("status").and_then(|m| m.parse().ok()),
            ids: slice_ids(&s.store, &q)?,
            sort,
            descending: q.get("dir").map(|d| d != "asc").unwrap_or(true),
            offset,
            limit: PER_PAGE,
            metric_columns: columns.iter().map(|c| c.0.clone()).collect(),
        };
        let (rows, total) = s.store.runs(&filter)?;
        if rows.is_empty() && page > 1 {
            let pages = total.div_ceil(PER_PAGE).max(1);
            return Ok(Out::NotFound(format!(
                "There is no page {page} of the run list: it has {pages} page{} of {PER_PAGE} runs.",
                if pages == 1 { "" } else { "s" }
            )));
        }
        let baselines: Vec<i64> = s.store.baselines()?.into_iter().map(|b| b.1).collect();
        let flash = q.get("deleted").map(|d| format!("Run {d} was deleted."));
        let flash = flash.or_else(|| q.get("imported").map(|d| d.to_string()));
        let v = views::runs::RunsView {
            rows: &rows,
            total,
            query: &q,
            facets: &facets,
            columns: &columns,
            all_keys: &keys,
            offset: filter.offset,
            per_page: PER_PAGE,
            baselines: &baselines,
            flash: flash.as_deref(),
            slice_menus: &slice_menus(&s.store)?,
        };
        Ok(Out::Page(html(views::runs::render(&ctx, &v))))
    })
    .await;
    respond(&st, r).await
}

pub(super) async fn run_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    AxPath(id): AxPath<String>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Runs);
    let s = st.clone();
    let r = blocking(&st, move || {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(Out::NotFound(format!("There is no run {id:?}.")));
        };
        let Some(detail) = s.store.run(id)? else {
            return Ok(Out::NotFound(format!("There is no run {id}.")));
        };
        let q = Query::parse(raw.as_deref());
        let stats = s.stats_for(&detail.run)?;
        let metrics = s.store.metrics_in_scope(id, &MetricScope::Run)?;
        let metas = s.store.prompt_metas(id)?;
        let headline = stats.as_ref().map(|st| headline_of(st));
        let curves = stats.as_ref().map(|st| curves_of(st, &detail.run.uid));
        let categories = stats
            .as_ref()
            .map(|st| categories_of(st))
            .unwrap_or_default();
        let mut prompts = prompt_rows(&metas, stats.as_deref());
        match q.get("psort") {
            Some("tau") => prompts.sort_by(|a, b| cmp_opt(a.tau_replayed, b.tau_replayed)),
            Some("tauu") => prompts.sort_by(|a, b| cmp_opt(a.tau_uniform, b.tau_uniform)),
            Some("acc") => prompts.sort_by(|a, b| cmp_opt(a.flat_accuracy, b.flat_accuracy)),
            _ => {}
        }
        let total = prompts.len();
        let page = q.get_usize("ppage").unwrap_or(1).max(1);
        let offset = ((page - 1) * PER_PAGE).min(total);
        let shown: Vec<_> = prompts.into_iter().skip(offset).take(PER_PAGE).collect();
        let is_baseline = s.store.baselines()?.iter().any(|b| b.1 == id);
        let series_runs = if detail.run.drafter_series.is_empty() {
            0
        } else {
            s.store.series_runs(&detail.run.drafter_series)?.len()
        };
        let v = views::run::RunView {
            detail: &detail,
            headline,
            curves: curves.as_ref(),
            metrics: &metrics,
            categories: &categories,
            prompts: &shown,
            prompt_total: total,
            offset,
            per_page: PER_PAGE,
            query: &q,
            is_baseline,
            series_runs,
        };
        Ok(Out::Page(html(views::run::render(&ctx, &v))))
    })
    .await;
    respond(&st, r).await
}

pub(super) async fn prompt_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    AxPath((id, idx)): AxPath<(String, String)>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Runs);
    let s = st.clone();
    let r = blocking(&st, move || {
        let (Ok(id), Ok(idx)) = (id.parse::<i64>(), idx.parse::<u32>()) else {
            return Ok(Out::NotFound("There is no such run or prompt.".into()));
        };
        let Some(detail) = s.store.run(id)? else {
            return Ok(Out::NotFound(format!("There is no run {id}.")));
        };
        let Some(prompt) = s.store.prompt(id, idx)? else {
            return Ok(Out::NotFound(format!("Run {id} has no prompt {idx}.")));
        };
        let records = s.store.prompt_records(id, idx)?;
        let vocab = match &detail.run.tokenizer_sha256 {
            Some(sha) => s.vocab_for(sha)?,
            None => None,
        };
        let metas = s.store.prompt_metas(id)?;
        let pos = metas.iter().position(|m| m.index == idx);
        let prev = pos.and_then(|p| p.checked_sub(1)).map(|p| metas[p].index);
        let next = pos.and_then(|p| metas.get(p + 1)).map(|m| m.index);
        let q = Query::parse(raw.as_deref());
        let v = views::prompt::PromptView {
            run: &detail.run,
            prompt: &prompt,
            records: &records,
            vocab: vocab.as_deref().map(|v| v.as_slice()),
            selected: q.get("anchor").and_then(|a| a.parse().ok()),
            prev,
            next,
        };
        Ok(Out::Page(html(views::prompt::render(&ctx, &v))))
    })
    .await;
    respond(&st, r).await
}

/// Most runs one comparison or report takes.
pub(super) const MAX_COMPARE: usize = 12;

/// Run ids of a compare URL: `runs=1,2` and/or repeated `run=` (the list's checkboxes). A
/// malformed request (none, too many, an ambiguous uid prefix) is `Out::Bad` (400); a run that
/// does not exist is `Out::NotFound` (404).
pub(super) fn compare_ids(store: &Store, q: &Query) -> Result<std::result::Result<Vec<i64>, Out>> {
    let mut refs = q.list("runs");
    refs.extend(q.all("run").iter().map(|s| s.to_string()));
    if refs.is_empty() {
        return Ok(Err(Out::Bad("Select at least two runs to compare.".into())));
    }
    if refs.len() > MAX_COMPARE {
        return Ok(Err(Out::Bad(format!(
            "Compare at most {MAX_COMPARE} runs at once ({} were given).",
            refs.len()
        ))));
    }
    let mut ids = Vec::new();
    for r in refs {
        match resolve_ref(store, &r)? {
            Ok(id) if !ids.contains(&id) => ids.push(id),
            Ok(_) => {}
            Err(out) => return Ok(Err(out)),
        }
    }
    Ok(Ok(ids))
}

/// One run reference of a URL: an id, a uid or a unique uid prefix.
pub(super) fn resolve_ref(store: &Store, r: &str) -> Result<std::result::Result<i64, Out>> {
    Ok(match compare::resolve(store, r)? {
        compare::Resolved::Run(id) => Ok(id),
        compare::Resolved::Ambiguous(n) => Err(Out::Bad(format!(
            "The run prefix {r:?} is ambiguous: it starts {n} run uids. Give more characters."
        ))),
        compare::Resolved::Missing => Err(Out::NotFound(format!("There is no run {r:?}."))),
    })
}

/// The `baseline=` of a compare or report URL: one of `ids`, else 400.
pub(super) fn baseline_of(
    store: &Store,
    q: &Query,
    ids: &[i64],
) -> Result<std::result::Result<Option<i64>, Out>> {
    let Some(b) = q.get("baseline") else {
        return Ok(Ok(None));
    };
    Ok(match resolve_ref(store, b)? {
        Ok(id) if ids.contains(&id) => Ok(Some(id)),
        Ok(_) | Err(Out::NotFound(_)) => Err(Out::Bad(format!(
            "The baseline {b:?} is not one of the compared runs."
        ))),
        Err(out) => Err(out),
    })
}

pub(super) async fn compare_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = Query::parse(raw.as_deref()).without(&["token"]);
    // Canonical URL: checkbox submissions become runs=1,2.
    if !q.all("run").is_empty() {
        let mut refs = q.list("runs");
        refs.extend(q.all("run").iter().map(|s| s.to_string()));
        let clean = q.without(&["run"]).with("runs", Some(&refs.join(",")));
        return Redirect::to(&format!("/compare{}", clean.to_string_with_qmark())).into_response();
    }
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Compare);
    let s = st.clone();
    let r = blocking(&st, move || {
        let ids = match compare_ids(&s.store, &q)? {
            Ok(ids) => ids,
            Err(out) => return Ok(out),
        };
        if ids.len() == 1 && q.get("format") != Some("json") {
            return Ok(Out::Page(
                Redirect::to(&format!("/runs/{}", ids[0])).into_response(),
            ));
        }
        let baseline = match baseline_of(&s.store, &q, &ids)? {
            Ok(b) => b,
            Err(out) => return Ok(out),
        };
        let opts = CompareOptions {
            baseline,
            ..Default::default()
        };
        let c = s.compare_cached(&ids, &opts)?;
        if q.get("format") == Some("json") {
            // \u-escaped '<' too: harmless for JSON readers, inert if anything sniffs it as HTML.
            return Ok(Out::Page(
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    views::safe_json(&*c),
                )
                    .into_response(),
            ));
        }
        Ok(Out::Page(html(views::compare::render(&ctx, &c, &q))))
    })
    .await;
    respond(&st, r).await
}

pub(super) async fn history_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::History);
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref());
        let (facets, _) = s.menus()?;
        let mode: RunMode = q
            .get("mode")
            .and_then(|m| m.parse().ok())
            .unwrap_or(RunMode::Deployment);
        // Default series: the one with the most runs.
        let series = match q.get("series") {
            Some(x) => Some(x.to_string()),
            None => {
                let mut best: Option<(usize, String)> = None;
                for d in facets.drafters.iter() {
                    let n = s
                        .store
                        .runs(&RunFilter {
                            drafter: Some(d.clone()),
                            limit: 1,
                            ..Default::default()
                        })?
                        .1;
                    if best.as_ref().map(|b| n > b.0).unwrap_or(true) {
                        best = Some((n, d.clone()));
                    }
                }
                best.map(|b| b.1)
            }
        };
        let stats_of = |r: &RunInfo| s.stats_for(r);
        let (history, error) = match &series {
            Some(name) => match compare::history(&s.store, name, mode, q.get("prompts"), &stats_of)
            {
                Ok(h) => (Some(h), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            },
            None => (
                None,
                Some("No drafter series yet: runs with a checkpoint step appear here.".into()),
            ),
        };
        let v = views::history::HistoryView {
            history: history.as_ref(),
            series: &facets.drafters,
            selected: series.as_deref(),
            mode: mode.as_str(),
            error,
        };
        Ok(Out::Page(html(views::history::render(&ctx, &v))))
    })
    .await;
    respond(&st, r).await
}

pub(super) async fn import_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Import);
    html(misc::import_form(&ctx, st.max_upload >> 20, None))
}

pub(super) async fn import_upload(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
    mut mp: Multipart,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Import);
    let mut file: Option<(String, Vec<u8>)> = None;
    loop {
        match mp.next_field().await {
            Ok(Some(f)) => {
                if f.name() == Some("file") {
                    let name = f.file_name().unwrap_or("upload").to_string();
                    match f.bytes().await {
                        Ok(b) => file = Some((name, b.to_vec())),
                        Err(e) => {
                            let msg = format!(
                                "upload failed: {e} (the limit is {} MiB)",
                                st.max_upload >> 20
                            );
                            return (
                                StatusCode::PAYLOAD_TOO_LARGE,
                                html(misc::import_form(&ctx, st.max_upload >> 20, Some(Err(msg)))),
                            )
                                .into_response();
                        }
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                let msg = format!(
                    "upload failed: {e} (the limit is {} MiB)",
                    st.max_upload >> 20
                );
                return (
                    StatusCode::BAD_REQUEST,
                    html(misc::import_form(&ctx, st.max_upload >> 20, Some(Err(msg)))),
                )
                    .into_response();
            }
        }
    }
    let Some((name, bytes)) = file else {
        return (
            StatusCode::BAD_REQUEST,
            html(misc::import_form(
                &ctx,
                st.max_upload >> 20,
                Some(Err("no file was uploaded".into())),
            )),
        )
            .into_response();
    };
    // Only the base name is kept (it becomes the runs' origin).
    let name: String = name
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or("upload")
        .chars()
        .take(200)
        .collect();
    let s = st.clone();
    let max = st.max_upload;
    let r = blocking(&st, move || {
        import_bytes(&s.store, &name, &name, &bytes, max)
    })
    .await;
    st.invalidate();
    match r {
        Ok(summary) => html(misc::import_form(
            &ctx,
            st.max_upload >> 20,
            Some(Ok(summary.to_string())),
        )),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            html(misc::import_form(
                &ctx,
                st.max_upload >> 20,
                Some(Err(format!("{e:#}"))),
            )),
        )
            .into_response(),
    }
}

pub(super) async fn report_download(
    State(st): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Response {
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref());
        let ids = match compare_ids(&s.store, &q)? {
            Ok(ids) => ids,
            Err(out) => return Ok(out),
        };
        let baseline = match baseline_of(&s.store, &q, &ids)? {
            Ok(b) => b,
            Err(out) => return Ok(out),
        };
        let opts = crate::report::ReportOptions {
            baseline,
            with_records: q.get("records") == Some("1"),
            title: None,
        };
        let stats_of = |r: &RunInfo| s.stats_for(r);
        let doc = crate::report::render_report_with(&s.store, &ids, &opts, &stats_of)?;
        let name = format!(
            "draftlens-report-{}.html",
            ids.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join("-")
        );
        Ok(Out::Page(
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
                    (
                        header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"{name}\""),
                    ),
                ],
                doc,
            )
                .into_response(),
        ))
    })
    .await;
    respond(&st, r).await
}

pub(super) async fn bundle_download(
    State(st): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Response {
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref());
        let ids = match compare_ids(&s.store, &q)? {
            Ok(ids) => ids,
            Err(out) => return Ok(out),
        };
        let b = crate::bundle::export_bundle(&s.store, &ids, q.get("records") == Some("1"))?;
        Ok(Out::Page(
            (
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (
                        header::CONTENT_DISPOSITION,
                        "attachment; filename=\"draftlens-bundle.json\"",
                    ),
                ],
                views::safe_json(&b),
            )
                .into_response(),
        ))
    })
    .await;
    respond(&st, r).await
}

#[derive(serde::Deserialize)]
pub(super) struct ShareForm {
    state: String,
}

/// A view state worth saving: a local GET page, not a redirect elsewhere.
pub(super) fn valid_state(s: &str) -> bool {
    s.len() <= 4000
        && s.starts_with('/')
        && !s.starts_with("//")
        && !s.contains('\\')
        && ["/?", "/runs/", "/compare", "/history"]
            .iter()
            .any(|p| s == "/" || s.starts_with(p))
        && s.parse::<Uri>().is_ok()
}

pub(super) async fn share_create(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
    headers: HeaderMap,
    Form(f): Form<ShareForm>,
) -> Response {
    if !valid_state(&f.state) {
        return bad_request(&st, "That view cannot be shared.");
    }
    let s = st.clone();
    let state = f.state.clone();
    match blocking(&st, move || s.store.create_share(&state)).await {
        Ok(id) => {
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            let url = format!("http://{host}/s/{id}");
            let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::None);
            html(misc::shared(&ctx, &url, &f.state))
        }
        Err(e) => server_error(&st, &e),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct BaselineForm {
    run: i64,
    unpin: Option<String>,
}

pub(super) async fn baseline_pin(
    State(st): State<Arc<AppState>>,
    Form(f): Form<BaselineForm>,
) -> Response {
    let s = st.clone();
    let r = blocking(&st, move || {
        let Some(d) = s.store.run(f.run)? else {
            return Ok(Out::NotFound(format!("There is no run {}.", f.run)));
        };
        // One pinned baseline per (target, prompt set): comparisons of those runs default to it.
        let scope = format!(
            "target={};prompts={}",
            d.run.target_sha256, d.run.prompt_set_sha256
        );
        if f.unpin.is_some() {
            s.store.unpin_baseline(&scope)?;
        } else {
            s.store.pin_baseline(&scope, f.run)?;
        }
        Ok(Out::Page(
            Redirect::to(&format!("/runs/{}", f.run)).into_response(),
        ))
    })
    .await;
    respond(&st, r).await
}

pub(super) async fn delete_run(
    State(st): State<Arc<AppState>>,
    AxPath(id): AxPath<String>,
) -> Response {
    let s = st.clone();
    let r = blocking(&st, move || {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(Out::NotFound("There is no such run.".into()));
        };
        if s.store.run(id)?.is_none() {
            return Ok(Out::NotFound(format!("There is no run {id}.")));
        }
        s.store.delete_run(id)?;
        Ok(Out::Page(
            Redirect::to(&format!("/?deleted={id}")).into_response(),
        ))
    })
    .await;
    st.invalidate();
    respond(&st, r).await
}

pub(super) async fn asset(AxPath(file): AxPath<String>) -> Response {
    let (body, ctype): (&'static str, &str) = match file.as_str() {
        "uPlot-1.6.32.iife.min.js" => (views::UPLOT_JS, "text/javascript; charset=utf-8"),
        "uPlot-1.6.32.min.css" => (views::UPLOT_CSS, "text/css; charset=utf-8"),
        "app.js" => (views::APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => (views::APP_CSS, "text/css; charset=utf-8"),
        _ => return (StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    // Versioned URLs (vendored version in the name, ?v=hash for ours): cache for a year.
    (
        [
            (header::CONTENT_TYPE, ctype),
            (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn not_found_route(State(st): State<Arc<AppState>>, uri: Uri) -> Response {
    not_found(&st, &format!("Nothing lives at {}.", uri.path()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_states_are_local_pages_only() {
        assert!(valid_state("/compare?runs=1,2"));
        assert!(valid_state("/"));
        assert!(valid_state("/?q=x"));
        assert!(valid_state("/runs/3/prompts/1?anchor=7"));
        assert!(!valid_state("//evil.example/x"));
        assert!(!valid_state("https://evil.example/"));
        assert!(!valid_state("/import"));
        assert!(!valid_state("/s/abc"));
        assert!(!valid_state("/\\evil"));
    }
}
