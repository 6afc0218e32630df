//! DFlash drafter checkpoints in the z-lab format: `config.json` (Qwen3-style with `block_size`
//! and `dflash_config`) + `model.safetensors` (names `fc`, `hidden_norm`, `norm`, `layers.{i}.*`;
//! no embedding or LM head — the target's are shared).

use crate::backend::{Rope, RopeStyle};
use anyhow::{bail, Context, Result};
pub use draftlens_results::store::MAX_BLOCK_SIZE;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Most drafter layers a config may declare (each gets an entry as the config is read).
pub const MAX_LAYERS: usize = 1024;

/// A drafter layer's type as `layer_types` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// `full_attention`: no window.
    Full,
    /// `sliding_attention`: a window over the context, and causal inside the block unless the
    /// config says otherwise ([`DrafterConfig::layer_mask`]).
    Sliding,
}

/// How one drafter layer's attention masks its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerMask {
    pub causal_in_block: bool,
    pub window: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrafterConfig {
    pub block_size: usize,
    pub mask_token_id: u32,
    /// 0-based target decoder-layer outputs (HF `hidden_states[id+1]`).
    pub target_layer_ids: Vec<usize>,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub vocab_size: Option<usize>,
    pub layer_kinds: Vec<LayerKind>,
    pub sliding_window: Option<usize>,
    /// `dflash_config.causal` / `is_causal` when the config sets it: causal (or not) inside the
    /// block for every layer, whatever its type; the window still follows the type.
    #[serde(default)]
    pub causal_override: Option<bool>,
    /// `num_target_layers` as written in the checkpoint (only informative).
    pub num_target_layers: Option<usize>,
}

impl DrafterConfig {
    /// Layer `i`'s mask, by the rule of the authors' newer code (`Qwen3DFlashAttention`:
    /// `is_causal = config.is_causal if set else layer is sliding`, window on sliding layers
    /// only) and vLLM's `_dflash_layer_causal`: the published drafters with sliding layers and
    /// `is_causal: false` are bidirectional inside the block with a window over the context
    /// (docs/dflash.md §1.2).
    pub fn layer_mask(&self, i: usize) -> LayerMask {
        let sliding = self.layer_kinds[i] == LayerKind::Sliding;
        LayerMask {
            causal_in_block: self.causal_override.unwrap_or(sliding),
            window: if sliding { self.sliding_window } else { None },
        }
    }

    pub fn rope(&self) -> Rope {
        Rope {
            theta: self.rope_theta,
            head_dim: self.head_dim,
            rotary_dim: self.head_dim,
            style: RopeStyle::RotateHalf,
        }
    }

    /// Parse `<dir>/config.json`. `dflash_config` keys win over top-level ones (older z-lab
    /// checkpoints keep `block_size` / `mask_token_id` at the top level); layer ids are never
    /// guessed from a formula. An absurd `block_size` ([`DrafterConfig::block_size_problem`]) is
    /// refused here, naming the key, before anything is allocated for it.
    pub fn load(dir: &Path) -> Result<DrafterConfig> {
        let cfg = Self::read(dir)?;
        if let Some(problem) = cfg.block_size_problem() {
            bail!("{}: {problem}", dir.join("config.json").display());
        }
        Ok(cfg)
    }

    /// Why this config's `block_size` cannot be evaluated, if it cannot: over
    /// [`MAX_BLOCK_SIZE`] (the rule the run store applies to every run too).
    pub fn block_size_problem(&self) -> Option<String> {
        (self.block_size > MAX_BLOCK_SIZE as usize).then(|| {
            format!(
                "block_size {} is over the limit of {MAX_BLOCK_SIZE} (published drafters use 8–16; \
                 the evaluation allocates per block position)",
                self.block_size
            )
        })
    }

