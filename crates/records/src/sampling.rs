//! Speculative sampling at temperature T > 0, defined once (`docs/metrics.md` §7): the transform
//! that turns a model's log-probabilities into the distribution a token is drawn from, the
//! acceptance rule (Leviathan et al. 2023; Chen et al. 2023) and its expectation.
//!
//! * [`Dist::sampling`]: temperature, then top-k, then top-p, then renormalise — the order of
//!   transformers' warpers and vLLM's sampler. The target's p and the drafter's q go through the
//!   same transform.
//! * The rule, per drafted position k: a draft x ~ q_k is accepted when u · q_k(x) < p_k(x)
//!   ([`accepts`], u uniform on [0, 1)), i.e. with probability min(1, p/q); at the first
//!   rejection the token is drawn from the [`residual`] norm(max(0, p − q)); when every draft is
//!   accepted the bonus token is drawn from p_{γ+1}. A greedy draft (x = argmax q) is the same
//!   rule with q a point mass at x ([`DraftSampling::Greedy`]).
//! * Its expectation: P(x_k accepted | x_{<k} accepted) = α_k = Σ_x min(p_k(x), q_k(x))
//!   ([`overlap`]), hence P(A ≥ k) = Π_{j≤k} α_j ([`survival`]) for DFlash, whose q_k does not
//!   depend on the drafted prefix; [`expected_round_tokens`] and [`expected_chain`] turn it into
//!   the expected tokens of one round and the expected rounds and τ of a whole decode.
//!
//! The live decode (`crates/engine/src/drafter/sampling.rs`) samples with these functions and the
//! native metrics (`crates/results/src/metrics/sampled.rs`) compute the expectation with them, so
//! p, q and the rule mean the same thing on both surfaces.

use crate::replay::MissingAnchor;
use crate::Block;
use std::fmt;

/// How the drafter's tokens are chosen at T > 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum DraftSampling {
    /// x_k ~ q_k, every drafted position drawn independently from the drafter's transformed
    /// distribution given `[y_a, MASK…]` (vLLM's `draft_sample_method = "probabilistic"`).
    Sampled,
    /// x_k = argmax q_k, q treated as a point mass at x_k: acceptance probability p_k(x_k)
    /// (z-lab's `dflash_generate`, vLLM's default `draft_sample_method = "greedy"`).
    Greedy,
}

impl DraftSampling {
    pub fn as_str(self) -> &'static str {
        match self {
            DraftSampling::Sampled => "sampled",
            DraftSampling::Greedy => "greedy",
        }
    }
}

/// The sampling settings of a decode: the transform of both distributions and how drafts are
/// chosen. Build it with [`SamplingParams::new`], which checks every field.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SamplingParams {
    /// T ≥ 0; 0 is greedy decoding (the transform keeps only the argmax).
    pub temperature: f64,
    /// Keep the k most likely tokens (after temperature); `None`: no top-k.
    pub top_k: Option<u32>,
    /// Keep the smallest set of most likely tokens whose probability reaches top-p, in (0, 1];
    /// 1: no top-p.
    pub top_p: f64,
    pub draft: DraftSampling,
}

/// A sampling setting out of range; the message names the command-line flag.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingError(pub String);

impl fmt::Display for SamplingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SamplingError {}

/// T must be finite and ≥ 0 (`--temperature`).
pub fn check_temperature(t: f64) -> Result<f64, SamplingError> {
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(SamplingError(format!(
            "--temperature must be a number ≥ 0 (0 = greedy), got {t}"
        )))
    }
}

/// top-p must lie in (0, 1] (`--top-p`).
pub fn check_top_p(p: f64) -> Result<f64, SamplingError> {
    if p > 0.0 && p <= 1.0 {
        Ok(p)
    } else {
        Err(SamplingError(format!(
            "--top-p must be in (0, 1] (1 = no top-p), got {p}"
        )))
    }
}

/// top-k must be at least 1 (`--top-k`); leave it out for no top-k.
pub fn check_top_k(k: u32) -> Result<u32, SamplingError> {
    if k >= 1 {
        Ok(k)
    } else {
        Err(SamplingError(
            "--top-k must be at least 1 (leave it out for no top-k), got 0".into(),
        ))
    }
}

