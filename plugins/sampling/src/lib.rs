//! Speculative-sampling acceptance (Leviathan et al.; Chen et al.) from the stored top-K
//! distributions of the drafter (q) and the target (p), at temperature 1.
//!
//! Per position the acceptance probability of a sampled draft token is α = Σ_x min(p(x), q(x))
//! = 1 − TV(p, q). Only the top-K of each side is stored, so α is bracketed:
//! α_lo = Σ_{x ∈ D∩T} min(p, q) (tokens in both top-Ks). Every other token contributes at most its
//! own p and its own q, and lies outside T (its p is part of 1 − P(T)) or outside D (its q is part
//! of 1 − Q(D)), so α_hi = α_lo + min(1 − P(D∩T), 1 − Q(D∩T), (1 − P(T)) + (1 − Q(D))).
//! With a deterministic
//! (greedy) draft the acceptance is p(d₁), known when d₁ is in the target's top-K (else ≥ 0).
//! Chain τ under sampling along the stored path: 1 + Σ_k Π_{j≤k} α_j per block (the positions are
//! those of the target's greedy path, an approximation of the sampled path).
//!
//! Needs the target's top-K in the records; blocks without it are skipped (and logged).

use draftlens_plugin_sdk::{
    export_metric, log, region_param, Accumulator, Batch, Inputs, Level, Metadata, Metric,
    MetricSpec, MetricValue, Params, PerPosition, PluginError, RegionFilter,
};

pub struct Sampling;

pub struct Acc {
    region: RegionFilter,
    alpha_lo: PerPosition,
    alpha_hi: PerPosition,
    greedy_lo: PerPosition,
    tau_lo: f64,
    tau_hi: f64,
    blocks: u64,
    skipped: u64,
}

impl Metric for Sampling {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "sampling".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "speculative-sampling acceptance bounds from stored draft and target top-K log-probs".into(),
            metrics: vec![
                MetricSpec::new(
                    "sampling_alpha_lo",
                    "fraction",
                    "lower bound of α = Σ min(p,q) (1 − TV) from tokens in both top-Ks; pooled over valid positions, \
                     series per position",
                    true,
                ),
                MetricSpec::new(
                    "sampling_alpha_hi",
                    "fraction",
                    "upper bound of α: α_lo + min(1 − P(both), 1 − Q(both), (1 − P(target top-K)) + (1 − Q(draft \
                     top-K))); pooled, series per position",
                    true,
                ),
                MetricSpec::new(
                    "sampling_tau_lo",
                    "tokens",
                    "1 + Σ_k Π_{j<=k} α_lo,j per block (bonus included), mean over blocks",
                    true,
                ),
                MetricSpec::new(
                    "sampling_tau_hi",
                    "tokens",
                    "1 + Σ_k Π_{j<=k} α_hi,j per block (bonus included), mean over blocks",
                    true,
                ),
                MetricSpec::new(
                    "greedy_draft_alpha_lo",
                    "fraction",
                    "acceptance p(d1) of a deterministic draft (the drafter's top-1) under target sampling; 0 when \
                     d1 is outside the target's top-K (lower bound); pooled, series per position",
                    true,
                ),
            ],
            params: vec![region_param("completion")],
            inputs: Inputs::ALL,
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            region: params.region_filter("region")?,
            alpha_lo: PerPosition::default(),
            alpha_hi: PerPosition::default(),
            greedy_lo: PerPosition::default(),
            tau_lo: 0.0,
            tau_hi: 0.0,
            blocks: 0,
            skipped: 0,
        })
    }
}

