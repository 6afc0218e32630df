//! The backend seam: every numeric operation the model code needs, implemented once per device.
//!
//! Model code (`crate::model`) is generic over [`Backend`] and never touches device memory
//! directly. The CPU backend ([`cpu::CpuBackend`]) is the reference: f32 weights and
//! activations, f32 accumulation. A CUDA backend implements the same trait with bf16 storage
//! and fp32 accumulation; `draftlens parity` compares the two.
//!
//! Layout conventions: a [`Backend::Tensor`] is a row-major 2-D activation `[rows, cols]`
//! (one row per token); a [`Backend::Matrix`] is a weight stored PyTorch-style `[out, in]`, so a
//! projection is `y = x · Wᵀ`.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use anyhow::Result;

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

/// Which key rows each query row may attend to.
#[derive(Clone, Debug, PartialEq)]
pub enum AttnMask {
    /// Target model. Query row i sits at absolute position `q_start + i`; key row j sits at
    /// absolute position j (the KV cache holds positions 0..). Key j is visible iff
    /// `j <= q_start + i`.
    Causal { q_start: usize },
    /// DFlash drafter over many anchors at once.
    ///
    /// Keys are `[ctx_len context rows (positions 0..ctx_len) | anchors.len() blocks of `block` rows]`,
    /// queries are the block rows only (`anchors.len() * block` rows, block n at positions
    /// `anchors[n] .. anchors[n] + block`). A query of block n sees:
    /// - context key j iff `j < anchors[n]` (`j <= anchors[n]` when `ctx_inclusive`: the
    ///   training-time leak of dflash.md §2.4 item 1);
    /// - the rows of its own block: all of them (bidirectional), or only rows at or before its
    ///   own when `causal_in_block` (sliding-window drafter layers);
    /// - with `window = Some(w)`, only keys at positions `>= q_pos - (w - 1)`;
    /// - nothing of any other block.
    ///
    /// With `ctx_inclusive = false` this is exactly one-anchor-at-a-time drafting, batched.
    Blocks {
        ctx_len: usize,
        block: usize,
        anchors: Vec<usize>,
        ctx_inclusive: bool,
        causal_in_block: bool,
        window: Option<usize>,
    },
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

/// Every operation the model code needs. All methods return errors instead of panicking
/// (device failures, shape mismatches).
pub trait Backend: Send + Sync + 'static {
    /// A row-major `[rows, cols]` activation on the device.
    type Tensor: Send + Sync;
    /// A weight matrix `[out, in]` on the device, in the backend's storage dtype.
    type Matrix: Send + Sync;

    /// Short name stored with every result ("cpu", "cuda").
    fn name(&self) -> &'static str;
    /// Storage dtype of weights and activations ("f32", "bf16").
    fn dtype(&self) -> &'static str;

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    fn dims(&self, t: &Self::Tensor) -> (usize, usize);
    fn matrix(&self, data: &[f32], out: usize, inp: usize) -> Result<Self::Matrix>;
    fn matrix_dims(&self, m: &Self::Matrix) -> (usize, usize);

    /// `x · Wᵀ`: `[T, in] × [out, in] → [T, out]`, f32 accumulation.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Matrix) -> Result<Self::Tensor>;
    /// `x[r, c] += bias[0, c]` for every row.
    fn add_row_bias(&self, x: &mut Self::Tensor, bias: &Self::Tensor) -> Result<()>;
    /// `x += y` elementwise (residual add).
    fn add_inplace(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// RMSNorm over consecutive groups of `group` columns (group = cols for a layer norm,
    /// = head_dim for per-head q/k norms), each group scaled by `weight[0, ..group]`. The
    /// statistic is computed in f32.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        group: usize,
    ) -> Result<Self::Tensor>;
    /// Rotary embedding in place on every head of `x` (`cols = n_heads * rope.head_dim`);
    /// row r is at absolute position `positions[r]`.
    fn rope_inplace(&self, x: &mut Self::Tensor, positions: &[u32], rope: &Rope) -> Result<()>;
    /// Scaled dot-product attention with softmax in f32. q `[Tq, heads*hd]`, k/v `[Tk, kv_heads*hd]`,
    /// output `[Tq, heads*hd]`. Query head h uses KV head `h / (heads / kv_heads)`.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<Self::Tensor>;
    /// Causal attention over several sequences packed into one tensor (varlen prefill): rows
    /// `seq_starts[i]..seq_starts[i + 1]` form sequence i (`seq_starts` runs from 0 to the row
    /// count); a query sees the keys of its own sequence at or before itself. q and k/v have the
    /// same rows. The default runs [`Backend::attention`] once per sequence; the CUDA backend does
    /// all sequences in one launch.
    fn attention_varlen(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        seq_starts: &[usize],
    ) -> Result<Self::Tensor> {
        let (rows, _) = self.dims(q);
        anyhow::ensure!(
            seq_starts.first() == Some(&0)
                && seq_starts.last() == Some(&rows)
                && seq_starts.windows(2).all(|w| w[0] <= w[1]),
            "attention_varlen: sequence starts must increase from 0 to {rows}"
        );
        let mut parts = Vec::with_capacity(seq_starts.len());
        for w in seq_starts.windows(2) {
            let (qs, ks, vs) = (
                self.slice_rows(q, w[0], w[1])?,
                self.slice_rows(k, w[0], w[1])?,
                self.slice_rows(v, w[0], w[1])?,
            );
            parts.push(self.attention(&qs, &ks, &vs, shape, &AttnMask::Causal { q_start: 0 })?);
        }
        let refs: Vec<&Self::Tensor> = parts.iter().collect();
        self.concat_rows(&refs)
    }
    /// `silu(gate) ⊙ up`.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// Rows `ids` of an embedding table `[vocab, dim]` → `[ids.len(), dim]`.
    fn embed(&self, table: &Self::Matrix, ids: &[u32]) -> Result<Self::Tensor>;
    /// Stack tensors with equal column counts.
    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;
    /// Put tensors with equal row counts side by side (DFlash tap fusion).
    fn concat_cols(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;
    /// Rows `start..end` (KV-cache cropping, last-token selection).
    fn slice_rows(&self, x: &Self::Tensor, start: usize, end: usize) -> Result<Self::Tensor>;
    /// Rows listed in `rows`, in that order.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;
    /// LM head fused with log-softmax and top-k: `x · headᵀ` per row, never returning the full
    /// vocabulary logits.
    fn lm_head_topk(&self, x: &Self::Tensor, head: &Self::Matrix, k: usize) -> Result<TopK>;
}
