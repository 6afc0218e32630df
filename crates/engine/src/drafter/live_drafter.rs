//! What each drafter family supplies to the one live loop (`super`, drafter/live.rs): propose B − 1 tokens
//! at the anchor (the last committed token) given the committed prefix and the target's state,
//! and keep its own state across verify rounds from what the verify pass already returns.
//!
//! | family | state across rounds | grows by (after a round that commits A drafts + bonus) |
//! |---|---|---|
//! | DFlash, DFlash2 | the backbone's context K/V of every committed position's taps | the verify pass's taps of positions a..a+A |
//! | EAGLE-3 | its context rows (fc over the low / mid / high taps at j, token y_{j+1}): its own KV | rows a..a+A (the bonus is y_{a+A+1}) |
//! | MTP head | its context rows (the target's final-norm state at j, token y_{j+1}): its own KV | rows a..a+A |
//! | oracle / anti-oracle | none: they read the target's greedy continuation of the prefix | |
//!
//! Each family drafts exactly what the replay (`crate::drafter::eval`) drafts at the same anchor over the
//! same committed tokens: DFlash2's path is chosen left to right by its selector from y_a,
//! EAGLE-3's and MTP's chains feed each step its own top-1, and their context rows are computed
//! incrementally (`extend_context`) as the replay's one causal pass computes them.
//!
//! At T > 0 ([`LiveDrafter::propose_sampled`], `crate::drafter::sampling`) each family returns its
//! drafts with the distribution q_k each was drawn from given the drafts before it: DFlash's
//! positions independently from one pass; DFlash2's selector path with each position's candidate
//! drawn from the selector's softmax given the drawn one before (the authors' sampled path);
//! EAGLE-3's and MTP's chains through one implementation ([`chain_sampled`] over
//! [`ChainDrafter`]), each step's token drawn from its q and fed to the next step.

use super::taps_rows;
use crate::backend::Backend;
use crate::drafter::chain::ChainDrafter;
use crate::drafter::config::DrafterFamily;
use crate::drafter::dflash2::DFlash2Drafter;
use crate::drafter::eagle3::{Eagle3Context, Eagle3Drafter};
use crate::drafter::eval::Drafter;
use crate::drafter::model::{DFlashDrafter, DraftContext, DraftOptions};
use crate::drafter::mtp::{MtpContext, MtpDrafter};
use crate::drafter::sampling::{draft_candidates, draw_draft, head_rows, SamplingRng, ScoringHead};
use crate::model::{Captured, ModelSpec, TargetModel};
use anyhow::{Context, Result};
use draftlens_records::sampling::{Dist, DraftSampling, SamplingParams};
use std::path::Path;

/// The drafter `live --drafter NAME` names, loaded for the target at `target_path` (described by
/// `spec`): `target:mtp[:K]`, the target's own MTP head, or a checkpoint folder or GGUF drafter
/// file whose family (DFlash, DFlash2, EAGLE-3) its config tells, loaded as `run` loads it.
pub fn load_drafter<B: Backend>(
    be: &B,
    name: &Path,
    target_path: &Path,
    spec: &ModelSpec,
) -> Result<Drafter<B>> {
    if let Some(steps) = name.to_str().and_then(crate::drafter::mtp::steps_of_name) {
        return Ok(Drafter::Mtp(MtpDrafter::load(
            be,
            target_path,
            spec,
            steps?,
        )?));
    }
    Ok(match DrafterFamily::detect(name)? {
        DrafterFamily::DFlash => Drafter::DFlash(DFlashDrafter::load(be, name, spec.hidden_size)?),
        DrafterFamily::DFlash2 => Drafter::DFlash2(DFlash2Drafter::load(
            be,
            name,
            spec.hidden_size,
            spec.vocab_size,
        )?),
        DrafterFamily::Eagle3 => Drafter::Eagle3(Eagle3Drafter::load(be, name, spec)?),
    })
}

