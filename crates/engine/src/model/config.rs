//! One description of a target architecture, built from a Hugging Face `config.json` or from GGUF
//! metadata, so the model code never looks at either format.

pub use super::gpt_oss::GptOssSpec;
pub use super::hybrid::{HybridSpec, LayerType};
pub use super::moe::MoeSpec;
use crate::backend::{Rope, RopeStyle};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// LLaMA / SmolLM2: no biases, no q/k norm.
    Llama,
    /// Qwen2: biases on q/k/v projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE, explicit head_dim.
    Qwen3,
    /// Qwen3.5 / Qwen3.6 dense (`qwen3_5`, `qwen3_5_text`): Gated DeltaNet + gated attention
    /// hybrid ([`HybridSpec`], docs/hybrid-models.md).
    #[serde(rename = "qwen3_5")]
    Qwen3_5,
    /// Qwen3-Next (`qwen3_next`): the same hybrid, with fused grouped GDN input projections in
    /// the checkpoint.
    #[serde(rename = "qwen3_next")]
    Qwen3Next,
    /// Qwen3-MoE (`qwen3_moe`: Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3 attention with
    /// sparse mixture-of-experts MLPs ([`MoeSpec`], docs/moe-models.md).
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    /// Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`, `qwen3_5_moe_text`): the Qwen3.5 hybrid with a
    /// sparse MLP (routed experts plus the gated shared expert) in every layer.
    #[serde(rename = "qwen3_5_moe")]
    Qwen3_5Moe,
    /// gpt-oss (`gpt_oss`: gpt-oss-20b / 120b): attention with sinks, sliding windows and
    /// YaRN, a biased router and fused or MXFP4 experts ([`GptOssSpec`], docs/moe-models.md).
    #[serde(rename = "gpt_oss")]
    GptOss,
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen3_5" | "qwen3_5_text" => Some(Arch::Qwen3_5),
            "qwen3_next" => Some(Arch::Qwen3Next),
            "qwen3_moe" => Some(Arch::Qwen3Moe),
            "qwen3_5_moe" | "qwen3_5_moe_text" => Some(Arch::Qwen3_5Moe),
            "gpt_oss" => Some(Arch::GptOss),
            _ => None,
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3_5 => "qwen3_5",
            Arch::Qwen3Next => "qwen3_next",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen3_5Moe => "qwen3_5_moe",
            Arch::GptOss => "gpt_oss",
        }
    }
    /// A Gated DeltaNet hybrid (zero-centred norms, gated attention, partial RoPE).
    pub fn is_hybrid(&self) -> bool {
        matches!(self, Arch::Qwen3_5 | Arch::Qwen3Next | Arch::Qwen3_5Moe)
    }
}

/// Shapes and constants of a decoder-only target model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Layer schedule and Gated DeltaNet sizes of a hybrid (Qwen3.5 / Qwen3-Next); `None` for
    /// dense models (left out of the serialised spec then, so dense cache keys do not change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridSpec>,
    /// Routed experts of the sparse layers (Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next); `None` when
    /// every MLP is dense (left out of the serialised spec then, as `hybrid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
    /// gpt-oss's layer kinds, window, YaRN and expert storage; `None` for every other
    /// architecture (left out of the serialised spec then, as `hybrid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpt_oss: Option<GptOssSpec>,
}

impl ModelSpec {
    pub fn rope(&self) -> Rope {
        // GGUF llama weights are un-permuted at load, so every architecture uses rotate-half.
        Rope {
            theta: self.rope_theta,
            head_dim: self.head_dim,
            rotary_dim: self.hybrid.as_ref().map_or(self.head_dim, |h| h.rotary_dim),
            style: RopeStyle::RotateHalf,
        }
    }

