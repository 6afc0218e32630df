//! A trace run against its reference drafter in a real headless Chromium (docs/traces.md §6):
//! the trace run and draftlens's run of the reference drafter picked in the run list and
//! compared by clicking; the panel's numbers and lines checked against the database (the
//! import's stored τ, the stored diff's rows) and against answers worked out from the fixture's
//! rules; then the drill-down, reached from the panel's link: the prompts whose rounds differ
//! in order, one opened by its link and one expanded by a click, each row's round, position,
//! tokens and text checked against the stored diff, the run's tokens and the stored vocabulary.
//! Skips (with a message) without chromium / chromedriver.

mod support;
mod trace_fixture;

use draftlens_results::metrics::SOURCE;
use draftlens_results::store::{MetricScope, Store};
use draftlens_results::trace::StoredCorrection;
use draftlens_web::compare::trace_diff::{summarize, summary_lines};
use serde_json::Value;
use support::*;
use trace_fixture::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// The rows of one prompt's table as the page shows them.
async fn rows(br: &Browser, index: u32) -> Vec<Value> {
    let v = br
        .js(&format!(
            "return [...document.querySelectorAll('details#prompt-{index} table.tdiff-rounds tbody tr')].map(tr => ({{
                round: +tr.dataset.round, anchor: +tr.dataset.anchor,
                engine: +tr.querySelector('td.engine').dataset.count,
                engine_ids: tr.querySelector('td.engine').dataset.ids,
                engine_text: tr.querySelector('td.engine code.text').textContent,
                reference: +tr.querySelector('td.reference').dataset.count,
                reference_ids: tr.querySelector('td.reference').dataset.ids,
                reference_text: tr.querySelector('td.reference code.text').textContent,
                visible: tr.getBoundingClientRect().height > 0 }}))"
        ))
        .await
        .unwrap();
    v.as_array().unwrap().clone()
}

/// With `TRACE_DIFF_SHOTS=DIR`, a screenshot of the page to DIR/name (for looking at it).
async fn shot(br: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("TRACE_DIFF_SHOTS") {
        br.full_screenshot(1400, 3000, &std::path::Path::new(&dir).join(name))
            .await
            .unwrap();
    }
}

