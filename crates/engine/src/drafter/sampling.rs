//! Live speculative sampling at temperature T > 0 (`draftlens live --temperature`), and plain
//! sampling from the target, the reference it must equal in distribution.
//!
//! The distributions and the rule are `draftlens_records::sampling`'s (one definition for the
//! live decode and the replayed expectation, `docs/metrics.md` §7): p and q are the target's and
//! the drafter's candidates after the same temperature → top-k → top-p transform. A round at
//! anchor a (the last committed token y_a, not yet in the target's cache):
//!
//! 1. the drafter proposes x_1..x_γ, each with the distribution q_k it was drawn from, given
//!    the drafts before it (`LiveDrafter::propose_sampled`, drafter/live_drafter.rs): DFlash
//!    draws every position of its one block pass independently (vLLM's DFlash path with
//!    `draft_sample_method = "probabilistic"`); DFlash2 walks its selector's path, each
//!    position's candidate drawn given the one before (the authors' `CandidateSelector.select`);
//!    EAGLE-3 and MTP heads draw each chain step's token and feed it to the next step. With
//!    [`DraftSampling::Greedy`] each x_k is argmax q_k and q_k a point mass (z-lab's
//!    `dflash_generate` for DFlash, vLLM's default);
//! 2. one target pass over `[y_a, x_1..x_γ]` gives p_1..p_{γ+1};
//! 3. for k = 1, 2, …: accept x_k with probability min(1, p_k(x_k)/q_k(x_k)); at the first
//!    rejection draw the round's last token from norm(max(0, p_k − q_k)); when all γ are
//!    accepted draw the bonus token from p_{γ+1} ([`verify`]). Lossless for every family:
//!    q_k is the distribution x_k was drawn from given x_{<k}, and p_k is conditioned on the same
//!    x_{<k};
//! 4. the cache is cropped and the drafter's state extended exactly as in greedy live decoding
//!    ([`super::live`], the same `LiveDrafter`), whose round and τ conventions this loop shares.
//!
//! Randomness: one ChaCha20 stream per prompt ([`SamplingRng::for_prompt`]: the run's seed and a
//! stream id from the prompt's content), so a prompt's output does not depend on which other
//! prompts run or in what order. Draws, in order: the prefill's token; then per round the γ
//! drafts (sampled drafts only, position by position), one uniform per verified position, and
//! one for the round's last token (residual or bonus). Plain sampling draws one uniform per token from the same kind of
//! stream, so the prefill's token is the same in both.

use super::eval::{AnchorPolicy, EvalOptions, Labels};
use super::live::{LiveDrafter, LiveResult};
use crate::backend::{Backend, TopK};
use crate::model::{Capture, EmbedHead, TargetModel};
use anyhow::{bail, Context, Result};
use draftlens_records::sampling::{accepts, residual, Dist, DraftSampling, SamplingParams};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

/// The random stream of one prompt: ChaCha20 (a fixed, portable algorithm: the same seed gives
/// the same draws on every machine and every version of this crate's dependencies' 0.9 line).
pub struct SamplingRng(ChaCha20Rng);

impl SamplingRng {
    /// Stream `stream` of the generator seeded with `seed` (ChaCha's 64-bit stream id: streams of
    /// one seed are independent).
    pub fn for_prompt(seed: u64, stream: u64) -> Self {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        SamplingRng(rng)
    }

    /// Uniform on [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A prompt's stream id: the first 16 hex digits of its sha256 (`Prompt::hash`), so the stream
/// follows the prompt's content, not its place in a set or a batch.
pub fn prompt_stream(sha256_hex: &str) -> Result<u64> {
    let head = sha256_hex
        .get(..16)
        .context("a prompt hash has 64 hex digits")?;
    u64::from_str_radix(head, 16).with_context(|| format!("{sha256_hex:?} is not a hex sha256"))
}

/// A run sampled at T > 0 (`run --temperature`, [`EvalOptions::sampling`]): the transform and
/// how drafts are chosen, and the seed of every prompt's sampled continuation. Stored in the
/// run's settings and evaluation identity as `eval.sampling`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampledEval {
    #[serde(flatten)]
    pub params: SamplingParams,
    /// With the prompt's content ([`prompt_stream`]), the stream its continuation is drawn from.
    pub seed: u64,
}

