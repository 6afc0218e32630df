//! Middleware (timing and security headers, team-mode access) and the responses every handler
//! shares: errors, blocking store calls, page rendering.

use super::*;

/// Server-Timing header (what the benchmark reads) and security headers on every response.
pub(super) async fn timing_layer(req: Request, next: Next) -> Response {
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

pub(super) fn token_from(headers: &HeaderMap, query: &Query) -> Option<String> {
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

pub(super) async fn access_layer(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
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
pub(super) struct SharedView;

pub(super) fn ctx_of(st: &AppState, req_access: Option<Access>, uri: &Uri, nav: Nav) -> Ctx {
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

pub(super) fn html(m: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        m.into_string(),
    )
        .into_response()
}

pub(super) fn plain_ctx(st: &AppState) -> Ctx {
    Ctx {
        report: false,
        can_write: false,
        team: st.team,
        current: String::new(),
        nav: Nav::None,
        asset_version: st.asset_version.clone(),
    }
}

pub(super) fn not_found(st: &AppState, what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        html(misc::not_found(&plain_ctx(st), what)),
    )
        .into_response()
}

pub(super) fn unauthorized(st: &AppState, write: bool) -> Response {
    let code = if write {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::UNAUTHORIZED
    };
    (code, html(misc::unauthorized(&plain_ctx(st), write))).into_response()
}

pub(super) fn server_error(st: &AppState, e: &anyhow::Error) -> Response {
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

pub(super) fn bad_request(st: &AppState, e: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        html(misc::error(&plain_ctx(st), "Bad request", e)),
    )
        .into_response()
}

/// Runs blocking store work off the async runtime.
pub(super) async fn blocking<T: Send + 'static>(
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
pub(super) enum Out {
    Page(Response),
    NotFound(String),
    Bad(String),
}

pub(super) async fn respond(st: &Arc<AppState>, r: Result<Out>) -> Response {
    match r {
        Ok(Out::Page(p)) => p,
        Ok(Out::NotFound(w)) => not_found(st, &w),
        Ok(Out::Bad(w)) => bad_request(st, &w),
        Err(e) => server_error(st, &e),
    }
}
