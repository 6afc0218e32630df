//! End-to-end test in a real headless Chromium (Debian's chromium + chromium-driver, driven over
//! WebDriver): run list → select runs → comparison with drawn charts → run page → drill-down →
//! top-K of an anchor → history; hostile text stays inert; an exported report opens from
//! file:// with no network request and drawn charts (its screenshots go to a temporary folder).
//! `screenshots_from_real_runs` writes docs/screenshots/ at 1280 px from a database of runs made
//! by `draftlens run` (`tools/screenshots.sh` makes one and runs it).
//!
//! Skips (with a message) when chromium or chromedriver is not installed; CI installs both.

mod support;

use draftlens_results::store::{Store, TokenScope};
use draftlens_web::demo::{fill_demo_db, DemoSpec};
use support::*;

/// Non-transparent pixels in the first drawn chart canvas (0 when none is drawn).
const CANVAS_INK: &str = r#"
    const c = document.querySelector('.chart[data-drawn] canvas');
    if (!c) return 0;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++;
    return n;
"#;

const PWNED: &str = "return window.__pwned === undefined";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_end_to_end() {
    if let Some(why) = browser_missing() {
        eprintln!("SKIPPED browser_end_to_end: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    // The hostile run first, so the demo runs fill the first page of the list screenshot.
    let evil = hostile_run(&store).unwrap();
    let runs = fill_demo_db(&store, &DemoSpec::showcase()).unwrap();
    let addr = serve(&db, false, 64 << 20).await.unwrap();
    let base = format!("http://{addr}");
    // Demo data: screenshots only prove the pages render; the documented ones come from real
    // runs (`screenshots_from_real_runs`).
    let shots = dir.path().join("shots");
    let br = Browser::start(1400, 1000).await.unwrap();

    // 1. Run list.
    br.goto(&format!("{base}/")).await.unwrap();
    br.wait_for("return document.querySelectorAll('table.runs tbody tr').length >= 20")
        .await
        .unwrap();
    let title = br.js("return document.title").await.unwrap();
    assert_eq!(title, "Runs · draftlens");
    assert_eq!(
        br.js(PWNED).await.unwrap(),
        true,
        "hostile run name executed script in the run list"
    );
    br.full_screenshot(1400, 1300, &shots.join("runs.png"))
        .await
        .unwrap();

    // 2. Select the last deployment checkpoint, the alternative drafter and a train-style run,
    // then compare: the form submission lands on the canonical URL.
    br.set_size(1400, 1000).await.unwrap();
    let last = *runs.checkpoints.last().unwrap();
    let picks = [last, runs.alternative.unwrap(), runs.train_style[1]];
    for id in picks {
        br.click(&format!("input[name=run][value='{id}']"))
            .await
            .unwrap();
    }
    br.click(".selbar button[type=submit]").await.unwrap();
    br.wait_for("return location.pathname === '/compare'")
        .await
        .unwrap();
    let url = br.url().await.unwrap();
    let (_, ids) = url.split_once("/compare?runs=").unwrap_or_default();
    let mut got: Vec<i64> = ids.split(',').filter_map(|x| x.parse().ok()).collect();
    got.sort();
    let mut want = picks.to_vec();
    want.sort();
    assert_eq!(got, want, "{url}");
    br.wait_for("return document.querySelectorAll('.chart[data-drawn] canvas').length >= 3")
        .await
        .unwrap();
    let ink = br.js(CANVAS_INK).await.unwrap().as_u64().unwrap();
    assert!(
        ink > 1000,
        "comparison chart canvas looks blank ({ink} inked pixels)"
    );
    let verdicts = br
        .js("return document.querySelectorAll('td.v-better, td.v-worse').length")
        .await
        .unwrap()
        .as_u64()
        .unwrap();
    assert!(verdicts > 0, "no significant difference is coloured");
    assert!(br
        .js("return document.body.innerText.includes('Training-style vs deployment')")
        .await
        .unwrap()
        .as_bool()
        .unwrap());
    br.full_screenshot(1400, 3200, &shots.join("compare.png"))
        .await
        .unwrap();

    // 3. Run page → first prompt → drill-down → click a bonus token to see its anchor's top-K.
    br.set_size(1400, 1000).await.unwrap();
    br.goto(&format!("{base}/runs/{last}")).await.unwrap();
    br.wait_for("return document.querySelectorAll('.chart[data-drawn] canvas').length >= 3")
        .await
        .unwrap();
    br.full_screenshot(1400, 2400, &shots.join("run.png"))
        .await
        .unwrap();
    br.set_size(1400, 1000).await.unwrap();
    br.click("table a[href*='/prompts/']").await.unwrap();
    br.wait_for("return document.querySelectorAll('.text .tok.acc').length > 5")
        .await
        .unwrap();
    let counts = br
        .js("return [document.querySelectorAll('.tok.acc').length, document.querySelectorAll('.tok.rej').length, document.querySelectorAll('.tok.bonus').length]")
        .await
        .unwrap();
    assert!(
        counts[1].as_u64().unwrap() > 0 && counts[2].as_u64().unwrap() > 0,
        "no rejected or bonus tokens: {counts}"
    );
    br.click(".text a.tok.bonus").await.unwrap();
    br.wait_for(
        "return location.search.includes('anchor=') && !!document.querySelector('#topk table')",
    )
    .await
    .unwrap();
    let rows = br
        .js("return document.querySelectorAll('#topk tbody tr').length")
        .await
        .unwrap();
    assert_eq!(
        rows, 15,
        "top-K table should list the B−1 = 15 drafted positions"
    );
    br.full_screenshot(1400, 2200, &shots.join("drilldown.png"))
        .await
        .unwrap();

    // 4. τ vs checkpoint step.
    br.set_size(1400, 1000).await.unwrap();
    br.goto(&format!("{base}/history")).await.unwrap();
    br.wait_for("return !!document.querySelector('.chart[data-drawn] canvas')")
        .await
        .unwrap();
    let points = br
        .js("return document.querySelectorAll('table tbody tr').length")
        .await
        .unwrap();
    assert_eq!(points, runs.checkpoints.len() as u64);
    br.full_screenshot(1400, 1400, &shots.join("history.png"))
        .await
        .unwrap();

    // 5. Hostile text: pages that show it run no script.
    for path in [
        "/?q=evil".to_string(),
        format!("/runs/{evil}"),
        format!("/runs/{evil}/prompts/0?anchor=12"),
        format!("/compare?runs={evil},{last}"),
    ] {
        br.goto(&format!("{base}{path}")).await.unwrap();
        br.wait_for("return document.readyState === 'complete'")
            .await
            .unwrap();
        assert_eq!(
            br.js(PWNED).await.unwrap(),
            true,
            "{path}: hostile text executed script"
        );
        let shown = br
            .js("return document.body.innerText.includes('<script>window.__pwned=1</script>')")
            .await
            .unwrap();
        assert_eq!(
            shown, true,
            "{path}: the hostile text should be visible as text"
        );
    }

    // 6. Export a report and open it from file://: charts drawn, nothing loaded from anywhere.
    let report = get(
        addr,
        &format!("/report?runs={},{}", runs.checkpoints[0], last),
    )
    .await
    .unwrap();
    assert_eq!(report.status, 200);
    let file = dir.path().join("report.html");
    std::fs::write(&file, &report.body).unwrap();
    br.set_size(1400, 1000).await.unwrap();
    br.goto(&format!("file://{}", file.display()))
        .await
        .unwrap();
    br.wait_for("return document.querySelectorAll('.chart[data-drawn] canvas').length >= 3")
        .await
        .unwrap();
    let ink = br.js(CANVAS_INK).await.unwrap().as_u64().unwrap();
    assert!(
        ink > 1000,
        "report chart canvas looks blank ({ink} inked pixels)"
    );
    let resources = br
        .js("return performance.getEntriesByType('resource').map(e => e.name)")
        .await
        .unwrap();
    assert_eq!(
        resources,
        serde_json::json!([]),
        "the report loaded resources: {resources}"
    );
    let has_bundle = br.js("return JSON.parse(document.getElementById('draftlens-bundle').textContent).runs.length").await.unwrap();
    assert_eq!(has_bundle, 2);
    br.full_screenshot(1400, 2600, &shots.join("report.png"))
        .await
        .unwrap();

    br.quit().await.unwrap();
}

/// Every state-changing control of the UI, clicked in Chromium (whose form posts carry
/// `Sec-Fetch-Site: same-origin` and, under strict referrer policies, `Origin: null`), with the
/// database checked after each: pin and unpin a baseline, share a view, delete a run, import a
/// report through the upload form; then in team mode the token page and a write action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_every_action_changes_the_database() {
    if let Some(why) = browser_missing() {
        eprintln!("SKIPPED browser_every_action_changes_the_database: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    let runs = fill_demo_db(&store, &DemoSpec::small()).unwrap();
    let (a, b) = (runs.checkpoints[0], runs.checkpoints[1]);
    let uid_a = store.run(a).unwrap().unwrap().run.uid;
    let addr = serve(&db, false, 64 << 20).await.unwrap();
    let base = format!("http://{addr}");
    // A report of run A, imported again after A is deleted.
    let report = get(addr, &format!("/report?runs={a}")).await.unwrap();
    assert_eq!(report.status, 200);
    let report_file = dir.path().join("report-a.html");
    std::fs::write(&report_file, &report.body).unwrap();

    let br = Browser::start(1280, 900).await.unwrap();
    let refused = "return document.body.innerText.includes('refused')";

    // Pin, then unpin, run A as the baseline.
    br.goto(&format!("{base}/runs/{a}")).await.unwrap();
    br.click("form[action='/baseline'] button").await.unwrap();
    br.wait_for("return document.body.innerText.includes('Unpin baseline')")
        .await
        .unwrap_or_else(|e| panic!("pin: {e}; page: {}", block_text(&br)));
    assert_eq!(br.js(refused).await.unwrap(), false);
    let pinned: Vec<i64> = store.baselines().unwrap().iter().map(|x| x.1).collect();
    assert_eq!(pinned, vec![a], "pin did not reach the database");
    br.click("form[action='/baseline'] button").await.unwrap();
    br.wait_for("return document.body.innerText.includes('Pin as baseline')")
        .await
        .unwrap();
    assert!(
        store.baselines().unwrap().is_empty(),
        "unpin did not reach the database"
    );

    // Share the comparison page: the saved link opens the same view.
    br.goto(&format!("{base}/compare?runs={a},{b}"))
        .await
        .unwrap();
    br.click("form[action='/share'] button").await.unwrap();
    br.wait_for("return document.body.innerText.includes('Link saved')")
        .await
        .unwrap();
    let link = br
        .js("return document.querySelector('input[readonly]').value")
        .await
        .unwrap();
    let link = link.as_str().unwrap().to_string();
    let id = link.rsplit("/s/").next().unwrap();
    assert_eq!(
        store.share(id).unwrap().as_deref(),
        Some(format!("/compare?runs={a},{b}").as_str()),
        "share did not reach the database"
    );
    br.goto(&link).await.unwrap();
    br.wait_for("return document.title.startsWith('Compare')")
        .await
        .unwrap();

    // Delete run A (behind a disclosure, as a person would open it).
    br.goto(&format!("{base}/runs/{a}")).await.unwrap();
    br.click("details summary.danger").await.unwrap();
    br.click(&format!("form[action='/runs/{a}/delete'] button"))
        .await
        .unwrap();
    br.wait_for("return location.search.includes('deleted=')")
        .await
        .unwrap();
    assert!(
        store.run(a).unwrap().is_none(),
        "delete did not reach the database"
    );

    // Import its report through the upload form.
    br.goto(&format!("{base}/import")).await.unwrap();
    br.send_keys("input[type=file]", report_file.to_str().unwrap())
        .await
        .unwrap();
    br.click("form[action='/import'] button").await.unwrap();
    br.wait_for("return !!document.querySelector('.ok, .err')")
        .await
        .unwrap();
    let msg = br.text().await.unwrap();
    assert!(
        store.run_id_by_uid(&uid_a).unwrap().is_some(),
        "import did not reach the database: {msg}"
    );

    // Team mode: the token page, then a write action with the cookie it set.
    let write = store.create_token("owner", TokenScope::Write).unwrap();
    let read = store.create_token("viewer", TokenScope::Read).unwrap();
    let team = serve(&db, true, 64 << 20).await.unwrap();
    let tbase = format!("http://{team}");
    br.goto(&format!("{tbase}/runs/{b}")).await.unwrap();
    assert!(br.text().await.unwrap().contains("needs a token"));
    br.send_keys("input[name=token]", &read).await.unwrap();
    br.click("form button[type=submit]").await.unwrap();
    br.wait_for("return document.title === 'Runs · draftlens'")
        .await
        .unwrap();
    assert!(br.text().await.unwrap().contains("read-only"));
    br.goto(&format!("{tbase}/runs/{b}")).await.unwrap();
    assert_eq!(
        br.js("return !!document.querySelector(\"form[action='/baseline']\")")
            .await
            .unwrap(),
        false,
        "a read token is offered a write action"
    );
    br.goto(&format!("{tbase}/?token={write}")).await.unwrap();
    br.wait_for("return document.body.innerText.includes('write access')")
        .await
        .unwrap();
    br.goto(&format!("{tbase}/runs/{b}")).await.unwrap();
    br.click("form[action='/baseline'] button").await.unwrap();
    br.wait_for("return document.body.innerText.includes('Unpin baseline')")
        .await
        .unwrap();
    let pinned: Vec<i64> = store.baselines().unwrap().iter().map(|x| x.1).collect();
    assert_eq!(pinned, vec![b], "team-mode pin did not reach the database");
    br.quit().await.unwrap();
}

fn block_text(br: &Browser) -> String {
    let h = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| h.block_on(br.text())).unwrap_or_default()
}

/// The documentation's screenshots (docs/screenshots/, 1280 px wide) from a database of runs made
/// by `draftlens run` (`tools/screenshots.sh`): set `DRAFTLENS_SHOTS_DB`; skipped otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_from_real_runs() {
    let Ok(db) = std::env::var("DRAFTLENS_SHOTS_DB") else {
        eprintln!("SKIPPED screenshots_from_real_runs: DRAFTLENS_SHOTS_DB is not set");
        return;
    };
    if let Some(why) = browser_missing() {
        eprintln!("SKIPPED screenshots_from_real_runs: {why}");
        return;
    }
    use draftlens_results::store::{RunFilter, RunMode};
    const W: u32 = 1280;
    let db = std::path::PathBuf::from(db);
    let store = Store::open(&db).unwrap();
    let (rows, _) = store
        .runs(&RunFilter {
            limit: 100,
            ..Default::default()
        })
        .unwrap();
    let mut deployment: Vec<_> = rows
        .iter()
        .map(|r| &r.run)
        .filter(|r| r.mode == RunMode::Deployment && r.drafter_step.is_some())
        .collect();
    deployment.sort_by_key(|r| r.drafter_step);
    let train: Vec<_> = rows
        .iter()
        .map(|r| &r.run)
        .filter(|r| r.mode == RunMode::TrainStyle)
        .collect();
    assert!(deployment.len() >= 2, "the database needs checkpoint runs");
    let last = deployment.last().unwrap().id;
    let mut picks: Vec<i64> = deployment.iter().map(|r| r.id).collect();
    picks.extend(train.iter().map(|r| r.id));
    let addr = serve(&db, false, 64 << 20).await.unwrap();
    let base = format!("http://{addr}");
    let shots = screenshots_dir();
    let br = Browser::start(W, 900).await.unwrap();
    let charts = |n: usize| {
        format!("return document.querySelectorAll('.chart[data-drawn] canvas').length >= {n}")
    };

    br.goto(&format!("{base}/")).await.unwrap();
    // Every default column fits: the table is no wider than the window.
    let overflow = br
        .js("const t = document.querySelector('table.runs'); return t.scrollWidth - t.parentElement.clientWidth")
        .await
        .unwrap();
    assert!(
        overflow.as_i64().unwrap() <= 0,
        "run list overflows at {W} px by {overflow} px"
    );
    br.full_screenshot(W, 1200, &shots.join("runs.png"))
        .await
        .unwrap();

    br.set_size(W, 900).await.unwrap();
    let ids: Vec<String> = picks.iter().map(|i| i.to_string()).collect();
    br.goto(&format!(
        "{base}/compare?runs={}&baseline={last}",
        ids.join(",")
    ))
    .await
    .unwrap();
    br.wait_for(&charts(3)).await.unwrap();
    br.full_screenshot(W, 3200, &shots.join("compare.png"))
        .await
        .unwrap();

    br.set_size(W, 900).await.unwrap();
    br.goto(&format!("{base}/runs/{last}")).await.unwrap();
    br.wait_for(&charts(3)).await.unwrap();
    br.full_screenshot(W, 2400, &shots.join("run.png"))
        .await
        .unwrap();

    br.set_size(W, 900).await.unwrap();
    br.click("table a[href*='/prompts/']").await.unwrap();
    br.wait_for("return document.querySelectorAll('.text .tok').length > 5")
        .await
        .unwrap();
    if br
        .js("return !!document.querySelector('.text a.tok.bonus')")
        .await
        .unwrap()
        == true
    {
        br.click(".text a.tok.bonus").await.unwrap();
        br.wait_for("return !!document.querySelector('#topk table')")
            .await
            .unwrap();
    }
    br.full_screenshot(W, 2200, &shots.join("drilldown.png"))
        .await
        .unwrap();

    br.set_size(W, 900).await.unwrap();
    br.goto(&format!("{base}/history")).await.unwrap();
    br.wait_for(&charts(1)).await.unwrap();
    br.full_screenshot(W, 1400, &shots.join("history.png"))
        .await
        .unwrap();

    let report = get(addr, &format!("/report?runs={}", ids.join(",")))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.html");
    std::fs::write(&file, &report.body).unwrap();
    br.set_size(W, 900).await.unwrap();
    br.goto(&format!("file://{}", file.display()))
        .await
        .unwrap();
    br.wait_for(&charts(3)).await.unwrap();
    br.full_screenshot(W, 2600, &shots.join("report.png"))
        .await
        .unwrap();
    br.quit().await.unwrap();
}
