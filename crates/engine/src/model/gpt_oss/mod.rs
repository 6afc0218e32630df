//! gpt-oss (`model_type` `gpt_oss`: gpt-oss-20b, gpt-oss-120b) as a target, defined by
//! transformers 5.17 `models/gpt_oss/{configuration,modeling}_gpt_oss.py` and
//! `integrations/mxfp4.py` (docs/moe-models.md, "gpt-oss"). What differs from the other targets:
//!
//! - attention: biases on q/k/v/o, a learned sink logit per head in the softmax, `sliding_attention`
//!   layers (window `sliding_window`) alternating with `full_attention` ones per `layer_types`,
//!   YaRN RoPE ([`yarn_inv_freq`]); the layers in [`layers::GptOssAttention`];
//! - a mixture of experts in every layer with a biased router, top-k of the logits then softmax
//!   over the k (`crate::model::moe::route_topk_softmax`, next to the Qwen rule), experts stored
//!   fused (`experts.gate_up_proj` `[E, D, 2I]` with gate and up in interleaved columns, biases)
//!   or as MXFP4 blocks (`formats::mxfp4`), and a clamped SwiGLU ([`layers::GptOssMoe`]).
//!
//! This file: [`GptOssSpec`] (the config keys), YaRN, the tensors a config implies and the
//! checkpoint checks made before any weight is read.

pub mod layers;

use super::config::ModelSpec;
use super::moe::MoeSpec;
use crate::backend::{Backend, RopeFreqs, RopeStyle};
use crate::formats::TensorInfo;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

pub use layers::{GptOssAttention, GptOssMoe};

/// The expert activation's constants, hard-coded in `GptOssExperts.__init__` (the checkpoints'
/// `swiglu_limit` key is not read by transformers, so not here either).
pub const SWIGLU_ALPHA: f32 = 1.702;
pub const SWIGLU_LIMIT: f32 = 7.0;

/// A decoder layer's attention kind (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    /// Sees the last `sliding_window` positions.
    SlidingAttention,
    FullAttention,
}

/// YaRN rotary scaling (`rope_type` "yarn"), its values resolved as
/// `modeling_rope_utils._compute_yarn_parameters` resolves them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Yarn {
    pub factor: f64,
    /// `beta_fast` (a missing or 0 value is 32) and `beta_slow` (1).
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub original_max_position_embeddings: f64,
    /// `truncate` (default true): round the correction range outward to whole dimensions.
    pub truncate: bool,
    /// Multiplies cos and sin: `attention_factor`, else `0.1·ln(factor) + 1` (the ratio of two
    /// such terms with `mscale` / `mscale_all_dim`).
    pub attention_factor: f64,
}

/// What `config.json` says about gpt-oss beyond the common keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptOssSpec {
    /// Per decoder layer (`layer_types`; default: even layers sliding, odd layers full).
    pub layer_types: Vec<AttentionKind>,
    /// Positions a sliding layer sees (`sliding_window`, 128 on the released models).
    pub sliding_window: Option<usize>,
    /// `None`: plain RoPE (`rope_type` "default").
    pub yarn: Option<Yarn>,
    /// `quantization_config.quant_method`: `Some("mxfp4")` for MXFP4 expert blocks.
    pub quant_method: Option<String>,
    /// The experts come one tensor per expert and projection, `experts.{e}.{gate,up,down}_proj
    /// .weight` `[out, in]` with biases `experts.{gate,up,down}_proj_bias` `[E, ·]`, gate and up
    /// already apart: a llama.cpp GGUF's stacks as `formats::gguf_gpt_oss` serves them. False
    /// for a Hugging Face folder (and then left out of the serialised spec, so its cache keys
    /// do not change).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_expert: bool,
}

impl GptOssSpec {
    /// The window of layer `i`, `None` for a full-attention layer.
    pub fn window(&self, i: usize) -> Option<usize> {
        match self.layer_types.get(i) {
            Some(AttentionKind::SlidingAttention) => self.sliding_window,
            _ => None,
        }
    }

