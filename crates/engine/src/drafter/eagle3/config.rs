//! `config.json` of an EAGLE-3 drafter in the SpecForge / vLLM `LlamaForCausalLMEagle3` layout
//! (docs/eagle3.md §1): a Llama-style config with `draft_vocab_size`, optional
//! `target_hidden_size`, and the taps in `eagle_config.eagle_aux_hidden_state_layer_ids`.
//!
//! Every key that would make the draft differ from what the engines compute and that draftlens
//! does not implement is refused here, naming the key, so that no run measures another model.

use crate::drafter::config::MAX_BLOCK_SIZE;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// The chain length when the config does not say (`num_speculative_tokens`): the length
/// SpecForge trains EAGLE-3 with (`OnlineEagle3Model(length=7)`, its test-time-training unroll)
/// and the chain of the EAGLE-3 baseline in the DFlash paper's table (z-lab/dflash README).
pub const DEFAULT_STEPS: usize = 7;

/// Where the tap ids came from (`lint` says which, because the engines disagree on the
/// convention of one of them: docs/eagle3.md §1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TapSource {
    /// `eagle_config.eagle_aux_hidden_state_layer_ids`: decoder-layer outputs, as SpecForge
    /// writes them and SGLang reads them (`set_eagle3_layers_to_capture` adds 1 to get the layer
    /// whose input it captures).
    EagleConfig,
    /// Top-level `eagle_aux_hidden_state_layer_ids`: vLLM's convention, the layer whose *input*
    /// is captured (id j = output of layer j − 1); converted by subtracting 1.
    VllmTopLevel,
    /// Neither key: the engines' default low / middle / high taps for the target's depth L,
    /// outputs of layers [1, L/2 − 1, L − 4] (vLLM captures the inputs of [2, L/2, L − 3]).
    Default,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Eagle3Config {
    /// `architectures[0]` as written ("" when absent).
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    /// The target vocabulary the maps index (`vocab_size`), when the config says.
    pub vocab_size: Option<usize>,
    /// Rows of the drafter's LM head (`draft_vocab_size`; `None`: the full `vocab_size`, as vLLM
    /// defaults it).
    pub draft_vocab_size: Option<usize>,
    /// `target_hidden_size` as written (the taps' width; `None`: `hidden_size`).
    pub target_hidden_size: Option<usize>,
    /// The low / middle / high taps as 0-based decoder-layer outputs (HF `hidden_states[id+1]`,
    /// the convention of DFlash's `target_layer_ids`), resolved for the target's depth.
    pub tap_layer_ids: Vec<usize>,
    pub tap_source: TapSource,
    /// Draft steps per round, K (`num_speculative_tokens`, else [`DEFAULT_STEPS`]).
    pub steps: usize,
    pub steps_from_config: bool,
}

impl Eagle3Config {
    /// The records' block size: the anchor plus K drafted positions.
    pub fn block_size(&self) -> usize {
        self.steps + 1
    }

    /// The draft vocabulary size, given the target's vocabulary.
    pub fn draft_vocab(&self, target_vocab: usize) -> usize {
        self.draft_vocab_size
            .or(self.vocab_size)
            .unwrap_or(target_vocab)
    }

    /// [`Eagle3Config::read`], then the taps checked against the target's depth: a tap out of
    /// range is an error naming the key (`lint` reports it as a finding instead).
    pub fn load(dir: &Path, target_layers: usize) -> Result<Eagle3Config> {
        let cfg = Self::read(dir, target_layers)?;
        if let Some(problem) = cfg.tap_problem(target_layers) {
            bail!("{}: {problem}", dir.join("config.json").display());
        }
        Ok(cfg)
    }