/// (α_lo, α_hi, p(d₁) or 0) of one position.
pub fn alpha(
    draft_ids: &[u32],
    draft_lp: &[f32],
    target_ids: &[u32],
    target_lp: &[f32],
) -> (f64, f64, f64) {
    let (mut lo, mut p_both, mut q_both) = (0.0f64, 0.0f64, 0.0f64);
    let p_top: f64 = target_lp.iter().map(|&l| (l as f64).exp()).sum();
    let q_top: f64 = draft_lp.iter().map(|&l| (l as f64).exp()).sum();
    for (i, &x) in draft_ids.iter().enumerate() {
        if let Some(j) = target_ids.iter().position(|&y| y == x) {
            let q = (draft_lp[i] as f64).exp();
            let p = (target_lp[j] as f64).exp();
            lo += p.min(q);
            p_both += p;
            q_both += q;
        }
    }
    let slack = (1.0 - p_both)
        .min(1.0 - q_both)
        .min((1.0 - p_top) + (1.0 - q_top))
        .max(0.0);
    let hi = (lo + slack).min(1.0);
    let greedy = target_ids
        .iter()
        .position(|&y| y == draft_ids[0])
        .map_or(0.0, |j| (target_lp[j] as f64).exp());
    (lo, hi, greedy)
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let p = batch.positions_per_block();
        let kk = batch.top_k();
        for pp in [&mut self.alpha_lo, &mut self.alpha_hi, &mut self.greedy_lo] {
            pp.ensure(p);
        }
        let (Some(tids), Some(tlps)) = (batch.target_ids, batch.target_logprobs) else {
            self.skipped += batch
                .blocks()
                .filter(|b| self.region.accepts(b.region))
                .count() as u64;
            return Ok(());
        };
        for block in batch.blocks().filter(|b| self.region.accepts(b.region)) {
            self.blocks += 1;
            let base = block.index * p * kk;
            let (mut surv_lo, mut surv_hi) = (1.0f64, 1.0f64);
            let (mut sum_lo, mut sum_hi) = (0.0f64, 0.0f64);
            let mut chain_open = true;
            for i in 0..p {
                if block.valid[i] == 0 {
                    chain_open = false;
                    continue;
                }
                let c = i * kk..(i + 1) * kk;
                let t = base + i * kk..base + (i + 1) * kk;
                let (lo, hi, greedy) = alpha(
                    &block.draft_ids[c.clone()],
                    &block.draft_logprobs[c],
                    &tids[t.clone()],
                    &tlps[t],
                );
                self.alpha_lo.num[i] += lo;
                self.alpha_lo.den[i] += 1;
                self.alpha_hi.num[i] += hi;
                self.alpha_hi.den[i] += 1;
                self.greedy_lo.num[i] += greedy;
                self.greedy_lo.den[i] += 1;
                if chain_open {
                    surv_lo *= lo;
                    surv_hi *= hi;
                    sum_lo += surv_lo;
                    sum_hi += surv_hi;
                }
            }
            self.tau_lo += 1.0 + sum_lo;
            self.tau_hi += 1.0 + sum_hi;
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        if self.skipped > 0 {
            log(
                Level::Warn,
                &format!(
                    "sampling: {} block(s) have no stored target top-K and were skipped (run the evaluation with \
                     target log-probs to score them)",
                    self.skipped
                ),
            );
        }
        if self.blocks == 0 {
            // Nothing to score: report no values rather than undefined ones.
            return Ok(vec![]);
        }
        Ok(vec![
            self.alpha_lo.pooled("sampling_alpha_lo"),
            self.alpha_hi.pooled("sampling_alpha_hi"),
            MetricValue::ratio("sampling_tau_lo", self.tau_lo, self.blocks),
            MetricValue::ratio("sampling_tau_hi", self.tau_hi, self.blocks),
            self.greedy_lo.pooled("greedy_draft_alpha_lo"),
        ])
    }
}

