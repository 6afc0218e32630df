//! The CPU backend against Hugging Face transformers on the two random-weight hybrid models
//! (tests/fixtures/golden/{qwen3_5,qwen3_next}, made by tools/golden/make_hybrid_goldens.py with
//! transformers 5.17's torch fallback in fp32: the Reference profile of docs/hybrid-models.md).
//!
//! They cover: a `qwen3_5` composite config (text model under `text_config`, weights named
//! `model.language_model.*`, vision and MTP tensors to ignore) and a flat `qwen3_next` config
//! (`full_attention_interval`, top-level `partial_rotary_factor`, fused grouped `in_proj_qkvz` /
//! `in_proj_ba`); Gated DeltaNet layers with 2 key heads and 4 value heads, the chunked delta rule
//! over 2 chunks (the 70-token prompt), gated attention with partial RoPE (8 of 32 dims),
//! zero-centred norms, f32 `A_log` / `dt_bias`. Per model and prompt: every hidden state
//! (0..=6) and the pre-norm last layer, the last-position top-8 log-probs, and the 64-token
//! greedy continuation (no EOS).

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::model::config::LayerType;
use draftlens_engine::model::{Arch, Capture, TargetFiles, TargetModel};
use golden_util::*;

/// ‖ours − ref‖/‖ref‖ per captured layer. As in golden_qwen.rs the weights are bf16 values f32
/// holds exactly and the reference is fp32, so the differences are f32 summation order (the
/// delta rule's chunked form sums in another order than torch's batched matmuls and
/// `solve_triangular`, still ~1e-6 relative per layer) plus the reference's f16 storage
/// (≤ 4.9e-4 per element, ~3e-4 in norm). 1e-3 bounds that; the bugs it guards against (q/gate
/// rows not de-interleaved, norms not zero-centred, full instead of partial RoPE, value heads
/// mapped to the wrong key head, fused projections un-grouped wrongly) give errors ≥ 1e-1.
const REL_TOL: f64 = 1e-3;
/// The same after rounding ours to f16 as the reference was (storage error cancels). f32
/// reordering alone through 6 layers stays ≤ ~1e-5 per element here; 1.5e-4 as in golden_qwen.rs.
const REL_TOL_F16: f64 = 1.5e-4;
/// Last-position top-8 log-probs (stored f32): logits are O(1–10); f32 noise is ~1e-5.
const LOGPROB_TOL: f32 = 5e-4;

fn check_model(name: &str) -> TargetFiles {
    let new_tokens = 64;
    let dir = repo_root().join("tests/fixtures/golden").join(name);
    let manifest = json(&dir.join("manifest.json"));
    // The committed weights are the ones the golden was computed from.
    let wsha = draftlens_engine::util::sha256_file(&dir.join("model.safetensors")).unwrap();
    assert_eq!(
        manifest["weights_sha256"].as_str().unwrap(),
        wsha,
        "{name}: model.safetensors is not the file the golden was made from"
    );

    let files = TargetFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(files.identity.format, "safetensors");
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let nl = files.spec.num_layers;
    let indices: Vec<usize> = manifest["hidden_state_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(indices, (0..=nl).collect::<Vec<_>>());
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices(indices.clone(), nl).unwrap()
    };
    let g = Golden::open(dir.join("golden.safetensors"));
    let prompts = manifest["prompts"].as_array().unwrap();
    assert!(!prompts.is_empty());
    // No eos_token_id in the config and no tokenizer: the golden ran 64 tokens without stopping.
    let eos = files.spec.eos_token_ids.clone();
    assert!(eos.is_empty(), "{name}: the random model declares no EOS");

    let (mut worst, mut worst16, mut worst_lp) = (0f64, 0f64, 0f32);
    let tol = Tolerances {
        rel: REL_TOL,
        rel_f16: REL_TOL_F16,
        logprob: LOGPROB_TOL,
    };
    for p in 0..prompts.len() {
        // Greedy decoding runs the recurrent form of the delta rule token by token (the golden's
        // prefill the chunked form).
        let (w, w16, wlp) = check_golden_prompt(name, p, &g, &model, &capture, new_tokens, &tol);
        worst = worst.max(w);
        worst16 = worst16.max(w16);
        worst_lp = worst_lp.max(wlp);
    }
    eprintln!("{name}: worst rel {worst:.2e} (f16-rounded {worst16:.2e}), top-8 log-prob max |Δ| {worst_lp:.2e}");
    files
}

#[test]
fn qwen3_5_random_model_matches_transformers() {
    let f = check_model("qwen3_5");
    // What this golden covers, stated so a config-parsing regression cannot pass silently.
    let s = &f.spec;
    assert_eq!(s.arch, Arch::Qwen3_5, "text_config.model_type qwen3_5_text");
    let hy = s.hybrid.as_ref().expect("hybrid spec");
    assert_eq!(
        hy.layer_types,
        [
            LayerType::LinearAttention,
            LayerType::LinearAttention,
            LayerType::FullAttention
        ]
        .repeat(2)
    );
    assert_eq!(
        (
            hy.linear_num_key_heads,
            hy.linear_num_value_heads,
            hy.rotary_dim
        ),
        (2, 4, 8),
        "grouped value heads, a quarter of head_dim 32 rotated"
    );
    assert_eq!(s.rope_theta, 1e6);
    // The checkpoint's VLM prefix is hidden; vision and MTP tensors are not part of the model.
    assert!(f.weights.contains("model.layers.0.linear_attn.A_log"));
    assert!(!f.weights.contains("mtp.fc.weight"));
    assert!(f
        .weights
        .tensors()
        .iter()
        .all(|t| !t.name.contains("visual")));
}

#[test]
fn qwen3_next_random_model_matches_transformers() {
    let f = check_model("qwen3_next");
    let s = &f.spec;
    assert_eq!(s.arch, Arch::Qwen3Next);
    let hy = s.hybrid.as_ref().expect("hybrid spec");
    assert_eq!(
        hy.layer_types,
        [
            LayerType::LinearAttention,
            LayerType::LinearAttention,
            LayerType::FullAttention
        ]
        .repeat(2),
        "from full_attention_interval 3"
    );
    assert_eq!(hy.rotary_dim, 8, "top-level partial_rotary_factor 0.25");
    // The fused projections are presented in the Qwen3.5 layout.
    assert!(f
        .weights
        .contains("model.layers.0.linear_attn.in_proj_qkv.weight"));
    assert!(f
        .weights
        .contains("model.layers.0.linear_attn.in_proj_a.weight"));
    // `inspect` counts each stored parameter once: the fused tensors are listed as their split
    // parts only (349 216 = the element count of model.safetensors, by the safetensors package).
    let n: usize = f
        .weights
        .tensors()
        .iter()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    assert_eq!(n, 349_216);
}
