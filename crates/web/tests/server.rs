//! HTTP-level tests of the web UI: pages, 404s, hostile input rendered inert, import (idempotent,
//! size limits, schema validation, no partial import), team tokens and share links, compare.

mod support;

use draftlens_results::store::{RunFilter, Store, TokenScope};
use draftlens_web::demo::{fill_demo_db, DemoRuns, DemoSpec};
use support::*;

fn demo_db() -> (tempfile::TempDir, std::path::PathBuf, DemoRuns, i64) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("runs.sqlite");
    let store = Store::open(&p).unwrap();
    let runs = fill_demo_db(&store, &DemoSpec::small()).unwrap();
    let evil = hostile_run(&store).unwrap();
    (d, p, runs, evil)
}

/// The page body contains no live markup from `EVIL`, but its escaped text is there.
fn assert_inert(body: &str, what: &str) {
    assert!(
        !body.contains("<script>window.__pwned"),
        "{what}: raw <script> from stored data reached the page"
    );
    assert!(
        !body.contains("<img src=x"),
        "{what}: raw <img> from stored data reached the page"
    );
    assert!(
        !body.contains("onerror=\"window"),
        "{what}: an event handler from stored data reached the page"
    );
}

#[tokio::test]
async fn pages_render_and_unknown_ids_are_404() {
    let (_d, db, runs, _) = demo_db();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let list = get(addr, "/").await.unwrap();
    assert_eq!(list.status, 200);
    let t = list.text();
    assert!(
        t.contains("dflash-qwen3-1.7b-b16 @ step 4000"),
        "run list lacks a run name"
    );
    assert!(list
        .header("server-timing")
        .unwrap()
        .starts_with("app;dur="));
    assert!(list
        .header("content-security-policy")
        .unwrap()
        .contains("script-src 'self'"));

    let c = runs.checkpoints[2];
    for path in [
        format!("/runs/{c}"),
        format!("/runs/{c}/prompts/0"),
        format!("/runs/{c}/prompts/0?anchor=30"),
        format!("/compare?runs={},{}", runs.checkpoints[0], c),
        "/history".to_string(),
        "/import".to_string(),
        "/assets/uPlot-1.6.32.iife.min.js".to_string(),
    ] {
        let r = get(addr, &path).await.unwrap();
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            r.text().chars().take(300).collect::<String>()
        );
    }
    for path in [
        "/runs/987654",
        "/runs/abc",
        &format!("/runs/{c}/prompts/999"),
        "/runs/987654/prompts/0",
        "/nothing/here",
        "/s/unknownid",
        "/compare?runs=987654,1",
    ] {
        let r = get(addr, path).await.unwrap();
        assert_eq!(r.status, 404, "{path}");
        assert!(r.text().contains("404"), "{path}: not the 404 page");
    }
    // Checkbox submissions are redirected to the canonical URL (the URL is the state).
    let r = get(
        addr,
        &format!("/compare?run={}&run={c}", runs.checkpoints[0]),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 303);
    assert_eq!(
        r.header("location").unwrap(),
        format!("/compare?runs={},{c}", runs.checkpoints[0])
    );
    // Filters and paging are server side.
    let r = get(addr, "/?mode=train-style&status=complete")
        .await
        .unwrap()
        .text();
    assert!(r.contains("train-style inclusive/data"));
    assert!(!r.contains("@ step 4000</a>"));
}

#[tokio::test]
async fn hostile_text_is_rendered_inert_everywhere() {
    let (_d, db, runs, evil) = demo_db();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    for path in [
        "/".to_string(),
        format!("/runs/{evil}"),
        format!("/runs/{evil}/prompts/0"),
        format!("/runs/{evil}/prompts/0?anchor=12"),
        format!("/compare?runs={evil},{}", runs.checkpoints[0]),
        format!("/compare?runs={evil},{}&format=json", runs.checkpoints[0]),
        format!(
            "/history?series={}",
            draftlens_web::qs::encode(&format!("series{EVIL}"))
        ),
        format!("/report?runs={evil},{}", runs.checkpoints[0]),
        format!("/bundle?runs={evil}"),
        format!("/?q={}", draftlens_web::qs::encode(EVIL)),
    ] {
        let r = get(addr, &path).await.unwrap();
        assert!(r.status == 200, "{path}: {}", r.status);
        let body = r.text();
        assert_inert(&body, &path);
    }
    // The text itself is shown, escaped.
    let page = get(addr, &format!("/runs/{evil}/prompts/0"))
        .await
        .unwrap()
        .text();
    assert!(
        page.contains("&lt;script&gt;window.__pwned=1&lt;/script&gt;"),
        "escaped token text is missing"
    );
    let run = get(addr, &format!("/runs/{evil}")).await.unwrap().text();
    assert!(run.contains("evil run &lt;script&gt;"));
}

