//! gpt-oss GGUF targets as llama.cpp writes them (`general.architecture` `gpt-oss`, llama.cpp's
//! `LLM_ARCH_OPENAI_MOE`; docs/moe-models.md, "GGUF files"): the metadata read into the
//! [`ModelSpec`] / [`GptOssSpec`] a Hugging Face folder gives, the tensors checked against it, and
//! [`GptOssGgufWeights`], the file under the Hugging Face names `model::gpt_oss` reads.
//!
//! Sources (llama.cpp as vendored under data/llamacpp-e2e/…/vendor/llama.cpp, ggml-org/llama.cpp):
//! `conversion/gpt_oss.py` (`GptOssModel`: gate_up split into gate and up, MXFP4 blocks repacked,
//! `sinks` → `.weight`), `conversion/base.py` (`TextModel.set_gguf_parameters`: the keys),
//! `src/models/openai-moe.cpp` (the tensors and shapes llama.cpp loads, the sliding-window
//! pattern 2), `src/llama-arch.cpp` (names), `src/llama-hparams.cpp` (`set_swa_pattern`),
//! `ggml/src/ggml.c` (`ggml_rope_yarn_corr_dims`).
//!
//! | GGUF (`blk.N.` …), `ne` innermost first | Hugging Face (`model.layers.N.` …), PyTorch shape |
//! |---|---|
//! | `attn_norm.weight` `[D]` / `post_attention_norm.weight` `[D]` | `input_layernorm.weight` / `post_attention_layernorm.weight` |
//! | `attn_{q,k,v,output}.{weight,bias}` | `self_attn.{q,k,v,o}_proj.{weight,bias}` (no row permutation: NeoX RoPE) |
//! | `attn_sinks.weight` `[H]` | `self_attn.sinks` `[H]` |
//! | `ffn_gate_inp.{weight,bias}` `[D, E]`, `[E]` | `mlp.router.{weight,bias}` |
//! | `ffn_gate_exps.weight` / `ffn_up_exps.weight` `[D, I, E]` | `mlp.experts.{e}.gate_proj.weight` / `up_proj.weight` `[I, D]`: rows `e·I ..` |
//! | `ffn_down_exps.weight` `[I, D, E]` | `mlp.experts.{e}.down_proj.weight` `[D, I]` |
//! | `ffn_{gate,up}_exps.bias` `[I, E]`, `ffn_down_exps.bias` `[D, E]` | `mlp.experts.{gate,up,down}_proj_bias` `[E, I]`, `[E, D]` |
//!
//! The converter writes gate and up as separate stacks, de-interleaved from the checkpoint's
//! `gate_up_proj` (`[..., ::2]` gate, `[..., 1::2]` up), so the per-expert tensors here are the
//! gate | up halves the model stacks ([`GptOssSpec::per_expert`]). Expert weights are MXFP4 (ggml
//! type 39, `formats::dequant`) in a converted MXFP4 checkpoint, any other supported type
//! otherwise. MXFP4 stacks reach the backend as MXFP4 bytes, their blocks repacked into the
//! Hugging Face layout (`formats::mxfp4::from_ggml`, [`super::WeightSource::mxfp4`]), as a
//! folder's blocks do: kept packed on CUDA, dequantised to the same values on the CPU.
//!
//! What the metadata cannot say, and is assumed:
//! - YaRN's `truncate`: false, as every gpt-oss checkpoint says (`GptOssConfig`'s default, the
//!   released configs) and transformers computes. llama.cpp itself always rounds the correction
//!   range outward (`ggml_rope_yarn_corr_dims`: floor / ceil, i.e. truncate true), so its own
//!   gpt-oss differs from transformers in a few rotary dimensions; draftlens reproduces the
//!   checkpoint, as for every GGUF target ([`YARN_TRUNCATE`]).
//! - `beta_fast` / `beta_slow`: the `rope.scaling.yarn_beta_*` keys the converter copies from
//!   `rope_scaling`, else llama.cpp's defaults 32 and 1 (`llama-hparams.h`, transformers' too).
//! - the attention factor: `rope.scaling.yarn_attn_factor` if written, else `0.1·ln(factor) + 1`
//!   (llama.cpp's `get_mscale` in `llama-context.cpp`, transformers' default).
//! - which layers slide: `attention.sliding_window_pattern` (a per-layer bool array, or a period
//!   n: layer l slides when `l % n < n − 1`), else llama.cpp's period 2 for gpt-oss: even layers
//!   sliding, odd full (= transformers' default `layer_types`).

