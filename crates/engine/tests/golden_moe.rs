//! The CPU backend against Hugging Face transformers on two random-weight mixture-of-experts
//! models (tests/fixtures/golden/{qwen3_moe,qwen3_5_moe}, made by
//! tools/golden/make_moe_goldens.py with transformers 5.17 in fp32 and its literal per-expert
//! loop, `experts_implementation="eager"`), and the rule that a token's routing and output do not
//! depend on its batch-mates (packed prefill and batched greedy decoding, bit for bit).
//!
//! Covered: `qwen3_moe` (flat config, per-expert checkpoint, a dense layer from
//! `mlp_only_layers`, renormalised top-8 of 16), `qwen3_5_moe` (composite config with
//! `text_config`, `model.language_model.*` weights, vision and MTP tensors to ignore, every layer
//! sparse with the gated shared expert). Head dims 128 (attention and Gated DeltaNet). (The
//! script's third model, `qwen3_next_moe`, is not committed: docs/moe-models.md.) Per prompt: every hidden state, the pre-norm last layer, the last position's
//! top-8 log-probs and the 64-token greedy continuation.

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::generate::greedy_batch;
use draftlens_engine::model::{Arch, Capture, TargetFiles, TargetModel};
use golden_util::*;

/// ‖ours − ref‖/‖ref‖ per captured layer. The weights are bf16 values f32 holds exactly and the
/// reference is fp32, so the differences are f32 summation order (GEMMs, the delta rule; the
/// expert sum is added in transformers' own order, ascending expert then the shared expert) and
/// the reference's f16 storage (≤ 4.9e-4 per element, ~3e-4 in norm). The same bounds as the
/// dense and hybrid goldens; the bugs they guard against (a wrong expert, weights not
/// renormalised or renormalised when they should not be, the shared gate missing or not
/// sigmoid-ed, a dense layer read as sparse) give errors ≥ 1e-2. The goldens' prompts were redrawn
/// until no token's k-th and (k+1)-th router probabilities were within 1e-5, so reordered f32
/// sums pick the same experts.
const REL_TOL: f64 = 1e-3;
/// The same after rounding ours to f16 as the reference was stored (storage error cancels).
const REL_TOL_F16: f64 = 1.5e-4;
/// Last-position top-8 log-probs (stored f32).
const LOGPROB_TOL: f32 = 5e-4;
const NEW_TOKENS: usize = 64;
/// Packed with other prompts against alone (see [`check_batch_invariance`]).
const PACKED_REL_TOL: f64 = 1e-5;

fn load(name: &str) -> (TargetFiles, TargetModel<CpuBackend>, serde_json::Value) {
    let dir = repo_root().join("tests/fixtures/golden").join(name);
    let manifest = json(&dir.join("manifest.json"));
    let wsha = draftlens_engine::util::sha256_file(&dir.join("model.safetensors")).unwrap();
    assert_eq!(
        manifest["weights_sha256"].as_str().unwrap(),
        wsha,
        "{name}: model.safetensors is not the file the golden was made from"
    );
    let files = TargetFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let model = TargetModel::load(&CpuBackend::new(), &files.spec, files.weights.as_ref())
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    (files, model, manifest)
}