/// A drafter as live decoding drives it: borrowed from a loaded [`Drafter`] (or a
/// [`DFlashDrafter`] alone, as before the other families were live).
pub enum LiveDrafter<'d, B: Backend> {
    DFlash(&'d DFlashDrafter<B>),
    DFlash2(&'d DFlash2Drafter<B>),
    Eagle3(&'d Eagle3Drafter<B>),
    Mtp(&'d MtpDrafter<B>),
    /// Proposes the target's own greedy continuation: every round accepts B − 1 (τ = B).
    Oracle {
        block_size: usize,
    },
    /// Proposes the successor of the target's greedy token: nothing is accepted (τ = 1).
    AntiOracle {
        block_size: usize,
    },
}

impl<B: Backend> Clone for LiveDrafter<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for LiveDrafter<'_, B> {}

impl<'d, B: Backend> From<&'d DFlashDrafter<B>> for LiveDrafter<'d, B> {
    fn from(d: &'d DFlashDrafter<B>) -> Self {
        LiveDrafter::DFlash(d)
    }
}

impl<'d, B: Backend> From<&'d Drafter<B>> for LiveDrafter<'d, B> {
    fn from(d: &'d Drafter<B>) -> Self {
        match d {
            Drafter::DFlash(d) => LiveDrafter::DFlash(d),
            Drafter::DFlash2(d) => LiveDrafter::DFlash2(d),
            Drafter::Eagle3(d) => LiveDrafter::Eagle3(d),
            Drafter::Mtp(d) => LiveDrafter::Mtp(d),
            Drafter::Oracle { block_size } => LiveDrafter::Oracle {
                block_size: *block_size,
            },
            Drafter::AntiOracle { block_size } => LiveDrafter::AntiOracle {
                block_size: *block_size,
            },
        }
    }
}

/// A family's state over one live decoding (module table).
pub(crate) enum LiveState<B: Backend> {
    /// DFlash and DFlash2 (the backbone's context).
    Taps(DraftContext<B>),
    Eagle3(Option<Eagle3Context<B>>),
    Mtp(Option<MtpContext<B>>),
    /// The known-answer drafters keep nothing.
    Stateless,
}

impl<'d, B: Backend> LiveDrafter<'d, B> {
    /// Tokens per verify pass: the anchor and B − 1 proposals.
    pub fn block_size(&self) -> usize {
        match self {
            LiveDrafter::DFlash(d) => d.cfg.block_size,
            LiveDrafter::DFlash2(d) => d.block_size(),
            LiveDrafter::Eagle3(d) => d.block_size(),
            LiveDrafter::Mtp(d) => d.block_size(),
            LiveDrafter::Oracle { block_size } | LiveDrafter::AntiOracle { block_size } => {
                *block_size
            }
        }
    }

    /// The decoder layers whose outputs the drafter reads (`Capture::for_layer_ids`): the MTP
    /// head reads the target's final-norm state, the last layer's output (index L), as `run`
    /// captures it.
    pub fn tap_layer_ids(&self, spec: &ModelSpec) -> Vec<usize> {
        match self {
            LiveDrafter::DFlash(d) => d.cfg.target_layer_ids.clone(),
            LiveDrafter::DFlash2(d) => d.cfg.backbone.target_layer_ids.clone(),
            LiveDrafter::Eagle3(d) => d.cfg.tap_layer_ids.clone(),
            LiveDrafter::Mtp(_) => vec![spec.num_layers - 1],
            LiveDrafter::Oracle { .. } | LiveDrafter::AntiOracle { .. } => Vec::new(),
        }
    }

    /// The state over the prompt from the prefill's captured taps (`prompt.len()` rows);
    /// `first` is the prefill's token y_P, the first anchor's.
    pub(crate) fn start(
        &self,
        be: &B,
        target: &TargetModel<B>,
        captured: &Captured<B>,
        prompt: &[u32],
        first: u32,
    ) -> Result<LiveState<B>> {
        let p = prompt.len();
        let mut next_tokens = prompt[1..].to_vec();
        next_tokens.push(first);
        Ok(match self {
            LiveDrafter::DFlash(_) | LiveDrafter::DFlash2(_) => {
                let d = self.backbone().expect("a DFlash family");
                let tap_idx = hf_indices(&d.cfg.target_layer_ids);
                let taps = taps_rows(be, captured, &tap_idx, p)?;
                let refs: Vec<_> = taps.iter().collect();
                LiveState::Taps(d.context(be, &refs, target.spec.hidden_size)?)
            }
            LiveDrafter::Eagle3(_) | LiveDrafter::Mtp(_) => {
                let mut state = match self {
                    LiveDrafter::Eagle3(_) => LiveState::Eagle3(None),
                    _ => LiveState::Mtp(None),
                };
                self.extend(be, target, &mut state, captured, p, &next_tokens)?;
                state
            }
            LiveDrafter::Oracle { .. } | LiveDrafter::AntiOracle { .. } => LiveState::Stateless,
        })
    }

    /// B − 1 proposals at the anchor a = `committed.len() − 1`, whose token y_a (the last of
    /// `committed`: prompt and generated ids) is not yet in the target's cache.
    pub(crate) fn propose(
        &self,
        be: &B,
        target: &TargetModel<B>,
        state: &LiveState<B>,
        committed: &[u32],
    ) -> Result<Vec<u32>> {
        let a = committed.len() - 1;
        let y_a = committed[a];
        let top1 = DraftOptions {
            ctx_inclusive: false,
            top_k: 1,
        };
        let top = match (self, state) {
            (LiveDrafter::DFlash(d), LiveState::Taps(ctx)) => {
                d.draft(be, target, ctx, &[a], &[y_a], top1)?
            }
            // The selector's path from y_a is each row's top-1.
            (LiveDrafter::DFlash2(d), LiveState::Taps(ctx)) => {
                d.draft(be, target, ctx, &[a], &[y_a], top1)?
            }
            (LiveDrafter::Eagle3(d), LiveState::Eagle3(ctx)) => {
                let ctx = ctx
                    .as_ref()
                    .context("the EAGLE-3 context covers the prompt")?;
                d.draft(be, Some(target), ctx, &[a], 1)?
            }
            (LiveDrafter::Mtp(d), LiveState::Mtp(ctx)) => {
                let ctx = ctx.as_ref().context("the MTP context covers the prompt")?;
                d.draft(be, target, ctx, &[a], 1)?
            }
            (LiveDrafter::Oracle { .. } | LiveDrafter::AntiOracle { .. }, _) => {
                return self.oracle_proposals(be, target, committed);
            }
            _ => unreachable!("a live state belongs to its drafter's family"),
        };
        Ok(top.argmax())
    }

    /// At T > 0: B − 1 drafts at the anchor a = `committed.len() − 1` (as [`LiveDrafter::propose`])
    /// and the distribution q_k each was drawn from given the drafts before it (a point mass for
    /// greedy drafts and the known-answer drafters), under `params`.
    pub(crate) fn propose_sampled(
        &self,
        be: &B,
        target: &TargetModel<B>,
        state: &LiveState<B>,
        committed: &[u32],
        params: &SamplingParams,
        rng: &mut SamplingRng,
    ) -> Result<(Vec<u32>, Vec<Dist>)> {
        let a = committed.len() - 1;
        let y_a = committed[a];
        match (self, state) {
            (LiveDrafter::DFlash(d), LiveState::Taps(ctx)) => {
                // One pass: every position's q is fixed before any is drawn.
                let drafted = d.draft_hidden(be, target, ctx, &[a], &[y_a], false)?;
                let head = ScoringHead::of(target);
                let q = head_rows(
                    be,
                    &drafted,
                    &head,
                    draft_candidates(params),
                    params,
                    Dist::draft,
                )?;
                let drafts = q.iter().map(|qk| draw_draft(qk, params, rng)).collect();
                Ok((drafts, q))
            }
            (LiveDrafter::DFlash2(d), LiveState::Taps(ctx)) => {
                // The authors' sampled path (`CandidateSelector.select` at temperature > 0):
                // q = softmax(score / T) over the selector's candidates, top-p and top-k not
                // applied; the drawn candidate is the next position's predecessor.
                let selector_params = SamplingParams {
                    top_k: None,
                    top_p: 1.0,
                    ..*params
                };
                let hidden = d.draft_hidden(be, target, ctx, &[a], &[y_a], false)?;
                let (mut drafts, mut q) = (Vec::new(), Vec::new());
                d.selector
                    .walk(be, &d.cfg, target, &hidden, &[y_a], &mut |ranked, logq| {
                        let qk = match params.draft {
                            DraftSampling::Sampled => {
                                Dist::sampling(ranked, logq, &selector_params)
                                    .context("the selector's scores are not finite")?
                            }
                            DraftSampling::Greedy => Dist::point(ranked[0]),
                        };
                        let x = draw_draft(&qk, params, rng);
                        drafts.push(x);
                        q.push(qk);
                        Ok(x)
                    })?;
                Ok((drafts, q))
            }
            (LiveDrafter::Eagle3(d), LiveState::Eagle3(ctx)) => {
                let ctx = ctx
                    .as_ref()
                    .context("the EAGLE-3 context covers the prompt")?;
                chain_sampled(*d, be, target, ctx, a, params, rng)
            }
            (LiveDrafter::Mtp(d), LiveState::Mtp(ctx)) => {
                let ctx = ctx.as_ref().context("the MTP context covers the prompt")?;
                chain_sampled(*d, be, target, ctx, a, params, rng)
            }
            (LiveDrafter::Oracle { .. } | LiveDrafter::AntiOracle { .. }, _) => {
                let drafts = self.oracle_proposals(be, target, committed)?;
                let q = drafts.iter().map(|&x| Dist::point(x)).collect();
                Ok((drafts, q))
            }
            _ => unreachable!("a live state belongs to its drafter's family"),
        }
    }

    /// Grows the state by a verify round at anchor a: `captured` holds the verify pass's taps
    /// (row i = position a + i), of which the first `positions` are committed (y_a and the
    /// accepted drafts); `next_tokens` are the tokens after them, y_{a+1}.. (the accepted drafts
    /// and the bonus, when the round had one).
    pub(crate) fn extend(
        &self,
        be: &B,
        target: &TargetModel<B>,
        state: &mut LiveState<B>,
        captured: &Captured<B>,
        positions: usize,
        next_tokens: &[u32],
    ) -> Result<()> {
        // A context row j needs y_{j+1}: rows wait for their next token (a round without a bonus
        // ends the decoding, so none is ever missing when the next round drafts).
        let rows = positions.min(next_tokens.len());
        let tap = |layer_ids: &[usize]| -> Result<Vec<B::Tensor>> {
            hf_indices(layer_ids)
                .into_iter()
                .map(|i| {
                    let t = captured
                        .get(i)
                        .with_context(|| format!("tap hidden_states[{i}] was not captured"))?;
                    be.slice_rows(t, 0, rows)
                })
                .collect()
        };
        match (self, state) {
            (LiveDrafter::DFlash(_) | LiveDrafter::DFlash2(_), LiveState::Taps(ctx)) => {
                let d = self.backbone().expect("a DFlash family");
                let tap_idx = hf_indices(&d.cfg.target_layer_ids);
                let taps = taps_rows(be, captured, &tap_idx, positions)?;
                let refs: Vec<_> = taps.iter().collect();
                d.extend_context(be, ctx, &refs, target.spec.hidden_size)?;
            }
            (LiveDrafter::Eagle3(d), LiveState::Eagle3(ctx)) => {
                let taps = tap(&d.cfg.tap_layer_ids)?;
                let refs: Vec<&B::Tensor> = taps.iter().collect();
                *ctx =
                    d.extend_context(be, Some(target), ctx.take(), &refs, &next_tokens[..rows])?;
            }
            (LiveDrafter::Mtp(_), LiveState::Mtp(ctx)) => {
                let LiveDrafter::Mtp(d) = self else {
                    unreachable!()
                };
                let [state] = &tap(&self.tap_layer_ids(&target.spec))?[..] else {
                    unreachable!("an MTP head reads one target state")
                };
                *ctx = d.extend_context(be, target, ctx.take(), state, &next_tokens[..rows])?;
            }
            (LiveDrafter::Oracle { .. } | LiveDrafter::AntiOracle { .. }, _) => {}
            _ => unreachable!("a live state belongs to its drafter's family"),
        }
        Ok(())
    }

    /// The DFlash backbone (DFlash2 drafts over DFlash's context).
    fn backbone(&self) -> Option<&'d DFlashDrafter<B>> {
        match *self {
            LiveDrafter::DFlash(d) => Some(d),
            LiveDrafter::DFlash2(d) => Some(&d.backbone),
            _ => None,
        }
    }

    /// The known-answer proposals: the target's greedy continuation of `committed` (B − 1
    /// one-token decode steps, the bits the verify pass reproduces on the CPU reference), or
    /// each of its tokens' successor for the anti-oracle.
    fn oracle_proposals(
        &self,
        be: &B,
        target: &TargetModel<B>,
        committed: &[u32],
    ) -> Result<Vec<u32>> {
        let n = self.block_size() - 1;
        let mut ids = crate::generate::greedy(be, target, committed, n, &[])?.ids;
        // The context window may end the continuation early; the loop stops before verifying
        // such a block, so the padding is never committed.
        ids.resize(n, 0);
        if let LiveDrafter::AntiOracle { .. } = self {
            let vocab = target.spec.vocab_size as u32;
            ids.iter_mut().for_each(|t| *t = (*t + 1) % vocab);
        }
        Ok(ids)
    }
}

