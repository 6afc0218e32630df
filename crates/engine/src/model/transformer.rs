//! The target model: a pre-norm decoder (LLaMA / Qwen2 / Qwen3, and the Qwen3.5 / Qwen3-Next
//! hybrids) over the backend seam.
//!
//! One struct per Hugging Face module, each loading its weights by their exact HF names, so the
//! weight map can be read straight off the code. Forward semantics follow
//! `transformers/models/qwen3/modeling_qwen3.py`: RMSNorm → q/k/v → (q/k per-head norm) → RoPE →
//! causal GQA attention → o_proj → residual → RMSNorm → SwiGLU MLP → residual; final norm; LM head
//! (tied to the embedding when `lm_head.weight` is absent). Hybrids (`modeling_qwen3_5.py`,
//! docs/hybrid-models.md) use zero-centred RMSNorms, a sigmoid output gate on attention, partial
//! RoPE, and a Gated DeltaNet ([`super::gdn`]) instead of attention in most layers.

use super::capture::{Capture, Captured};
use super::config::ModelSpec;
pub use super::decoder::{DecoderLayer, Mixer};
use super::gpt_oss::GptOssAttention;
pub use super::kv_cache::KvCache;
use super::kv_cache::LayerCache;
use crate::backend::raw::RawPart;
use crate::backend::{
    AttnExtras, AttnShape, Backend, GdnProfile, KvSlot, QkNorm, Rope, SeqStarts, TopK,
};
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
    load_stacked_matrix(be, src, &[(name.to_string(), out)], inp)
}

/// Load 2-D weights `[out_i, inp]` (by HF name and expected row count) stacked by output rows
/// into one `[Σ out_i, inp]` matrix: a fused projection (q | k | v, gate | up), one GEMM instead of
/// several. Tensors stored as F32/F16/BF16 go to the backend as their stored bytes
/// ([`Backend::matrix_stacked_raw`]: no host f32 copy on CUDA); others (quantised GGUF) are
/// dequantised one tensor at a time. Either way the device holds one stacked copy.
pub(crate) fn load_stacked_matrix<B: Backend>(
    be: &B,
    src: &dyn WeightSource,
    parts: &[(String, usize)],
    inp: usize,
) -> Result<B::Matrix> {
    let p = src.path().display();
    let check = |name: &str, shape: &[usize], o: usize| -> Result<()> {
        if shape != [o, inp] {
            bail!("{p}: tensor {name} has shape {shape:?}, the config implies [{o}, {inp}]");
        }
        Ok(())
    };
    // Dequantised tensors live here while their raw views below borrow them.
    let mut owned = Vec::new();
    let mut raws = Vec::with_capacity(parts.len());
    for (name, o) in parts {
        match src.raw(name)? {
            Some(r) => {
                check(name, &[r.rows, r.cols], *o)?;
                raws.push(Some(r));
            }
            None => {
                let t = src.tensor(name)?;
                check(name, &t.shape, *o)?;
                owned.push(t);
                raws.push(None);
            }
        }
    }
    let mut host = owned.iter();
    let views: Vec<RawPart<'_>> = raws
        .into_iter()
        .zip(parts)
        .map(|(r, (_, o))| {
            r.unwrap_or_else(|| RawPart::from_f32(&host.next().expect("owned").data, *o, inp))
        })
        .collect();
    let m = be.matrix_stacked_raw(&views).with_context(|| {
        let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
        format!("{p}: uploading {}", names.join(" + "))
    })?;
    for (name, _) in parts {
        src.release(name);
    }
    Ok(m)
}

/// Load 1-D weights (biases) of the given lengths, concatenated into one `[1, Σ n_i]` tensor
/// (the bias of a fused projection, stacked like [`load_stacked_matrix`]).
pub(crate) fn load_stacked_vector<B: Backend>(
    be: &B,
    src: &dyn WeightSource,
    parts: &[(String, usize)],
) -> Result<B::Tensor> {
    let total: usize = parts.iter().map(|(_, n)| n).sum();
    let mut data = Vec::with_capacity(total);
    for (name, n) in parts {
        let t = src.tensor(name)?;
        if t.shape != [*n] {
            bail!(
                "{}: tensor {name} has shape {:?}, the config implies [{n}]",
                src.path().display(),
                t.shape
            );
        }
        data.extend_from_slice(&t.data);
    }
    be.from_host(&data, 1, total)
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
    /// The stored weight `w`: the scale itself, or `1 + w` is the scale when `zero_centred`.
    pub weight: B::Tensor,
    pub eps: f32,
    pub group: usize,
    /// Qwen3.5 / Qwen3-Next `…RMSNorm`: scale by `1 + w` ([`Backend::rms_norm_zero_centred`]).
    pub zero_centred: bool,
}

