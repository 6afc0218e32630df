//! Accepted length and τ over the stored anchors, with both aggregation conventions.
//!
//! A(a) = leading positions whose draft top-1 equals the target token (an invalid position stops
//! the streak); τ counts the bonus token, so one block contributes A + 1 tokens per verify round.
//! *Pooled* = Σ over blocks / number of blocks (SpecForge, vLLM counters); *macro* = mean over
//! prompts of each prompt's mean (z-lab, DDTree, specdec_bench `Request_AL`).

use std::collections::BTreeMap;

use draftlens_plugin_sdk::{
    export_metric, region_param, Accumulator, Batch, Inputs, Metadata, Metric, MetricSpec,
    MetricValue, Params, PluginError, RegionFilter, Series, SeriesKind,
};

pub struct AcceptLength;

pub struct Acc {
    region: RegionFilter,
    /// P = B-1 of the first batch (for the histogram size and the acceptance rate).
    positions: usize,
    /// Per prompt: (Σ A, blocks).
    per_prompt: BTreeMap<u32, (u64, u64)>,
    /// hist[A] = blocks with accepted length A.
    hist: Vec<u64>,
}

impl Metric for AcceptLength {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "accept-length".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "accepted length A and tau = A + 1 (bonus included), pooled and macro over prompts".into(),
            metrics: vec![
                MetricSpec::new(
                    "tau_pooled",
                    "tokens",
                    "tokens per verify round incl. the bonus token, Σ(A+1) / blocks over all counted anchors",
                    true,
                ),
                MetricSpec::new(
                    "tau_macro",
                    "tokens",
                    "tokens per verify round incl. the bonus token, mean over prompts of each prompt's mean (count = prompts)",
                    true,
                ),
                MetricSpec::new(
                    "accept_len_pooled",
                    "tokens",
                    "accepted draft tokens A per block (bonus excluded), pooled; series = histogram of A",
                    true,
                ),
                MetricSpec::new(
                    "accept_len_macro",
                    "tokens",
                    "accepted draft tokens A per block (bonus excluded), mean over prompts of each prompt's mean",
                    true,
                ),
                MetricSpec::new(
                    "draft_accept_rate",
                    "fraction",
                    "Σ A / (blocks × (B−1)) = (tau_pooled − 1) / (B−1), the vLLM/llama.cpp acceptance rate",
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
            positions: 0,
            per_prompt: BTreeMap::new(),
            hist: Vec::new(),
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        let p = batch.positions_per_block();
        if self.positions == 0 {
            self.positions = p;
            self.hist = vec![0; p + 1];
        } else if p != self.positions {
            return Err(PluginError::InvalidBatch(format!(
                "block size changed between batches ({} then {})",
                self.positions + 1,
                p + 1
            )));
        }
        // Blocks of one prompt are usually contiguous: keep the current prompt's sums in locals
        // and touch the map only when the prompt changes.
        let mut cur: Option<(u32, u64, u64)> = None;
        for b in 0..batch.num_blocks() {
            if !self.region.accepts(batch.region_of(b)) {
                continue;
            }
            let a = batch.accepted_len(b);
            self.hist[a] += 1;
            let prompt = batch.prompt_index[b];
            match &mut cur {
                Some((pi, sum, n)) if *pi == prompt => {
                    *sum += a as u64;
                    *n += 1;
                }
                _ => {
                    if let Some((pi, sum, n)) = cur.take() {
                        let e = self.per_prompt.entry(pi).or_default();
                        e.0 += sum;
                        e.1 += n;
                    }
                    cur = Some((prompt, a as u64, 1));
                }
            }
        }
        if let Some((pi, sum, n)) = cur {
            let e = self.per_prompt.entry(pi).or_default();
            e.0 += sum;
            e.1 += n;
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        let (accepted, blocks) = self
            .per_prompt
            .values()
            .fold((0u64, 0u64), |(s, n), &(ps, pn)| (s + ps, n + pn));
        debug_assert_eq!(blocks, self.hist.iter().sum::<u64>());
        // Macro: mean over prompts (in prompt order, so the float sum is reproducible).
        let prompts = self.per_prompt.len() as u64;
        let macro_a: f64 = self
            .per_prompt
            .values()
            .map(|&(s, n)| s as f64 / n as f64)
            .sum();
        let accept_len_macro = MetricValue::ratio("accept_len_macro", macro_a, prompts);
        let tau_macro = MetricValue::new("tau_macro", accept_len_macro.value + 1.0, prompts);
        let tau_pooled = MetricValue::ratio("tau_pooled", (accepted + blocks) as f64, blocks);
        let hist_total: u64 = blocks;
        let accept_len_pooled = MetricValue::ratio("accept_len_pooled", accepted as f64, blocks)
            .with_series(Series {
                kind: SeriesKind::Histogram,
                values: self
                    .hist
                    .iter()
                    .map(|&c| draftlens_plugin_sdk::ratio(c as f64, hist_total))
                    .collect(),
                counts: self.hist.clone(),
            });
        let rate = MetricValue::ratio(
            "draft_accept_rate",
            accepted as f64,
            blocks * self.positions as u64,
        );
        Ok(vec![
            tau_pooled,
            tau_macro,
            accept_len_pooled,
            accept_len_macro,
            rate,
        ])
    }
}

export_metric!(AcceptLength);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, oracle, project, random, Shape};
    use draftlens_plugin_sdk::{
        evaluate, evaluate_chunks, OwnedBatch, Param, ParamValue, PositionSpec, Region,
    };