impl SampledEval {
    /// Refuse, before anything runs, a sampled evaluation whose expectation could not be exact:
    /// the transform must be determined by the stored candidates, and every completion anchor
    /// must be drafted (a sampled decode may visit any of them).
    pub fn check(&self, eval: &EvalOptions) -> Result<()> {
        let k = eval.top_k;
        if !self.params.exact_with_candidates(k) {
            bail!(
                "--sampling-top-k {}: the expected acceptance at T > 0 needs the transformed p and q exactly, and \
                 the stored top-{k} candidates (--top-k {k}) give them only for a sampling top-k of at most {k} \
                 (without it the temperature's normaliser and top-p need every token; docs/metrics.md §7): give \
                 --sampling-top-k N with N <= {k}, or raise --top-k",
                self.params.top_k.map_or("missing".to_string(), |t| t.to_string())
            );
        }
        if eval.anchors != AnchorPolicy::Every {
            bail!(
                "--temperature: a sampled decode may visit any completion anchor, so every one is drafted: \
                 leave out --stride / --sample"
            );
        }
        if eval.labels != Labels::Target {
            bail!("--temperature: a sampled run's continuation is drawn from the target: leave out --labels data");
        }
        Ok(())
    }

    /// The prompt's continuation drawn from the target ([`sample_decode`]) on the stream of this
    /// run's seed and the prompt's sha256.
    pub fn continuation<B: Backend>(
        &self,
        be: &B,
        target: &TargetModel<B>,
        prompt: &[u32],
        max_new: usize,
        eos: &[u32],
        prompt_sha256: &str,
    ) -> Result<Vec<u32>> {
        let mut rng = SamplingRng::for_prompt(self.seed, prompt_stream(prompt_sha256)?);
        sample_decode(be, target, prompt, max_new, eos, &self.params, &mut rng)
    }
}

/// The acceptance test and the residual a rejected position draws from: [`Rule::STANDARD`] is
/// the lossless rule; tests plug in wrong ones to show the losslessness test catches them.
#[derive(Clone, Copy)]
pub struct Rule {
    /// `accepts(p(x), q(x), u)` with u uniform on [0, 1).
    pub accepts: fn(f64, f64, f64) -> bool,
    /// What a rejected position's token is drawn from; None when p ≤ q everywhere.
    pub residual: fn(&Dist, &Dist) -> Option<Dist>,
}

impl Rule {
    /// min(1, p/q) and norm(max(0, p − q)) (Leviathan et al. 2023; Chen et al. 2023).
    pub const STANDARD: Rule = Rule { accepts, residual };
}

/// The outcome of verifying one round's drafts.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// Drafts accepted: the leading drafts committed.
    pub accepted: usize,
    /// The round's last token: the residual draw at the first rejection, or the bonus from
    /// p_{γ+1} when every draft was accepted; None when an accepted EOS or the budget ended the
    /// round first.
    pub next: Option<u32>,
}

/// Verify `drafts` (x_k drawn from `q[k]`) against the target's `p` (γ + 1 rows) under `rule`:
/// at most `budget` tokens may still be committed; an accepted EOS ends the round.
pub fn verify(
    p: &[Dist],
    q: &[Dist],
    drafts: &[u32],
    budget: usize,
    eos: &[u32],
    rule: &Rule,
    rng: &mut SamplingRng,
) -> Verified {
    let mut accepted = 0;
    while accepted < drafts.len() && accepted < budget {
        let (pk, qk, x) = (&p[accepted], &q[accepted], drafts[accepted]);
        if !(rule.accepts)(pk.prob(x), qk.prob(x), rng.uniform()) {
            // A rejection means p(x) < q(x), so p exceeds q somewhere and the residual has mass;
            // p itself covers a rounding-level empty residual.
            let r = (rule.residual)(pk, qk).unwrap_or_else(|| pk.clone());
            return Verified {
                accepted,
                next: Some(r.sample(rng.uniform())),
            };
        }
        accepted += 1;
        if eos.contains(&x) {
            return Verified {
                accepted,
                next: None,
            };
        }
    }
    let next = (accepted < budget).then(|| p[accepted].sample(rng.uniform()));
    Verified { accepted, next }
}