#[tokio::test]
async fn report_import_round_trip_is_idempotent_over_http() {
    let (_d, db, runs, evil) = demo_db();
    let addr = serve(&db, false, 64 << 20).await.unwrap();
    let ids = format!("{},{},{evil}", runs.checkpoints[0], runs.checkpoints[2]);
    let report = get(addr, &format!("/report?runs={ids}")).await.unwrap();
    assert_eq!(report.status, 200);
    assert!(report
        .header("content-disposition")
        .unwrap()
        .contains("attachment"));
    let html = report.body.clone();

    let d2 = tempfile::tempdir().unwrap();
    let db2 = d2.path().join("team.sqlite");
    Store::open(&db2).unwrap();
    let team = serve(&db2, false, 64 << 20).await.unwrap();
    let r = post_file(team, "/import", &[], "report.html", &html)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("imported 3 runs, 0 already present"),
        "{}",
        r.text()
    );
    let r = post_file(team, "/import", &[], "report.html", &html)
        .await
        .unwrap();
    assert!(
        r.text().contains("imported 0 runs, 3 already present"),
        "{}",
        r.text()
    );
    let store2 = Store::open(&db2).unwrap();
    let (list, n) = store2.runs(&RunFilter::default()).unwrap();
    assert_eq!(n, 3);
    // The hostile name survives byte for byte (escaping is only for display).
    assert!(list
        .iter()
        .any(|r| r.run.name == format!("evil run {EVIL}")));
    // Imported runs have their statistics, so the comparison works without records.
    let a = store2.run_id_by_uid(&list[0].run.uid).unwrap().unwrap();
    let b = store2.run_id_by_uid(&list[1].run.uid).unwrap().unwrap();
    let c = get(team, &format!("/compare?runs={a},{b}&format=json"))
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
    let tau = v["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"]["name"] == "tau_replayed_macro")
        .unwrap();
    assert!(
        tau["deltas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["ci"].is_array()),
        "imported runs lost their per-prompt statistics"
    );
}

