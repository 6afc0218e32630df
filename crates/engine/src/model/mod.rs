//! Target models: one generic pre-norm decoder covering LLaMA, Qwen2, Qwen3 and the Qwen3.5 /
//! Qwen3-Next hybrids, written over
//! the [`crate::backend::Backend`] seam.

pub mod capture;
pub mod config;
pub mod decoder;
pub mod flops;
pub mod gdn;
pub mod gpt_oss;
pub mod head;
pub mod hybrid;
pub mod kv_cache;
pub mod moe;
mod params;
pub mod step_recorder;
pub mod transformer;

pub use capture::{Capture, Captured};
pub use config::{Arch, ModelSpec};
pub mod load;
pub mod random;
pub mod random_target;

pub use head::{EmbedHead, TargetHead};
pub use load::{TargetFiles, TargetIdentity};
pub use step_recorder::StepRecorder;
pub use transformer::{KvCache, TargetModel};