    /// [`DrafterConfig::load`] without the `block_size` limit, for `lint`, which reports an
    /// absurd one as an error finding.
    pub(crate) fn read(dir: &Path) -> Result<DrafterConfig> {
        // A GGUF drafter's metadata arrives translated to this layout (`super::gguf`).
        let (path, v) = super::gguf::config_json(dir)?;
        let p = path.display();
        let dc = v.get("dflash_config");
        let pick = |k: &str| {
            dc.and_then(|d| d.get(k))
                .filter(|x| !x.is_null())
                .or_else(|| v.get(k).filter(|x| !x.is_null()))
        };
        let uint = |k: &str| -> Result<Option<usize>> {
            match pick(k) {
                None => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .with_context(|| format!("{p}: {k} must be a non-negative integer, found {x}")),
            }
        };
        let need =
            |k: &str| -> Result<usize> { uint(k)?.with_context(|| format!("{p}: missing {k}")) };
        let float = |k: &str| pick(k).and_then(|x| x.as_f64());

        let target_layer_ids: Vec<usize> = match pick("target_layer_ids") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|n| n as usize).with_context(|| format!("{p}: target_layer_ids must hold integers, found {x}")))
                .collect::<Result<_>>()?,
            Some(other) => bail!("{p}: target_layer_ids must be a list, found {other}"),
            None => bail!("{p}: missing dflash_config.target_layer_ids (draftlens never guesses tap layers: the formula is wrong for most published drafters)"),
        };
        if target_layer_ids.is_empty() {
            bail!("{p}: target_layer_ids is empty");
        }
        let hidden_size = need("hidden_size")?;
        let num_heads = need("num_attention_heads")?;
        let num_layers = need("num_hidden_layers")?;
        // Each layer gets an entry below: an absurd count must not become an allocation.
        if num_layers > MAX_LAYERS {
            bail!("{p}: num_hidden_layers {num_layers} is over the limit of {MAX_LAYERS} (DFlash drafters have 1–8)");
        }
        let head_dim = uint("head_dim")?.unwrap_or(hidden_size / num_heads.max(1));
        let rope_theta = float("rope_theta")
            .or_else(|| {
                v.get("rope_parameters")
                    .and_then(|r| r.get("rope_theta"))
                    .and_then(|x| x.as_f64())
            })
            .unwrap_or(1_000_000.0) as f32;
        let sliding_window = uint("sliding_window")?;
        // Per-layer types; `is_causal` / dflash_config.causal, when set, decides causality inside
        // the block for every layer (`layer_mask`).
        let layer_kinds: Vec<LayerKind> = match v.get("layer_types") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| match x.as_str() {
                    Some("full_attention") => Ok(LayerKind::Full),
                    Some("sliding_attention") => Ok(LayerKind::Sliding),
                    _ => bail!("{p}: unknown layer type {x} in layer_types"),
                })
                .collect::<Result<_>>()?,
            _ => vec![LayerKind::Full; num_layers],
        };
        if layer_kinds.len() != num_layers {
            bail!(
                "{p}: layer_types has {} entries for {num_layers} layers",
                layer_kinds.len()
            );
        }
        let causal_override = pick("causal")
            .or_else(|| v.get("is_causal"))
            .and_then(|x| x.as_bool());
        if layer_kinds.contains(&LayerKind::Sliding) && sliding_window.is_none() {
            tracing::warn!(
                "{p}: sliding layers without sliding_window: no window over the context"
            );
        }
        let block_size = need("block_size")?;
        if block_size < 2 {
            bail!("{p}: block_size {block_size} must be at least 2 (anchor + one drafted token)");
        }
        let mask_token_id = need("mask_token_id")? as u32;
        let cfg = DrafterConfig {
            block_size,
            mask_token_id,
            target_layer_ids,
            num_layers,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            num_heads,
            num_kv_heads: uint("num_key_value_heads")?.unwrap_or(num_heads),
            head_dim,
            rope_theta,
            rms_norm_eps: float("rms_norm_eps").unwrap_or(1e-6) as f32,
            vocab_size: uint("vocab_size")?,
            layer_kinds,
            sliding_window,
            causal_override,
            num_target_layers: uint("num_target_layers")?,
        };
        if cfg.num_kv_heads == 0 || cfg.num_heads % cfg.num_kv_heads != 0 {
            bail!(
                "{p}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                cfg.num_heads,
                cfg.num_kv_heads
            );
        }
        Ok(cfg)
    }
}

/// The drafter family a checkpoint folder holds, told from its `config.json`: every command that
/// takes `--drafter DIR` dispatches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrafterFamily {
    /// z-lab DFlash (this module's [`DrafterConfig`]).
    DFlash,
    /// SpecForge / vLLM EAGLE-3 (`super::eagle3`, docs/eagle3.md).
    Eagle3,
    /// The DFlash authors' DFlash2 (`super::dflash2`, docs/dflash2.md).
    DFlash2,
}

