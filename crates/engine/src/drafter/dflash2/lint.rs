//! `draftlens lint` for a DFlash2 checkpoint: the DFlash backbone's findings (the same checks
//! as a DFlash drafter's), what DFlash2 adds and how its proposals are chosen, and a missing or
//! partial candidate selector or convolution as an error, from the config and the tensor
//! headers only.

use super::config::DFlash2Config;
use super::model::{plan_problem, CODEBOOKS, HIDDEN_PROJECTION};
use crate::drafter::gguf::{open_weights, weights_file};
use crate::drafter::lint::{lint_dflash, Finding, Severity};
use crate::formats::WeightSource;
use crate::model::TargetFiles;
use anyhow::Result;
use std::path::Path;

fn f(severity: Severity, code: &'static str, message: String) -> Finding {
    Finding {
        severity,
        code,
        message,
    }
}

/// Every finding for DFlash2 drafter `dir` against `target`, most severe first. A config
/// without a DFlash2 key it needs is an error return naming the file and the key.
pub fn lint(target: &TargetFiles, dir: &Path) -> Result<Vec<Finding>> {
    use Severity::*;
    let cfg = DFlash2Config::read(dir)?;
    // The backbone's findings; its tensor check covers the DFlash tensors only, the whole plan
    // is checked below.
    let mut out: Vec<Finding> = lint_dflash(target, dir)?
        .into_iter()
        .filter(|x| !(x.code == "weights" && x.severity == Error))
        .collect();
    let file = weights_file(dir);
    out.push(f(Info, "dflash2", format!(
        "DFlash2 drafter: grouped dynamic causal convolutions (kernel {}, groups of {} channels) around each layer's attention and MLP; a candidate selector re-scores the top {} of each drafted position at rank {}; logits x {}{}, block embeddings x {}",
        cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_top_k, cfg.selector_rank, cfg.output_multiplier,
        cfg.final_logit_softcapping.map(|c| format!(", soft-capped at {c}")).unwrap_or_default(),
        cfg.input_embedding_scale,
    )));
    out.push(f(Info, "path-dependent", "proposals are path-dependent: each drafted token is chosen given the token chosen before it, so a position's candidates are conditioned on the drafter's own path, not on the target's tokens; replayed A and τ are exact for this greedy path, while DDTree-N over the stored candidates is only a surrogate for DFlash2 (docs/dflash2.md §3)".into()));
    match open_weights(dir) {
        Err(e) => out.push(f(Error, "weights", format!("{e:#}"))),
        Ok(src) => {
            let names: Vec<String> = src.tensors().into_iter().map(|t| t.name).collect();
            let selector: Vec<&str> = [HIDDEN_PROJECTION, CODEBOOKS[0], CODEBOOKS[1]]
                .into_iter()
                .filter(|base| {
                    !names
                        .iter()
                        .any(|n| n == base || *n == format!("{base}.weight"))
                })
                .collect();
            if selector.len() == 3 {
                out.push(f(Error, "selector", format!("{}: no candidate selector tensors ({}): this DFlash2 checkpoint's proposals cannot be computed; serving engines that ignore the selector fall back to plain DFlash proposals silently (docs/dflash2.md §5)", file.display(), selector.join(", "))));
            } else if !selector.is_empty() {
                out.push(f(Error, "selector", format!("{}: the candidate selector is partial, {} missing: serving engines that ignore the selector fall back to plain DFlash proposals silently (docs/dflash2.md §5)", file.display(), selector.join(", "))));
            } else if let Some(problem) = plan_problem(
                &cfg,
                &src,
                target.spec.hidden_size,
                &file.display().to_string(),
            ) {
                out.push(f(Error, "weights", problem));
            }
            if cfg.vocab_size < target.spec.vocab_size {
                out.push(f(Error, "selector-vocab", format!("config.json: vocab_size {} is under the target's {} LM-head rows: a candidate would have no codebook row", cfg.vocab_size, target.spec.vocab_size)));
            }
        }
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity));
    Ok(out)
}