    /// Checks that make later shape errors impossible; errors name `origin` (the file).
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let o = origin.display();
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || self.head_dim == 0
            || self.num_layers == 0
        {
            bail!("{o}: config has zero heads, head_dim or layers");
        }
        if self.num_heads % self.num_kv_heads != 0 {
            bail!(
                "{o}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads,
                self.num_kv_heads
            );
        }
        if self.head_dim % 2 != 0 {
            bail!("{o}: head_dim {} must be even for RoPE", self.head_dim);
        }
        if self.hidden_size == 0 || self.vocab_size == 0 {
            bail!("{o}: config has zero hidden_size or vocab_size");
        }
        // A model whose every MLP is sparse (Qwen3.5-MoE) has no dense intermediate_size.
        let all_sparse = self
            .moe
            .as_ref()
            .is_some_and(|m| m.sparse_layers.iter().all(|&s| s));
        if self.intermediate_size == 0 && !all_sparse {
            bail!("{o}: config has zero or no intermediate_size (the dense MLPs' width)");
        }
        if let Some(h) = &self.hybrid {
            h.validate(origin, self)?;
        }
        if let Some(m) = &self.moe {
            if m.sparse_layers.len() != self.num_layers {
                bail!(
                    "{o}: {} layers have an MLP kind, num_hidden_layers is {}",
                    m.sparse_layers.len(),
                    self.num_layers
                );
            }
            m.validate(origin)?;
        }
        Ok(())
    }

    /// Parse a Hugging Face `config.json` (llama, qwen2, qwen3, qwen3_moe, qwen3_5, qwen3_5_text,
    /// qwen3_5_moe, qwen3_5_moe_text, qwen3_next). A `qwen3_5` / `qwen3_5_moe` composite
    /// (vision-language) config is read from its `text_config`, top-level keys filling in what
    /// the text config lacks.
    pub fn from_hf_config(path: &Path) -> Result<ModelSpec> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        let raw: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a valid config.json", path.display()))?;
        let raw = super::hybrid::text_config(&raw, path)?;
        let c: HfConfig = serde_json::from_value(raw.clone())
            .with_context(|| format!("{}: not a valid config.json", path.display()))?;
        let arch = Arch::parse(&c.model_type).with_context(|| {
            format!(
                "{}: unsupported architecture model_type {:?} (supported: llama, qwen2, qwen3, qwen3_moe, qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next, gpt_oss)",
                path.display(),
                c.model_type
            )
        })?;
        // gpt-oss: its own config keys and GptOssConfig's defaults (head_dim 64, rms_norm_eps
        // 1e-5, biases on, 131072 positions, YaRN with θ 150000).
        let oss = match arch {
            Arch::GptOss => Some(super::gpt_oss::from_hf_config(
                &raw,
                c.num_hidden_layers,
                c.intermediate_size.unwrap_or(0),
                path,
            )?),
            _ => None,
        };
        let head_dim = c.head_dim.unwrap_or(match oss {
            Some(_) => super::gpt_oss::DEFAULT_HEAD_DIM,
            None => c.hidden_size / c.num_attention_heads.max(1),
        });
        let rope_theta = match &oss {
            Some(g) => g.rope_theta,
            None => c
                .rope_theta
                .or_else(|| {
                    c.rope_parameters
                        .as_ref()
                        .and_then(|r| r.get("rope_theta"))
                        .and_then(|v| v.as_f64())
                })
                .unwrap_or(10000.0),
        } as f32;
        let (default_eps, default_positions) = match oss {
            Some(_) => (
                super::gpt_oss::DEFAULT_RMS_NORM_EPS,
                super::gpt_oss::DEFAULT_MAX_POSITIONS,
            ),
            None => (1e-6, 4096),
        };
        let eos_token_ids = match c.eos_token_id {
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
            _ => vec![],
        };
        let spec = ModelSpec {
            arch,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size.unwrap_or(0),
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
            head_dim,
            rope_theta,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(default_eps) as f32,
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: c.max_position_embeddings.unwrap_or(default_positions),
            attention_bias: c
                .attention_bias
                .unwrap_or(arch == Arch::Qwen2 || arch == Arch::GptOss),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe) || arch.is_hybrid(),
            bos_token_id: c.bos_token_id,
            eos_token_ids,
            hybrid: if arch.is_hybrid() {
                Some(HybridSpec::from_hf_config(
                    &raw,
                    c.num_hidden_layers,
                    head_dim,
                    path,
                )?)
            } else {
                None
            },
            moe: match &oss {
                Some(g) => Some(g.moe.clone()),
                None => MoeSpec::from_hf_config(&raw, arch, c.num_hidden_layers, path)?,
            },
            gpt_oss: oss.map(|g| g.spec),
        };
        spec.validate(path)?;
        Ok(spec)
    }
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    attention_bias: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<serde_json::Value>,
}
