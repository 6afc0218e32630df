//! HTTP guards of the server: the default mode's Host allow-list (DNS rebinding), the origin
//! rules for state-changing requests (the browser's real same-origin posts pass, cross-site ones
//! do not), the run list's `cols` cap, and malformed requests answering a 4xx with a clear
//! message instead of a 500.

mod support;

use draftlens_results::store::{Store, TokenScope};
use draftlens_web::demo::{fill_demo_db, DemoSpec};
use support::*;

fn demo() -> (tempfile::TempDir, std::path::PathBuf, Vec<i64>) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("runs.sqlite");
    let store = Store::open(&p).unwrap();
    let runs = fill_demo_db(&store, &DemoSpec::small()).unwrap();
    (d, p, runs.checkpoints)
}

#[tokio::test]
async fn default_mode_answers_only_loopback_hosts() {
    let (_d, db, runs) = demo();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let port = addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
    ] {
        let r = get_with(addr, "/", &[("Host", &host)]).await.unwrap();
        assert_eq!(r.status, 200, "{host}");
    }
    // A rebinding page: its own name resolves to 127.0.0.1, the browser sends it as Host.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_string(),
        format!("localhost.evil.example:{port}"),
    ] {
        let r = get_with(addr, &format!("/runs/{}", runs[0]), &[("Host", &host)])
            .await
            .unwrap();
        assert_eq!(r.status, 421, "{host}");
        assert!(r.text().contains("DNS rebinding"), "{}", r.text());
        let r = post_form(
            addr,
            &format!("/runs/{}/delete", runs[0]),
            &[("Host", &host), ("Sec-Fetch-Site", "same-origin")],
            "",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 421, "{host}");
    }
    // Nothing was deleted.
    let store = Store::open(&db).unwrap();
    assert!(store.run(runs[0]).unwrap().is_some());

    // A team server answers any name (tokens protect it).
    let store = Store::open(&db).unwrap();
    let tok = store.create_token("t", TokenScope::Read).unwrap();
    let team = serve(&db, true, 1 << 20).await.unwrap();
    let auth = format!("bearer {tok}"); // lowercase scheme is accepted
    let r = get_with(
        team,
        "/",
        &[("Host", "runs.team.example"), ("Authorization", &auth)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn browser_same_origin_posts_pass_and_cross_site_posts_do_not() {
    let (_d, db, runs) = demo();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let own = format!("http://{addr}");
    let pin = format!("run={}", runs[0]);
    // Chromium's form post under a strict referrer policy: Origin null, Sec-Fetch-Site same-origin.
    let r = post_form(
        addr,
        "/baseline",
        &[("Origin", "null"), ("Sec-Fetch-Site", "same-origin")],
        &pin,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 303, "{}", r.text());
    let store = Store::open(&db).unwrap();
    assert_eq!(store.baselines().unwrap().len(), 1);
    // Cross-site, same-site (another port of localhost) and unattributable posts are refused.
    for hdrs in [
        vec![
            ("Origin", "http://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        vec![
            ("Origin", "http://127.0.0.1:1"),
            ("Sec-Fetch-Site", "same-site"),
        ],
        vec![("Origin", "http://evil.example")],
        vec![("Origin", "null")],
    ] {
        let r = post_form(addr, &format!("/runs/{}/delete", runs[1]), &hdrs, "")
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{hdrs:?}");
        assert!(r.text().contains("refused"), "{hdrs:?}: {}", r.text());
    }
    assert!(store.run(runs[1]).unwrap().is_some());
    // An old browser's matching Origin, and a script with no browser headers, pass.
    let r = post_form(addr, "/share", &[("Origin", &own)], "state=%2F%3Fq%3Dx")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = post_form(addr, &format!("/runs/{}/delete", runs[1]), &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 303);
    assert!(store.run(runs[1]).unwrap().is_none());
    // The policy that makes Chromium send a real Origin on our own posts.
    let r = get(addr, "/").await.unwrap();
    assert_eq!(r.header("referrer-policy"), Some("same-origin"));
}

#[tokio::test]
async fn cols_are_deduplicated_and_capped() {
    let (_d, db, _) = demo();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let plain = get(addr, "/").await.unwrap();
    // 40 KB of repeated and unknown column keys.
    let one = "native/tau_uniform,nosuch/metric,";
    let cols = one.repeat(40_000 / one.len());
    let r = get(addr, &format!("/?cols={}", cols)).await.unwrap();
    assert_eq!(r.status, 200);
    let t = r.text();
    assert!(
        t.len() < plain.body.len() * 2,
        "{} bytes for a cols query vs {} plain",
        t.len(),
        plain.body.len()
    );
    assert!(!t.contains("nosuch"), "an unknown column was echoed");
}

#[tokio::test]
async fn malformed_requests_answer_4xx_with_a_reason() {
    let (_d, db, runs) = demo();
    let store = Store::open(&db).unwrap();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let many: Vec<String> = (0..13).map(|i| runs[i % runs.len()].to_string()).collect();
    // Two runs whose uids share a prefix: the prefix is ambiguous.
    let uids: Vec<String> = runs
        .iter()
        .map(|&r| store.run(r).unwrap().unwrap().run.uid)
        .collect();
    let mut ambiguous = None;
    'outer: for n in (6..20).rev() {
        for a in &uids {
            if uids.iter().filter(|u| u.starts_with(&a[..n])).count() > 1 {
                ambiguous = Some(a[..n].to_string());
                break 'outer;
            }
        }
    }
    let mut cases = vec![
        ("/?page=999999999999999999".to_string(), 404, "no page"),
        ("/?page=40".to_string(), 404, "no page 40"),
        (
            format!("/report?runs={}&baseline=abc", runs[0]),
            400,
            "baseline",
        ),
        (
            format!("/compare?runs={},{}&baseline=abc", runs[0], runs[1]),
            400,
            "baseline",
        ),
        (
            format!("/compare?runs={}", many.join(",")),
            400,
            "at most 12",
        ),
        (
            format!("/report?runs={}", many.join(",")),
            400,
            "at most 12",
        ),
        ("/compare".to_string(), 400, "at least two"),
        ("/compare?runs=987654,1".to_string(), 404, "no run"),
    ];
    if let Some(p) = &ambiguous {
        cases.push((format!("/compare?runs={p},{}", runs[0]), 400, "ambiguous"));
    }
    for (path, code, needle) in cases {
        let r = get(addr, &path).await.unwrap();
        assert_eq!(r.status, code, "{path}");
        assert!(
            r.text().to_lowercase().contains(needle),
            "{path}: no {needle:?} in the answer"
        );
    }
}