    fn get<'a>(vs: &'a [MetricValue], name: &str) -> &'a MetricValue {
        vs.iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    /// B = 4 (P = 3), K = 2; `hits` = how many leading positions match, then one miss.
    fn block(b: &mut OwnedBatch, prompt: u32, anchor: u32, region: Region, hits: usize) {
        let positions: Vec<PositionSpec> = (0..3)
            .map(|i| {
                let t = 10 + i as u32;
                let top1 = if i < hits { t } else { 99 };
                PositionSpec {
                    target: Some(t),
                    loss_mask: true,
                    draft: vec![(top1, -0.1), (t + 100, -2.0)],
                    target_top: None,
                }
            })
            .collect();
        b.push_block(prompt, anchor, region, &positions);
    }

    #[test]
    fn hand_built_batch() {
        let mut b = OwnedBatch::new(4, 2);
        block(&mut b, 0, 5, Region::Completion, 3); // A = 3
        block(&mut b, 0, 6, Region::Completion, 0); // A = 0
        block(&mut b, 1, 5, Region::Completion, 1); // A = 1
        block(&mut b, 1, 2, Region::Prompt, 3); // prompt anchor: not counted by default
        let vs = evaluate::<AcceptLength>(&[], &b.as_batch()).unwrap();
        let tau = get(&vs, "tau_pooled");
        assert_eq!((tau.value, tau.count), (7.0 / 3.0, 3));
        // prompt 0: (4 + 1) / 2 = 2.5; prompt 1: 2 -> 2.25
        let tau_m = get(&vs, "tau_macro");
        assert_eq!((tau_m.value, tau_m.count), (2.25, 2));
        assert_eq!(get(&vs, "accept_len_macro").value, 1.25);
        let al = get(&vs, "accept_len_pooled");
        assert_eq!(al.value, 4.0 / 3.0);
        assert_eq!(al.series.as_ref().unwrap().counts, vec![1, 1, 0, 1]);
        let rate = get(&vs, "draft_accept_rate");
        assert_eq!((rate.value, rate.count), (4.0 / 9.0, 9));

        // All regions: the prompt anchor (A = 3) joins prompt 1.
        let all = [Param::new("region", ParamValue::Text("all".into()))];
        let vs = evaluate::<AcceptLength>(&all, &b.as_batch()).unwrap();
        assert_eq!(get(&vs, "tau_pooled").value, 11.0 / 4.0);
        let prompt_only = [Param::new("region", ParamValue::Text("prompt".into()))];
        let vs = evaluate::<AcceptLength>(&prompt_only, &b.as_batch()).unwrap();
        assert_eq!(get(&vs, "tau_pooled").value, 4.0);
    }

    #[test]
    fn invalid_position_stops_the_streak() {
        let mut b = OwnedBatch::new(4, 1);
        let pos = |t: Option<u32>, d: u32| PositionSpec {
            target: t,
            loss_mask: true,
            draft: vec![(d, -0.1)],
            target_top: None,
        };
        // Position 2 is past the sequence end: A = 1 although the draft "matches" token 0.
        b.push_block(
            0,
            9,
            Region::Completion,
            &[pos(Some(4), 4), pos(None, 0), pos(None, 0)],
        );
        let vs = evaluate::<AcceptLength>(&[], &b.as_batch()).unwrap();
        assert_eq!(get(&vs, "tau_pooled").value, 2.0);
    }

    #[test]
    fn oracle_drafter_reaches_block_size_except_at_the_end() {
        // B = 16, completions of 100 tokens after 7 prompt tokens; anchors 7..106.
        let shape = Shape::new(16, 4, 3, 7, 100);
        let b = oracle(&shape);
        let vs = evaluate::<AcceptLength>(&[], &b.as_batch()).unwrap();
        // Per prompt: 100 anchors; anchor a has min(15, 106 - a) valid positions.
        let per_prompt: u64 = (7..107u64).map(|a| 1 + 15.min(106 - a)).sum();
        let tau = get(&vs, "tau_pooled");
        assert_eq!(tau.count, 300);
        assert_eq!(tau.value, (3 * per_prompt) as f64 / 300.0);
        // Away from the end every block gives τ = B = 16.
        let inner = oracle(&Shape::new(16, 4, 1, 7, 100));
        let t = chunks(&inner, 85).remove(0);
        let vs = evaluate::<AcceptLength>(&[], &t.as_batch()).unwrap();
        assert_eq!(get(&vs, "tau_pooled").value, 16.0);
        assert_eq!(get(&vs, "draft_accept_rate").value, 1.0);
    }

    #[test]
    fn streaming_equals_one_shot() {
        let b = random(11, &Shape::new(8, 3, 5, 4, 37), 0.7, 0.2);
        let one = evaluate::<AcceptLength>(&[], &b.as_batch()).unwrap();
        // The declared inputs (top-1 only) are enough: the host's projection changes nothing.
        let projected = project(&b, AcceptLength::describe().inputs);
        assert_eq!(projected.top_k, 1);
        assert_eq!(
            one,
            evaluate::<AcceptLength>(&[], &projected.as_batch()).unwrap()
        );
        for n in [1, 7, 50] {
            let parts = chunks(&b, n);
            let streamed =
                evaluate_chunks::<AcceptLength>(&[], parts.iter().map(|c| c.as_batch())).unwrap();
            assert_eq!(one, streamed, "chunks of {n}");
        }
    }

    #[test]
    fn empty_input_gives_undefined_values() {
        let b = OwnedBatch::new(4, 2);
        let vs = evaluate::<AcceptLength>(&[], &b.as_batch()).unwrap();
        assert!(get(&vs, "tau_pooled").value.is_nan());
        assert_eq!(get(&vs, "tau_macro").count, 0);
    }
}