use super::dequant::{self, GgmlType};
use super::gguf::{GgufFile, GgufValue, GgufWeights};
use super::gguf_experts::{blk, Keys, StackedGgufWeights};
use super::TensorInfo;
use crate::model::config::{Arch, ModelSpec};
use crate::model::gpt_oss::{self, AttentionKind, GptOssSpec, Yarn};
use crate::model::moe::MoeSpec;
use anyhow::{bail, Context, Result};
use std::sync::Arc;

/// `general.architecture` of a gpt-oss GGUF (llama.cpp's `LLM_ARCH_OPENAI_MOE`).
pub const ARCH: &str = "gpt-oss";

/// YaRN's `truncate` for a GGUF, which has no key for it (see the module docs).
pub const YARN_TRUNCATE: bool = false;

/// The full name of key `gpt-oss.{k}`.
fn full_key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

/// The model a gpt-oss GGUF describes, its tensors checked ([`check`]) before any is read.
pub fn model_spec(file: &GgufFile) -> Result<ModelSpec> {
    let p = file.path().display();
    let k = Keys { file, arch: ARCH };
    let num_layers = k.req("block_count", "the number of layers")?;
    let hidden_size = k.req("embedding_length", "the hidden size")?;
    let num_heads = k.req("attention.head_count", "the query heads")?;
    let num_kv_heads = k.opt("attention.head_count_kv")?.unwrap_or(num_heads);
    // gpt-oss's heads (64) are not hidden_size / heads (2880 / 64): key_length says it.
    let head_dim = match k.opt("attention.key_length")? {
        Some(h) => h,
        None if num_heads > 0 && hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => bail!(
            "{p}: metadata key {} is missing and {} = {hidden_size} is not a multiple of {} = {num_heads}",
            full_key("attention.key_length"),
            full_key("embedding_length"),
            full_key("attention.head_count")
        ),
    };
    if let Some(v) = k.opt("attention.value_length")? {
        if v != head_dim {
            bail!("{p}: {} = {v} differs from the key length {head_dim}; gpt-oss's values are as wide as its keys", full_key("attention.value_length"));
        }
    }
    if let Some(rd) = k.opt("rope.dimension_count")? {
        if rd != head_dim {
            bail!(
                "{p}: {} = {rd} differs from head_dim {head_dim}; gpt-oss rotates the whole head",
                full_key("rope.dimension_count")
            );
        }
    }
    let experts = k.req("expert_count", "a gpt-oss model is a mixture of experts")?;
    let top_k = k.req("expert_used_count", "the experts each token is routed to")?;
    let inter = k.req("expert_feed_forward_length", "each expert's width")?;
    if experts == 0 || top_k == 0 || top_k > experts {
        bail!(
            "{p}: {} = {top_k} must be between 1 and {} = {experts}",
            full_key("expert_used_count"),
            full_key("expert_count")
        );
    }
    let moe = MoeSpec {
        num_experts: experts,
        num_experts_per_tok: top_k,
        moe_intermediate_size: inter,
        // A softmax over the top-k logits (llama.cpp's SOFTMAX_WEIGHT gating).
        norm_topk_prob: true,
        shared_expert_intermediate_size: None,
        sparse_layers: vec![true; num_layers],
    };
    moe.validate(file.path())?;
    let sliding_window = k.req(
        "attention.sliding_window",
        "the window of the sliding layers",
    )?;
    if sliding_window == 0 {
        bail!("{p}: {} is 0", full_key("attention.sliding_window"));
    }
    let layer_types = layer_types(file, num_layers)?;
    let rope_theta = k.float("rope.freq_base")?.unwrap_or(10000.0); // llama.cpp's default
    let max_positions = k
        .opt("context_length")?
        .unwrap_or(gpt_oss::DEFAULT_MAX_POSITIONS);
    let yarn = yarn(file, max_positions)?;
    let rms_norm_eps = k
        .float("attention.layer_norm_rms_epsilon")?
        .with_context(|| {
            format!(
                "{p}: metadata key {} is missing",
                full_key("attention.layer_norm_rms_epsilon")
            )
        })? as f32;
    let vocab_size = match file.tensor_info("token_embd.weight") {
        Some(t) if t.ne.len() == 2 => t.ne[1] as usize,
        _ => bail!("{p}: tensor token_embd.weight is missing or not 2-D"),
    };
    let tok_id = |key: &str| file.get_u64(key).and_then(|v| u32::try_from(v).ok());
    let mut eos_token_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = tok_id(key) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }
    let spec = ModelSpec {
        arch: Arch::GptOss,
        vocab_size,
        hidden_size,
        // The Hugging Face config's intermediate_size is the experts' width (feed_forward_length
        // carries the same value; llama.cpp reads only the expert key for gpt-oss).
        intermediate_size: inter,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: rope_theta as f32,
        rms_norm_eps,
        tie_word_embeddings: file.tensor_info("output.weight").is_none(),
        max_position_embeddings: max_positions,
        attention_bias: true,
        qk_norm: false,
        bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
        eos_token_ids,
        hybrid: None,
        moe: Some(moe),
        gpt_oss: Some(GptOssSpec {
            layer_types,
            sliding_window: Some(sliding_window),
            yarn,
            quant_method: None,
            per_expert: true,
        }),
    };
    spec.validate(file.path())?;
    check(file, &spec)?;
    Ok(spec)
}

