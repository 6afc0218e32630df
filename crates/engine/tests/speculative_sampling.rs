//! Speculative sampling at T > 0 on the CPU reference, with a tiny random target and a random
//! DFlash drafter (`docs/metrics.md` §7, `crates/engine/src/drafter/sampling.rs`):
//!
//! The chi-square machinery, the wrong rules and the interval are in `sampling_util/` (shared with
//! the other families' T > 0 tests).
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
use draftlens_records::sampling::{Dist, DraftSampling, SamplingParams};
use draftlens_records::RecordBatch;
use draftlens_results::metrics::{sampled_rows, PromptInfo};
use draftlens_results::store::MetricScope;
use sampling_util::*;

mod sampling_util;

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
        let spec = tally(*n, DEPTH, VOCAB, |seed| {
            speculative(&s, params, &Rule::STANDARD, seed)
        });
        let ps = p_values(&spec, &exact, DEPTH);
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
    let plain = tally(*n / 2, DEPTH, VOCAB, |seed| {
        let mut rng = SamplingRng::for_prompt(seed, 0);
        sample_decode(&s.be, &s.target, &PROMPT, DEPTH + 1, &[], params, &mut rng).unwrap()
    });
    let ps = p_values(&plain, &exact, DEPTH);
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
                for (a, o) in acc.iter_mut().zip(one_position(&p1, &q1, rule, VOCAB)) {
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
        let counts = tally(n_wrong, DEPTH, VOCAB, |seed| {
            speculative(&s, params, &rule, seed)
        });
        let ps = p_values(&counts, &exact, DEPTH);
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
