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
    // same-origin, not no-referrer: under no-referrer Chromium sends `Origin: null` on our own
    // form posts; same-origin still sends nothing to other sites.
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
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

/// Whether a POST comes from one of our own pages. Browsers send `Sec-Fetch-Site` on every
/// request (Chromium, Firefox, Safari ≥ 16.4): only `same-origin` (our page) and `none` (typed or
/// bookmarked by the user) pass; `same-site` (another port of localhost) and `cross-site` do not.
/// Without it (older browsers, scripts) the `Origin` header, when present, must name this host;
/// `Origin: null` (a sandboxed or privacy-stripped request) cannot be attributed and is refused.
/// Requests with neither header are not from a browser form (curl, the CLI) and pass: they
/// cannot carry a victim's cookies by accident.
pub(super) fn same_origin_post(headers: &HeaderMap) -> std::result::Result<(), &'static str> {
    let get = |name: &str| headers.get(name).and_then(|h| h.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return match site {
            "same-origin" | "none" => Ok(()),
            _ => Err("cross-site request refused (Sec-Fetch-Site is not same-origin)"),
        };
    }
    if let Some(origin) = get("origin") {
        let host = get("host").unwrap_or("");
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !same {
            return Err("cross-origin request refused (Origin does not match Host)");
        }
    }
    Ok(())
}

/// The host part of a `Host` header value: `name`, `name:port`, `[v6]` or `[v6]:port`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    })
}

/// Default-mode Host allow-list: loopback names and addresses and the bound address.
pub(super) fn host_allowed(host: &str, bound: Option<&SocketAddr>) -> bool {
    let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || bound.is_some_and(|b| b.ip() == ip),
        Err(_) => false,
    }
}

pub(super) fn token_from(headers: &HeaderMap, query: &Query) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        // The scheme is case-insensitive (RFC 9110 §11.1): `bearer` works too.
        if let Some((scheme, t)) = v.trim().split_once(' ') {
            if scheme.eq_ignore_ascii_case("bearer") && !t.trim().is_empty() {
                return Some(t.trim().to_string());
            }
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
    // DNS rebinding: without --team the server answers only to loopback names (a page on
    // evil.example whose name resolves to 127.0.0.1 sends `Host: evil.example`).
    if !st.team {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .unwrap_or("");
        if !host_allowed(host, st.bound.as_ref()) {
            return (
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "Host {host:?} is not served here: without --team draftlens answers only to localhost, 127.0.0.1, [::1] and the address it is bound to (protection against DNS rebinding)\n"
                ),
            )
                .into_response();
        }
    }
    // Cross-site POSTs are refused whatever the mode (no CSRF through a teammate's browser).
    if req.method() == Method::POST {
        if let Err(why) = same_origin_post(req.headers()) {
            return (StatusCode::FORBIDDEN, format!("{why}\n")).into_response();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_allow_list() {
        let bound: SocketAddr = "127.0.0.2:8080".parse().unwrap();
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "app.localhost:9",
            "127.0.0.1:8080",
            "127.3.4.5",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(host_allowed(ok, Some(&bound)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:8080",
            "",
            "127.0.0.1.evil.example",
        ] {
            assert!(!host_allowed(bad, Some(&bound)), "{bad}");
        }
        let lan: SocketAddr = "192.168.1.5:80".parse().unwrap();
        assert!(host_allowed("192.168.1.5", Some(&lan)));
        assert!(!host_allowed("192.168.1.6", Some(&lan)));
    }

    #[test]
    fn origin_rules() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        // Chromium's own form post under a strict referrer policy.
        assert!(same_origin_post(&h(&[
            ("sec-fetch-site", "same-origin"),
            ("origin", "null"),
            ("host", "127.0.0.1:1")
        ]))
        .is_ok());
        assert!(same_origin_post(&h(&[
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://127.0.0.1:1"),
            ("host", "127.0.0.1:1")
        ]))
        .is_err());
        assert!(same_origin_post(&h(&[("sec-fetch-site", "same-site")])).is_err());
        assert!(same_origin_post(&h(&[
            ("origin", "http://127.0.0.1:1"),
            ("host", "127.0.0.1:1")
        ]))
        .is_ok());
        assert!(same_origin_post(&h(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:1")
        ]))
        .is_err());
        assert!(same_origin_post(&h(&[("origin", "null"), ("host", "127.0.0.1:1")])).is_err());
        assert!(same_origin_post(&h(&[("host", "127.0.0.1:1")])).is_ok());
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for v in ["Bearer abc", "bearer abc", "BEARER  abc "] {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, HeaderValue::from_static(v));
            assert_eq!(
                token_from(&m, &Query::default()).as_deref(),
                Some("abc"),
                "{v}"
            );
        }
    }
}
