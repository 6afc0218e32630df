//! `draftlens lint`: compatibility and leakage-risk findings for a drafter against a target,
//! computed from the config and tensor headers only (no weights are loaded, nothing runs).

use super::config::{DrafterConfig, DrafterFamily, LayerKind};
use crate::formats::WeightSource;
use crate::model::TargetFiles;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub code: &'static str,
    /// One sentence: what was found and why it matters.
    pub message: String,
}

fn f(severity: Severity, code: &'static str, message: String) -> Finding {
    Finding {
        severity,
        code,
        message,
    }
}

/// Every finding for drafter `dir` against `target`, most severe first. Errors mean the pair
/// cannot be evaluated; `run` refuses them before any compute. An EAGLE-3 checkpoint
/// ([`DrafterFamily`]) gets its own findings (`super::eagle3::lint`).
pub fn lint(target: &TargetFiles, dir: &Path) -> Result<Vec<Finding>> {
    // `target:mtp[:K]`: the target's own head, checked as `run` checks it before a run exists.
    if let Some(steps) = dir.to_str().and_then(super::mtp::steps_of_name) {
        return lint_mtp(target, steps?);
    }
    let mut out = match DrafterFamily::detect(dir)? {
        DrafterFamily::Eagle3 => super::eagle3::lint::lint(target, dir),
        DrafterFamily::DFlash2 => super::dflash2::lint::lint(target, dir),
        DrafterFamily::DFlash => lint_dflash(target, dir),
    }?;
    // A GGUF drafter (docs/gguf-drafters.md): what the mapping read from the file.
    if super::gguf::is_gguf(dir) {
        out.push(super::gguf::finding(dir)?);
    }
    Ok(out)
}

/// The findings of the target's native MTP head drafting `steps` tokens a round: an error when
/// the target has no usable head (the loader's own message, naming the file and tensor), else
/// what will be evaluated (docs/mtp.md).
fn lint_mtp(target: &TargetFiles, steps: usize) -> Result<Vec<Finding>> {
    let head = super::mtp::MtpHeadConfig::read(&target.identity.path, &target.spec)
        .and_then(|cfg| super::mtp::head::MtpWeights::open(&cfg).map(|_| cfg));
    Ok(vec![match head {
        Err(e) => f(Severity::Error, "mtp", format!("{e:#}")),
        Ok(cfg) => f(
            Severity::Info,
            "mtp",
            format!(
                "native MTP head ({} layer, declared by {}): drafts K = {steps} tokens a round from the target's final-normed state (docs/mtp.md)",
                cfg.num_layers, cfg.source
            ),
        ),
    }])
}

