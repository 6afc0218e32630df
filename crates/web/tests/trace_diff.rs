//! A trace run against its reference drafter on the web (docs/traces.md §6): the view models
//! (`compare::trace_diff::of_runs`, `drill_down`) against answers worked out from the fixture's
//! rules, and over HTTP the compare page and its JSON, the drill-down page and its bad requests,
//! the static report, and a diff stored again showing up on a cached comparison.

mod support;
mod trace_fixture;

use draftlens_results::metrics::SOURCE;
use draftlens_results::store::{MetricScope, NewRun, NewTraceDiff, Store};
use draftlens_results::trace::StoredCorrection;
use draftlens_web::compare::trace_diff::{
    delta_text, drill_down, of_runs, summarize, summary_lines, tau_text, DrillRound,
};
use support::*;
use trace_fixture::*;

fn setup() -> (tempfile::TempDir, std::path::PathBuf, Store, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    let f = build(&store, dir.path());
    (dir, db, store, f)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn the_view_models_hold_what_the_engine_and_the_reference_did() {
    let (_d, _db, store, f) = setup();
    let trace = store.run(f.trace_run).unwrap().unwrap().run;
    let reference = store.run(f.reference_run).unwrap().unwrap().run;

    // The compare page's section: one diff, the reference run recognised by its weights.
    let sections = of_runs(&store, &[reference.clone(), trace.clone()]).unwrap();
    assert_eq!(sections.len(), 1);
    let t = &sections[0];
    assert_eq!(
        (t.run, t.diff.id, t.reference_runs.clone()),
        (1, f.diff, vec![0])
    );
    let s = &t.summary;
    // τ of the engine: Σ tokens / Σ rounds of its (normalised) rounds = the import's stored τ.
    let rounds: u64 = f.prompts.iter().map(|p| p.rounds.len() as u64).sum();
    let tokens: u64 = f
        .prompts
        .iter()
        .map(|p| p.rounds.iter().map(|&c| c as u64).sum::<u64>())
        .sum();
    let stored_tau = store
        .metrics(f.trace_run)
        .unwrap()
        .into_iter()
        .find(|m| {
            m.source == SOURCE && m.name == "tau_replayed_pooled" && m.scope == MetricScope::Run
        })
        .unwrap()
        .value;
    assert!(close(
        s.engine_tau_pooled.unwrap(),
        tokens as f64 / rounds as f64
    ));
    assert!(close(s.engine_tau_pooled.unwrap(), stored_tau));
    let (ct, cr) = f
        .prompts
        .iter()
        .map(|p| p.reference_chain())
        .fold((0, 0), |(a, b), (t, r)| (a + t, b + r));
    assert!(close(
        s.reference_tau_pooled.unwrap(),
        ct as f64 / cr as f64
    ));
    let lost: i64 = f.prompts.iter().map(|p| p.tokens_lost()).sum();
    let lost = lost as f64 / rounds as f64;
    let shown = s.tokens_lost_per_round.as_ref().unwrap();
    assert!(close(shown.value, lost), "{} vs {lost}", shown.value);
    // 12 prompts lose 3 tokens in round 1, 6 of them 2 more in round 3; 4 gain 2: a loss.
    assert!(lost > 0.0 && shown.interval.unwrap().lo > 0.0);
    assert!(
        s.verdict
            .starts_with(&format!("the integration loses {lost:.3} tokens per round against the reference drafter (95% CI [")),
        "{}",
        s.verdict
    );
    assert_eq!(s.departures, 1);
    // The import cut prompt 23 after its end-of-generation token: the correction is listed.
    assert!(
        t.corrections
            .iter()
            .any(|c| c.name == "tokens-after-eos" && c.effect.requests == 1),
        "{:?}",
        t.corrections
    );

    // The drill-down: the prompts whose rounds differ, in order, each with its rounds.
    let dd = drill_down(&store, &trace, None).unwrap().unwrap();
    assert_eq!(dd.summary, t.summary);
    let expected: Vec<(u32, Vec<ExpectedRound>)> = f
        .prompts
        .iter()
        .map(|p| (p.index, p.expected_rounds()))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    let indexes: Vec<u32> = dd.prompts.iter().map(|p| p.index).collect();
    assert_eq!(indexes, expected.iter().map(|e| e.0).collect::<Vec<_>>());
    // Even prompts and i ≡ 3 (mod 6): 12 + 4.
    assert_eq!(indexes.len(), 16);
    for (p, (_, rounds)) in dd.prompts.iter().zip(&expected) {
        let want: Vec<DrillRound> = rounds
            .iter()
            .map(|r| DrillRound {
                round: r.round,
                anchor: r.anchor,
                engine: r.engine,
                reference: r.reference,
                engine_ids: r.engine_ids.clone(),
                reference_ids: r.reference_ids.clone(),
            })
            .collect();
        assert_eq!(p.listed, want, "prompt {}", p.index);
    }
    // Prompt 0: the reference's tokens are the target's, 998 where the engine departs.
    assert_eq!(dd.prompts[0].listed[0].reference_ids[1], 998);
    assert_eq!(
        dd.prompts[0].departure_positions,
        [(PROMPT_LEN + 6) as usize]
    );
    // Another run's diff id, or a run without diffs: nothing.
    assert!(drill_down(&store, &reference, Some(f.diff))
        .unwrap()
        .is_none());
    assert!(drill_down(&store, &reference, None).unwrap().is_none());
}

#[tokio::test]
async fn the_compare_page_and_the_drill_down_over_http() {
    let (_d, db, store, f) = setup();
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let trace = store.run(f.trace_run).unwrap().unwrap().run;
    let (_, prompts) = store.trace_diff(f.diff).unwrap().unwrap();
    let summary = summarize(&prompts, &f.trace_uid);
    let corrections = StoredCorrection::of_config(&trace.config);

    // The JSON of the comparison holds the summary as `trace diff --json` does.
    let runs = format!("{},{}", f.reference_run, f.trace_run);
    let json: serde_json::Value = serde_json::from_str(
        &get(addr, &format!("/compare?runs={runs}&format=json"))
            .await
            .unwrap()
            .text(),
    )
    .unwrap();
    assert_eq!(
        json["trace_diffs"][0]["summary"],
        serde_json::to_value(&summary).unwrap()
    );
    assert_eq!(
        json["trace_diffs"][0]["diff"]["drafter_sha256"],
        DRAFTER_SHA
    );

    // The page shows every line `trace diff` prints, as it prints them.
    let page = get(addr, &format!("/compare?runs={runs}")).await.unwrap();
    assert_eq!(page.status, 200);
    let html = page.text();
    for piece in [
        tau_text(summary.engine_tau_pooled),
        tau_text(summary.reference_tau_pooled),
        delta_text(&summary.tau_delta),
        delta_text(&summary.tokens_lost_per_round),
        summary.verdict.clone(),
        format!("{}/trace-diff?diff={}", f.trace_run, f.diff),
    ] {
        assert!(
            html.contains(&escape(&piece)),
            "compare page lacks {piece:?}"
        );
    }
    let lines = summary_lines(&summary, &corrections);
    assert!(
        lines.iter().any(|l| l.contains("tokens-after-eos")),
        "{lines:?}"
    );
    for line in lines {
        let div = format!(">{}</", escape(&line));
        assert!(html.contains(&div), "compare page lacks the line {line:?}");
    }

    // The drill-down page and its bad requests.
    let dd = get(addr, &format!("/runs/{}/trace-diff", f.trace_run))
        .await
        .unwrap();
    assert_eq!(dd.status, 200);
    let text = dd.text();
    assert!(text.contains("id=\"prompt-0\"") && text.contains("id=\"prompt-22\""));
    assert!(
        !text.contains("id=\"prompt-1\""),
        "prompt 1 has no round that differs"
    );
    // The decoded text of prompt 0's first differing round, as the reference would commit it.
    let r0 = &f.prompts[0].expected_rounds()[0];
    let words: String = r0.reference_ids.iter().map(|&i| piece(i)).collect();
    assert!(text.contains(&words), "no {words:?}");
    let opened = get(
        addr,
        &format!("/runs/{}/trace-diff?diff={}&prompt=4", f.trace_run, f.diff),
    )
    .await
    .unwrap()
    .text();
    assert!(
        opened.contains("id=\"prompt-4\" data-index=\"4\" open"),
        "prompt 4 is not opened"
    );
    assert!(!opened.contains("id=\"prompt-0\" data-index=\"0\" open"));
    for (path, status) in [
        (format!("/runs/{}/trace-diff?diff=9999", f.trace_run), 404),
        (format!("/runs/{}/trace-diff", f.reference_run), 404),
        ("/runs/9999/trace-diff".to_string(), 404),
        (format!("/runs/{}/trace-diff?diff=x", f.trace_run), 400),
        (format!("/runs/{}/trace-diff?prompt=x", f.trace_run), 400),
    ] {
        assert_eq!(get(addr, &path).await.unwrap().status, status, "{path}");
    }

    // A comparison without a trace run has no trace_diffs key (the JSON as before).
    let plain = store
        .create_run(&NewRun {
            name: "plain".into(),
            block_size: 4,
            top_k: 1,
            ..Default::default()
        })
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(
        &get(
            addr,
            &format!("/compare?runs={},{plain}&format=json", f.reference_run),
        )
        .await
        .unwrap()
        .text(),
    )
    .unwrap();
    assert!(json.get("trace_diffs").is_none(), "{json}");

    // Diffing again against the same drafter replaces the diff; the cached comparison follows.
    let fewer = &prompts[..5];
    let again = store
        .put_trace_diff(
            f.trace_run,
            &NewTraceDiff {
                drafter_path: "ckpts/reference/step-9",
                drafter_sha256: DRAFTER_SHA,
                target_path: "models/fake",
                backend: "cpu",
                prompts: fewer,
            },
        )
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(
        &get(addr, &format!("/compare?runs={runs}&format=json"))
            .await
            .unwrap()
            .text(),
    )
    .unwrap();
    assert_eq!(json["trace_diffs"].as_array().unwrap().len(), 1);
    assert_eq!(json["trace_diffs"][0]["diff"]["id"], again);
    assert_eq!(json["trace_diffs"][0]["summary"]["prompts"], 5);
    assert!(json["trace_diffs"][0]["summary"]["verdict"]
        .as_str()
        .unwrap()
        .starts_with("no verdict: 5 prompts"));
}

#[test]
fn the_report_shows_the_summary_without_links_to_the_server() {
    let (_d, _db, store, f) = setup();
    let html = draftlens_web::render_report(
        &store,
        &[f.reference_run.to_string(), f.trace_run.to_string()],
        &Default::default(),
    )
    .unwrap();
    assert!(html.contains("Engine against its reference drafter"));
    let (_, prompts) = store.trace_diff(f.diff).unwrap().unwrap();
    let summary = summarize(&prompts, &f.trace_uid);
    assert!(html.contains(&escape(&summary.verdict)));
    assert!(
        !html.contains("/trace-diff"),
        "a report links to no server route"
    );
}

/// Text as maud escapes it.
fn escape(s: &str) -> String {
    maud::html! { (s) }.into_string()
}
