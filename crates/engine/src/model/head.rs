//! The two ends of a target that a drafter borrows: the input embedding and the LM head.
//!
//! A DFlash drafter embeds its block with the target's `embed_tokens` and scores with the
//! target's LM head (docs/reference-drafters.md). When every target pass a run needs is cached,
//! only these two matrices have to be on the device, not the decoder layers: [`TargetHead`]
//! loads just them (for Qwen3-8B 2 × 1.2 GB of bf16 instead of 16 GB), and [`EmbedHead`] lets the
//! drafter use either that or a fully loaded [`TargetModel`].

use super::config::ModelSpec;
use super::transformer::{load_matrix, TargetModel};
use crate::backend::{Backend, TopK};
use crate::formats::WeightSource;
use anyhow::Result;

/// The target's input embedding `[vocab, D]` and LM head `[vocab, D]`.
pub trait EmbedHead<B: Backend>: Send + Sync {
    fn embed_tokens(&self) -> &B::Matrix;
    /// The LM head (the embedding itself when tied).
    fn head(&self) -> &B::Matrix;
    /// Rows of the embedding / LM head (the model's padded vocabulary).
    fn vocab_size(&self) -> usize;
    /// Top-k next-token log-probabilities for every row of `hidden` (final-norm states).
    fn logits_topk(&self, be: &B, hidden: &B::Tensor, k: usize) -> Result<TopK> {
        be.lm_head_topk(hidden, self.head(), k)
    }
}

impl<B: Backend> EmbedHead<B> for TargetModel<B> {
    fn embed_tokens(&self) -> &B::Matrix {
        &self.embed_tokens
    }
    fn head(&self) -> &B::Matrix {
        TargetModel::head(self)
    }
    fn vocab_size(&self) -> usize {
        self.spec.vocab_size
    }
}

/// Only the embedding and LM head of a target, loaded by their Hugging Face names.
pub struct TargetHead<B: Backend> {
    pub embed_tokens: B::Matrix,
    /// `None` when tied to `embed_tokens`.
    pub lm_head: Option<B::Matrix>,
    pub vocab_size: usize,
}

impl<B: Backend> TargetHead<B> {
    pub fn load(be: &B, spec: &ModelSpec, src: &dyn WeightSource) -> Result<Self> {
        let (v, d) = (spec.vocab_size, spec.hidden_size);
        let embed_tokens = load_matrix(be, src, "model.embed_tokens.weight", v, d)?;
        let lm_head = if src.contains("lm_head.weight") {
            Some(load_matrix(be, src, "lm_head.weight", v, d)?)
        } else {
            None
        };
        Ok(TargetHead {
            embed_tokens,
            lm_head,
            vocab_size: v,
        })
    }
}

impl<B: Backend> EmbedHead<B> for TargetHead<B> {
    fn embed_tokens(&self) -> &B::Matrix {
        &self.embed_tokens
    }
    fn head(&self) -> &B::Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}
