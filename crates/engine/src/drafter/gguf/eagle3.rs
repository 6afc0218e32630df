//! `general.architecture = eagle3` (llama.cpp conversion/llama.py `LlamaModel` in EAGLE-3 mode,
//! src/models/eagle3.cpp) → the SpecForge / vLLM `LlamaForCausalLMEagle3` layout
//! (`super::super::eagle3`, docs/eagle3.md).
//!
//! | GGUF | checkpoint |
//! |---|---|
//! | `eagle3.target_layers` (llama.cpp captures these layers' *inputs*) | top-level `eagle_aux_hidden_state_layer_ids` (vLLM's input convention: draftlens reads id − 1) |
//! | `eagle3.target_hidden_size`, `eagle3.vocab_size`, rows of `output.weight` | `target_hidden_size`, `vocab_size`, `draft_vocab_size` |
//! | `token_embd`, `fc`, `output_norm`, `output` | `embed_tokens`, `fc`, `norm`, `lm_head` |
//! | `blk.0.attn_norm`, `blk.0.attn_norm_2`, `blk.0.attn_q / … / ffn_down` | `midlayer.input_layernorm`, `midlayer.hidden_norm`, `midlayer.self_attn.q_proj / … / mlp.down_proj` |
//! | `d2t` (absolute target ids, I64) | `d2t` (offsets: id − index) |
//!
//! The converter permutes the rows of q/k for llama.cpp's interleaved RoPE (`LlamaModel.permute`,
//! docs/models.md §3.6); they are put back per head. It drops `t2d` (training only). It writes no
//! `num_speculative_tokens` (llama.cpp takes the draft length from its command line), so the
//! drafter's default chain length applies (docs/eagle3.md §3).

use super::{tokenizer_len, Mapped, Meta, Transform};
use crate::formats::gguf::GgufFile;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The checkpoint name of an EAGLE-3 GGUF tensor, if the layout has one.
pub(super) fn hf_name(gguf_name: &str) -> Option<String> {
    match gguf_name {
        "fc.weight" => return Some("fc.weight".into()),
        "d2t" => return Some("d2t".into()),
        "blk.0.attn_norm_2.weight" => return Some("midlayer.hidden_norm.weight".into()),
        _ => {}
    }
    let name = crate::formats::gguf::hf_name(gguf_name)?;
    if let Some(rest) = name.strip_prefix("model.layers.0.") {
        return Some(format!("midlayer.{rest}"));
    }
    if name.starts_with("model.layers.") {
        return None; // EAGLE-3 has one decoder layer
    }
    Some(name.strip_prefix("model.").unwrap_or(&name).to_string())
}

pub(super) fn map(file: &GgufFile) -> Result<(Value, BTreeMap<String, Mapped>)> {
    let m = Meta {
        file,
        arch: "eagle3",
    };
    let p = file.path().display();
    if m.opt_bool("norm_before_fc")? == Some(true) {
        bail!("{p}: metadata key eagle3.norm_before_fc is true: a norm over the fused taps before fc is not part of the EAGLE-3 layout draftlens evaluates (docs/eagle3.md §1.3)");
    }
    if let Some(kind) = file
        .get_str("eagle3.rope.scaling.type")
        .filter(|k| *k != "none")
    {
        bail!("{p}: metadata key eagle3.rope.scaling.type is {kind:?}: RoPE scaling is not implemented for EAGLE-3 drafters");
    }
    let hidden = m.uint("embedding_length")?;
    let heads = m.uint("attention.head_count")?;
    if heads == 0 {
        bail!("{p}: metadata key eagle3.attention.head_count is 0");
    }
    let kv_heads = m.opt_uint("attention.head_count_kv")?.unwrap_or(heads);
    let head_dim = m
        .opt_uint("attention.key_length")?
        .unwrap_or(hidden / heads);
    if let Some(rd) = m.opt_uint("rope.dimension_count")? {
        if rd != head_dim {
            bail!("{p}: metadata key eagle3.rope.dimension_count {rd} differs from the head size {head_dim}: partial rotary embeddings are not supported");
        }
    }
    let output = file
        .tensor_info("output.weight")
        .filter(|t| t.ne.len() == 2)
        .ok_or_else(|| anyhow::anyhow!("{p}: tensor output.weight (lm_head.weight, the draft vocabulary's head) is missing or not 2-D"))?;
    let mut config = json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": m.uint("block_count")?,
        "hidden_size": hidden,
        "intermediate_size": m.uint("feed_forward_length")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rope_theta": m.opt_float("rope.freq_base")?.unwrap_or(10000.0),
        "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon")?,
        "draft_vocab_size": output.ne[1],
        "target_hidden_size": m.uint("target_hidden_size")?,
        // llama.cpp reads these as layer inputs, vLLM's convention for the top-level key.
        "eagle_aux_hidden_state_layer_ids": m.uint_array("target_layers")?,
        "norm_before_residual": m.opt_bool("norm_before_residual")?.unwrap_or(false),
    });
    let c = config.as_object_mut().expect("an object");
    if let Some(v) = m
        .opt_uint("vocab_size")?
        .map(|v| v as usize)
        .or_else(|| tokenizer_len(file))
    {
        c.insert("vocab_size".into(), v.into());
    }
    if let Some(n) = m.opt_uint("context_length")? {
        c.insert("max_position_embeddings".into(), n.into());
    }

    let mut tensors = BTreeMap::new();
    for t in file.tensors() {
        let Some(name) = hf_name(&t.name) else {
            bail!("{p}: tensor {} has no place in the EAGLE-3 layout (token_embd, fc, output_norm, output, d2t and blk.0.* are mapped; docs/gguf-drafters.md)", t.name);
        };
        let transform = match name.as_str() {
            "midlayer.self_attn.q_proj.weight" => Transform::Unpermute(heads as usize),
            "midlayer.self_attn.k_proj.weight" => Transform::Unpermute(kv_heads as usize),
            "d2t" => Transform::AbsoluteToOffsets,
            _ => Transform::AsIs,
        };
        if let Transform::Unpermute(nh) = transform {
            let rows = t.ne.last().copied().unwrap_or(0) as usize;
            if nh == 0 || !rows.is_multiple_of(2 * nh) {
                bail!("{p}: tensor {} has {rows} rows, not a whole number of {nh} heads of even size; cannot undo the converter's q/k permutation", t.name);
            }
        }
        tensors.insert(
            name,
            Mapped {
                gguf_name: t.name.clone(),
                transform,
            },
        );
    }
    Ok((config, tensors))
}
