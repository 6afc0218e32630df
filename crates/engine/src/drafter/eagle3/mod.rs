//! EAGLE-3 drafters in the SpecForge / vLLM `LlamaForCausalLMEagle3` layout (docs/eagle3.md):
//! the checkpoint's config ([`config`]) and draft-vocabulary maps ([`vocab`]), the K-step draft
//! chain over the backend seam ([`model`]), its dynamic draft tree evaluated offline ([`tree`],
//! `run --eagle3-tree`), and `lint`'s findings ([`lint`]). The per-anchor
//! evaluation (`super::eval`) drafts them at the same anchors and records the same columns as
//! DFlash, so every metric, the web UI and the plugins read their runs unchanged.

pub mod config;
pub mod lint;
pub mod model;
pub mod tree;
pub mod vocab;

pub use config::Eagle3Config;
pub use model::{Eagle3Context, Eagle3Drafter};
pub use tree::TreeShape;

use super::eval::EvalOptions;
use anyhow::{bail, Result};

/// The evaluation options an EAGLE-3 drafter cannot honour, refused before a run is created:
/// `--mask inclusive` is DFlash's training leak (docs/dflash.md §2.4 item 1), which has no
/// EAGLE-3 counterpart here (docs/eagle3.md §4).
pub fn check_options(opts: &EvalOptions) -> Result<()> {
    if opts.ctx_inclusive {
        bail!("--mask inclusive reproduces DFlash's training leak; it is not defined for an EAGLE-3 drafter (docs/eagle3.md §4)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