impl SamplingParams {
    /// Checked settings: T ≥ 0, top-p in (0, 1], top-k ≥ 1.
    pub fn new(
        temperature: f64,
        top_k: Option<u32>,
        top_p: f64,
        draft: DraftSampling,
    ) -> Result<Self, SamplingError> {
        Ok(SamplingParams {
            temperature: check_temperature(temperature)?,
            top_k: top_k.map(check_top_k).transpose()?,
            top_p: check_top_p(top_p)?,
            draft,
        })
    }

    /// Whether `k` stored candidates per position (the best k, with their log-probabilities over
    /// the whole vocabulary) determine the transformed distribution exactly: with top-k ≤ k the
    /// transform never reads a token outside them. Without top-k (or a larger one) the
    /// temperature's normaliser and the top-p cut depend on the tokens not stored.
    pub fn exact_with_candidates(&self, k: usize) -> bool {
        self.temperature == 0.0 || self.top_k.is_some_and(|t| t as usize <= k)
    }

    /// `T=1 top-k=20 top-p=0.95 draft=sampled`: the settings as one line.
    pub fn describe(&self) -> String {
        let top_k = self.top_k.map_or("off".to_string(), |k| k.to_string());
        format!(
            "T={} top-k={top_k} top-p={} draft={}",
            self.temperature,
            self.top_p,
            self.draft.as_str()
        )
    }
}

/// A probability distribution over token ids with finite support: what one token is drawn from.
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    /// (id, probability > 0), most likely first, ties by ascending id; probabilities sum to 1.
    entries: Vec<(u32, f64)>,
    /// The same entries by ascending id, for [`Dist::prob`].
    by_id: Vec<(u32, f64)>,
}

impl Dist {
    /// From (id, weight ≥ 0) pairs: zero weights dropped, the rest normalised and sorted. None
    /// when no weight is positive.
    pub fn from_weights(weights: impl IntoIterator<Item = (u32, f64)>) -> Option<Dist> {
        let mut entries: Vec<(u32, f64)> = weights.into_iter().filter(|&(_, w)| w > 0.0).collect();
        let total: f64 = entries.iter().map(|&(_, w)| w).sum();
        if entries.is_empty() || !total.is_finite() {
            return None;
        }
        for e in &mut entries {
            e.1 /= total;
        }
        sort_most_likely_first(&mut entries);
        let mut by_id = entries.clone();
        by_id.sort_unstable_by_key(|&(id, _)| id);
        Some(Dist { entries, by_id })
    }

    /// All the probability on `id`.
    pub fn point(id: u32) -> Dist {
        Dist {
            entries: vec![(id, 1.0)],
            by_id: vec![(id, 1.0)],
        }
    }

    /// The distribution a token is drawn from under `params`, from a model's candidates (ids and
    /// natural-log probabilities, any order; non-finite log-probabilities are padding and
    /// skipped): the full vocabulary, or its best K when [`SamplingParams::exact_with_candidates`]
    /// says K suffices. In order, as transformers' warpers and vLLM's sampler apply them:
    ///
    /// 1. temperature: logits / T (log-probabilities differ from logits by a constant, which
    ///    the softmax removes); T = 0 keeps only the most likely token;
    /// 2. top-k: keep the k most likely tokens (ties by ascending id);
    /// 3. top-p: softmax over what is left, then keep the most likely tokens while the
    ///    probability of those before them is < top-p (the smallest set reaching top-p, at least
    ///    one token);
    /// 4. renormalise.
    ///
    /// None when no candidate is finite.
    pub fn sampling(ids: &[u32], logprobs: &[f32], params: &SamplingParams) -> Option<Dist> {
        let mut cands: Vec<(u32, f64)> = ids
            .iter()
            .zip(logprobs)
            .filter(|(_, l)| l.is_finite())
            .map(|(&id, &l)| (id, l as f64))
            .collect();
        if cands.is_empty() {
            return None;
        }
        sort_most_likely_first(&mut cands);
        if params.temperature == 0.0 {
            return Some(Dist::point(cands[0].0));
        }
        if let Some(k) = params.top_k {
            cands.truncate(k as usize);
        }
        // Tempered softmax over what is left (shifted by the maximum for range).
        let top = cands[0].1 / params.temperature;
        let mut probs: Vec<(u32, f64)> = cands
            .iter()
            .map(|&(id, l)| (id, (l / params.temperature - top).exp()))
            .collect();
        let total: f64 = probs.iter().map(|&(_, w)| w).sum();
        for p in &mut probs {
            p.1 /= total;
        }
        if params.top_p < 1.0 {
            let (mut keep, mut before) = (0, 0.0);
            for &(_, p) in &probs {
                if before >= params.top_p {
                    break;
                }
                before += p;
                keep += 1;
            }
            probs.truncate(keep.max(1));
        }
        Dist::from_weights(probs)
    }