impl<B: Backend> RmsNorm<B> {
    pub fn load(be: &B, src: &dyn WeightSource, name: &str, n: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm {
            weight: load_vector(be, src, name, n)?,
            eps,
            group: n,
            zero_centred: false,
        })
    }
    /// The model's norm kind: zero-centred for the hybrids, plain otherwise.
    pub fn load_for(
        be: &B,
        src: &dyn WeightSource,
        name: &str,
        n: usize,
        spec: &ModelSpec,
    ) -> Result<Self> {
        let mut norm = Self::load(be, src, name, n, spec.rms_norm_eps)?;
        norm.zero_centred = spec.arch.is_hybrid();
        Ok(norm)
    }
    pub fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        if self.zero_centred {
            be.rms_norm_zero_centred(x, &self.weight, self.eps, self.group)
        } else {
            be.rms_norm(x, &self.weight, self.eps, self.group)
        }
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) ⊙ up(x))`, with gate and up as one fused
/// projection.
pub struct Mlp<B: Backend> {
    /// `gate_proj` and `up_proj` stacked by output rows, `[2·I, D]` (gate rows first): one GEMM
    /// whose output [`Backend::swiglu_packed`] consumes.
    pub gate_up_proj: B::Matrix,
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
            gate_up_proj: load_stacked_matrix(
                be,
                src,
                &[
                    (format!("{prefix}.gate_proj.weight"), inter),
                    (format!("{prefix}.up_proj.weight"), inter),
                ],
                hidden,
            )?,
            down_proj: load_matrix(
                be,
                src,
                &format!("{prefix}.down_proj.weight"),
                hidden,
                inter,
            )?,
        })
    }

    /// `silu(gate(x)) ⊙ up(x)`, the input of `down_proj`.
    fn act(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        be.swiglu_packed(&be.matmul(x, &self.gate_up_proj)?)
    }

    pub fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        be.matmul(&self.act(be, x)?, &self.down_proj)
    }

    /// `h += forward(x)`, the residual add done by the down projection
    /// ([`Backend::matmul_acc`]).
    pub fn forward_acc(&self, be: &B, x: &B::Tensor, h: &mut B::Tensor) -> Result<()> {
        be.matmul_acc(&self.act(be, x)?, &self.down_proj, h)
    }
}

/// How a cached forward computes its new rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedRows {
    /// One causal pass over the new rows (attention over the cache and the block at once; a
    /// Gated DeltaNet's chunked rule): the prefill.
    Causal,
    /// Each row as the decode step of that token would compute it
    /// ([`TargetModel::forward_verify`]).
    AsDecodeSteps,
}

/// Causal self-attention with grouped KV heads, optional q/k/v biases (Qwen2) and optional
/// per-head q/k RMSNorm before RoPE (Qwen3).
pub struct Attention<B: Backend> {
    /// `q_proj`, `k_proj` and `v_proj` stacked by output rows, `[qd + 2·kvd, D]`: one GEMM whose
    /// output columns are q | k | v.
    pub qkv_proj: B::Matrix,
    pub o_proj: B::Matrix,
    /// The q, k and v biases stacked likewise, `[1, qd + 2·kvd]` (Qwen2).
    pub qkv_bias: Option<B::Tensor>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    /// The hybrids' output gate `[H·hd, D]`: the gate rows of `q_proj` (which stores each head's
    /// query rows then its gate rows, `[q_h0 | g_h0 | q_h1 | g_h1 | …]`); the output is
    /// `attn ⊙ sigmoid(x · gateᵀ)` before `o_proj`.
    pub gate_proj: Option<B::Matrix>,
    pub shape: AttnShape,
    pub rope: Rope,
    /// gpt-oss's o_proj bias, sinks, window and YaRN; its forwards take over when set
    /// (`model::gpt_oss::layers`).
    pub gpt_oss: Option<GptOssAttention<B>>,
}

/// The fused `[q | k | v]` and the gate matrices of a gated attention layer (Qwen3.5 / Qwen3-Next,
/// `modeling_qwen3_5.py`): `q_proj` stores per head `hd` query rows then `hd` gate rows. Stored
/// F32/F16/BF16 weights go to the backend as row views of their bytes (no host copy, as
/// [`load_stacked_matrix`]); quantised GGUF tensors are dequantised and split on the host.
fn load_gated_qkv<B: Backend>(
    be: &B,
    src: &dyn WeightSource,
    prefix: &str,
    spec: &ModelSpec,
) -> Result<(B::Matrix, B::Matrix)> {
    let (d, hd, heads) = (spec.hidden_size, spec.head_dim, spec.num_heads);
    let kvd = spec.num_kv_heads * hd;
    let q_name = format!("{prefix}.q_proj.weight");
    let kv = [
        (format!("{prefix}.k_proj.weight"), kvd),
        (format!("{prefix}.v_proj.weight"), kvd),
    ];
    let p = src.path().display();
    let check = |name: &str, shape: &[usize], rows: usize, what: &str| -> Result<()> {
        if shape != [rows, d] {
            bail!("{p}: tensor {name} has shape {shape:?}, the config implies [{rows}, {d}]{what}");
        }
        Ok(())
    };
    let q_rows = 2 * heads * hd;
    let per_head = " (query and gate rows per head)";
    let raws = (src.raw(&q_name)?, src.raw(&kv[0].0)?, src.raw(&kv[1].0)?);
    let (qkv, gate) = if let (Some(q), Some(k), Some(v)) = raws {
        check(&q_name, &[q.rows, q.cols], q_rows, per_head)?;
        check(&kv[0].0, &[k.rows, k.cols], kvd, "")?;
        check(&kv[1].0, &[v.rows, v.cols], kvd, "")?;
        let rows_of = |first: usize| (0..heads).map(move |h| q.row_range((2 * h + first) * hd, hd));
        let qkv: Vec<RawPart<'_>> = rows_of(0).chain([k, v]).collect();
        let gate: Vec<RawPart<'_>> = rows_of(1).collect();
        (be.matrix_stacked_raw(&qkv), be.matrix_stacked_raw(&gate))
    } else {
        let qt = src.tensor(&q_name)?;
        check(&q_name, &qt.shape, q_rows, per_head)?;
        let (mut q, mut gate) = (Vec::new(), Vec::new());
        for (i, rows) in qt.data.chunks(hd * d).enumerate() {
            if i % 2 == 0 { &mut q } else { &mut gate }.extend_from_slice(rows);
        }
        for (n, rows) in &kv {
            let t = src.tensor(n)?;
            check(n, &t.shape, *rows, "")?;
            q.extend_from_slice(&t.data);
        }
        let qkv_rows = heads * hd + 2 * kvd;
        (be.matrix(&q, qkv_rows, d), be.matrix(&gate, heads * hd, d))
    };
    let ctx =
        || format!("{p}: uploading {q_name} (split into query and gate rows) + k_proj + v_proj");
    let (qkv, gate) = (qkv.with_context(ctx)?, gate.with_context(ctx)?);
    for n in [&q_name, &kv[0].0, &kv[1].0] {
        src.release(n);
    }
    Ok((qkv, gate))
}

impl<B: Backend> Attention<B> {
    pub fn load(be: &B, src: &dyn WeightSource, prefix: &str, spec: &ModelSpec) -> Result<Self> {
        let (d, hd) = (spec.hidden_size, spec.head_dim);
        let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let stacked = |what: &str| {
            [
                (format!("{prefix}.q_proj.{what}"), qd),
                (format!("{prefix}.k_proj.{what}"), kvd),
                (format!("{prefix}.v_proj.{what}"), kvd),
            ]
        };
        let qkv_bias = if spec.attention_bias {
            Some(load_stacked_vector(be, src, &stacked("bias"))?)
        } else {
            None
        };
        let (q_norm, k_norm) = if spec.qk_norm {
            (
                Some(RmsNorm::load_for(
                    be,
                    src,
                    &format!("{prefix}.q_norm.weight"),
                    hd,
                    spec,
                )?),
                Some(RmsNorm::load_for(
                    be,
                    src,
                    &format!("{prefix}.k_norm.weight"),
                    hd,
                    spec,
                )?),
            )
        } else {
            (None, None)
        };
        let (qkv_proj, gate_proj) = if spec.arch.is_hybrid() {
            let (qkv, gate) = load_gated_qkv(be, src, prefix, spec)?;
            (qkv, Some(gate))
        } else {
            (load_stacked_matrix(be, src, &stacked("weight"), d)?, None)
        };
        Ok(Attention {
            qkv_proj,
            o_proj: load_matrix(be, src, &format!("{prefix}.o_proj.weight"), d, qd)?,
            qkv_bias,
            q_norm,
            k_norm,
            gate_proj,
            shape: AttnShape {
                heads: spec.num_heads,
                kv_heads: spec.num_kv_heads,
                head_dim: hd,
            },
            rope: spec.rope(),
            gpt_oss: None,
        })
    }

    /// The fused projection `[T, qd + 2·kvd]` of `x` (q | k | v columns, biases added).
    pub(crate) fn project_qkv(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let mut qkv = be.matmul(x, &self.qkv_proj)?;
        if let Some(b) = &self.qkv_bias {
            be.add_row_bias(&mut qkv, b)?;
        }
        Ok(qkv)
    }

    /// Project `x` to rotated q, k and v for tokens at `positions`.
    pub fn qkv(
        &self,
        be: &B,
        x: &B::Tensor,
        positions: &[u32],
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let (mut q, mut k, v) =
            crate::backend::compose::split_qkv(be, &self.project_qkv(be, x)?, self.shape)?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(be, &q)?;
            k = kn.forward(be, &k)?;
        }
        be.rope_inplace(&mut q, positions, &self.rope)?;
        be.rope_inplace(&mut k, positions, &self.rope)?;
        Ok((q, k, v))
    }

    /// Attend the new tokens (at positions `start..start+T`) over the cache, appending their K/V,
    /// and add the output projection to the residual stream `h`; `rows` says how (one causal
    /// attention, or each row as its decode step: [`TargetModel::forward_verify`]).
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        start: usize,
        cache: &mut LayerCache<B>,
        h: &mut B::Tensor,
        rows: CachedRows,
    ) -> Result<()> {
        if let Some(g) = &self.gpt_oss {
            return g.forward(self, be, x, start, cache, h, rows);
        }
        let t = be.dims(x).0;
        let positions: Vec<u32> = (start..start + t).map(|p| p as u32).collect();
        let (q, k, v) = self.qkv(be, x, &positions)?;
        let o = match rows {
            CachedRows::Causal => cache.append_and_attend(be, &q, k, v, self.shape, start)?,
            CachedRows::AsDecodeSteps => {
                let slot = KvSlot {
                    k: &mut cache.k,
                    v: &mut cache.v,
                };
                be.attention_verify(&q, &k, &v, self.shape, slot, AttnExtras::NONE)?
            }
        };
        self.output(be, x, o, h)
    }

    /// `h += o_proj(o)`, with `o` first gated by `sigmoid(x · gate_projᵀ)` on the hybrids.
    pub(crate) fn output(
        &self,
        be: &B,
        x: &B::Tensor,
        mut o: B::Tensor,
        h: &mut B::Tensor,
    ) -> Result<()> {
        if let Some(g) = &self.gate_proj {
            be.sigmoid_gate_inplace(&mut o, &be.matmul(x, g)?)?;
        }
        be.matmul_acc(&o, &self.o_proj, h)
    }

    /// One decode step of several sequences: row r of `x` is the next token of the sequence whose
    /// cache is `caches[r]`, at position `caches[r]`'s length. The projections run over all rows
    /// at once; each row then attends over its own cache (appending its K/V) through
    /// [`Backend::attention_decode_qkv`] (dense models: q/k norm and RoPE fused on the QKV
    /// output) or [`Backend::attention_decode`] (hybrids), whose defaults are exactly
    /// [`Attention::forward`]'s append-then-attend for that row alone.
    pub fn forward_decode(
        &self,
        be: &B,
        x: &B::Tensor,
        caches: &mut [&mut LayerCache<B>],
        starts: &[usize],
        h: &mut B::Tensor,
    ) -> Result<()> {
        if let Some(g) = &self.gpt_oss {
            return g.forward_decode(self, be, x, caches, starts, h);
        }
        let positions: Vec<u32> = starts.iter().map(|&s| s as u32).collect();
        let mut slots: Vec<KvSlot<'_, B::Tensor>> = caches
            .iter_mut()
            .map(|c| KvSlot {
                k: &mut c.k,
                v: &mut c.v,
            })
            .collect();
        if self.gate_proj.is_some() {
            // Hybrid: zero-centred q/k norms, which the fused QKV path does not cover.
            let (q, k, v) = self.qkv(be, x, &positions)?;
            let o = be.attention_decode(&q, &k, &v, self.shape, &mut slots)?;
            return self.output(be, x, o, h);
        }
        let qkv = self.project_qkv(be, x)?;
        let o = be.attention_decode_qkv(
            qkv,
            self.shape,
            self.qk_norm(),
            &positions,
            &self.rope,
            &mut slots,
        )?;
        be.matmul_acc(&o, &self.o_proj, h)
    }

    /// Attend several whole sequences packed row-wise (`seq_starts`, see
    /// [`Backend::attention_varlen`]), each causal over itself only, and add the output
    /// projection to `h`; `positions` restart at 0 for every sequence. No KV cache: this is
    /// prefill only, so q/k/v never need to exist as separate tensors
    /// ([`Backend::attention_varlen_qkv`] works on the fused projection).
    pub fn forward_packed(
        &self,
        be: &B,
        x: &B::Tensor,
        positions: &[u32],
        seq_starts: &SeqStarts,
        h: &mut B::Tensor,
    ) -> Result<()> {
        if let Some(g) = &self.gpt_oss {
            return g.forward_packed(self, be, x, positions, seq_starts, h);
        }
        if self.gate_proj.is_some() {
            // Hybrid: zero-centred q/k norms, which the fused QKV path does not cover.
            let (q, k, v) = self.qkv(be, x, positions)?;
            let o = be.attention_varlen(&q, &k, &v, self.shape, seq_starts)?;
            return self.output(be, x, o, h);
        }
        let qkv = self.project_qkv(be, x)?;
        let o = be.attention_varlen_qkv(
            qkv,
            self.shape,
            self.qk_norm(),
            positions,
            &self.rope,
            seq_starts,
        )?;
        be.matmul_acc(&o, &self.o_proj, h)
    }

    /// The per-head q/k norms as the fused QKV paths take them (dense models; the hybrids'
    /// zero-centred norms go through [`Attention::qkv`]).
    fn qk_norm(&self) -> Option<QkNorm<'_, B::Tensor>> {
        match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => Some(QkNorm {
                q: &qn.weight,
                k: &kn.weight,
                eps: qn.eps,
            }),
            _ => None,
        }
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
        // Before any upload: a backend that cannot compute the model refuses it here.
        super::gpt_oss::check_backend(be, spec)?;
        let (v, d) = (spec.vocab_size, spec.hidden_size);
        let embed_tokens = load_matrix(be, src, "model.embed_tokens.weight", v, d)?;
        let layers = (0..spec.num_layers)
            .map(|i| DecoderLayer::load(be, src, i, spec))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load_for(be, src, "model.norm.weight", d, spec)?;
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
        self.forward_cached(be, ids, cache, capture, CachedRows::Causal)
    }

    /// [`TargetModel::forward`] computing each row exactly as a decode step would
    /// ([`TargetModel::forward_decode`] of that token alone, after the rows before it): the
    /// verify pass of live speculative decoding, which then equals plain greedy decoding bit for
    /// bit on every backend (docs/live.md, "Verify equals decoding"). That needs `ids.len()` at
    /// most [`Backend::max_independent_rows`] (64 on CUDA), where every GEMM gives a row the bits
    /// of a one-row call; a longer block runs as [`TargetModel::forward`] does.
    ///
    /// Each attention layer attends row t over positions `..=start+t` through
    /// [`Backend::attention_verify`]; each Gated DeltaNet layer steps its state one row at a time.
    /// `DRAFTLENS_VERIFY=causal` runs the block as [`TargetModel::forward`] instead: the A/B
    /// switch of the cost comparison in docs/benchmarks-cuda.md, not a product setting.
    pub fn forward_verify(
        &self,
        be: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
        capture: &Capture,
    ) -> Result<ForwardOutput<B>> {
        static CAUSAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let causal =
            *CAUSAL.get_or_init(|| std::env::var("DRAFTLENS_VERIFY").is_ok_and(|v| v == "causal"));
        let rows = if !causal && ids.len() <= be.max_independent_rows() {
            CachedRows::AsDecodeSteps
        } else {
            CachedRows::Causal
        };
        self.forward_cached(be, ids, cache, capture, rows)
    }

    fn forward_cached(
        &self,
        be: &B,
        ids: &[u32],
        cache: &mut KvCache<B>,
        capture: &Capture,
        rows: CachedRows,
    ) -> Result<ForwardOutput<B>> {
        let start = cache.len;
        let limit = self.spec.max_position_embeddings;
        if start + ids.len() > limit {
            bail!(
                "sequence of {} tokens exceeds the model's max_position_embeddings {limit}",
                start + ids.len()
            );
        }
        if self.is_hybrid() {
            cache.take_checkpoint(be, ids, rows)?;
        }
        let out = self.run_layers(be, ids, capture, |i, layer, h| {
            layer.forward(be, h, start, &mut cache.layers[i], rows)
        })?;
        cache.len += ids.len();
        Ok(out)
    }

    /// Whether some layer is a Gated DeltaNet (its cache holds a recurrent state).
    pub fn is_hybrid(&self) -> bool {
        self.layers.iter().any(|l| matches!(l.mixer, Mixer::Gdn(_)))
    }

    /// The numeric profile of every Gated DeltaNet layer's core (default
    /// [`GdnProfile::Reference`]).
    pub fn set_gdn_profile(&mut self, profile: GdnProfile) {
        for l in &mut self.layers {
            if let Mixer::Gdn(g) = &mut l.mixer {
                g.profile = profile;
            }
        }
    }

    /// Keep the first `len` cached positions (speculative decoding drops the rejected tail of a
    /// verify pass). Dense models slice K/V. A hybrid's recurrent state cannot be sliced, so
    /// [`TargetModel::forward`] snapshots the states before each call: a crop to a length between
    /// that call's start and its end restores the snapshot, slices K/V to the start, and runs the
    /// kept tokens again, leaving exactly the cache an uncropped history of the kept tokens gives.
    /// Cropping further back than the last forward's start is an error on a hybrid.
    pub fn crop(&self, be: &B, cache: &mut KvCache<B>, len: usize) -> Result<()> {
        if len >= cache.len {
            return Ok(());
        }
        if !cache.has_recurrent_state() {
            return cache.crop(be, len);
        }
        let cp = match cache.checkpoint.take() {
            Some(cp) if cp.len <= len => cp,
            other => {
                let from = other.as_ref().map(|c| c.len);
                cache.checkpoint = other;
                bail!(
                    "cannot crop a hybrid model's cache to {len} tokens: its recurrent state is only recoverable back to the start of the last forward ({})",
                    from.map_or("no snapshot".to_string(), |l| format!("position {l}"))
                );
            }
        };
        cache.crop_attention(be, cp.len)?;
        for (layer, state) in cache.layers.iter_mut().zip(cp.states) {
            if layer.gdn.is_some() {
                layer.gdn = state;
            }
        }
        let replay = &cp.ids[..len - cp.len];
        if !replay.is_empty() {
            self.forward_cached(be, replay, cache, &Capture::none(), cp.rows)?;
        }
        Ok(())
    }

    /// One greedy-decoding step of several sequences: `ids[r]` is the next token of the sequence
    /// whose cache is `caches[r]` (each at its own position). Returns the final-norm hidden
    /// states `[ids.len(), D]`; row r equals what [`TargetModel::forward`] gives for `ids[r]` and
    /// `caches[r]` alone when `ids.len()` is at most [`Backend::max_independent_rows`].
    ///
    /// Why: a decode step of one token is a matrix-vector product that reads every weight for
    /// one row; decoding many prompts together reads them once for all rows.
    pub fn forward_decode(
        &self,
        be: &B,
        ids: &[u32],
        caches: &mut [&mut KvCache<B>],
    ) -> Result<B::Tensor> {
        if ids.len() != caches.len() {
            bail!(
                "decode step: {} tokens for {} caches",
                ids.len(),
                caches.len()
            );
        }
        let limit = self.spec.max_position_embeddings;
        let starts: Vec<usize> = caches.iter().map(|c| c.len).collect();
        if let Some(r) = starts.iter().position(|&s| s + 1 > limit) {
            bail!(
                "decode step: sequence {r} would exceed the model's max_position_embeddings {limit}"
            );
        }
        let out = self.run_layers(be, ids, &Capture::none(), |i, layer, h| {
            let mut layer_caches: Vec<&mut LayerCache<B>> =
                caches.iter_mut().map(|c| &mut c.layers[i]).collect();
            layer.forward_decode(be, h, &mut layer_caches, &starts)
        })?;
        for c in caches.iter_mut() {
            c.took_decode_step();
        }
        Ok(out.last_hidden)
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
        let seq_starts = &SeqStarts::non_empty(seq_starts.to_vec()).context("packed forward")?;
        seq_starts.check_rows("packed forward", ids.len())?;
        let limit = self.spec.max_position_embeddings;
        let mut positions = Vec::with_capacity(ids.len());
        for (n, rows) in seq_starts.ranges().enumerate() {
            let len = rows.len();
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
