//! Masked vs unmasked top-1 accuracy: training reports accuracy over loss-mask positions only
//! (completion tokens), while "every position" includes the prompt positions a drafter sees when
//! the loss mask is off. The gap between the two is one of the ways training numbers drift from
//! deployment numbers. Counts every stored anchor by default (both regions), as training does.

use draftlens_plugin_sdk::{
    export_metric, region_param, Accumulator, Batch, Inputs, Metadata, Metric, MetricSpec,
    MetricValue, Params, PerPosition, PluginError, RegionFilter,
};

pub struct MaskedAccuracy;

pub struct Acc {
    region: RegionFilter,
    masked: PerPosition,
    unmasked: PerPosition,
}

impl Metric for MaskedAccuracy {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "masked-accuracy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "top-1 accuracy over loss-mask positions only (as training reports) vs over every position"
                .into(),
            metrics: vec![
                MetricSpec::new(
                    "acc_masked",
                    "fraction",
                    "P(draft top-1 = target) over valid positions whose loss-mask bit is 1; pooled, series per position",
                    true,
                ),
                MetricSpec::new(
                    "acc_unmasked",
                    "fraction",
                    "P(draft top-1 = target) over every valid position (loss mask ignored); pooled, series per position",
                    true,
                ),
            ],
            params: vec![region_param("all")],
            // Only the drafter's top-1 is read: the host sends 1 candidate id per position.
            inputs: Inputs::TOP1,
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            region: params.region_filter("region")?,
            masked: PerPosition::default(),
            unmasked: PerPosition::default(),
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let p = batch.positions_per_block();
        self.masked.ensure(p);
        self.unmasked.ensure(p);
        for block in batch.blocks().filter(|b| self.region.accepts(b.region)) {
            for i in 0..p {
                if block.valid[i] == 0 {
                    continue;
                }
                let hit = (block.draft_top1(i + 1) == block.target[i]) as u64 as f64;
                self.unmasked.den[i] += 1;
                self.unmasked.num[i] += hit;
                if block.loss_mask[i] != 0 {
                    self.masked.den[i] += 1;
                    self.masked.num[i] += hit;
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(vec![
            self.masked.pooled("acc_masked"),
            self.unmasked.pooled("acc_unmasked"),
        ])
    }
}

export_metric!(MaskedAccuracy);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, random, series, Shape};
    use draftlens_plugin_sdk::{
        evaluate, evaluate_chunks, OwnedBatch, Param, ParamValue, PositionSpec, Region,
    };

    fn pos(t: u32, top1: u32, mask: bool) -> PositionSpec {
        PositionSpec {
            target: Some(t),
            loss_mask: mask,
            draft: vec![(top1, -0.5)],
            target_top: None,
        }
    }

    #[test]
    fn hand_built_batch() {
        // B = 3, K = 1. A prompt anchor whose positions straddle the prompt end: position 1 is in
        // the prompt (mask 0, hit), position 2 in the completion (mask 1, miss).
        let mut b = OwnedBatch::new(3, 1);
        b.push_block(0, 4, Region::Prompt, &[pos(1, 1, false), pos(2, 9, true)]);
        // Two completion anchors: hits [1,1] and [0,1], all masked.
        b.push_block(
            0,
            6,
            Region::Completion,
            &[pos(3, 3, true), pos(4, 4, true)],
        );
        b.push_block(
            0,
            7,
            Region::Completion,
            &[pos(4, 8, true), pos(5, 5, true)],
        );
        let vs = evaluate::<MaskedAccuracy>(&[], &b.as_batch()).unwrap();
        let m = metric(&vs, "acc_masked");
        assert_eq!((m.value, m.count), (3.0 / 5.0, 5));
        assert_eq!(series(&vs, "acc_masked"), &[0.5, 2.0 / 3.0]);
        let u = metric(&vs, "acc_unmasked");
        assert_eq!((u.value, u.count), (4.0 / 6.0, 6));
        assert_eq!(series(&vs, "acc_unmasked"), &[2.0 / 3.0, 2.0 / 3.0]);

        // Completion anchors only: everything is masked, both numbers agree.
        let c = [Param::new("region", ParamValue::Text("completion".into()))];
        let vs = evaluate::<MaskedAccuracy>(&c, &b.as_batch()).unwrap();
        assert_eq!(metric(&vs, "acc_masked").value, 0.75);
        assert_eq!(metric(&vs, "acc_unmasked").value, 0.75);
    }

    #[test]
    fn mask_only_restricts_positions() {
        // Random batch with prompt anchors: masked counts are a subset of unmasked counts.
        let mut shape = Shape::new(8, 2, 3, 10, 30);
        shape.prompt_anchors = true;
        let b = random(9, &shape, 0.5, 0.2);
        let vs = evaluate::<MaskedAccuracy>(&[], &b.as_batch()).unwrap();
        let (m, u) = (metric(&vs, "acc_masked"), metric(&vs, "acc_unmasked"));
        let valid = b.valid.iter().filter(|&&v| v == 1).count() as u64;
        let masked = b.loss_mask.iter().filter(|&&v| v == 1).count() as u64;
        assert_eq!(u.count, valid);
        assert_eq!(m.count, masked);
        assert!(m.count < u.count);
        let parts = chunks(&b, 13);
        assert_eq!(
            vs,
            evaluate_chunks::<MaskedAccuracy>(&[], parts.iter().map(|c| c.as_batch())).unwrap()
        );
    }
}
