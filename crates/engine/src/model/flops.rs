//! FLOP counts of the target and the drafter: the compute floors every benchmark divides by
//! (docs/benchmarks-cuda.md). Counted as 2 FLOPs per multiply-add of the linear projections plus
//! the attention products; norms, RoPE and activations are left out (under 1% at these shapes).

use super::hybrid::LayerType;
use super::ModelSpec;
use crate::drafter::DrafterConfig;

impl ModelSpec {
    /// Parameters of one dense decoder layer's linear projections (q, k, v, o, gate, up, down).
    pub fn layer_linear_params(&self) -> usize {
        let (d, q, kv) = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        );
        d * q + 2 * d * kv + q * d + 3 * d * self.intermediate_size
    }

    /// Linear-projection parameters of decoder layer `i`: [`ModelSpec::layer_linear_params`] for a
    /// dense model; on a hybrid, a gated-attention layer's `q_proj` is twice as wide (query and
    /// output gate), and a Gated DeltaNet layer has `in_proj_qkv` (D × (2·Hk·dk + Hv·dv)),
    /// `in_proj_z` (D × Hv·dv), `in_proj_b` and `in_proj_a` (D × Hv each) and `out_proj`.
    /// A sparse layer's MLP counts the parameters one token uses (router, top-k experts, shared
    /// expert: [`super::moe::MoeSpec::active_params`]), the FLOP floor's measure.
    pub fn layer_linear_params_at(&self, i: usize) -> usize {
        let d = self.hidden_size;
        let mlp = match &self.moe {
            Some(m) if m.is_sparse(i) => m.active_params(d),
            _ => 3 * d * self.intermediate_size,
        };
        let Some(h) = &self.hybrid else {
            return self.layer_linear_params() - 3 * d * self.intermediate_size + mlp;
        };
        match h.layer_types[i] {
            LayerType::FullAttention => {
                let (q, kv) = (
                    self.num_heads * self.head_dim,
                    self.num_kv_heads * self.head_dim,
                );
                d * 2 * q + 2 * d * kv + q * d + mlp
            }
            LayerType::LinearAttention => {
                let key = h.linear_num_key_heads * h.linear_key_head_dim;
                let value = h.linear_num_value_heads * h.linear_value_head_dim;
                d * (2 * key + value)
                    + d * value
                    + 2 * d * h.linear_num_value_heads
                    + value * d
                    + mlp
            }
        }
    }

    /// Linear-projection parameters of all decoder layers.
    pub fn linear_params(&self) -> usize {
        (0..self.num_layers)
            .map(|i| self.layer_linear_params_at(i))
            .sum()
    }

    /// Keys a query of layer `i` sees on average over a causal sequence of `seq_len` tokens:
    /// `(S+1)/2`, or on a gpt-oss sliding-window layer of window `w < S`
    /// `(w(w+1)/2 + (S−w)·w) / S`.
    fn mean_visible_keys(&self, i: usize, seq_len: usize) -> f64 {
        let s = seq_len as f64;
        match self.gpt_oss.as_ref().and_then(|g| g.window(i)) {
            Some(w) if w < seq_len => {
                let w = w as f64;
                (w * (w + 1.0) / 2.0 + (s - w) * w) / s
            }
            _ => (s + 1.0) / 2.0,
        }
    }

    /// Prefill FLOPs per token of a causal sequence of `seq_len` tokens, without the LM head:
    /// `2·N_lin` per layer, plus per softmax-attention layer `4·H·hd·(S+1)/2` (QKᵀ and PV over
    /// the causal half on average; over the keys of its window on a gpt-oss sliding layer), plus per Gated DeltaNet layer its chunked core
    /// `Hv·(2C(3dk + 2dv) + C² + 6·dk·dv)` with chunks of C = 64 (docs/gdn-cuda.md) and the
    /// short convolution `2·K·conv_dim`. Qwen3.6-27B at S = 1k: 49.33 GF.
    pub fn prefill_flops_per_token(&self, seq_len: usize) -> f64 {
        let lin = 2.0 * self.linear_params() as f64;
        let attn_layer = |i: usize| {
            4.0 * (self.num_heads * self.head_dim) as f64 * self.mean_visible_keys(i, seq_len)
        };
        let mixers: f64 = (0..self.num_layers)
            .map(
                |i| match self.hybrid.as_ref().map(|h| (h, h.layer_types[i])) {
                    Some((h, LayerType::LinearAttention)) => {
                        const C: f64 = 64.0;
                        let (dk, dv) =
                            (h.linear_key_head_dim as f64, h.linear_value_head_dim as f64);
                        let core = h.linear_num_value_heads as f64
                            * (2.0 * C * (3.0 * dk + 2.0 * dv) + C * C + 6.0 * dk * dv);
                        let conv_dim = 2 * h.linear_num_key_heads * h.linear_key_head_dim
                            + h.linear_num_value_heads * h.linear_value_head_dim;
                        core + 2.0 * (h.linear_conv_kernel_dim * conv_dim) as f64
                    }
                    _ => attn_layer(i),
                },
            )
            .sum();
        lin + mixers
    }

    /// Parameters one token's forward reads: every layer's linear projections as
    /// [`ModelSpec::layer_linear_params_at`] counts them (a sparse MLP's top-k experts only), the
    /// embedding row's table and the LM head (counted once when tied). Qwen3-30B-A3B: 3.35 B
    /// (its card: 3.3 B activated).
    pub fn active_params_per_token(&self) -> u64 {
        let table = (self.vocab_size * self.hidden_size) as u64;
        let head = if self.tie_word_embeddings { 0 } else { table };
        self.linear_params() as u64 + table + head
    }

    /// FLOPs of one greedy decode step per sequence at context length `ctx` (LM head included):
    /// what the decode benchmarks compare against, next to the bytes of weights each step reads.
    /// A gpt-oss sliding layer attends over at most its window.
    pub fn decode_flops(&self, ctx: usize) -> f64 {
        let lin = 2.0 * self.linear_params() as f64;
        let keys: usize = (0..self.num_layers)
            .map(|i| match self.gpt_oss.as_ref().and_then(|g| g.window(i)) {
                Some(w) => (ctx + 1).min(w),
                None => ctx + 1,
            })
            .sum();
        let attn = 4.0 * (self.num_heads * self.head_dim * keys) as f64;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The FLOP counts against the independent figures of docs/benchmarks-cuda.md (Qwen3-8B) and
    /// docs/gdn-cuda.md / the Qwen3.6-27B parameter count (24.35 B linear parameters).
    #[test]
    fn prefill_flops_match_the_documented_figures() {
        let q8 = crate::model::random::qwen3_8b_spec();
        let gf = |s: &ModelSpec, len| s.prefill_flops_per_token(len) / 1e9;
        assert!((gf(&q8, 1024) - 14.19).abs() < 0.01, "{}", gf(&q8, 1024));
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(
            &cfg,
            r#"{"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120,
                "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
                "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16,
                "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "rms_norm_eps": 1e-6,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
                "tie_word_embeddings": false, "max_position_embeddings": 262144}"#,
        )
        .unwrap();
        let q27 = ModelSpec::from_hf_config(&cfg).unwrap();
        assert_eq!(q27.linear_params(), 24_350_556_160);
        assert!((gf(&q27, 1024) - 49.33).abs() < 0.01, "{}", gf(&q27, 1024));
        assert!(
            (gf(&q27, 32768) - 55.57).abs() < 0.01,
            "{}",
            gf(&q27, 32768)
        );
    }

    /// Qwen3-30B-A3B's config (48 layers, 128 experts, top-8 of width 768): 3.35 B parameters
    /// per token, the card's "3.3B activated".
    #[test]
    fn active_params_of_qwen3_30b_a3b() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(
            &cfg,
            r#"{"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
                "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "max_position_embeddings": 40960}"#,
        )
        .unwrap();
        let s = ModelSpec::from_hf_config(&cfg).unwrap();
        let active = s.active_params_per_token();
        assert!((active as f64 / 1e9 - 3.35).abs() < 0.01, "{active}");
    }

    /// gpt-oss-20b's published config (24 layers, 32 experts of width 2880, top-4, window 128
    /// on every other layer): 3.61 B parameters per token without the input embedding (the model
    /// card's "3.6B active", which counts the unembedding but not the embedding); the sliding
    /// layers attend over 128 keys however long the context.
    #[test]
    fn gpt_oss_20b_active_params_and_windowed_attention() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(
            &cfg,
            r#"{"model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
                "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
                "num_experts_per_tok": 4, "sliding_window": 128, "tie_word_embeddings": false,
                "quantization_config": {"quant_method": "mxfp4"}}"#,
        )
        .unwrap();
        let s = ModelSpec::from_hf_config(&cfg).unwrap();
        let embedding = (s.vocab_size * s.hidden_size) as u64;
        let active = s.active_params_per_token() - embedding;
        assert!((active as f64 / 1e9 - 3.61).abs() < 0.01, "{active}");
        // Attention FLOPs: 12 full layers grow with the context, 12 sliding ones stop at 128.
        let per_layer = 4.0 * (64 * 64) as f64;
        let attn = |ctx: usize| s.decode_flops(ctx) - s.decode_flops(0) + 24.0 * per_layer;
        assert!((attn(1000) - per_layer * (12.0 * 1001.0 + 12.0 * 128.0)).abs() < 1.0);
        let full = (1024.0 + 1.0) / 2.0;
        let sliding = (128.0 * 129.0 / 2.0 + (1024.0 - 128.0) * 128.0) / 1024.0;
        let want = 2.0 * s.linear_params() as f64 + 12.0 * per_layer * (full + sliding);
        assert!((s.prefill_flops_per_token(1024) - want).abs() < 1.0);
    }
}