    /// The distribution the drafter's token at one position is drawn from: the transform of its
    /// candidates ([`DraftSampling::Sampled`]) or a point mass at its most likely candidate
    /// ([`DraftSampling::Greedy`]; the transform never changes which token that is).
    pub fn draft(ids: &[u32], logprobs: &[f32], params: &SamplingParams) -> Option<Dist> {
        match params.draft {
            DraftSampling::Sampled => Dist::sampling(ids, logprobs, params),
            DraftSampling::Greedy => Dist::sampling(
                ids,
                logprobs,
                &SamplingParams {
                    temperature: 0.0,
                    ..*params
                },
            ),
        }
    }

    /// P(id); 0 outside the support.
    pub fn prob(&self, id: u32) -> f64 {
        self.by_id
            .binary_search_by_key(&id, |&(i, _)| i)
            .map_or(0.0, |i| self.by_id[i].1)
    }

    /// (id, probability), most likely first.
    pub fn entries(&self) -> &[(u32, f64)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most likely token.
    pub fn argmax(&self) -> u32 {
        self.entries[0].0
    }

    /// The token drawn by `u` uniform on [0, 1) (inverse CDF over [`Dist::entries`]' order).
    pub fn sample(&self, u: f64) -> u32 {
        let mut cum = 0.0;
        for &(id, p) in &self.entries {
            cum += p;
            if u < cum {
                return id;
            }
        }
        // u within rounding of 1: the last token of the support.
        self.entries[self.entries.len() - 1].0
    }
}

/// Most likely first, ties by ascending id: one order for the transform and for sampling.
fn sort_most_likely_first(v: &mut [(u32, f64)]) {
    v.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
}

/// The acceptance test of a draft x with target probability `p_x` and draft probability
/// `q_x` > 0, given u uniform on [0, 1): accepted with probability min(1, p_x / q_x).
pub fn accepts(p_x: f64, q_x: f64, u: f64) -> bool {
    u * q_x < p_x
}

/// What a rejected position's token is drawn from: norm(max(0, p − q)). None when p ≤ q
/// everywhere (then p = q, α = 1 and no draft is ever rejected).
pub fn residual(p: &Dist, q: &Dist) -> Option<Dist> {
    Dist::from_weights(p.entries().iter().map(|&(x, px)| (x, px - q.prob(x))))
}

/// α = Σ_x min(p(x), q(x)) = 1 − TV(p, q): the probability that a draft x ~ q is accepted.
/// With q a point mass at d it is p(d).
pub fn overlap(p: &Dist, q: &Dist) -> f64 {
    let (small, other) = if p.len() <= q.len() { (p, q) } else { (q, p) };
    small
        .entries()
        .iter()
        .map(|&(x, s)| s.min(other.prob(x)))
        .sum()
}

/// α_k of one block's drafted positions under `params`: Σ_x min(p'_k(x), q'_k(x)) with p' the
/// target's transformed distribution at a+k and q' the drafted one ([`Dist::draft`]), over the
/// valid positions up to the first invalid one (the end of the sequence). None when the block has
/// no stored target top-K, or a valid position has no finite candidate.
///
/// The target's p_k is the one stored: given the sequence's own tokens before a+k, not given the
/// drafts x_{<k} (`docs/metrics.md` §7 on why that is the expectation to report for DFlash).
pub fn block_alphas(block: &Block<'_>, params: &SamplingParams) -> Option<Vec<f64>> {
    let mut alphas = Vec::with_capacity(block.len());
    for pos in block.positions() {
        if !pos.valid {
            break;
        }
        let target = pos.target_top?;
        let p = Dist::sampling(target.ids, target.logprobs, params)?;
        let q = Dist::draft(pos.draft.ids, pos.draft.logprobs, params)?;
        alphas.push(overlap(&p, &q));
    }
    Some(alphas)
}

/// S_k = P(A ≥ k) = Π_{j≤k} α_j, k = 1..len.
pub fn survival(alphas: &[f64]) -> Vec<f64> {
    alphas
        .iter()
        .scan(1.0, |s, &a| {
            *s *= a;
            Some(*s)
        })
        .collect()
}

/// Expected tokens of one verify round, bonus included: E[A + 1] = 1 + Σ_k Π_{j≤k} α_j over the
/// round's positions (the uniform-anchor convention: no end-of-sequence cap).
pub fn expected_round_tokens(alphas: &[f64]) -> f64 {
    1.0 + survival(alphas).iter().sum::<f64>()
}

/// What the chain of verify rounds of a speculative decode is expected to give
/// ([`expected_chain`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChainExpectation {
    /// Tokens the rounds commit, `end − first` whichever anchors the decode visits.
    pub tokens: u32,
    /// E[R]: the expected number of rounds.
    pub rounds: f64,
    /// E[tokens / R]: the expectation of the τ a live decode of this sequence reports. By Jensen
    /// it exceeds tokens / E[R] by about τ · Var(R) / E[R]² (a short sequence's few rounds).
    pub tau: f64,
}

