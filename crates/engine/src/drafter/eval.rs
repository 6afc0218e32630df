//! Exact per-anchor drafter evaluation (docs/dflash.md §2.5).
//!
//! For one sequence (prompt + the target's greedy continuation), one teacher-forced target pass
//! gives the taps and the target's argmax. For each anchor a the drafter sees the taps of
//! positions strictly `< a` and the block `[y_a, MASK×(B−1)]` at positions a..a+B−1; row k is
//! scored against the target token t_k = argmax of the target at position a+k−1 (the target's
//! own greedy token at a+k). Many anchors share one drafter forward through the `Blocks` mask,
//! which is one-anchor-at-a-time semantics batched (a test proves it numerically).

use super::dflash2::DFlash2Drafter;
use super::eagle3::{Eagle3Context, Eagle3Drafter};
use super::model::{DFlashDrafter, DraftContext, DraftOptions};
use super::mtp::{MtpContext, MtpDrafter};
use crate::backend::{Backend, TopK};
use crate::model::{EmbedHead, TargetModel};
use crate::records::{next_anchor, RecordBatch, Region};
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// Which anchors of a sequence to evaluate (the replay chain is always added).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnchorPolicy {
    /// Every completion position.
    Every,
    /// Every `n`-th completion position.
    Stride(usize),
    /// `n` completion positions sampled without replacement with a seed.
    Random { n: usize, seed: u64 },
}

/// Where labels come from (train-style evaluation only). `--labels` takes its values (listed
/// without help, as the command line always did).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Labels {
    /// The target's own greedy tokens (what verification accepts against).
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Target,
    /// Tokens of the data (a reference completion), as training on non-regenerated data does.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Data,
}

/// Anchors per drafter forward by default: all of a 128-token continuation's anchors (and up to
/// 256) in one forward. Why: each forward ends in a synchronising top-K download; on the H200 an
/// 8B target's 3-checkpoint `run` spent ~1 s more in the drafter at 32 anchors per forward
/// (docs/benchmarks-cuda.md, "Session 14"). Records depend on it only through float noise (the
/// GEMMs' row count), but it is an evaluation option and so part of the records' cache key.
pub const DEFAULT_ANCHOR_BATCH: usize = 256;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalOptions {
    pub top_k: usize,
    pub anchors: AnchorPolicy,
    /// Also evaluate anchors inside the prompt.
    pub prompt_anchors: bool,
    /// Context ≤ anchor (the training leak) instead of < anchor.
    pub ctx_inclusive: bool,
    pub labels: Labels,
    /// Anchors per drafter forward.
    pub anchor_batch: usize,
    /// Sampling at T > 0 (`run --temperature`, docs/metrics.md §7): continuations drawn from the
    /// target, and the expected acceptance added to the metrics. Not serialised when absent, so a
    /// greedy run's settings, identity and cache keys stay byte for byte what they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<super::sampling::SampledEval>,
    /// EAGLE-3's dynamic draft tree evaluated next to the chain (`run --eagle3-tree`,
    /// docs/eagle3.md §3.1); not serialised when absent, as `sampling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eagle3_tree: Option<super::eagle3::TreeShape>,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            top_k: 8,
            anchors: AnchorPolicy::Every,
            prompt_anchors: false,
            ctx_inclusive: false,
            labels: Labels::Target,
            anchor_batch: DEFAULT_ANCHOR_BATCH,
            sampling: None,
            eagle3_tree: None,
        }
    }
}