    /// Why the taps do not fit a target of `target_layers` decoder layers, if they do not.
    pub fn tap_problem(&self, target_layers: usize) -> Option<String> {
        let bad = self.tap_layer_ids.iter().find(|&&id| id >= target_layers)?;
        Some(format!(
            "{} holds tap {bad} (a decoder-layer output id{}), but the target has only {target_layers} decoder layers (ids 0..{})",
            self.tap_key(),
            if self.tap_source == TapSource::VllmTopLevel { ", after vLLM's id − 1" } else { "" },
            target_layers.saturating_sub(1)
        ))
    }

    /// The config key the taps came from, for messages.
    pub fn tap_key(&self) -> &'static str {
        match self.tap_source {
            TapSource::EagleConfig => "eagle_config.eagle_aux_hidden_state_layer_ids",
            TapSource::VllmTopLevel => "eagle_aux_hidden_state_layer_ids",
            TapSource::Default => "the default taps [1, L/2 − 1, L − 4]",
        }
    }

    /// Parse `<dir>/config.json` for a target of `target_layers` decoder layers (needed only to
    /// resolve the default taps).
    pub fn read(dir: &Path, target_layers: usize) -> Result<Eagle3Config> {
        // A GGUF drafter's metadata arrives translated to this layout (`crate::drafter::gguf`).
        let (path, v) = crate::drafter::gguf::config_json(dir)?;
        let p = path.display();
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        let uint = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .with_context(|| format!("{p}: {k} must be a non-negative integer, found {x}")),
            }
        };
        let need = |k: &str| uint(k)?.with_context(|| format!("{p}: missing {k}"));
        let flag = |x: Option<&Value>| x.and_then(Value::as_bool);

        if get("speculators_model_type").is_some() || get("transformer_layer_config").is_some() {
            bail!("{p}: a speculators-format checkpoint (speculators_model_type / transformer_layer_config): draftlens reads the SpecForge / vLLM LlamaForCausalLMEagle3 layout (docs/eagle3.md §1)");
        }
        let eagle = get("eagle_config");
        // What the engines compute and draftlens does not: refused, never ignored.
        let layers = uint("num_hidden_layers")?.unwrap_or(1);
        if layers != 1 {
            bail!("{p}: num_hidden_layers {layers}: draftlens evaluates the one-decoder-layer EAGLE-3 layout (midlayer.*)");
        }
        if let Some(act) = get("hidden_act") {
            if act.as_str() != Some("silu") {
                bail!("{p}: hidden_act {act} is not supported (the SwiGLU MLP uses silu)");
            }
        }
        for key in [
            "attention_bias",
            "mlp_bias",
            "fc_norm",
            "norm_before_residual",
        ] {
            if flag(get(key)) == Some(true) {
                bail!("{p}: {key} = true is not supported by draftlens's EAGLE-3 drafter (docs/eagle3.md §1.3)");
            }
        }
        if flag(get("norm_output")) == Some(false) {
            bail!("{p}: norm_output = false is not supported (the LM head reads the final norm's output)");
        }
        if flag(eagle.and_then(|e| e.get("use_aux_hidden_state"))) == Some(false) {
            bail!("{p}: eagle_config.use_aux_hidden_state = false: without the fused low / middle / high taps this is not an EAGLE-3 drafter");
        }
        if let Some(scale) = get("logit_scale")
            .and_then(Value::as_f64)
            .filter(|&x| x != 1.0)
        {
            bail!("{p}: logit_scale {scale} is not supported (vLLM scales the draft logits by it)");
        }
        if let Some(scaling) = get("rope_scaling") {
            let kind = scaling
                .get("rope_type")
                .or_else(|| scaling.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            if kind != "default" {
                bail!("{p}: rope_scaling of type {kind:?} is not implemented: the draft's positions would rotate otherwise than in serving");
            }
        }

        let (tap_layer_ids, tap_source) = tap_layer_ids(&v, &p.to_string(), target_layers)?;
        let hidden_size = need("hidden_size")?;
        let num_heads = need("num_attention_heads")?;
        if num_heads == 0 {
            bail!("{p}: num_attention_heads is 0");
        }
        let num_kv_heads = uint("num_key_value_heads")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            bail!("{p}: num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}");
        }
        let rope_theta = get("rope_theta")
            .or_else(|| get("rope_parameters").and_then(|r| r.get("rope_theta")))
            .and_then(Value::as_f64)
            // transformers' LlamaConfig default.
            .unwrap_or(10_000.0) as f32;
        let steps = uint("num_speculative_tokens")?;
        let cfg = Eagle3Config {
            architecture: v
                .get("architectures")
                .and_then(|a| a.get(0))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            num_heads,
            num_kv_heads,
            head_dim: uint("head_dim")?.unwrap_or(hidden_size / num_heads),
            rope_theta,
            rms_norm_eps: get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6) as f32,
            vocab_size: uint("vocab_size")?,
            draft_vocab_size: uint("draft_vocab_size")?,
            target_hidden_size: uint("target_hidden_size")?,
            tap_layer_ids,
            tap_source,
            steps: steps.unwrap_or(DEFAULT_STEPS),
            steps_from_config: steps.is_some(),
        };
        if cfg.steps == 0 || cfg.block_size() > MAX_BLOCK_SIZE as usize {
            bail!(
                "{p}: num_speculative_tokens {} must be 1..{} (the run store's block limit)",
                cfg.steps,
                MAX_BLOCK_SIZE - 1
            );
        }
        if let (Some(d), Some(t)) = (cfg.draft_vocab_size, cfg.vocab_size) {
            if d > t {
                bail!("{p}: draft_vocab_size {d} is larger than vocab_size {t}");
            }
        }
        Ok(cfg)
    }
}

