//! Speculative sampling at T > 0 on the CPU reference, with a tiny random target and a random
//! DFlash drafter (`docs/metrics.md` §7, `crates/engine/src/drafter/sampling.rs`):
//!
//! 1. **Lossless in distribution.** For one prompt, the tokens at generated positions 1..3 from
//!    speculative sampling over many seeds are tested against the target's exact marginals
//!    (enumerated: every continuation weighted by its probability, so the reference carries no
//!    sampling noise) with a chi-square goodness-of-fit test at level [`LEVEL`] per position.
//!    Plain sampling from the target passes the same test (the test's calibration).
//! 2. **The test has power.** Two wrong rules — the rejected token drawn from p instead of
//!    norm(max(0, p − q)), and the ratio inverted (accept with min(1, q/p)) — are plugged into
//!    the same loop; their exact position-1 marginal gives the test's power (noncentral
//!    chi-square), and the sampled run must fail the test.
//! 3. **Live τ = the replayed expectation.** Over [`PROMPTS`] prompts at T = 1, live τ agrees
//!    with the native metric `tau_sampled_replayed` (`crates/results/src/metrics/sampled.rs`),
//!    computed exactly from the p and q of records along a sampled continuation, as
//!    `run --temperature` stores them: per prompt (macro) and in rounds (pooled), paired over
//!    prompts, within 99% intervals.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::drafter::eval::{
    evaluate_sequence, AnchorPolicy, Drafter, EvalOptions, Labels, Sequence,
};
use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
use draftlens_engine::drafter::sampling::SampledEval;
use draftlens_engine::drafter::sampling::{
    live_decode_sampled, live_decode_sampled_with, sample_decode, Rule, SamplingRng,
};
use draftlens_engine::drafter::DFlashDrafter;
use draftlens_engine::model::random::{qwen3_8b_spec, RandomWeights};
use draftlens_engine::model::{Capture, ModelSpec, TargetModel};
use draftlens_records::sampling::{accepts, residual, Dist, DraftSampling, SamplingParams};
use draftlens_records::RecordBatch;
use draftlens_results::metrics::{sampled_rows, PromptInfo};
use draftlens_results::store::MetricScope;

/// Significance level of each chi-square test.
const LEVEL: f64 = 1e-3;
const VOCAB: usize = 16;
const PROMPT: [u32; 6] = [3, 11, 7, 2, 14, 5];

struct Setup {
    be: CpuBackend,
    target: TargetModel<CpuBackend>,
    /// `Drafter::DFlash`, for the per-anchor evaluation; [`Setup::dflash`] borrows it.
    drafter: Drafter<CpuBackend>,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// The lossless test's models: [`Setup::with`] matrices of std 0.25 and B = 3 (γ = 2, so a
    /// round's bonus token is generated position 3).
    fn new() -> Setup {
        Setup::with(0.25, 3)
    }

    /// A 2-layer target of vocabulary [`VOCAB`] whose matrices have std `init` (smaller: flatter
    /// distributions, more drafts accepted) and a 1-layer random DFlash drafter of block size
    /// `block_size`.
    fn with(init: f32, block_size: usize) -> Setup {
        let spec = ModelSpec {
            vocab_size: VOCAB,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            max_position_embeddings: 256,
            ..qwen3_8b_spec()
        };
        let be = CpuBackend::new();
        let weights = RandomWeights::new(&spec, 5).with_init(init, 0.5);
        let target = TargetModel::load(&be, &spec, &weights).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = RandomDrafter {
            layers: 1,
            block_size,
            target_layer_ids: vec![0, 1],
            intermediate_size: 48,
            mask_token_id: (VOCAB - 1) as u32,
            sliding_layers: 0,
            sliding_window: 0,
            seed: 9,
        };
        write_random_checkpoint(dir.path(), &spec, &r).unwrap();
        let d = DFlashDrafter::load(&be, dir.path(), spec.hidden_size).unwrap();
        Setup {
            be,
            target,
            drafter: Drafter::DFlash(d),
            _dir: dir,
        }
    }

    fn dflash(&self) -> &DFlashDrafter<CpuBackend> {
        match &self.drafter {
            Drafter::DFlash(d) => d,
            _ => unreachable!(),
        }
    }