/// The findings of a DFlash checkpoint (also a DFlash2 checkpoint's backbone, whose own
/// findings `super::dflash2::lint` adds).
pub(crate) fn lint_dflash(target: &TargetFiles, dir: &Path) -> Result<Vec<Finding>> {
    // Read without the size limit: an absurd block_size is reported below, as an error.
    let cfg = DrafterConfig::read(dir)?;
    let spec = &target.spec;
    let mut out = Vec::new();
    use Severity::*;

    if cfg.hidden_size != spec.hidden_size {
        out.push(f(Error, "hidden-size", format!("drafter hidden_size {} differs from the target's {}: DFlash shares the target's embedding and LM head, so they must match", cfg.hidden_size, spec.hidden_size)));
    }
    if cfg.mask_token_id as usize >= spec.vocab_size {
        out.push(f(Error, "mask-token", format!("mask_token_id {} is outside the target's {} embedding rows: the block's MASK rows would have no embedding", cfg.mask_token_id, spec.vocab_size)));
    } else if let Some(tok) = &target.tokenizer {
        if let Some(name) = tok.id_to_token(cfg.mask_token_id) {
            let special = name.starts_with('<') && name.ends_with('>');
            out.push(f(if special { Info } else { Warning }, "mask-token", format!("mask_token_id {} is the target token {name:?}{}", cfg.mask_token_id, if special { "" } else { ": an ordinary text token, so a real occurrence in the context is indistinguishable from MASK" })));
        }
    }
    for &id in &cfg.target_layer_ids {
        if id >= spec.num_layers {
            out.push(f(Error, "tap-range", format!("target_layer_ids contains {id}, but the target has only {} decoder layers (ids 0..{})", spec.num_layers, spec.num_layers - 1)));
        }
    }
    let l = spec.num_layers;
    if cfg.target_layer_ids.iter().any(|&i| i + 1 == l) {
        out.push(f(Warning, "tap-last-layer", format!("taps include the target's last decoder layer {}: its state at position t nearly encodes token t+1, so any mask leak inflates training metrics far above deployment (docs/dflash.md §1.2)", l - 1)));
    } else if cfg.target_layer_ids.iter().any(|&i| i + 2 == l) {
        out.push(f(Info, "tap-late-layer", format!("taps include layer {}, second to last: higher leakage sensitivity than the usual ≤ L−3 taps", l - 2)));
    }
    if let Some(n) = cfg.num_target_layers {
        if n != l {
            out.push(f(Warning, "num-target-layers", format!("config says num_target_layers = {n} but the target has {l}: the drafter was probably trained for another target")));
        }
    }
    if let Some(v) = cfg.vocab_size {
        if v != spec.vocab_size {
            out.push(f(Warning, "vocab-size", format!("drafter vocab_size {v} differs from the target's {}: check the drafter was trained for this tokenizer", spec.vocab_size)));
        }
    }
    if let Some(problem) = cfg.block_size_problem() {
        out.push(f(Error, "block-size", problem));
    } else if cfg.block_size > 32 {
        out.push(f(
            Info,
            "block-size",
            format!(
                "block_size {} is unusually large (published drafters use 8–16)",
                cfg.block_size
            ),
        ));
    }
    if cfg.layer_kinds.contains(&LayerKind::Sliding) {
        let causal = match cfg.causal_override {
            Some(true) => "causal inside the block (is_causal: true)",
            Some(false) => "bidirectional inside the block (is_causal: false)",
            None => "causal inside the block (no is_causal: the layer type decides)",
        };
        out.push(f(Info, "sliding", format!("sliding-window layers are evaluated {causal} with window {:?} over the context (the authors' newer code and vLLM; the April z-lab code had no window)", cfg.sliding_window)));
    }
    if (cfg.rope_theta - spec.rope_theta).abs() > f32::EPSILON * spec.rope_theta {
        out.push(f(Info, "rope", format!("drafter RoPE θ = {} (its own), target θ = {}: draftlens uses the drafter's, as deployment does", cfg.rope_theta, spec.rope_theta)));
    }
    match super::gguf::open_weights(dir) {
        Err(e) => out.push(f(Error, "weights", format!("{e:#}"))),
        Ok(w) => {
            let infos = w.tensors();
            if infos.iter().any(|t| t.dtype == "F16") {
                out.push(f(Warning, "fp16", "weights are stored in fp16: the feature fusion overflows fp16 on Qwen3-class targets and acceptance collapses (lmdeploy #4991); prefer bf16".into()));
            }
            match infos.iter().find(|t| t.name == "fc.weight") {
                None => out.push(f(Error, "weights", format!("{}: tensor fc.weight is missing", dir.display()))),
                Some(t) if t.shape != [cfg.hidden_size, cfg.target_layer_ids.len() * spec.hidden_size] => out.push(f(
                    Error,
                    "fc-shape",
                    format!("fc.weight has shape {:?}, expected [{}, {}] for {} taps of the target's hidden size {}", t.shape, cfg.hidden_size, cfg.target_layer_ids.len() * spec.hidden_size, cfg.target_layer_ids.len(), spec.hidden_size),
                )),
                _ => {}
            }
            // Every other tensor the loader reads (the weights themselves are loaded only when a
            // prompt needs the drafter): the first one missing or misshapen is the error.
            let file = super::gguf::weights_file(dir);
            let plan = super::model::tensor_plan(&cfg, spec.hidden_size);
            let problem =
                plan.iter()
                    .filter(|(n, _)| n != "fc.weight")
                    .find_map(
                        |(name, shape)| match infos.iter().find(|t| &t.name == name) {
                            None => Some(format!("{}: tensor {name} is missing", file.display())),
                            Some(t) if &t.shape != shape => Some(format!(
                                "{}: tensor {name} has shape {:?}, expected {shape:?}",
                                file.display(),
                                t.shape
                            )),
                            Some(_) => None,
                        },
                    );
            if let Some(p) = problem {
                out.push(f(Error, "weights", p));
            }
            if infos
                .iter()
                .any(|t| t.name.contains("embed_tokens") || t.name.contains("lm_head"))
            {
                out.push(f(Info, "own-embedding", "the checkpoint carries its own embedding or LM head; DFlash uses the target's, so these are ignored".into()));
            }
        }
    }
    if dir.join("tokenizer.json").exists() {
        match crate::tokenizer::TextTokenizer::from_hf_dir(dir) {
            Ok(dt) => {
                if let Some(tt) = &target.tokenizer {
                    if dt.vocab_size() != tt.vocab_size() {
                        out.push(f(
                            Error,
                            "tokenizer",
                            format!(
                                "drafter tokenizer has {} ids, the target's {}: they disagree",
                                dt.vocab_size(),
                                tt.vocab_size()
                            ),
                        ));
                    }
                }
            }
            Err(e) => out.push(f(
                Warning,
                "tokenizer",
                format!("drafter tokenizer unreadable: {e:#}"),
            )),
        }
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity));
    Ok(out)
}
