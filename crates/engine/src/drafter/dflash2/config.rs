//! A DFlash2 checkpoint's `config.json`: the DFlash backbone's keys ([`DrafterConfig`]) and what
//! DFlash2 adds (docs/dflash2.md §1): the convolutions' kernel and group, the candidate
//! selector's rank and width, the logit scale and soft cap, the embedding scale, and each
//! layer's mask as the authors' attention builds it.

use crate::drafter::config::DrafterConfig;
pub use crate::drafter::config::LayerMask;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// The `architectures` entry of the authors' checkpoints.
pub const ARCHITECTURE: &str = "DFlash2DraftModel";

/// The keys only a DFlash2 config has (in `dflash_config` or at the top level).
pub const DFLASH2_KEYS: [&str; 4] = [
    "selector_rank",
    "selector_top_k",
    "conv_kernel_size",
    "conv_group_size",
];

/// Whether a parsed `config.json` is a DFlash2 checkpoint's: `architectures` names
/// [`ARCHITECTURE`], or a DFlash2 key is present. The keys count on their own because a config
/// that lost its class name still needs its selector: engines that key on the class fall back
/// to plain DFlash without a word.
pub fn is_dflash2(v: &Value) -> bool {
    let class = v
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|s| s.as_str() == Some(ARCHITECTURE)));
    let keys = DFLASH2_KEYS
        .iter()
        .any(|k| v.get("dflash_config").and_then(|d| d.get(*k)).is_some() || v.get(*k).is_some());
    class || keys
}

#[derive(Clone, Debug, PartialEq)]
pub struct DFlash2Config {
    /// The DFlash keys (block, mask token, taps, sizes, RoPE θ).
    pub backbone: DrafterConfig,
    /// Offsets of each causal convolution (2 in the published checkpoints).
    pub conv_kernel_size: usize,
    /// Channels sharing one dynamic kernel value (16).
    pub conv_group_size: usize,
    /// Width of the selector's bilinear term (256).
    pub selector_rank: usize,
    /// Candidates the selector re-scores per position (16).
    pub selector_top_k: usize,
    /// Logits are multiplied by this before the soft cap.
    pub output_multiplier: f32,
    /// `cap · tanh(logit / cap)` when set (a cap ≤ 0 or null is none, as the authors read it).
    pub final_logit_softcapping: Option<f32>,
    /// The block's token embeddings are multiplied by this.
    pub input_embedding_scale: f32,
    /// `vocab_size`: the codebooks' rows.
    pub vocab_size: usize,
    pub layer_masks: Vec<LayerMask>,
}

impl DFlash2Config {
    /// Parse `<dir>/config.json`: [`DrafterConfig::load`] for the backbone, then the DFlash2 keys,
    /// `dflash_config` first, then the top level, as the authors' `_draft_value` reads them.
    /// A missing or impossible key is an error naming the file and the key.
    pub fn load(dir: &Path) -> Result<DFlash2Config> {
        Self::parse(dir, DrafterConfig::load(dir)?)
    }

    /// [`DFlash2Config::load`] without the backbone's block-size limit (for `lint`).
    pub(crate) fn read(dir: &Path) -> Result<DFlash2Config> {
        Self::parse(dir, DrafterConfig::read(dir)?)
    }

