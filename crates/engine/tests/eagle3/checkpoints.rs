//! EAGLE-3 checkpoints written at test time (SpecForge / vLLM `LlamaForCausalLMEagle3` layout):
//! the golden fixture's tensors with one thing broken, a random drafter for a full `run`, and the
//! known-answer successor drafter.

use draftlens_engine::util::{write_safetensors, SafetensorsEntry};
use rand::{Rng, SeedableRng};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Every tensor of a safetensors file, as entries `write_safetensors` takes back.
pub fn read_entries(path: &Path) -> Vec<SafetensorsEntry> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<SafetensorsEntry> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes `config` and `tensors` as a checkpoint folder.
pub fn write_checkpoint(dir: &Path, config: &serde_json::Value, tensors: &[SafetensorsEntry]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors).unwrap();
}

pub fn f32_entry(name: &str, shape: Vec<usize>, values: &[f32]) -> SafetensorsEntry {
    let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape, bytes)
}

pub fn i64_entry(name: &str, values: &[i64]) -> SafetensorsEntry {
    let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name.to_string(), Dtype::I64, vec![values.len()], bytes)
}

pub fn bool_entry(name: &str, values: &[bool]) -> SafetensorsEntry {
    let bytes = values.iter().map(|&b| b as u8).collect();
    (name.to_string(), Dtype::BOOL, vec![values.len()], bytes)
}

/// The config every checkpoint here starts from: one midlayer of hidden `d`, 2 heads / 1 KV
/// head of `d / 2`, MLP `inter`.
pub fn base_config(d: usize, inter: usize, vocab: usize, draft_vocab: usize) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": inter,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": d / 2,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "torch_dtype": "float32"
    })
}

/// A random-weight EAGLE-3 drafter with its own embedding, for a target of hidden `dt` and
/// vocabulary `vocab`: hidden 32, a draft vocabulary of `draft_vocab` target ids (a seeded random
/// subset, sorted: SpecForge's d2t / t2d), the default taps (no `eagle_config`) and a chain of
/// `steps`.
pub fn write_random_eagle3(
    dir: &Path,
    dt: usize,
    vocab: usize,
    draft_vocab: usize,
    steps: usize,
    seed: u64,
) {
    let (d, inter) = (32usize, 48usize);
    let mut config = base_config(d, inter, vocab, draft_vocab);
    config["num_speculative_tokens"] = steps.into();
    config["target_hidden_size"] = dt.into();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut mat = |name: &str, out: usize, inp: usize| {
        let b = (3.0 / inp as f32).sqrt();
        let v: Vec<f32> = (0..out * inp).map(|_| rng.random_range(-b..b)).collect();
        f32_entry(name, vec![out, inp], &v)
    };
    let mut tensors = vec![
        mat("embed_tokens.weight", vocab, d),
        mat("fc.weight", d, 3 * dt),
        mat("midlayer.self_attn.q_proj.weight", d, 2 * d),
        mat("midlayer.self_attn.k_proj.weight", d / 2, 2 * d),
        mat("midlayer.self_attn.v_proj.weight", d / 2, 2 * d),
        mat("midlayer.self_attn.o_proj.weight", d, d),
        mat("midlayer.mlp.gate_proj.weight", inter, d),
        mat("midlayer.mlp.up_proj.weight", inter, d),
        mat("midlayer.mlp.down_proj.weight", d, inter),
        mat("lm_head.weight", draft_vocab, d),
    ];
    for name in [
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
    ] {
        let v: Vec<f32> = (0..d).map(|_| rng.random_range(0.5..1.5)).collect();
        tensors.push(f32_entry(name, vec![d], &v));
    }
    let mut ids: Vec<usize> = (0..vocab).collect();
    for i in 0..draft_vocab {
        let j = rng.random_range(i..vocab);
        ids.swap(i, j);
    }
    let mut used = ids[..draft_vocab].to_vec();
    used.sort_unstable();
    let d2t: Vec<i64> = used
        .iter()
        .enumerate()
        .map(|(i, &t)| t as i64 - i as i64)
        .collect();
    let mut t2d = vec![false; vocab];
    for &t in &used {
        t2d[t] = true;
    }
    tensors.push(i64_entry("d2t", &d2t));
    tensors.push(bool_entry("t2d", &t2d));
    write_checkpoint(dir, &config, &tensors);
}

