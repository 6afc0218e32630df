//! The DFlash drafter forward pass (docs/dflash.md §1.1), over the backend seam.
//!
//! ```text
//! taps [S, n·Dt] ─ fc ─ hidden_norm ─► C [S, D]           (context features, once per sequence)
//! per layer: K_ctx = RoPE(k_norm(k_proj(C))), V_ctx = v_proj(C)   (cached, reused by every anchor)
//! block [y_a, MASK×(B−1)] ─ target embedding ─► x
//! per layer: h = input_layernorm(x); Q, K_blk, V_blk from h (q/k norm, RoPE at a..a+B−1)
//!            attention over [K_ctx rows < a ; the block's own rows] ─ o_proj ─ residual ─ MLP ─ residual
//! norm ─► target LM head ─► top-K for rows 1..B−1 (row k predicts the token at a+k)
//! ```
//! Context rows never pass through attention or MLPs; only each layer's k/v projections see them.

use super::config::{DrafterConfig, DrafterFamily, LayerKind};
use crate::backend::{AttnMask, AttnShape, Backend, HostRowsRef, TopK};
use crate::formats::WeightSource;
use crate::model::transformer::{load_matrix, Mlp, RmsNorm};
use crate::model::EmbedHead;
use anyhow::{bail, Result};
use std::path::Path;

/// Attention projections of one drafter layer (Qwen3-style: per-head q/k norm, no biases).
pub struct DraftAttention<B: Backend> {
    pub q_proj: B::Matrix,
    pub k_proj: B::Matrix,
    pub v_proj: B::Matrix,
    pub o_proj: B::Matrix,
    pub q_norm: RmsNorm<B>,
    pub k_norm: RmsNorm<B>,
}

pub struct DraftLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: DraftAttention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
    pub kind: LayerKind,
}

/// Context K/V of every drafter layer for positions `0..len` of one sequence.
pub struct DraftContext<B: Backend> {
    pub k: Vec<B::Tensor>,
    pub v: Vec<B::Tensor>,
    pub len: usize,
}

impl<B: Backend> DraftContext<B> {
    /// A context of no positions yet.
    pub fn empty() -> Self {
        DraftContext {
            k: Vec::new(),
            v: Vec::new(),
            len: 0,
        }
    }
}

/// How [`DFlashDrafter::draft`] drafts its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftOptions {
    /// Let a block see the context row of its anchor too (`j <= anchor`): the training-time leak
    /// of docs/dflash.md §2.4 item 1. `false` is one-anchor-at-a-time drafting.
    pub ctx_inclusive: bool,
    /// How many candidates to return per drafted position.
    pub top_k: usize,
}

pub struct DFlashDrafter<B: Backend> {
    /// `config.json` as parsed (the loader never changes it).
    pub cfg: DrafterConfig,
    /// The storage dtypes of the weights in `model.safetensors`, "+"-joined ("BF16", "F32").
    pub weights_dtype: String,
    pub fc: B::Matrix,
    pub hidden_norm: RmsNorm<B>,
    pub layers: Vec<DraftLayer<B>>,
    pub norm: RmsNorm<B>,
    pub shape: AttnShape,
}

