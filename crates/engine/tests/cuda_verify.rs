//! A verify pass on CUDA computes each row with the bits of the decode step (docs/live.md,
//! "Verify equals decoding"): the block's k/v appended first, then one decode-attention launch
//! with row t at length len + t; every GEMM of the block already runs on the batch-invariant
//! decode kernel. Checked for each target family (dense, hybrid with its Gated DeltaNet rows
//! stepped one at a time and the crop's replay, mixture of experts, gpt-oss with sinks and
//! windows), and end to end: live decoding with the oracle and anti-oracle drafters equals
//! greedy decoding token for token on bf16 random targets, whose logits hold near-ties that a
//! differently rounded verify pass resolves the other way.
//!
//! Without a GPU every test prints "SKIP: CUDA unavailable: <reason>" and passes (CI).
#![cfg(feature = "cuda")]

mod cuda_util;
use cuda_util::gpu;
mod golden_util;
mod verify_util;

use draftlens_engine::model::random::RandomWeights;
use draftlens_engine::model::{ModelSpec, TargetModel};
use verify_util::*;

fn check(spec: ModelSpec, seed: u64) {
    let Some(be) = gpu() else { return };
    let src = RandomWeights::new(&spec, seed).with_init(0.08, 0.3);
    let model = TargetModel::load(&be, &spec, &src).unwrap();
    let v = spec.vocab_size;
    // Prompts below, inside and across gpt-oss's 8-token window and the decode attention's
    // 32-key chunks; blocks of 1, 5, 16 and 64 (the most rows decoding keeps independent).
    for (n, b, keep) in [(3, 5, 2), (9, 16, 15), (1, 1, 0), (40, 16, 7), (70, 64, 33)] {
        let prompt = ids(n, 100 + n as u64, v);
        let block = ids(b, 200 + b as u64, v);
        assert_verify_rows_are_decode_steps(&be, &model, &prompt, &block, keep);
    }
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| ids(4 + 9 * i, 300 + i as u64, v)).collect();
    let tau = assert_live_equals_greedy(&be, &model, &prompts, 48, 16);
    println!("{:?}: oracle τ {tau:.3} (B = 16)", spec.arch);
}

#[test]
fn dense_verify_rows_are_decode_steps_on_cuda() {
    check(dense_spec(), 1);
}

#[test]
fn hybrid_verify_rows_are_decode_steps_on_cuda() {
    check(hybrid_spec(), 2);
}

#[test]
fn moe_verify_rows_are_decode_steps_on_cuda() {
    check(moe_spec(), 3);
}

#[test]
fn gpt_oss_verify_rows_are_decode_steps_on_cuda() {
    check(gpt_oss_spec(), 4);
}
