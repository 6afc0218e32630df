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

/// A checkpoint quantised in a way draftlens cannot read (here FP8, as Qwen's `-FP8` releases
/// store their experts: `F8_E4M3` tensors under `quantization_config.quant_method` "fp8"): the
/// folder still opens (`inspect` lists its tensors and dtypes), and a command that runs the target
/// refuses it when it opens it (`Session::load`), before any weight is read, naming the folder,
/// the tensor and its dtype.
#[test]
fn a_tensor_in_an_unreadable_quantised_dtype_is_refused_before_any_weight_is_read() {
    use safetensors::tensor::{Dtype, TensorView};
    let fp8 = "model.layers.0.mlp.experts.1.down_proj.weight";
    let mut c = config();
    c["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
    let dir = folder(&c, |_| {});
    // Rewrite the file with that expert's weight stored as one byte per value.
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let stored: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let n_values: usize = t.shape().iter().product();
            match n == fp8 {
                true => (n, Dtype::F8_E4M3, t.shape().to_vec(), vec![0x38; n_values]),
                false => (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()),
            }
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = stored
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();

    let listed = TargetFiles::open(dir.path()).unwrap().weights.tensors();
    assert_eq!(
        listed.iter().find(|t| t.name == fp8).unwrap().dtype,
        "F8_E4M3"
    );
    let cache = tempfile::tempdir().unwrap();
    let e = match draftlens_engine::session::Session::load(
        CpuBackend::new(),
        dir.path(),
        draftlens_engine::hidden_cache::HiddenCache::open(cache.path()).unwrap(),
        Default::default(),
    ) {
        Ok(_) => panic!("an F8_E4M3 expert was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with(&dir.path().display().to_string())
            && e.contains(&format!(
                "tensor {fp8} ({fp8}) is stored as F8_E4M3, which draftlens cannot read"
            )),
        "{e}"
    );
}

/// A top-k of 0: no expert would run.
#[test]
fn a_top_k_of_zero_is_named() {
    let mut c = config();
    c["num_experts_per_tok"] = json!(0);
    let dir = folder(&c, |_| {});
    let e = open_err(dir.path());
    assert!(
        e.contains("config.json: num_experts_per_tok 0 must be between 1 and num_experts (4)"),
        "{e}"
    );
}
