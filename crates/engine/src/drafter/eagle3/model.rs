//! The EAGLE-3 draft chain over the backend seam (docs/eagle3.md §2).
//!
//! ```text
//! taps low | mid | high [S, 3·Dt] ─ fc ─► g_j                     (target features, per position)
//! context row j = 0..S−2: token y_{j+1}, feature g_j, RoPE position j      (tokens shifted by one)
//! midlayer(token t, hidden h, position p):
//!     x = [input_layernorm(embed(t)) | hidden_norm(h)]          (2·D wide: q/k/v read both)
//!     h' = h + o_proj(attention(q, k, v))  (causal: the context rows, then the chain's own rows)
//!     h' = h' + MLP(post_attention_layernorm(h'))                (h' is the pre-norm output)
//! logits = lm_head(norm(h')) over the draft vocabulary; draft id i ↦ target id i + d2t[i]
//! ```
//! The context rows are computed once per sequence (one causal pass, [`Eagle3Drafter::context`]).
//! At anchor a, step 1 *is* context row a − 1 (feature g_{a−1}, token y_a); step s ≥ 2 feeds the
//! midlayer its own output h'_{s−1} and its own top-1 token d_{s−1} at position a − 2 + s, seeing
//! context rows < a and its earlier steps: what vLLM's proposer and EAGLE's `topK_genrate` do with
//! their KV caches. Many anchors share each step's forward through the `Blocks` mask (context
//! rows < a, causal inside each anchor's own steps).

use super::config::Eagle3Config;
use super::vocab::VocabMap;
use crate::backend::{AttnMask, AttnShape, Backend, HostRowsRef, TopK};
use crate::formats::WeightSource;
use crate::model::transformer::{load_matrix, load_stacked_matrix, Mlp, RmsNorm};
use crate::model::{EmbedHead, ModelSpec};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// The taps EAGLE-3 fuses (low, middle, high).
pub const TAPS: usize = 3;

