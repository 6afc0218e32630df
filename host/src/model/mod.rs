//! Target models: one generic pre-norm decoder covering LLaMA, Qwen2 and Qwen3, written over
//! the [`crate::backend::Backend`] seam.

pub mod capture;
pub mod config;
pub mod head;
pub mod transformer;

pub use capture::{Capture, Captured};
pub use config::{Arch, ModelSpec};
pub mod load;
pub mod random;

pub use head::{EmbedHead, TargetHead};
pub use load::{TargetFiles, TargetIdentity};
pub use transformer::{KvCache, TargetModel};
