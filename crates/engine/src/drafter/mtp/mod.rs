//! Native multi-token-prediction heads of Qwen3.5 / Qwen3.6 / Qwen3-Next targets, read from the
//! target checkpoint itself (`mtp.*`, docs/mtp.md) and evaluated as a drafter that drafts K tokens
//! autoregressively per anchor: the same anchors, chain shape and records as EAGLE-3
//! (`super::eagle3`), so every metric, the web UI and the plugins read MTP runs unchanged.
//!
//! - [`head`]: which `config.json` keys / GGUF metadata say the target has a head, the checkpoint
//!   layout under its stored names (safetensors `mtp.*`), and the checks that refuse a missing or
//!   partial head before anything is computed;
//! - [`gguf`]: a GGUF target's head (llama.cpp's block L and `blk.{L}.nextn.*`) under those names;
//! - [`model`]: the head over the backend seam (the context rows, the K-step chain).
//!
//! The user names the drafter `target:mtp` (K = [`DEFAULT_STEPS`]) or `target:mtp:K` on `run
//! --drafter`: the head is the target's own, so there is no checkpoint folder.

pub mod gguf;
pub mod head;
pub mod model;

pub use head::MtpHeadConfig;
pub use model::{MtpContext, MtpDrafter};

use super::eval::EvalOptions;
use anyhow::{bail, Context, Result};

/// What `--drafter` names for the target's own MTP head (optionally followed by `:K`).
pub const DRAFTER_NAME: &str = "target:mtp";

/// Draft steps per round when `target:mtp` names no K: vLLM's and SGLang's MTP proposers run the
/// one MTP layer again for every step (vLLM `spec_step_idx % num_mtp_layers`), so K is a serving
/// setting, not a property of the checkpoint; 3 is draftlens's default (docs/mtp.md §3).
pub const DEFAULT_STEPS: usize = 3;

/// Most draft steps: the records' block is K + 1 positions, limited by the run store.
pub const MAX_STEPS: usize = super::config::MAX_BLOCK_SIZE as usize - 1;

/// K of a `--drafter` name: `Some(Ok(K))` for `target:mtp` / `target:mtp:K`, `Some(Err)` for a
/// `target:mtp:…` whose K is not an integer in 1..=[`MAX_STEPS`], `None` for any other name (a
/// checkpoint path).
pub fn steps_of_name(name: &str) -> Option<Result<usize>> {
    let rest = name.strip_prefix(DRAFTER_NAME)?;
    if rest.is_empty() {
        return Some(Ok(DEFAULT_STEPS));
    }
    let k = rest.strip_prefix(':')?;
    Some(check_steps_text(k).with_context(|| format!("--drafter {name}")))
}

fn check_steps_text(k: &str) -> Result<usize> {
    let steps: usize = k.parse().map_err(|_| {
        anyhow::anyhow!(
            "the number of draft steps K must be an integer in 1..={MAX_STEPS}, found {k:?}"
        )
    })?;
    check_steps(steps)?;
    Ok(steps)
}

/// K must be in 1..=[`MAX_STEPS`] (checked before anything is loaded).
pub fn check_steps(steps: usize) -> Result<()> {
    if steps == 0 || steps > MAX_STEPS {
        bail!(
            "the number of draft steps K = {steps} is out of range: an MTP chain drafts 1..={MAX_STEPS} tokens per round (the records' block of K + 1 positions is limited to {})",
            MAX_STEPS + 1
        );
    }
    Ok(())
}

/// The `--drafter` name of the head drafting `steps` tokens per round (what runs store as their
/// drafter path).
pub fn drafter_name(steps: usize) -> String {
    format!("{DRAFTER_NAME}:{steps}")
}

/// The evaluation options an MTP head cannot honour, refused before a run is created: `--mask
/// inclusive` is DFlash's training leak (docs/dflash.md §2.4 item 1), which has no MTP
/// counterpart.
pub fn check_options(opts: &EvalOptions) -> Result<()> {
    if opts.ctx_inclusive {
        bail!("--mask inclusive reproduces DFlash's training leak; it is not defined for an MTP head (docs/mtp.md §4)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
