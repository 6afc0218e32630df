//! Configuration and checkpoint layout of the Qwen3.5 / Qwen3.6 / Qwen3-Next hybrids (Gated
//! DeltaNet + gated attention), see docs/hybrid-models.md.
//!
//! - [`text_config`]: the language-model part of a `config.json` (`qwen3_5` / `qwen3_5_moe`
//!   composite configs nest it under `text_config`); their experts are read by `super::moe`.
//! - [`HybridSpec`]: the layer schedule (`layer_types` or `full_attention_interval`), the
//!   `linear_*` sizes and the partial-rotary dimension.
//! - [`HybridWeights`]: presents a hybrid checkpoint under the plain HF text-model names
//!   (`model.layers.{i}…`): strips the `model.language_model.` prefix of Qwen3.5 checkpoints,
//!   ignores `model.visual.*` and `mtp.*`, and un-groups Qwen3-Next's fused `in_proj_qkvz` /
//!   `in_proj_ba` into Qwen3.5's `in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a`.

use super::config::ModelSpec;
use crate::backend::GdnShape;
use crate::formats::{HostTensor, TensorInfo, WeightSource};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// The mixer of one decoder layer (`layer_types[i]` in `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Gated softmax attention with a KV cache (`self_attn.*`).
    FullAttention,
    /// Gated DeltaNet with a conv state and a recurrent state (`linear_attn.*`).
    LinearAttention,
}

/// Layer schedule and Gated DeltaNet sizes of a hybrid model (HF key names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HybridSpec {
    pub layer_types: Vec<LayerType>,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    /// Rotated dimensions at the start of each attention head:
    /// `int(head_dim · partial_rotary_factor)` (64 of 256 on Qwen3.5).
    pub rotary_dim: usize,
}

/// The `config.json` keys of a hybrid that [`super::config`]'s common parser does not read.
#[derive(Deserialize)]
struct HfHybridConfig {
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    partial_rotary_factor: Option<f64>,
    rope_parameters: Option<serde_json::Map<String, Value>>,
}