export_metric!(Sampling);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, random, series, Shape};
    use draftlens_plugin_sdk::{
        evaluate, evaluate_chunks, take_native_logs, OwnedBatch, PositionSpec, Region,
    };

    fn ln(x: f64) -> f32 {
        x.ln() as f32
    }

    #[test]
    fn alpha_of_known_distributions() {
        // Vocabulary {1,2,3,4}; q = (.5,.3,.2,0), p = (.4,.4,.1,.1); K = 2 each side.
        // Draft top-2 = {1:.5, 2:.3}, target top-2 = {1:.4, 2:.4}: α_lo = .4 + .3 = .7,
        // P(both) = .8, Q(both) = .8 → α_hi = .7 + .2 = .9. True α = .4+.3+.1+0 = .8 ∈ [.7, .9].
        let (lo, hi, g) = alpha(&[1, 2], &[ln(0.5), ln(0.3)], &[1, 2], &[ln(0.4), ln(0.4)]);
        assert!(
            (lo - 0.7).abs() < 1e-6 && (hi - 0.9).abs() < 1e-6,
            "{lo} {hi}"
        );
        assert!((g - 0.4).abs() < 1e-6);
        // Disjoint top-Ks: α_lo = 0 and the greedy draft's p is unknown (→ 0). Tokens 1, 2 have
        // p <= 1 − .9 together, tokens 3, 4 have q <= 1 − .8: α_hi = .1 + .2.
        let (lo, hi, g) = alpha(&[1, 2], &[ln(0.5), ln(0.3)], &[3, 4], &[ln(0.6), ln(0.3)]);
        assert_eq!((lo, g), (0.0, 0.0));
        assert!((hi - 0.3).abs() < 1e-6, "{hi}");
    }

    #[test]
    fn identical_full_distributions_accept_everything() {
        // K covers the whole distribution and p = q: α = 1 exactly at every position, τ = B.
        let mut b = OwnedBatch::new(4, 2);
        let pos = || PositionSpec {
            target: Some(1),
            loss_mask: true,
            draft: vec![(1, ln(0.75)), (2, ln(0.25))],
            target_top: Some(vec![(1, ln(0.75)), (2, ln(0.25))]),
        };
        b.push_block(0, 0, Region::Completion, &[pos(), pos(), pos()]);
        let vs = evaluate::<Sampling>(&[], &b.as_batch()).unwrap();
        for name in ["sampling_alpha_lo", "sampling_alpha_hi"] {
            assert!(
                series(&vs, name).iter().all(|a| (a - 1.0).abs() < 1e-6),
                "{name}"
            );
        }
        assert!((metric(&vs, "sampling_tau_lo").value - 4.0).abs() < 1e-5);
        assert!((metric(&vs, "greedy_draft_alpha_lo").value - 0.75).abs() < 1e-6);
    }

    #[test]
    fn chain_tau_multiplies_alphas() {
        // α_lo = 0.5 at every position (q = p = .5 on token 1, other half elsewhere), P = 3:
        // τ_lo = 1 + .5 + .25 + .125.
        let mut b = OwnedBatch::new(4, 1);
        let pos = || PositionSpec {
            target: Some(1),
            loss_mask: true,
            draft: vec![(1, ln(0.5))],
            target_top: Some(vec![(1, ln(0.5))]),
        };
        b.push_block(0, 0, Region::Completion, &[pos(), pos(), pos()]);
        let vs = evaluate::<Sampling>(&[], &b.as_batch()).unwrap();
        assert!((metric(&vs, "sampling_tau_lo").value - 1.875).abs() < 1e-6);
        // α_hi = .5 + min(.5, .5, .5 + .5) = 1 → τ_hi = 4.
        assert!((metric(&vs, "sampling_tau_hi").value - 4.0).abs() < 1e-6);
    }

    #[test]
    fn without_target_topk_nothing_is_reported() {
        let b = random(1, &Shape::new(5, 2, 2, 3, 10), 0.5, 0.3);
        take_native_logs();
        let vs = evaluate::<Sampling>(&[], &b.as_batch()).unwrap();
        assert!(vs.is_empty());
        let logs = take_native_logs();
        assert!(
            logs.iter()
                .any(|(_, m)| m.contains("no stored target top-K")),
            "{logs:?}"
        );
    }

    #[test]
    fn bounds_bracket_and_streaming_matches() {
        let mut shape = Shape::new(7, 4, 3, 3, 25);
        shape.target_topk = true;
        let b = random(12, &shape, 0.6, 0.3);
        let one = evaluate::<Sampling>(&[], &b.as_batch()).unwrap();
        let parts = chunks(&b, 10);
        assert_eq!(
            one,
            evaluate_chunks::<Sampling>(&[], parts.iter().map(|c| c.as_batch())).unwrap()
        );
        let lo = series(&one, "sampling_alpha_lo");
        let hi = series(&one, "sampling_alpha_hi");
        assert!(lo.iter().zip(hi).all(|(l, h)| l <= h && *h <= 1.0));
        assert!(metric(&one, "sampling_tau_lo").value <= metric(&one, "sampling_tau_hi").value);
    }
}
