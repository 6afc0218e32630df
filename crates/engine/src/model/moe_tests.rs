//! The routing rule against its literal definition, the routing plan's layout and row
//! independence, the config keys, and a sparse block against a dense per-row reference.

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::model::random::RandomWeights;

/// The rule written as transformers' code reads, in f64: `softmax(logits)`, the `k` largest,
/// divided by their sum when renormalising.
fn literal_route(logits: &[f32], k: usize, renormalise: bool) -> Vec<(usize, f64)> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
    let exps: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    let mut ranked: Vec<(usize, f64)> = exps.iter().map(|e| e / sum).enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(k);
    if renormalise {
        let total: f64 = ranked.iter().map(|r| r.1).sum();
        ranked.iter_mut().for_each(|r| r.1 /= total);
    }
    ranked.sort_by_key(|r| r.0);
    ranked
}

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
}

#[test]
fn route_of_known_probabilities() {
    // softmax(ln [1, 2, 3, 4]) = [0.1, 0.2, 0.3, 0.4].
    let logits: Vec<f32> = [1f32, 2.0, 3.0, 4.0].iter().map(|v| v.ln()).collect();
    let r = route(&logits, 2, false);
    assert_eq!(
        r.iter().map(|c| c.0).collect::<Vec<_>>(),
        [2, 3],
        "ascending expert order"
    );
    assert!(
        (r[0].1 - 0.3).abs() < 1e-6 && (r[1].1 - 0.4).abs() < 1e-6,
        "{r:?}"
    );
    let r = route(&logits, 2, true);
    assert!(
        (r[0].1 - 3.0 / 7.0).abs() < 1e-6 && (r[1].1 - 4.0 / 7.0).abs() < 1e-6,
        "{r:?}"
    );
    // k = E renormalised: every expert, weights summing to 1.
    let r = route(&logits, 4, true);
    assert_eq!(r.len(), 4);
    assert!((r.iter().map(|c| c.1).sum::<f32>() - 1.0).abs() < 1e-6);
}