/// The language-model config of `raw`: its `text_config` for a `qwen3_5` / `qwen3_5_moe`
/// composite config (keys only at the top level, such as `tie_word_embeddings`, fill in), `raw`
/// itself otherwise.
pub fn text_config(raw: &Value, path: &Path) -> Result<Value> {
    let _ = path;
    let top = raw
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let inner = raw.get("text_config").filter(|t| t.is_object());
    let Some(inner) = inner.filter(|_| top == "qwen3_5" || top == "qwen3_5_moe") else {
        return Ok(raw.clone());
    };
    let mut merged = inner.clone();
    let m = merged.as_object_mut().expect("checked is_object");
    for (k, v) in raw.as_object().into_iter().flatten() {
        if k != "text_config" && k != "vision_config" && !m.contains_key(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    // The composite type decides, as transformers builds the text config from the composite
    // class's own sub-config (Qwen3_5TextConfig / Qwen3_5MoeTextConfig).
    m.insert("model_type".into(), Value::String(format!("{top}_text")));
    Ok(merged)
}

impl HybridSpec {
    /// Read the hybrid keys of a (text) config; `head_dim` is the attention head size.
    /// Defaults are those of transformers' `Qwen3_5TextConfig` / `Qwen3NextConfig`.
    pub fn from_hf_config(
        raw: &Value,
        num_layers: usize,
        head_dim: usize,
        path: &Path,
    ) -> Result<HybridSpec> {
        let o = path.display();
        let c: HfHybridConfig = serde_json::from_value(raw.clone())
            .with_context(|| format!("{o}: not a valid hybrid config.json"))?;
        // Sparse MLPs (Qwen3.5-MoE; Qwen3-Next, whose num_experts defaults to 512) are read by
        // super::moe::MoeSpec.
        let layer_types = match c.layer_types {
            Some(names) => names
                .iter()
                .enumerate()
                .map(|(i, n)| match n.as_str() {
                    // transformers' remap_legacy_layer_types: mamba/conv → linear, attention → full.
                    "full_attention" | "attention" => Ok(LayerType::FullAttention),
                    "linear_attention" | "mamba" | "conv" => Ok(LayerType::LinearAttention),
                    other => bail!(
                        "{o}: layer_types[{i}] = {other:?} is not a known layer type (full_attention, linear_attention)"
                    ),
                })
                .collect::<Result<Vec<_>>>()?,
            None => {
                let every = c.full_attention_interval.unwrap_or(4);
                if every == 0 {
                    bail!("{o}: full_attention_interval must be at least 1");
                }
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % every == 0 {
                            LayerType::FullAttention
                        } else {
                            LayerType::LinearAttention
                        }
                    })
                    .collect()
            }
        };
        let factor = c
            .partial_rotary_factor
            .or_else(|| {
                c.rope_parameters
                    .as_ref()
                    .and_then(|r| r.get("partial_rotary_factor"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(0.25);
        Ok(HybridSpec {
            layer_types,
            linear_num_key_heads: c.linear_num_key_heads.unwrap_or(16),
            linear_num_value_heads: c.linear_num_value_heads.unwrap_or(32),
            linear_key_head_dim: c.linear_key_head_dim.unwrap_or(128),
            linear_value_head_dim: c.linear_value_head_dim.unwrap_or(128),
            linear_conv_kernel_dim: c.linear_conv_kernel_dim.unwrap_or(4),
            rotary_dim: (head_dim as f64 * factor) as usize,
        })
    }

    /// Sizes of the Gated DeltaNet core.
    pub fn gdn_shape(&self) -> GdnShape {
        GdnShape {
            k_heads: self.linear_num_key_heads,
            v_heads: self.linear_num_value_heads,
            k_dim: self.linear_key_head_dim,
            v_dim: self.linear_value_head_dim,
        }
    }

    /// Consistency checks, each error naming the key.
    pub fn validate(&self, origin: &Path, spec: &ModelSpec) -> Result<()> {
        let o = origin.display();
        if self.layer_types.len() != spec.num_layers {
            bail!(
                "{o}: layer_types has {} entries, num_hidden_layers is {}",
                self.layer_types.len(),
                spec.num_layers
            );
        }
        for (key, v) in [
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
        ] {
            if v == 0 {
                bail!("{o}: {key} is 0");
            }
        }
        if !self
            .linear_num_value_heads
            .is_multiple_of(self.linear_num_key_heads)
        {
            bail!(
                "{o}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {} (each key head serves a whole group of value heads)",
                self.linear_num_value_heads,
                self.linear_num_key_heads
            );
        }
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > spec.head_dim
        {
            bail!(
                "{o}: partial_rotary_factor gives {} rotary dimensions of head_dim {}: must be even and in 2..=head_dim",
                self.rotary_dim,
                spec.head_dim
            );
        }
        Ok(())
    }

    /// Every HF tensor of layer `i` and its shape, in the Qwen3.5 layout (after
    /// [`HybridWeights`]): what [`super::load`]'s shape check requires.
    pub fn layer_tensors(&self, spec: &ModelSpec, i: usize) -> Vec<(String, Vec<usize>)> {
        let (d, hd, inter) = (spec.hidden_size, spec.head_dim, spec.intermediate_size);
        let p = format!("model.layers.{i}");
        let mut v = vec![
            (format!("{p}.input_layernorm.weight"), vec![d]),
            (format!("{p}.post_attention_layernorm.weight"), vec![d]),
            (format!("{p}.mlp.gate_proj.weight"), vec![inter, d]),
            (format!("{p}.mlp.up_proj.weight"), vec![inter, d]),
            (format!("{p}.mlp.down_proj.weight"), vec![d, inter]),
        ];
        match self.layer_types[i] {
            LayerType::FullAttention => {
                let (h, kv) = (spec.num_heads, spec.num_kv_heads);
                let a = format!("{p}.self_attn");
                v.extend([
                    // q_proj holds each head's query and output gate: [H · 2 · hd, D].
                    (format!("{a}.q_proj.weight"), vec![2 * h * hd, d]),
                    (format!("{a}.k_proj.weight"), vec![kv * hd, d]),
                    (format!("{a}.v_proj.weight"), vec![kv * hd, d]),
                    (format!("{a}.o_proj.weight"), vec![d, h * hd]),
                    (format!("{a}.q_norm.weight"), vec![hd]),
                    (format!("{a}.k_norm.weight"), vec![hd]),
                ]);
            }
            LayerType::LinearAttention => {
                let s = self.gdn_shape();
                let l = format!("{p}.linear_attn");
                v.extend([
                    (format!("{l}.in_proj_qkv.weight"), vec![s.conv_dim(), d]),
                    (format!("{l}.in_proj_z.weight"), vec![s.value_dim(), d]),
                    (format!("{l}.in_proj_b.weight"), vec![s.v_heads, d]),
                    (format!("{l}.in_proj_a.weight"), vec![s.v_heads, d]),
                    (
                        format!("{l}.conv1d.weight"),
                        vec![s.conv_dim(), 1, self.linear_conv_kernel_dim],
                    ),
                    (format!("{l}.dt_bias"), vec![s.v_heads]),
                    (format!("{l}.A_log"), vec![s.v_heads]),
                    (format!("{l}.norm.weight"), vec![s.v_dim]),
                    (format!("{l}.out_proj.weight"), vec![d, s.value_dim()]),
                ]);
            }
        }
        v
    }
}

/// A hybrid checkpoint under plain HF text-model names (see the module doc).
pub struct HybridWeights {
    inner: Box<dyn WeightSource>,
    /// Where the text model's `model.*` tensors are stored: `model.language_model.` (Qwen3.5 /
    /// Qwen3.6 checkpoints, saved from the vision-language class) or `model.`.
    prefix: &'static str,
    shape: GdnShape,
}

/// The four Qwen3.5 projections a Qwen3-Next fused projection holds: (split suffix, fused suffix).
const SPLIT: [(&str, &str); 4] = [
    ("in_proj_qkv.weight", "in_proj_qkvz.weight"),
    ("in_proj_z.weight", "in_proj_qkvz.weight"),
    ("in_proj_b.weight", "in_proj_ba.weight"),
    ("in_proj_a.weight", "in_proj_ba.weight"),
];

impl HybridWeights {
    pub fn new(inner: Box<dyn WeightSource>, hybrid: &HybridSpec) -> HybridWeights {
        let prefix = if inner.contains("model.language_model.embed_tokens.weight") {
            "model.language_model."
        } else {
            "model."
        };
        HybridWeights {
            inner,
            prefix,
            shape: hybrid.gdn_shape(),
        }
    }

    /// The stored name of HF name `name`.
    fn stored(&self, name: &str) -> String {
        match name.strip_prefix("model.") {
            Some(rest) => format!("{}{rest}", self.prefix),
            None => name.to_owned(),
        }
    }

    /// For a Qwen3.5-layout GDN projection name that the checkpoint stores fused (Qwen3-Next):
    /// (stored fused name, split suffix).
    fn fused_source(&self, name: &str) -> Option<(String, &'static str)> {
        let stored = self.stored(name);
        if self.inner.contains(&stored) {
            return None;
        }
        SPLIT.iter().find_map(|(split, fused)| {
            let base = stored.strip_suffix(split)?;
            base.ends_with("linear_attn.")
                .then(|| (format!("{base}{fused}"), *split))
                .filter(|(f, _)| self.inner.contains(f))
        })
    }

    /// Rows of the split projection `split` from a fused grouped tensor: per key head g the fused
    /// rows are `[q_g (dk) | k_g (dk) | v_g (r·dv) | z_g (r·dv)]` (`in_proj_qkvz`) or
    /// `[b_g (r) | a_g (r)]` (`in_proj_ba`), r = value heads per key head (transformers'
    /// `fix_query_key_value_ordering`). The split tensors concatenate the groups' pieces:
    /// `in_proj_qkv` = all q, then all k, then all v.
    fn ungroup(&self, fused: &HostTensor, split: &str, fused_name: &str) -> Result<HostTensor> {
        let GdnShape {
            k_heads: hk,
            k_dim: dk,
            v_dim: dv,
            ..
        } = self.shape;
        let r = self.shape.group();
        let (qkvz, pieces): (bool, &[(usize, usize)]) = match split {
            // (offset in the group block, rows) of each piece to take, in output order.
            "in_proj_qkv.weight" => (true, &[(0, dk), (dk, dk), (2 * dk, r * dv)]),
            "in_proj_z.weight" => (true, &[(2 * dk + r * dv, r * dv)]),
            "in_proj_b.weight" => (false, &[(0, r)]),
            _ => (false, &[(r, r)]),
        };
        let block = if qkvz { 2 * dk + 2 * r * dv } else { 2 * r };
        let cols = fused.shape.get(1).copied().unwrap_or(0);
        if fused.shape.len() != 2 || fused.shape[0] != hk * block {
            bail!(
                "{}: tensor {fused_name} has shape {:?}, the config implies [{}, hidden_size] ({hk} key-head groups of {block} rows)",
                self.inner.path().display(),
                fused.shape,
                hk * block
            );
        }
        let mut data = Vec::new();
        for &(off, rows) in pieces {
            for g in 0..hk {
                let start = (g * block + off) * cols;
                data.extend_from_slice(&fused.data[start..start + rows * cols]);
            }
        }
        let rows: usize = pieces.iter().map(|p| p.1).sum::<usize>() * hk;
        Ok(HostTensor {
            shape: vec![rows, cols],
            data,
        })
    }
}

impl WeightSource for HybridWeights {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    /// Only text-model names: `model.*` (under the stored prefix) and `lm_head.weight`.
    fn contains(&self, name: &str) -> bool {
        (name.starts_with("model.") || name == "lm_head.weight")
            && (self.inner.contains(&self.stored(name)) || self.fused_source(name).is_some())
    }
    /// The stored tensors under HF text-model names (vision and MTP tensors left out); a
    /// Qwen3-Next fused projection is listed as the split projections it holds (`file_name` =
    /// the fused tensor, bytes shared out by rows), so every parameter is counted once.
    fn tensors(&self) -> Vec<TensorInfo> {
        let mut out = Vec::new();
        for t in self.inner.tensors() {
            let name = match t.name.strip_prefix(self.prefix) {
                Some(rest) => format!("model.{rest}"),
                None if t.name == "lm_head.weight" => t.name.clone(),
                None => continue,
            };
            let s = self.shape;
            let is_fused = SPLIT.iter().any(|(_, f)| name.ends_with(f));
            for (split, fused) in SPLIT {
                let Some(base) = name.strip_suffix(fused) else {
                    continue;
                };
                // A fused tensor of the configured size yields split tensors of the configured
                // sizes; any other keeps its stored shape, so the shape check names it.
                let (rows, fused_rows) = match split {
                    "in_proj_qkv.weight" => (s.conv_dim(), s.conv_dim() + s.value_dim()),
                    "in_proj_z.weight" => (s.value_dim(), s.conv_dim() + s.value_dim()),
                    _ => (s.v_heads, 2 * s.v_heads),
                };
                let (shape, bytes) = match t.shape.as_slice() {
                    [r, c] if *r == fused_rows => {
                        (vec![rows, *c], t.bytes * rows as u64 / fused_rows as u64)
                    }
                    _ => (t.shape.clone(), t.bytes),
                };
                out.push(TensorInfo {
                    name: format!("{base}{split}"),
                    shape,
                    bytes,
                    ..t.clone()
                });
            }
            if !is_fused {
                out.push(TensorInfo { name, ..t });
            }
        }
        out
    }
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        if !(name.starts_with("model.") || name == "lm_head.weight") {
            bail!(
                "{}: {name} is not a text-model tensor (only model.* and lm_head.weight are read)",
                self.inner.path().display()
            );
        }
        match self.fused_source(name) {
            Some((fused_name, split)) => {
                let fused = self.inner.tensor(&fused_name)?;
                self.ungroup(&fused, split, &fused_name)
            }
            None => self.inner.tensor(&self.stored(name)),
        }
    }
    /// The stored bytes, borrowed from the memory map, of a tensor stored under its own name
    /// (so the weights go to the device without a host copy, as a dense model's do); a split of a
    /// Qwen3-Next fused projection is gathered on the host ([`WeightSource::tensor`]).
    fn raw(&self, name: &str) -> Result<Option<crate::backend::raw::RawPart<'_>>> {
        if !(name.starts_with("model.") || name == "lm_head.weight")
            || self.fused_source(name).is_some()
        {
            return Ok(None);
        }
        self.inner.raw(&self.stored(name))
    }
    fn release(&self, name: &str) {
        match self.fused_source(name) {
            Some((fused_name, _)) => self.inner.release(&fused_name),
            None => self.inner.release(&self.stored(name)),
        }
    }
}
