//! The DFlash drafter forward against the reference implementation the shipped drafters were
//! trained with (tools/train-reference-drafter/train.py, run in fp32 torch on a CPU by
//! tools/golden/make_drafter_golden.py → tests/fixtures/golden/drafter).
//!
//! Inputs are identical on both sides: the taps are the SmolLM2 golden's f16 hidden states of
//! prompt p1 (code) upcast to f32 (tap id t reads `p1.hs{t+1}`), the sequence is p1's prompt ++
//! golden continuation, and the embedding / tied LM head is the GGUF's Q8_0 `token_embd.weight`.
//! At anchors 51, 60, 80, 100 the drafter sees the taps of positions < a and the block
//! [y_a, MASK×15]; the golden keeps, per drafted row, the top-8 ids and raw logits.
//!
//! Our drafter is loaded through the normal path (`DrafterConfig` + safetensors via
//! `DFlashDrafter::load`, after `lint` finds no errors) and drafts all four anchors in one batched
//! forward, as evaluation does. It returns log-probs, which differ from logits by one constant
//! per row (the log-sum-exp), so the comparison is on logit *gaps* to the row's top-1, which are
//! shift-invariant, plus the identity of the top-8 ids.

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::drafter::lint::{lint, Severity};
use draftlens_engine::drafter::{DFlashDrafter, DraftOptions};
use draftlens_engine::model::{TargetFiles, TargetModel};
use golden_util::*;

/// |Δ (logit_j − logit_top1)| between ours and the golden. Both sides run fp32 on identical
/// inputs (the bf16 weights and the f16 taps are exact in f32), so the only difference is f32
/// summation order through fc (2880-wide), one layer and the 576-wide head: relative ~1e-6 on
/// logits of size ≤ ~25, i.e. ~1e-5 absolute (we measure ≤ 3.5e-5). 2e-4 is ~6× that, and any
/// real error (wrong RoPE positions for the block, context rows ≤ a visible, a missing norm, the
/// wrong tap layer) moves gaps by ≥ 1e-1.
const GAP_TOL: f32 = 2e-4;
/// Two candidates closer than this may legitimately swap ranks (the golden's own note: ids
/// whose logit gap exceeds ~1e-3 must be reproduced).
const TIE: f32 = 1e-3;
/// Golden hidden (f16-stored) · our dequantised embedding row vs the golden's logit: checks that
/// our Q8_0 dequantisation of token_embd equals gguf-py's. f16 storage of the hidden (≤ 4.9e-4
/// relative per element) over a 576-wide dot product with a row of norm ~1 and hidden of norm
/// ~25–60 bounds the error at ~1e-2 (we measure 2.6e-3); any different dequantisation (a wrong scale, a swapped
/// nibble order) is off by ≥ 1.
const EMBED_TOL: f32 = 2e-2;

