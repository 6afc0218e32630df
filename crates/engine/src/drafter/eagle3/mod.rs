//! EAGLE-3 drafters in the SpecForge / vLLM `LlamaForCausalLMEagle3` layout (docs/eagle3.md):
//! the checkpoint's config ([`config`]) and draft-vocabulary maps ([`vocab`]), the K-step draft
//! chain over the backend seam ([`model`]), and `lint`'s findings ([`lint`]). The per-anchor
//! evaluation (`super::eval`) drafts them at the same anchors and records the same columns as
//! DFlash, so every metric, the web UI and the plugins read their runs unchanged.

pub mod config;
pub mod lint;
pub mod model;
pub mod vocab;

pub use config::Eagle3Config;
pub use model::{Eagle3Context, Eagle3Drafter};

#[cfg(test)]
mod tests;