/// Which layers slide (see the module docs).
fn layer_types(file: &GgufFile, num_layers: usize) -> Result<Vec<AttentionKind>> {
    let p = file.path().display();
    let key = full_key("attention.sliding_window_pattern");
    let sliding = |s: bool| {
        if s {
            AttentionKind::SlidingAttention
        } else {
            AttentionKind::FullAttention
        }
    };
    let period = match file.metadata().get(&key) {
        None => 2, // llama.cpp: load_swa_pattern(ml, 2) for LLM_ARCH_OPENAI_MOE
        Some(GgufValue::Array(a)) => {
            if a.len() != num_layers {
                bail!(
                    "{p}: {key} has {} entries, {} is {num_layers}",
                    a.len(),
                    full_key("block_count")
                );
            }
            return a
                .iter()
                .map(|v| match v {
                    GgufValue::Bool(b) => Ok(sliding(*b)),
                    other => bail!("{p}: {key} should hold bools, found {other:?}"),
                })
                .collect();
        }
        Some(v) => v.as_u64().with_context(|| {
            format!("{p}: {key} should be a bool array or an unsigned integer, found {v:?}")
        })? as usize,
    };
    // llama_hparams::set_swa_pattern (dense_first false): period 0 slides everywhere.
    Ok((0..num_layers)
        .map(|l| sliding(period == 0 || l % period < period - 1))
        .collect())
}

/// YaRN from `rope.scaling.*` (`None`: plain RoPE), resolved as transformers resolves a gpt-oss
/// config; see the module docs for what the keys cannot say.
fn yarn(file: &GgufFile, max_positions: usize) -> Result<Option<Yarn>> {
    let p = file.path().display();
    let k = Keys { file, arch: ARCH };
    let type_key = full_key("rope.scaling.type");
    let factor = k.float("rope.scaling.factor")?;
    match file.get_str(&type_key) {
        Some("yarn") => {}
        None | Some("none") => {
            if factor.is_some_and(|f| f != 1.0) {
                bail!("{p}: {} is set but {type_key} is not \"yarn\" (llama.cpp would scale linearly; gpt-oss uses YaRN)", full_key("rope.scaling.factor"));
            }
            return Ok(None);
        }
        Some(other) => {
            bail!("{p}: {type_key} {other:?} is not supported for gpt-oss (supported: \"yarn\", \"none\")")
        }
    }
    let factor = factor.with_context(|| {
        format!(
            "{p}: metadata key {} is missing (YaRN needs it)",
            full_key("rope.scaling.factor")
        )
    })?;
    if let Some(a) = k.float("rope.scaling.attn_factor")? {
        if a != 1.0 {
            bail!(
                "{p}: {} = {a} is not supported for gpt-oss (an extra scale on YaRN's attention factor)",
                full_key("rope.scaling.attn_factor")
            );
        }
    }
    // llama.cpp: n_ctx_orig_yarn defaults to the training context; transformers to
    // max_position_embeddings: the same key here.
    let original = k
        .opt("rope.scaling.original_context_length")?
        .unwrap_or(max_positions) as f64;
    let or = |v: Option<f64>, d: f64| v.filter(|&x| x != 0.0).unwrap_or(d);
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    Ok(Some(Yarn {
        factor,
        beta_fast: or(k.float("rope.scaling.yarn_beta_fast")?, 32.0),
        beta_slow: or(k.float("rope.scaling.yarn_beta_slow")?, 1.0),
        original_max_position_embeddings: original,
        truncate: YARN_TRUNCATE,
        attention_factor: k.float("rope.scaling.yarn_attn_factor")?.unwrap_or(mscale),
    }))
}

