//! The verdict panel in a real headless Chromium (docs/verdict.md): two runs of different drafter
//! families on the same prompts, one with stored `live --store` timings, picked in the run list
//! and compared by clicking; what the panel shows (family, τ, estimated and measured speed-up,
//! estimate error, the missing timings of the other run) is checked against the database, and
//! the run page shows the family. Both runs also carry costs measured apart from live decoding
//! (`bench-costs`, source `cost_bench`): the estimate from them and its distance from the measured
//! speed-up are checked against the database too. Skips (with a message) without chromium /
//! chromedriver.

mod support;

use draftlens_records::{RecordBatch, Region};
use draftlens_results::cost_bench::{ContextSamples, CostBench, PromptSamples, StoredCostBench};
use draftlens_results::metrics::{summarize, PromptInfo};
use draftlens_results::speed::{estimated_speedup, PromptTiming, SpeedSummary, StoredSpeed};
use draftlens_results::store::{MetricScope, NewRun, RunPrompt, RunStatus, Store};
use support::*;

fn tok(p: u32, pos: u32) -> u32 {
    1000 * p + pos
}

/// Records at every completion anchor of `prompts` (prompt length, sequence length), B = 5,
/// the drafter accepting `acc(prompt, anchor)` positions.
fn records(prompts: &[(u32, u32)], acc: &dyn Fn(u32, u32) -> u32) -> RecordBatch {
    let b = 5;
    let mut r = RecordBatch::new(b, 2);
    for (p, &(plen, t)) in prompts.iter().enumerate() {
        let p = p as u32;
        for a in plen..t - 1 {
            r.prompt_index.push(p);
            r.anchor.push(a);
            r.region.push(Region::Completion as u8);
            let n = acc(p, a);
            for k in 1..b {
                let valid = a + k < t;
                r.target.push(if valid { tok(p, a + k) } else { 0 });
                r.valid.push(valid as u8);
                r.loss_mask.push(valid as u8);
                let top1 = if k <= n { tok(p, a + k) } else { 7 };
                r.draft_ids.extend([top1, 8]);
                r.draft_logprobs.extend([-0.1, -3.0]);
            }
        }
    }
    r.check().unwrap();
    r
}

/// Independent costs (`bench-costs`) of a drafter with B = 5 over `prompts` prompts, two
/// contexts each, scaled by `scale`.
fn cost_bench_rows(prompts: u32, scale: f64) -> Vec<draftlens_results::store::MetricRow> {
    let samples: Vec<PromptSamples> = (0..prompts)
        .map(|i| PromptSamples {
            index: i,
            decode_step_s: (0..6)
                .map(|k| scale * (0.014 + 0.0003 * ((i + k) % 4) as f64))
                .collect(),
            contexts: (0..2)
                .map(|c| ContextSamples {
                    prompt: i,
                    context_len: (10 + 8 * c) as u64,
                    accepted: 1,
                    draft_s: vec![scale * (0.0024 + 0.0001 * c as f64); 3],
                    verify_s: vec![
                        (1, vec![scale * 0.0150; 3]),
                        (5, vec![scale * (0.0110 + 0.0002 * (i % 3) as f64); 3]),
                    ],
                })
                .collect(),
        })
        .collect();
    CostBench::of(&samples, 5).unwrap().rows()
}

/// A complete run of `family` over `prompts` with its native metrics; timed when `timed`, with
/// independent costs (`bench-costs`) scaled by `bench`.
fn stored_run(
    store: &Store,
    family: &str,
    prompts: &[(u32, u32)],
    acc: &dyn Fn(u32, u32) -> u32,
    timed: bool,
    bench: Option<f64>,
) -> i64 {
    let id = store
        .create_run(&NewRun {
            name: format!("{family} run"),
            target_sha256: "t".repeat(64),
            prompt_set_sha256: "s".repeat(64),
            backend: "cpu".into(),
            dtype: "f32".into(),
            block_size: 5,
            top_k: 2,
            drafter_family: family.into(),
            ..Default::default()
        })
        .unwrap();
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
    let batch = records(prompts, acc);
    store.add_records(id, &batch).unwrap();
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
    store.add_metrics(id, &summarize(&batch, &infos)).unwrap();
    if timed {
        let timings: Vec<PromptTiming> = (0..prompts.len() as u32)
            .map(|i| PromptTiming {
                index: i,
                greedy_s: 0.30 + 0.01 * i as f64,
                greedy_steps: 20,
                live_s: 0.12 + 0.003 * (i % 5) as f64,
                rounds: 8,
                round_tokens: 20,
                draft_s: 0.02,
                verify_s: 0.09,
            })
            .collect();
        let summary = SpeedSummary::of(&timings).unwrap();
        store
            .replace_metrics(
                id,
                draftlens_results::speed::SOURCE,
                &summary.rows(&timings, 5),
            )
            .unwrap();
    }
    if let Some(scale) = bench {
        store
            .replace_metrics(
                id,
                draftlens_results::cost_bench::SOURCE,
                &cost_bench_rows(prompts.len() as u32, scale),
            )
            .unwrap();
    }
    store
        .finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))
        .unwrap();
    id
}