/// The drafter under evaluation: a real checkpoint (DFlash, EAGLE-3) or a known-answer drafter
/// for tests.
pub enum Drafter<B: Backend> {
    DFlash(DFlashDrafter<B>),
    /// An EAGLE-3 checkpoint: a chain of K steps per anchor (docs/eagle3.md).
    Eagle3(Eagle3Drafter<B>),
    /// A DFlash2 checkpoint: DFlash's context (`Sequence::ctx`), proposals along the selector's
    /// path (docs/dflash2.md).
    DFlash2(DFlash2Drafter<B>),
    /// The target's own MTP head: a chain of K steps per anchor (docs/mtp.md).
    Mtp(MtpDrafter<B>),
    /// Top-1 is always the target token: every round accepts B−1 plus the bonus.
    Oracle {
        block_size: usize,
    },
    /// Top-1 is never the target token: τ = 1.
    AntiOracle {
        block_size: usize,
    },
}

impl<B: Backend> Drafter<B> {
    pub fn block_size(&self) -> usize {
        match self {
            Drafter::DFlash(d) => d.cfg.block_size,
            Drafter::Eagle3(d) => d.block_size(),
            Drafter::DFlash2(d) => d.block_size(),
            Drafter::Mtp(d) => d.block_size(),
            Drafter::Oracle { block_size } | Drafter::AntiOracle { block_size } => *block_size,
        }
    }
}

/// One sequence ready for drafting: ids, where the prompt ends, the target's labels, and the
/// drafter's context K/V.
pub struct Sequence<'a, B: Backend> {
    pub prompt_index: u32,
    pub ids: &'a [u32],
    pub prompt_len: usize,
    /// `labels[t]` = the token the drafter should predict at position t (t ≥ 1).
    pub labels: Vec<u32>,
    /// The target's own top-K next-token prediction at every position (row t predicts t+1).
    pub target_topk: &'a TopK,
    pub ctx: Option<DraftContext<B>>,
    /// An EAGLE-3 drafter's context rows (`None` for other drafters and one-token sequences).
    pub eagle3: Option<Eagle3Context<B>>,
    /// An MTP head's context rows (`None` for other drafters and one-token sequences).
    pub mtp: Option<MtpContext<B>>,
}