    fn parse(dir: &Path, backbone: DrafterConfig) -> Result<DFlash2Config> {
        // A GGUF drafter's metadata arrives translated to this layout (`crate::drafter::gguf`).
        let (path, v) = crate::drafter::gguf::config_json(dir)?;
        let p = path.display();
        let dc = v.get("dflash_config");
        let pick = |k: &str| {
            dc.and_then(|d| d.get(k))
                .filter(|x| !x.is_null())
                .or_else(|| v.get(k).filter(|x| !x.is_null()))
        };
        let positive = |k: &str| -> Result<usize> {
            let x = pick(k).with_context(|| {
                format!("{p}: missing dflash_config.{k}, which a DFlash2 checkpoint needs (docs/dflash2.md §1)")
            })?;
            match x.as_u64() {
                Some(n) if n > 0 => Ok(n as usize),
                _ => bail!("{p}: {k} must be a positive integer, found {x}"),
            }
        };
        let float = |k: &str| -> Result<Option<f64>> {
            match pick(k) {
                None => Ok(None),
                Some(x) => match x.as_f64() {
                    Some(f) if f.is_finite() => Ok(Some(f)),
                    _ => bail!("{p}: {k} must be a finite number, found {x}"),
                },
            }
        };
        let conv_kernel_size = positive("conv_kernel_size")?;
        let conv_group_size = positive("conv_group_size")?;
        let selector_rank = positive("selector_rank")?;
        let selector_top_k = positive("selector_top_k")?;
        let d = backbone.hidden_size;
        if d % conv_group_size != 0 {
            bail!("{p}: hidden_size {d} is not a multiple of conv_group_size {conv_group_size}");
        }
        let vocab_size = backbone
            .vocab_size
            .with_context(|| format!("{p}: missing vocab_size (the candidate selector's codebooks have one row per token)"))?;
        if selector_top_k > vocab_size {
            bail!("{p}: selector_top_k {selector_top_k} is over vocab_size {vocab_size}");
        }
        let output_multiplier = float("output_multiplier")?.unwrap_or(1.0);
        if output_multiplier <= 0.0 {
            // A negative scale would turn the top-k into the bottom-k.
            bail!("{p}: output_multiplier must be positive, found {output_multiplier}");
        }
        let final_logit_softcapping = float("final_logit_softcapping")?
            .filter(|&c| c > 0.0)
            .map(|c| c as f32);
        let input_embedding_scale = float("input_embedding_scale")?.unwrap_or(1.0) as f32;
        check_rope(&v, &p.to_string())?;
        let layer_masks = (0..backbone.num_layers)
            .map(|i| backbone.layer_mask(i))
            .collect();
        Ok(DFlash2Config {
            backbone,
            conv_kernel_size,
            conv_group_size,
            selector_rank,
            selector_top_k,
            output_multiplier: output_multiplier as f32,
            final_logit_softcapping,
            input_embedding_scale,
            vocab_size,
            layer_masks,
        })
    }

    /// Groups of channels per convolution (one dynamic kernel value each).
    pub fn conv_groups(&self) -> usize {
        self.backbone.hidden_size / self.conv_group_size
    }

    /// The selector's unary score of a raw logit: `output_multiplier`, then the soft cap
    /// (`DFlashDraftModel.compute_logits`).
    pub fn transform_logit(&self, raw: f32) -> f32 {
        let x = raw * self.output_multiplier;
        match self.final_logit_softcapping {
            Some(cap) => (x / cap).tanh() * cap,
            None => x,
        }
    }
}

/// RoPE beyond plain rotate-half is refused, naming the key: the drafter's positions would be
/// rotated otherwise than in the authors' model. (`dimension_sections` / `mrope_section` are the
/// multi-section RoPE of converted files, docs/dflash2.md §4.)
fn check_rope(v: &Value, p: &str) -> Result<()> {
    if let Some(s) = v.get("rope_scaling").filter(|x| !x.is_null()) {
        bail!("{p}: rope_scaling {s} is not implemented for DFlash2 drafters (plain RoPE only)");
    }
    if let Some(r) = v.get("rope_parameters") {
        if let Some(t) = r
            .get("rope_type")
            .and_then(Value::as_str)
            .filter(|t| *t != "default")
        {
            bail!("{p}: rope_parameters.rope_type {t:?} is not implemented for DFlash2 drafters (plain RoPE only)");
        }
        for key in ["mrope_section", "dimension_sections"] {
            if r.get(key).is_some() {
                bail!("{p}: rope_parameters.{key} (multi-section RoPE) is not implemented for DFlash2 drafters");
            }
        }
    }
    Ok(())
}