    /// Whether the experts are stored as MXFP4 blocks.
    pub fn mxfp4(&self) -> bool {
        self.quant_method.is_some()
    }
}

/// The defaults of `GptOssConfig` where they differ from the other families'.
pub const DEFAULT_ROPE_THETA: f64 = 150_000.0;
pub const DEFAULT_RMS_NORM_EPS: f64 = 1e-5;
pub const DEFAULT_HEAD_DIM: usize = 64;
pub const DEFAULT_MAX_POSITIONS: usize = 131_072;

/// The parts of a gpt-oss `config.json` the common parser does not read: the spec above, the
/// RoPE base, and the experts as a [`MoeSpec`] (every layer sparse, width `intermediate_size`).
pub struct GptOssConfig {
    pub spec: GptOssSpec,
    pub rope_theta: f64,
    pub moe: MoeSpec,
}

/// Read a gpt-oss config (`raw`, at `path`) with `num_layers` layers and expert width
/// `intermediate_size`. Errors name the file and the key.
pub fn from_hf_config(
    raw: &Value,
    num_layers: usize,
    intermediate_size: usize,
    path: &Path,
) -> Result<GptOssConfig> {
    let o = path.display();
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    let usize_key = |k: &str| -> Result<Option<usize>> {
        get(k)
            .map(|v| {
                v.as_u64().map(|n| n as usize).with_context(|| {
                    format!("{o}: {k} should be a non-negative integer, found {v}")
                })
            })
            .transpose()
    };
    // transformers' attribute_map makes num_experts an alias of num_local_experts.
    let experts = match (usize_key("num_local_experts")?, usize_key("num_experts")?) {
        (Some(a), Some(b)) if a != b => {
            bail!("{o}: num_local_experts {a} and num_experts {b} disagree (the same key in GptOssConfig)")
        }
        (a, b) => a.or(b).unwrap_or(128),
    };
    let moe = MoeSpec {
        num_experts: experts,
        num_experts_per_tok: usize_key("num_experts_per_tok")?.unwrap_or(4),
        moe_intermediate_size: intermediate_size,
        // A softmax over the top-k logits is the renormalised top-k of the full softmax.
        norm_topk_prob: true,
        shared_expert_intermediate_size: None,
        sparse_layers: vec![true; num_layers],
    };
    if experts == 0 {
        bail!("{o}: num_local_experts is 0 (every gpt-oss layer is a mixture of experts)");
    }
    moe.validate(path)?;

    let layer_types = match get("layer_types") {
        None => (0..num_layers)
            .map(|i| {
                if (i + 1) % 2 == 1 {
                    AttentionKind::SlidingAttention
                } else {
                    AttentionKind::FullAttention
                }
            })
            .collect(),
        Some(v) => {
            let kinds: Vec<AttentionKind> = serde_json::from_value(v.clone()).with_context(|| {
                format!("{o}: layer_types must list \"sliding_attention\" / \"full_attention\", found {v}")
            })?;
            if kinds.len() != num_layers {
                bail!(
                    "{o}: layer_types has {} entries, num_hidden_layers is {num_layers}",
                    kinds.len()
                );
            }
            kinds
        }
    };
    let sliding_window = usize_key("sliding_window")?;
    if layer_types.contains(&AttentionKind::SlidingAttention)
        && !matches!(sliding_window, Some(w) if w > 0)
    {
        bail!("{o}: layer_types has sliding_attention layers but sliding_window is {sliding_window:?}");
    }

    let quant_method = match get("quantization_config") {
        None => None,
        Some(q) => match q.get("quant_method").and_then(Value::as_str) {
            Some("mxfp4") => Some("mxfp4".to_string()),
            other => bail!(
                "{o}: quantization_config.quant_method {} is not supported for gpt_oss (supported: \"mxfp4\" expert blocks, or no quantization_config for unquantised weights)",
                other.map_or("(missing)".to_string(), |m| format!("{m:?}"))
            ),
        },
    };

    let (rope_theta, yarn) = rope_of(raw, path)?;
    Ok(GptOssConfig {
        spec: GptOssSpec {
            layer_types,
            sliding_window,
            yarn,
            quant_method,
            per_expert: false,
        },
        rope_theta,
        moe,
    })
}