/// Every tensor llama.cpp's gpt-oss loader requires (`openai-moe.cpp`, `load_arch_tensors`), with
/// the `ne` the keys imply, checked before any weight is read: one error naming the file, the
/// GGUF tensor and the keys. A fused `ffn_gate_up_exps` is refused (llama.cpp's gpt-oss reads
/// separate gate and up stacks only).
fn check(file: &GgufFile, spec: &ModelSpec) -> Result<()> {
    let p = file.path().display();
    let moe = spec.moe.as_ref().expect("gpt-oss has experts");
    let (d, v, hd) = (
        spec.hidden_size as u64,
        spec.vocab_size as u64,
        spec.head_dim as u64,
    );
    let (h, hkv) = (spec.num_heads as u64, spec.num_kv_heads as u64);
    let (e, i) = (moe.num_experts as u64, moe.moe_intermediate_size as u64);
    let (d_key, e_key, i_key) = (
        full_key("embedding_length"),
        full_key("expert_count"),
        full_key("expert_feed_forward_length"),
    );
    let mut want: Vec<(String, Vec<u64>, String)> = vec![
        ("token_embd.weight".into(), vec![d, v], d_key.clone()),
        ("output_norm.weight".into(), vec![d], d_key.clone()),
    ];
    if !spec.tie_word_embeddings {
        want.push(("output.weight".into(), vec![d, v], d_key.clone()));
    }
    let heads = format!(
        "{d_key} = {d}, {} = {h}, {} = {hkv} and head size {hd}",
        full_key("attention.head_count"),
        full_key("attention.head_count_kv")
    );
    let experts = format!("{d_key} = {d}, {i_key} = {i} and {e_key} = {e}");
    for l in 0..spec.num_layers {
        let t = |part: &str, ne: Vec<u64>, keys: &str| (blk(l, part), ne, keys.to_string());
        want.extend([
            t("attn_norm.weight", vec![d], &d_key),
            t("post_attention_norm.weight", vec![d], &d_key),
            t("attn_q.weight", vec![d, h * hd], &heads),
            t("attn_q.bias", vec![h * hd], &heads),
            t("attn_k.weight", vec![d, hkv * hd], &heads),
            t("attn_k.bias", vec![hkv * hd], &heads),
            t("attn_v.weight", vec![d, hkv * hd], &heads),
            t("attn_v.bias", vec![hkv * hd], &heads),
            t("attn_output.weight", vec![h * hd, d], &heads),
            t("attn_output.bias", vec![d], &heads),
            t("attn_sinks.weight", vec![h], &heads),
            t("ffn_gate_inp.weight", vec![d, e], &experts),
            t("ffn_gate_inp.bias", vec![e], &experts),
            t("ffn_gate_exps.weight", vec![d, i, e], &experts),
            t("ffn_up_exps.weight", vec![d, i, e], &experts),
            t("ffn_down_exps.weight", vec![i, d, e], &experts),
            t("ffn_gate_exps.bias", vec![i, e], &experts),
            t("ffn_up_exps.bias", vec![i, e], &experts),
            t("ffn_down_exps.bias", vec![d, e], &experts),
        ]);
        let fused = blk(l, "ffn_gate_up_exps.weight");
        if file.tensor_info(&fused).is_some() {
            bail!("{p}: tensor {fused} holds gate and up fused; llama.cpp's gpt-oss reads them as separate stacks (blk.{l}.ffn_gate_exps.weight, blk.{l}.ffn_up_exps.weight)");
        }
    }
    for (name, ne, keys) in &want {
        let t = file.tensor_info(name).with_context(|| {
            format!("{p}: tensor {name} is missing (llama.cpp's gpt-oss loader requires it)")
        })?;
        let is_expert = name.contains("_exps.") || name.contains("ffn_gate_inp.");
        // The experts are the outermost dimension of every expert tensor and the router.
        if is_expert && t.ne.len() == ne.len() && t.ne.last() != ne.last() {
            bail!(
                "{p}: tensor {name} holds {} experts (ne {:?}, innermost first), {e_key} = {e}",
                t.ne.last().copied().unwrap_or(0),
                t.ne
            );
        }
        if t.ne != *ne {
            bail!(
                "{p}: tensor {name} has ne {:?} (innermost first), {keys} imply {ne:?}",
                t.ne
            );
        }
        if !t.ty.is_supported() {
            bail!(
                "{p}: unsupported tensor type {} in tensor {name} (supported: {})",
                t.ty,
                dequant::SUPPORTED
            );
        }
    }
    Ok(())
}

