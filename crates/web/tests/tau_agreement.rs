//! One number per metric. The native metrics are one implementation (`draftlens_results::metrics`:
//! `draftlens run` stores their rows, the web folds the same per-prompt statistics for CIs), and
//! the `replayed-tau` plugin is another (its native build, the same code as its wasm build): both
//! give the same replayed τ, macro and pooled, on runs whose sequences end in the middle of a
//! block, including last rounds that accept every remaining position (no bonus token past the
//! end, `docs/metrics.md` §2); known answers are worked out by hand for one prompt. And the run
//! page, the comparison (page and JSON, every bit) and the exported report show the stored value:
//! the web recomputes it from statistics it loads prompt by prompt from the store.

mod support;

use draftlens_plugin_sdk::evaluate;
use draftlens_records::{RecordBatch, Region};
use draftlens_results::metrics::{summarize, PromptInfo, DERIVED};
use draftlens_results::store::MetricScope;
use metric_replayed_tau::ReplayedTau;

/// The tokens of prompt `p` at position `pos` (any injective function will do).
fn tok(p: u32, pos: u32) -> u32 {
    1000 * p + pos
}

/// Records as the drafter evaluation stores them: every completion anchor prompt_len..=T−2, B,
/// K = 2, the drafter accepting `acc(prompt, anchor)` positions (capped by the sequence end).
fn run(b: u32, prompts: &[(u32, u32)], acc: &dyn Fn(u32, u32) -> u32) -> RecordBatch {
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

/// (macro, pooled) replayed τ from each implementation: [native, plugin].
fn both_taus(batch: &RecordBatch, prompts: &[(u32, u32)]) -> [(f64, f64); 2] {
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
    let native = summarize(batch, &infos);
    let nget = |n: &str| {
        native
            .iter()
            .find(|r| r.name == n && r.scope == MetricScope::Run)
            .unwrap_or_else(|| panic!("native {n}"))
            .value
    };

    let plugin = evaluate::<ReplayedTau>(&[], &batch.view()).unwrap();
    let pget = |n: &str| plugin.iter().find(|v| v.name == n).unwrap().value;

    [
        (nget("tau_replayed_macro"), nget("tau_replayed_pooled")),
        (pget("replayed_tau_macro"), pget("replayed_tau_pooled")),
    ]
}

fn assert_agree(t: [(f64, f64); 2]) {
    let (native, plugin) = (t[0], t[1]);
    assert!(
        (plugin.0 - native.0).abs() < 1e-12 && (plugin.1 - native.1).abs() < 1e-12,
        "plugin τ {plugin:?} differs from native {native:?}"
    );
}

#[test]
fn hand_worked_prompt_whose_last_round_accepts_up_to_the_end() {
    // B = 4, prompt 5 tokens, 13 tokens in all (positions 0..=12, end 12). A = 3 at anchor 5, 9
    // (10, 11, 12 accepted: the end), 0 elsewhere. Chain 5 → 9 → 13: rounds yield 4 and 3
    // tokens (no bonus past 12): τ = 3.5. Counting a bonus past the end would give 4.
    let prompts = [(5, 13)];
    let b = run(4, &prompts, &|_, a| if a == 5 || a == 9 { 3 } else { 0 });
    let t = both_taus(&b, &prompts);
    assert_eq!(t[0], (3.5, 3.5));
    assert_agree(t);
}

#[test]
fn many_prompts_ending_mid_block_agree() {
    // Lengths chosen so sequences end at every offset inside a block of B = 5 and B = 3; the
    // drafter's acceptance follows a fixed pattern, and for half the prompts it accepts
    // everything (every last round then reaches the end).
    for b in [3u32, 5] {
        let prompts: Vec<(u32, u32)> = (0..12).map(|i| (3 + i % 4, 20 + 3 * i)).collect();
        let acc = |p: u32, a: u32| {
            if p % 2 == 0 {
                b
            } else {
                (a * 7 + p * 3) % b
            }
        };
        let batch = run(b, &prompts, &acc);
        let t = both_taus(&batch, &prompts);
        assert_agree(t);
        assert!(t[0].0 > 1.0 && t[0].0 <= b as f64, "{t:?}");
    }
}

fn infos(prompts: &[(u32, u32)]) -> Vec<PromptInfo> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, &(plen, t))| PromptInfo {
            index: i as u32,
            prompt_len: plen as usize,
            seq_len: t as usize,
            category: Some(if i.is_multiple_of(2) { "even" } else { "odd" }.into()),
        })
        .collect()
}

