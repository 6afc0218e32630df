//! The built-in plugins through the sandbox agree with the same code built natively, one-shot,
//! streamed in chunks, and per prompt / per category (host-side grouping).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use draftlens_plugin_host::sdk::testdata::{oracle, random, Shape};
use draftlens_plugin_host::sdk::{self, Metric};
use draftlens_plugin_host::{Grouping, MetricResult, Param, ParamValue, SeriesKind};
use draftlens_records::RecordBatch;

fn native_with<M: Metric>(params: &[Param], batch: &RecordBatch) -> Vec<sdk::MetricValue> {
    // Native reference in chunks of 333 blocks: the accumulators must not care where chunks fall.
    let p = params.to_vec();
    let view = batch.view();
    let nb = view.num_blocks();
    let per = view.positions_per_block();
    let k = view.top_k();
    let chunks = (0..nb.div_ceil(333).max(1)).map(|i| {
        let (s, e) = (i * 333, ((i + 1) * 333).min(nb));
        let (ps, pe, cs, ce) = (s * per, e * per, s * per * k, e * per * k);
        sdk::Batch {
            block_size: view.block_size,
            top_k: view.top_k,
            prompt_index: &view.prompt_index[s..e],
            anchor: &view.anchor[s..e],
            region: &view.region[s..e],
            target: &view.target[ps..pe],
            valid: &view.valid[ps..pe],
            loss_mask: &view.loss_mask[ps..pe],
            draft_ids: &view.draft_ids[cs..ce],
            draft_logprobs: &view.draft_logprobs[cs..ce],
            target_ids: view.target_ids.map(|c| &c[cs..ce]),
            target_logprobs: view.target_logprobs.map(|c| &c[cs..ce]),
        }
    });
    sdk::evaluate_chunks::<M>(&p, chunks).unwrap()
}

fn native(name: &str, params: &[Param], batch: &RecordBatch) -> Vec<sdk::MetricValue> {
    match name {
        "accept-length" => native_with::<metric_accept_length::AcceptLength>(params, batch),
        "acceptance" => native_with::<metric_acceptance::Acceptance>(params, batch),
        "ddtree" => native_with::<metric_ddtree::DdTree>(params, batch),
        "masked-accuracy" => native_with::<metric_masked_accuracy::MaskedAccuracy>(params, batch),
        "replayed-tau" => native_with::<metric_replayed_tau::ReplayedTau>(params, batch),
        "sampling" => native_with::<metric_sampling::Sampling>(params, batch),
        "top1-accuracy" => native_with::<metric_top1_accuracy::Top1Accuracy>(params, batch),
        "topk" => native_with::<metric_topk::TopK>(params, batch),
        other => panic!("unknown plugin {other}"),
    }
}

/// Plugins whose arithmetic uses exp/ln: the wasm build links Rust's libm port, the native build
/// the system libm, which may differ in the last bit.
fn exact(name: &str) -> bool {
    !matches!(name, "ddtree" | "sampling")
}

fn same_number(a: Option<f64>, b: f64, exact: bool) -> bool {
    match a {
        None => b.is_nan(),
        Some(a) if exact => a.to_bits() == b.to_bits(),
        Some(a) => (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0),
    }
}

fn assert_same(what: &str, wasm: &[MetricResult], native: &[sdk::MetricValue], exact: bool) {
    let names: Vec<&str> = wasm.iter().map(|v| v.name.as_str()).collect();
    let want: Vec<&str> = native.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, want, "{what}: metric names");
    for (w, n) in wasm.iter().zip(native) {
        assert_eq!(w.count, n.count, "{what}: {} count", w.name);
        assert!(
            same_number(w.value, n.value, exact),
            "{what}: {} wasm {:?} native {}",
            w.name,
            w.value,
            n.value
        );
        match (&w.series, &n.series) {
            (None, None) => {}
            (Some(ws), Some(ns)) => {
                let kind = match ns.kind {
                    sdk::SeriesKind::PerPosition => SeriesKind::PerPosition,
                    sdk::SeriesKind::Histogram => SeriesKind::Histogram,
                };
                assert_eq!(ws.kind, kind, "{what}: {} series kind", w.name);
                assert_eq!(ws.counts, ns.counts, "{what}: {} series counts", w.name);
                assert_eq!(ws.values.len(), ns.values.len());
                for (a, b) in ws.values.iter().zip(&ns.values) {
                    assert!(
                        same_number(*a, *b, exact),
                        "{what}: {} series {a:?} vs {b}",
                        w.name
                    );
                }
            }
            _ => panic!("{what}: {} series present on one side only", w.name),
        }
    }
}

/// Blocks of `batch` for which `keep(block)` holds, in order.
fn filter(batch: &RecordBatch, keep: impl Fn(usize) -> bool) -> RecordBatch {
    let mut out = RecordBatch::new(batch.block_size, batch.top_k);
    let one = |b: usize| {
        let p = batch.positions_per_block();
        let k = batch.top_k as usize;
        let mut r = RecordBatch::new(batch.block_size, batch.top_k);
        r.prompt_index = vec![batch.prompt_index[b]];
        r.anchor = vec![batch.anchor[b]];
        r.region = vec![batch.region[b]];
        r.target = batch.target[b * p..(b + 1) * p].to_vec();
        r.valid = batch.valid[b * p..(b + 1) * p].to_vec();
        r.loss_mask = batch.loss_mask[b * p..(b + 1) * p].to_vec();
        r.draft_ids = batch.draft_ids[b * p * k..(b + 1) * p * k].to_vec();
        r.draft_logprobs = batch.draft_logprobs[b * p * k..(b + 1) * p * k].to_vec();
        r.target_ids = batch
            .target_ids
            .as_ref()
            .map(|c| c[b * p * k..(b + 1) * p * k].to_vec());
        r.target_logprobs = batch
            .target_logprobs
            .as_ref()
            .map(|c| c[b * p * k..(b + 1) * p * k].to_vec());
        r
    };
    let mut first = true;
    for b in 0..batch.num_blocks() {
        if keep(b) {
            if first {
                out = one(b);
                first = false;
            } else {
                out.extend(&one(b));
            }
        }
    }
    out
}