    /// The target's transformed next-token distribution after `context`.
    fn next(&self, context: &[u32], params: &SamplingParams) -> Dist {
        let out = self
            .target
            .forward(
                &self.be,
                context,
                &mut self.target.new_cache(),
                &Capture::none(),
            )
            .unwrap();
        let n = context.len();
        let last = self.be.slice_rows(&out.last_hidden, n - 1, n).unwrap();
        let top = self.target.logits_topk(&self.be, &last, VOCAB).unwrap();
        Dist::sampling(top.row_ids(0), top.row_logprobs(0), params).unwrap()
    }

    /// The drafter's first-round distribution at drafted position 1 after the prompt and its
    /// first generated token `y0` (what the rule compares p_1 with).
    fn first_draft(&self, y0: u32, params: &SamplingParams) -> Dist {
        let d = self.dflash();
        let capture =
            Capture::for_layer_ids(&d.cfg.target_layer_ids, self.target.spec.num_layers).unwrap();
        let out = self
            .target
            .forward(&self.be, &PROMPT, &mut self.target.new_cache(), &capture)
            .unwrap();
        let taps: Vec<Vec<f32>> = d
            .cfg
            .target_layer_ids
            .iter()
            .map(|i| self.be.to_host(out.captured.get(i + 1).unwrap()).unwrap())
            .collect();
        let taps: Vec<&[f32]> = taps.iter().map(|t| t.as_slice()).collect();
        let ctx = d.context(&self.be, &taps, 32).unwrap();
        let top = d
            .draft(
                &self.be,
                &self.target,
                &ctx,
                &[PROMPT.len()],
                &[y0],
                draftlens_engine::drafter::DraftOptions {
                    ctx_inclusive: false,
                    top_k: VOCAB,
                },
            )
            .unwrap();
        Dist::draft(top.row_ids(0), top.row_logprobs(0), params).unwrap()
    }

    /// Exact marginals of generated positions 0..=depth after [`PROMPT`] under plain sampling:
    /// every continuation enumerated with its probability.
    fn exact_marginals(&self, params: &SamplingParams, depth: usize) -> Vec<Vec<f64>> {
        let mut marg = vec![vec![0.0; VOCAB]; depth + 1];
        let mut ctx = PROMPT.to_vec();
        self.enumerate(&mut ctx, 1.0, 0, depth, params, &mut marg);
        marg
    }

    fn enumerate(
        &self,
        ctx: &mut Vec<u32>,
        prob: f64,
        j: usize,
        depth: usize,
        params: &SamplingParams,
        marg: &mut [Vec<f64>],
    ) {
        let next = self.next(ctx, params);
        for &(x, px) in next.entries() {
            marg[j][x as usize] += prob * px;
            if j < depth {
                ctx.push(x);
                self.enumerate(ctx, prob * px, j + 1, depth, params, marg);
                ctx.pop();
            }
        }
    }
}

/// Counts of the token at generated positions 0..=depth over `n` outputs of `generate(seed)`.
fn tally(n: u64, depth: usize, mut generate: impl FnMut(u64) -> Vec<u32>) -> Vec<Vec<u64>> {
    let mut counts = vec![vec![0u64; VOCAB]; depth + 1];
    for seed in 0..n {
        let ids = generate(seed);
        assert_eq!(ids.len(), depth + 1, "seed {seed}: {ids:?}");
        for (j, &x) in ids.iter().enumerate() {
            counts[j][x as usize] += 1;
        }
    }
    counts
}

// ---------------------------------------------------------------------------------------------
// Chi-square machinery: cells, the regularised incomplete gamma function, power.
// ---------------------------------------------------------------------------------------------