/// The RoPE base and YaRN parameters as transformers resolves them for gpt-oss: the parameters
/// come from `rope_scaling` if set, else `rope_parameters`, else `GptOssConfig`'s defaults (YaRN,
/// factor 32, beta_fast 32, beta_slow 1, truncate false, original_max_position_embeddings 4096);
/// the base from the parameters' `rope_theta`, else the top-level `rope_theta`, else 150000.
fn rope_of(raw: &Value, path: &Path) -> Result<(f64, Option<Yarn>)> {
    let o = path.display();
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    let (key, params) = match (get("rope_scaling"), get("rope_parameters")) {
        (Some(p), _) => ("rope_scaling", p.clone()),
        (None, Some(p)) => ("rope_parameters", p.clone()),
        (None, None) => (
            "rope_parameters",
            serde_json::json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}),
        ),
    };
    let Some(p) = params.as_object() else {
        bail!("{o}: {key} should be an object, found {params}");
    };
    let num = |k: &str| -> Result<Option<f64>> {
        p.get(k)
            .filter(|v| !v.is_null())
            .map(|v| {
                v.as_f64()
                    .with_context(|| format!("{o}: {key}.{k} should be a number, found {v}"))
            })
            .transpose()
    };
    let theta = match num("rope_theta")? {
        Some(t) => t,
        None => match get("rope_theta") {
            Some(v) => v
                .as_f64()
                .with_context(|| format!("{o}: rope_theta should be a number, found {v}"))?,
            None => DEFAULT_ROPE_THETA,
        },
    };
    if num("partial_rotary_factor")?.is_some_and(|f| f != 1.0) {
        bail!("{o}: {key}.partial_rotary_factor is not supported for gpt_oss (its rotary embedding covers the whole head)");
    }
    let rope_type = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match rope_type {
        "default" => Ok((theta, None)),
        "yarn" => {
            let factor = num("factor")?
                .with_context(|| format!("{o}: {key}.factor is missing (YaRN needs it)"))?;
            // transformers: a top-level original_max_position_embeddings overrides the
            // parameters'; without either, max_position_embeddings.
            let original = match get("original_max_position_embeddings").and_then(Value::as_f64) {
                Some(v) => v,
                None => match num("original_max_position_embeddings")? {
                    Some(v) => v,
                    None => get("max_position_embeddings")
                        .and_then(Value::as_f64)
                        .unwrap_or(DEFAULT_MAX_POSITIONS as f64),
                },
            };
            let mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (num("attention_factor")?, num("mscale")?, num("mscale_all_dim")?) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                    mscale(factor, m) / mscale(factor, a)
                }
                _ => mscale(factor, 1.0),
            };
            let truncate = match p.get("truncate") {
                None | Some(Value::Null) => true,
                Some(v) => v
                    .as_bool()
                    .with_context(|| format!("{o}: {key}.truncate should be true or false, found {v}"))?,
            };
            // `beta_fast or 32`: a missing or zero value takes the default.
            let or = |v: Option<f64>, d: f64| v.filter(|&x| x != 0.0).unwrap_or(d);
            Ok((
                theta,
                Some(Yarn {
                    factor,
                    beta_fast: or(num("beta_fast")?, 32.0),
                    beta_slow: or(num("beta_slow")?, 1.0),
                    original_max_position_embeddings: original,
                    truncate,
                    attention_factor,
                }),
            ))
        }
        other => bail!(
            "{o}: {key}.rope_type {other:?} is not supported for gpt_oss (supported: \"yarn\", \"default\")"
        ),
    }
}

