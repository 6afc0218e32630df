//! Parameters a target stores, counted from its config alone: what the loader uploads
//! (`model::transformer`, the hybrid's Gated DeltaNet, the MoE and gpt-oss layers), so that the
//! device-memory estimate (`crate::backend::memory`) is made before any weight byte is read, and
//! can be made from a `config.json` without weights (`inspect`, the tests' published configs).
//! `crates/engine/tests/memory_estimate.rs` checks it against the headers of every golden
//! checkpoint and against the published totals of Qwen3-30B-A3B, Qwen3.5-35B-A3B,
//! Qwen3.5-122B-A10B, gpt-oss-20b and gpt-oss-120b.

use super::hybrid::LayerType;
use super::ModelSpec;

impl ModelSpec {
    /// Parameters of every tensor the loader uploads: the embedding, the final norm, the LM head
    /// unless `tie_word_embeddings`, and per decoder layer its two norms, its token mixer and its
    /// MLP (all experts). MXFP4 expert blocks count as the parameters they unpack to. Tensors a
    /// checkpoint holds that the target never loads (a vision tower, an MTP head) are not counted.
    pub fn stored_params(&self) -> u64 {
        let (d, v) = (self.hidden_size as u64, self.vocab_size as u64);
        let lm_head = if self.tie_word_embeddings { 0 } else { v * d };
        let layers: u64 = (0..self.num_layers)
            .map(|l| 2 * d + self.mixer_params(l) + self.mlp_params(l))
            .sum();
        v * d + lm_head + d + layers
    }

    /// Layer `l`'s token mixer: softmax attention (q/k/v/o, with biases, q/k norms, a hybrid's
    /// output gate in `q_proj`, gpt-oss's sinks) or a Gated DeltaNet.
    fn mixer_params(&self, l: usize) -> u64 {
        let d = self.hidden_size as u64;
        let (hd, heads) = (self.head_dim as u64, self.num_heads as u64);
        let (qd, kvd) = (heads * hd, self.num_kv_heads as u64 * hd);
        if let Some(h) = &self.hybrid {
            if h.layer_types[l] == LayerType::LinearAttention {
                let s = h.gdn_shape();
                let (conv, value, hv) =
                    (s.conv_dim() as u64, s.value_dim() as u64, s.v_heads as u64);
                // in_proj_qkv, in_proj_z, in_proj_b + in_proj_a, conv1d [conv, 1, K], dt_bias +
                // A_log, the gated norm [dv], out_proj.
                return d * (conv + value + 2 * hv)
                    + conv * h.linear_conv_kernel_dim as u64
                    + 2 * hv
                    + s.v_dim as u64
                    + value * d;
            }
        }
        // A hybrid's gated attention stores each head's query rows and output-gate rows in q_proj.
        let q_rows = if self.hybrid.is_some() { 2 * qd } else { qd };
        let mut p = d * (q_rows + 2 * kvd) + qd * d;
        if self.attention_bias {
            p += q_rows + 2 * kvd;
            if self.gpt_oss.is_some() {
                p += d; // gpt-oss biases o_proj too
            }
        }
        if self.qk_norm {
            p += 2 * hd;
        }
        if self.gpt_oss.is_some() {
            p += heads; // one sink logit per head
        }
        p
    }

    /// Layer `l`'s MLP: dense SwiGLU, a sparse MoE (router, every expert, the shared expert and
    /// its gate) or gpt-oss's (biased router, every expert with its biases).
    fn mlp_params(&self, l: usize) -> u64 {
        let d = self.hidden_size as u64;
        match (&self.moe, &self.gpt_oss) {
            (Some(m), Some(_)) => {
                let (e, i) = (m.num_experts as u64, m.moe_intermediate_size as u64);
                // router + bias, gate_up [D, 2I] + bias, down [I, D] + bias, per expert.
                e * d + e + e * (d * 2 * i + 2 * i + i * d + d)
            }
            (Some(m), None) if m.is_sparse(l) => m.total_params(self.hidden_size) as u64,
            _ => 3 * d * self.intermediate_size as u64,
        }
    }
}
