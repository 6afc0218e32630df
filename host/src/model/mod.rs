//! Target models: one generic pre-norm decoder covering LLaMA, Qwen2 and Qwen3, written over
//! the [`crate::backend::Backend`] seam.

pub mod config;
