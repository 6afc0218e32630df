//! DFlash2 drafters, the DFlash authors' successor (PyPI `dflash==0.1.0`, `DFlash2DraftModel`;
//! docs/dflash2.md): the DFlash backbone (`super::model`, reused as it is) with grouped dynamic
//! causal convolutions around attention and MLP ([`conv`]) and a candidate selector that
//! chooses each drafted token given the one before it ([`selector`]), so proposals are
//! path-dependent. [`config`] reads the checkpoint's keys, [`model`] loads it and drafts
//! through the backend seam, [`lint`] says what it found. The per-anchor evaluation
//! (`super::eval`) drafts DFlash2 at the same anchors and records the same columns as DFlash.

pub mod config;
pub mod conv;
pub mod lint;
pub mod model;
pub mod selector;

pub use config::DFlash2Config;
pub use model::DFlash2Drafter;

use super::eval::EvalOptions;
use anyhow::{bail, Result};
use std::path::Path;

/// The evaluation options a DFlash2 drafter at `dir` cannot honour, refused before a run is
/// created: more candidates per position than its selector scores (`--top-k` over
/// `selector_top_k`), and sampling at T > 0, whose draft distribution is the selector's along a
/// *sampled* path (docs/dflash2.md §4).
pub fn check_options(dir: &Path, opts: &EvalOptions) -> Result<()> {
    let cfg = DFlash2Config::load(dir)?;
    if opts.top_k > cfg.selector_top_k {
        bail!(
            "--top-k {}: a DFlash2 drafter proposes from its selector's {} candidates per position ({}: selector_top_k); give --top-k {} or less",
            opts.top_k,
            cfg.selector_top_k,
            dir.join("config.json").display(),
            cfg.selector_top_k
        );
    }
    if opts.sampling.is_some() {
        bail!("--temperature: sampled evaluation of DFlash2 drafters is not implemented (their draft distribution follows a sampled path; docs/dflash2.md §4)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