/// A chain family's K drafts at anchor `a` at T > 0, and each step's q: step s's states scored by
/// the family's head under `params`, its token drawn from q_s (or q_s's argmax for greedy
/// drafts) and embedded by step s + 1, so q_{s+1} is conditioned on the drawn token, as the
/// target's p_{s+1} is in the verify pass.
fn chain_sampled<B: Backend, C: ChainDrafter<B>>(
    chain: &C,
    be: &B,
    target: &TargetModel<B>,
    ctx: &C::Context,
    a: usize,
    params: &SamplingParams,
    rng: &mut SamplingRng,
) -> Result<(Vec<u32>, Vec<Dist>)> {
    let head = chain.scoring_head(Some(target))?;
    let needed = draft_candidates(params);
    let (mut drafts, mut q) = (Vec::new(), Vec::new());
    chain.run_chain(be, Some(target), ctx, &[a], &mut |states| {
        let qs = head_rows(be, states, &head, needed, params, Dist::draft)?
            .pop()
            .context("one anchor's step")?;
        let x = draw_draft(&qs, params, rng);
        drafts.push(x);
        q.push(qs);
        Ok(vec![x])
    })?;
    Ok((drafts, q))
}

/// Hugging Face hidden-state indices of decoder-layer ids (id → id + 1, `crate::model::capture`).
fn hf_indices(layer_ids: &[usize]) -> Vec<usize> {
    layer_ids.iter().map(|i| i + 1).collect()
}
