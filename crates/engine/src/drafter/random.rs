//! Random-weight DFlash checkpoints in the real z-lab format: known-answer tests and benchmarks
//! load them through the normal path (config.json + model.safetensors).

use crate::model::ModelSpec;
use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use std::path::Path;

/// Shape of a random drafter for `target`.
#[derive(Clone, Debug)]
pub struct RandomDrafter {
    pub layers: usize,
    pub block_size: usize,
    pub target_layer_ids: Vec<usize>,
    pub intermediate_size: usize,
    pub mask_token_id: u32,
    /// Number of sliding-window layers at the start (causal in the block).
    pub sliding_layers: usize,
    pub sliding_window: usize,
    pub seed: u64,
}

/// Write `config.json` + `model.safetensors` (bf16) for a random drafter into `dir`.
pub fn write_random_checkpoint(dir: &Path, target: &ModelSpec, r: &RandomDrafter) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let d = target.hidden_size;
    let (heads, kv, hd) = (target.num_heads, target.num_kv_heads, target.head_dim);
    let layer_types: Vec<&str> = (0..r.layers)
        .map(|i| {
            if i < r.sliding_layers {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let config = serde_json::json!({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "block_size": r.block_size,
        "dflash_config": { "mask_token_id": r.mask_token_id, "target_layer_ids": r.target_layer_ids },
        "num_target_layers": target.num_layers,
        "num_hidden_layers": r.layers, "hidden_size": d, "intermediate_size": r.intermediate_size,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "vocab_size": target.vocab_size,
        "layer_types": layer_types, "sliding_window": if r.sliding_layers > 0 { Some(r.sliding_window) } else { None },
        "max_position_embeddings": target.max_position_embeddings, "tie_word_embeddings": false,
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(r.seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut mat = |name: String, shape: Vec<usize>, scale: f32, around_one: bool| {
        let n: usize = shape.iter().product();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| {
                let u: f32 = rng.random::<f32>() * 2.0 - 1.0;
                let v = if around_one { 1.0 + 0.2 * u } else { u * scale };
                half::bf16::from_f32(v).to_bits().to_le_bytes()
            })
            .collect();
        tensors.push((name, shape, bytes));
    };
    let taps = r.target_layer_ids.len();
    mat(
        "fc.weight".into(),
        vec![d, taps * d],
        (3.0 / (taps * d) as f32).sqrt(),
        false,
    );
    mat("hidden_norm.weight".into(), vec![d], 0.0, true);
    mat("norm.weight".into(), vec![d], 0.0, true);
    for i in 0..r.layers {
        let p = format!("layers.{i}");
        let s = (3.0 / d as f32).sqrt();
        mat(format!("{p}.input_layernorm.weight"), vec![d], 0.0, true);
        mat(
            format!("{p}.post_attention_layernorm.weight"),
            vec![d],
            0.0,
            true,
        );
        mat(
            format!("{p}.self_attn.q_proj.weight"),
            vec![heads * hd, d],
            s,
            false,
        );
        mat(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv * hd, d],
            s,
            false,
        );
        mat(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv * hd, d],
            s,
            false,
        );
        mat(
            format!("{p}.self_attn.o_proj.weight"),
            vec![d, heads * hd],
            (3.0 / (heads * hd) as f32).sqrt(),
            false,
        );
        mat(format!("{p}.self_attn.q_norm.weight"), vec![hd], 0.0, true);
        mat(format!("{p}.self_attn.k_norm.weight"), vec![hd], 0.0, true);
        mat(
            format!("{p}.mlp.gate_proj.weight"),
            vec![r.intermediate_size, d],
            s,
            false,
        );
        mat(
            format!("{p}.mlp.up_proj.weight"),
            vec![r.intermediate_size, d],
            s,
            false,
        );
        mat(
            format!("{p}.mlp.down_proj.weight"),
            vec![d, r.intermediate_size],
            (3.0 / r.intermediate_size as f32).sqrt(),
            false,
        );
    }
    let entries: Vec<crate::util::SafetensorsEntry> = tensors
        .into_iter()
        .map(|(n, s, b)| (n, safetensors::Dtype::BF16, s, b))
        .collect();
    crate::util::write_safetensors(&dir.join("model.safetensors"), &entries)
}