/// Every tensor [`Eagle3Drafter::load`] reads, with its HF shape (`[out, in]` for projections),
/// for a target of hidden size `target_hidden` and vocabulary `target_vocab`. `embed_tokens` is
/// listed only when the checkpoint has its own (`own_embedding`); `d2t` / `t2d` are checked by
/// [`VocabMap`]. `lint` checks the plan against the file's header before a run starts.
pub fn tensor_plan(
    cfg: &Eagle3Config,
    target_hidden: usize,
    target_vocab: usize,
    own_embedding: bool,
) -> Vec<(String, Vec<usize>)> {
    let (d, hd, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut plan: Vec<(String, Vec<usize>)> = vec![
        ("fc.weight".into(), vec![d, TAPS * target_hidden]),
        ("midlayer.input_layernorm.weight".into(), vec![d]),
        ("midlayer.hidden_norm.weight".into(), vec![d]),
        ("midlayer.self_attn.q_proj.weight".into(), vec![qd, 2 * d]),
        ("midlayer.self_attn.k_proj.weight".into(), vec![kvd, 2 * d]),
        ("midlayer.self_attn.v_proj.weight".into(), vec![kvd, 2 * d]),
        ("midlayer.self_attn.o_proj.weight".into(), vec![d, qd]),
        ("midlayer.post_attention_layernorm.weight".into(), vec![d]),
        ("midlayer.mlp.gate_proj.weight".into(), vec![inter, d]),
        ("midlayer.mlp.up_proj.weight".into(), vec![inter, d]),
        ("midlayer.mlp.down_proj.weight".into(), vec![d, inter]),
        ("norm.weight".into(), vec![d]),
        (
            "lm_head.weight".into(),
            vec![cfg.draft_vocab(target_vocab), d],
        ),
    ];
    if own_embedding {
        plan.push(("embed_tokens.weight".into(), vec![target_vocab, d]));
    }
    plan
}

pub struct Eagle3Drafter<B: Backend> {
    /// `config.json` as parsed, taps resolved for the target.
    pub cfg: Eagle3Config,
    /// The storage dtypes of the weights, "+"-joined ("BF16", "BF16+BOOL+I64").
    pub weights_dtype: String,
    pub vocab: VocabMap,
    fc: B::Matrix,
    /// The drafter's own `embed_tokens`; `None`: the target's is used (vLLM shares it when the
    /// checkpoint has none).
    embed_tokens: Option<B::Matrix>,
    input_layernorm: RmsNorm<B>,
    hidden_norm: RmsNorm<B>,
    /// q | k | v stacked by output rows, `[qd + 2·kvd, 2·D]`.
    qkv_proj: B::Matrix,
    o_proj: B::Matrix,
    post_attention_layernorm: RmsNorm<B>,
    mlp: Mlp<B>,
    norm: RmsNorm<B>,
    /// `[draft_vocab, D]`.
    lm_head: B::Matrix,
    pub(super) shape: AttnShape,
}

/// The drafter's state over one sequence: context rows 0..len, row j = (feature g_j, token
/// y_{j+1}) at position j.
pub struct Eagle3Context<B: Backend> {
    /// Rotated keys and the values of the context rows, `[len, kv_heads·head_dim]`.
    pub k: B::Tensor,
    pub v: B::Tensor,
    /// The midlayer's pre-norm output of every context row: row a − 1 is step 1 at anchor a.
    pub hidden: B::Tensor,
    pub len: usize,
}

/// q, k and v of some midlayer rows (RoPE applied), and the rows' residual.
pub(super) struct Projected<B: Backend> {
    pub(super) q: B::Tensor,
    pub(super) k: B::Tensor,
    pub(super) v: B::Tensor,
    pub(super) residual: B::Tensor,
}

impl<B: Backend> Eagle3Drafter<B> {
    /// Load a checkpoint folder for `target` (its depth resolves the default taps, its hidden
    /// size and vocabulary check the fc, embedding and maps).
    pub fn load(be: &B, dir: &Path, target: &ModelSpec) -> Result<Self> {
        let cfg = Eagle3Config::load(dir, target.num_layers)?;
        // A checkpoint folder or a llama.cpp GGUF file (`crate::drafter::gguf`).
        let src = crate::drafter::gguf::open_weights(dir)?;
        let file = crate::drafter::gguf::weights_file(dir);
        let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let (vocab, draft_vocab) = (target.vocab_size, cfg.draft_vocab(target.vocab_size));
        if let Some(v) = cfg.vocab_size.filter(|&v| v != vocab) {
            bail!("{}: vocab_size {v} differs from the target's {vocab}: the draft vocabulary maps index the target's vocabulary", dir.join("config.json").display());
        }
        let own_embedding = src.contains("embed_tokens.weight");
        if !own_embedding && d != target.hidden_size {
            bail!("{}: no embed_tokens.weight, so the target's embedding is used, but hidden_size {d} differs from the target's {}", file.display(), target.hidden_size);
        }
        let vocab_map = VocabMap::load(&src, &file, draft_vocab, vocab)?;
        let dtypes: std::collections::BTreeSet<String> =
            src.tensors().into_iter().map(|t| t.dtype).collect();
        let (hd, qd, kvd) = (
            cfg.head_dim,
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let m = "midlayer";
        let norm = |name: &str| RmsNorm::load(be, &src, name, d, eps);
        Ok(Eagle3Drafter {
            weights_dtype: dtypes.into_iter().collect::<Vec<_>>().join("+"),
            vocab: vocab_map,
            fc: load_matrix(be, &src, "fc.weight", d, TAPS * target.hidden_size)?,
            embed_tokens: if own_embedding {
                Some(load_matrix(be, &src, "embed_tokens.weight", vocab, d)?)
            } else {
                None
            },
            input_layernorm: norm(&format!("{m}.input_layernorm.weight"))?,
            hidden_norm: norm(&format!("{m}.hidden_norm.weight"))?,
            qkv_proj: load_stacked_matrix(
                be,
                &src,
                &[
                    (format!("{m}.self_attn.q_proj.weight"), qd),
                    (format!("{m}.self_attn.k_proj.weight"), kvd),
                    (format!("{m}.self_attn.v_proj.weight"), kvd),
                ],
                2 * d,
            )?,
            o_proj: load_matrix(be, &src, &format!("{m}.self_attn.o_proj.weight"), d, qd)?,
            post_attention_layernorm: norm(&format!("{m}.post_attention_layernorm.weight"))?,
            mlp: Mlp::load(be, &src, &format!("{m}.mlp"), d, cfg.intermediate_size)?,
            norm: norm("norm.weight")?,
            lm_head: load_matrix(be, &src, "lm_head.weight", draft_vocab, d)?,
            shape: AttnShape {
                heads: cfg.num_heads,
                kv_heads: cfg.num_kv_heads,
                head_dim: hd,
            },
            cfg,
        })
    }

    /// The records' block size (anchor + K steps).
    pub fn block_size(&self) -> usize {
        self.cfg.block_size()
    }

    /// Whether drafting needs the target's embedding (the checkpoint has none of its own).
    pub fn needs_target_embedding(&self) -> bool {
        self.embed_tokens.is_none()
    }

    pub(super) fn embedding<'a>(
        &'a self,
        target: Option<&'a dyn EmbedHead<B>>,
    ) -> Result<&'a B::Matrix> {
        match (&self.embed_tokens, target) {
            (Some(own), _) => Ok(own),
            (None, Some(t)) => Ok(t.embed_tokens()),
            (None, None) => {
                bail!("this EAGLE-3 drafter has no embed_tokens of its own and needs the target's")
            }
        }
    }

    /// The context of a sequence `ids` from its taps (`taps[j]` is `[S, Dt]` row-major for the
    /// S = `ids.len()` positions, low / mid / high, f32 or bf16: see [`HostRowsRef`]). `None` for
    /// a sequence of one token, which has no context row (and no anchor).
    pub fn context<'t, T: Into<HostRowsRef<'t>> + Copy>(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        taps: &[T],
        target_hidden: usize,
        ids: &[u32],
    ) -> Result<Option<Eagle3Context<B>>> {
        self.check_tap_count(taps.len())?;
        let n = ids.len();
        let parts: Vec<B::Tensor> = taps
            .iter()
            .map(|&t| be.from_host_rows(t.into(), n, target_hidden))
            .collect::<Result<_>>()?;
        let refs: Vec<&B::Tensor> = parts.iter().collect();
        self.context_from_tensors(be, target, &refs, ids)
    }

    fn check_tap_count(&self, taps: usize) -> Result<()> {
        if taps != TAPS {
            bail!("an EAGLE-3 drafter fuses {TAPS} taps, got {taps}");
        }
        Ok(())
    }

    /// [`Eagle3Drafter::context`] from taps already on the device (`[S, Dt]` each): fc over the
    /// taps side by side, then the midlayer over rows j = 0..S−2 (token `ids[j+1]`, position j),
    /// causal. The last position has no row: its next token is not part of the sequence.
    pub fn context_from_tensors(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        taps: &[&B::Tensor],
        ids: &[u32],
    ) -> Result<Option<Eagle3Context<B>>> {
        self.check_tap_count(taps.len())?;
        let s = be.dims(taps[0]).0;
        if s != ids.len() {
            bail!(
                "taps of {s} positions for a sequence of {} tokens",
                ids.len()
            );
        }
        let rows = s.saturating_sub(1);
        if rows == 0 {
            return Ok(None);
        }
        let features = be.slice_rows(&be.concat_cols(taps)?, 0, rows)?;
        let hidden = be.matmul(&features, &self.fc)?;
        let emb = be.embed(self.embedding(target)?, &ids[1..])?;
        let positions: Vec<u32> = (0..rows as u32).collect();
        let p = self.project(be, &emb, hidden, &positions)?;
        let o = be.attention(
            &p.q,
            &p.k,
            &p.v,
            self.shape,
            &AttnMask::Causal { q_start: 0 },
        )?;
        let out = self.finish(be, &o, p.residual)?;
        Ok(Some(Eagle3Context {
            k: p.k,
            v: p.v,
            hidden: out,
            len: rows,
        }))
    }

    /// Appends context rows as live decoding commits tokens (`crate::drafter::live`): rows j =
    /// `start .. start + n` (`start` = the rows `ctx` holds, 0 for `None`) from the taps of
    /// positions j (`taps[t]` `[n, Dt]`, row i = position start + i) and the tokens y_{j+1}
    /// (`next_tokens`, n of them), each row attending to every row before it and itself: what
    /// [`Eagle3Drafter::context_from_tensors`] computes for those rows in its one causal pass over
    /// the whole sequence, so the chain drafted at an anchor is the replay's.
    pub fn extend_context(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        ctx: Option<Eagle3Context<B>>,
        taps: &[&B::Tensor],
        next_tokens: &[u32],
    ) -> Result<Option<Eagle3Context<B>>> {
        self.check_tap_count(taps.len())?;
        let n = next_tokens.len();
        let rows = be.dims(taps[0]).0;
        if rows != n {
            bail!("taps of {rows} positions for {n} new context rows");
        }
        if n == 0 {
            return Ok(ctx);
        }
        let start = ctx.as_ref().map_or(0, |c| c.len);
        let hidden = be.matmul(&be.concat_cols(taps)?, &self.fc)?;
        let emb = be.embed(self.embedding(target)?, next_tokens)?;
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
        let o = be.attention(
            &p.q,
            &k,
            &v,
            self.shape,
            &AttnMask::Causal { q_start: start },
        )?;
        let out = self.finish(be, &o, p.residual)?;
        let hidden = match before {
            Some(h) => be.concat_rows(&[&h, &out])?,
            None => out,
        };
        Ok(Some(Eagle3Context {
            k,
            v,
            hidden,
            len: start + n,
        }))
    }

    /// The midlayer up to attention for rows of (token embedding, hidden state) at `positions`.
    pub(super) fn project(
        &self,
        be: &B,
        emb: &B::Tensor,
        hidden: B::Tensor,
        positions: &[u32],
    ) -> Result<Projected<B>> {
        let x = be.concat_cols(&[
            &self.input_layernorm.forward(be, emb)?,
            &self.hidden_norm.forward(be, &hidden)?,
        ])?;
        let (qd, kvd) = (
            self.shape.heads * self.shape.head_dim,
            self.shape.kv_heads * self.shape.head_dim,
        );
        let mut qkv = be
            .split_cols(&be.matmul(&x, &self.qkv_proj)?, &[qd, kvd, kvd])?
            .into_iter();
        let (mut q, mut k, v) = (
            qkv.next().context("q")?,
            qkv.next().context("k")?,
            qkv.next().context("v")?,
        );
        let rope = self.rope();
        be.rope_inplace(&mut q, positions, &rope)?;
        be.rope_inplace(&mut k, positions, &rope)?;
        // The residual is the un-normed hidden state (SpecForge; vLLM without
        // norm_before_residual).
        Ok(Projected {
            q,
            k,
            v,
            residual: hidden,
        })
    }

    /// The midlayer after attention: o_proj + residual, then the MLP block; the pre-norm output.
    pub(super) fn finish(&self, be: &B, o: &B::Tensor, mut h: B::Tensor) -> Result<B::Tensor> {
        be.add_inplace(&mut h, &be.matmul(o, &self.o_proj)?)?;
        let g = self.post_attention_layernorm.forward(be, &h)?;
        self.mlp.forward_acc(be, &g, &mut h)?;
        Ok(h)
    }

    fn rope(&self) -> crate::backend::Rope {
        crate::backend::Rope {
            theta: self.cfg.rope_theta,
            head_dim: self.cfg.head_dim,
            rotary_dim: self.cfg.head_dim,
            style: crate::backend::RopeStyle::RotateHalf,
        }
    }

    /// Top-`k` of the draft logits of pre-norm states `h`, ids mapped to the target's.
    pub(super) fn head_topk(&self, be: &B, h: &B::Tensor, k: usize) -> Result<TopK> {
        let mut top = be.lm_head_topk(&self.norm.forward(be, h)?, &self.lm_head, k)?;
        for id in top.ids.iter_mut() {
            *id = self.vocab.target_of[*id as usize];
        }
        Ok(top)
    }

    /// The K-step chain at every anchor: `anchors[n]` is an absolute position a (1 ≤ a ≤
    /// `ctx.len`) whose token y_a is context row a − 1's. Returns the top-`top_k` (target ids,
    /// log-probabilities over the draft vocabulary) of every step, anchor by anchor
    /// (`anchors.len() · K` rows); each step's top-1 is the next step's token.
    pub fn draft(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        ctx: &Eagle3Context<B>,
        anchors: &[usize],
        top_k: usize,
    ) -> Result<TopK> {
        check_anchors(ctx, anchors)?;
        let draft_vocab = self.vocab.target_of.len();
        if top_k == 0 || top_k > draft_vocab {
            bail!("top-K {top_k} must be 1..{draft_vocab} (the drafter's draft_vocab_size)");
        }
        super::super::chain::draft_topk(self, be, target, ctx, anchors, top_k)
    }
}

