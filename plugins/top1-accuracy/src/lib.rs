//! Per-position top-1 accuracy a_k = P(d_k = t_k): the drafter's best candidate at position k
//! equals the target's greedy token, counted over valid positions whatever happened at earlier
//! positions (the marginal, "position k acc" of training logs).

use draftlens_plugin_sdk::{
    export_metric, region_param, Accumulator, Batch, Inputs, Metadata, Metric, MetricSpec,
    MetricValue, Params, PerPosition, PluginError, RegionFilter,
};

pub struct Top1Accuracy;

pub struct Acc {
    region: RegionFilter,
    hits: PerPosition,
}

impl Metric for Top1Accuracy {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "top1-accuracy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "per-position top-1 accuracy of the drafter against the target's greedy tokens".into(),
            metrics: vec![MetricSpec::new(
                "top1_acc",
                "fraction",
                "P(draft top-1 = target token) over valid positions (marginal, not conditioned on earlier \
                 positions); value pooled over positions, series per position k",
                true,
            )],
            params: vec![region_param("completion")],
            // Only the drafter's top-1 is read: the host sends 1 candidate id per position.
            inputs: Inputs::TOP1,
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            region: params.region_filter("region")?,
            hits: PerPosition::default(),
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let p = batch.positions_per_block();
        self.hits.ensure(p);
        for block in batch.blocks().filter(|b| self.region.accepts(b.region)) {
            for k in 1..=p {
                if block.valid[k - 1] != 0 {
                    self.hits.den[k - 1] += 1;
                    if block.draft_top1(k) == block.target[k - 1] {
                        self.hits.num[k - 1] += 1.0;
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(vec![self.hits.pooled("top1_acc")])
    }
}

export_metric!(Top1Accuracy);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, oracle, random, series, Shape};
    use draftlens_plugin_sdk::{evaluate, evaluate_chunks, OwnedBatch, PositionSpec, Region};

    #[test]
    fn hand_built_batch() {
        // B = 4, K = 2. Position hits: block 1 = [hit, miss, hit], block 2 = [miss, hit, invalid].
        let mut b = OwnedBatch::new(4, 2);
        let pos = |t: Option<u32>, top1: u32| PositionSpec {
            target: t,
            loss_mask: true,
            draft: vec![(top1, -0.2), (500, -1.9)],
            target_top: None,
        };
        b.push_block(
            0,
            3,
            Region::Completion,
            &[pos(Some(1), 1), pos(Some(2), 7), pos(Some(3), 3)],
        );
        b.push_block(
            0,
            4,
            Region::Completion,
            &[pos(Some(2), 8), pos(Some(3), 3), pos(None, 0)],
        );
        // A prompt anchor that would change everything if it were counted.
        b.push_block(
            0,
            1,
            Region::Prompt,
            &[pos(Some(5), 5), pos(Some(5), 5), pos(Some(5), 5)],
        );
        let vs = evaluate::<Top1Accuracy>(&[], &b.as_batch()).unwrap();
        let acc = metric(&vs, "top1_acc");
        assert_eq!((acc.value, acc.count), (3.0 / 5.0, 5));
        let s = acc.series.as_ref().unwrap();
        assert_eq!(s.values, vec![0.5, 0.5, 1.0]);
        assert_eq!(s.counts, vec![2, 2, 1]);
    }

    #[test]
    fn accuracy_is_marginal_not_conditional() {
        // Position 1 always misses, position 2 always hits: a_2 = 1 although A = 0 everywhere.
        let mut b = OwnedBatch::new(3, 1);
        for a in 0..4 {
            let p1 = PositionSpec {
                target: Some(1),
                loss_mask: true,
                draft: vec![(2, -0.1)],
                target_top: None,
            };
            let p2 = PositionSpec {
                target: Some(3),
                loss_mask: true,
                draft: vec![(3, -0.1)],
                target_top: None,
            };
            b.push_block(0, 10 + a, Region::Completion, &[p1, p2]);
        }
        let vs = evaluate::<Top1Accuracy>(&[], &b.as_batch()).unwrap();
        assert_eq!(series(&vs, "top1_acc"), &[0.0, 1.0]);
    }

    #[test]
    fn oracle_is_perfect_and_streaming_matches() {
        let o = oracle(&Shape::new(16, 4, 2, 5, 40));
        let vs = evaluate::<Top1Accuracy>(&[], &o.as_batch()).unwrap();
        assert_eq!(metric(&vs, "top1_acc").value, 1.0);
        let b = random(5, &Shape::new(6, 2, 4, 3, 21), 0.4, 0.3);
        let one = evaluate::<Top1Accuracy>(&[], &b.as_batch()).unwrap();
        let parts = chunks(&b, 9);
        assert_eq!(
            one,
            evaluate_chunks::<Top1Accuracy>(&[], parts.iter().map(|c| c.as_batch())).unwrap()
        );
        // Statistically near the generator's p_top1 (0.4) with ~400 positions.
        let v = metric(&one, "top1_acc").value;
        assert!((0.3..0.5).contains(&v), "{v}");
    }
}