/// `data-value` of a verdict cell, as a number (None when empty).
async fn cell(br: &Browser, run: i64, class: &str) -> Option<f64> {
    let v = br
        .js(&format!(
            "return document.querySelector('#verdict tr[data-run=\"{run}\"] td.{class}').dataset.value"
        ))
        .await
        .unwrap();
    v.as_str().and_then(|s| s.parse().ok())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_panel_shows_the_stored_numbers() {
    if let Some(why) = browser_missing() {
        eprintln!("SKIPPED verdict_panel_shows_the_stored_numbers: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    let prompts: Vec<(u32, u32)> = (0..24).map(|i| (3 + i % 4, 20 + 3 * i)).collect();
    let a = stored_run(
        &store,
        "dflash",
        &prompts,
        &|p, a| (a * 7 + p * 3) % 5,
        true,
        Some(1.0),
    );
    let b = stored_run(
        &store,
        "eagle3",
        &prompts,
        &|p, a| (a * 5 + p) % 3,
        false,
        Some(1.3),
    );

    // What the database says.
    let tau_of = |id: i64| {
        store
            .metrics(id)
            .unwrap()
            .into_iter()
            .find(|m| m.name == "tau_replayed_pooled" && m.scope == MetricScope::Run)
            .unwrap()
            .value
    };
    let speed = StoredSpeed::from_rows(&store.metrics(a).unwrap()).unwrap();
    let (tau_a, tau_b) = (tau_of(a), tau_of(b));
    let est_a = estimated_speedup(tau_a, &speed.costs).unwrap();
    let measured_a = speed.speedup_measured.unwrap();
    let bench_of = |id: i64| StoredCostBench::from_rows(&store.metrics(id).unwrap()).unwrap();
    let est_bench_a = estimated_speedup(tau_a, &bench_of(a).costs).unwrap();
    let est_bench_b = estimated_speedup(tau_b, &bench_of(b).costs).unwrap();

    let addr = serve(&db, false, 1 << 20).await.unwrap();
    let base = format!("http://{addr}");
    let br = Browser::start(1400, 1000).await.unwrap();
    br.goto(&format!("{base}/")).await.unwrap();
    br.wait_for("return document.querySelectorAll('table.runs tbody tr').length >= 2")
        .await
        .unwrap();
    for id in [a, b] {
        br.click(&format!("input[name=run][value='{id}']"))
            .await
            .unwrap();
    }
    br.click(".selbar button[type=submit]").await.unwrap();
    br.wait_for("return location.pathname === '/compare' && !!document.querySelector('#verdict')")
        .await
        .unwrap();

    let family = |run: i64| {
        format!("return document.querySelector('#verdict tr[data-run=\"{run}\"] td.family').textContent.trim()")
    };
    assert_eq!(br.js(&family(a)).await.unwrap(), "dflash");
    assert_eq!(br.js(&family(b)).await.unwrap(), "eagle3");
    let shown = cell(&br, a, "tau").await.unwrap();
    assert!(close(shown, tau_a), "τ {shown} vs stored {tau_a}");
    assert!(close(cell(&br, b, "tau").await.unwrap(), tau_b));
    let shown = cell(&br, a, "est").await.unwrap();
    assert!(close(shown, est_a), "estimate {shown} vs {est_a}");
    let shown = cell(&br, a, "meas").await.unwrap();
    assert!(close(shown, measured_a), "measured {shown} vs {measured_a}");
    let err = cell(&br, a, "err").await.unwrap();
    assert!(close(err, 100.0 * (est_a / measured_a - 1.0)));
    // The visible text rounds the same numbers.
    let text = br
        .js(&format!(
            "return document.querySelector('#verdict tr[data-run=\"{a}\"]').textContent"
        ))
        .await
        .unwrap();
    let text = text.as_str().unwrap();
    assert!(
        text.contains(&format!("{est_a:.3}×")) && text.contains(&format!("{measured_a:.3}×")),
        "{text}"
    );
    // The estimates from the independent costs (bench-costs) and their distance from the
    // measured speed-up, against what the database gives.
    let shown = cell(&br, a, "est-bench").await.unwrap();
    assert!(
        close(shown, est_bench_a),
        "bench estimate {shown} vs {est_bench_a}"
    );
    assert!(
        (est_bench_a - est_a).abs() > 1e-6,
        "the fixture's two estimates differ"
    );
    let err_bench = cell(&br, a, "err-bench").await.unwrap();
    assert!(close(err_bench, 100.0 * (est_bench_a / measured_a - 1.0)));
    let shown = cell(&br, b, "est-bench").await.unwrap();
    assert!(
        close(shown, est_bench_b),
        "bench estimate {shown} vs {est_bench_b}"
    );
    assert_eq!(cell(&br, b, "err-bench").await, None);
    assert!(text.contains(&format!("{est_bench_a:.3}×")), "{text}");
    let closeness_bench = br
        .js("return document.querySelector('#verdict .closeness-bench').textContent")
        .await
        .unwrap();
    assert!(
        closeness_bench
            .as_str()
            .unwrap()
            .contains(&format!("{:.1}%", err_bench.abs())),
        "{closeness_bench}"
    );
    // The EAGLE-3 run has no live timings: empty cells and the command that would measure them.
    assert_eq!(cell(&br, b, "est").await, None);
    assert_eq!(cell(&br, b, "meas").await, None);
    let missing = br
        .js("return [...document.querySelectorAll('#verdict .missing')].map(e => e.textContent).join('|')")
        .await
        .unwrap();
    assert!(
        missing.as_str().unwrap().contains(&format!("--store {b}")),
        "{missing}"
    );
    let closeness = br
        .js("return document.querySelector('#verdict .closeness').textContent")
        .await
        .unwrap();
    assert!(
        closeness
            .as_str()
            .unwrap()
            .contains(&format!("{:.1}%", err.abs())),
        "{closeness}"
    );

    // The run page says the family.
    br.click(&format!(".runhead a[href='/runs/{b}']"))
        .await
        .unwrap();
    br.wait_for("return !!document.querySelector('dd.family')")
        .await
        .unwrap();
    let fam = br
        .js("return document.querySelector('dd.family').textContent.trim()")
        .await
        .unwrap();
    assert_eq!(fam, "eagle3");
    br.quit().await.unwrap();
}
