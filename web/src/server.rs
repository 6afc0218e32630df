//! The HTTP server: axum routes over the store, team-mode tokens, share links, uploads.
//!
//! Access model: by default the server binds to localhost and anyone who can reach it may read
//! and write. With `team`, every request needs a token (header `Authorization: Bearer`, the
//! `draftlens_token` cookie, or `?token=` once, which sets the cookie): read tokens may view,
//! write tokens may also import, delete, pin and share. A share link `/s/<id>` grants read
//! access to exactly the view it saved. POSTs from other sites are refused (Origin check), and
//! the cookie is HttpOnly + SameSite=Strict.

use crate::analysis::{self, load_stats, RunStats, DERIVED};
use crate::bundle::{import_bytes, DEFAULT_MAX_IMPORT_BYTES};
use crate::compare::{self, CompareOptions, RunCurves};
use crate::qs::Query;
use crate::views::{self, misc, Ctx, Nav};
use anyhow::{anyhow, Context, Result};
use axum::extract::{DefaultBodyLimit, Multipart, Path as AxPath, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use draftlens::store::{
    MetricKey, MetricScope, RunFilter, RunInfo, RunMode, RunSort, Store, TokenScope,
};
use maud::Markup;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of `draftlens serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub db: PathBuf,
    pub addr: SocketAddr,
    /// Require tokens (read/write); needed to bind to a non-loopback address.
    pub team: bool,
    pub max_upload_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            db: PathBuf::from("runs.sqlite"),
            addr: "127.0.0.1:8080".parse().expect("valid"),
            team: false,
            max_upload_bytes: DEFAULT_MAX_IMPORT_BYTES,
        }
    }
}

/// Runs the server until Ctrl-C.
pub async fn serve(opts: ServeOptions) -> Result<()> {
    if !opts.addr.ip().is_loopback() && !opts.team {
        anyhow::bail!(
            "refusing to serve {} without --team: anyone on the network could read and delete runs. Pass --team (and create tokens with `draftlens tokens create`), or bind to 127.0.0.1",
            opts.addr
        );
    }
    let store = Store::open(&opts.db)?;
    if opts.team && store.tokens()?.iter().all(|t| t.revoked_at.is_some()) {
        eprintln!("warning: team mode but no active tokens: create one with `draftlens tokens create NAME --scope write --db {}`", opts.db.display());
    }
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .with_context(|| format!("cannot listen on {}", opts.addr))?;
    let addr = listener.local_addr()?;
    eprintln!(
        "draftlens: serving {} on http://{addr}/{}",
        opts.db.display(),
        if opts.team {
            " (team mode: tokens required)"
        } else {
            ""
        }
    );
    let app = app(store, opts.team, opts.max_upload_bytes);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("server failed")?;
    Ok(())
}

/// Shared state of the handlers.
pub struct AppState {
    pub store: Store,
    pub team: bool,
    pub max_upload: usize,
    stats: Mutex<HashMap<i64, (String, Arc<RunStats>)>>,
    vocab: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// (computed at, value) caches for the run list's menus; refreshed every few seconds so
    /// runs written by other processes show up.
    facets: Mutex<
        Option<(
            Instant,
            Arc<draftlens::store::Facets>,
            Arc<Vec<(MetricKey, usize, bool)>>,
        )>,
    >,
    asset_version: String,
    /// Finished comparisons keyed by their inputs' identity (see `compare_cached`).
    comparisons: Mutex<Vec<(String, Arc<compare::Comparison>)>>,
    /// Permits for blocking store work (about two per core).
    work: tokio::sync::Semaphore,
}

const COMPARE_CACHE: usize = 32;

const MENU_TTL: Duration = Duration::from_secs(5);
const STATS_CACHE: usize = 256;

impl AppState {
    fn stats_for(&self, run: &RunInfo) -> Result<Option<Arc<RunStats>>> {
        let key = format!("{}:{}:{}", run.uid, run.num_blocks, run.status);
        if let Some((k, s)) = self
            .stats
            .lock()
            .map_err(|_| anyhow!("stats cache poisoned"))?
            .get(&run.id)
        {
            if *k == key {
                return Ok(Some(s.clone()));
            }
        }
        let Some(s) = load_stats(&self.store, run)? else {
            return Ok(None);
        };
        let s = Arc::new(s);
        let mut cache = self
            .stats
            .lock()
            .map_err(|_| anyhow!("stats cache poisoned"))?;
        if cache.len() >= STATS_CACHE {
            cache.clear();
        }
        cache.insert(run.id, (key, s.clone()));
        Ok(Some(s))
    }

    fn vocab_for(&self, sha: &str) -> Result<Option<Arc<Vec<String>>>> {
        if let Some(v) = self
            .vocab
            .lock()
            .map_err(|_| anyhow!("vocab cache poisoned"))?
            .get(sha)
        {
            return Ok(Some(v.clone()));
        }
        let Some((_, pieces)) = self.store.vocab(sha)? else {
            return Ok(None);
        };
        let v = Arc::new(pieces);
        self.vocab
            .lock()
            .map_err(|_| anyhow!("vocab cache poisoned"))?
            .insert(sha.to_string(), v.clone());
        Ok(Some(v))
    }

    #[allow(clippy::type_complexity)]
    fn menus(
        &self,
    ) -> Result<(
        Arc<draftlens::store::Facets>,
        Arc<Vec<(MetricKey, usize, bool)>>,
    )> {
        if let Some((t, f, k)) = self
            .facets
            .lock()
            .map_err(|_| anyhow!("cache poisoned"))?
            .as_ref()
        {
            if t.elapsed() < MENU_TTL {
                return Ok((f.clone(), k.clone()));
            }
        }
        let f = Arc::new(self.store.facets()?);
        let k = Arc::new(self.store.metric_keys()?);
        *self.facets.lock().map_err(|_| anyhow!("cache poisoned"))? =
            Some((Instant::now(), f.clone(), k.clone()));
        Ok((f, k))
    }

    /// A comparison is a pure function of the runs' records, statistics and metric rows (the
    /// bootstrap is seeded), so it is cached under a key that changes with any of them.
    fn compare_cached(
        &self,
        ids: &[i64],
        opts: &CompareOptions,
    ) -> Result<Arc<compare::Comparison>> {
        let mut key = format!("{:?}|{:?}|{}|", ids, opts.baseline, opts.reps);
        for &id in ids {
            let Some(d) = self.store.run(id)? else {
                anyhow::bail!("{}: run {id} does not exist", self.store.path().display())
            };
            let fp = self.store.metrics_fingerprint(id)?;
            key.push_str(&format!(
                "{}:{}:{}:{fp};",
                d.run.uid, d.run.num_blocks, d.run.status
            ));
        }
        // The default baseline depends on pins.
        key.push_str(&format!("{:?}", self.store.baselines()?));
        let cache = self
            .comparisons
            .lock()
            .map_err(|_| anyhow!("cache poisoned"))?;
        if let Some((_, c)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(c.clone());
        }
        drop(cache);
        let stats_of = |r: &RunInfo| self.stats_for(r);
        let c = Arc::new(compare::compare(&self.store, ids, opts, &stats_of)?);
        let mut cache = self
            .comparisons
            .lock()
            .map_err(|_| anyhow!("cache poisoned"))?;
        if cache.len() >= COMPARE_CACHE {
            cache.remove(0);
        }
        cache.push((key, c.clone()));
        Ok(c)
    }

    fn invalidate(&self) {
        if let Ok(mut f) = self.facets.lock() {
            *f = None;
        }
    }
}

/// What the current request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// The router (used by `serve`, tests and the benchmark).
pub fn app(store: Store, team: bool, max_upload: usize) -> Router {
    let asset_version = hex::encode(
        &<sha2::Sha256 as sha2::Digest>::digest(
            format!("{}{}", views::APP_JS, views::APP_CSS).as_bytes(),
        )[..6],
    );
    let state = Arc::new(AppState {
        store,
        team,
        max_upload,
        stats: Mutex::new(HashMap::new()),
        vocab: Mutex::new(HashMap::new()),
        facets: Mutex::new(None),
        asset_version,
        comparisons: Mutex::new(Vec::new()),
        work: tokio::sync::Semaphore::new(
            std::thread::available_parallelism()
                .map(|n| n.get() * 2)
                .unwrap_or(4)
                .max(4),
        ),
    });
    let pages = Router::new()
        .route("/", get(runs_page))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/prompts/{idx}", get(prompt_page))
        .route("/runs/{id}/delete", post(delete_run))
        .route("/compare", get(compare_page))
        .route("/history", get(history_page))
        .route("/import", get(import_page).post(import_upload))
        .route("/report", get(report_download))
        .route("/bundle", get(bundle_download))
        .route("/share", post(share_create))
        .route("/baseline", post(baseline_pin))
        .route("/healthz", get(|| async { "ok" }))
        .route("/assets/{file}", get(asset))
        .fallback(not_found_route)
        .layer(DefaultBodyLimit::max(max_upload.saturating_add(64 << 10)))
        .with_state(state.clone());
    // Access control wraps the whole router (not each route) so that it can rewrite a share
    // link's URI to the saved view before routing.
    let guarded =
        tower_layer::Layer::layer(&middleware::from_fn_with_state(state, access_layer), pages);
    Router::new()
        .fallback_service(guarded)
        .layer(middleware::from_fn(timing_layer))
}

// ---------------------------------------------------------------------------------------------
// Middleware
// ---------------------------------------------------------------------------------------------

/// Server-Timing header (what the benchmark reads) and security headers on every response.
async fn timing_layer(req: Request, next: Next) -> Response {
    let t = Instant::now();
    let mut resp = next.run(req).await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={ms:.3}")) {
        h.insert("server-timing", v);
    }
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
            ),
        );
    }
    resp
}

fn token_from(headers: &HeaderMap, query: &Query) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        if let Some(t) = v.strip_prefix("Bearer ") {
            return Some(t.trim().to_string());
        }
    }
    if let Some(t) = query.get("token") {
        return Some(t.to_string());
    }
    for c in headers.get_all(header::COOKIE) {
        for part in c.to_str().unwrap_or("").split(';') {
            if let Some(t) = part.trim().strip_prefix("draftlens_token=") {
                return Some(t.to_string());
            }
        }
    }
    None
}

async fn access_layer(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // Cross-site POSTs are refused whatever the mode (no CSRF through a teammate's browser).
    if req.method() == Method::POST {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if let Some(origin) = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|h| h.to_str().ok())
        {
            let ok = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                == Some(host);
            if !ok {
                return (StatusCode::FORBIDDEN, "cross-origin request refused").into_response();
            }
        }
        if req
            .headers()
            .get("sec-fetch-site")
            .and_then(|h| h.to_str().ok())
            == Some("cross-site")
        {
            return (StatusCode::FORBIDDEN, "cross-site request refused").into_response();
        }
    }
    if path.starts_with("/assets/") || path == "/healthz" {
        return next.run(req).await;
    }
    // Share links: rewrite to the saved view, with read access to it alone.
    if let Some(id) = path.strip_prefix("/s/") {
        let state = {
            let st = st.clone();
            let id = id.to_string();
            tokio::task::spawn_blocking(move || st.store.share(&id)).await
        };
        return match state {
            Ok(Ok(Some(saved))) if req.method() == Method::GET => match saved.parse::<Uri>() {
                Ok(uri) => {
                    *req.uri_mut() = uri;
                    req.extensions_mut().insert(Access::Read);
                    req.extensions_mut().insert(SharedView);
                    next.run(req).await
                }
                Err(_) => not_found(&st, "This share link is broken."),
            },
            _ => not_found(&st, "No shared view has this id."),
        };
    }
    let access = if !st.team {
        Access::Write
    } else {
        let query = Query::parse(req.uri().query());
        let Some(tok) = token_from(req.headers(), &query) else {
            return unauthorized(&st, req.method() == Method::POST);
        };
        let scope = {
            let st = st.clone();
            let tok = tok.clone();
            tokio::task::spawn_blocking(move || st.store.check_token(&tok)).await
        };
        let scope = match scope {
            Ok(Ok(Some(s))) => s,
            Ok(Err(e)) => return server_error(&st, &e),
            _ => return unauthorized(&st, req.method() == Method::POST),
        };
        // A token in the URL: remember it in a cookie and drop it from the address bar (so it
        // is not shared or logged by accident).
        if query.get("token").is_some() && req.method() == Method::GET {
            let clean = format!(
                "{}{}",
                req.uri().path(),
                query.without(&["token"]).to_string_with_qmark()
            );
            let mut resp = Redirect::to(&clean).into_response();
            if let Ok(v) = HeaderValue::from_str(&format!(
                "draftlens_token={tok}; Path=/; HttpOnly; SameSite=Strict"
            )) {
                resp.headers_mut().insert(header::SET_COOKIE, v);
            }
            return resp;
        }
        match scope {
            TokenScope::Read => Access::Read,
            TokenScope::Write => Access::Write,
        }
    };
    if req.method() == Method::POST && access != Access::Write {
        return unauthorized(&st, true);
    }
    req.extensions_mut().insert(access);
    next.run(req).await
}

/// Marks a request served through a share link.
#[derive(Clone, Copy)]
struct SharedView;

fn ctx_of(st: &AppState, req_access: Option<Access>, uri: &Uri, nav: Nav) -> Ctx {
    let q = Query::parse(uri.query()).without(&["token"]);
    Ctx {
        report: false,
        can_write: req_access == Some(Access::Write),
        team: st.team,
        current: format!("{}{}", uri.path(), q.to_string_with_qmark()),
        nav,
        asset_version: st.asset_version.clone(),
    }
}

fn html(m: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        m.into_string(),
    )
        .into_response()
}

fn plain_ctx(st: &AppState) -> Ctx {
    Ctx {
        report: false,
        can_write: false,
        team: st.team,
        current: String::new(),
        nav: Nav::None,
        asset_version: st.asset_version.clone(),
    }
}

fn not_found(st: &AppState, what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        html(misc::not_found(&plain_ctx(st), what)),
    )
        .into_response()
}

fn unauthorized(st: &AppState, write: bool) -> Response {
    let code = if write {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::UNAUTHORIZED
    };
    (code, html(misc::unauthorized(&plain_ctx(st), write))).into_response()
}

fn server_error(st: &AppState, e: &anyhow::Error) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        html(misc::error(
            &plain_ctx(st),
            "Something went wrong",
            &format!("{e:#}"),
        )),
    )
        .into_response()
}

fn bad_request(st: &AppState, e: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        html(misc::error(&plain_ctx(st), "Bad request", e)),
    )
        .into_response()
}

/// Runs blocking store work off the async runtime.
async fn blocking<T: Send + 'static>(
    st: &AppState,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    // Bounded: a burst of requests queues here instead of oversubscribing the cores with
    // threads and the database with fresh connections.
    let _permit = st
        .work
        .acquire()
        .await
        .map_err(|e| anyhow!("server is shutting down: {e}"))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("worker failed: {e}"))?
}

/// A handler's outcome: a page, a 404, or an error.
enum Out {
    Page(Response),
    NotFound(String),
    Bad(String),
}

async fn respond(st: &Arc<AppState>, r: Result<Out>) -> Response {
    match r {
        Ok(Out::Page(p)) => p,
        Ok(Out::NotFound(w)) => not_found(st, &w),
        Ok(Out::Bad(w)) => bad_request(st, &w),
        Err(e) => server_error(st, &e),
    }
}

// ---------------------------------------------------------------------------------------------
// Pages
// ---------------------------------------------------------------------------------------------

const PER_PAGE: usize = 50;

async fn runs_page(
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
        let columns: Vec<(MetricKey, bool)> = {
            let asked: Vec<MetricKey> = q
                .all("cols")
                .iter()
                .flat_map(|v| v.split(','))
                .filter_map(|k| k.parse().ok())
                .collect();
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
            ids: None,
            sort,
            descending: q.get("dir").map(|d| d != "asc").unwrap_or(true),
            offset: (page - 1) * PER_PAGE,
            limit: PER_PAGE,
            metric_columns: columns.iter().map(|c| c.0.clone()).collect(),
        };
        let (rows, total) = s.store.runs(&filter)?;
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
        };
        Ok(Out::Page(html(views::runs::render(&ctx, &v))))
    })
    .await;
    respond(&st, r).await
}

/// Records-derived headline metrics first, then the most common others; at most 4.
fn default_columns(keys: &[(MetricKey, usize, bool)]) -> Vec<MetricKey> {
    let mut out: Vec<MetricKey> = Vec::new();
    for name in ["tau_replayed", "tau_uniform", "flat_accuracy", "draft_nll"] {
        if let Some(k) = keys
            .iter()
            .find(|k| k.0.source == analysis::SOURCE && k.0.name == name)
        {
            out.push(k.0.clone());
        }
    }
    for k in keys {
        if out.len() >= 4 {
            break;
        }
        if !out.contains(&k.0) {
            out.push(k.0.clone());
        }
    }
    out.truncate(4);
    out
}

fn curves_of(stats: &RunStats, seed: &str) -> RunCurves {
    RunCurves {
        accuracy: analysis::position_curve(stats, false, 400, seed),
        acceptance: analysis::position_curve(stats, true, 400, seed),
        hist_replayed: analysis::accept_histogram(stats, true),
        hist_uniform: analysis::accept_histogram(stats, false),
    }
}

async fn run_page(
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

fn cmp_opt(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    // Missing values last; otherwise ascending (worst first for ↑ metrics).
    match (a, b) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

pub(crate) fn headline_of(st: &RunStats) -> views::run::Headline {
    let all: Vec<&analysis::PromptStats> = st.evaluated().collect();
    let get = |name: &str| {
        DERIVED
            .iter()
            .find(|d| d.name == name)
            .and_then(|m| analysis::aggregate(m, &all))
    };
    views::run::Headline {
        tau_replayed: get("tau_replayed"),
        tau_replayed_pooled: get("tau_replayed_pooled"),
        tau_uniform: get("tau_uniform"),
        flat_accuracy: get("flat_accuracy"),
        rounds: all.iter().map(|p| p.rounds.len() as u64).sum(),
    }
}

pub(crate) fn categories_of(st: &RunStats) -> Vec<views::run::CategoryRow> {
    let mut by: std::collections::BTreeMap<String, Vec<&analysis::PromptStats>> =
        Default::default();
    for p in st.evaluated() {
        if let Some(c) = &p.category {
            by.entry(c.clone()).or_default().push(p);
        }
    }
    let get = |name: &str, ps: &[&analysis::PromptStats]| {
        DERIVED
            .iter()
            .find(|d| d.name == name)
            .and_then(|m| analysis::aggregate(m, ps))
    };
    by.into_iter()
        .map(|(name, ps)| views::run::CategoryRow {
            prompts: ps.len(),
            tau_replayed: get("tau_replayed", &ps),
            tau_uniform: get("tau_uniform", &ps),
            flat_accuracy: get("flat_accuracy", &ps),
            name,
        })
        .collect()
}

pub(crate) fn prompt_rows(
    metas: &[draftlens::store::PromptMeta],
    stats: Option<&RunStats>,
) -> Vec<views::run::PromptRow> {
    let by: HashMap<u32, &analysis::PromptStats> = stats
        .map(|s| s.prompts.iter().map(|p| (p.index, p)).collect())
        .unwrap_or_default();
    metas
        .iter()
        .map(|m| {
            let ps = by.get(&m.index);
            views::run::PromptRow {
                index: m.index,
                id: m.id.clone(),
                category: m.category.clone(),
                tokens: m.num_tokens,
                prompt_len: m.prompt_len,
                blocks: ps.map(|p| p.blocks).unwrap_or(0),
                tau_replayed: ps.and_then(|p| p.replayed_tau()),
                tau_uniform: ps.and_then(|p| p.uniform_tau()),
                flat_accuracy: ps.and_then(|p| {
                    (p.valid_total() > 0).then(|| p.correct_total() as f64 / p.valid_total() as f64)
                }),
            }
        })
        .collect()
}

async fn prompt_page(
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

/// Run ids of a compare URL: `runs=1,2` and/or repeated `run=` (the list's checkboxes).
fn compare_ids(store: &Store, q: &Query) -> Result<std::result::Result<Vec<i64>, String>> {
    let mut refs = q.list("runs");
    refs.extend(q.all("run").iter().map(|s| s.to_string()));
    if refs.is_empty() {
        return Ok(Err("Select at least two runs to compare.".into()));
    }
    if refs.len() > 12 {
        return Ok(Err("Compare at most 12 runs at once.".into()));
    }
    let mut ids = Vec::new();
    for r in refs {
        match compare::resolve_run(store, &r) {
            Ok(id) if !ids.contains(&id) => ids.push(id),
            Ok(_) => {}
            Err(_) => return Ok(Err(format!("There is no run {r:?}."))),
        }
    }
    Ok(Ok(ids))
}

async fn compare_page(
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
            Err(msg) => return Ok(Out::NotFound(msg)),
        };
        if ids.len() == 1 && q.get("format") != Some("json") {
            return Ok(Out::Page(
                Redirect::to(&format!("/runs/{}", ids[0])).into_response(),
            ));
        }
        let baseline = match q.get("baseline") {
            Some(b) => match compare::resolve_run(&s.store, b) {
                Ok(id) if ids.contains(&id) => Some(id),
                _ => {
                    return Ok(Out::Bad(format!(
                        "The baseline {b:?} is not one of the compared runs."
                    )))
                }
            },
            None => None,
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

async fn history_page(
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

async fn import_page(
    State(st): State<Arc<AppState>>,
    access: Option<axum::Extension<Access>>,
    uri: Uri,
) -> Response {
    let ctx = ctx_of(&st, access.map(|a| a.0), &uri, Nav::Import);
    html(misc::import_form(&ctx, st.max_upload >> 20, None))
}

async fn import_upload(
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

async fn report_download(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> Response {
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref());
        let ids = match compare_ids(&s.store, &q)? {
            Ok(ids) => ids,
            Err(msg) => return Ok(Out::NotFound(msg)),
        };
        let baseline = q
            .get("baseline")
            .map(|b| compare::resolve_run(&s.store, b))
            .transpose()?;
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

async fn bundle_download(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> Response {
    let s = st.clone();
    let r = blocking(&st, move || {
        let q = Query::parse(raw.as_deref());
        let ids = match compare_ids(&s.store, &q)? {
            Ok(ids) => ids,
            Err(msg) => return Ok(Out::NotFound(msg)),
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
struct ShareForm {
    state: String,
}

/// A view state worth saving: a local GET page, not a redirect elsewhere.
fn valid_state(s: &str) -> bool {
    s.len() <= 4000
        && s.starts_with('/')
        && !s.starts_with("//")
        && !s.contains('\\')
        && ["/?", "/runs/", "/compare", "/history"]
            .iter()
            .any(|p| s == "/" || s.starts_with(p))
        && s.parse::<Uri>().is_ok()
}

async fn share_create(
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
struct BaselineForm {
    run: i64,
    unpin: Option<String>,
}

async fn baseline_pin(State(st): State<Arc<AppState>>, Form(f): Form<BaselineForm>) -> Response {
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

async fn delete_run(State(st): State<Arc<AppState>>, AxPath(id): AxPath<String>) -> Response {
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

async fn asset(AxPath(file): AxPath<String>) -> Response {
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

async fn not_found_route(State(st): State<Arc<AppState>>, uri: Uri) -> Response {
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

    #[test]
    fn default_columns_prefer_headline_metrics() {
        let k = |s: &str, n: &str| (MetricKey::new(s, n), 1, true);
        let keys = vec![
            k("plugin", "zzz"),
            k(analysis::SOURCE, "flat_accuracy"),
            k(analysis::SOURCE, "tau_replayed"),
            k("p", "a"),
            k("p", "b"),
        ];
        let cols = default_columns(&keys);
        assert_eq!(cols[0].name, "tau_replayed");
        assert_eq!(cols[1].name, "flat_accuracy");
        assert_eq!(cols.len(), 4);
    }
}
