//! Mixture-of-experts checkpoints that disagree with their config: each is refused by
//! `TargetFiles::open` (headers only, before any weight is read or computed on) with one message
//! naming the file and the tensor or key. A consistent tiny Qwen3-MoE folder opens and runs.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::formats::WeightSource;
use draftlens_engine::model::random::RandomWeights;
use draftlens_engine::model::{Capture, ModelSpec, TargetFiles, TargetModel};
use serde_json::json;
use std::path::Path;

/// 2 layers (layer 1 dense), 4 experts, top-2, renormalised.
fn config() -> serde_json::Value {
    json!({
        "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
        "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [1]
    })
}

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// A folder with `config` and the tensors of `config()`'s model after `edit`.
fn folder(config: &serde_json::Value, edit: impl FnOnce(&mut Tensors)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, self::config().to_string()).unwrap();
    let spec = ModelSpec::from_hf_config(&good).unwrap();
    std::fs::remove_file(good).unwrap();
    let src = RandomWeights::new(&spec, 5).with_init(0.2, 0.3);
    let mut tensors: Tensors = src
        .tensors()
        .into_iter()
        .map(|t| {
            let data = src.tensor(&t.name).unwrap().data;
            (t.name, t.shape, data)
        })
        .collect();
    edit(&mut tensors);
    draftlens_engine::util::write_f32_safetensors(&dir.path().join("model.safetensors"), &tensors)
        .unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

fn open_err(dir: &Path) -> String {
    match TargetFiles::open(dir) {
        Ok(_) => panic!("{}: accepted", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

fn remove(name: &'static str) -> impl FnOnce(&mut Tensors) {
    move |t| t.retain(|(n, _, _)| n != name)
}

#[test]
fn a_consistent_checkpoint_opens_and_runs() {
    let dir = folder(&config(), |_| {});
    let files = TargetFiles::open(dir.path()).unwrap();
    let moe = files.spec.moe.as_ref().unwrap();
    assert_eq!(moe.sparse_layers, [true, false]);
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    let out = model
        .forward(&be, &[1, 2, 3], &mut model.new_cache(), &Capture::none())
        .unwrap();
    let top = model.logits_topk(&be, &out.last_hidden, 1).unwrap();
    assert!(top.logprobs.iter().all(|l| l.is_finite()));
}

#[test]
fn bad_checkpoints_are_one_clear_error_naming_the_tensor_or_key() {
    type Edit = Box<dyn FnOnce(&mut Tensors)>;
    let with = |k: &str, v: serde_json::Value| {
        let mut c = config();
        c[k] = v;
        c
    };
    let cases: Vec<(serde_json::Value, Edit, &[&str])> = vec![
        (
            config(),
            Box::new(remove("model.layers.0.mlp.experts.3.up_proj.weight")),
            &["tensor model.layers.0.mlp.experts.3.up_proj.weight is missing"],
        ),
        (
            config(),
            Box::new(remove("model.layers.0.mlp.gate.weight")),
            &["tensor model.layers.0.mlp.gate.weight is missing"],
        ),
        (
            config(),
            Box::new(|t: &mut Tensors| {
                t.push(("model.layers.0.mlp.gate.bias".into(), vec![4], vec![0.0; 4]))
            }),
            &[
                "tensor model.layers.0.mlp.gate.bias",
                "router bias",
                "qwen3_moe's router has none",
            ],
        ),
        (
            // Fewer experts in the config than in the file.
            with("num_experts", json!(3)),
            Box::new(|_: &mut Tensors| {}),
            &[
                "model.layers.0.mlp.experts.3.",
                "is expert 3",
                "num_experts = 3",
            ],
        ),
        (
            // More experts in the config than in the file: the router's shape says so first.
            with("num_experts", json!(5)),
            Box::new(|_: &mut Tensors| {}),
            &[
                "tensor model.layers.0.mlp.gate.weight",
                "has shape [4, 16]",
                "[5, 16]",
            ],
        ),
        (
            with("num_experts_per_tok", json!(5)),
            Box::new(|_: &mut Tensors| {}),
            &["config.json: num_experts_per_tok 5 must be between 1 and num_experts (4)"],
        ),
        (
            with("moe_intermediate_size", json!(6)),
            Box::new(|_: &mut Tensors| {}),
            &[
                "tensor model.layers.0.mlp.experts.0.gate_proj.weight",
                "has shape [8, 16]",
                "[6, 16]",
            ],
        ),
        (
            // The config makes layer 0 dense, the file holds its experts.
            with("mlp_only_layers", json!([0])),
            Box::new(|_: &mut Tensors| {}),
            &[
                "model.layers.0.mlp.",
                "belongs to a sparse MLP",
                "layer 0's MLP dense",
            ],
        ),
        (
            // Experts stored fused as 3-D tensors.
            config(),
            Box::new(|t: &mut Tensors| {
                t.retain(|(n, _, _)| !n.starts_with("model.layers.0.mlp.experts."));
                t.push((
                    "model.layers.0.mlp.experts.gate_up_proj".into(),
                    vec![4, 16, 16],
                    vec![0.0; 1024],
                ));
                t.push((
                    "model.layers.0.mlp.experts.down_proj".into(),
                    vec![4, 16, 8],
                    vec![0.0; 512],
                ));
            }),
            &[
                "tensor model.layers.0.mlp.experts.",
                "fused",
                "not supported yet",
            ],
        ),
    ];
    for (config, edit, want) in cases {
        let dir = folder(&config, edit);
        let e = open_err(dir.path());
        assert!(
            e.contains(&dir.path().display().to_string()),
            "names the folder: {e}"
        );
        for w in want {
            assert!(e.contains(w), "expected {w:?} in: {e}");
        }
        assert_eq!(e.lines().count(), 1, "one line: {e}");
    }
}