/// Above this many candidates a row is read as every token's logit (one GEMM with the LM head)
/// rather than through the fused LM-head top-K, whose CUDA kernel stops at 64 and whose CPU
/// version keeps a sorted buffer (quadratic in k).
const FUSED_TOP_K_MAX: usize = 64;

/// An LM head that scores final-norm states over the target's vocabulary: `matrix` has `rows`
/// rows, row i scoring the target's token `target_of[i]` (EAGLE-3's draft vocabulary) or token i.
pub struct ScoringHead<'a, B: Backend> {
    pub matrix: &'a B::Matrix,
    pub rows: usize,
    pub target_of: Option<&'a [u32]>,
}

impl<'a, B: Backend> ScoringHead<'a, B> {
    /// A model's own LM head (the target's, which DFlash, DFlash2 and MTP heads share).
    pub fn of(head: &'a dyn EmbedHead<B>) -> Self {
        ScoringHead {
            matrix: head.head(),
            rows: head.vocab_size(),
            target_of: None,
        }
    }

    fn target_id(&self, row: u32) -> u32 {
        self.target_of.map_or(row, |m| m[row as usize])
    }

    /// The best `k` of every row of `states` (log-probabilities over the head's rows), ids in
    /// the target's vocabulary: the fused LM-head top-K.
    pub fn topk(&self, be: &B, states: &B::Tensor, k: usize) -> Result<TopK> {
        let mut top = be.lm_head_topk(states, self.matrix, k)?;
        if self.target_of.is_some() {
            for id in top.ids.iter_mut() {
                *id = self.target_id(*id);
            }
        }
        Ok(top)
    }
}

/// The rows of `hidden` (final-norm states) as distributions under `params` (`dist`:
/// [`Dist::sampling`] or [`Dist::draft`]), read from `head` as the `needed` best candidates of
/// each row (None: every token). The transform reads the same tokens either way: with top-k it
/// never looks past the k best.
pub(crate) fn head_rows<B: Backend>(
    be: &B,
    hidden: &B::Tensor,
    head: &ScoringHead<'_, B>,
    needed: Option<usize>,
    params: &SamplingParams,
    dist: fn(&[u32], &[f32], &SamplingParams) -> Option<Dist>,
) -> Result<Vec<Dist>> {
    let vocab = head.rows;
    let row = |r: usize, ids: &[u32], scores: &[f32]| {
        dist(ids, scores, params)
            .with_context(|| format!("row {r} of the LM head has no finite logit"))
    };
    match needed {
        Some(k) if k <= FUSED_TOP_K_MAX && k < vocab => {
            let top = head.topk(be, hidden, k)?;
            (0..top.rows)
                .map(|r| row(r, top.row_ids(r), top.row_logprobs(r)))
                .collect()
        }
        // Logits serve as log-probabilities: the transform's softmax removes the constant.
        _ => {
            let logits = be.to_host(&be.matmul(hidden, head.matrix)?)?;
            let ids: Vec<u32> = (0..vocab as u32).map(|i| head.target_id(i)).collect();
            logits
                .chunks(vocab)
                .enumerate()
                .map(|(r, scores)| row(r, &ids, scores))
                .collect()
        }
    }
}

/// The candidates a drafted position's q needs: the sampling top-k (None: every token) for
/// sampled drafts, the best one for greedy drafts.
pub(crate) fn draft_candidates(params: &SamplingParams) -> Option<usize> {
    match params.draft {
        DraftSampling::Sampled => params.top_k.map(|k| k as usize),
        DraftSampling::Greedy => Some(1),
    }
}

