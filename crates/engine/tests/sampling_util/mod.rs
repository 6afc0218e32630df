//! The statistics of the speculative-sampling tests (shared by tests/speculative_sampling.rs for
//! DFlash and the other families' T > 0 tests in tests/{mtp,dflash2}/main.rs and
//! tests/eagle3_sampling.rs): a chi-square goodness-of-fit test of sampled tokens against exact
//! marginals (cells, p-values, the power against a known alternative), two wrong acceptance
//! rules that the test must catch, and the exact one-position distribution a rule gives.
#![allow(dead_code)]

use draftlens_engine::drafter::sampling::Rule;
use draftlens_records::sampling::{accepts, residual, Dist};

/// Significance level of each chi-square test.
pub const LEVEL: f64 = 1e-3;

/// Counts of the token at generated positions 0..=depth over `n` outputs of `generate(seed)`
/// (token ids below `vocab`).
pub fn tally(
    n: u64,
    depth: usize,
    vocab: usize,
    mut generate: impl FnMut(u64) -> Vec<u32>,
) -> Vec<Vec<u64>> {
    let mut counts = vec![vec![0u64; vocab]; depth + 1];
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
pub fn cells(probs: &[f64], n: u64) -> (Vec<Option<usize>>, usize) {
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
pub fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize) {
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
pub fn ln_gamma(x: f64) -> f64 {
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
pub fn gamma_q(a: f64, x: f64) -> f64 {
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
pub fn p_value(stat: f64, df: usize) -> f64 {
    // An infinite statistic (a token of probability 0 was drawn) is an outright failure; the
    // series would give NaN.
    if stat.is_infinite() {
        return 0.0;
    }
    gamma_q(df as f64 / 2.0, stat / 2.0)
}

/// The χ²_df quantile at 1 − `level` (bisection).
pub fn critical(df: usize, level: f64) -> f64 {
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
pub fn power(probs: &[f64], actual: &[f64], n: u64, level: f64) -> f64 {
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

pub fn residual_from_p(p: &Dist, _q: &Dist) -> Option<Dist> {
    Some(p.clone())
}

pub fn accepts_inverted(p_x: f64, q_x: f64, u: f64) -> bool {
    u * p_x < q_x
}

/// The rejected token drawn from p instead of the residual.
pub const RESIDUAL_FROM_P: Rule = Rule {
    accepts,
    residual: residual_from_p,
};
/// Accepted with probability min(1, q/p).
pub const INVERTED_RATIO: Rule = Rule {
    accepts: accepts_inverted,
    residual,
};

/// The exact distribution of one verified position's token under `rule` when the draft is drawn
/// from `q` and the target's is `p`: Σ_x q(x) P(accept x) δ_x + P(reject) · the rule's residual.
pub fn one_position(p: &Dist, q: &Dist, rule: &Rule, vocab: usize) -> Vec<f64> {
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
    let mut out = vec![0.0; vocab];
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

/// Chi-square p-values of positions 1..=depth of `counts` against `exact`.
pub fn p_values(counts: &[Vec<u64>], exact: &[Vec<f64>], depth: usize) -> Vec<f64> {
    (1..=depth)
        .map(|j| {
            let (stat, df) = chi_square(&counts[j], &exact[j]);
            p_value(stat, df)
        })
        .collect()
}

/// Mean of `xs` and the half-width of its two-sided 99% t-interval (t₀.₉₉₅ at n − 1 ≥ 100
/// degrees of freedom is at most 2.63).
pub fn mean_and_half_width(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    assert!(n > 100.0);
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, 2.63 * (var / n).sqrt())
}

// ---------------------------------------------------------------------------------------------
// One harness for every drafter family: the losslessness test with its power, and live τ at T = 1
// against the replayed expectation.
// ---------------------------------------------------------------------------------------------

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::drafter::eval::{
    evaluate_sequence, AnchorPolicy, DraftTarget, Drafter, EvalOptions, Labels, Sequence,
};
use draftlens_engine::drafter::live::LiveDrafter;
use draftlens_engine::drafter::sampling::{
    live_decode_sampled, live_decode_sampled_with, SampledEval, SamplingRng,
};
use draftlens_engine::drafter::DraftOptions;
use draftlens_engine::model::transformer::ForwardOutput;
use draftlens_engine::model::{Capture, TargetModel};
use draftlens_records::sampling::{DraftSampling, SamplingParams};
use draftlens_records::RecordBatch;
use draftlens_results::metrics::{sampled_rows, PromptInfo};
use draftlens_results::store::MetricScope;

type Cpu = CpuBackend;

/// The target's transformed next-token distribution after `context`, from its best `top_k`
/// candidates (every token without a top-k).
pub fn target_next(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    context: &[u32],
    params: &SamplingParams,
) -> Dist {
    let k = params.top_k.map_or(target.spec.vocab_size, |k| k as usize);
    let out = target
        .forward(be, context, &mut target.new_cache(), &Capture::none())
        .unwrap();
    let n = context.len();
    let last = be.slice_rows(&out.last_hidden, n - 1, n).unwrap();
    let top = target.logits_topk(be, &last, k).unwrap();
    Dist::sampling(top.row_ids(0), top.row_logprobs(0), params).unwrap()
}

/// Exact marginals of generated positions 0..=depth after `prompt` under plain sampling: every
/// continuation enumerated with its probability (finite with a top-k).
pub fn exact_marginals(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    prompt: &[u32],
    params: &SamplingParams,
    depth: usize,
) -> Vec<Vec<f64>> {
    fn walk(
        be: &Cpu,
        target: &TargetModel<Cpu>,
        ctx: &mut Vec<u32>,
        prob: f64,
        j: usize,
        depth: usize,
        params: &SamplingParams,
        marg: &mut [Vec<f64>],
    ) {
        let next = target_next(be, target, ctx, params);
        for &(x, px) in next.entries() {
            marg[j][x as usize] += prob * px;
            if j < depth {
                ctx.push(x);
                walk(be, target, ctx, prob * px, j + 1, depth, params, marg);
                ctx.pop();
            }
        }
    }
    let mut marg = vec![vec![0.0; target.spec.vocab_size]; depth + 1];
    walk(
        be,
        target,
        &mut prompt.to_vec(),
        1.0,
        0,
        depth,
        params,
        &mut marg,
    );
    marg
}

/// The target pass over `ids` with the drafter's taps captured, and those taps (the drafter's
/// order).
fn tapped(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    drafter: &Drafter<Cpu>,
    ids: &[u32],
) -> (ForwardOutput<Cpu>, Vec<usize>) {
    let layers = LiveDrafter::from(drafter).tap_layer_ids(&target.spec);
    let capture = Capture::for_layer_ids(&layers, target.spec.num_layers).unwrap();
    let out = target
        .forward(be, ids, &mut target.new_cache(), &capture)
        .unwrap();
    (out, capture.indices.clone())
}

/// `seq` given the drafter family's context over the target pass `out` of `seq.ids` (as `run`
/// builds it).
fn with_context<'a>(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    drafter: &Drafter<Cpu>,
    out: &ForwardOutput<Cpu>,
    indices: &[usize],
    mut seq: Sequence<'a, Cpu>,
) -> Sequence<'a, Cpu> {
    let taps: Vec<&<Cpu as Backend>::Tensor> = indices
        .iter()
        .map(|&i| out.captured.get(i).unwrap())
        .collect();
    let ids = seq.ids;
    match drafter {
        Drafter::DFlash(d) => seq.ctx = Some(d.context_from_tensors(be, &taps).unwrap()),
        Drafter::DFlash2(d) => seq.ctx = Some(d.backbone.context_from_tensors(be, &taps).unwrap()),
        Drafter::Eagle3(d) => {
            seq.eagle3 = d
                .context_from_tensors(be, Some(target), &taps, ids)
                .unwrap()
        }
        Drafter::Mtp(d) => seq.mtp = d.context_from_tensor(be, target, taps[0], ids).unwrap(),
        Drafter::Oracle { .. } | Drafter::AntiOracle { .. } => {}
    }
    seq
}

/// The distribution the drafter draws drafted position 1 of the first round from, after
/// `prompt` and the prefill's token `y0` (what the rule compares with p_1): DFlash's and the
/// chains' step-1 q under `params`; DFlash2's selector softmax at temperature T only (the
/// authors' q, docs/dflash2.md §4).
pub fn first_draft_q(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    drafter: &Drafter<Cpu>,
    prompt: &[u32],
    y0: u32,
    params: &SamplingParams,
) -> Dist {
    let a = prompt.len();
    let mut ids = prompt.to_vec();
    ids.push(y0);
    let vocab = target.spec.vocab_size;
    let k = match params.draft {
        DraftSampling::Sampled => params.top_k.map_or(vocab, |k| k as usize),
        DraftSampling::Greedy => 1,
    };
    let (out, indices) = tapped(be, target, drafter, &ids);
    let slice_taps = |rows: usize| -> Vec<<Cpu as Backend>::Tensor> {
        indices
            .iter()
            .map(|&i| {
                be.slice_rows(out.captured.get(i).unwrap(), 0, rows)
                    .unwrap()
            })
            .collect()
    };
    let row0 = |top: draftlens_engine::backend::TopK, p: &SamplingParams| {
        Dist::draft(top.row_ids(0), top.row_logprobs(0), p).unwrap()
    };
    match drafter {
        Drafter::DFlash(d) => {
            let taps = slice_taps(a);
            let ctx = d
                .context_from_tensors(be, &taps.iter().collect::<Vec<_>>())
                .unwrap();
            let opts = DraftOptions {
                ctx_inclusive: false,
                top_k: k,
            };
            row0(
                d.draft(be, target, &ctx, &[a], &[y0], opts).unwrap(),
                params,
            )
        }
        Drafter::DFlash2(d) => {
            let taps = slice_taps(a);
            let ctx = d
                .backbone
                .context_from_tensors(be, &taps.iter().collect::<Vec<_>>())
                .unwrap();
            let opts = DraftOptions {
                ctx_inclusive: false,
                top_k: d.cfg.selector_top_k,
            };
            let only_t = SamplingParams {
                top_k: None,
                top_p: 1.0,
                ..*params
            };
            row0(
                d.draft(be, target, &ctx, &[a], &[y0], opts).unwrap(),
                &only_t,
            )
        }
        Drafter::Eagle3(_) | Drafter::Mtp(_) => {
            let seq_topk = draftlens_engine::backend::TopK {
                rows: ids.len(),
                k: 1,
                ids: vec![0; ids.len()],
                logprobs: vec![0.0; ids.len()],
            };
            let seq = Sequence::new(0, &ids, a, &seq_topk, Labels::Target);
            let seq = with_context(be, target, drafter, &out, &indices, seq);
            let top = match drafter {
                Drafter::Eagle3(d) => {
                    let k = k.min(d.vocab.target_of.len());
                    d.draft(be, Some(target), seq.eagle3.as_ref().unwrap(), &[a], k)
                }
                Drafter::Mtp(d) => d.draft(be, target, seq.mtp.as_ref().unwrap(), &[a], k),
                _ => unreachable!(),
            };
            row0(top.unwrap(), params)
        }
        Drafter::Oracle { .. } | Drafter::AntiOracle { .. } => panic!("no q"),
    }
}

/// Generated positions tested: 0 (the prefill's token), 1 and 2 (drafted in the first round)
/// and 3 (the first round's third token: a draft, a residual draw or a bonus).
pub const DEPTH: usize = 3;

/// The first DEPTH + 1 tokens of speculative sampling after `prompt` under `rule`, seed `seed`.
pub fn speculative(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    drafter: &Drafter<Cpu>,
    prompt: &[u32],
    params: &SamplingParams,
    rule: &Rule,
    seed: u64,
) -> Vec<u32> {
    let mut rng = SamplingRng::for_prompt(seed, 0);
    live_decode_sampled_with(
        be,
        target,
        drafter,
        prompt,
        DEPTH + 1,
        &[],
        params,
        &mut rng,
        rule,
    )
    .unwrap()
    .ids
}

/// Total-variation distance between two distributions over the same ids.
fn tv(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
}

/// Speculative sampling with `drafter` after `prompt` is tested against the target's exact
/// marginals, per config (`(name, params, seeds)`), by the chi-square test of positions
/// 1..=DEPTH at [`LEVEL`]; each config must see drafts both accepted and rejected. Then, on the
/// first config, the two wrong rules: the exact position-1 marginal each gives (from p_1 and the
/// drafter's q_1, over the prefill's token), the test's power against it with `wrong_seeds`
/// seeds, and a sampled run with the rule, which must fail the test. Prints a line per check.
pub fn check_lossless(
    label: &str,
    be: &Cpu,
    target: &TargetModel<Cpu>,
    drafter: &Drafter<Cpu>,
    prompt: &[u32],
    configs: &[(&str, SamplingParams, u64)],
    wrong_seeds: u64,
) {
    let vocab = target.spec.vocab_size;
    let mut first_exact = None;
    for (name, params, n) in configs {
        let t = std::time::Instant::now();
        let exact = exact_marginals(be, target, prompt, params, DEPTH);
        let (mut drafted, mut accepted) = (0u64, 0u64);
        let counts = tally(*n, DEPTH, vocab, |seed| {
            let mut rng = SamplingRng::for_prompt(seed, 0);
            let live = live_decode_sampled(
                be,
                target,
                drafter,
                prompt,
                DEPTH + 1,
                &[],
                params,
                &mut rng,
            )
            .unwrap();
            drafted += live.drafts.len() as u64;
            accepted += live.accepted.iter().map(|&a| a as u64).sum::<u64>();
            live.ids
        });
        let ps = p_values(&counts, &exact, DEPTH);
        eprintln!(
            "{label} {name}: {n} seeds, p-values of positions 1..={DEPTH}: {ps:.4?}, drafts accepted {accepted}/{drafted} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        assert!(
            ps.iter().all(|&p| p > LEVEL),
            "{label} {name}: speculative sampling departs from the target's distribution: {ps:?}"
        );
        assert!(
            accepted > 0 && accepted < drafted,
            "{label} {name}: the test needs accepted and rejected drafts ({accepted}/{drafted})"
        );
        first_exact.get_or_insert(exact);
    }
    let exact = first_exact.expect("at least one config");
    let (_, params, _) = &configs[0];
    let p0 = target_next(be, target, prompt, params);
    for (name, rule) in [
        ("rejected token from p", RESIDUAL_FROM_P),
        ("ratio inverted", INVERTED_RATIO),
    ] {
        let (mut standard, mut wrong) = (vec![0.0; vocab], vec![0.0; vocab]);
        for &(y0, w) in p0.entries() {
            let mut ctx = prompt.to_vec();
            ctx.push(y0);
            let p1 = target_next(be, target, &ctx, params);
            let q1 = first_draft_q(be, target, drafter, prompt, y0, params);
            for (acc, rule) in [(&mut standard, &Rule::STANDARD), (&mut wrong, &rule)] {
                for (a, o) in acc.iter_mut().zip(one_position(&p1, &q1, rule, vocab)) {
                    *a += w * o;
                }
            }
        }
        // The standard rule's exact marginal is the target's: q_1 is what the loop draws from.
        let tv_standard = tv(&standard, &exact[1]);
        assert!(
            tv_standard < 1e-9,
            "{label}: standard rule: TV {tv_standard} from the target"
        );
        let tv_wrong = tv(&wrong, &exact[1]);
        let pw = power(&exact[1], &wrong, wrong_seeds, LEVEL);
        let counts = tally(wrong_seeds, DEPTH, vocab, |seed| {
            speculative(be, target, drafter, prompt, params, &rule, seed)
        });
        let ps = p_values(&counts, &exact, DEPTH);
        eprintln!(
            "{label} wrong rule ({name}): position-1 TV from the target {tv_wrong:.4}, power at {wrong_seeds} seeds and level {LEVEL}: {pw:.6}; sampled p-values {ps:.3?}"
        );
        assert!(pw > 0.99, "{label} {name}: power {pw}");
        assert!(
            ps[0] < LEVEL,
            "{label} {name}: the test did not catch the wrong rule: {ps:?}"
        );
    }
}

/// What [`tau_agreement`] measured.
pub struct Agreement {
    pub live_macro: f64,
    pub expected_macro: f64,
    /// Live − expected τ per prompt: mean and 99% half-width.
    pub gap: (f64, f64),
    /// Live − expected rounds per prompt: mean and 99% half-width.
    pub round_gap: (f64, f64),
}

/// Live τ at T = 1 with top-k `top_k` (no top-p) over `prompts` random prompts of the target's
/// vocabulary against the native metric `tau_sampled_replayed`, computed exactly from the p and
/// q of records drafted along a continuation sampled from the target, as `run --temperature 1
/// --sampling-top-k K --top-k K` stores them (the same transform; K the vocabulary reads every
/// token through one GEMM with the LM head, as live decoding does), drafts chosen as `draft`
/// says. Paired per prompt: τ and rounds.
pub fn tau_agreement(
    be: &Cpu,
    target: &TargetModel<Cpu>,
    drafter: &Drafter<Cpu>,
    prompts: u32,
    max_new: usize,
    top_k: usize,
    draft: DraftSampling,
) -> Agreement {
    let vocab = target.spec.vocab_size;
    let b = LiveDrafter::from(drafter).block_size();
    let live_params = SamplingParams::new(1.0, Some(top_k as u32), 1.0, draft).unwrap();
    let run = SampledEval {
        params: live_params,
        seed: 2,
    };
    let opts = EvalOptions {
        top_k,
        anchors: AnchorPolicy::Every,
        sampling: Some(run),
        ..EvalOptions::default()
    };
    run.check(&opts).unwrap();
    let mut prompt_rng = SamplingRng::for_prompt(99, 0);
    let (mut live_tau, mut live_rounds) = (Vec::new(), Vec::new());
    let mut all = RecordBatch::new(b as u32, top_k as u32);
    all.target_ids = Some(vec![]);
    all.target_logprobs = Some(vec![]);
    let mut infos = Vec::new();
    for i in 0..prompts {
        let len = 4 + (prompt_rng.uniform() * 6.0) as usize;
        let prompt: Vec<u32> = (0..len)
            .map(|_| (prompt_rng.uniform() * vocab as f64) as u32)
            .collect();
        let sha = format!("{i:016x}{}", "0".repeat(48));
        let mut rng = SamplingRng::for_prompt(1, i as u64);
        let live = live_decode_sampled(
            be,
            target,
            drafter,
            &prompt,
            max_new,
            &[],
            &live_params,
            &mut rng,
        )
        .unwrap();
        live_tau.push(live.tau());
        live_rounds.push(live.round_tokens.len() as f64);
        let cont = run
            .continuation(be, target, &prompt, max_new, &[], &sha)
            .unwrap();
        let mut ids = prompt.clone();
        ids.extend(&cont);
        let (out, indices) = tapped(be, target, drafter, &ids);
        let topk = target.logits_topk(be, &out.last_hidden, top_k).unwrap();
        let seq = Sequence::new(i, &ids, prompt.len(), &topk, Labels::Target);
        let seq = with_context(be, target, drafter, &out, &indices, seq);
        all.extend(
            &evaluate_sequence(be, DraftTarget::Head(target), drafter, &seq, &opts).unwrap(),
        );
        infos.push(PromptInfo {
            index: i,
            prompt_len: prompt.len(),
            seq_len: ids.len(),
            category: None,
        });
    }
    let rows = sampled_rows(&all, &infos, &run.params);
    let metric = |name: &str, scope: &MetricScope| {
        rows.iter()
            .find(|r| r.name == name && &r.scope == scope)
            .unwrap_or_else(|| panic!("no {name} at {scope}"))
            .value
    };
    let expected_tau: Vec<f64> = (0..prompts)
        .map(|i| metric("tau_sampled_replayed", &MetricScope::Prompt(i)))
        .collect();
    let tokens = (max_new - 1) as f64;
    let diffs: Vec<f64> = live_tau
        .iter()
        .zip(&expected_tau)
        .map(|(l, e)| l - e)
        .collect();
    let round_diffs: Vec<f64> = live_rounds
        .iter()
        .zip(&expected_tau)
        .map(|(l, e)| l - tokens / e)
        .collect();
    Agreement {
        live_macro: mean_and_half_width(&live_tau).0,
        expected_macro: metric("tau_sampled_replayed_macro", &MetricScope::Run),
        gap: mean_and_half_width(&diffs),
        round_gap: mean_and_half_width(&round_diffs),
    }
}

/// A copy of the checkpoint folder `src` in `dst` with a vocabulary of `vocab` tokens: the first
/// `vocab` rows of each tensor in `rows_of`, `vocab_size` (top level and `text_config`) set, then
/// `edit_config` and `edit_tensors` applied. Random models of a small vocabulary overlap enough
/// for drafts to be accepted at T > 0 (two random models of 512 tokens hardly ever agree).
pub fn small_vocab_copy(
    src: &std::path::Path,
    dst: &std::path::Path,
    vocab: usize,
    rows_of: &[&str],
    edit_config: impl Fn(&mut serde_json::Value),
    edit_tensors: impl Fn(&mut Vec<draftlens_engine::util::SafetensorsEntry>),
) -> std::path::PathBuf {
    std::fs::create_dir_all(dst).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    if config.get("text_config").is_some() {
        config["text_config"]["vocab_size"] = vocab.into();
    } else {
        config["vocab_size"] = vocab.into();
    }
    edit_config(&mut config);
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<draftlens_engine::util::SafetensorsEntry> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let mut shape = t.shape().to_vec();
            let mut data = t.data().to_vec();
            if rows_of.contains(&name.as_str()) {
                let row = data.len() / shape[0];
                shape[0] = vocab;
                data.truncate(vocab * row);
            }
            (name, t.dtype(), shape, data)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    edit_tensors(&mut tensors);
    draftlens_engine::util::write_safetensors(&dst.join("model.safetensors"), &tensors).unwrap();
    dst.to_path_buf()
}
