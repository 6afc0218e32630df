//! Workload-slice facets (docs/slices.md): runs stored with different slices (thinking on/off,
//! one unsliced) are filtered by the run list's facet menus (over HTTP, and by clicking in a real
//! headless Chromium: skipped with a message without chromium / chromedriver), and grouped and
//! filtered by `compare --where / --group-by`; every check is against what the database holds
//! (`Store::run_slices`, the stored τ).

mod support;

use draftlens_records::{RecordBatch, Region};
use draftlens_results::metrics::{summarize, PromptInfo};
use draftlens_results::slice::{FacetFilter, Slice};
use draftlens_results::store::{MetricScope, NewRun, RunPrompt, RunStatus, Store};
use draftlens_web::compare::{self, slices};
use std::sync::Arc;
use support::*;

/// A complete run over 6 prompts whose drafter accepts `acc` positions at every anchor, stored
/// with `slice` in its settings (as `run` stores it).
fn stored_run(store: &Store, name: &str, slice: &Slice, acc: u32) -> i64 {
    let mut config = serde_json::json!({"mode": "deployment"});
    if let Some(s) = slice.to_stored() {
        config["slice"] = s;
    }
    let id = store
        .create_run(&NewRun {
            name: name.into(),
            config,
            target_sha256: "t".repeat(64),
            prompt_set_sha256: "s".repeat(64),
            backend: "cpu".into(),
            dtype: "f32".into(),
            block_size: 5,
            top_k: 2,
            drafter_family: "dflash".into(),
            ..Default::default()
        })
        .unwrap();
    let prompts: Vec<(u32, u32)> = (0..6).map(|i| (3, 14 + i)).collect();
    let tok = |p: u32, pos: u32| 1000 * p + pos;
    let mut r = RecordBatch::new(5, 2);
    for (p, &(plen, t)) in prompts.iter().enumerate() {
        let p = p as u32;
        for a in plen..t - 1 {
            r.prompt_index.push(p);
            r.anchor.push(a);
            r.region.push(Region::Completion as u8);
            for k in 1..5 {
                let valid = a + k < t;
                r.target.push(if valid { tok(p, a + k) } else { 0 });
                r.valid.push(valid as u8);
                r.loss_mask.push(valid as u8);
                r.draft_ids
                    .extend([if k <= acc { tok(p, a + k) } else { 7 }, 8]);
                r.draft_logprobs.extend([-0.1, -3.0]);
            }
        }
    }
    r.check().unwrap();
    let rp: Vec<RunPrompt> = prompts
        .iter()
        .enumerate()
        .map(|(i, &(plen, t))| RunPrompt {
            index: i as u32,
            id: format!("p{i}"),
            sha256: format!("{i:064x}"),
            category: None,
            prompt_len: plen,
            token_ids: (0..t).map(|x| tok(i as u32, x)).collect(),
            text: format!("prompt {i}"),
        })
        .collect();
    store.add_prompts(id, &rp).unwrap();
    store.add_records(id, &r).unwrap();
    let infos: Vec<PromptInfo> = prompts
        .iter()
        .enumerate()
        .map(|(i, &(plen, t))| PromptInfo {
            index: i as u32,
            prompt_len: plen as usize,
            seq_len: t as usize,
            category: None,
        })
        .collect();
    store.add_metrics(id, &summarize(&r, &infos)).unwrap();
    store
        .finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))
        .unwrap();
    id
}

fn thinking(on: Option<bool>) -> Slice {
    Slice {
        thinking: on,
        ..Default::default()
    }
}

/// Three runs: thinking on (accepts 3), thinking off (1), unsliced (2); the database's ids per
/// thinking value.
fn three_runs(store: &Store) -> (i64, i64, i64) {
    (
        stored_run(store, "think on", &thinking(Some(true)), 3),
        stored_run(store, "think off", &thinking(Some(false)), 1),
        stored_run(store, "unsliced", &Slice::default(), 2),
    )
}

fn ids_where(store: &Store, facet: &str, value: &str) -> Vec<i64> {
    let f = FacetFilter::parse(&format!("{facet}={value}")).unwrap();
    store
        .run_slices()
        .unwrap()
        .into_iter()
        .filter(|(_, s)| f.matches(s))
        .map(|(id, _)| id)
        .collect()
}

fn tau(store: &Store, id: i64) -> f64 {
    store
        .metrics(id)
        .unwrap()
        .into_iter()
        .find(|m| m.name == "tau_replayed_pooled" && m.scope == MetricScope::Run)
        .unwrap()
        .value
}

