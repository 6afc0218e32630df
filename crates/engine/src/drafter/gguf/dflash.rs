//! `general.architecture = dflash` (llama.cpp conversion/qwen.py `DFlashModel`, gguf-py
//! constants `MODEL_ARCH.DFLASH`) → the z-lab DFlash layout (`super::super::config`).
//!
//! | GGUF | checkpoint |
//! |---|---|
//! | `dflash.target_layers` (each id + 1: llama.cpp captures a layer's input) | `dflash_config.target_layer_ids` |
//! | `tokenizer.ggml.mask_token_id` | `dflash_config.mask_token_id` |
//! | `dflash.block_size`, `dflash.block_count`, `dflash.embedding_length`, `dflash.feed_forward_length` | `block_size`, `num_hidden_layers`, `hidden_size`, `intermediate_size` |
//! | `dflash.attention.head_count`, `.head_count_kv`, `.key_length`, `.layer_norm_rms_epsilon` | `num_attention_heads`, `num_key_value_heads`, `head_dim`, `rms_norm_eps` |
//! | `dflash.rope.freq_base`, `dflash.attention.causal`, `.sliding_window`, `.sliding_window_pattern` | `rope_theta`, `is_causal`, `sliding_window`, `layer_types` |
//! | `fc.weight`, `enc.output_norm.weight`, `output_norm.weight` | `fc.weight`, `hidden_norm.weight`, `norm.weight` |
//! | `blk.{i}.attn_norm / attn_q / … / ffn_down` | `layers.{i}.input_layernorm / self_attn.q_proj / … / mlp.down_proj` |
//!
//! DFlash2 drafters (the converter writes them under the same architecture) carry
//! `dflash.conv_kernel_size`, `.conv_group_size`, `.selector_rank`, `.selector_top_k`,
//! `.logit_scale`, `.final_logit_softcapping`, `.embedding_scale` (→ `dflash_config.*`,
//! `output_multiplier`, `input_embedding_scale`; `architectures = [DFlash2DraftModel]`) and the
//! tensors `blk.{i}.{attn,ffn}_conv_{base,proj}` (→ `layers.{i}.{attention,mlp}_conv.{base_kernel,
//! kernel_projection.weight}`) and `selector_{predecessor,successor,hidden}.weight` (→
//! `candidate_selector.*`). A file with DFlash2 tensors but no DFlash2 keys is refused: read as
//! DFlash it would lose them without a word.
//!
//! Qwen3-family drafters are not Q/K-permuted by the converter (NeoX RoPE), so every tensor is
//! taken as stored. What the layouts have no place for is refused by name: DSpark's heads,
//! attention sinks, partial rotary, value scaling.

use super::{tokenizer_len, Mapped, Meta, Transform};
use crate::formats::gguf::GgufFile;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Tensors of llama.cpp's DFlash2 / DSpark variants of the architecture: what a DFlash load
/// would silently drop.
const DFLASH2_PARTS: [&str; 7] = [
    "attn_conv_base",
    "attn_conv_proj",
    "ffn_conv_base",
    "ffn_conv_proj",
    "selector_predecessor",
    "selector_successor",
    "selector_hidden",
];
const DSPARK_PARTS: [&str; 3] = ["markov_w1", "markov_w2", "conf_proj"];
/// The DFlash2 keys, as `dflash.*` metadata and as `dflash_config.*` keys alike.
const DFLASH2_KEYS: [&str; 4] = [
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
];

/// The checkpoint name of a DFlash (or DFlash2) GGUF tensor, if the layouts have one.
pub(super) fn hf_name(gguf_name: &str) -> Option<String> {
    let top = match gguf_name {
        "fc.weight" => "fc.weight",
        "enc.output_norm.weight" => "hidden_norm.weight",
        // The authors' checkpoints store the codebooks without `.weight`; the converter adds it.
        "selector_predecessor.weight" => "candidate_selector.predecessor_codebook",
        "selector_successor.weight" => "candidate_selector.successor_codebook",
        "selector_hidden.weight" => "candidate_selector.hidden_projection.weight",
        _ => "",
    };
    if !top.is_empty() {
        return Some(top.into());
    }
    if let Some((layer, part)) = gguf_name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
    {
        let conv = match part {
            "attn_conv_base" => Some("attention_conv.base_kernel"),
            "attn_conv_proj.weight" => Some("attention_conv.kernel_projection.weight"),
            "ffn_conv_base" => Some("mlp_conv.base_kernel"),
            "ffn_conv_proj.weight" => Some("mlp_conv.kernel_projection.weight"),
            _ => None,
        };
        if let (Some(c), Ok(l)) = (conv, layer.parse::<usize>()) {
            return Some(format!("layers.{l}.{c}"));
        }
    }
    // The target-style names (blk.*, output_norm, token_embd, output) are the GGUF target
    // reader's, under "model.": a DFlash checkpoint has no such prefix.
    let name = crate::formats::gguf::hf_name(gguf_name)?;
    Some(name.strip_prefix("model.").unwrap_or(&name).to_string())
}