/// Cells of a goodness-of-fit test over `n` draws from `probs`: categories with an expected count
/// of at least 5 stay alone, the others are pooled into one cell (itself folded into the smallest
/// cell when it would expect fewer than 5). Returns the cell of each category and the cell count.
fn cells(probs: &[f64], n: u64) -> (Vec<Option<usize>>, usize) {
    let expected = |p: f64| p * n as f64;
    let mut cell = vec![None; probs.len()];
    let mut next = 0;
    for (c, &p) in probs.iter().enumerate() {
        if expected(p) >= 5.0 {
            cell[c] = Some(next);
            next += 1;
        }
    }
    let rest: f64 = probs
        .iter()
        .zip(&cell)
        .filter(|(_, c)| c.is_none())
        .map(|(&p, _)| p)
        .sum();
    let pooled = if rest == 0.0 {
        None
    } else if expected(rest) >= 5.0 || next == 0 {
        next += 1;
        Some(next - 1)
    } else {
        // The smallest kept cell.
        (0..probs.len())
            .filter(|&c| cell[c].is_some())
            .min_by(|&a, &b| probs[a].total_cmp(&probs[b]))
            .and_then(|c| cell[c])
    };
    for c in &mut cell {
        if c.is_none() {
            *c = pooled;
        }
    }
    (cell, next)
}

/// Pearson's statistic of `counts` against `probs` on [`cells`], and its degrees of freedom.
/// A category of probability 0 that was drawn is an outright failure (infinite statistic).
fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    if counts.iter().zip(probs).any(|(&c, &p)| c > 0 && p == 0.0) {
        return (f64::INFINITY, 1);
    }
    let (cell, k) = cells(probs, n);
    let (mut obs, mut exp) = (vec![0.0; k], vec![0.0; k]);
    for c in 0..probs.len() {
        if let Some(i) = cell[c] {
            obs[i] += counts[c] as f64;
            exp[i] += probs[c] * n as f64;
        }
    }
    let stat = obs
        .iter()
        .zip(&exp)
        .map(|(o, e)| (o - e) * (o - e) / e)
        .sum();
    (stat, k.saturating_sub(1).max(1))
}

/// ln Γ(x), Lanczos (g = 7, 9 terms; ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let t = x + 7.5;
    let s: f64 = C[0] + (1..9).map(|i| C[i] / (x + i as f64)).sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}

/// Q(a, x) = Γ(a, x) / Γ(a): the series below a + 1, the continued fraction above
/// (Numerical Recipes §6.2).
fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * front
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let (mut c, mut d) = (1.0 / tiny, 1.0 / b);
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            d = if d.abs() < tiny { tiny } else { d };
            c = b + an / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        front * h
    }
}

/// P(χ²_df > stat).
fn p_value(stat: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, stat / 2.0)
}