#[tokio::test]
async fn uploads_over_the_limit_or_malformed_import_nothing() {
    let (_d, db, runs, _) = demo_db();
    let store = Store::open(&db).unwrap();
    let bundle = draftlens_web::bundle::export_bundle(
        &store,
        &[runs.checkpoints[0], runs.checkpoints[1]],
        true,
    )
    .unwrap();
    let good = serde_json::to_string(&bundle).unwrap();

    let d2 = tempfile::tempdir().unwrap();
    let db2 = d2.path().join("t.sqlite");
    let target = Store::open(&db2).unwrap();
    let addr = serve(&db2, false, 4096).await.unwrap();
    // Over the upload limit: refused, nothing stored.
    let r = post_file(addr, "/import", &[], "big.json", good.as_bytes())
        .await
        .unwrap();
    assert!(
        r.status == 413 || r.status == 400 || r.status == 422,
        "{}",
        r.status
    );
    assert!(
        r.text().contains("limit") || r.text().contains("large"),
        "{}",
        r.text()
    );
    assert_eq!(target.runs(&RunFilter::default()).unwrap().1, 0);

    let check = |bytes: &[u8], expect: &str| {
        let err = draftlens_web::bundle::import_bytes(&target, "x.json", "x.json", bytes, 64 << 20)
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(expect), "expected {expect:?} in {msg:?}");
        assert!(
            msg.starts_with("x.json"),
            "error does not name the file: {msg}"
        );
        assert_eq!(
            target.runs(&RunFilter::default()).unwrap().1,
            0,
            "partial import after: {msg}"
        );
    };
    check(
        b"{\"format\": \"draftlens-bundle\", \"version\": 1, ",
        "not a valid draftlens bundle",
    );
    check(
        b"<html><body>no bundle here</body></html>",
        "without an embedded draftlens bundle",
    );
    check(b"\x00\x01binary", "neither a JSON bundle");
    check(
        good.replacen("\"version\":1", "\"version\":7", 1)
            .as_bytes(),
        "version 7 is not supported",
    );
    check(
        good.replacen("\"format\":\"draftlens-bundle\"", "\"format\":\"other\"", 1)
            .as_bytes(),
        "format is \"other\"",
    );
    check(
        good.replacen("\"runs\":[", "\"surprise\":1,\"runs\":[", 1)
            .as_bytes(),
        "unknown field",
    );
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["runs"][0]["run"]["block_size"] = serde_json::json!(1);
    check(v.to_string().as_bytes(), "block_size 1");
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["runs"][1]["records"]["target"] = serde_json::json!("AAAAAA==");
    check(v.to_string().as_bytes(), "record column target");
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["runs"][1]["run"]["uid"] = serde_json::json!("../../etc");
    check(v.to_string().as_bytes(), "uid");
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["runs"][1]["prompts"][0]["prompt_len"] = serde_json::json!(999999);
    check(v.to_string().as_bytes(), "prompt_len 999999 exceeds");
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["runs"][0]["stats"]["prompts"][0]["hist"] = serde_json::json!([1]);
    check(v.to_string().as_bytes(), "hist");
    // And the good one imports, once.
    let s = draftlens_web::bundle::import_bytes(
        &target,
        "ok.json",
        "ok.json",
        good.as_bytes(),
        64 << 20,
    )
    .unwrap();
    assert_eq!((s.imported.len(), s.skipped.len()), (2, 0));
    let s = draftlens_web::bundle::import_bytes(
        &target,
        "ok.json",
        "ok.json",
        good.as_bytes(),
        64 << 20,
    )
    .unwrap();
    assert_eq!((s.imported.len(), s.skipped.len()), (0, 2));
    // Records came along: the drill-down works on the imported copy.
    let id = target
        .run_id_by_uid(&bundle.runs[0].run.uid)
        .unwrap()
        .unwrap();
    assert_eq!(
        target.records(id).unwrap(),
        store.records(runs.checkpoints[0]).unwrap()
    );
}

