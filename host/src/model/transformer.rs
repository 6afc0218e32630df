//! The target model: a pre-norm decoder (LLaMA / Qwen2 / Qwen3) over the backend seam.
//!
//! One struct per Hugging Face module, each loading its weights by their exact HF names, so the
//! weight map can be read straight off the code. Forward semantics follow
//! `transformers/models/qwen3/modeling_qwen3.py` (models.md §1.3): RMSNorm → q/k/v → (q/k
//! per-head norm) → RoPE → causal GQA attention → o_proj → residual → RMSNorm → SwiGLU MLP →
//! residual; final norm; LM head (tied to the embedding when `lm_head.weight` is absent).

use super::capture::{Capture, Captured};
use super::config::ModelSpec;
use crate::backend::{AttnMask, AttnShape, Backend, Rope, TopK};
use crate::formats::WeightSource;
use anyhow::{bail, Context, Result};

/// Load a 2-D weight `[out, in]` by HF name, checking its shape against the config.
pub(crate) fn load_matrix<B: Backend>(
    be: &B,
    src: &dyn WeightSource,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<B::Matrix> {
    let t = src.tensor(name)?;
    if t.shape != [out, inp] {
        bail!(
            "{}: tensor {name} has shape {:?}, the config implies [{out}, {inp}]",
            src.path().display(),
            t.shape
        );
    }
    be.matrix(&t.data, out, inp)
        .with_context(|| format!("{}: uploading {name}", src.path().display()))
}

/// Load a 1-D weight (norm scale, bias) of length `n` as a `[1, n]` tensor.
pub(crate) fn load_vector<B: Backend>(
    be: &B,
    src: &dyn WeightSource,
    name: &str,
    n: usize,
) -> Result<B::Tensor> {
    let t = src.tensor(name)?;
    if t.shape != [n] {
        bail!(
            "{}: tensor {name} has shape {:?}, the config implies [{n}]",
            src.path().display(),
            t.shape
        );
    }
    be.from_host(&t.data, 1, n)
}

/// An RMSNorm with its scale (`eps` from the config; `group` = columns normalised together).
pub struct RmsNorm<B: Backend> {
    pub weight: B::Tensor,
    pub eps: f32,
    pub group: usize,
}

impl<B: Backend> RmsNorm<B> {
    pub fn load(be: &B, src: &dyn WeightSource, name: &str, n: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm {
            weight: load_vector(be, src, name, n)?,
            eps,
            group: n,
        })
    }
    pub fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        be.rms_norm(x, &self.weight, self.eps, self.group)
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) ⊙ up(x))`.
pub struct Mlp<B: Backend> {
    pub gate_proj: B::Matrix,
    pub up_proj: B::Matrix,
    pub down_proj: B::Matrix,
}

impl<B: Backend> Mlp<B> {
    pub fn load(
        be: &B,
        src: &dyn WeightSource,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<Self> {
        Ok(Mlp {
            gate_proj: load_matrix(
                be,
                src,
                &format!("{prefix}.gate_proj.weight"),
                inter,
                hidden,
            )?,
            up_proj: load_matrix(be, src, &format!("{prefix}.up_proj.weight"), inter, hidden)?,
            down_proj: load_matrix(
                be,
                src,
                &format!("{prefix}.down_proj.weight"),
                hidden,
                inter,
            )?,
        })
    }
    pub fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let g = be.matmul(x, &self.gate_proj)?;
        let u = be.matmul(x, &self.up_proj)?;
        be.matmul(&be.swiglu(&g, &u)?, &self.down_proj)
    }
}

/// Causal self-attention with grouped KV heads, optional q/k/v biases (Qwen2) and optional
/// per-head q/k RMSNorm before RoPE (Qwen3).
pub struct Attention<B: Backend> {
    pub q_proj: B::Matrix,
    pub k_proj: B::Matrix,
    pub v_proj: B::Matrix,
    pub o_proj: B::Matrix,
    pub biases: Option<[B::Tensor; 3]>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub shape: AttnShape,
    pub rope: Rope,
}

impl<B: Backend> Attention<B> {
    pub fn load(be: &B, src: &dyn WeightSource, prefix: &str, spec: &ModelSpec) -> Result<Self> {
        let (d, hd) = (spec.hidden_size, spec.head_dim);
        let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let biases = if spec.attention_bias {
            Some([
                load_vector(be, src, &format!("{prefix}.q_proj.bias"), qd)?,
                load_vector(be, src, &format!("{prefix}.k_proj.bias"), kvd)?,
                load_vector(be, src, &format!("{prefix}.v_proj.bias"), kvd)?,
            ])
        } else {
            None
        };
        let (q_norm, k_norm) = if spec.qk_norm {
            (
                Some(RmsNorm::load(
                    be,
                    src,
                    &format!("{prefix}.q_norm.weight"),
                    hd,
                    spec.rms_norm_eps,
                )?),
                Some(RmsNorm::load(
                    be,
                    src,
                    &format!("{prefix}.k_norm.weight"),
                    hd,
                    spec.rms_norm_eps,
                )?),
            )
        } else {
            (None, None)
        };
        Ok(Attention {
            q_proj: load_matrix(be, src, &format!("{prefix}.q_proj.weight"), qd, d)?,
            k_proj: load_matrix(be, src, &format!("{prefix}.k_proj.weight"), kvd, d)?,
            v_proj: load_matrix(be, src, &format!("{prefix}.v_proj.weight"), kvd, d)?,
            o_proj: load_matrix(be, src, &format!("{prefix}.o_proj.weight"), d, qd)?,
            biases,
            q_norm,
            k_norm,
            shape: AttnShape {
                heads: spec.num_heads,
                kv_heads: spec.num_kv_heads,
                head_dim: hd,
            },
            rope: spec.rope(),
        })
    }

    /// Project `x` to rotated q, k and v for tokens at `positions`.
    pub fn qkv(
        &self,
        be: &B,
        x: &B::Tensor,
        positions: &[u32],
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let mut q = be.matmul(x, &self.q_proj)?;
        let mut k = be.matmul(x, &self.k_proj)?;
        let mut v = be.matmul(x, &self.v_proj)?;
        if let Some([bq, bk, bv]) = &self.biases {
            be.add_row_bias(&mut q, bq)?;
            be.add_row_bias(&mut k, bk)?;
            be.add_row_bias(&mut v, bv)?;
        }
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(be, &q)?;
            k = kn.forward(be, &k)?;
        }
        be.rope_inplace(&mut q, positions, &self.rope)?;
        be.rope_inplace(&mut k, positions, &self.rope)?;
        Ok((q, k, v))
    }

    /// Attend the new tokens (at positions `start..start+T`) over the cache, appending their K/V.
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        start: usize,
        cache: &mut LayerCache<B>,
    ) -> Result<B::Tensor> {
        let t = be.dims(x).0;
        let positions: Vec<u32> = (start..start + t).map(|p| p as u32).collect();
        let (q, k, v) = self.qkv(be, x, &positions)?;
        cache.append(be, k, v)?;
        let (k_all, v_all) = (
            cache.k.as_ref().expect("appended"),
            cache.v.as_ref().expect("appended"),
        );
        let o = be.attention(
            &q,
            k_all,
            v_all,
            self.shape,
            &AttnMask::Causal { q_start: start },
        )?;
        be.matmul(&o, &self.o_proj)
    }

    /// Attend several whole sequences packed row-wise (`seq_starts`, see
    /// [`Backend::attention_varlen`]), each causal over itself only; `positions` restart at 0 for
    /// every sequence. No KV cache: this is prefill only.
    pub fn forward_packed(
        &self,
        be: &B,
        x: &B::Tensor,
        positions: &[u32],
        seq_starts: &[usize],
    ) -> Result<B::Tensor> {
        let (q, k, v) = self.qkv(be, x, positions)?;
        let o = be.attention_varlen(&q, &k, &v, self.shape, seq_starts)?;
        be.matmul(&o, &self.o_proj)
    }
}

/// K and V of one layer for positions `0..len`.
pub struct LayerCache<B: Backend> {
    pub k: Option<B::Tensor>,
    pub v: Option<B::Tensor>,
}

impl<B: Backend> LayerCache<B> {
    fn append(&mut self, be: &B, k: B::Tensor, v: B::Tensor) -> Result<()> {
        self.k = Some(match self.k.take() {
            Some(old) => be.concat_rows(&[&old, &k])?,
            None => k,
        });
        self.v = Some(match self.v.take() {
            Some(old) => be.concat_rows(&[&old, &v])?,
            None => v,
        });
        Ok(())
    }
}

/// The target's KV cache: one [`LayerCache`] per layer, all holding positions `0..len`.
pub struct KvCache<B: Backend> {
    pub layers: Vec<LayerCache<B>>,
    pub len: usize,
}

impl<B: Backend> KvCache<B> {
    pub fn new(num_layers: usize) -> Self {
        KvCache {
            layers: (0..num_layers)
                .map(|_| LayerCache { k: None, v: None })
                .collect(),
            len: 0,
        }
    }
    /// Drop every position `>= len` (speculative decoding rejects the unaccepted tail).
    pub fn crop(&mut self, be: &B, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        for l in &mut self.layers {
            if let (Some(k), Some(v)) = (&l.k, &l.v) {
                l.k = Some(be.slice_rows(k, 0, len)?);
                l.v = Some(be.slice_rows(v, 0, len)?);
            }
        }
        self.len = len;
        Ok(())
    }
}

/// One pre-norm decoder layer.
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    pub fn load(be: &B, src: &dyn WeightSource, i: usize, spec: &ModelSpec) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let (d, eps) = (spec.hidden_size, spec.rms_norm_eps);
        Ok(DecoderLayer {
            input_layernorm: RmsNorm::load(
                be,
                src,
                &format!("{p}.input_layernorm.weight"),
                d,
                eps,
            )?,
            self_attn: Attention::load(be, src, &format!("{p}.self_attn"), spec)?,
            post_attention_layernorm: RmsNorm::load(
                be,
                src,
                &format!("{p}.post_attention_layernorm.weight"),
                d,
                eps,
            )?,
            mlp: Mlp::load(be, src, &format!("{p}.mlp"), d, spec.intermediate_size)?,
        })
    }

    pub fn forward(
        &self,
        be: &B,
        h: &mut B::Tensor,
        start: usize,
        cache: &mut LayerCache<B>,
    ) -> Result<()> {
        self.forward_with(be, h, |x| self.self_attn.forward(be, x, start, cache))
    }

    /// The layer over packed whole sequences (see [`Attention::forward_packed`]).
    pub fn forward_packed(
        &self,
        be: &B,
        h: &mut B::Tensor,
        positions: &[u32],
        seq_starts: &[usize],
    ) -> Result<()> {
        self.forward_with(be, h, |x| {
            self.self_attn.forward_packed(be, x, positions, seq_starts)
        })
    }

    /// Norm → `attend` → residual → norm → MLP → residual; only the attention differs between
    /// the cached and the packed forward.
    fn forward_with(
        &self,
        be: &B,
        h: &mut B::Tensor,
        attend: impl FnOnce(&B::Tensor) -> Result<B::Tensor>,
    ) -> Result<()> {
        let x = self.input_layernorm.forward(be, h)?;
        let a = attend(&x)?;
        be.add_inplace(h, &a)?;
        let x = self.post_attention_layernorm.forward(be, h)?;
        let m = self.mlp.forward(be, &x)?;
        be.add_inplace(h, &m)
    }
}

/// What one forward pass returns.
pub struct ForwardOutput<B: Backend> {
    /// Final-norm hidden states of the new tokens `[T, D]` (= HF `hidden_states[L]`).
    pub last_hidden: B::Tensor,
    /// The hidden states requested through [`Capture`].
    pub captured: Captured<B>,
}

/// A decoder-only target model on backend `B`.
pub struct TargetModel<B: Backend> {
    pub spec: ModelSpec,
    pub embed_tokens: B::Matrix,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `None` when the LM head is tied to `embed_tokens`.
    pub lm_head: Option<B::Matrix>,
}

impl<B: Backend> TargetModel<B> {
    pub fn load(be: &B, spec: &ModelSpec, src: &dyn WeightSource) -> Result<Self> {
        let (v, d) = (spec.vocab_size, spec.hidden_size);
        let embed_tokens = load_matrix(be, src, "model.embed_tokens.weight", v, d)?;
        let layers = (0..spec.num_layers)
            .map(|i| DecoderLayer::load(be, src, i, spec))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(be, src, "model.norm.weight", d, spec.rms_norm_eps)?;
        let lm_head = if src.contains("lm_head.weight") {
            Some(load_matrix(be, src, "lm_head.weight", v, d)?)
        } else {
            None
        };
        if lm_head.is_none() && !spec.tie_word_embeddings {
            tracing::warn!(
                "{}: no lm_head.weight although tie_word_embeddings is false; using the embedding",
                src.path().display()
            );
        }
        Ok(TargetModel {
            spec: spec.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.layers.len())
    }

    /// The LM head matrix (shared with the drafter).
    pub fn head(&self) -> &B::Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Run `ids` (positions `cache.len..`) through the model, appending to the cache and capturing
    /// the hidden states `capture` asks for.
    pub fn forward(
        &self,
        be: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
        capture: &Capture,
    ) -> Result<ForwardOutput<B>> {
        let start = cache.len;
        let limit = self.spec.max_position_embeddings;
        if start + ids.len() > limit {
            bail!(
                "sequence of {} tokens exceeds the model's max_position_embeddings {limit}",
                start + ids.len()
            );
        }
        let out = self.run_layers(be, ids, capture, |i, layer, h| {
            layer.forward(be, h, start, &mut cache.layers[i])
        })?;
        cache.len += ids.len();
        Ok(out)
    }

    /// Prefill several whole sequences at once: `ids` holds them concatenated, sequence i being
    /// rows `seq_starts[i]..seq_starts[i + 1]` (`seq_starts` runs from 0 to `ids.len()`, every
    /// sequence non-empty). Each sequence starts at position 0 and attends only to itself, so row
    /// for row the result is what [`TargetModel::forward`] gives for that sequence alone with a
    /// fresh cache; the captured states (same indices as `forward`) hold all rows in `ids` order.
    ///
    /// Why: one forward over many prompts fills the GPU (matmuls over thousands of rows), and
    /// varlen attention never forms a T×T score matrix across sequences.
    pub fn forward_packed(
        &self,
        be: &B,
        ids: &[u32],
        seq_starts: &[usize],
        capture: &Capture,
    ) -> Result<ForwardOutput<B>> {
        check_seq_starts(seq_starts, ids.len())?;
        let limit = self.spec.max_position_embeddings;
        let mut positions = Vec::with_capacity(ids.len());
        for (n, w) in seq_starts.windows(2).enumerate() {
            let len = w[1] - w[0];
            if len > limit {
                bail!("packed sequence {n} of {len} tokens exceeds the model's max_position_embeddings {limit}");
            }
            positions.extend(0..len as u32);
        }
        self.run_layers(be, ids, capture, |_, layer, h| {
            layer.forward_packed(be, h, &positions, seq_starts)
        })
    }

    /// Embedding → every layer (through `layer_fn`) → final norm, offering each hidden state to
    /// `capture` (HF index i+1 = output of layer i; index L is the *normed* output).
    fn run_layers(
        &self,
        be: &B,
        ids: &[u32],
        capture: &Capture,
        mut layer_fn: impl FnMut(usize, &DecoderLayer<B>, &mut B::Tensor) -> Result<()>,
    ) -> Result<ForwardOutput<B>> {
        let mut captured = Captured::default();
        let mut h = be.embed(&self.embed_tokens, ids)?;
        captured.offer(be, capture, 0, &h)?;
        for (i, layer) in self.layers.iter().enumerate() {
            layer_fn(i, layer, &mut h)?;
            if i + 1 < self.layers.len() {
                captured.offer(be, capture, i + 1, &h)?;
            }
        }
        if capture.prenorm {
            captured.prenorm = Some(be.slice_rows(&h, 0, ids.len())?);
        }
        let last_hidden = self.norm.forward(be, &h)?;
        captured.offer(be, capture, self.layers.len(), &last_hidden)?;
        Ok(ForwardOutput {
            last_hidden,
            captured,
        })
    }

    /// Top-k next-token log-probabilities for every row of `hidden` (final-norm states).
    pub fn logits_topk(&self, be: &B, hidden: &B::Tensor, k: usize) -> Result<TopK> {
        be.lm_head_topk(hidden, self.head(), k)
    }
}

/// `seq_starts` must run from 0 to `rows` and strictly increase (every sequence non-empty).
fn check_seq_starts(seq_starts: &[usize], rows: usize) -> Result<()> {
    if seq_starts.len() < 2 {
        bail!("packed forward: sequence starts {seq_starts:?} hold no sequence (need at least [0, len])");
    }
    if seq_starts.first() != Some(&0) {
        bail!("packed forward: sequence starts {seq_starts:?} must begin at 0");
    }
    if seq_starts.last() != Some(&rows) {
        bail!("packed forward: sequence starts {seq_starts:?} must end at the token count {rows}");
    }
    if let Some(w) = seq_starts.windows(2).find(|w| w[0] >= w[1]) {
        bail!(
            "packed forward: sequence starts {seq_starts:?} must strictly increase (found {} then {}; every sequence needs at least one token)",
            w[0],
            w[1]
        );
    }
    Ok(())
}