fn test_batch() -> RecordBatch {
    let mut shape = Shape::new(16, 8, 12, 20, 300);
    shape.prompt_anchors = true;
    shape.target_topk = true;
    random(2024, &shape, 0.75, 0.2)
}

fn params_for(name: &str) -> Vec<Param> {
    let text = |n: &str, v: &str| Param {
        name: n.into(),
        value: ParamValue::Text(v.into()),
    };
    match name {
        // 128 > K = 8: exercises the stored-K limit.
        "ddtree" => vec![text("budgets", "4,8,16,32,128")],
        "topk" => vec![text("ks", "1,2,4,8")],
        "top1-accuracy" => vec![text("region", "all")],
        _ => vec![],
    }
}

#[test]
fn wasm_equals_native_for_every_builtin() {
    let rt = common::runtime(Duration::from_secs(120), 256);
    let batch = test_batch();
    batch.check().unwrap();
    let categories: BTreeMap<u32, String> = (0..12)
        .filter(|p| p % 4 != 3)
        .map(|p| (p, format!("cat{}", p % 2)))
        .collect();
    let groups = Grouping {
        per_prompt: true,
        categories: categories.clone(),
    };
    for name in common::BUILTINS {
        let plugin = rt
            .load(&common::builtin(name))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plugin.metadata.name, *name);
        let params = params_for(name);
        let exact = exact(name);
        let want = native(name, &params, &batch);
        assert!(!want.is_empty(), "{name} produces values on the test batch");

        let one_shot = rt
            .evaluate(&plugin, &params, &batch)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_same(&format!("{name} one-shot"), &one_shot, &want, exact);

        let outcome = rt.score_chunked(&plugin, &params, &batch, &groups, 700);
        assert!(outcome.is_ok(), "{name}: {:?}", outcome.failure);
        if *name == "ddtree" {
            // Budget 128 > K: each of the 15 accumulators (whole batch, 12 prompts, 2
            // categories) says so once; the host folds identical consecutive lines.
            assert_eq!(outcome.logs.len(), 1, "{:?}", outcome.logs);
            assert_eq!(outcome.logs[0].repeats, 14);
        }
        let scores = outcome.scores.unwrap();
        assert_same(&format!("{name} streamed"), &scores.overall, &want, exact);

        assert_eq!(scores.per_prompt.len(), 12);
        for (prompt, values) in &scores.per_prompt {
            let sub = filter(&batch, |b| batch.prompt_index[b] == *prompt);
            assert_same(
                &format!("{name} prompt {prompt}"),
                values,
                &native(name, &params, &sub),
                exact,
            );
        }
        assert_eq!(
            scores.per_category.keys().collect::<Vec<_>>(),
            ["cat0", "cat1"]
        );
        for (cat, values) in &scores.per_category {
            let sub = filter(&batch, |b| {
                categories.get(&batch.prompt_index[b]) == Some(cat)
            });
            assert_same(
                &format!("{name} category {cat}"),
                values,
                &native(name, &params, &sub),
                exact,
            );
        }
    }
}

#[test]
fn oracle_through_the_sandbox() {
    // The oracle drafter's top-1 always equals the target: τ = B except near the sequence end.
    let rt = common::runtime(Duration::from_secs(60), 128);
    let plugin = rt.load(&common::builtin("accept-length")).unwrap();
    let batch = oracle(&Shape::new(16, 8, 4, 10, 200));
    let v = rt.evaluate(&plugin, &[], &batch).unwrap();
    let tau = v.iter().find(|v| v.name == "tau_pooled").unwrap();
    // Per prompt: anchors 10..=209, anchor a has min(15, 209 - a) valid positions.
    let per_prompt: u64 = (10..210u64).map(|a| 1 + 15.min(209 - a)).sum();
    assert_eq!(tau.count, 800);
    assert_eq!(tau.value, Some((4 * per_prompt) as f64 / 800.0));
    let first = filter(&batch, |b| batch.anchor[b] + 15 <= 209);
    let v = rt.evaluate(&plugin, &[], &first).unwrap();
    assert_eq!(
        v.iter().find(|v| v.name == "tau_pooled").unwrap().value,
        Some(16.0)
    );
}

#[test]
fn empty_batch_gives_undefined_values_not_failures() {
    let rt = common::runtime(Duration::from_secs(60), 128);
    let empty = RecordBatch::new(16, 8);
    // Every built-in: the host refuses a defined value with a count of 0 (issue 39).
    for name in common::BUILTINS {
        let plugin = rt.load(&common::builtin(name)).unwrap();
        let o = rt.score(&plugin, &[], &empty, &Grouping::default());
        assert!(o.is_ok(), "{name}: {:?}", o.failure);
        let scores = o.scores.unwrap();
        assert!(
            scores
                .overall
                .iter()
                .all(|v| v.value.is_none() || v.count > 0),
            "{name}: {:?}",
            scores.overall
        );
    }
}