/// The chain step by step (`super::super::chain`): the greedy records above and live sampling
/// at T > 0 run it. The states handed to `choose` are norm(h') of each step, which the drafter's
/// `lm_head` scores over the draft vocabulary, ids mapped through `d2t`.
impl<B: Backend> super::super::chain::ChainDrafter<B> for Eagle3Drafter<B> {
    type Context = Eagle3Context<B>;

    fn run_chain(
        &self,
        be: &B,
        target: Option<&dyn EmbedHead<B>>,
        ctx: &Eagle3Context<B>,
        anchors: &[usize],
        choose: &mut super::super::chain::Choose<'_, B>,
    ) -> Result<()> {
        check_anchors(ctx, anchors)?;
        let table = self.embedding(target)?;
        let _layers = crate::timeline::phase("drafter layers");
        let rows: Vec<u32> = anchors.iter().map(|&a| (a - 1) as u32).collect();
        let mut h = be.gather_rows(&ctx.hidden, &rows)?;
        let mut tokens = choose(&self.norm.forward(be, &h)?)?;
        // The chain's own rows (steps 2..s), anchor by anchor: what each anchor's queries see
        // after the context.
        let mut chain: super::super::chain::ChainRows<B> = None;
        for s in 2..=self.cfg.steps {
            let emb = be.embed(table, &tokens)?;
            let positions: Vec<u32> = anchors.iter().map(|&a| (a + s - 2) as u32).collect();
            let p = self.project(be, &emb, h, &positions)?;
            let o = super::super::chain::attend_step(
                be,
                &mut chain,
                (p.q, p.k, p.v),
                super::super::chain::ChainContext {
                    k: &ctx.k,
                    v: &ctx.v,
                    len: ctx.len,
                },
                anchors,
                s,
                self.shape,
            )?;
            h = self.finish(be, &o, p.residual)?;
            tokens = choose(&self.norm.forward(be, &h)?)?;
        }
        Ok(())
    }

    fn scoring_head<'a>(
        &'a self,
        _target: Option<&'a dyn EmbedHead<B>>,
    ) -> Result<crate::drafter::sampling::ScoringHead<'a, B>> {
        Ok(crate::drafter::sampling::ScoringHead {
            matrix: &self.lm_head,
            rows: self.vocab.target_of.len(),
            target_of: Some(&self.vocab.target_of),
        })
    }
}

/// Every anchor a must have its step-1 row, context row a − 1 (1 ≤ a ≤ `ctx.len`).
pub(super) fn check_anchors<B: Backend>(ctx: &Eagle3Context<B>, anchors: &[usize]) -> Result<()> {
    if let Some(&bad) = anchors.iter().find(|&&a| a == 0 || a > ctx.len) {
        bail!(
            "EAGLE-3 anchor {bad} needs context row {} (the sequence's context has rows 0..{})",
            bad as i64 - 1,
            ctx.len
        );
    }
    Ok(())
}