#[test]
fn route_matches_the_literal_definition() {
    let mut seed = 7u64;
    for (e, k) in [(16, 8), (128, 8), (512, 10), (8, 1), (256, 8)] {
        for renormalise in [false, true] {
            for _ in 0..50 {
                let logits: Vec<f32> = (0..e).map(|_| lcg(&mut seed)).collect();
                let ours = route(&logits, k, renormalise);
                let want = literal_route(&logits, k, renormalise);
                let ids = |v: &[(usize, f64)]| v.iter().map(|c| c.0).collect::<Vec<_>>();
                let ours64: Vec<(usize, f64)> = ours.iter().map(|&(i, w)| (i, w as f64)).collect();
                assert_eq!(ids(&ours64), ids(&want), "E {e} k {k}: experts");
                for (a, b) in ours64.iter().zip(&want) {
                    assert!(
                        (a.1 - b.1).abs() <= 1e-6 * b.1.max(1e-3),
                        "E {e} k {k}: {a:?} vs {b:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn route_breaks_ties_to_the_lower_expert() {
    let r = route(&[1.0, 2.0, 2.0, 2.0, 0.0], 2, true);
    assert_eq!(r, vec![(1, 0.5), (2, 0.5)]);
}

fn spec(e: usize, k: usize, shared: Option<usize>) -> MoeSpec {
    MoeSpec {
        num_experts: e,
        num_experts_per_tok: k,
        moe_intermediate_size: 4,
        norm_topk_prob: true,
        shared_expert_intermediate_size: shared,
        sparse_layers: vec![true],
    }
}

#[test]
fn plan_lays_out_blocks_by_expert_and_is_row_independent() {
    let moe = spec(6, 2, Some(4));
    let width = 7;
    let mut seed = 3u64;
    let logits: Vec<f32> = (0..5 * width).map(|_| lcg(&mut seed)).collect();
    let plan = RoutingPlan::new(&logits, width, &moe, true);
    assert_eq!(plan.terms, 3);
    let routed: usize = plan.rows_by_expert.iter().map(Vec::len).sum();
    assert_eq!(routed, 5 * 2);
    // Each row's routed terms point into its experts' blocks, at the row's place there.
    let mut start = 0;
    let mut block_of = vec![0usize; routed];
    for (e, rows) in plan.rows_by_expert.iter().enumerate() {
        assert!(rows.windows(2).all(|w| w[0] < w[1]), "ascending rows");
        for (i, &r) in rows.iter().enumerate() {
            block_of[start + i] = e;
            let terms = &plan.index[r as usize * 3..r as usize * 3 + 2];
            assert!(
                terms.contains(&((start + i) as u32)),
                "row {r} uses expert {e}'s row {i}"
            );
        }
        start += rows.len();
    }
    for r in 0..5 {
        let row = &logits[r * width..(r + 1) * width];
        let want = route(&row[..6], 2, true);
        let terms = &plan.index[r * 3..r * 3 + 3];
        let experts: Vec<usize> = terms[..2].iter().map(|&i| block_of[i as usize]).collect();
        assert_eq!(experts, want.iter().map(|c| c.0).collect::<Vec<_>>());
        assert_eq!(
            &plan.weights[r * 3..r * 3 + 2],
            &want.iter().map(|c| c.1).collect::<Vec<_>>()[..]
        );
        // The shared expert's term: its own output row, weighted by sigmoid of the gate logit.
        assert_eq!(terms[2], (routed + r) as u32);
        assert_eq!(plan.weights[r * 3 + 2], 1.0 / (1.0 + (-row[6]).exp()));
        // Alone, the row gets the same experts and weights.
        let alone = RoutingPlan::new(row, width, &moe, true);
        assert_eq!(alone.weights, plan.weights[r * 3..r * 3 + 3]);
    }
}

fn cfg(json: serde_json::Value, arch: Arch, layers: usize) -> Result<Option<MoeSpec>> {
    MoeSpec::from_hf_config(&json, arch, layers, Path::new("config.json"))
}

#[test]
fn config_keys_and_defaults() {
    // Qwen3-30B-A3B's keys.
    let m = cfg(
        serde_json::json!({"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
            "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []}),
        Arch::Qwen3Moe,
        48,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size
        ),
        (128, 8, 768)
    );
    assert!(m.norm_topk_prob && m.shared_expert_intermediate_size.is_none());
    assert!(m.sparse_layers.iter().all(|&s| s));
    // The schedule: mlp_only_layers and decoder_sparse_step.
    let m = cfg(
        serde_json::json!({"decoder_sparse_step": 2, "mlp_only_layers": [3]}),
        Arch::Qwen3Moe,
        6,
    )
    .unwrap()
    .unwrap();
    assert_eq!(m.sparse_layers, [false, true, false, false, false, true]);
    assert!(!m.norm_topk_prob, "transformers' Qwen3MoeConfig default");
    // Qwen3.5-MoE: always renormalised, every layer sparse, a shared expert; keys it does not
    // read are ignored as transformers ignores them.
    let m = cfg(
        serde_json::json!({"norm_topk_prob": false, "mlp_only_layers": [0]}),
        Arch::Qwen3_5Moe,
        4,
    )
    .unwrap()
    .unwrap();
    assert!(m.norm_topk_prob && m.sparse_layers == [true; 4]);
    assert_eq!(
        (m.num_experts, m.shared_expert_intermediate_size),
        (256, Some(512))
    );
    // Qwen3-Next without num_experts is a 512-expert model; with 0 it is dense.
    let m = cfg(serde_json::json!({}), Arch::Qwen3Next, 2)
        .unwrap()
        .unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok), (512, 10));
    assert!(
        cfg(serde_json::json!({"num_experts": 0}), Arch::Qwen3Next, 2)
            .unwrap()
            .is_none()
    );
    // Dense architectures have no experts whatever the keys say.
    assert!(cfg(serde_json::json!({"num_experts": 8}), Arch::Qwen3, 2)
        .unwrap()
        .is_none());
    // Every layer in mlp_only_layers: dense.
    assert!(cfg(
        serde_json::json!({"mlp_only_layers": [0, 1]}),
        Arch::Qwen3Moe,
        2
    )
    .unwrap()
    .is_none());
}

#[test]
fn bad_config_keys_are_named() {
    let err = |j: serde_json::Value, arch| format!("{:#}", cfg(j, arch, 4).unwrap_err());
    let e = err(
        serde_json::json!({"num_experts": 8, "num_experts_per_tok": 9}),
        Arch::Qwen3Moe,
    );
    assert!(
        e.contains("config.json: num_experts_per_tok 9 must be between 1 and num_experts (8)"),
        "{e}"
    );
    let e = err(
        serde_json::json!({"num_experts_per_tok": 0}),
        Arch::Qwen3_5Moe,
    );
    assert!(e.contains("num_experts_per_tok 0"), "{e}");
    let e = err(
        serde_json::json!({"decoder_sparse_step": 0}),
        Arch::Qwen3Moe,
    );
    assert!(e.contains("decoder_sparse_step is 0"), "{e}");
    let e = err(
        serde_json::json!({"moe_intermediate_size": 0}),
        Arch::Qwen3Moe,
    );
    assert!(e.contains("moe_intermediate_size is 0"), "{e}");
    let e = err(
        serde_json::json!({"shared_expert_intermediate_size": 0}),
        Arch::Qwen3Next,
    );
    assert!(e.contains("shared_expert_intermediate_size is 0"), "{e}");
}

/// A tiny Qwen3-MoE spec: 2 layers, layer 1 dense; 6 experts, top-2, a shared expert (as on
/// Qwen3-Next, to cover both terms).
pub(crate) fn tiny_moe_spec() -> ModelSpec {
    let mut s = crate::model::random::qwen3_8b_spec();
    s.arch = Arch::Qwen3Moe;
    s.vocab_size = 64;
    s.hidden_size = 16;
    s.intermediate_size = 24;
    s.num_layers = 2;
    s.num_heads = 2;
    s.num_kv_heads = 1;
    s.head_dim = 8;
    s.moe = Some(MoeSpec {
        num_experts: 6,
        num_experts_per_tok: 2,
        moe_intermediate_size: 8,
        norm_topk_prob: false,
        shared_expert_intermediate_size: Some(12),
        sparse_layers: vec![true, false],
    });
    s
}

/// The sparse block against its definition computed row by row on the host from the same
/// weights: `Σ_{e ∈ topk} w_e · expert_e(x) + sigmoid(g · x) · shared(x)`.
#[test]
fn sparse_block_matches_a_per_row_reference() {
    let spec = tiny_moe_spec();
    let moe = spec.moe.clone().unwrap();
    let src = RandomWeights::new(&spec, 11).with_init(0.3, 0.5);
    let be = CpuBackend::new();
    let block = SparseMoe::load(&be, &src, "model.layers.0.mlp", 16, &moe).unwrap();
    let rows = 5;
    let mut seed = 9u64;
    let x: Vec<f32> = (0..rows * 16).map(|_| lcg(&mut seed) / 4.0).collect();
    let h0: Vec<f32> = (0..rows * 16).map(|_| lcg(&mut seed)).collect();
    let xt = be.from_host(&x, rows, 16).unwrap();
    let mut h = be.from_host(&h0, rows, 16).unwrap();
    block.forward_acc(&be, &xt, &mut h).unwrap();
    let got = be.to_host(&h).unwrap();

    let w = |n: &str| src.tensor(n).unwrap().data;
    let matvec = |m: &[f32], v: &[f32]| -> Vec<f32> {
        m.chunks(v.len())
            .map(|r| r.iter().zip(v).map(|(a, b)| a * b).sum())
            .collect()
    };
    let swiglu = |p: &str, v: &[f32]| -> Vec<f32> {
        let g = matvec(&w(&format!("{p}.gate_proj.weight")), v);
        let u = matvec(&w(&format!("{p}.up_proj.weight")), v);
        let a: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        matvec(&w(&format!("{p}.down_proj.weight")), &a)
    };
    for r in 0..rows {
        let xr = &x[r * 16..(r + 1) * 16];
        let logits = matvec(&w("model.layers.0.mlp.gate.weight"), xr);
        let mut want = vec![0f32; 16];
        for (e, wt) in route(&logits, 2, false) {
            let y = swiglu(&format!("model.layers.0.mlp.experts.{e}"), xr);
            want.iter_mut().zip(&y).for_each(|(o, y)| *o += wt * y);
        }
        let g = matvec(&w("model.layers.0.mlp.shared_expert_gate.weight"), xr)[0];
        let s = swiglu("model.layers.0.mlp.shared_expert", xr);
        want.iter_mut()
            .zip(&s)
            .for_each(|(o, s)| *o += 1.0 / (1.0 + (-g).exp()) * s);
        for c in 0..16 {
            let (a, b) = (got[r * 16 + c], h0[r * 16 + c] + want[c]);
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "row {r} col {c}: {a} vs {b}"
            );
        }
    }
    // Row independence: each row alone gives bit-identical output.
    for r in 0..rows {
        let xt = be.from_host(&x[r * 16..(r + 1) * 16], 1, 16).unwrap();
        let mut h = be.from_host(&h0[r * 16..(r + 1) * 16], 1, 16).unwrap();
        block.forward_acc(&be, &xt, &mut h).unwrap();
        assert_eq!(
            be.to_host(&h).unwrap(),
            got[r * 16..(r + 1) * 16],
            "row {r} alone"
        );
    }
}