/// A drafted token from its q: a draw ([`DraftSampling::Sampled`]) or q's argmax, without a draw
/// ([`DraftSampling::Greedy`], q a point mass).
pub(crate) fn draw_draft(q: &Dist, params: &SamplingParams, rng: &mut SamplingRng) -> u32 {
    match params.draft {
        DraftSampling::Sampled => q.sample(rng.uniform()),
        DraftSampling::Greedy => q.argmax(),
    }
}

/// Plain sampling from the target: the prefill's token, then one token per decode step, each
/// drawn from the transformed p; stops at an EOS, after `max_new` tokens or at the context
/// window. What speculative sampling must equal in distribution.
pub fn sample_decode<B: Backend>(
    be: &B,
    target: &TargetModel<B>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
    params: &SamplingParams,
    rng: &mut SamplingRng,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        bail!("empty prompt");
    }
    let needed = params.top_k.map(|k| k as usize);
    let mut ids = Vec::with_capacity(max_new);
    let mut cache = target.new_cache();
    let mut feed = prompt.to_vec();
    while ids.len() < max_new && cache.len + feed.len() <= target.spec.max_position_embeddings {
        let out = target.forward(be, &feed, &mut cache, &Capture::none())?;
        let n = feed.len();
        let last = be.slice_rows(&out.last_hidden, n - 1, n)?;
        let next = head_rows(
            be,
            &last,
            &ScoringHead::of(target),
            needed,
            params,
            Dist::sampling,
        )?[0]
            .sample(rng.uniform());
        ids.push(next);
        if eos.contains(&next) {
            break;
        }
        feed = vec![next];
    }
    Ok(ids)
}

/// Live speculative sampling with the lossless rule: [`live_decode_sampled_with`]
/// [`Rule::STANDARD`].
#[allow(clippy::too_many_arguments)]
pub fn live_decode_sampled<'d, B: Backend + 'd>(
    be: &B,
    target: &TargetModel<B>,
    drafter: impl Into<LiveDrafter<'d, B>>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
    params: &SamplingParams,
    rng: &mut SamplingRng,
) -> Result<LiveResult> {
    live_decode_sampled_with(
        be,
        target,
        drafter,
        prompt,
        max_new,
        eos,
        params,
        rng,
        &Rule::STANDARD,
    )
}