/// Whether every expert weight of a gpt-oss GGUF (`infos`: [`GptOssGgufWeights`]'s listing,
/// `model.layers.N.mlp.experts.{e}.{gate,up,down}_proj.weight`) is stored as ggml MXFP4, as
/// llama.cpp's converter writes a gpt-oss MXFP4 checkpoint: the loader then hands them to the
/// backend as MXFP4 bytes ([`super::WeightSource::mxfp4`]), and the memory estimate counts them
/// so. A file whose expert stacks mix types counts as dequantised (an overestimate).
pub fn experts_are_mxfp4(infos: &[TensorInfo]) -> bool {
    let mut experts = infos
        .iter()
        .filter(|t| t.name.contains(".mlp.experts.") && t.name.ends_with("_proj.weight"))
        .peekable();
    experts.peek().is_some() && experts.all(|t| t.dtype == GgmlType::MXFP4.name())
}

/// A gpt-oss GGUF under Hugging Face names (the table in the module docs): llama's names from
/// [`GgufWeights`], the rest (post-attention norm, sinks, router, experts) served here.
pub type GptOssGgufWeights = StackedGgufWeights<GptOss>;

/// [`StackedGgufWeights`]'s marker for gpt-oss's names.
pub struct GptOss;

impl GptOssGgufWeights {
    /// `spec` from [`model_spec`] (so every tensor below exists with the shape it implies).
    pub fn new(file: Arc<GgufFile>, spec: &ModelSpec) -> Result<Self> {
        let moe = spec
            .moe
            .as_ref()
            .context("a gpt-oss spec without experts")?;
        let (e, i, d) = (moe.num_experts, moe.moe_intermediate_size, spec.hidden_size);
        let mut w = Self::over(Box::new(GgufWeights::new(file.clone())?), file);
        for l in 0..spec.num_layers {
            let hf = |rest: &str| format!("model.layers.{l}.{rest}");
            // Whole tensors under a new name, shape as stored (ne reversed).
            for (gguf, hf_name) in [
                (
                    "post_attention_norm.weight",
                    "post_attention_layernorm.weight",
                ),
                ("attn_sinks.weight", "self_attn.sinks"),
                ("ffn_gate_inp.weight", "mlp.router.weight"),
                ("ffn_gate_inp.bias", "mlp.router.bias"),
                ("ffn_gate_exps.bias", "mlp.experts.gate_proj_bias"),
                ("ffn_up_exps.bias", "mlp.experts.up_proj_bias"),
                ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
            ] {
                let index = w.consume(&blk(l, gguf))?;
                let t = &w.file().tensors()[index];
                let (rows, shape) = ((t.n_elements() / t.row_len().max(1)) as usize, t.shape());
                w.serve(hf(hf_name), index, 0, rows, shape);
            }
            // Each expert a block of rows of its stack.
            for (gguf, proj, rows, cols) in [
                ("ffn_gate_exps.weight", "gate_proj", i, d),
                ("ffn_up_exps.weight", "up_proj", i, d),
                ("ffn_down_exps.weight", "down_proj", d, i),
            ] {
                let index = w.consume(&blk(l, gguf))?;
                for x in 0..e {
                    w.serve(
                        hf(&format!("mlp.experts.{x}.{proj}.weight")),
                        index,
                        x * rows,
                        rows,
                        vec![rows, cols],
                    );
                }
            }
        }
        Ok(w)
    }
}