impl<'a, B: Backend> Sequence<'a, B> {
    /// `labels` from the target's argmax (row t−1 predicts position t) or from the data tokens.
    pub fn new(
        prompt_index: u32,
        ids: &'a [u32],
        prompt_len: usize,
        target_topk: &'a TopK,
        labels: Labels,
    ) -> Self {
        let argmax = target_topk.argmax();
        let labels = (0..ids.len())
            .map(|t| match (labels, t) {
                (_, 0) => ids[0],
                (Labels::Target, t) => argmax[t - 1],
                (Labels::Data, t) => ids[t],
            })
            .collect();
        Sequence {
            prompt_index,
            ids,
            prompt_len,
            labels,
            target_topk,
            ctx: None,
            eagle3: None,
            mtp: None,
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Completion anchors: every position whose block has at least one drafted position inside
    /// the sequence (`P ..= T−2`).
    pub fn completion_anchors(&self) -> std::ops::Range<usize> {
        self.prompt_len..self.len().saturating_sub(1)
    }
}

/// Anchors chosen by the policy, sorted.
pub fn select_anchors(
    seq_prompt_len: usize,
    seq_len: usize,
    policy: &AnchorPolicy,
    prompt_anchors: bool,
) -> Vec<usize> {
    let comp: Vec<usize> = (seq_prompt_len..seq_len.saturating_sub(1)).collect();
    let mut out: Vec<usize> = match policy {
        AnchorPolicy::Every => comp,
        AnchorPolicy::Stride(n) => comp.into_iter().step_by((*n).max(1)).collect(),
        AnchorPolicy::Random { n, seed } => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(
                *seed ^ (seq_prompt_len as u64) << 32 ^ seq_len as u64,
            );
            let mut c = comp;
            c.shuffle(&mut rng);
            c.truncate(*n);
            c
        }
    };
    if prompt_anchors {
        out.extend(1..seq_prompt_len.min(seq_len.saturating_sub(1)));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// What drafting needs of the target: a DFlash drafter its embedding and LM head, the oracle
/// drafters only the vocabulary size (so an oracle run over cached passes uploads no weights).
pub enum DraftTarget<'a, B: Backend> {
    Head(&'a dyn EmbedHead<B>),
    Vocab(usize),
}

impl<B: Backend> Clone for DraftTarget<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for DraftTarget<'_, B> {}

impl<'a, B: Backend> DraftTarget<'a, B> {
    pub fn vocab_size(&self) -> usize {
        match self {
            DraftTarget::Head(h) => h.vocab_size(),
            DraftTarget::Vocab(v) => *v,
        }
    }

    /// The target's embedding and LM head, when drafting was given them.
    pub fn head(&self) -> Option<&'a dyn EmbedHead<B>> {
        match self {
            DraftTarget::Head(h) => Some(*h),
            DraftTarget::Vocab(_) => None,
        }
    }
}

impl<'a, B: Backend> From<&'a TargetModel<B>> for DraftTarget<'a, B> {
    fn from(m: &'a TargetModel<B>) -> Self {
        DraftTarget::Head(m)
    }
}

/// Draft the blocks at `anchors` and append their records to `out`.
pub fn draft_into<B: Backend>(
    be: &B,
    target: DraftTarget<'_, B>,
    drafter: &Drafter<B>,
    seq: &Sequence<B>,
    anchors: &[usize],
    opts: &EvalOptions,
    out: &mut RecordBatch,
) -> Result<()> {
    let b = drafter.block_size();
    let k = opts.top_k;
    let t_len = seq.len();
    for chunk in anchors.chunks(opts.anchor_batch.max(1)) {
        if let Some(&bad) = chunk.iter().find(|&&a| a >= t_len) {
            bail!("anchor {bad} is outside the sequence of {t_len} tokens");
        }
        let top = match drafter {
            Drafter::DFlash(d) => {
                let ctx = seq.ctx.as_ref().expect("DFlash sequences carry a context");
                let toks: Vec<u32> = chunk.iter().map(|&a| seq.ids[a]).collect();
                let DraftTarget::Head(target) = target else {
                    bail!("a DFlash drafter needs the target's embedding and LM head");
                };
                d.draft(
                    be,
                    target,
                    ctx,
                    chunk,
                    &toks,
                    DraftOptions {
                        ctx_inclusive: opts.ctx_inclusive,
                        top_k: k,
                    },
                )?
            }
            Drafter::DFlash2(d) => {
                let ctx = seq
                    .ctx
                    .as_ref()
                    .context("a DFlash2 sequence carries its context")?;
                let toks: Vec<u32> = chunk.iter().map(|&a| seq.ids[a]).collect();
                let DraftTarget::Head(target) = target else {
                    bail!("a DFlash2 drafter needs the target's embedding and LM head");
                };
                let opts = DraftOptions {
                    ctx_inclusive: opts.ctx_inclusive,
                    top_k: k,
                };
                d.draft(be, target, ctx, chunk, &toks, opts)?
            }
            Drafter::Eagle3(d) => {
                super::eagle3::check_options(opts)?;
                let ctx = seq
                    .eagle3
                    .as_ref()
                    .context("an EAGLE-3 sequence carries its context rows")?;
                d.draft(be, target.head(), ctx, chunk, k)?
            }
            Drafter::Mtp(d) => {
                super::mtp::check_options(opts)?;
                let ctx = seq
                    .mtp
                    .as_ref()
                    .context("an MTP sequence carries its context rows")?;
                let DraftTarget::Head(target) = target else {
                    bail!("an MTP head needs the target's embedding and LM head");
                };
                d.draft(be, target, ctx, chunk, k)?
            }
            Drafter::Oracle { .. } | Drafter::AntiOracle { .. } => {
                let oracle = matches!(drafter, Drafter::Oracle { .. });
                let vocab = target.vocab_size() as u32;
                let mut ids = Vec::new();
                let mut lps = Vec::new();
                for &a in chunk {
                    for kk in 1..b {
                        let t = seq.labels.get(a + kk).copied().unwrap_or(0);
                        let first = if oracle { t } else { (t + 1) % vocab };
                        for j in 0..k {
                            ids.push((first + j as u32) % vocab);
                            lps.push(-(j as f32) - 0.1);
                        }
                    }
                }
                TopK {
                    rows: chunk.len() * (b - 1),
                    k,
                    ids,
                    logprobs: lps,
                }
            }
        };
        for (n, &a) in chunk.iter().enumerate() {
            out.prompt_index.push(seq.prompt_index);
            out.anchor.push(a as u32);
            out.region.push(if a >= seq.prompt_len {
                Region::Completion as u8
            } else {
                Region::Prompt as u8
            });
            for kk in 1..b {
                let pos = a + kk;
                let valid = pos < t_len;
                out.target.push(if valid { seq.labels[pos] } else { 0 });
                out.valid.push(valid as u8);
                out.loss_mask.push((valid && pos >= seq.prompt_len) as u8);
                let row = n * (b - 1) + (kk - 1);
                out.draft_ids.extend_from_slice(top.row_ids(row));
                out.draft_logprobs.extend_from_slice(top.row_logprobs(row));
                let tk = seq.target_topk.k.min(k);
                let (tids, tlps) = out
                    .target_ids
                    .as_mut()
                    .zip(out.target_logprobs.as_mut())
                    .expect("target columns");
                if valid {
                    tids.extend_from_slice(&seq.target_topk.row_ids(pos - 1)[..tk]);
                    tlps.extend_from_slice(&seq.target_topk.row_logprobs(pos - 1)[..tk]);
                    tids.extend(std::iter::repeat(u32::MAX).take(k - tk));
                    tlps.extend(std::iter::repeat(f32::NEG_INFINITY).take(k - tk));
                } else {
                    tids.extend(std::iter::repeat(u32::MAX).take(k));
                    tlps.extend(std::iter::repeat(f32::NEG_INFINITY).take(k));
                }
            }
        }
    }
    Ok(())
}

/// Evaluate one sequence: the policy's anchors, then the replay chain (anchors a real greedy
/// decode visits), drafting missing chain anchors one round at a time. Returns the records of
/// this sequence, sorted by anchor.
pub fn evaluate_sequence<B: Backend>(
    be: &B,
    target: DraftTarget<'_, B>,
    drafter: &Drafter<B>,
    seq: &Sequence<B>,
    opts: &EvalOptions,
) -> Result<RecordBatch> {
    let mut out = RecordBatch::new(drafter.block_size() as u32, opts.top_k as u32);
    out.target_ids = Some(Vec::new());
    out.target_logprobs = Some(Vec::new());
    let anchors = select_anchors(
        seq.prompt_len,
        seq.len(),
        &opts.anchors,
        opts.prompt_anchors,
    );
    draft_into(be, target, drafter, seq, &anchors, opts, &mut out)?;
    // Walk the replay chain; anchors the policy skipped are drafted now.
    let end = seq.len().saturating_sub(1);
    let mut a = seq.prompt_len;
    while a < end {
        let idx = match out.anchor.iter().position(|&x| x as usize == a) {
            Some(i) => i,
            None => {
                draft_into(be, target, drafter, seq, &[a], opts, &mut out)?;
                out.num_blocks() - 1
            }
        };
        a = next_anchor(a as u32, out.accepted_len(idx) as u32) as usize;
    }
    Ok(sort_by_anchor(out))
}

/// Reorder blocks by anchor (records of one sequence).
fn sort_by_anchor(batch: RecordBatch) -> RecordBatch {
    let mut order: Vec<usize> = (0..batch.num_blocks()).collect();
    order.sort_by_key(|&i| (batch.prompt_index[i], batch.anchor[i]));
    if order.iter().enumerate().all(|(i, &j)| i == j) {
        return batch;
    }
    batch.select(&order)
}