/// Contributions to the rounds' distribution below this are dropped (their total changes E[R]
/// and E[tokens / R] by less than about 1e-12 of their value for sequences up to 10⁵ tokens).
const NEGLIGIBLE: f64 = 1e-18;

/// The distribution of R over the chain of a speculative decode that starts at anchor `first`
/// and stops when the anchor reaches `end` (the last position of the sequence;
/// `docs/metrics.md` §3), summarised as E[R] and E[tokens / R]. A round at anchor a accepts
/// A = n drafts with probability S_n − S_{n+1} (S from `alphas_at(a)` by [`survival`], S_0 = 1,
/// zero past the block's valid positions) and moves to a + n + 1. `alphas_at(a)` is None when no
/// block is stored at a: an error for an anchor the decode visits with positive probability.
/// None when `first ≥ end` (no round).
pub fn expected_chain(
    first: u32,
    end: u32,
    mut alphas_at: impl FnMut(u32) -> Option<Vec<f64>>,
) -> Result<Option<ChainExpectation>, MissingAnchor> {
    if first >= end {
        return Ok(None);
    }
    let span = (end - first) as usize;
    // reach[i]: P(the decode arrives at anchor first + i after r rounds), over r.
    let mut reach: Vec<RoundsMass> = (0..span).map(|_| RoundsMass::default()).collect();
    reach[0].add(0, 1.0);
    let (mut rounds, mut tau) = (0.0, 0.0);
    for i in 0..span {
        let here = std::mem::take(&mut reach[i]);
        if here.mass.is_empty() {
            continue;
        }
        let a = first + i as u32;
        let s = survival(&alphas_at(a).ok_or(MissingAnchor(a))?);
        let at_least = |n: usize| match n {
            0 => 1.0,
            n => s.get(n - 1).copied().unwrap_or(0.0),
        };
        for n in 0..=s.len() {
            let p_n = at_least(n) - at_least(n + 1);
            if p_n <= 0.0 {
                continue;
            }
            let next = i + n + 1;
            for (j, &m) in here.mass.iter().enumerate() {
                let (m, r) = (m * p_n, here.first + j + 1);
                if m < NEGLIGIBLE {
                    continue;
                }
                if next >= span {
                    rounds += m * r as f64;
                    tau += m * span as f64 / r as f64;
                } else {
                    reach[next].add(r, m);
                }
            }
        }
    }
    Ok(Some(ChainExpectation {
        tokens: span as u32,
        rounds,
        tau,
    }))
}

/// Probability mass over round counts first, first + 1, … (one anchor of [`expected_chain`]).
#[derive(Default)]
struct RoundsMass {
    first: usize,
    mass: Vec<f64>,
}

impl RoundsMass {
    fn add(&mut self, r: usize, m: f64) {
        if self.mass.is_empty() {
            self.first = r;
        } else if r < self.first {
            let shift = self.first - r;
            self.mass.splice(0..0, std::iter::repeat_n(0.0, shift));
            self.first = r;
        }
        let j = r - self.first;
        if j >= self.mass.len() {
            self.mass.resize(j + 1, 0.0);
        }
        self.mass[j] += m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f64, top_k: Option<u32>, top_p: f64) -> SamplingParams {
        SamplingParams::new(t, top_k, top_p, DraftSampling::Sampled).unwrap()
    }

