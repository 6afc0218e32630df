//! Conditional and survival acceptance per position, from the accepted length A of each block.
//!
//! c_k = P(d_k = t_k | d_j = t_j for all j < k) ("n-α", EAGLE) = #{A ≥ k} / #{A ≥ k−1 and position
//! k valid}. Blocks near the end of a sequence cannot reach position k; they leave the
//! denominator of c_k instead of counting as rejections (right-censoring), so the survival curve
//! S_k = Π_{j≤k} c_j is the product-limit estimate of P(A ≥ k). Without censoring S_k is exactly
//! #{A ≥ k} / blocks (vLLM's "per-position acceptance") and 1 + Σ S_k is the pooled τ.

use draftlens_plugin_sdk::{
    export_metric, region_param, Accumulator, Batch, Inputs, Metadata, Metric, MetricSpec,
    MetricValue, Params, PluginError, RegionFilter, Series, SeriesKind,
};

pub struct Acceptance;

pub struct Acc {
    region: RegionFilter,
    /// reached[k-1] = #{A ≥ k}.
    reached: Vec<u64>,
    /// at_risk[k-1] = #{A ≥ k−1 and position k valid}.
    at_risk: Vec<u64>,
    blocks: u64,
}

impl Metric for Acceptance {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "acceptance".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "conditional acceptance c_k and survival P(A >= k) per position".into(),
            metrics: vec![
                MetricSpec::new(
                    "conditional_acceptance",
                    "fraction",
                    "c_k = #{A>=k} / #{A>=k-1, position k valid}; series per position, value pooled over positions \
                     (Σ num / Σ den)",
                    true,
                ),
                MetricSpec::new(
                    "survival",
                    "fraction",
                    "S_k = Π_{j<=k} c_j, product-limit estimate of P(A>=k) (blocks cut by the sequence end are \
                     censored, not rejected); series per position, value = mean_k S_k = (tau_survival-1)/(B-1)",
                    true,
                ),
                MetricSpec::new(
                    "tau_survival",
                    "tokens",
                    "1 + Σ_k S_k: chain τ (bonus included) from the survival curve; equals the pooled τ when no \
                     block reaches the sequence end (count = blocks)",
                    true,
                ),
            ],
            params: vec![region_param("completion")],
            // Only the drafter's top-1 is read: the host sends 1 candidate id per position.
            inputs: Inputs::TOP1,
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            region: params.region_filter("region")?,
            reached: Vec::new(),
            at_risk: Vec::new(),
            blocks: 0,
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let p = batch.positions_per_block();
        if self.reached.len() < p {
            self.reached.resize(p, 0);
            self.at_risk.resize(p, 0);
        }
        for block in batch.blocks().filter(|b| self.region.accepts(b.region)) {
            self.blocks += 1;
            let a = block.accepted_len();
            for i in 0..a {
                self.reached[i] += 1;
            }
            // Positions 1..=a+1 were tried (A >= k-1), if they exist.
            for i in 0..(a + 1).min(p) {
                if block.valid[i] != 0 {
                    self.at_risk[i] += 1;
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        let p = self.reached.len();
        let cond_values: Vec<f64> = (0..p)
            .map(|i| draftlens_plugin_sdk::ratio(self.reached[i] as f64, self.at_risk[i]))
            .collect();
        let cond = MetricValue::ratio(
            "conditional_acceptance",
            self.reached.iter().sum::<u64>() as f64,
            self.at_risk.iter().sum(),
        )
        .with_series(Series {
            kind: SeriesKind::PerPosition,
            values: cond_values.clone(),
            counts: self.at_risk.clone(),
        });

        // Product-limit curve. Once no block is at risk the curve is undefined from there on.
        let mut surv = Vec::with_capacity(p);
        let mut s = 1.0f64;
        for &c in &cond_values {
            s *= c;
            surv.push(s);
        }
        let defined = self.blocks > 0 && surv.iter().all(|v| !v.is_nan());
        let sum: f64 = surv.iter().sum();
        // NaN means undefined, whose count is 0 (the host refuses NaN with a count).
        let n = if defined { self.blocks } else { 0 };
        let survival = MetricValue::new(
            "survival",
            if defined && p > 0 {
                sum / p as f64
            } else {
                f64::NAN
            },
            if defined && p > 0 { n } else { 0 },
        )
        .with_series(Series {
            kind: SeriesKind::PerPosition,
            values: surv,
            counts: self.at_risk.clone(),
        });
        let tau = MetricValue::new(
            "tau_survival",
            if defined { 1.0 + sum } else { f64::NAN },
            n,
        );
        Ok(vec![cond, survival, tau])
    }
}

export_metric!(Acceptance);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, oracle, random, series, Shape};
    use draftlens_plugin_sdk::{evaluate, evaluate_chunks, OwnedBatch, PositionSpec, Region};