fn ids_text(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_panel_and_drill_down_show_the_stored_diff() {
    if let Some(why) = browser_missing() {
        eprintln!("SKIPPED compare_panel_and_drill_down_show_the_stored_diff: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    let f = build(&store, dir.path());

    // What the database says.
    let trace = store.run(f.trace_run).unwrap().unwrap().run;
    let (_, stored) = store.trace_diff(f.diff).unwrap().unwrap();
    let summary = summarize(&stored, &trace.uid);
    let lines = summary_lines(&summary, &StoredCorrection::of_config(&trace.config));
    let stored_tau = store
        .metrics(f.trace_run)
        .unwrap()
        .into_iter()
        .find(|m| {
            m.source == SOURCE && m.name == "tau_replayed_pooled" && m.scope == MetricScope::Run
        })
        .unwrap()
        .value;
    let (_, vocab) = store.vocab(TOKENIZER_SHA).unwrap().unwrap();
    let text =
        |ids: &[u32]| -> String { ids.iter().map(|&i| vocab[i as usize].as_str()).collect() };

    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let base = format!("http://{addr}");
    let br = Browser::start(1400, 1000).await.unwrap();
    br.goto(&format!("{base}/")).await.unwrap();
    br.wait_for("return document.querySelectorAll('table.runs tbody tr').length >= 2")
        .await
        .unwrap();
    for id in [f.reference_run, f.trace_run] {
        br.click(&format!("input[name=run][value='{id}']"))
            .await
            .unwrap();
    }
    br.click(".selbar button[type=submit]").await.unwrap();
    br.wait_for("return location.pathname === '/compare' && !!document.querySelector('.trace-diff .tdiff-summary')")
        .await
        .unwrap();

    // The panel: the numbers at full precision, then its lines as `trace diff` prints them.
    let d = br
        .js("const p = document.querySelector('.trace-diff'); return Object.assign({run: p.dataset.run, diff: p.dataset.diff}, p.querySelector('.tdiff-summary').dataset)")
        .await
        .unwrap();
    assert_eq!(num(&d, "run") as i64, f.trace_run);
    assert_eq!(num(&d, "diff") as i64, f.diff);
    let engine_tau = num(&d, "engineTau");
    assert!(
        close(engine_tau, stored_tau),
        "engine τ {engine_tau} vs the import's {stored_tau}"
    );
    let (ct, cr) = f
        .prompts
        .iter()
        .map(|p| p.reference_chain())
        .fold((0, 0), |(a, b), (t, r)| (a + t, b + r));
    let reference_tau = num(&d, "referenceTau");
    assert!(
        close(reference_tau, ct as f64 / cr as f64),
        "reference τ {reference_tau}"
    );
    let tau_delta = summary.tau_delta.as_ref().unwrap();
    assert!(close(num(&d, "tauDelta"), reference_tau - engine_tau));
    assert!(close(num(&d, "tauLo"), tau_delta.interval.unwrap().lo));
    assert!(close(num(&d, "tauHi"), tau_delta.interval.unwrap().hi));
    let rounds: u64 = f.prompts.iter().map(|p| p.rounds.len() as u64).sum();
    let lost = f.prompts.iter().map(|p| p.tokens_lost()).sum::<i64>() as f64 / rounds as f64;
    assert!(
        close(num(&d, "lost"), lost),
        "lost {} vs {lost}",
        num(&d, "lost")
    );
    assert!(num(&d, "lostLo") > 0.0, "the loss's interval excludes 0");
    let shown: Vec<String> = serde_json::from_value(
        br.js("return [...document.querySelectorAll('.trace-diff .tdiff-summary .line')].map(e => e.textContent)")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(shown, lines);
    let verdict = br
        .js("return document.querySelector('.trace-diff .verdict-line').textContent")
        .await
        .unwrap();
    assert_eq!(verdict, summary.verdict.as_str());
    assert!(summary
        .verdict
        .starts_with(&format!("the integration loses {lost:.3} tokens per round")));
    assert!(
        shown
            .iter()
            .any(|l| l.trim_start().starts_with("tokens-after-eos")),
        "the import's correction is listed: {shown:?}"
    );

    shot(&br, "compare.png").await;

    // The link from the summary to the drill-down.
    br.click(".trace-diff a.drill").await.unwrap();
    br.wait_for(&format!(
        "return location.pathname === '/runs/{}/trace-diff' && !!document.querySelector('table.tdiff-index')",
        f.trace_run
    ))
    .await
    .unwrap();
    let listed: Vec<u32> = stored
        .iter()
        .filter(|p| !p.first_rounds.is_empty())
        .map(|p| p.index)
        .collect();
    let index: Vec<u32> = serde_json::from_value(
        br.js("return [...document.querySelectorAll('table.tdiff-index tbody tr')].map(tr => +tr.dataset.index)")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        index, listed,
        "the prompts whose rounds differ, in prompt order"
    );
    let sections: Vec<u32> = serde_json::from_value(
        br.js("return [...document.querySelectorAll('details.tdiff-prompt')].map(e => +e.dataset.index)")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(sections, listed);
    let open = br
        .js("return document.querySelectorAll('details.tdiff-prompt[open]').length")
        .await
        .unwrap();
    assert_eq!(open, 0, "nothing is open before a prompt is chosen");

    // Prompt 4's link opens its rounds (two differ: rounds 1 and 3).
    br.click("table.tdiff-index tr[data-index='4'] a.open-prompt")
        .await
        .unwrap();
    br.wait_for("return new URLSearchParams(location.search).get('prompt') === '4' && document.querySelector('details#prompt-4').open")
        .await
        .unwrap();
    let p4 = stored.iter().find(|p| p.index == 4).unwrap();
    let tokens4 = &f.prompts[4].ids;
    let shown = rows(&br, 4).await;
    assert_eq!(shown.len(), p4.first_rounds.len());
    assert_eq!(
        p4.first_rounds.iter().map(|r| r.round).collect::<Vec<_>>(),
        [1, 3]
    );
    for (row, r) in shown.iter().zip(&p4.first_rounds) {
        let from = r.anchor as usize + 1;
        let engine_ids = &tokens4[from..from + r.engine as usize];
        assert_eq!(row["visible"], true, "{row}");
        assert_eq!(row["round"], r.round, "{row}");
        assert_eq!(row["anchor"], r.anchor, "{row}");
        assert_eq!(
            (row["engine"].as_u64(), row["reference"].as_u64()),
            (Some(r.engine as u64), Some(r.reference as u64))
        );
        assert_eq!(row["engine_ids"], ids_text(engine_ids));
        assert_eq!(row["reference_ids"], ids_text(&r.reference_ids));
        assert_eq!(row["engine_text"], text(engine_ids));
        assert_eq!(row["reference_text"], text(&r.reference_ids));
    }
    // The same rows as the fixture's rules give (engine 1 then 2 tokens, the reference 4).
    let expected = f.prompts[4].expected_rounds();
    assert_eq!(
        shown
            .iter()
            .map(|r| (
                r["engine"].as_u64().unwrap(),
                r["reference"].as_u64().unwrap()
            ))
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|r| (r.engine as u64, r.reference as u64))
            .collect::<Vec<_>>()
    );
    let closed = br
        .js("return document.querySelector('details#prompt-0').open")
        .await
        .unwrap();
    assert_eq!(closed, false);

    // Expanding prompt 0 by a click: the reference's tokens are the target's greedy ones (998
    // where the engine departed from them), the engine's its own.
    br.click("details#prompt-0 > summary").await.unwrap();
    br.wait_for("return document.querySelector('details#prompt-0').open")
        .await
        .unwrap();
    shot(&br, "drill-down.png").await;
    let shown = rows(&br, 0).await;
    let r0 = &stored[0].first_rounds[0];
    assert_eq!(shown[0]["visible"], true);
    assert_eq!(shown[0]["reference_text"], text(&r0.reference_ids));
    assert!(
        shown[0]["reference_text"]
            .as_str()
            .unwrap()
            .contains("w998 "),
        "{}",
        shown[0]
    );
    assert!(
        !shown[0]["engine_text"].as_str().unwrap().contains("w998"),
        "{}",
        shown[0]
    );

    // Every prompt's rows are in decode order and are the stored ones.
    let all = br
        .js("return [...document.querySelectorAll('details.tdiff-prompt')].map(e => [+e.dataset.index, [...e.querySelectorAll('tbody tr')].map(tr => +tr.dataset.round)])")
        .await
        .unwrap();
    let want: Vec<(u32, Vec<usize>)> = stored
        .iter()
        .filter(|p| !p.first_rounds.is_empty())
        .map(|p| (p.index, p.first_rounds.iter().map(|r| r.round).collect()))
        .collect();
    let got: Vec<(u32, Vec<usize>)> = serde_json::from_value(all).unwrap();
    assert_eq!(got, want);
    for (_, rounds) in &got {
        assert!(rounds.windows(2).all(|w| w[0] < w[1]), "{rounds:?}");
    }
    br.quit().await.unwrap();
}
