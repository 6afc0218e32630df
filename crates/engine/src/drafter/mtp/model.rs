//! The MTP head's draft chain over the backend seam (docs/mtp.md §2).
//!
//! ```text
//! mtp(token t, hidden h, position p):                   (vLLM Qwen3NextMultiTokenPredictor.forward)
//!     x  = fc([pre_fc_norm_embedding(embed(t)) │ pre_fc_norm_hidden(h)])        (2·D → D)
//!     x' = decoder layer(x) at position p   (full attention: gated, q/k norms, partial RoPE; causal)
//!     h' = norm(x')                          → logits = lm_head(h') (the target's head)
//! context row j = 0..S−2: h = the target's final-norm state at j, t = y_{j+1}, p = j
//! ```
//! At anchor a, step 1 *is* context row a − 1 (the target's state at a − 1 and the anchor token
//! y_a); step s ≥ 2 feeds the head its own normed output h'_{s−1} (vLLM's proposer keeps one
//! hidden tensor for MTP models: `model_returns_tuple()` is false) and its own top-1 d_{s−1} at
//! position a − 2 + s, seeing context rows < a and its earlier steps. This is EAGLE-3's chain
//! (`super::super::eagle3::model`, docs/eagle3.md §2) with another step function: many anchors
//! share each step's forward through the `Blocks` mask, and the chain runs step by step through
//! [`ChainDrafter`] (greedy records, and live sampling's drawn tokens at T > 0).

use super::head::{MtpHeadConfig, MtpWeights, FC, NORM, PRE_FC_NORM_EMBEDDING, PRE_FC_NORM_HIDDEN};
use crate::backend::{AttnMask, Backend, HostRowsRef, TopK};
use crate::drafter::chain::{attend_step, ChainContext, ChainDrafter, ChainRows, Choose};
use crate::drafter::sampling::ScoringHead;
use crate::model::decoder::{DecoderLayer, Mixer};
use crate::model::transformer::{load_matrix, Attention, RmsNorm};
use crate::model::{EmbedHead, ModelSpec};
use anyhow::{bail, Context, Result};
use std::path::Path;

pub struct MtpDrafter<B: Backend> {
    pub cfg: MtpHeadConfig,
    /// Draft steps per round (K).
    pub steps: usize,
    pre_fc_norm_embedding: RmsNorm<B>,
    pre_fc_norm_hidden: RmsNorm<B>,
    /// `[D, 2·D]`.
    fc: B::Matrix,
    layer: DecoderLayer<B>,
    norm: RmsNorm<B>,
}

/// The head's state over one sequence: context rows 0..len, row j = (the target's state at j,
/// token y_{j+1}) at position j.
pub struct MtpContext<B: Backend> {
    /// Rotated keys and the values of the context rows, `[len, kv_heads·head_dim]`.
    pub k: B::Tensor,
    pub v: B::Tensor,
    /// The head's normed output of every context row: row a − 1 is step 1 at anchor a.
    pub hidden: B::Tensor,
    pub len: usize,
}

/// One layer pass up to attention: the residual stream after `fc`, the normed layer input
/// (which the output gate reads), and rotated q, k, v.
struct Projected<B: Backend> {
    residual: B::Tensor,
    normed: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
}

impl<B: Backend> MtpDrafter<B> {
    /// The head of the target at `path` (described by `spec`), drafting `steps` tokens a round.
    /// Every check (head declared, one layer, every tensor present with its shape, K in range)
    /// runs before the first upload.
    pub fn load(be: &B, path: &Path, spec: &ModelSpec, steps: usize) -> Result<Self> {
        super::check_steps(steps)?;
        let cfg = MtpHeadConfig::read(path, spec)?;
        let src = MtpWeights::open(&cfg)?;
        let d = spec.hidden_size;
        let norm = |name: &str| RmsNorm::load_for(be, &src, name, d, spec);
        let layer = DecoderLayer::load(be, &src, 0, &cfg.layer_spec)
            .with_context(|| format!("{}: loading the MTP layer mtp.layers.0", path.display()))?;
        Ok(MtpDrafter {
            pre_fc_norm_embedding: norm(PRE_FC_NORM_EMBEDDING)?,
            pre_fc_norm_hidden: norm(PRE_FC_NORM_HIDDEN)?,
            fc: load_matrix(be, &src, FC, d, 2 * d)?,
            layer,
            norm: norm(NORM)?,
            cfg,
            steps,
        })
    }

