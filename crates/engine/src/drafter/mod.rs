//! Drafters (DFlash; EAGLE-3 in `eagle3`): checkpoint loading, the forward pass, exact per-anchor
//! evaluation, live speculative decoding (the native metrics over its records are in
//! `draftlens-results`).

pub(crate) mod chain;
pub mod config;
pub mod cost_bench;
pub mod dflash2;
pub mod eagle3;
pub mod eval;
pub mod gguf;
pub mod model;
pub mod mtp;

pub use config::{DrafterCheckpoint, DrafterConfig};
pub use eval::{AnchorPolicy, Drafter, EvalOptions, Labels};
pub use model::{DFlashDrafter, DraftOptions};
pub mod lint;
pub mod live;
pub mod random;
pub mod records_cache;
pub mod run;
pub mod run_identity;
pub mod sampling;
pub mod speed;
pub mod vocab;