pub(super) fn map(file: &GgufFile) -> Result<(Value, BTreeMap<String, Mapped>)> {
    let m = Meta {
        file,
        arch: "dflash",
    };
    let p = file.path().display();
    m.refuse(
        "sample_from_anchor",
        "a DSpark drafter (Markov head), which draftlens does not evaluate",
    )?;
    m.refuse(
        "attention.value_scale",
        "attention value scaling has no place in the DFlash layout draftlens evaluates",
    )?;
    // DFlash2: its keys (all four, as the converter writes them together) say so.
    let dflash2 = DFLASH2_KEYS.iter().any(|k| m.has(k));
    if !dflash2 {
        for k in ["logit_scale", "final_logit_softcapping", "embedding_scale"] {
            m.refuse(k, "a DFlash2 / DSpark setting, but the file has no DFlash2 keys (dflash.conv_kernel_size, …)")?;
        }
    }

    let hidden = m.uint("embedding_length")?;
    let heads = m.uint("attention.head_count")?;
    let kv_heads = m.opt_uint("attention.head_count_kv")?.unwrap_or(heads);
    let layers = m.uint("block_count")?;
    if layers as usize > crate::drafter::config::MAX_LAYERS {
        bail!("{p}: metadata key dflash.block_count {layers} is over the limit of {} (DFlash drafters have 1–8)", crate::drafter::config::MAX_LAYERS);
    }
    if heads == 0 {
        bail!("{p}: metadata key dflash.attention.head_count is 0");
    }
    let head_dim = m
        .opt_uint("attention.key_length")?
        .unwrap_or(hidden / heads);
    if let Some(v) = m.opt_uint("attention.value_length")? {
        if v != head_dim {
            bail!("{p}: metadata key dflash.attention.value_length {v} differs from key_length {head_dim}: the DFlash layout has one head size");
        }
    }
    if let Some(rd) = m.opt_uint("rope.dimension_count")? {
        if rd != head_dim {
            bail!("{p}: metadata key dflash.rope.dimension_count {rd} differs from the head size {head_dim}: partial rotary embeddings are not supported");
        }
    }
    // An M-RoPE target's drafter gets degenerate sections [n_rot/2, 0, 0, 0] (temporal only):
    // plain RoPE on text positions. Anything else is refused.
    if m.has("rope.dimension_sections") {
        let s = m.uint_array("rope.dimension_sections")?;
        if s.first() != Some(&(head_dim / 2)) || s.iter().skip(1).any(|&x| x != 0) {
            bail!("{p}: metadata key dflash.rope.dimension_sections {s:?} is not the temporal-only [{}, 0, 0, 0] llama.cpp writes for a drafter: multi-section RoPE is not supported", head_dim / 2);
        }
    }
    let stored = m.uint_array("target_layers")?;
    if stored.is_empty() {
        bail!("{p}: metadata key dflash.target_layers is empty");
    }
    // llama.cpp captures the input of layer id (the output of layer id − 1): the converter
    // writes the checkpoint's ids plus one (docs/dflash.md §1.2). An id 0 would be the embedding.
    if let Some(i) = stored.iter().position(|&x| x == 0) {
        bail!("{p}: metadata key dflash.target_layers[{i}] is 0: llama.cpp's converter stores each target layer id plus one, so 0 would tap the embedding output (a converter that did not shift the ids?)");
    }
    let target_layer_ids: Vec<u64> = stored.iter().map(|&x| x - 1).collect();
    let mask = m.uint("tokenizer.ggml.mask_token_id")?;

    let mut config = json!({
        "architectures": [if dflash2 { "DFlash2DraftModel" } else { "DFlashDraftModel" }],
        "model_type": "qwen3",
        "block_size": m.uint("block_size")?,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": target_layer_ids},
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "intermediate_size": m.uint("feed_forward_length")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        // llama.cpp's default when the key is absent (the converter always writes it).
        "rope_theta": m.opt_float("rope.freq_base")?.unwrap_or(10000.0),
        "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon")?,
    });
    let c = config.as_object_mut().expect("an object");
    if let Some(v) = tokenizer_len(file) {
        c.insert("vocab_size".into(), v.into());
    }
    if let Some(n) = m.opt_uint("context_length")? {
        c.insert("max_position_embeddings".into(), n.into());
    }
    if dflash2 {
        let dc = c["dflash_config"].as_object_mut().expect("an object");
        for k in DFLASH2_KEYS {
            dc.insert(k.into(), m.uint(k)?.into());
        }
        for (gguf_key, hf_key) in [
            ("logit_scale", "output_multiplier"),
            ("final_logit_softcapping", "final_logit_softcapping"),
            ("embedding_scale", "input_embedding_scale"),
        ] {
            if let Some(x) = m.opt_float(gguf_key)? {
                dc.insert(hf_key.into(), x.into());
            }
        }
    }
    if let Some(causal) = m.opt_bool("attention.causal")? {
        c.insert("is_causal".into(), causal.into());
    }
    if let Some(w) = m.opt_uint("attention.sliding_window")? {
        c.insert("sliding_window".into(), w.into());
        // gguf-py writes the pattern as a bool array, one per layer (true = sliding).
        let key = m.key("attention.sliding_window_pattern");
        let kinds: Vec<&str> = match file.metadata().get(&key) {
            None => vec!["sliding_attention"; layers as usize],
            Some(crate::formats::gguf::GgufValue::Array(a)) => a
                .iter()
                .map(|x| match x {
                    crate::formats::gguf::GgufValue::Bool(true) => Ok("sliding_attention"),
                    crate::formats::gguf::GgufValue::Bool(false) => Ok("full_attention"),
                    other => bail!(
                        "{p}: metadata key {key} should hold bools, found {}",
                        other.type_name()
                    ),
                })
                .collect::<Result<_>>()?,
            Some(other) => bail!(
                "{p}: metadata key {key} should be an array of bools, found {}",
                other.type_name()
            ),
        };
        c.insert("layer_types".into(), json!(kinds));
    }

    let mut tensors = BTreeMap::new();
    for t in file.tensors() {
        let part = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map(|(_, r)| r)
            .unwrap_or(&t.name);
        if !dflash2 && DFLASH2_PARTS.iter().any(|d| part.starts_with(d)) {
            bail!("{p}: tensor {} is a DFlash2 tensor (convolution or candidate selector), but the file has no DFlash2 keys (dflash.conv_kernel_size, …): read as DFlash it would be dropped without a word (docs/gguf-drafters.md)", t.name);
        }
        if DSPARK_PARTS.iter().any(|d| part.starts_with(d)) {
            bail!(
                "{p}: tensor {} belongs to a DSpark head, which draftlens does not evaluate",
                t.name
            );
        }
        let Some(name) = hf_name(&t.name) else {
            bail!("{p}: tensor {} has no place in the DFlash layout (fc, enc.output_norm, output_norm and blk.N.attn_*/ffn_* are mapped; docs/gguf-drafters.md)", t.name);
        };
        if let Some(layer) = name
            .strip_prefix("layers.")
            .and_then(|r| r.split('.').next())
        {
            if layer.parse::<u64>().map_or(true, |l| l >= layers) {
                bail!(
                    "{p}: tensor {} is in block {layer}, but dflash.block_count is {layers}",
                    t.name
                );
            }
        }
        tensors.insert(
            name,
            Mapped {
                gguf_name: t.name.clone(),
                transform: Transform::AsIs,
            },
        );
    }
    // Every tensor the DFlash loader reads, named as stored (shapes are checked against the
    // translated config by `lint`, which `run` applies first).
    let mut expected: Vec<String> = ["fc", "enc.output_norm", "output_norm"]
        .iter()
        .map(|n| format!("{n}.weight"))
        .collect();
    for i in 0..layers {
        for part in LAYER_PARTS {
            expected.push(format!("blk.{i}.{part}.weight"));
        }
    }
    if let Some(g) = expected.iter().find(|g| file.tensor_info(g).is_none()) {
        bail!(
            "{p}: tensor {g} ({} in the checkpoint) is missing",
            hf_name(g).expect("expected names map")
        );
    }
    Ok((config, tensors))
}

/// The tensors of one DFlash layer, as llama.cpp names them.
pub(super) const LAYER_PARTS: [&str; 11] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];