/// The successor map of the known-answer test: a permutation of `0..v` (5 is odd, `v` a power
/// of two).
pub fn successor(x: u32, v: u32) -> u32 {
    (5 * x + 3) % v
}

/// A drafter that always drafts the successor of its input state, whatever the context:
/// hidden = vocabulary = `v` (one-hot states), attention switched off (q / k / v / o_proj zero),
/// the MLP maps the state c·e_x to c·e_{successor(x)} (gate_proj picks unit x, down_proj writes
/// e_{succ(x)} − e_x), fc reads tap 0 as the state, and the draft vocabulary is the target's in
/// reverse (draft id i ↔ target id v − 1 − i, d2t[i] = v − 1 − 2i) so that the ids pass through
/// the map. On a sequence that follows the successor map, with the "perfect" feature tap 0 at
/// position j = e_{y_{j+1}} (what the target's state at j predicts), every step is right if and
/// only if step 1 reads the feature at a − 1 and each later step its own previous output.
pub fn write_successor_eagle3(dir: &Path, v: usize, steps: usize) {
    let d = v;
    let mut config = base_config(d, d, v, v);
    config["num_speculative_tokens"] = steps.into();
    config["eagle_config"] = serde_json::json!({ "eagle_aux_hidden_state_layer_ids": [0, 1, 2] });
    let zeros = |out: usize, inp: usize| vec![0f32; out * inp];
    let eye = |scale: f32| -> Vec<f32> {
        (0..d * d)
            .map(|i| if i / d == i % d { scale } else { 0.0 })
            .collect()
    };
    // Hidden states are c·e_x; the MLP sees rms_norm(c·e_x) = √v·e_x.
    let c = 4.0f32;
    let (alpha, root) = (4.0f32, (v as f32).sqrt());
    let silu = |x: f32| x / (1.0 + (-x).exp());
    let act = silu(alpha * root) * root;
    let mut down = zeros(d, d);
    for x in 0..v {
        let s = successor(x as u32, v as u32) as usize;
        // Column x of down_proj ([D, I] row-major: element (row, x)).
        down[s * d + x] += c / act;
        down[x * d + x] -= c / act;
    }
    let mut fc = zeros(d, 3 * v);
    for i in 0..d {
        fc[i * 3 * v + i] = c;
    }
    let mut lm_head = zeros(v, d);
    for i in 0..v {
        lm_head[i * d + (v - 1 - i)] = 4.0;
    }
    let d2t: Vec<i64> = (0..v as i64).map(|i| v as i64 - 1 - 2 * i).collect();
    let ones = vec![1f32; d];
    let tensors = vec![
        f32_entry("embed_tokens.weight", vec![v, d], &eye(1.0)),
        f32_entry("fc.weight", vec![d, 3 * v], &fc),
        f32_entry("midlayer.input_layernorm.weight", vec![d], &ones),
        f32_entry("midlayer.hidden_norm.weight", vec![d], &ones),
        f32_entry(
            "midlayer.self_attn.q_proj.weight",
            vec![d, 2 * d],
            &zeros(d, 2 * d),
        ),
        f32_entry(
            "midlayer.self_attn.k_proj.weight",
            vec![d / 2, 2 * d],
            &zeros(d / 2, 2 * d),
        ),
        f32_entry(
            "midlayer.self_attn.v_proj.weight",
            vec![d / 2, 2 * d],
            &zeros(d / 2, 2 * d),
        ),
        f32_entry("midlayer.self_attn.o_proj.weight", vec![d, d], &zeros(d, d)),
        f32_entry("midlayer.post_attention_layernorm.weight", vec![d], &ones),
        f32_entry("midlayer.mlp.gate_proj.weight", vec![d, d], &eye(alpha)),
        f32_entry("midlayer.mlp.up_proj.weight", vec![d, d], &eye(1.0)),
        f32_entry("midlayer.mlp.down_proj.weight", vec![d, d], &down),
        f32_entry("norm.weight", vec![d], &ones),
        f32_entry("lm_head.weight", vec![v, d], &lm_head),
        i64_entry("d2t", &d2t),
        bool_entry("t2d", &vec![true; v]),
    ];
    write_checkpoint(dir, &config, &tensors);
}