/// YaRN's inverse frequencies for a rotary dimension `dim` and base `theta`, in f32 as
/// `_compute_yarn_parameters` computes them: `pos_freqs = θ^(2i/dim)`, the extrapolated
/// frequencies `1/pos_freqs` and the interpolated ones `1/(factor·pos_freqs)` blended by a linear
/// ramp over the dimensions between the correction range `[low, high]` (from `beta_fast` /
/// `beta_slow` rotations at `original_max_position_embeddings`, in f64; floored / ceiled when
/// `truncate`; clamped to `[0, dim − 1]`).
pub fn yarn_inv_freq(theta: f64, dim: usize, y: &Yarn) -> Vec<f32> {
    let half = dim / 2;
    let base = theta as f32;
    let pos_freqs: Vec<f32> = (0..half)
        .map(|i| base.powf((2 * i) as f32 / dim as f32))
        .collect();
    let correction_dim = |rotations: f64| {
        (dim as f64
            * (y.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
    if y.truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
    if low == high {
        high += 0.001; // transformers: "Prevent singularity"
    }
    let (low32, span32) = (low as f32, (high - low) as f32);
    let factor = y.factor as f32;
    pos_freqs
        .iter()
        .enumerate()
        .map(|(i, &pf)| {
            let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            let (inv_extra, inv_inter) = (1.0 / pf, 1.0 / (factor * pf));
            inv_inter * (1.0 - extrapolation) + inv_extra * extrapolation
        })
        .collect()
}

/// The rotary frequencies of a gpt-oss model: YaRN or plain, over the whole head.
pub fn rope_freqs(spec: &ModelSpec, g: &GptOssSpec) -> RopeFreqs {
    let rope = spec.rope();
    match &g.yarn {
        None => RopeFreqs::of_rope(&rope),
        Some(y) => RopeFreqs {
            head_dim: spec.head_dim,
            rotary_dim: spec.head_dim,
            style: RopeStyle::RotateHalf,
            inv_freq: yarn_inv_freq(spec.rope_theta as f64, spec.head_dim, y),
            attention_scaling: y.attention_factor as f32,
        },
    }
}

/// Refuse gpt-oss on a backend without attention sinks before any weight is uploaded.
pub fn check_backend<B: Backend>(be: &B, spec: &ModelSpec) -> Result<()> {
    if spec.gpt_oss.is_some() && !be.supports_attention_sinks() {
        bail!(crate::backend::gpt_oss::sinks_unsupported(be.name()));
    }
    Ok(())
}

/// The attention tensors of layer `l` beyond q/k/v/o weights: the sinks, and the biases with
/// `attention_bias` (on the released models; q/k/v/o alike, unlike Qwen2's q/k/v only).
pub fn attention_extra_tensors(spec: &ModelSpec, l: usize) -> Vec<(String, Vec<usize>)> {
    let (d, qd, kvd) = (
        spec.hidden_size,
        spec.num_heads * spec.head_dim,
        spec.num_kv_heads * spec.head_dim,
    );
    let p = format!("model.layers.{l}.self_attn");
    let mut v = vec![(format!("{p}.sinks"), vec![spec.num_heads])];
    if spec.attention_bias {
        v.push((format!("{p}.q_proj.bias"), vec![qd]));
        v.push((format!("{p}.k_proj.bias"), vec![kvd]));
        v.push((format!("{p}.v_proj.bias"), vec![kvd]));
        v.push((format!("{p}.o_proj.bias"), vec![d]));
    }
    v
}

/// Layer `l`'s MLP tensors: the router with its bias and the experts, fused (`[E, D, 2I]`,
/// `[E, I, D]`, as `GptOssExperts` holds them) or as MXFP4 blocks and scales (`[E, 2I, D/32,
/// 16]` / `[E, 2I, D/32]`, `[E, D, I/32, 16]` / `[E, D, I/32]`), with the biases.
pub fn mlp_tensors(spec: &ModelSpec, l: usize, mxfp4: bool) -> Vec<(String, Vec<usize>)> {
    let d = spec.hidden_size;
    let Some(m) = &spec.moe else {
        return Vec::new();
    };
    let (e, i) = (m.num_experts, m.moe_intermediate_size);
    let p = format!("model.layers.{l}.mlp");
    let mut v = vec![
        (format!("{p}.router.weight"), vec![e, d]),
        (format!("{p}.router.bias"), vec![e]),
        (format!("{p}.experts.gate_up_proj_bias"), vec![e, 2 * i]),
        (format!("{p}.experts.down_proj_bias"), vec![e, d]),
    ];
    if mxfp4 {
        let b = crate::formats::mxfp4::BLOCK;
        v.push((
            format!("{p}.experts.gate_up_proj_blocks"),
            vec![e, 2 * i, d / b, 16],
        ));
        v.push((
            format!("{p}.experts.gate_up_proj_scales"),
            vec![e, 2 * i, d / b],
        ));
        v.push((
            format!("{p}.experts.down_proj_blocks"),
            vec![e, d, i / b, 16],
        ));
        v.push((format!("{p}.experts.down_proj_scales"), vec![e, d, i / b]));
    } else {
        v.push((format!("{p}.experts.gate_up_proj"), vec![e, d, 2 * i]));
        v.push((format!("{p}.experts.down_proj"), vec![e, i, d]));
    }
    v
}

/// Layer `l`'s MLP tensors when the experts come one per expert ([`GptOssSpec::per_expert`]):
/// the router with its bias, each expert's gate, up and down weights, the three bias stacks.
pub fn per_expert_mlp_tensors(spec: &ModelSpec, l: usize) -> Vec<(String, Vec<usize>)> {
    let d = spec.hidden_size;
    let Some(m) = &spec.moe else {
        return Vec::new();
    };
    let (e, i) = (m.num_experts, m.moe_intermediate_size);
    let p = format!("model.layers.{l}.mlp");
    let mut v = vec![
        (format!("{p}.router.weight"), vec![e, d]),
        (format!("{p}.router.bias"), vec![e]),
        (format!("{p}.experts.gate_proj_bias"), vec![e, i]),
        (format!("{p}.experts.up_proj_bias"), vec![e, i]),
        (format!("{p}.experts.down_proj_bias"), vec![e, d]),
    ];
    for x in 0..e {
        v.push((format!("{p}.experts.{x}.gate_proj.weight"), vec![i, d]));
        v.push((format!("{p}.experts.{x}.up_proj.weight"), vec![i, d]));
        v.push((format!("{p}.experts.{x}.down_proj.weight"), vec![d, i]));
    }
    v
}

/// Every tensor of a gpt-oss checkpoint that `spec` implies (without the embedding, final norm
/// and LM head, which every model has), for the shape check at open.
pub fn layer_tensors(spec: &ModelSpec, g: &GptOssSpec) -> Vec<(String, Vec<usize>)> {
    let (d, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let mut v = Vec::new();
    for l in 0..spec.num_layers {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![d]));
        v.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        v.push((format!("{p}.self_attn.q_proj.weight"), vec![qd, d]));
        v.push((format!("{p}.self_attn.k_proj.weight"), vec![kvd, d]));
        v.push((format!("{p}.self_attn.v_proj.weight"), vec![kvd, d]));
        v.push((format!("{p}.self_attn.o_proj.weight"), vec![d, qd]));
        v.extend(attention_extra_tensors(spec, l));
        if g.per_expert {
            v.extend(per_expert_mlp_tensors(spec, l));
        } else {
            v.extend(mlp_tensors(spec, l, g.mxfp4()));
        }
    }
    v
}

/// What a gpt-oss checkpoint must get right beyond each tensor's shape, checked on the headers
/// before any weight is read; each error names the file and the tensor or key:
/// - the experts' storage agrees with `quantization_config`: MXFP4 blocks and scales (U8) when
///   `quant_method` is "mxfp4", fused unquantised tensors otherwise; the per-expert layout only
///   with [`GptOssSpec::per_expert`] (a GGUF);
/// - blocks and scales fit each other (`[E, R, G, 16]` and `[E, R, G]`) and the dims they pack
///   (`hidden_size`, `intermediate_size`) are multiples of 32;
/// - every expert tensor and the router hold `num_local_experts` experts;
/// - the router has its bias (`GptOssTopKRouter` is a biased linear layer).
///
/// The remaining shapes are compared by `model::load::check_shapes` with [`layer_tensors`].
pub fn check_checkpoint(
    spec: &ModelSpec,
    g: &GptOssSpec,
    infos: &[TensorInfo],
    path: &Path,
) -> Result<()> {
    let o = path.display();
    let by_name: HashMap<&str, &TensorInfo> = infos.iter().map(|t| (t.name.as_str(), t)).collect();
    let Some(m) = &spec.moe else {
        bail!("{o}: a gpt_oss config without experts");
    };
    let (d, i, e) = (spec.hidden_size, m.moe_intermediate_size, m.num_experts);
    let b = crate::formats::mxfp4::BLOCK;
    if g.mxfp4() && (d % b != 0 || i % b != 0) {
        bail!("{o}: hidden_size {d} and intermediate_size {i} must be multiples of {b} for MXFP4 expert blocks");
    }
    for t in infos {
        let Some(rest) = t
            .name
            .strip_prefix("model.layers.")
            .and_then(|s| s.split_once(".mlp."))
            .map(|(_, r)| r)
        else {
            continue;
        };
        let (name, file) = (&t.name, &t.file_name);
        if rest
            .strip_prefix("experts.")
            .and_then(|r| r.split('.').next())
            .is_some_and(|n| n.parse::<usize>().is_ok())
        {
            if g.per_expert {
                continue; // shapes: model::load::check_shapes with [`layer_tensors`]
            }
            bail!("{o}: tensor {name} ({file}) is a per-expert tensor; gpt-oss checkpoints store the experts fused (experts.gate_up_proj, experts.down_proj) or as MXFP4 blocks");
        }
        let quantised = rest.ends_with("_blocks") || rest.ends_with("_scales");
        if quantised && !g.mxfp4() {
            bail!("{o}: tensor {name} ({file}) holds MXFP4 blocks, but config.json has no quantization_config with quant_method \"mxfp4\"");
        }
        if g.mxfp4() && (rest == "experts.gate_up_proj" || rest == "experts.down_proj") {
            bail!("{o}: tensor {name} ({file}) is stored unquantised, but config.json says quantization_config.quant_method \"mxfp4\" (expected {name}_blocks and {name}_scales)");
        }
        if quantised && t.dtype != "U8" {
            bail!(
                "{o}: tensor {name} ({file}) has dtype {}; MXFP4 blocks and scales are U8",
                t.dtype
            );
        }
        let experts_first = rest.starts_with("experts.") || rest.starts_with("router.");
        if experts_first && t.shape.first() != Some(&e) {
            bail!(
                "{o}: tensor {name} ({file}) has shape {:?}: {} experts, but config.json says num_local_experts = {e}",
                t.shape,
                t.shape.first().map_or("no".to_string(), |n| n.to_string())
            );
        }
    }
    for l in 0..spec.num_layers {
        let p = format!("model.layers.{l}.mlp");
        let bias = format!("{p}.router.bias");
        if by_name.contains_key(format!("{p}.router.weight").as_str())
            && !by_name.contains_key(bias.as_str())
        {
            bail!("{o}: tensor {bias} is missing: gpt-oss's router (GptOssTopKRouter) is a linear layer with a bias");
        }
        if !g.mxfp4() {
            continue;
        }
        for proj in ["gate_up_proj", "down_proj"] {
            let (bn, sn) = (
                format!("{p}.experts.{proj}_blocks"),
                format!("{p}.experts.{proj}_scales"),
            );
            let (Some(bt), Some(st)) = (by_name.get(bn.as_str()), by_name.get(sn.as_str())) else {
                continue; // reported as missing by the shape check
            };
            if crate::formats::mxfp4::packed_shape(&bt.shape, &st.shape).is_none() {
                bail!(
                    "{o}: tensors {bn} {:?} and {sn} {:?} do not fit each other (MXFP4 blocks [E, R, G, 16] need scales [E, R, G])",
                    bt.shape,
                    st.shape
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
