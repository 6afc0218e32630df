//! The values the [`Backend`] methods take and return: errors callers tell apart, rotary
//! settings, attention head layouts, top-k results and the per-call parameter bundles.

use super::{Backend, GdnProfile, GdnShape};
use anyhow::{ensure, Result};

/// Backend failures that callers tell apart by kind (everything else is a plain error with
/// context).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No usable CUDA on this machine or in this binary (no driver, NVRTC or cuBLAS library, no
    /// such device, or a build without the `cuda` feature); the text is the reason. Printed as is
    /// by the CLI, and the reason the GPU tests skip.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
}

impl BackendError {
    /// Whether `e` (anywhere in its chain) says that CUDA is unavailable.
    pub fn is_cuda_unavailable(e: &anyhow::Error) -> bool {
        e.chain().any(|c| {
            matches!(
                c.downcast_ref::<BackendError>(),
                Some(BackendError::CudaUnavailable(_))
            )
        })
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RopeStyle {
    /// Hugging Face / NeoX: dimension i pairs with i + rotary_dim/2.
    RotateHalf,
    /// GPT-J / llama.cpp "norm": dimension 2i pairs with 2i+1.
    Interleaved,
}

/// Rotary embedding settings of one model.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rope {
    pub theta: f32,
    pub head_dim: usize,
    /// Dimensions rotated at the start of each head (= head_dim unless partial rotary).
    pub rotary_dim: usize,
    pub style: RopeStyle,
}

/// Head layout of an attention call (grouped-query attention when `kv_heads < heads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// The checks every backend's attention makes before touching memory: whole KV groups, q as
    /// `[T, heads·head_dim]`, k and v as `[S, kv_heads·head_dim]` with the same S.
    /// Arguments are (rows, cols) of q, k and v.
    pub fn check(&self, q: (usize, usize), k: (usize, usize), v: (usize, usize)) -> Result<()> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = *self;
        ensure!(
            kv_heads > 0 && heads % kv_heads == 0,
            "attention: {heads} heads not divisible by {kv_heads} KV heads"
        );
        ensure!(
            q.1 == heads * hd,
            "attention: q has {} columns, expected {}",
            q.1,
            heads * hd
        );
        ensure!(
            k.1 == kv_heads * hd && v.1 == kv_heads * hd,
            "attention: k/v have {}/{} columns, expected {}",
            k.1,
            v.1,
            kv_heads * hd
        );
        ensure!(k.0 == v.0, "attention: k has {} rows, v has {}", k.0, v.0);
        Ok(())
    }
}

/// Top-k of log-softmax over the vocabulary, per row: `ids[r*k + j]`, `logprobs[r*k + j]`,
/// sorted by decreasing log-probability (ties: lower id first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopK {
    pub rows: usize,
    pub k: usize,
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

impl TopK {
    pub fn row_ids(&self, r: usize) -> &[u32] {
        &self.ids[r * self.k..(r + 1) * self.k]
    }
    pub fn row_logprobs(&self, r: usize) -> &[f32] {
        &self.logprobs[r * self.k..(r + 1) * self.k]
    }
    /// The top-1 id of every row.
    pub fn argmax(&self) -> Vec<u32> {
        (0..self.rows).map(|r| self.ids[r * self.k]).collect()
    }
}

/// Per-head q/k RMSNorm weights (`[1, head_dim]` each) of an attention (Qwen3), for
/// [`Backend::attention_varlen_qkv`].
pub struct QkNorm<'a, T> {
    pub q: &'a T,
    pub k: &'a T,
    pub eps: f32,
}

/// Per-layer constants of a Gated DeltaNet core, for [`Backend::gated_delta_rule`].
pub struct GdnParams<'a, B: Backend + ?Sized> {
    /// `A_log` `[v_heads]` (f32 in real checkpoints): the decay rate is `exp(A_log)`.
    pub a_log: &'a B::F32Buf,
    /// `dt_bias` `[v_heads]`.
    pub dt_bias: &'a B::F32Buf,
    pub shape: GdnShape,
    pub profile: GdnProfile,
}

/// The K and V cache of one sequence in one layer (`[len, kv_heads·head_dim]` each, positions
/// `0..len`; `None` before the first token), as [`Backend::attention_decode`] grows it.
pub struct KvSlot<'a, T> {
    pub k: &'a mut Option<T>,
    pub v: &'a mut Option<T>,
}