    /// B = 4 (P = 3), K = 1; `hits` leading matches then misses; `valid` positions exist.
    fn push(b: &mut OwnedBatch, anchor: u32, hits: usize, valid: usize) {
        let ps: Vec<PositionSpec> = (0..3)
            .map(|i| PositionSpec {
                target: (i < valid).then_some(7),
                loss_mask: true,
                draft: vec![(if i < hits { 7 } else { 8 }, -0.3)],
                target_top: None,
            })
            .collect();
        b.push_block(0, anchor, Region::Completion, &ps);
    }

    #[test]
    fn hand_built_histogram() {
        // A = 0, 1, 2, 3, 3 with every position valid.
        let mut b = OwnedBatch::new(4, 1);
        for (i, a) in [0, 1, 2, 3, 3].into_iter().enumerate() {
            push(&mut b, i as u32, a, 3);
        }
        let vs = evaluate::<Acceptance>(&[], &b.as_batch()).unwrap();
        // reached = [4, 3, 2], at risk = [5, 4, 3]
        assert_eq!(
            series(&vs, "conditional_acceptance"),
            &[0.8, 0.75, 2.0 / 3.0]
        );
        let c = metric(&vs, "conditional_acceptance");
        assert_eq!((c.value, c.count), (9.0 / 12.0, 12));
        let s = series(&vs, "survival");
        let want = [4.0 / 5.0, 3.0 / 5.0, 2.0 / 5.0];
        for (g, w) in s.iter().zip(want) {
            assert!((g - w).abs() < 1e-15, "{s:?}");
        }
        // Without censoring 1 + Σ S_k is the pooled τ: (1+2+3+4+4)/5 = 2.8.
        let tau = metric(&vs, "tau_survival");
        assert!((tau.value - 2.8).abs() < 1e-12);
        assert!((metric(&vs, "survival").value - 1.8 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn censoring_at_the_sequence_end() {
        // Two full blocks with A = 3, one block with only 1 valid position, fully accepted (A = 1).
        // Naively P(A >= 2) would be 2/3; censored, position 2 has 2 blocks at risk, both accepted.
        let mut b = OwnedBatch::new(4, 1);
        push(&mut b, 0, 3, 3);
        push(&mut b, 1, 3, 3);
        push(&mut b, 2, 3, 1);
        let vs = evaluate::<Acceptance>(&[], &b.as_batch()).unwrap();
        assert_eq!(series(&vs, "conditional_acceptance"), &[1.0, 1.0, 1.0]);
        assert_eq!(
            metric(&vs, "conditional_acceptance")
                .series
                .as_ref()
                .unwrap()
                .counts,
            vec![3, 2, 2]
        );
        assert_eq!(metric(&vs, "tau_survival").value, 4.0);
    }

    #[test]
    fn oracle_survives_everywhere() {
        let o = oracle(&Shape::new(16, 2, 3, 4, 50));
        let vs = evaluate::<Acceptance>(&[], &o.as_batch()).unwrap();
        assert!(series(&vs, "survival").iter().all(|&s| s == 1.0));
        assert_eq!(metric(&vs, "tau_survival").value, 16.0);
    }

    #[test]
    fn streaming_matches_and_curve_is_monotone() {
        let b = random(21, &Shape::new(10, 3, 4, 6, 40), 0.8, 0.1);
        let one = evaluate::<Acceptance>(&[], &b.as_batch()).unwrap();
        let parts = chunks(&b, 17);
        assert_eq!(
            one,
            evaluate_chunks::<Acceptance>(&[], parts.iter().map(|c| c.as_batch())).unwrap()
        );
        let s = series(&one, "survival");
        assert!(s.windows(2).all(|w| w[1] <= w[0]), "{s:?}");
    }
}