    fn ln(x: f64) -> f32 {
        x.ln() as f32
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn the_transform_applies_temperature_then_top_k_then_top_p() {
        // p = (.5, .3, .15, .05) over ids 7, 3, 9, 1 (given out of order).
        let ids = [9, 7, 1, 3];
        let lps = [ln(0.15), ln(0.5), ln(0.05), ln(0.3)];
        // T = 1, nothing else: the distribution itself, most likely first.
        let d = Dist::sampling(&ids, &lps, &params(1.0, None, 1.0)).unwrap();
        let got: Vec<u32> = d.entries().iter().map(|e| e.0).collect();
        assert_eq!(got, [7, 3, 9, 1]);
        assert!(close(d.prob(9), 0.15) && close(d.prob(4), 0.0));
        // T = 0.5 squares the probabilities before normalising: .25, .09, .0225, .0025.
        let d = Dist::sampling(&ids, &lps, &params(0.5, None, 1.0)).unwrap();
        let z = 0.25 + 0.09 + 0.0225 + 0.0025;
        assert!(close(d.prob(7), 0.25 / z) && close(d.prob(1), 0.0025 / z));
        // top-k 2 keeps 7 and 3: .5/.8, .3/.8.
        let d = Dist::sampling(&ids, &lps, &params(1.0, Some(2), 1.0)).unwrap();
        assert_eq!(d.len(), 2);
        assert!(close(d.prob(7), 0.625) && close(d.prob(3), 0.375));
        // top-p 0.79: 7 (nothing before it) and 3 (.5 before it) are kept; 9 has .8 before it.
        let d = Dist::sampling(&ids, &lps, &params(1.0, None, 0.79)).unwrap();
        assert_eq!(d.len(), 2);
        // top-p 0.81 keeps 9 too.
        assert_eq!(
            Dist::sampling(&ids, &lps, &params(1.0, None, 0.81))
                .unwrap()
                .len(),
            3
        );
        // Top-p acts on the tempered distribution after top-k: with T = 0.5 and top-k 3 the
        // probabilities are .25, .09, .0225 over .3625, so 7 alone is .69 < .7 and 3 joins.
        let d = Dist::sampling(&ids, &lps, &params(0.5, Some(3), 0.7)).unwrap();
        assert_eq!(d.len(), 2);
        let d = Dist::sampling(&ids, &lps, &params(0.5, Some(3), 0.68)).unwrap();
        assert_eq!(d.len(), 1);
        // T = 0: the argmax; a tie goes to the smaller id.
        let d = Dist::sampling(&[5, 2], &[ln(0.5), ln(0.5)], &params(0.0, None, 1.0)).unwrap();
        assert_eq!(d, Dist::point(2));
        // Padding (−∞) is no candidate.
        assert_eq!(
            Dist::sampling(&[u32::MAX], &[f32::NEG_INFINITY], &params(1.0, None, 1.0)),
            None
        );
    }

    #[test]
    fn settings_out_of_range_name_their_flag() {
        for (t, k, p, flag) in [
            (-0.1, None, 1.0, "--temperature"),
            (f64::NAN, None, 1.0, "--temperature"),
            (1.0, Some(0), 1.0, "--top-k"),
            (1.0, None, 0.0, "--top-p"),
            (1.0, None, 1.5, "--top-p"),
        ] {
            let e = SamplingParams::new(t, k, p, DraftSampling::Sampled).unwrap_err();
            assert!(e.0.starts_with(flag), "{e}");
        }
        assert!(SamplingParams::new(0.0, Some(1), 1.0, DraftSampling::Greedy).is_ok());
    }

    #[test]
    fn overlap_residual_and_the_rule_give_back_p() {
        // q = (.5, .3, .2, 0), p = (.4, .4, .1, .1) over ids 1..4.
        let q = Dist::from_weights([(1, 0.5), (2, 0.3), (3, 0.2)]).unwrap();
        let p = Dist::from_weights([(1, 0.4), (2, 0.4), (3, 0.1), (4, 0.1)]).unwrap();
        let alpha = overlap(&p, &q);
        assert!(close(alpha, 0.4 + 0.3 + 0.1));
        let r = residual(&p, &q).unwrap();
        assert!(close(r.prob(2), 0.5) && close(r.prob(4), 0.5) && close(r.prob(1), 0.0));
        // One position of the rule: P(x) = q(x) min(1, p/q) + (1 − α) r(x) = p(x).
        for x in 1..=4 {
            let q_x = q.prob(x);
            let accepted = if q_x > 0.0 {
                q_x * (p.prob(x) / q_x).min(1.0)
            } else {
                0.0
            };
            assert!(
                close(accepted + (1.0 - alpha) * r.prob(x), p.prob(x)),
                "{x}"
            );
        }
        // The test itself: u · q < p.
        assert!(accepts(0.4, 0.5, 0.79) && !accepts(0.4, 0.5, 0.8));
        assert!(accepts(0.4, 0.3, 0.999));
        // Equal distributions: nothing to resample, α = 1.
        assert_eq!(residual(&p, &p), None);
        assert!(close(overlap(&p, &p), 1.0));
        // A greedy draft d: α = p(d).
        assert!(close(overlap(&p, &Dist::point(3)), 0.1));
    }

    #[test]
    fn sampling_by_inverse_cdf() {
        let d = Dist::from_weights([(4, 1.0), (9, 3.0)]).unwrap();
        assert_eq!(d.sample(0.0), 9);
        assert_eq!(d.sample(0.7499), 9);
        assert_eq!(d.sample(0.75), 4);
        assert_eq!(d.sample(0.999_999_999_999), 4);
    }

    #[test]
    fn expected_tokens_and_rounds() {
        // One round: 1 + .5 + .5·.4.
        assert!(close(expected_round_tokens(&[0.5, 0.4]), 1.7));
        assert_eq!(survival(&[0.5, 0.4, 1.0]), [0.5, 0.2, 0.2]);
        let chain = |first, end, f: &dyn Fn(u32) -> Option<Vec<f64>>| {
            expected_chain(first, end, f).unwrap().unwrap()
        };
        // Every α = 1 with γ = 3 from 0 to 8: rounds at 0 and 4 (A = 3 each); the one at 4
        // reaches the end exactly. 8 tokens in 2 rounds.
        let c = chain(0, 8, &|_| Some(vec![1.0; 3]));
        assert_eq!(c.tokens, 8);
        assert!(close(c.rounds, 2.0) && close(c.tau, 4.0));
        // α = 0: one round per token.
        let c = chain(0, 8, &|_| Some(vec![0.0; 3]));
        assert!(close(c.rounds, 8.0) && close(c.tau, 1.0));
        // γ = 1, α = .5, end 2: R = 1 (A = 1 at 0) or 2, each with probability .5: E[R] = 1.5,
        // E[2 / R] = .5 · 2 + .5 · 1 = 1.5, above 2 / E[R] = 1.33 (Jensen).
        let c = chain(0, 2, &|_| Some(vec![0.5]));
        assert!(close(c.rounds, 1.5) && close(c.tau, 1.5), "{c:?}");
        // Blocks cut by the end have fewer valid positions: at 0 (end 3) all three.
        let c = chain(0, 3, &|a| Some(vec![1.0; (3 - a as usize).min(3)]));
        assert!(close(c.rounds, 1.0) && close(c.tau, 3.0));
        // Only anchors visited with positive probability are needed.
        let c = chain(0, 8, &|a| (a == 0 || a == 4).then(|| vec![1.0; 3]));
        assert!(close(c.rounds, 2.0));
        assert_eq!(
            expected_chain(0, 8, |a| (a == 0).then(|| vec![0.5; 3])),
            Err(MissingAnchor(1))
        );
        assert_eq!(expected_chain(5, 5, |_| None), Ok(None));
        // E[R] by brute force over every acceptance pattern: γ = 2, α = (.6, .3) everywhere,
        // 7 tokens.
        let alphas = [0.6, 0.3];
        let s = survival(&alphas);
        let p_a = [1.0 - s[0], s[0] - s[1], s[1]];
        fn walk(a: usize, end: usize, r: usize, p: f64, p_a: &[f64; 3], out: &mut (f64, f64)) {
            if a >= end {
                out.0 += p * r as f64;
                out.1 += p * 7.0 / r as f64;
                return;
            }
            let valid = (end - a).min(2);
            for n in 0..=valid {
                // Past the valid positions the survival is 0: A = valid takes the rest.
                let pn = if n < valid {
                    p_a[n]
                } else {
                    p_a[n..].iter().sum()
                };
                walk(a + n + 1, end, r + 1, p * pn, p_a, out);
            }
        }
        let mut brute = (0.0, 0.0);
        walk(0, 7, 0, 1.0, &p_a, &mut brute);
        let c = chain(0, 7, &|a| Some(alphas[..(7 - a as usize).min(2)].to_vec()));
        assert!(
            close(c.rounds, brute.0) && close(c.tau, brute.1),
            "{c:?} vs {brute:?}"
        );
    }
}
