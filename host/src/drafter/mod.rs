//! DFlash drafters: checkpoint loading, the forward pass, exact per-anchor evaluation, live
//! speculative decoding, and native summary metrics.

pub mod config;
pub mod eval;
pub mod metrics;
pub mod model;

pub use config::{DrafterCheckpoint, DrafterConfig};
pub use eval::{AnchorPolicy, Drafter, EvalOptions, Labels};
pub use model::{DFlashDrafter, DraftOptions};
pub mod lint;
pub mod live;
pub mod random;
pub mod records_cache;
pub mod run;