/// Every tensor [`DFlashDrafter::load`] reads from `model.safetensors`, with its HF shape
/// (`[out, in]` for projections). `lint` checks it against the file's header before a run starts,
/// so a checkpoint missing a tensor is refused before anything is stored even
/// though its weights are loaded only when the first prompt needs them.
pub fn tensor_plan(cfg: &DrafterConfig, target_hidden: usize) -> Vec<(String, Vec<usize>)> {
    let (d, hd, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut plan = vec![
        (
            "fc.weight".to_string(),
            vec![d, cfg.target_layer_ids.len() * target_hidden],
        ),
        ("hidden_norm.weight".into(), vec![d]),
        ("norm.weight".into(), vec![d]),
    ];
    for i in 0..cfg.num_layers {
        let p = format!("layers.{i}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![d]),
            ("self_attn.q_proj.weight", vec![qd, d]),
            ("self_attn.k_proj.weight", vec![kvd, d]),
            ("self_attn.v_proj.weight", vec![kvd, d]),
            ("self_attn.o_proj.weight", vec![d, qd]),
            ("self_attn.q_norm.weight", vec![hd]),
            ("self_attn.k_norm.weight", vec![hd]),
            ("post_attention_layernorm.weight", vec![d]),
            ("mlp.gate_proj.weight", vec![inter, d]),
            ("mlp.up_proj.weight", vec![inter, d]),
            ("mlp.down_proj.weight", vec![d, inter]),
        ] {
            plan.push((format!("{p}.{name}"), shape));
        }
    }
    plan
}

impl<B: Backend> DFlashDrafter<B> {
    /// Load a checkpoint folder. `target_hidden` is the target's hidden size (taps width). A
    /// DFlash2 checkpoint is refused: loaded as DFlash it would lose its convolutions and
    /// candidate selector without a word (`super::dflash2` loads it).
    pub fn load(be: &B, dir: &Path, target_hidden: usize) -> Result<Self> {
        if DrafterFamily::detect(dir)? == DrafterFamily::DFlash2 {
            bail!("{}: a DFlash2 checkpoint; loading it as DFlash would drop its convolutions and candidate selector (docs/dflash2.md)", dir.join("config.json").display());
        }
        Self::load_backbone(be, dir, DrafterConfig::load(dir)?, target_hidden)
    }

    /// The DFlash tensors of checkpoint `dir` under `cfg`: the whole DFlash drafter, or the
    /// backbone DFlash2 wraps (`super::dflash2`).
    pub(crate) fn load_backbone(
        be: &B,
        dir: &Path,
        cfg: DrafterConfig,
        target_hidden: usize,
    ) -> Result<Self> {
        let src = super::gguf::open_weights(dir)?;
        let d = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let (hd, qd, kvd) = (
            cfg.head_dim,
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let dtypes: std::collections::BTreeSet<String> =
            src.tensors().into_iter().map(|t| t.dtype).collect();
        let weights_dtype = dtypes.into_iter().collect::<Vec<_>>().join("+");
        let taps = cfg.target_layer_ids.len();
        let fc = load_matrix(be, &src, "fc.weight", d, taps * target_hidden)?;
        let mut layers = Vec::new();
        for i in 0..cfg.num_layers {
            let p = format!("layers.{i}");
            layers.push(DraftLayer {
                input_layernorm: RmsNorm::load(
                    be,
                    &src,
                    &format!("{p}.input_layernorm.weight"),
                    d,
                    eps,
                )?,
                self_attn: DraftAttention {
                    q_proj: load_matrix(be, &src, &format!("{p}.self_attn.q_proj.weight"), qd, d)?,
                    k_proj: load_matrix(be, &src, &format!("{p}.self_attn.k_proj.weight"), kvd, d)?,
                    v_proj: load_matrix(be, &src, &format!("{p}.self_attn.v_proj.weight"), kvd, d)?,
                    o_proj: load_matrix(be, &src, &format!("{p}.self_attn.o_proj.weight"), d, qd)?,
                    q_norm: RmsNorm::load(
                        be,
                        &src,
                        &format!("{p}.self_attn.q_norm.weight"),
                        hd,
                        eps,
                    )?,
                    k_norm: RmsNorm::load(
                        be,
                        &src,
                        &format!("{p}.self_attn.k_norm.weight"),
                        hd,
                        eps,
                    )?,
                },
                post_attention_layernorm: RmsNorm::load(
                    be,
                    &src,
                    &format!("{p}.post_attention_layernorm.weight"),
                    d,
                    eps,
                )?,
                mlp: Mlp::load(be, &src, &format!("{p}.mlp"), d, cfg.intermediate_size)?,
                kind: cfg.layer_kinds[i],
            });
        }
        let shape = AttnShape {
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: hd,
        };
        Ok(DFlashDrafter {
            hidden_norm: RmsNorm::load(be, &src, "hidden_norm.weight", d, eps)?,
            norm: RmsNorm::load(be, &src, "norm.weight", d, eps)?,
            fc,
            layers,
            shape,
            cfg,
            weights_dtype,
        })
    }

    fn check_tap_count(&self, taps: usize) -> Result<()> {
        let want = self.cfg.target_layer_ids.len();
        if taps != want {
            bail!("drafter expects {want} taps, got {taps}");
        }
        Ok(())
    }

    /// Context K/V for positions `0..S` from the taps (`taps[j]` is `[S, Dt]` row-major, in
    /// `target_layer_ids` order, f32 or bf16: see [`HostRowsRef`]).
    pub fn context<'t, T: Into<HostRowsRef<'t>> + Copy>(
        &self,
        be: &B,
        taps: &[T],
        target_hidden: usize,
    ) -> Result<DraftContext<B>> {
        let mut ctx = DraftContext::empty();
        self.extend_context(be, &mut ctx, taps, target_hidden)?;
        Ok(ctx)
    }

    /// Append context rows for positions `ctx.len..ctx.len+n` (live decoding adds the taps of
    /// each verify pass's accepted tokens).
    pub fn extend_context<'t, T: Into<HostRowsRef<'t>> + Copy>(
        &self,
        be: &B,
        ctx: &mut DraftContext<B>,
        taps: &[T],
        target_hidden: usize,
    ) -> Result<()> {
        self.check_tap_count(taps.len())?;
        let taps: Vec<HostRowsRef> = taps.iter().map(|&t| t.into()).collect();
        let n = taps[0].len() / target_hidden;
        if n == 0 {
            return Ok(());
        }
        // bf16 taps (the CUDA backend's) are uploaded as they are: no conversion on the host.
        let upload = crate::timeline::phase("drafter context: tap upload");
        let parts: Vec<B::Tensor> = taps
            .iter()
            .map(|&t| be.from_host_rows(t, n, target_hidden))
            .collect::<Result<_>>()?;
        drop(upload);
        let refs: Vec<&B::Tensor> = parts.iter().collect();
        self.extend_context_tensors(be, ctx, &refs)
    }

    /// Context K/V for positions `0..S` from taps already on the device (`taps[j]` is `[S, Dt]`,
    /// in `target_layer_ids` order): what [`DFlashDrafter::context`] computes after its upload.
    pub fn context_from_tensors(&self, be: &B, taps: &[&B::Tensor]) -> Result<DraftContext<B>> {
        let mut ctx = DraftContext::empty();
        self.extend_context_tensors(be, &mut ctx, taps)?;
        Ok(ctx)
    }

    /// [`DFlashDrafter::extend_context`] from device tensors: `fc` over the taps side by side,
    /// `hidden_norm`, then each layer's K (normed, rotated) and V appended to `ctx`.
    fn extend_context_tensors(
        &self,
        be: &B,
        ctx: &mut DraftContext<B>,
        taps: &[&B::Tensor],
    ) -> Result<()> {
        self.check_tap_count(taps.len())?;
        // concat_cols refuses taps of different row counts.
        let n = be.dims(taps[0]).0;
        if n == 0 {
            return Ok(());
        }
        let fused = be.concat_cols(taps)?;
        let c = self
            .hidden_norm
            .forward(be, &be.matmul(&fused, &self.fc)?)?;
        let positions: Vec<u32> = (ctx.len..ctx.len + n).map(|p| p as u32).collect();
        let rope = self.cfg.rope();
        for (i, l) in self.layers.iter().enumerate() {
            let mut k = l
                .self_attn
                .k_norm
                .forward(be, &be.matmul(&c, &l.self_attn.k_proj)?)?;
            be.rope_inplace(&mut k, &positions, &rope)?;
            let v = be.matmul(&c, &l.self_attn.v_proj)?;
            if i < ctx.k.len() {
                ctx.k[i] = be.concat_rows(&[&ctx.k[i], &k])?;
                ctx.v[i] = be.concat_rows(&[&ctx.v[i], &v])?;
            } else {
                ctx.k.push(k);
                ctx.v.push(v);
            }
        }
        ctx.len += n;
        Ok(())
    }

    /// Draft one block per anchor: `anchors[n]` is the absolute position of the anchor token
    /// `anchor_tokens[n]`; it sees context rows `< anchor` (`<= anchor` with
    /// [`DraftOptions::ctx_inclusive`], the training leak). Returns the top-`opts.top_k` for the
    /// B−1 drafted positions of every block, block by block (`anchors.len() * (B−1)` rows).
    pub fn draft(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        ctx: &DraftContext<B>,
        anchors: &[usize],
        anchor_tokens: &[u32],
        opts: DraftOptions,
    ) -> Result<TopK> {
        let out = self.draft_hidden(be, target, ctx, anchors, anchor_tokens, opts.ctx_inclusive)?;
        // Where the device work queued above is waited for (the top-K download synchronises).
        let _head = crate::timeline::phase("drafter LM head + top-K");
        target.logits_topk(be, &out, opts.top_k)
    }

    /// [`DFlashDrafter::draft`] up to the LM head: the final-norm hidden states of the drafted
    /// positions, block by block (what sampling at T > 0 multiplies by the whole LM head).
    pub fn draft_hidden(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        ctx: &DraftContext<B>,
        anchors: &[usize],
        anchor_tokens: &[u32],
        ctx_inclusive: bool,
    ) -> Result<B::Tensor> {
        let (ids, positions) = self.block_inputs(anchors, anchor_tokens)?;
        let layers = crate::timeline::phase("drafter layers");
        let mut x = be.embed(target.embed_tokens(), &ids)?;
        for (i, l) in self.layers.iter().enumerate() {
            let h = l.input_layernorm.forward(be, &x)?;
            let m = self.cfg.layer_mask(i);
            let mask = AttnMask::Blocks {
                ctx_len: ctx.len,
                block: self.cfg.block_size,
                anchors: anchors.to_vec(),
                ctx_inclusive,
                causal_in_block: m.causal_in_block,
                window: m.window,
            };
            be.add_inplace(&mut x, &self.attend(be, i, &h, &positions, ctx, &mask)?)?;
            let h = l.post_attention_layernorm.forward(be, &x)?;
            be.add_inplace(&mut x, &l.mlp.forward(be, &h)?)?;
        }
        let out = self.drafted_rows(be, &x, anchors.len())?;
        drop(layers);
        Ok(out)
    }

    /// The token ids and RoPE positions of the blocks `[y_a, MASK×(B−1)]` at `a..a+B−1`, block
    /// by block.
    pub(crate) fn block_inputs(
        &self,
        anchors: &[usize],
        anchor_tokens: &[u32],
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        let b = self.cfg.block_size;
        let n = anchors.len();
        if anchor_tokens.len() != n {
            bail!("{} anchor tokens for {n} anchors", anchor_tokens.len());
        }
        let mut ids = Vec::with_capacity(n * b);
        let mut positions = Vec::with_capacity(n * b);
        for (&a, &t) in anchors.iter().zip(anchor_tokens) {
            ids.push(t);
            ids.extend(std::iter::repeat(self.cfg.mask_token_id).take(b - 1));
            positions.extend((a..a + b).map(|p| p as u32));
        }
        Ok((ids, positions))
    }

    /// Layer `i`'s attention for the block rows `h` (after its input norm): Q, K, V of the block
    /// (q/k norm, RoPE at `positions`), keys and values of the context then the blocks, under
    /// `mask`, and `o_proj`: what the layer adds to the residual stream.
    pub(crate) fn attend(
        &self,
        be: &B,
        i: usize,
        h: &B::Tensor,
        positions: &[u32],
        ctx: &DraftContext<B>,
        mask: &AttnMask,
    ) -> Result<B::Tensor> {
        let rope = self.cfg.rope();
        let att = &self.layers[i].self_attn;
        let mut q = att.q_norm.forward(be, &be.matmul(h, &att.q_proj)?)?;
        let mut kb = att.k_norm.forward(be, &be.matmul(h, &att.k_proj)?)?;
        be.rope_inplace(&mut q, positions, &rope)?;
        be.rope_inplace(&mut kb, positions, &rope)?;
        let vb = be.matmul(h, &att.v_proj)?;
        let (k_all, v_all) = if ctx.len > 0 {
            (
                be.concat_rows(&[&ctx.k[i], &kb])?,
                be.concat_rows(&[&ctx.v[i], &vb])?,
            )
        } else {
            (kb, vb)
        };
        let o = be.attention(&q, &k_all, &v_all, self.shape, mask)?;
        be.matmul(&o, &att.o_proj)
    }

    /// The final norm of the drafted rows 1..B−1 of each of `n` blocks of the residual `x`.
    pub(crate) fn drafted_rows(&self, be: &B, x: &B::Tensor, n: usize) -> Result<B::Tensor> {
        let b = self.cfg.block_size;
        let rows: Vec<u32> = (0..n)
            .flat_map(|blk| (1..b).map(move |r| (blk * b + r) as u32))
            .collect();
        self.norm.forward(be, &be.gather_rows(x, &rows)?)
    }
}