/// Logprobs that are not round numbers, so that the NLL's summation order would show.
fn ragged_logprobs(b: &mut RecordBatch) {
    for (i, lp) in b.draft_logprobs.iter_mut().enumerate() {
        *lp = -((i * 37 % 101) as f32) / 13.0 - 0.001;
    }
}

/// The stored native values, shown by every surface: the run page's cards, the comparison's
/// JSON (every bit) and page, and the exported report.
#[tokio::test]
async fn run_page_comparison_and_report_show_the_stored_values() {
    use draftlens_results::store::{NewRun, RunPrompt, RunStatus, Store};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.sqlite");
    let store = Store::open(&db).unwrap();
    let prompts: Vec<(u32, u32)> = (0..24).map(|i| (3 + i % 4, 20 + 3 * i)).collect();
    let infos = infos(&prompts);
    let mut ids = Vec::new();
    let mut stored = Vec::new();
    for (r, shift) in [(0u32, 0u32), (1, 2)] {
        let b = 5u32;
        let acc = move |p: u32, a: u32| {
            if p.is_multiple_of(2) {
                b
            } else {
                (a * 7 + p * 3 + shift) % b
            }
        };
        let mut batch = run(b, &prompts, &acc);
        ragged_logprobs(&mut batch);
        let new = NewRun {
            name: format!("agreement-{r}"),
            block_size: b,
            top_k: 2,
            ..Default::default()
        };
        let id = store.create_run(&new).unwrap();
        let rp: Vec<RunPrompt> = prompts
            .iter()
            .enumerate()
            .map(|(i, &(plen, t))| RunPrompt {
                index: i as u32,
                id: format!("p{i}"),
                sha256: format!("{i:064x}"),
                category: infos[i].category.clone(),
                prompt_len: plen,
                token_ids: (0..t).map(|x| tok(i as u32, x)).collect(),
                text: format!("prompt {i}"),
            })
            .collect();
        store.add_prompts(id, &rp).unwrap();
        store.add_records(id, &batch).unwrap();
        let rows = summarize(&batch, &infos);
        store.add_metrics(id, &rows).unwrap();
        store
            .finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))
            .unwrap();
        ids.push(id);
        stored.push(rows);
    }
    let value = |run: usize, name: &str| -> f64 {
        stored[run]
            .iter()
            .find(|r| r.name == name && r.scope == MetricScope::Run)
            .unwrap()
            .value
    };
    let addr = support::serve(&db, false, 1 << 20).await.unwrap();
    let cmp = support::get(
        addr,
        &format!("/compare?runs={},{}&format=json", ids[0], ids[1]),
    )
    .await
    .unwrap();
    assert_eq!(cmp.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&cmp.body).unwrap();
    let page = support::get(addr, &format!("/compare?runs={},{}", ids[0], ids[1]))
        .await
        .unwrap()
        .text();
    let report = support::get(addr, &format!("/report?runs={},{}", ids[0], ids[1]))
        .await
        .unwrap()
        .text();
    for d in DERIVED {
        let m = v["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["key"]["source"] == "native" && m["key"]["name"] == d.name)
            .unwrap_or_else(|| panic!("comparison lacks native/{}", d.name));
        let count = v["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["key"]["name"] == d.name)
            .count();
        assert_eq!(
            count, 1,
            "{} appears {count} times in the comparison",
            d.name
        );
        for r in 0..2 {
            let shown = m["values"][r].as_f64().unwrap();
            assert_eq!(
                shown.to_bits(),
                value(r, d.name).to_bits(),
                "{}: comparison {shown} vs stored {}",
                d.name,
                value(r, d.name)
            );
            let f = draftlens_web::compare::fmt_value(Some(value(r, d.name)));
            assert!(
                page.contains(&f),
                "{}: {f} not on the comparison page",
                d.name
            );
            assert!(report.contains(&f), "{}: {f} not in the report", d.name);
        }
    }
    for (r, id) in ids.iter().enumerate() {
        let page = support::get(addr, &format!("/runs/{id}"))
            .await
            .unwrap()
            .text();
        for name in [
            "tau_replayed_macro",
            "tau_replayed_pooled",
            "tau_uniform",
            "flat_accuracy",
        ] {
            let f = draftlens_web::compare::fmt_value(Some(value(r, name)));
            assert!(page.contains(&f), "run page lacks {name} = {f}");
        }
    }
}