/// The draft → verify loop of speculative sampling (module docs) under `rule`, for every drafter
/// family. Rounds, budget, EOS, cache crop and the drafter's state as in greedy
/// [`super::live::live_decode`]; the tokens a round commits are the accepted drafts and
/// [`Verified::next`].
#[allow(clippy::too_many_arguments)]
pub fn live_decode_sampled_with<'d, B: Backend + 'd>(
    be: &B,
    target: &TargetModel<B>,
    drafter: impl Into<LiveDrafter<'d, B>>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
    params: &SamplingParams,
    rng: &mut SamplingRng,
    rule: &Rule,
) -> Result<LiveResult> {
    let drafter = drafter.into();
    if prompt.is_empty() {
        bail!("empty prompt");
    }
    let mut res = LiveResult::default();
    if max_new == 0 {
        return Ok(res);
    }
    let needed = params.top_k.map(|k| k as usize);
    let head = ScoringHead::of(target);
    let capture =
        Capture::for_layer_ids(&drafter.tap_layer_ids(&target.spec), target.spec.num_layers)?;
    let mut cache = target.new_cache();
    let out = target.forward(be, prompt, &mut cache, &capture)?;
    let n = prompt.len();
    let last = be.slice_rows(&out.last_hidden, n - 1, n)?;
    let first =
        head_rows(be, &last, &head, needed, params, Dist::sampling)?[0].sample(rng.uniform());
    res.ids.push(first);
    let mut state = drafter.start(be, target, &out.captured, prompt, first)?;
    // The prompt and the generated ids: what the drafter proposes after.
    let mut committed = prompt.to_vec();
    committed.push(first);
    while !eos.contains(res.ids.last().expect("non-empty")) && res.ids.len() < max_new {
        let a = n + res.ids.len() - 1;
        let y_a = *res.ids.last().expect("non-empty");
        let (drafts, q) = drafter.propose_sampled(be, target, &state, &committed, params, rng)?;
        let mut block = vec![y_a];
        block.extend(&drafts);
        if cache.len + block.len() > target.spec.max_position_embeddings {
            break;
        }
        let v = target.forward_verify(be, &block, &mut cache, &capture)?;
        let p = head_rows(be, &v.last_hidden, &head, needed, params, Dist::sampling)?;
        let budget = max_new - res.ids.len();
        let verified = verify(&p, &q, &drafts, budget, eos, rule, rng);
        let acc = verified.accepted;
        let before = res.ids.len();
        res.ids.extend_from_slice(&drafts[..acc]);
        res.ids.extend(verified.next);
        let new_tokens = &res.ids[before..];
        committed.extend_from_slice(new_tokens);
        res.drafts.extend_from_slice(&drafts);
        res.round_tokens.push(new_tokens.len() as u32);
        res.accepted.push(acc as u32);
        // Keep y_a and the accepted drafts in the cache; the round's last token enters with the
        // next verify pass.
        target.crop(be, &mut cache, a + acc + 1)?;
        drafter.extend(be, target, &mut state, &v.captured, acc + 1, new_tokens)?;
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(w: &[(u32, f64)]) -> Dist {
        Dist::from_weights(w.iter().copied()).unwrap()
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let draws = |seed, stream| {
            let mut r = SamplingRng::for_prompt(seed, stream);
            (0..4).map(|_| r.uniform()).collect::<Vec<_>>()
        };
        assert_eq!(draws(7, 1), draws(7, 1));
        assert_ne!(draws(7, 1), draws(7, 2));
        assert_ne!(draws(7, 1), draws(8, 1));
        assert!(draws(7, 1).iter().all(|u| (0.0..1.0).contains(u)));
        // ChaCha20 is pinned: these bits must never change (a different generator, or another
        // version of it, would silently change every seeded output).
        let u = draws(0, 0)[0];
        assert_eq!(
            u.to_bits(),
            0x3F98_F37B_5A07_D7C0,
            "{u} = {:#x}",
            u.to_bits()
        );
        assert_eq!(
            prompt_stream("00000000000000ff0123").unwrap(),
            255,
            "the stream is the hash's first 16 hex digits"
        );
        assert!(prompt_stream("zz").is_err());
    }

    #[test]
    fn verify_accepts_rejects_and_draws_the_bonus() {
        let p = vec![
            dist(&[(1, 0.5), (2, 0.5)]),
            dist(&[(3, 1.0)]),
            dist(&[(4, 1.0)]),
        ];
        // q = p at position 1 (always accepted), a point mass at 3 at position 2 (p(3) = 1).
        let q = vec![p[0].clone(), Dist::point(3)];
        let mut rng = SamplingRng::for_prompt(1, 1);
        let v = verify(&p, &q, &[2, 3], 3, &[], &Rule::STANDARD, &mut rng);
        assert_eq!(
            v,
            Verified {
                accepted: 2,
                next: Some(4)
            }
        );
        // The budget stops the round: no bonus.
        let v = verify(&p, &q, &[2, 3], 2, &[], &Rule::STANDARD, &mut rng);
        assert_eq!(
            v,
            Verified {
                accepted: 2,
                next: None
            }
        );
        // An accepted EOS ends the round.
        let v = verify(&p, &q, &[2, 3], 3, &[2], &Rule::STANDARD, &mut rng);
        assert_eq!(
            v,
            Verified {
                accepted: 1,
                next: None
            }
        );
        // A draft the target never makes is rejected and replaced from the residual (p(x) > q(x)
        // only at 3 at position 2).
        let q = vec![p[0].clone(), dist(&[(3, 0.5), (5, 0.5)])];
        let v = verify(&p, &q, &[1, 5], 3, &[], &Rule::STANDARD, &mut rng);
        assert_eq!(
            v,
            Verified {
                accepted: 1,
                next: Some(3)
            }
        );
    }
}