impl DrafterFamily {
    /// EAGLE-3 when `architectures` names an EAGLE-3 class (`LlamaForCausalLMEagle3`,
    /// `Eagle3LlamaForCausalLM`, … : any name containing "eagle3", case-insensitive) or the config
    /// has an `eagle_config`; DFlash2 when `architectures` names `DFlash2DraftModel` or the config
    /// has a DFlash2 key ([`super::dflash2::config::is_dflash2`]); DFlash otherwise (its own
    /// parser then says what is missing).
    pub fn detect(dir: &Path) -> Result<DrafterFamily> {
        let (_, v) = super::gguf::config_json(dir)?;
        let eagle3_class = v
            .get("architectures")
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .any(|s| s.to_ascii_lowercase().contains("eagle3"))
            });
        Ok(if eagle3_class || v.get("eagle_config").is_some() {
            DrafterFamily::Eagle3
        } else if super::dflash2::config::is_dflash2(&v) {
            DrafterFamily::DFlash2
        } else {
            DrafterFamily::DFlash
        })
    }
}

/// A drafter checkpoint folder, with the training step read from its name (`step-20000`,
/// `checkpoint-1500`, `epoch_3_step_800` → the last number).
#[derive(Clone, Debug, Serialize)]
pub struct DrafterCheckpoint {
    pub dir: PathBuf,
    pub step: Option<u64>,
}

impl DrafterCheckpoint {
    pub fn step_from_name(dir: &Path) -> Option<u64> {
        let name = dir.file_name()?.to_string_lossy().to_string();
        let digits: Vec<u64> = name
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse().ok())
            .collect();
        digits.last().copied()
    }

    /// `path` is a checkpoint (has config.json) or a folder of checkpoints, sorted by step.
    pub fn discover(path: &Path) -> Result<Vec<DrafterCheckpoint>> {
        if path.join("config.json").is_file() || super::gguf::is_gguf(path) {
            return Ok(vec![DrafterCheckpoint {
                dir: path.to_path_buf(),
                step: Self::step_from_name(path),
            }]);
        }
        if !path.is_dir() {
            bail!(
                "{}: not a drafter checkpoint (no config.json, not a GGUF file) and not a folder",
                path.display()
            );
        }
        let mut out: Vec<DrafterCheckpoint> = std::fs::read_dir(path)
            .with_context(|| format!("{}: cannot list", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("config.json").is_file())
            .map(|dir| DrafterCheckpoint {
                step: Self::step_from_name(&dir),
                dir,
            })
            .collect();
        if out.is_empty() {
            bail!(
                "{}: no drafter checkpoints (folders with config.json) inside",
                path.display()
            );
        }
        out.sort_by(|a, b| a.step.cmp(&b.step).then(a.dir.cmp(&b.dir)));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn masks(extra: &[(&str, Value)]) -> Vec<LayerMask> {
        let mut v = json!({
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64,
            "dflash_config": {"block_size": 8, "mask_token_id": 5, "target_layer_ids": [0, 1]}
        });
        for (k, x) in extra {
            match k.strip_prefix("dflash_config.") {
                Some(k) => v["dflash_config"][k] = x.clone(),
                None => v[*k] = x.clone(),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
        let cfg = DrafterConfig::load(dir.path()).unwrap();
        (0..cfg.num_layers).map(|i| cfg.layer_mask(i)).collect()
    }

    const fn mask(causal_in_block: bool, window: Option<usize>) -> LayerMask {
        LayerMask {
            causal_in_block,
            window,
        }
    }

    #[test]
    fn layer_masks_follow_the_authors_newer_code_and_vllm() {
        // No override: the layer type decides both.
        assert_eq!(masks(&[]), [mask(true, Some(64)), mask(false, None)]);
        // The published layout (sliding layers, is_causal false): bidirectional inside the
        // block, the window kept over the context — it used to be dropped ("full, no window").
        assert_eq!(
            masks(&[("is_causal", json!(false))]),
            [mask(false, Some(64)), mask(false, None)]
        );
        // dflash_config.causal true: every layer causal; the full layer still has no window.
        assert_eq!(
            masks(&[("dflash_config.causal", json!(true))]),
            [mask(true, Some(64)), mask(true, None)]
        );
    }
}
