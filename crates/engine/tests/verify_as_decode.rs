//! A verify pass computes each row as decoding does (docs/live.md, "Verify equals decoding"), on
//! the CPU reference for every target family: dense, hybrid (Gated DeltaNet layers stepped row by
//! row, and the crop's replay after them), mixture of experts and gpt-oss (sinks and windows);
//! and live decoding with the oracle and anti-oracle drafters equals greedy decoding.
//! `cuda_verify.rs` runs the same checks on the GPU, where the verify pass is one launch.

mod golden_util;
mod verify_util;
use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::model::random::RandomWeights;
use draftlens_engine::model::{ModelSpec, TargetModel};
use verify_util::*;

fn check(spec: ModelSpec, seed: u64) {
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &spec, &RandomWeights::new(&spec, seed)).unwrap();
    let v = spec.vocab_size;
    // Prompts around gpt-oss's 8-token window; blocks of 1, 5 and 16; crops at 0, 2 and 15.
    for (n, b, keep) in [(3, 5, 2), (9, 16, 15), (1, 1, 0), (12, 5, 0)] {
        let prompt = ids(n, 100 + n as u64, v);
        let block = ids(b, 200 + b as u64, v);
        assert_verify_rows_are_decode_steps(&be, &model, &prompt, &block, keep);
    }
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| ids(4 + 5 * i, 300 + i as u64, v)).collect();
    let tau = assert_live_equals_greedy(&be, &model, &prompts, 20, 4);
    // The oracle proposes the continuation a prefill of the context then decoding gives, which
    // on the f32 reference is the greedy one: every full round commits all 4.
    assert!(tau > 3.0, "{:?}: oracle τ {tau}", spec.arch);
}

#[test]
fn dense_verify_rows_are_decode_steps() {
    check(dense_spec(), 1);
}

#[test]
fn hybrid_verify_rows_are_decode_steps_and_the_crop_replays_them_alike() {
    check(hybrid_spec(), 2);
}

#[test]
fn moe_verify_rows_are_decode_steps() {
    check(moe_spec(), 3);
}

#[test]
fn gpt_oss_verify_rows_are_decode_steps() {
    check(gpt_oss_spec(), 4);
}