#[tokio::test]
async fn team_mode_needs_tokens_and_share_links_grant_one_view() {
    let (_d, db, runs, _) = demo_db();
    let store = Store::open(&db).unwrap();
    let read = store.create_token("viewer", TokenScope::Read).unwrap();
    let write = store.create_token("owner", TokenScope::Write).unwrap();
    let addr = serve(&db, true, 1 << 20).await.unwrap();
    let c = runs.checkpoints[0];

    assert_eq!(get(addr, "/").await.unwrap().status, 401);
    assert_eq!(get(addr, &format!("/runs/{c}")).await.unwrap().status, 401);
    assert_eq!(
        get_with(addr, "/", &[("Authorization", "Bearer dl_wrong")])
            .await
            .unwrap()
            .status,
        401
    );
    let auth_r = format!("Bearer {read}");
    let auth_w = format!("Bearer {write}");
    assert_eq!(
        get_with(addr, "/", &[("Authorization", &auth_r)])
            .await
            .unwrap()
            .status,
        200
    );
    // Assets load without a token (the 401 page needs its stylesheet).
    assert_eq!(get(addr, "/assets/app.css").await.unwrap().status, 200);

    // ?token= sets an HttpOnly cookie and removes the token from the address.
    let r = get(addr, &format!("/runs/{c}?token={read}")).await.unwrap();
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location").unwrap(), format!("/runs/{c}"));
    let cookie = r.header("set-cookie").unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let cookie_hdr = cookie.split(';').next().unwrap().to_string();
    assert_eq!(
        get_with(addr, &format!("/runs/{c}"), &[("Cookie", &cookie_hdr)])
            .await
            .unwrap()
            .status,
        200
    );

    // Writing needs a write token.
    let r = post_form(
        addr,
        &format!("/runs/{c}/delete"),
        &[("Authorization", &auth_r)],
        "",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    assert!(store.run(c).unwrap().is_some());
    // A cross-site POST is refused even with a write token.
    let r = post_form(
        addr,
        &format!("/runs/{c}/delete"),
        &[
            ("Authorization", &auth_w),
            ("Origin", "http://evil.example"),
        ],
        "",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    assert!(store.run(c).unwrap().is_some());

    // Share: a write token saves the view; the link opens it without any token.
    let state = format!("/compare?runs={c},{}", runs.checkpoints[1]);
    let r = post_form(
        addr,
        "/share",
        &[("Authorization", &auth_w)],
        &format!("state={}", draftlens_web::qs::encode(&state)),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.text();
    let at = body.find(&format!("{addr}/s/")).unwrap() + addr.to_string().len();
    let id: String = body[at + 3..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    assert_eq!(id.len(), 10);
    let shared = get(addr, &format!("/s/{id}")).await.unwrap();
    assert_eq!(shared.status, 200);
    assert!(shared.text().contains("Comparing 2 runs"));
    // ... but nothing else.
    assert_eq!(get(addr, &format!("/runs/{c}")).await.unwrap().status, 401);
    // Sharing a foreign URL is refused.
    let r = post_form(
        addr,
        "/share",
        &[("Authorization", &auth_w)],
        "state=https%3A%2F%2Fevil.example%2F",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);

    // And a write token may delete.
    let r = post_form(
        addr,
        &format!("/runs/{c}/delete"),
        &[("Authorization", &auth_w)],
        "",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 303);
    assert!(store.run(c).unwrap().is_none());
}

#[tokio::test]
async fn serve_refuses_a_public_address_without_team_mode() {
    let d = tempfile::tempdir().unwrap();
    let opts = draftlens_web::ServeOptions {
        db: d.path().join("x.sqlite"),
        addr: "0.0.0.0:0".parse().unwrap(),
        ..Default::default()
    };
    let err = draftlens_web::serve(opts).await.unwrap_err().to_string();
    assert!(err.contains("without --team"), "{err}");
}

#[test]
fn compare_text_and_json_agree_and_pin_baseline() {
    let (_d, db, runs, _) = demo_db();
    let store = Store::open(&db).unwrap();
    let first = runs.checkpoints[0].to_string();
    let last = runs.checkpoints[2].to_string();
    let text = draftlens_web::compare_text(&store, &[first.clone(), last.clone()], None).unwrap();
    assert!(text.starts_with(&format!("baseline: #{first} ")), "{text}");
    assert!(text.contains("native/tau_replayed_macro ↑"), "{text}");
    // 12 shared prompts: an interval but no verdict, and the note says why.
    assert!(text.contains("too few prompts"), "{text}");
    assert!(!text.contains("accept_hist ↑"), "a count is ranked: {text}");
    assert!(text.contains("prompts shared with the baseline"));
    let v =
        draftlens_web::compare_json(&store, &[first.clone(), last.clone()], Some(&last)).unwrap();
    assert_eq!(v["baseline"], 1);
    let tau = v["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"]["name"] == "tau_replayed_macro")
        .unwrap();
    let d = &tau["deltas"][0];
    // The last checkpoint is better, so the first is below the baseline; with 12 shared prompts
    // (fewer than 20) the interval is a paired t-interval and there is no verdict.
    assert!(d["delta"].as_f64().unwrap() < 0.0);
    assert_eq!(d["verdict"], "too_few_prompts");
    assert_eq!(d["method"], "paired_t");
    assert_eq!(d["n"], 12);
    let (lo, hi) = (d["ci"][0].as_f64().unwrap(), d["ci"][1].as_f64().unwrap());
    assert!(lo < d["delta"].as_f64().unwrap() && d["delta"].as_f64().unwrap() < hi);
    // A pinned baseline is the default.
    store.pin_baseline("*", runs.checkpoints[2]).unwrap();
    let v = draftlens_web::compare_json(&store, &[first.clone(), last.clone()], None).unwrap();
    assert_eq!(v["baseline"], 1);
    // Unknown runs are one clear error.
    let err = draftlens_web::compare_text(&store, &[first, "zzzz".into()], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no run \"zzzz\""), "{err}");
}