/// `compare --where thinking=off` keeps the one run; `--group-by thinking` puts each run under
/// its value with its stored τ; a filter matching nothing is one error listing the values.
#[test]
fn compare_filters_and_groups_by_slice() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("runs.sqlite")).unwrap();
    let (on, off, plain) = three_runs(&store);
    assert_eq!(ids_where(&store, "thinking", "off"), [off]);
    assert_eq!(ids_where(&store, "thinking", "template default"), [plain]);

    let all = [on, off, plain];
    let kept =
        slices::filter_runs(&store, &all, &[FacetFilter::parse("thinking=off").unwrap()]).unwrap();
    assert_eq!(kept, [off]);
    let e = slices::filter_runs(&store, &all, &[FacetFilter::parse("language=zh").unwrap()])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "--where language=zh matches none of the 3 runs (their values: language: all)"
    );

    let stats_of = |r: &draftlens_results::store::RunInfo| {
        Ok(draftlens_web::analysis::load_stats(&store, r)?.map(Arc::new))
    };
    let c = compare::compare(&store, &all, &Default::default(), &stats_of).unwrap();
    assert!(slices::any_sliced(&c));
    let section = slices::slice_section(&c, Some("thinking"));
    let groups: Vec<(&str, Vec<i64>)> = section
        .groups
        .iter()
        .map(|g| (g.value.as_str(), g.runs.iter().map(|r| r.run).collect()))
        .collect();
    assert_eq!(
        groups,
        [
            ("on", vec![on]),
            ("off", vec![off]),
            ("template default", vec![plain])
        ]
    );
    for g in &section.groups {
        let id = g.runs[0].run;
        assert_eq!(g.runs[0].tau, Some(tau(&store, id)), "run {id}");
        assert_eq!(g.tau_mean, Some(tau(&store, id)));
    }
    assert!(tau(&store, on) > tau(&store, plain) && tau(&store, plain) > tau(&store, off));
    let text = slices::slice_text(&section);
    assert!(text.contains("thinking = off: 1 run, mean τ"), "{text}");
    assert!(
        text.contains("format=as set thinking=off category=all language=all  think off"),
        "{text}"
    );
}

/// The run list's facet menu over HTTP: `?slice_thinking=off` lists exactly the database's runs
/// with thinking off; a database of unsliced runs shows no slice menu.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_list_filters_by_slice_facet() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    let (on, off, plain) = three_runs(&store);
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let page = get(addr, "/").await.unwrap().text();
    assert!(
        page.contains("name=\"slice_thinking\""),
        "the facet menu is shown"
    );
    let page = get(addr, "/?slice_thinking=off").await.unwrap().text();
    for (id, shown) in [(on, false), (off, true), (plain, false)] {
        assert_eq!(
            page.contains(&format!("href=\"/runs/{id}\"")),
            shown,
            "run {id}"
        );
    }

    let dir2 = tempfile::tempdir().unwrap();
    let db2 = dir2.path().join("runs.sqlite");
    stored_run(
        &Store::open(&db2).unwrap(),
        "unsliced",
        &Slice::default(),
        2,
    );
    let addr2 = serve(&db2, false, 1 << 20).await.unwrap();
    assert!(!get(addr2, "/").await.unwrap().text().contains("slice_"));
}

/// The same in Chromium: pick "off" in the thinking facet, press Filter, read the rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicking_a_facet_lists_the_databases_runs() {
    if let Some(why) = browser_missing() {
        eprintln!("SKIPPED clicking_a_facet_lists_the_databases_runs: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    three_runs(&store);
    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let br = Browser::start(1400, 1000).await.unwrap();
    br.goto(&format!("http://{addr}/")).await.unwrap();
    br.wait_for("return document.querySelectorAll('table.runs tbody tr').length === 3")
        .await
        .unwrap();
    br.js("const s = document.querySelector('select[name=slice_thinking]'); s.value = 'off'; return s.value")
        .await
        .unwrap();
    br.click("form.filters button[type=submit]").await.unwrap();
    br.wait_for("return location.search.includes('slice_thinking=off')")
        .await
        .unwrap();
    let shown = br
        .js("return [...document.querySelectorAll('table.runs tbody input[name=run]')].map(e => Number(e.value))")
        .await
        .unwrap();
    let shown: Vec<i64> = serde_json::from_value(shown).unwrap();
    assert_eq!(shown, ids_where(&store, "thinking", "off"));
    br.quit().await.unwrap();
}
