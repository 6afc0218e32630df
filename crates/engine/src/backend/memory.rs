//! Device-memory estimates from a model's spec, checked before any work starts.
//!
//! A long prompt that does not fit must be refused (or its pack split) up front with the numbers,
//! never discovered by an out-of-memory error half-way through a run. The estimates follow what
//! the model code allocates (`model/transformer.rs`, `backend/cuda/`), element size `e`
//! (4 on the CPU, 2 on CUDA), for a forward over `T` rows:
//!
//! - weights: every stored tensor's elements × `e` (exact, from the file's headers);
//! - activations at the peak of a layer: the residual `h` and normed `x` (`2·T·D`) plus the larger
//!   of the attention step (fused q|k|v `T·(qd + 2·kvd)` and its output `T·qd`) and the MLP step
//!   (fused gate|up `2·T·I` and its product `T·I`);
//! - captured hidden states kept to the end of the forward: `(taps + 1)·T·D` (taps plus the
//!   final norm's output);
//! - the LM head's fp32 logits scratch: `min(T, 2^30 / (4·V))·V·4` bytes (≤ 1 GiB, as the CUDA
//!   `lm_head_topk` chunks it);
//! - KV cache of a decode: `2·L·kvd·e` per cached position, plus one layer's worth again while
//!   a layer's cache grows (append may copy);
//! - a fixed [`WORKSPACE_BYTES`] for GEMM workspaces, the allocator's rounding and
//!   fragmentation, and 25 % on top of the activations for temporaries the list above misses.
//!
//! These are estimates with margins, not allocations: they decide before the first kernel runs.

use crate::model::ModelSpec;

/// Fixed allowance for cuBLAS/cuBLASLt workspaces (32 MiB each), kernel tables and the pool
/// allocator's rounding.
pub const WORKSPACE_BYTES: u64 = 512 << 20;

/// Device bytes one stored weight element takes: 4 for f32 backends, 2 for bf16/f16.
pub fn element_bytes(dtype: &str) -> u64 {
    match dtype {
        "bf16" | "f16" => 2,
        _ => 4,
    }
}

/// The sizes of a target that the estimates need (a [`ModelSpec`] plus the element size).
#[derive(Clone, Debug)]
pub struct MemoryModel {
    pub hidden: u64,
    pub q_dim: u64,
    pub kv_dim: u64,
    pub inter: u64,
    pub vocab: u64,
    pub layers: u64,
    /// Bytes per activation / weight element on the device.
    pub elem: u64,
    /// Bytes of all weights on the device.
    pub weights: u64,
}

impl MemoryModel {
    /// `params`: the stored tensors' total element count (from the headers).
    pub fn new(spec: &ModelSpec, params: u64, dtype: &str) -> MemoryModel {
        let elem = element_bytes(dtype);
        MemoryModel {
            hidden: spec.hidden_size as u64,
            q_dim: (spec.num_heads * spec.head_dim) as u64,
            kv_dim: (spec.num_kv_heads * spec.head_dim) as u64,
            inter: spec.intermediate_size as u64,
            vocab: spec.vocab_size as u64,
            layers: spec.num_layers as u64,
            elem,
            weights: params * elem,
        }
    }

    /// Activation bytes per row of a forward that captures `taps` hidden states.
    fn per_row(&self, taps: u64) -> u64 {
        let attn = self.q_dim + 2 * self.kv_dim + self.q_dim;
        let mlp = 3 * self.inter;
        let live = 2 * self.hidden + attn.max(mlp) + (taps + 1) * self.hidden;
        // 25 % for temporaries (splits, norms' outputs) the list misses.
        live * self.elem * 5 / 4
    }

    /// The LM head's fp32 logits scratch for `rows` rows.
    fn logits(&self, rows: u64) -> u64 {
        let chunk = rows.min(((1u64 << 30) / (self.vocab * 4)).max(1));
        chunk * self.vocab * 4
    }

    /// Device bytes (beyond the weights) of one packed forward over `rows` rows capturing
    /// `taps` hidden states, then its top-K.
    pub fn forward_bytes(&self, rows: u64, taps: u64) -> u64 {
        WORKSPACE_BYTES + rows * self.per_row(taps) + self.logits(rows)
    }

    /// KV-cache bytes of `positions` cached positions (one sequence).
    pub fn kv_bytes(&self, positions: u64) -> u64 {
        2 * self.layers * self.kv_dim * self.elem * positions
    }

    /// Device bytes (beyond the weights) of greedily decoding `batch` prompts of at most
    /// `prompt` tokens by `max_new` tokens: the prompt's prefill (prompts are prefilled one at a
    /// time) next to every sequence's full KV cache, plus one layer's cache copied while it grows.
    pub fn decode_bytes(&self, batch: u64, prompt: u64, max_new: u64) -> u64 {
        let positions = prompt + max_new;
        let kv = batch * self.kv_bytes(positions);
        let growing = self.kv_bytes(positions) / self.layers.max(1);
        self.forward_bytes(prompt, 0) + kv + growing
    }

    /// The most rows one forward capturing `taps` states may have within `available` bytes
    /// (0 when not even the fixed part fits).
    pub fn max_rows(&self, available: u64, taps: u64) -> u64 {
        // forward_bytes is increasing in rows: binary search the largest fitting count.
        let (mut lo, mut hi) = (0u64, 1u64 << 32);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.forward_bytes(mid, taps) <= available {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// Bytes as GiB with two decimals, for messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
