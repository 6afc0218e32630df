//! Top-k accuracy and the top-k streak bound.
//!
//! a_k^(k') = P(t_k ∈ top-k'(q_k)): how often the target token is among the drafter's best k'
//! candidates at position k (the tree potential per depth). The top-k' streak A^(k') = leading
//! positions whose target token is within the top-k'; 1 + E[A^(k')] bounds τ of any draft tree
//! whose depth-d candidates stay within the per-depth top-k' (the oracle tree bound for DDTree
//! with width ≤ k'). Values of k' above the stored K cannot be computed and are skipped with a
//! warning.

use draftlens_plugin_sdk::{
    export_metric, log, region_param, Accumulator, Batch, Inputs, Level, Metadata, Metric,
    MetricSpec, MetricValue, ParamSpec, ParamValue, Params, PerPosition, PluginError, RegionFilter,
};

pub struct TopK;

pub struct Acc {
    region: RegionFilter,
    /// Requested k' values (sorted); those above the stored K are dropped at the first batch.
    ks: Vec<usize>,
    checked_k: bool,
    /// Per k': rank hits per position.
    acc: Vec<PerPosition>,
    /// Per k': Σ A^(k') over blocks.
    streak: Vec<u64>,
    blocks: u64,
}

impl Metric for TopK {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "topk".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "top-k accuracy per position and the top-k streak upper bound on tree tau".into(),
            metrics: vec![
                MetricSpec::new(
                    "topk_acc_*",
                    "fraction",
                    "topk_acc_<k>: P(target token among the drafter's best k) over valid positions; pooled, series \
                     per position",
                    true,
                ),
                MetricSpec::new(
                    "topk_streak_tau_*",
                    "tokens",
                    "topk_streak_tau_<k>: 1 + mean over blocks of the leading run of positions whose target is in \
                     the top-k: upper bound on tau of any tree within the per-depth top-k (count = blocks)",
                    true,
                ),
            ],
            params: vec![
                ParamSpec::new(
                    "ks",
                    "comma-separated k values, each <= the stored top-K",
                    ParamValue::Text("1,2,4,8".into()),
                ),
                region_param("completion"),
            ],
            // Every candidate's id, no log-probs.
            inputs: Inputs { candidates: 0, draft_logprobs: false, target_topk: false },
        }
    }

    fn begin(params: &Params) -> Result<Acc, PluginError> {
        let ks = params.positive_int_list("ks")?;
        Ok(Acc {
            region: params.region_filter("region")?,
            acc: vec![PerPosition::default(); ks.len()],
            streak: vec![0; ks.len()],
            ks,
            checked_k: false,
            blocks: 0,
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let kk = batch.top_k();
        if !self.checked_k {
            self.checked_k = true;
            let too_big: Vec<String> = self
                .ks
                .iter()
                .filter(|&&k| k > kk)
                .map(|k| k.to_string())
                .collect();
            if !too_big.is_empty() {
                log(
                    Level::Warn,
                    &format!(
                        "topk: k = {} exceed the stored top-K ({kk}); skipped",
                        too_big.join(", ")
                    ),
                );
                let keep = self.ks.iter().take_while(|&&k| k <= kk).count();
                self.ks.truncate(keep);
                self.acc.truncate(keep);
                self.streak.truncate(keep);
            }
        }
        let p = batch.positions_per_block();
        for a in &mut self.acc {
            a.ensure(p);
        }
        let mut streak_open = vec![true; self.ks.len()];
        for block in batch.blocks().filter(|b| self.region.accepts(b.region)) {
            self.blocks += 1;
            streak_open.fill(true);
            for i in 0..p {
                if block.valid[i] == 0 {
                    streak_open.iter_mut().for_each(|s| *s = false);
                    continue;
                }
                let cands = &block.draft_ids[i * kk..(i + 1) * kk];
                // Rank of the target among the candidates (K = absent).
                let rank = cands
                    .iter()
                    .position(|&t| t == block.target[i])
                    .unwrap_or(kk);
                for (j, &k) in self.ks.iter().enumerate() {
                    let hit = rank < k;
                    self.acc[j].den[i] += 1;
                    self.acc[j].num[i] += hit as u64 as f64;
                    if streak_open[j] {
                        if hit {
                            self.streak[j] += 1;
                        } else {
                            streak_open[j] = false;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        let mut out = Vec::new();
        for (j, &k) in self.ks.iter().enumerate() {
            out.push(self.acc[j].pooled(&format!("topk_acc_{k}")));
            let mut tau = MetricValue::ratio(
                &format!("topk_streak_tau_{k}"),
                self.streak[j] as f64,
                self.blocks,
            );
            tau.value += 1.0;
            out.push(tau);
        }
        Ok(out)
    }
}

export_metric!(TopK);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, random, series, Shape};
    use draftlens_plugin_sdk::{
        evaluate, evaluate_chunks, take_native_logs, OwnedBatch, Param, PositionSpec, Region,
    };

    /// B = 4 (P = 3), K = 3; `ranks[i]` = rank of the target at position i+1 (3 = absent).
    fn push(b: &mut OwnedBatch, ranks: [usize; 3]) {
        let ps: Vec<PositionSpec> = ranks
            .iter()
            .map(|&r| {
                let mut draft = vec![(100, -0.5), (101, -1.0), (102, -2.0)];
                if r < 3 {
                    draft[r].0 = 7;
                }
                PositionSpec {
                    target: Some(7),
                    loss_mask: true,
                    draft,
                    target_top: None,
                }
            })
            .collect();
        b.push_block(0, b.anchor.len() as u32, Region::Completion, &ps);
    }

    fn ks(s: &str) -> Vec<Param> {
        vec![Param::new("ks", ParamValue::Text(s.into()))]
    }

    #[test]
    fn hand_built_ranks() {
        let mut b = OwnedBatch::new(4, 3);
        push(&mut b, [0, 1, 3]); // streaks: k1 = 1, k2 = 2, k3 = 2
        push(&mut b, [2, 0, 0]); // k1 = 0, k2 = 0, k3 = 3
        let vs = evaluate::<TopK>(&ks("1,2,3"), &b.as_batch()).unwrap();
        assert_eq!(series(&vs, "topk_acc_1"), &[0.5, 0.5, 0.5]);
        assert_eq!(series(&vs, "topk_acc_2"), &[0.5, 1.0, 0.5]);
        assert_eq!(series(&vs, "topk_acc_3"), &[1.0, 1.0, 0.5]);
        assert_eq!(metric(&vs, "topk_acc_2").value, 4.0 / 6.0);
        assert_eq!(metric(&vs, "topk_streak_tau_1").value, 1.5);
        assert_eq!(metric(&vs, "topk_streak_tau_2").value, 2.0);
        assert_eq!(metric(&vs, "topk_streak_tau_3").value, 3.5);
    }

    #[test]
    fn k_above_stored_k_is_skipped_with_a_warning() {
        let b = random(2, &Shape::new(5, 2, 2, 3, 10), 0.5, 0.3);
        take_native_logs();
        let vs = evaluate::<TopK>(&ks("1,2,4,8"), &b.as_batch()).unwrap();
        let names: Vec<&str> = vs.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "topk_acc_1",
                "topk_streak_tau_1",
                "topk_acc_2",
                "topk_streak_tau_2"
            ]
        );
        let logs = take_native_logs();
        assert!(
            logs.iter()
                .any(|(_, m)| m.contains("k = 4, 8 exceed the stored top-K (2)")),
            "{logs:?}"
        );
    }

    #[test]
    fn bounds_are_ordered_and_streaming_matches() {
        let b = random(8, &Shape::new(9, 4, 3, 4, 30), 0.5, 0.35);
        let p = ks("1,2,4");
        let one = evaluate::<TopK>(&p, &b.as_batch()).unwrap();
        let parts = chunks(&b, 11);
        assert_eq!(
            one,
            evaluate_chunks::<TopK>(&p, parts.iter().map(|c| c.as_batch())).unwrap()
        );
        let t1 = metric(&one, "topk_streak_tau_1").value;
        let t2 = metric(&one, "topk_streak_tau_2").value;
        let t4 = metric(&one, "topk_streak_tau_4").value;
        assert!(t1 <= t2 && t2 <= t4, "{t1} {t2} {t4}");
        // top-1 streak is the chain τ.
        let blocks = b.as_batch();
        let tau: f64 = blocks
            .blocks()
            .map(|bl| 1.0 + bl.accepted_len() as f64)
            .sum::<f64>()
            / blocks.num_blocks() as f64;
        assert!((t1 - tau).abs() < 1e-12);
    }
}