fn check_model(name: &str) -> TargetFiles {
    let (files, model, manifest) = load(name);
    let nl = files.spec.num_layers;
    let indices: Vec<usize> = manifest["hidden_state_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(indices, (0..=nl).collect::<Vec<_>>());
    // The layers transformers built as sparse are the ones we read as sparse.
    let sparse: Vec<usize> = manifest["sparse_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let moe = files.spec.moe.as_ref().expect("a mixture-of-experts spec");
    let ours: Vec<usize> = (0..nl).filter(|&i| moe.is_sparse(i)).collect();
    assert_eq!(ours, sparse, "{name}: sparse layers");
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices(indices, nl).unwrap()
    };
    let g = Golden::open(
        repo_root()
            .join("tests/fixtures/golden")
            .join(name)
            .join("golden.safetensors"),
    );
    let prompts = manifest["prompts"].as_array().unwrap();
    assert!(!prompts.is_empty());
    assert!(files.spec.eos_token_ids.is_empty(), "{name}: no EOS");
    let tol = Tolerances {
        rel: REL_TOL,
        rel_f16: REL_TOL_F16,
        logprob: LOGPROB_TOL,
    };
    let (mut worst, mut worst16, mut worst_lp) = (0f64, 0f64, 0f32);
    for p in 0..prompts.len() {
        let (w, w16, wlp) = check_golden_prompt(name, p, &g, &model, &capture, NEW_TOKENS, &tol);
        worst = worst.max(w);
        worst16 = worst16.max(w16);
        worst_lp = worst_lp.max(wlp);
    }
    eprintln!("{name}: worst rel {worst:.2e} (f16-rounded {worst16:.2e}), top-8 log-prob max |Δ| {worst_lp:.2e}");
    check_batch_invariance(name, &model, &g, prompts.len());
    files
}

/// Packed prefill of every golden prompt together against the packed prefill of each prompt
/// alone at the last hidden state, and batched greedy decoding against the golden tokens. Routing
/// is per row and each row's expert terms are summed in its own fixed order, but the CPU GEMM
/// (the `gemm` crate) may block an expert's rows differently when the expert gets a different
/// number of rows, so the states agree to f32 rounding (measured ~1e-7), not bit for bit
/// (docs/moe-models.md, "Row independence").
fn check_batch_invariance(name: &str, model: &TargetModel<CpuBackend>, g: &Golden, n: usize) {
    let be = CpuBackend::new();
    let prompts: Vec<Vec<u32>> = (0..n).map(|p| g.ids(&format!("p{p}.input_ids"))).collect();
    for (i, rel) in packed_vs_alone(model, &prompts).into_iter().enumerate() {
        eprintln!("{name}: prompt {i} packed with the others vs alone: rel {rel:.1e}");
        assert!(
            rel < PACKED_REL_TOL,
            "{name}: prompt {i} packed with the others differs from alone: rel {rel:.2e}"
        );
    }
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let batch = greedy_batch(&be, model, &refs, 16, &[]).unwrap();
    for (i, c) in batch.iter().enumerate() {
        let want = g.ids(&format!("p{i}.greedy_ids"));
        assert_eq!(c.ids, want[..16], "{name}: prompt {i} decoded in a batch");
    }
}

#[test]
fn qwen3_moe_random_model_matches_transformers() {
    let f = check_model("qwen3_moe");
    let s = &f.spec;
    assert_eq!(s.arch, Arch::Qwen3Moe);
    assert!(s.hybrid.is_none() && s.qk_norm);
    let m = s.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.num_experts_per_tok),
        (16, 8),
        "the real top-k"
    );
    assert!(m.norm_topk_prob && m.shared_expert_intermediate_size.is_none());
    assert_eq!(m.sparse_layers, [true, false, true], "mlp_only_layers [1]");
    assert_eq!(s.head_dim, 128);
}

#[test]
fn qwen3_5_moe_random_model_matches_transformers() {
    let f = check_model("qwen3_5_moe");
    let s = &f.spec;
    assert_eq!(
        s.arch,
        Arch::Qwen3_5Moe,
        "text_config.model_type qwen3_5_moe_text"
    );
    assert!(s.hybrid.is_some());
    let m = s.moe.as_ref().unwrap();
    assert_eq!(m.sparse_layers, [true; 3]);
    assert!(m.norm_topk_prob, "Qwen3.5-MoE always renormalises");
    assert_eq!(m.shared_expert_intermediate_size, Some(16));
    // The VLM prefix is hidden; vision and MTP tensors are not part of the model.
    assert!(f
        .weights
        .contains("model.layers.0.mlp.experts.15.down_proj.weight"));
    assert!(f
        .weights
        .contains("model.layers.0.mlp.shared_expert_gate.weight"));
    assert!(!f.weights.contains("mtp.fc.weight"));
}