/// The χ²_df quantile at 1 − `level` (bisection).
fn critical(df: usize, level: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 1e4);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if p_value(mid, df) > level {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// Power of the level-`level` test with `n` draws when the draws follow `actual` while the test
/// expects `probs`: P(χ'²_df(λ) > critical), λ = n Σ_cells (actual − probs)² / probs, the
/// noncentral chi-square as a Poisson(λ/2) mixture of central ones.
fn power(probs: &[f64], actual: &[f64], n: u64, level: f64) -> f64 {
    let (cell, k) = cells(probs, n);
    let (mut a, mut e) = (vec![0.0; k], vec![0.0; k]);
    for c in 0..probs.len() {
        if let Some(i) = cell[c] {
            a[i] += actual[c];
            e[i] += probs[c];
        }
    }
    let lambda: f64 = n as f64
        * a.iter()
            .zip(&e)
            .map(|(a, e)| (a - e) * (a - e) / e)
            .sum::<f64>();
    let df = k - 1;
    let crit = critical(df, level);
    let half = lambda / 2.0;
    let mut total = 0.0;
    for j in 0..(half + 20.0 * half.sqrt() + 100.0) as usize {
        let ln_w = -half + j as f64 * half.max(1e-300).ln() - ln_gamma(j as f64 + 1.0);
        total += ln_w.exp() * gamma_q((df + 2 * j) as f64 / 2.0, crit / 2.0);
    }
    total.min(1.0)
}

// ---------------------------------------------------------------------------------------------
// Rules: the standard one and two wrong ones.
// ---------------------------------------------------------------------------------------------

fn residual_from_p(p: &Dist, _q: &Dist) -> Option<Dist> {
    Some(p.clone())
}

fn accepts_inverted(p_x: f64, q_x: f64, u: f64) -> bool {
    u * p_x < q_x
}

/// The rejected token drawn from p instead of the residual.
const RESIDUAL_FROM_P: Rule = Rule {
    accepts,
    residual: residual_from_p,
};
/// Accepted with probability min(1, q/p).
const INVERTED_RATIO: Rule = Rule {
    accepts: accepts_inverted,
    residual,
};

/// The exact distribution of one verified position's token under `rule` when the draft is drawn
/// from `q` and the target's is `p`: Σ_x q(x) P(accept x) δ_x + P(reject) · the rule's residual.
fn one_position(p: &Dist, q: &Dist, rule: &Rule) -> Vec<f64> {
    // P(accept x) = P(u < t) for the threshold t at which the rule's test flips.
    let accept_prob = |x: u32| {
        let (px, qx) = (p.prob(x), q.prob(x));
        // Bisection on u: every rule here accepts exactly for u below a threshold.
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        if (rule.accepts)(px, qx, 1.0 - 1e-15) {
            return 1.0;
        }
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if (rule.accepts)(px, qx, mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let mut out = vec![0.0; VOCAB];
    let mut accepted = 0.0;
    for &(x, qx) in q.entries() {
        let a = qx * accept_prob(x);
        out[x as usize] += a;
        accepted += a;
    }
    if let Some(r) = (rule.residual)(p, q) {
        for &(x, rx) in r.entries() {
            out[x as usize] += (1.0 - accepted) * rx;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// Depth of the tested positions: 0 (the prefill's token), 1 and 2 (drafted positions of the
/// first round) and 3 (its bonus when both drafts are accepted).
const DEPTH: usize = 3;

fn speculative(s: &Setup, params: &SamplingParams, rule: &Rule, seed: u64) -> Vec<u32> {
    let mut rng = SamplingRng::for_prompt(seed, 0);
    live_decode_sampled_with(
        &s.be,
        &s.target,
        s.dflash(),
        &PROMPT,
        DEPTH + 1,
        &[],
        params,
        &mut rng,
        rule,
    )
    .unwrap()
    .ids
}

/// Chi-square p-values of positions 1..=DEPTH of `counts` against `exact`.
fn p_values(counts: &[Vec<u64>], exact: &[Vec<f64>]) -> Vec<f64> {
    (1..=DEPTH)
        .map(|j| {
            let (stat, df) = chi_square(&counts[j], &exact[j]);
            p_value(stat, df)
        })
        .collect()
}

#[test]
fn speculative_sampling_is_lossless_and_the_test_catches_wrong_rules() {
    let s = Setup::new();
    let configs = [
        (
            "T=1, sampled drafts",
            SamplingParams::new(1.0, None, 1.0, DraftSampling::Sampled).unwrap(),
            6000u64,
        ),
        (
            "T=0.7 top-k=6 top-p=0.9, sampled drafts",
            SamplingParams::new(0.7, Some(6), 0.9, DraftSampling::Sampled).unwrap(),
            3000,
        ),
        (
            "T=1, greedy drafts",
            SamplingParams::new(1.0, None, 1.0, DraftSampling::Greedy).unwrap(),
            3000,
        ),
    ];
    for (name, params, n) in &configs {
        let t = std::time::Instant::now();
        let exact = s.exact_marginals(params, DEPTH);
        let spec = tally(*n, DEPTH, |seed| {
            speculative(&s, params, &Rule::STANDARD, seed)
        });
        let ps = p_values(&spec, &exact);
        eprintln!(
            "{name}: {n} seeds, p-values of positions 1..={DEPTH}: {ps:.4?} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        assert!(
            ps.iter().all(|&p| p > LEVEL),
            "{name}: speculative sampling departs from the target's distribution: {ps:?}"
        );
    }

    // Calibration: plain sampling from the target passes the same test.
    let (_, params, n) = &configs[0];
    let exact = s.exact_marginals(params, DEPTH);
    let plain = tally(*n / 2, DEPTH, |seed| {
        let mut rng = SamplingRng::for_prompt(seed, 0);
        sample_decode(&s.be, &s.target, &PROMPT, DEPTH + 1, &[], params, &mut rng).unwrap()
    });
    let ps = p_values(&plain, &exact);
    eprintln!("plain sampling: p-values {ps:.4?}");
    assert!(ps.iter().all(|&p| p > LEVEL), "{ps:?}");

    // Power: the exact position-1 marginal under each wrong rule (over the prefill's token y0),
    // the test's power against it, and the sampled run failing.
    let p0 = s.next(&PROMPT, params);
    for (name, rule, n_wrong) in [
        ("rejected token from p", RESIDUAL_FROM_P, 2000u64),
        ("ratio inverted", INVERTED_RATIO, 2000),
    ] {
        let (mut standard, mut wrong) = (vec![0.0; VOCAB], vec![0.0; VOCAB]);
        for &(y0, w) in p0.entries() {
            let mut ctx = PROMPT.to_vec();
            ctx.push(y0);
            let p1 = s.next(&ctx, params);
            let q1 = s.first_draft(y0, params);
            for (acc, rule) in [(&mut standard, &Rule::STANDARD), (&mut wrong, &rule)] {
                for (a, o) in acc.iter_mut().zip(one_position(&p1, &q1, rule)) {
                    *a += w * o;
                }
            }
        }
        // The standard rule's exact marginal is the target's (the identity the loop relies on).
        let tv: f64 = standard
            .iter()
            .zip(&exact[1])
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < 1e-9, "standard rule: TV {tv} from the target");
        let tv_wrong: f64 = wrong
            .iter()
            .zip(&exact[1])
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>()
            / 2.0;
        let pw = power(&exact[1], &wrong, n_wrong, LEVEL);
        let counts = tally(n_wrong, DEPTH, |seed| speculative(&s, params, &rule, seed));
        let ps = p_values(&counts, &exact);
        eprintln!(
            "wrong rule ({name}): position-1 TV from the target {tv_wrong:.4}, power at {n_wrong} seeds and \
             level {LEVEL}: {pw:.6}; p-values {ps:.3?}"
        );
        assert!(pw > 0.99, "{name}: power {pw}");
        assert!(
            ps[0] < LEVEL,
            "{name}: the test did not catch the wrong rule: {ps:?}"
        );
    }
}

/// Mean of `xs` and the half-width of its two-sided 99% t-interval (t₀.₉₉₅ at n − 1 ≥ 100
/// degrees of freedom is at most 2.63).
fn mean_and_half_width(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    assert!(n > 100.0);
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, 2.63 * (var / n).sqrt())
}

/// Prompts of the agreement test.
const PROMPTS: u32 = 300;
/// Tokens generated per prompt (the first one is the prefill's, not a round's).
const MAX_NEW: usize = 40;

#[test]
fn live_tau_at_t1_agrees_with_the_replayed_expectation() {
    // A target with flatter distributions than the lossless test's and B = 4, so that rounds
    // accept more than one draft (τ ≈ 2.4) and the chain's expectation has something to do.
    let s = Setup::with(0.1, 4);
    let d = s.dflash();
    let capture =
        Capture::for_layer_ids(&d.cfg.target_layer_ids, s.target.spec.num_layers).unwrap();
    // T = 1 over the whole vocabulary: for live decoding no top-k; for the metric top-k = V,
    // the same transform, which the stored top-V candidates give exactly.
    let live_params = SamplingParams::new(1.0, None, 1.0, DraftSampling::Sampled).unwrap();
    let run = SampledEval {
        params: SamplingParams {
            top_k: Some(VOCAB as u32),
            ..live_params
        },
        seed: 2,
    };
    let opts = EvalOptions {
        top_k: VOCAB,
        anchors: AnchorPolicy::Every,
        sampling: Some(run),
        ..EvalOptions::default()
    };
    run.check(&opts).unwrap();

    let mut prompt_rng = SamplingRng::for_prompt(99, 0);
    let (mut live_tau, mut live_rounds) = (Vec::new(), Vec::new());
    let mut all = RecordBatch::new(4, VOCAB as u32);
    all.target_ids = Some(vec![]);
    all.target_logprobs = Some(vec![]);
    let mut infos = Vec::new();
    for i in 0..PROMPTS {
        let len = 4 + (prompt_rng.uniform() * 6.0) as usize;
        let prompt: Vec<u32> = (0..len)
            .map(|_| (prompt_rng.uniform() * (VOCAB - 1) as f64) as u32)
            .collect();
        // The prompt's "sha256": its stream id is the index.
        let sha = format!("{i:016x}{}", "0".repeat(48));
        let mut rng = SamplingRng::for_prompt(1, i as u64);
        let live = live_decode_sampled(
            &s.be,
            &s.target,
            d,
            &prompt,
            MAX_NEW,
            &[],
            &live_params,
            &mut rng,
        )
        .unwrap();
        live_tau.push(live.tau());
        live_rounds.push(live.round_tokens.len() as f64);

        // What `run --temperature 1` stores for the prompt: records along a continuation drawn
        // from the target on another stream, every completion anchor drafted.
        let cont = run
            .continuation(&s.be, &s.target, &prompt, MAX_NEW, &[], &sha)
            .unwrap();
        let mut ids = prompt.clone();
        ids.extend(&cont);
        let out = s
            .target
            .forward(&s.be, &ids, &mut s.target.new_cache(), &capture)
            .unwrap();
        let topk = s
            .target
            .logits_topk(&s.be, &out.last_hidden, VOCAB)
            .unwrap();
        let taps: Vec<Vec<f32>> = d
            .cfg
            .target_layer_ids
            .iter()
            .map(|l| s.be.to_host(out.captured.get(l + 1).unwrap()).unwrap())
            .collect();
        let taps: Vec<&[f32]> = taps.iter().map(|t| t.as_slice()).collect();
        let mut seq = Sequence::new(i, &ids, prompt.len(), &topk, Labels::Target);
        seq.ctx = Some(d.context(&s.be, &taps, 32).unwrap());
        all.extend(&evaluate_sequence(&s.be, (&s.target).into(), &s.drafter, &seq, &opts).unwrap());
        infos.push(PromptInfo {
            index: i,
            prompt_len: prompt.len(),
            seq_len: ids.len(),
            category: None,
        });
    }

    // The native metric over those records.
    let rows = sampled_rows(&all, &infos, &run.params);
    let metric = |name: &str, scope: &MetricScope| {
        rows.iter()
            .find(|r| r.name == name && &r.scope == scope)
            .unwrap_or_else(|| panic!("no {name} at {scope}"))
            .value
    };
    let expected_tau: Vec<f64> = (0..PROMPTS)
        .map(|i| metric("tau_sampled_replayed", &MetricScope::Prompt(i)))
        .collect();
    let tokens = (MAX_NEW - 1) as f64;
    let expected_rounds: Vec<f64> = expected_tau.iter().map(|t| tokens / t).collect();

    // Macro: per prompt, live τ against E[tokens / rounds]; paired over prompts.
    let diffs: Vec<f64> = live_tau
        .iter()
        .zip(&expected_tau)
        .map(|(l, e)| l - e)
        .collect();
    let (gap, half) = mean_and_half_width(&diffs);
    let (live_macro, _) = mean_and_half_width(&live_tau);
    let expected_macro = metric("tau_sampled_replayed_macro", &MetricScope::Run);
    // Pooled: Σ tokens / Σ rounds; its difference rests on the rounds' paired difference.
    let round_diffs: Vec<f64> = live_rounds
        .iter()
        .zip(&expected_rounds)
        .map(|(l, e)| l - e)
        .collect();
    let (round_gap, round_half) = mean_and_half_width(&round_diffs);
    let live_pooled = tokens * PROMPTS as f64 / live_rounds.iter().sum::<f64>();
    let expected_pooled = metric("tau_sampled_replayed_pooled", &MetricScope::Run);
    eprintln!(
        "{PROMPTS} prompts, T = 1: live τ macro {live_macro:.4} vs expected {expected_macro:.4} (paired gap \
         {gap:+.4} ± {half:.4}, 99%); pooled {live_pooled:.4} vs {expected_pooled:.4} (rounds per prompt \
         {round_gap:+.3} ± {round_half:.3})"
    );
    assert!(
        expected_macro > 1.5,
        "too few drafts accepted for the comparison to mean much: {expected_macro}"
    );
    assert!(
        gap.abs() < half,
        "macro τ: live − expected = {gap} ± {half}"
    );
    assert!(
        round_gap.abs() < round_half,
        "rounds: live − expected = {round_gap} ± {round_half}"
    );
}