/// The three taps as decoder-layer outputs, and where they came from (see [`TapSource`]).
fn tap_layer_ids(v: &Value, p: &str, target_layers: usize) -> Result<(Vec<usize>, TapSource)> {
    let list = |key: &str, x: &Value| -> Result<Vec<i64>> {
        x.as_array()
            .with_context(|| format!("{p}: {key} must be a list, found {x}"))?
            .iter()
            .map(|i| {
                i.as_i64()
                    .with_context(|| format!("{p}: {key} must hold integers, found {i}"))
            })
            .collect()
    };
    let in_eagle = v
        .get("eagle_config")
        .and_then(|e| e.get("eagle_aux_hidden_state_layer_ids"))
        .filter(|x| !x.is_null());
    let top = v
        .get("eagle_aux_hidden_state_layer_ids")
        .filter(|x| !x.is_null());
    let (ids, source) = if let Some(x) = in_eagle {
        let key = "eagle_config.eagle_aux_hidden_state_layer_ids";
        let ids = list(key, x)?;
        if let Some(bad) = ids.iter().find(|&&i| i < 0) {
            bail!("{p}: {key} holds {bad}, a negative layer id");
        }
        (ids, TapSource::EagleConfig)
    } else if let Some(x) = top {
        let key = "eagle_aux_hidden_state_layer_ids";
        let ids = list(key, x)?;
        if let Some(bad) = ids.iter().find(|&&i| i < 1) {
            bail!("{p}: {key} holds {bad}: in vLLM's convention id j is the input of layer j, so {bad} is the embedding output, which no decoder-layer tap can hold");
        }
        (ids.iter().map(|i| i - 1).collect(), TapSource::VllmTopLevel)
    } else {
        if target_layers < 4 {
            bail!("{p}: no eagle_config.eagle_aux_hidden_state_layer_ids, and the default taps [1, L/2 − 1, L − 4] need a target of at least 4 layers (this one has {target_layers}): set the taps in the config");
        }
        let l = target_layers as i64;
        (vec![1, l / 2 - 1, l - 4], TapSource::Default)
    };
    if ids.len() != 3 {
        bail!(
            "{p}: EAGLE-3 fuses exactly 3 taps (low, middle, high: fc takes 3 × the target's hidden size), found {} ({ids:?})",
            ids.len()
        );
    }
    Ok((ids.into_iter().map(|i| i as usize).collect(), source))
}
