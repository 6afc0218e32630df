//! Live speculative sampling at T > 0 with an EAGLE-3 drafter (docs/live.md §5, docs/eagle3.md
//! §4), on the CPU reference: the golden drafter on the golden Qwen3 target, both cut to a
//! vocabulary of 16 tokens (random models of 512 tokens hardly ever agree, so too few drafts
//! would be accepted for the test to see the accept path), the drafter's own vocabulary 12 of
//! them through `d2t` (so q has no mass on 4 target tokens and the id map is exercised).
//!
//! 1. Lossless in distribution, K = 2: the first four tokens over many seeds against the target's
//!    exact marginals (chi-square per position), per sampling setting; the test's power against
//!    two wrong rules, whose sampled runs fail it (`sampling_util`, as for DFlash in
//!    tests/speculative_sampling.rs).
//! 2. K = 1: live τ at T = 1 agrees with the replayed expectation `tau_sampled_replayed`, exact on
//!    the drafter's side at step 1 (docs/metrics.md §7.3).
//! (The other engineer's tests of the EAGLE-3 chain and tree are in tests/eagle3/.)

mod golden_util;
mod sampling_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::drafter::eagle3::Eagle3Drafter;
use draftlens_engine::drafter::eval::Drafter;
use draftlens_engine::model::{TargetFiles, TargetModel};
use draftlens_records::sampling::{DraftSampling, SamplingParams};
use golden_util::repo_root;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

const VOCAB: usize = 16;
/// The target ids of the drafter's 12 draft ids (d2t[i] = TARGET_OF[i] − i).
const TARGET_OF: [i64; 12] = [0, 1, 2, 4, 5, 7, 8, 10, 11, 13, 14, 15];

/// The target and the drafter (K = `steps`) with a vocabulary of [`VOCAB`].
fn small_vocab(dir: &Path, steps: usize) -> (PathBuf, PathBuf) {
    let golden = repo_root().join("tests/fixtures/golden");
    let target = sampling_util::small_vocab_copy(
        &golden.join("qwen3"),
        &dir.join("target"),
        VOCAB,
        &["model.embed_tokens.weight", "lm_head.weight"],
        |_| {},
        |_| {},
    );
    let drafter = sampling_util::small_vocab_copy(
        &golden.join("eagle3"),
        &dir.join("eagle3"),
        VOCAB,
        &["embed_tokens.weight"],
        |c| {
            c["draft_vocab_size"] = TARGET_OF.len().into();
            c["num_speculative_tokens"] = steps.into();
        },
        |t| {
            for e in t.iter_mut() {
                match e.0.as_str() {
                    "lm_head.weight" => {
                        let row = e.3.len() / e.2[0];
                        e.2[0] = TARGET_OF.len();
                        e.3.truncate(TARGET_OF.len() * row);
                    }
                    "d2t" => {
                        e.1 = Dtype::I64;
                        e.2 = vec![TARGET_OF.len()];
                        e.3 = TARGET_OF
                            .iter()
                            .enumerate()
                            .flat_map(|(i, &t)| (t - i as i64).to_le_bytes())
                            .collect();
                    }
                    "t2d" => {
                        e.1 = Dtype::BOOL;
                        e.2 = vec![VOCAB];
                        e.3 = (0..VOCAB as i64)
                            .map(|t| TARGET_OF.contains(&t) as u8)
                            .collect();
                    }
                    _ => {}
                }
            }
        },
    );
    (target, drafter)
}

fn load(
    steps: usize,
) -> (
    tempfile::TempDir,
    CpuBackend,
    TargetModel<CpuBackend>,
    Drafter<CpuBackend>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let (target, drafter) = small_vocab(tmp.path(), steps);
    let be = CpuBackend::new();
    let files = TargetFiles::open(&target).unwrap();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let d = Eagle3Drafter::load(&be, &drafter, &files.spec).unwrap();
    assert_eq!(
        (d.cfg.steps, d.vocab.target_of.len()),
        (steps, TARGET_OF.len())
    );
    (tmp, be, model, Drafter::Eagle3(d))
}

#[test]
fn speculative_sampling_with_an_eagle3_chain_is_lossless() {
    let (_tmp, be, model, d) = load(2);
    let prompt = [3u32, 11, 7, 2, 14, 5];
    let params = |t, k, p, draft| SamplingParams::new(t, Some(k), p, draft).unwrap();
    let configs = [
        (
            "T=1 top-k=8, sampled drafts",
            params(1.0, 8, 1.0, DraftSampling::Sampled),
            1500,
        ),
        (
            "T=0.7 top-k=6 top-p=0.9, sampled drafts",
            params(0.7, 6, 0.9, DraftSampling::Sampled),
            1000,
        ),
        (
            "T=1 top-k=8, greedy drafts",
            params(1.0, 8, 1.0, DraftSampling::Greedy),
            1000,
        ),
    ];
    sampling_util::check_lossless("eagle3 K=2", &be, &model, &d, &prompt, &configs, 1000);
}

#[test]
fn live_tau_at_t1_agrees_with_the_replayed_expectation() {
    let (_tmp, be, model, d) = load(1);
    let t = std::time::Instant::now();
    let a = sampling_util::tau_agreement(
        &be,
        &model,
        &d,
        200,
        32,
        TARGET_OF.len(),
        DraftSampling::Sampled,
    );
    eprintln!(
        "eagle3 K=1, 200 prompts of 32 tokens, T = 1, top-k 12 (the draft vocabulary): live τ macro {:.4} vs expected {:.4} (paired gap {:+.4} ± {:.4}, 99%); rounds per prompt {:+.3} ± {:.3} ({:.1} s)",
        a.live_macro, a.expected_macro, a.gap.0, a.gap.1, a.round_gap.0, a.round_gap.1,
        t.elapsed().as_secs_f64()
    );
    assert!(
        a.expected_macro > 1.1,
        "too few drafts accepted: {}",
        a.expected_macro
    );
    assert!(a.gap.0.abs() < a.gap.1, "τ: live − expected = {:?}", a.gap);
    assert!(
        a.round_gap.0.abs() < a.round_gap.1,
        "rounds: live − expected = {:?}",
        a.round_gap
    );
}