    /// The records' block size (anchor + K steps).
    pub fn block_size(&self) -> usize {
        self.steps + 1
    }

    fn attention(&self) -> &Attention<B> {
        match &self.layer.mixer {
            Mixer::Attention(a) => a,
            Mixer::Gdn(_) => unreachable!("the MTP layer spec has one full-attention layer"),
        }
    }

    /// The context of a sequence `ids` from the target's final-norm states over it (`[S, D]`
    /// row-major, f32 or bf16). `None` for a sequence of one token (no context row, no anchor).
    pub fn context<'t>(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        hidden: impl Into<HostRowsRef<'t>>,
        ids: &[u32],
    ) -> Result<Option<MtpContext<B>>> {
        let h = be.from_host_rows(hidden.into(), ids.len(), self.cfg.layer_spec.hidden_size)?;
        self.context_from_tensor(be, target, &h, ids)
    }

    /// [`MtpDrafter::context`] from the states on the device: the head over rows j = 0..S−2
    /// (token `ids[j+1]`, position j), causal. The last position has no row: its next token is
    /// not part of the sequence.
    pub fn context_from_tensor(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        hidden: &B::Tensor,
        ids: &[u32],
    ) -> Result<Option<MtpContext<B>>> {
        let s = be.dims(hidden).0;
        if s != ids.len() {
            bail!(
                "target states of {s} positions for a sequence of {} tokens",
                ids.len()
            );
        }
        let rows = s.saturating_sub(1);
        if rows == 0 {
            return Ok(None);
        }
        let h = be.slice_rows(hidden, 0, rows)?;
        let emb = be.embed(target.embed_tokens(), &ids[1..])?;
        let positions: Vec<u32> = (0..rows as u32).collect();
        let p = self.project(be, &emb, &h, &positions)?;
        let o = be.attention(
            &p.q,
            &p.k,
            &p.v,
            self.attention().shape,
            &AttnMask::Causal { q_start: 0 },
        )?;
        let out = self.finish(be, &p.normed, o, p.residual)?;
        Ok(Some(MtpContext {
            k: p.k,
            v: p.v,
            hidden: out,
            len: rows,
        }))
    }

    /// Appends context rows as live decoding commits tokens (`crate::drafter::live`): rows j =
    /// `start .. start + n` (`start` = the rows `ctx` holds, 0 for `None`) from the target's
    /// final-norm states at positions j (`hidden` `[n, D]`, row i = position start + i) and the
    /// tokens y_{j+1} (`next_tokens`), each row attending to every row before it and itself: what
    /// [`MtpDrafter::context_from_tensor`] computes for those rows in its one causal pass over the
    /// whole sequence, so the chain drafted at an anchor is the replay's.
    pub fn extend_context(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        ctx: Option<MtpContext<B>>,
        hidden: &B::Tensor,
        next_tokens: &[u32],
    ) -> Result<Option<MtpContext<B>>> {
        let n = next_tokens.len();
        let rows = be.dims(hidden).0;
        if rows != n {
            bail!("target states of {rows} positions for {n} new context rows");
        }
        if n == 0 {
            return Ok(ctx);
        }
        let start = ctx.as_ref().map_or(0, |c| c.len);
        let emb = be.embed(target.embed_tokens(), next_tokens)?;
        let positions: Vec<u32> = (start..start + n).map(|j| j as u32).collect();
        let p = self.project(be, &emb, hidden, &positions)?;
        let (k, v, before) = match ctx {
            Some(c) => (
                be.concat_rows(&[&c.k, &p.k])?,
                be.concat_rows(&[&c.v, &p.v])?,
                Some(c.hidden),
            ),
            None => (p.k, p.v, None),
        };
        let shape = self.attention().shape;
        let o = be.attention(&p.q, &k, &v, shape, &AttnMask::Causal { q_start: start })?;
        let out = self.finish(be, &p.normed, o, p.residual)?;
        let hidden = match before {
            Some(h) => be.concat_rows(&[&h, &out])?,
            None => out,
        };
        Ok(Some(MtpContext {
            k,
            v,
            hidden,
            len: start + n,
        }))
    }

    /// fc over the normed embedding and hidden state, then the layer up to attention.
    fn project(
        &self,
        be: &B,
        emb: &B::Tensor,
        hidden: &B::Tensor,
        positions: &[u32],
    ) -> Result<Projected<B>> {
        let x = be.concat_cols(&[
            &self.pre_fc_norm_embedding.forward(be, emb)?,
            &self.pre_fc_norm_hidden.forward(be, hidden)?,
        ])?;
        let residual = be.matmul(&x, &self.fc)?;
        let normed = self.layer.input_layernorm.forward(be, &residual)?;
        let (q, k, v) = self.attention().qkv(be, &normed, positions)?;
        Ok(Projected {
            residual,
            normed,
            q,
            k,
            v,
        })
    }

    /// The layer after attention (gated o_proj into the residual, then the MLP block) and the
    /// head's final norm.
    fn finish(
        &self,
        be: &B,
        normed: &B::Tensor,
        o: B::Tensor,
        mut h: B::Tensor,
    ) -> Result<B::Tensor> {
        self.attention().output(be, normed, o, &mut h)?;
        let g = self.layer.post_attention_layernorm.forward(be, &h)?;
        self.layer.mlp.forward_acc(be, &g, &mut h)?;
        self.norm.forward(be, &h)
    }

    /// The K-step chain at every anchor: `anchors[n]` is an absolute position a (1 ≤ a ≤
    /// `ctx.len`) whose token y_a is context row a − 1's. Returns the top-`top_k` (ids,
    /// log-probabilities over the target's vocabulary) of every step, anchor by anchor
    /// (`anchors.len() · K` rows); each step's top-1 is the next step's token.
    pub fn draft(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        ctx: &MtpContext<B>,
        anchors: &[usize],
        top_k: usize,
    ) -> Result<TopK> {
        let vocab = target.vocab_size();
        if top_k == 0 || top_k > vocab {
            bail!("top-K {top_k} must be 1..{vocab} (the target's vocabulary)");
        }
        super::super::chain::draft_topk(self, be, Some(target), ctx, anchors, top_k)
    }
}

