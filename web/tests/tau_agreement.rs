//! One replayed τ: the web UI's records-derived metrics, the native metrics `draftlens run` stores
//! and the `replayed-tau` plugin (its native build, the same code as its wasm build) give the same
//! replayed τ, macro and pooled, on runs whose sequences end in the middle of a block, including
//! last rounds that accept every remaining position (no bonus token past the end,
//! `docs/metrics.md` §2). Known answers are worked out by hand for one prompt.

use draftlens::drafter::metrics::{summarize, PromptInfo};
use draftlens::records::{RecordBatch, Region};
use draftlens::store::{MetricScope, PromptMeta};
use draftlens_plugin_sdk::evaluate;
use draftlens_web::analysis::{compute_stats, native_metrics};
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

/// (macro, pooled) replayed τ from each of the three implementations.
fn three_taus(batch: &RecordBatch, prompts: &[(u32, u32)]) -> [(f64, f64); 3] {
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

    let metas: Vec<PromptMeta> = prompts
        .iter()
        .enumerate()
        .map(|(i, &(plen, t))| PromptMeta {
            index: i as u32,
            id: format!("p{i}"),
            sha256: format!("s{i}"),
            category: None,
            prompt_len: plen,
            num_tokens: t,
        })
        .collect();
    let web = native_metrics(&compute_stats(batch, &metas));
    let wget = |n: &str| {
        web.iter()
            .find(|r| r.name == n && r.scope == MetricScope::Run)
            .unwrap_or_else(|| panic!("web {n}"))
            .value
    };

    let plugin = evaluate::<ReplayedTau>(&[], &batch.view()).unwrap();
    let pget = |n: &str| plugin.iter().find(|v| v.name == n).unwrap().value;

    [
        (nget("tau_replayed_macro"), nget("tau_replayed_pooled")),
        (wget("tau_replayed"), wget("tau_replayed_pooled")),
        (pget("replayed_tau_macro"), pget("replayed_tau_pooled")),
    ]
}

fn assert_agree(t: [(f64, f64); 3]) {
    for (name, x) in [("web", t[1]), ("plugin", t[2])] {
        assert!(
            (x.0 - t[0].0).abs() < 1e-12 && (x.1 - t[0].1).abs() < 1e-12,
            "{name} τ {x:?} differs from native {:?}",
            t[0]
        );
    }
}

#[test]
fn hand_worked_prompt_whose_last_round_accepts_up_to_the_end() {
    // B = 4, prompt 5 tokens, 13 tokens in all (positions 0..=12, end 12). A = 3 at anchor 5, 9
    // (10, 11, 12 accepted: the end), 0 elsewhere. Chain 5 → 9 → 13: rounds yield 4 and 3
    // tokens (no bonus past 12): τ = 3.5. Counting a bonus past the end would give 4.
    let prompts = [(5, 13)];
    let b = run(4, &prompts, &|_, a| if a == 5 || a == 9 { 3 } else { 0 });
    let t = three_taus(&b, &prompts);
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
        let t = three_taus(&batch, &prompts);
        assert_agree(t);
        assert!(t[0].0 > 1.0 && t[0].0 <= b as f64, "{t:?}");
    }
}
