//! FLOP counts of the target and the drafter: the compute floors every benchmark divides by
//! (docs/benchmarks-cuda.md). Counted as 2 FLOPs per multiply-add of the linear projections plus
//! the attention products; norms, RoPE and activations are left out (under 1% at these shapes).

use super::ModelSpec;
use crate::drafter::DrafterConfig;

impl ModelSpec {
    /// Parameters of one decoder layer's linear projections (q, k, v, o, gate, up, down).
    pub fn layer_linear_params(&self) -> usize {
        let (d, q, kv) = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        );
        d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size
    }

    /// Prefill FLOPs per token of a causal sequence of `seq_len` tokens, without the LM head:
    /// `2·N_lin + 4·H·hd·(S+1)/2` per layer (QKᵀ and PV over the causal half on average).
    pub fn prefill_flops_per_token(&self, seq_len: usize) -> f64 {
        let lin = 2.0 * (self.layer_linear_params() * self.num_layers) as f64;
        let attn = 4.0 * (self.num_heads * self.head_dim) as f64 * (seq_len as f64 + 1.0) / 2.0
            * self.num_layers as f64;
        lin + attn
    }

    /// FLOPs of one greedy decode step per sequence at context length `ctx` (LM head included):
    /// what the decode benchmarks compare against, next to the bytes of weights each step reads.
    pub fn decode_flops(&self, ctx: usize) -> f64 {
        let lin = 2.0 * (self.layer_linear_params() * self.num_layers) as f64;
        let attn = 4.0 * (self.num_heads * self.head_dim * (ctx + 1) * self.num_layers) as f64;
        lin + attn + 2.0 * (self.vocab_size * self.hidden_size) as f64
    }
}

impl DrafterConfig {
    /// Parameters of one drafter layer's linear projections.
    fn layer_linear_params(&self) -> usize {
        let (d, q, kv) = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        );
        d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size
    }

    /// FLOPs of drafting one anchor with `ctx` visible context rows: the B block rows through
    /// every layer, attention over context + block, and the LM head (`vocab × hidden`) over the
    /// B−1 drafted rows.
    pub fn flops_per_anchor(&self, ctx: usize, vocab: usize) -> f64 {
        let b = self.block_size as f64;
        let lin = 2.0 * b * (self.layer_linear_params() * self.num_layers) as f64;
        let attn = 4.0
            * b
            * (self.num_heads * self.head_dim) as f64
            * (ctx as f64 + b)
            * self.num_layers as f64;
        let head = 2.0 * (b - 1.0) * (vocab * self.hidden_size) as f64;
        lin + attn + head
    }

    /// FLOPs per context token: `fc` over the concatenated taps, then every layer's k/v
    /// projections of the context features.
    pub fn flops_per_context_token(&self, target_hidden: usize) -> f64 {
        let taps = self.target_layer_ids.len();
        2.0 * (taps * target_hidden * self.hidden_size) as f64
            + 2.0
                * (2 * self.hidden_size * self.num_kv_heads * self.head_dim * self.num_layers)
                    as f64
    }
}