impl<B: Backend> ChainDrafter<B> for MtpDrafter<B> {
    type Context = MtpContext<B>;

    /// Step 1 at anchor a is context row a − 1's normed output; step s ≥ 2 embeds the token
    /// `choose` returned for step s − 1 with the head's own output h'_{s−1}, at position
    /// a − 2 + s. The states handed to `choose` are the head's normed outputs, which the
    /// target's LM head scores.
    fn run_chain(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        ctx: &MtpContext<B>,
        anchors: &[usize],
        choose: &mut Choose<'_, B>,
    ) -> Result<()> {
        let target = target.context("the MTP head reads the target's embedding")?;
        if let Some(&bad) = anchors.iter().find(|&&a| a == 0 || a > ctx.len) {
            bail!(
                "MTP anchor {bad} needs context row {} (the sequence's context has rows 0..{})",
                bad as i64 - 1,
                ctx.len
            );
        }
        let shape = self.attention().shape;
        let _layers = crate::timeline::phase("drafter layers");
        let rows: Vec<u32> = anchors.iter().map(|&a| (a - 1) as u32).collect();
        let mut h = be.gather_rows(&ctx.hidden, &rows)?;
        let mut tokens = choose(&h)?;
        // The chain's own rows (steps 2..s), anchor by anchor: what each anchor's queries see
        // after the context.
        let mut chain: ChainRows<B> = None;
        for s in 2..=self.steps {
            let emb = be.embed(target.embed_tokens(), &tokens)?;
            let positions: Vec<u32> = anchors.iter().map(|&a| (a + s - 2) as u32).collect();
            let p = self.project(be, &emb, &h, &positions)?;
            let o = attend_step(
                be,
                &mut chain,
                (p.q, p.k, p.v),
                ChainContext {
                    k: &ctx.k,
                    v: &ctx.v,
                    len: ctx.len,
                },
                anchors,
                s,
                shape,
            )?;
            h = self.finish(be, &p.normed, o, p.residual)?;
            tokens = choose(&h)?;
        }
        Ok(())
    }

    fn scoring_head<'a>(
        &'a self,
        target: Option<&'a dyn EmbedHead<B>>,
    ) -> Result<ScoringHead<'a, B>> {
        let target = target.context("the MTP head is scored by the target's LM head")?;
        Ok(ScoringHead::of(target))
    }
}