#[test]
fn drafter_forward_matches_the_reference_implementation() {
    let root = repo_root();
    let gdir = root.join("tests/fixtures/golden/drafter");
    let manifest = json(&gdir.join("manifest.json"));
    assert_eq!(
        manifest["golden_safetensors_sha256"].as_str().unwrap(),
        draftlens_engine::util::sha256_file(&gdir.join("golden.safetensors")).unwrap()
    );
    let golden = Golden::open(gdir.join("golden.safetensors"));
    let target_golden = Golden::open(root.join("tests/fixtures/golden/smollm2/golden.safetensors"));

    let files = TargetFiles::open(&default_model()).unwrap();
    let be = CpuBackend::new();
    let target = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d_t = files.spec.hidden_size;
    let embed = files.weights.tensor("model.embed_tokens.weight").unwrap();

    let mut ids = target_golden.ids("p1.input_ids");
    ids.extend(target_golden.ids("p1.greedy_ids"));
    let anchors: Vec<usize> = manifest["anchors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    for &a in &anchors {
        assert_eq!(
            manifest["anchor_tokens"][a.to_string()].as_u64().unwrap() as u32,
            ids[a],
            "anchor token at {a}"
        );
    }

    let (mut worst_gap, mut worst_embed, mut rows_checked) = (0f32, 0f32, 0usize);
    for series in ["reference", "leaky"] {
        let ck = &manifest["checkpoints"][series];
        let dir = root.join(ck["checkpoint"].as_str().unwrap());
        assert_eq!(
            ck["model_safetensors_sha256"].as_str().unwrap(),
            draftlens_engine::util::sha256_file(&dir.join("model.safetensors")).unwrap(),
            "{series}: checkpoint changed since the golden was made"
        );
        let findings = lint(&files, &dir).unwrap();
        assert!(
            findings.iter().all(|f| f.severity != Severity::Error),
            "{series}: {findings:?}"
        );
        let drafter = DFlashDrafter::load(&be, &dir, d_t).unwrap();
        let b = drafter.cfg.block_size;
        assert_eq!(b, 16);
        let tap_ids: Vec<usize> = ck["target_layer_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(drafter.cfg.target_layer_ids, tap_ids);

        let taps: Vec<Vec<f32>> = tap_ids
            .iter()
            .map(|t| target_golden.f32(&format!("p1.hs{}", t + 1)).1)
            .collect();
        let refs: Vec<&[f32]> = taps.iter().map(|v| v.as_slice()).collect();
        let ctx = drafter.context(&be, &refs, d_t).unwrap();
        let toks: Vec<u32> = anchors.iter().map(|&a| ids[a]).collect();
        let top = drafter
            .draft(
                &be,
                &target,
                &ctx,
                &anchors,
                &toks,
                DraftOptions {
                    ctx_inclusive: false,
                    top_k: 8,
                },
            )
            .unwrap();
        assert_eq!(top.rows, anchors.len() * (b - 1));

        for (n, &a) in anchors.iter().enumerate() {
            let gids = golden.ids(&format!("{series}.a{a}.top8_ids"));
            let (gshape, glog) = golden.f32(&format!("{series}.a{a}.top8_logits"));
            assert_eq!(gshape, [b - 1, 8]);
            let (_, ghid) = golden.f32(&format!("{series}.a{a}.hidden"));
            for r in 0..b - 1 {
                let (ours_ids, ours_lp) = (
                    top.row_ids(n * (b - 1) + r),
                    top.row_logprobs(n * (b - 1) + r),
                );
                let (g_ids, g_log) = (&gids[r * 8..r * 8 + 8], &glog[r * 8..r * 8 + 8]);
                let what = format!("{series} anchor {a} row {}", r + 1);
                // The golden's hidden row reproduces its logits with our embedding rows.
                let h = &ghid[r * d_t..(r + 1) * d_t];
                for j in 0..8 {
                    let e = &embed.data[g_ids[j] as usize * d_t..(g_ids[j] as usize + 1) * d_t];
                    let dot: f64 = h.iter().zip(e).map(|(&x, &y)| x as f64 * y as f64).sum();
                    let err = (dot as f32 - g_log[j]).abs();
                    worst_embed = worst_embed.max(err);
                    assert!(
                        err < EMBED_TOL,
                        "{what}: golden hidden · our embedding row {} = {dot}, golden logit {}",
                        g_ids[j],
                        g_log[j]
                    );
                }
                for j in 0..8 {
                    if ours_ids[j] != g_ids[j] {
                        // Allowed only inside a near-tie of the golden's own logits: two of its
                        // top-8 swapped, or (rank 8) our 8th is the golden's 9th, tied with its 8th.
                        let k = g_ids.iter().position(|&x| x == ours_ids[j]);
                        let ok = k.is_some_and(|k| (g_log[k] - g_log[j]).abs() < TIE)
                            || (j == 7
                                && (g_log[7] - ours_lp[7] + ours_lp[0] - g_log[0]).abs() < TIE);
                        assert!(ok, "{what}: rank {j} is id {} (ours) vs {} (golden), golden logits {g_log:?}", ours_ids[j], g_ids[j]);
                        continue;
                    }
                    let gap = (ours_lp[j] - ours_lp[0]) - (g_log[j] - g_log[0]);
                    worst_gap = worst_gap.max(gap.abs());
                    assert!(
                        gap.abs() < GAP_TOL,
                        "{what} rank {j}: logit gap to top-1 differs by {gap:.3e}"
                    );
                }
                assert!(
                    ours_lp[0] <= 0.0 && ours_lp.windows(2).all(|w| w[0] >= w[1]),
                    "{what}: log-probs {ours_lp:?}"
                );
                rows_checked += 1;
            }
        }
    }
    assert_eq!(rows_checked, 2 * 4 * 15);
    eprintln!("drafter golden: {rows_checked} rows, max |Δ gap| {worst_gap:.2e}, embedding check max |Δ| {worst_embed:.2e}");
}
