//! A random-weight DFlash drafter written as a real checkpoint, for the batched = single-anchor
//! check of a drafter with a sliding layer.

use rand::{Rng, SeedableRng};
use std::path::Path;

/// Writes a random-weight DFlash drafter checkpoint (z-lab layout, bf16 weights) for a target of
/// hidden size `dt`: 2 layers (0 sliding with window 4 < B, 1 full), 3 taps, B = 8.
pub fn write_random_drafter(dir: &Path, dt: usize, vocab: usize, tap_ids: &[usize], seed: u64) {
    let (d, heads, kv_heads, hd, inter, b) = (dt, 4usize, 2usize, 32usize, 192usize, 8usize);
    let config = serde_json::json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": b,
        "dflash_config": { "mask_token_id": 5, "target_layer_ids": tap_ids },
        "num_hidden_layers": 2,
        "hidden_size": d,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hd,
        "hidden_act": "silu",
        "attention_bias": false,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "layer_types": ["sliding_attention", "full_attention"],
        "use_sliding_window": true,
        "sliding_window": 4,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut put = |name: String, shape: Vec<usize>, rng: &mut rand::rngs::StdRng, norm: bool| {
        let n: usize = shape.iter().product();
        // Matrices: uniform with variance 1/fan_in (activations stay O(1) through the layers);
        // norm scales: U(0.5, 1.5) so that a skipped scale is visible.
        let bound = if norm {
            0.0
        } else {
            (3.0 / shape[1] as f32).sqrt()
        };
        let bytes = (0..n)
            .flat_map(|_| {
                let v: f32 = if norm {
                    rng.random_range(0.5..1.5)
                } else {
                    rng.random_range(-bound..bound)
                };
                half::bf16::from_f32(v).to_le_bytes()
            })
            .collect();
        tensors.push((name, shape, bytes));
    };
    put(
        "fc.weight".into(),
        vec![d, tap_ids.len() * dt],
        &mut rng,
        false,
    );
    put("hidden_norm.weight".into(), vec![d], &mut rng, true);
    put("norm.weight".into(), vec![d], &mut rng, true);
    for l in 0..2 {
        let p = format!("layers.{l}");
        put(
            format!("{p}.input_layernorm.weight"),
            vec![d],
            &mut rng,
            true,
        );
        put(
            format!("{p}.post_attention_layernorm.weight"),
            vec![d],
            &mut rng,
            true,
        );
        put(
            format!("{p}.self_attn.q_proj.weight"),
            vec![heads * hd, d],
            &mut rng,
            false,
        );
        put(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv_heads * hd, d],
            &mut rng,
            false,
        );
        put(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv_heads * hd, d],
            &mut rng,
            false,
        );
        put(
            format!("{p}.self_attn.o_proj.weight"),
            vec![d, heads * hd],
            &mut rng,
            false,
        );
        put(
            format!("{p}.self_attn.q_norm.weight"),
            vec![hd],
            &mut rng,
            true,
        );
        put(
            format!("{p}.self_attn.k_norm.weight"),
            vec![hd],
            &mut rng,
            true,
        );
        put(
            format!("{p}.mlp.gate_proj.weight"),
            vec![inter, d],
            &mut rng,
            false,
        );
        put(
            format!("{p}.mlp.up_proj.weight"),
            vec![inter, d],
            &mut rng,
            false,
        );
        put(
            format!("{p}.mlp.down_proj.weight"),
            vec![d, inter],
            &mut rng,
            false,
        );
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}
