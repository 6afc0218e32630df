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

/// Attention of one drafter layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Bidirectional inside the block.
    Full,
    /// Causal inside the block, with a window over the context (z-lab newer code, vLLM).
    Sliding,
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
    /// `num_target_layers` as written in the checkpoint (only informative).
    pub num_target_layers: Option<usize>,
}

impl DrafterConfig {
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
    pub(super) fn read(dir: &Path) -> Result<DrafterConfig> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("{}: cannot read the drafter config", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
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
        // Per-layer kinds; `is_causal` / dflash_config.causal overrides every layer.
        let mut layer_kinds: Vec<LayerKind> = match v.get("layer_types") {
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
        if let Some(c) = pick("causal")
            .or_else(|| v.get("is_causal"))
            .and_then(|x| x.as_bool())
        {
            layer_kinds = vec![
                if c {
                    LayerKind::Sliding
                } else {
                    LayerKind::Full
                };
                num_layers
            ];
        }
        if layer_kinds.contains(&LayerKind::Sliding)
            && sliding_window.is_none()
            && !v
                .get("is_causal")
                .is_some_and(|x| x.as_bool() == Some(true))
        {
            tracing::warn!("{p}: sliding layers without sliding_window: treated as causal in the block, no window");
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
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("{}: cannot read the drafter config", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
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
        if path.join("config.json").is_file() {
            return Ok(vec![DrafterCheckpoint {
                dir: path.to_path_buf(),
                step: Self::step_from_name(path),
            }]);
        }
        if !path.is_dir() {
            bail!(
                "{}: not a drafter checkpoint (no config.json) and not a folder",
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
