//! The HTTP server: axum routes over the store, team-mode tokens, share links, uploads.
//!
//! Access model: by default the server binds to localhost and anyone who can reach it may read
//! and write. With `team`, every request needs a token (header `Authorization: Bearer`, the
//! `draftlens_token` cookie, or `?token=` once, which sets the cookie): read tokens may view,
//! write tokens may also import, delete, pin and share. A share link `/s/<id>` grants read
//! access to exactly the view it saved. POSTs from other sites are refused (Origin check), and
//! the cookie is HttpOnly + SameSite=Strict.
//!
//! Layout: this file holds the options, the shared state (store, caches) and the router;
//! `access` the middleware and the shared responses; `pages` the handlers (`trace_diff` the
//! trace-diff drill-down's). View models shared
//! with the static report are in `crate::viewmodel`.

use crate::analysis::{load_stats, RunStats};
use crate::bundle::{import_bytes, DEFAULT_MAX_IMPORT_BYTES};
use crate::compare::{self, CompareOptions};
use crate::qs::Query;
use crate::views::{self, misc, Ctx, Nav};
use anyhow::{anyhow, Context, Result};
use axum::extract::{DefaultBodyLimit, Multipart, Path as AxPath, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use draftlens_results::store::{
    MetricKey, MetricScope, RunFilter, RunInfo, RunMode, RunSort, Store, TokenScope,
};
use maud::Markup;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod access;
mod pages;
mod push;
mod trace_diff;

use crate::viewmodel::*;
use access::*;
use pages::*;
use trace_diff::trace_diff_page;

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

/// Runs the server until SIGINT or SIGTERM, then checkpoints the database.
pub async fn serve(opts: ServeOptions) -> Result<()> {
    serve_with(opts, None).await
}

/// [`serve`] with the plugin host that re-scores the runs it merges from pushed shards
/// (`draftlens serve` passes the command line's; without one, shards scored with plugins are
/// not merged on the server).
pub async fn serve_with(
    opts: ServeOptions,
    scorer: Option<Arc<dyn draftlens_results::merge::PluginScorer>>,
) -> Result<()> {
    if !opts.addr.ip().is_loopback() && !opts.team {
        anyhow::bail!(
            "refusing to serve {} without --team: anyone on the network could read and delete runs. Pass --team (and create tokens with `draftlens tokens create`), or bind to 127.0.0.1",
            opts.addr
        );
    }
    let store = Store::open(&opts.db)?;
    if opts.team && store.tokens()?.iter().all(|t| t.revoked_at.is_some()) {
        eprintln!(
            "warning: team mode but no active tokens: create one with `{}`",
            tokens_hint(&opts.db)
        );
    }
    // Installed before the listener exists: a signal that arrives once the server can answer
    // must reach this handler, not the default action (which ends the process without the
    // checkpoint below).
    let shutdown = shutdown_signal()?;
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
    let app = app_with(store, opts.team, opts.max_upload_bytes, Some(addr), scorer);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("server failed")?;
    // In-flight requests have finished and every connection of the app is closed: fold the
    // write-ahead log into the database so the file is complete on its own.
    Store::open(&opts.db)?.checkpoint()?;
    eprintln!("draftlens: stopped");
    Ok(())
}

/// Installs the SIGINT (Ctrl-C) and SIGTERM (`kill`, `systemctl stop`, `docker stop`)
/// handlers now and returns the future that resolves on either: axum then stops accepting
/// connections and lets in-flight requests finish. (Registering inside the future would leave a
/// window after the listener is up in which a signal still kills the process.)
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let stop = {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
    };
    #[cfg(not(unix))]
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    Ok(async move {
        stop.await;
        eprintln!("draftlens: shutting down (finishing requests in flight)");
    })
}

/// The command that creates a write token for `db`, as printed (tested by running it).
pub fn tokens_hint(db: &std::path::Path) -> String {
    format!(
        "draftlens tokens create NAME --scope write --db {}",
        shell_quote(&db.display().to_string())
    )
}

/// Quotes a word for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:@%=,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Shared state of the handlers.
pub struct AppState {
    pub store: Store,
    pub team: bool,
    pub max_upload: usize,
    /// The address `serve` bound to (part of the default mode's Host allow-list).
    bound: Option<SocketAddr>,
    stats: Mutex<HashMap<i64, (String, Arc<RunStats>)>>,
    vocab: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// (computed at, value) caches for the run list's menus; refreshed every few seconds so
    /// runs written by other processes show up.
    facets: Mutex<
        Option<(
            Instant,
            Arc<draftlens_results::store::Facets>,
            Arc<Vec<(MetricKey, usize, bool)>>,
        )>,
    >,
    asset_version: String,
    /// Finished comparisons keyed by their inputs' identity (see `compare_cached`).
    comparisons: Mutex<Vec<(String, Arc<compare::Comparison>)>>,
    /// Permits for blocking store work (about two per core).
    work: tokio::sync::Semaphore,
    /// Re-scores the runs merged from pushed shards (`server/push.rs`).
    scorer: Option<Arc<dyn draftlens_results::merge::PluginScorer>>,
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
        Arc<draftlens_results::store::Facets>,
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
            // A trace diff stored or replaced (a new id) changes the comparison's trace panel.
            let diffs: Vec<i64> = self.store.trace_diffs(id)?.iter().map(|t| t.id).collect();
            key.push_str(&format!("{diffs:?};"));
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
    app_bound(store, team, max_upload, None)
}

/// The router of a server bound to `bound` (which joins the default mode's Host allow-list).
pub fn app_bound(store: Store, team: bool, max_upload: usize, bound: Option<SocketAddr>) -> Router {
    app_with(store, team, max_upload, bound, None)
}

/// [`app_bound`] with the plugin host of [`serve_with`].
pub fn app_with(
    store: Store,
    team: bool,
    max_upload: usize,
    bound: Option<SocketAddr>,
    scorer: Option<Arc<dyn draftlens_results::merge::PluginScorer>>,
) -> Router {
    let asset_version = hex::encode(
        &<sha2::Sha256 as sha2::Digest>::digest(
            format!("{}{}", views::APP_JS, views::APP_CSS).as_bytes(),
        )[..6],
    );
    let state = Arc::new(AppState {
        store,
        team,
        max_upload,
        bound,
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
        scorer,
    });
    let pages = Router::new()
        .route("/", get(runs_page))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/prompts/{idx}", get(prompt_page))
        .route("/runs/{id}/trace-diff", get(trace_diff_page))
        .route("/runs/{id}/delete", post(delete_run))
        .route("/compare", get(compare_page))
        .route("/history", get(history_page))
        .route("/import", get(import_page).post(import_upload))
        .route("/report", get(report_download))
        .route("/bundle", get(bundle_download))
        .route("/share", post(share_create))
        .route("/baseline", post(baseline_pin))
        .route("/healthz", get(|| async { "ok" }))
        .route("/api/runs/{uid}", get(push::run_exists))
        .route("/api/uploads", post(push::upload_start))
        .route("/api/uploads/{id}/chunk", post(push::upload_chunk))
        .route("/api/uploads/{id}/finish", post(push::upload_finish))
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
