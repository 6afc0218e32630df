//! Helpers of the "verify equals decoding" tests (`verify_as_decode.rs` on the CPU reference,
//! `cuda_verify.rs` on the GPU; docs/live.md, "Verify equals decoding"): one small target of each
//! family whose attention the CUDA decode kernel covers (head dims of 64), and the two checks.
#![allow(dead_code)]

use draftlens_engine::backend::Backend;
use draftlens_engine::drafter::live::live_decode;
use draftlens_engine::drafter::Drafter;
use draftlens_engine::generate::greedy;
use draftlens_engine::model::hybrid::{HybridSpec, LayerType};
use draftlens_engine::model::moe::MoeSpec;
use draftlens_engine::model::random::qwen3_8b_spec;
use draftlens_engine::model::{Arch, Capture, ModelSpec, TargetModel};

/// Qwen3's architecture, 3 layers, heads of 64.
pub fn dense_spec() -> ModelSpec {
    ModelSpec {
        vocab_size: 1003,
        hidden_size: 200,
        intermediate_size: 264,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        max_position_embeddings: 512,
        ..qwen3_8b_spec()
    }
}

/// A Qwen3.5-shaped hybrid: Gated DeltaNet, GDN, GDN, full attention (gated, heads of 64 with a
/// quarter rotary).
pub fn hybrid_spec() -> ModelSpec {
    let layers = 4;
    ModelSpec {
        arch: Arch::Qwen3_5,
        hybrid: Some(HybridSpec {
            layer_types: (0..layers)
                .map(|i| {
                    if (i + 1) % 4 == 0 {
                        LayerType::FullAttention
                    } else {
                        LayerType::LinearAttention
                    }
                })
                .collect(),
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 32,
            linear_value_head_dim: 32,
            linear_conv_kernel_dim: 4,
            rotary_dim: 16,
        }),
        num_layers: layers,
        ..dense_spec()
    }
}

/// A Qwen3-MoE-shaped model: 16 experts, top-4, expert width 96.
pub fn moe_spec() -> ModelSpec {
    let layers = 2;
    ModelSpec {
        arch: Arch::Qwen3Moe,
        num_layers: layers,
        moe: Some(MoeSpec {
            num_experts: 16,
            num_experts_per_tok: 4,
            moe_intermediate_size: 96,
            norm_topk_prob: true,
            shared_expert_intermediate_size: None,
            sparse_layers: vec![true; layers],
        }),
        ..dense_spec()
    }
}

/// gpt-oss: the committed fixture's config (YaRN, top-4, sinks, window 8), sliding and full
/// layers alternating, 16 experts of width 96 over a hidden size of 256.
pub fn gpt_oss_spec() -> ModelSpec {
    crate::golden_util::small_gpt_oss_spec(16, &["sliding_attention", "full_attention"].repeat(2))
}

fn bits<B: Backend>(be: &B, t: &B::Tensor) -> Vec<u32> {
    be.to_host(t).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// A prompt of `n` ids from `seed`, below `vocab`.
pub fn ids(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut r = draftlens_engine::util::DetRng::new(seed);
    (0..n).map(|_| r.below(vocab as u64) as u32).collect()
}

/// After `prompt`, a verify pass over `block` gives every row the bits of decoding the block's
/// tokens one at a time; cropped to the prompt and `keep` of the block, its cache then decodes
/// the next token with the bits of a cache that decoded only those `keep` tokens.
pub fn assert_verify_rows_are_decode_steps<B: Backend>(
    be: &B,
    model: &TargetModel<B>,
    prompt: &[u32],
    block: &[u32],
    keep: usize,
) {
    let what = format!(
        "{:?}, prompt {}, block {}",
        model.spec.arch,
        prompt.len(),
        block.len()
    );
    let prefilled = || {
        let mut c = model.new_cache();
        model.forward(be, prompt, &mut c, &Capture::none()).unwrap();
        c
    };
    let mut decoded = prefilled();
    let steps: Vec<Vec<u32>> = block
        .iter()
        .map(|&t| {
            bits(
                be,
                &model.forward_decode(be, &[t], &mut [&mut decoded]).unwrap(),
            )
        })
        .collect();
    let mut verified = prefilled();
    let out = model
        .forward_verify(be, block, &mut verified, &Capture::none())
        .unwrap();
    let rows = bits(be, &out.last_hidden);
    let d = rows.len() / block.len();
    for (r, step) in steps.iter().enumerate() {
        let same = rows[r * d..(r + 1) * d] == step[..];
        assert!(same, "{what}: verify row {r} differs from its decode step");
    }
    assert_eq!(verified.len, decoded.len, "{what}");

    model.crop(be, &mut verified, prompt.len() + keep).unwrap();
    let mut kept = prefilled();
    for &t in &block[..keep] {
        model.forward_decode(be, &[t], &mut [&mut kept]).unwrap();
    }
    let next = block[keep];
    let after_crop = bits(
        be,
        &model
            .forward_decode(be, &[next], &mut [&mut verified])
            .unwrap(),
    );
    let decoded_only = bits(
        be,
        &model.forward_decode(be, &[next], &mut [&mut kept]).unwrap(),
    );
    assert!(
        after_crop == decoded_only,
        "{what}: after a crop to {keep} of the block, the next decode step differs"
    );
}

/// Live decoding with the oracle drafter (blocks of `block_size`) gives each prompt exactly its
/// plain greedy continuation, and so does the anti-oracle (every block rejected); returns the
/// oracle's mean τ over the prompts.
pub fn assert_live_equals_greedy<B: Backend>(
    be: &B,
    model: &TargetModel<B>,
    prompts: &[Vec<u32>],
    max_new: usize,
    block_size: usize,
) -> f64 {
    let mut taus = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let plain = greedy(be, model, p, max_new, &[]).unwrap();
        for (name, d) in [
            ("the oracle", Drafter::<B>::Oracle { block_size }),
            ("the anti-oracle", Drafter::<B>::AntiOracle { block_size }),
        ] {
            let live = live_decode(be, model, &d, p, max_new, &[]).unwrap();
            assert_eq!(
                live.ids, plain.ids,
                "{:?}, prompt {i}: live decoding with {name} parts from greedy decoding",
                model.spec.arch
            );
            if matches!(d, Drafter::Oracle { .. }) {
                taus.push(live.tau());
            }
        }
    }
    taus.iter().sum::<f64>() / taus.len() as f64
}
