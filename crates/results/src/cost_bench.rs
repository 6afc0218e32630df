//! The cost model's inputs measured apart from live decoding (`draftlens bench-costs`,
//! docs/verdict.md §9), stored as their own metric source ([`SOURCE`]) so that the verdict can put
//! the estimate from these costs next to the estimate from live decoding's own rounds
//! (`crate::speed`) and the measured speed-up. The estimate is the one of
//! [`crate::speed::estimated_speedup`]; only where its inputs come from differs.
//!
//! Why apart: `live --baseline` takes t_draft_round and t_verify(B) from the rounds of the very
//! live decoding whose wall time is the measured speed-up, so estimate and measurement share
//! their timings. Here each cost is timed on its own, repeated at chosen contexts:
//!
//! - t_decode: every step of plain greedy decoding at batch 1 (one token, KV cache, its top-1);
//! - t_verify(n): one target forward over n tokens (the anchor token and n − 1 of the drafter's
//!   proposals) on a KV cache holding the prompt and part of its continuation, its top-1 and the
//!   crop to the accepted length, for several n;
//! - t_draft_round: the drafter's proposals for one anchor plus its context update with the
//!   verify pass's accepted rows, at the same contexts.
//!
//! Each cost is the **median** of its timed samples pooled over prompts and contexts; its spread
//! the interquartile range (p25–p75) and the extremes of the same samples.

use crate::speed::CostInputs;
use crate::store::{MetricRow, MetricScope};
use serde::Serialize;

/// The metric source of the independent costs (reserved: no plugin may write it).
pub const SOURCE: &str = "cost_bench";

/// Run-scope rows (milliseconds): the three inputs of the cost model, t_verify at the drafter's B.
pub const T_DECODE_MS: &str = "t_decode_ms";
pub const T_DRAFT_ROUND_MS: &str = "t_draft_round_ms";
pub const T_VERIFY_MS: &str = "t_verify_ms";

/// The row of t_verify over `tokens` tokens a pass (every measured size, B included).
pub fn t_verify_n_ms(tokens: u32) -> String {
    format!("t_verify_{tokens}_ms")
}

/// Median, quartiles and extremes of a set of timings (seconds).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub p25: f64,
    pub p75: f64,
    pub min: f64,
    pub max: f64,
    /// Samples.
    pub n: u64,
}

impl Spread {
    /// The spread of `samples` (quantiles by linear interpolation between order statistics, as
    /// numpy's default); `None` when there is none or one is not finite.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let h = p * (v.len() - 1) as f64;
            let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
            v[lo] + (h - lo as f64) * (v[hi] - v[lo])
        };
        Some(Spread {
            median: q(0.5),
            p25: q(0.25),
            p75: q(0.75),
            min: v[0],
            max: v[v.len() - 1],
            n: v.len() as u64,
        })
    }
}

/// One context of one prompt: the anchor after `context_len` cached tokens (the prompt and the
/// first tokens of its greedy continuation), with the timed repetitions there.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ContextSamples {
    /// The run's prompt index.
    pub prompt: u32,
    /// Tokens in the target's KV cache before the verify pass.
    pub context_len: u64,
    /// Proposals the target accepted at this anchor (what the timed crop and context update keep).
    pub accepted: u32,
    /// Seconds of each draft round: proposals and context update.
    pub draft_s: Vec<f64>,
    /// Seconds of each verify pass, per tokens a pass (ascending).
    pub verify_s: Vec<(u32, Vec<f64>)>,
}

/// What one prompt contributed: its greedy decode steps and its contexts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PromptSamples {
    pub index: u32,
    /// Seconds of each plain greedy decode step.
    pub decode_step_s: Vec<f64>,
    pub contexts: Vec<ContextSamples>,
}

/// t_verify over `tokens` tokens a pass.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerifySpread {
    pub tokens: u32,
    pub spread: Spread,
}

/// The independent costs of a set of prompts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostBench {
    /// Tokens a verify pass of the drafter (its B): the t_verify the cost model reads.
    pub block_size: u32,
    pub t_decode: Spread,
    pub t_draft_round: Spread,
    /// Every measured size, ascending; B among them.
    pub t_verify: Vec<VerifySpread>,
    pub prompts: usize,
    pub contexts: usize,
    /// Smallest and largest KV cache length of the contexts.
    pub context_len: (u64, u64),
}

impl CostBench {
    /// The costs of `prompts` for a drafter of block size `block_size`; `None` without a decode
    /// step, a draft round or a verify pass over B tokens.
    pub fn of(prompts: &[PromptSamples], block_size: u32) -> Option<CostBench> {
        let contexts: Vec<&ContextSamples> = prompts.iter().flat_map(|p| &p.contexts).collect();
        let decode: Vec<f64> = prompts
            .iter()
            .flat_map(|p| p.decode_step_s.iter().copied())
            .collect();
        let draft: Vec<f64> = contexts
            .iter()
            .flat_map(|c| c.draft_s.iter().copied())
            .collect();
        let mut sizes: Vec<u32> = contexts
            .iter()
            .flat_map(|c| c.verify_s.iter().map(|(n, _)| *n))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let t_verify: Vec<VerifySpread> = sizes
            .into_iter()
            .filter_map(|tokens| {
                let samples: Vec<f64> = contexts
                    .iter()
                    .flat_map(|c| c.verify_s.iter().filter(|(n, _)| *n == tokens))
                    .flat_map(|(_, s)| s.iter().copied())
                    .collect();
                Some(VerifySpread {
                    tokens,
                    spread: Spread::of(&samples)?,
                })
            })
            .collect();
        t_verify.iter().find(|v| v.tokens == block_size)?;
        let lens = contexts.iter().map(|c| c.context_len);
        Some(CostBench {
            block_size,
            t_decode: Spread::of(&decode)?,
            t_draft_round: Spread::of(&draft)?,
            t_verify,
            prompts: prompts.len(),
            contexts: contexts.len(),
            context_len: (lens.clone().min()?, lens.max()?),
        })
    }

    /// t_verify at the drafter's B.
    pub fn verify_at_block(&self) -> &Spread {
        &self
            .t_verify
            .iter()
            .find(|v| v.tokens == self.block_size)
            .expect("CostBench::of keeps B")
            .spread
    }

    /// The cost model's inputs: the medians, t_verify at B.
    pub fn costs(&self) -> CostInputs {
        CostInputs {
            t_decode: self.t_decode.median,
            t_draft_round: self.t_draft_round.median,
            t_verify: self.verify_at_block().median,
        }
    }

    /// The rows stored with the run (source [`SOURCE`], run scope): each median in ms, its count
    /// the samples, its spread in the series (`p25_ms`, `p75_ms`, `min_ms`, `max_ms`).
    pub fn rows(&self) -> Vec<MetricRow> {
        let row = |name: &str, s: &Spread, description: String| MetricRow {
            unit: "ms".into(),
            description,
            series: Some(serde_json::json!({
                "p25_ms": s.p25 * 1e3,
                "p75_ms": s.p75 * 1e3,
                "min_ms": s.min * 1e3,
                "max_ms": s.max * 1e3,
            })),
            ..MetricRow::scalar(SOURCE, name, MetricScope::Run, s.median * 1e3, s.n, false)
        };
        let (lo, hi) = self.context_len;
        let at = format!(
            "{} contexts of {} prompts, KV caches of {lo}–{hi} tokens",
            self.contexts, self.prompts
        );
        let mut rows = vec![
            row(T_DECODE_MS, &self.t_decode,
                format!("one plain greedy decode step at batch 1, median over the steps of {} prompts (bench-costs, apart from live decoding)", self.prompts)),
            row(T_DRAFT_ROUND_MS, &self.t_draft_round,
                format!("one draft round (proposals for one anchor and the context update), median over repetitions at {at} (bench-costs)")),
            row(T_VERIFY_MS, self.verify_at_block(),
                format!("one verify pass over B = {} tokens, median over repetitions at {at} (bench-costs)", self.block_size)),
        ];
        for v in &self.t_verify {
            rows.push(row(
                &t_verify_n_ms(v.tokens),
                &v.spread,
                format!(
                    "one target forward over {} tokens with its top-1 and crop, median over repetitions at {at} (bench-costs)",
                    v.tokens
                ),
            ));
        }
        rows
    }
}

/// A run's independent costs, read back from its metric rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredCostBench {
    pub costs: CostInputs,
    /// Median t_verify (seconds) per tokens a pass, ascending.
    pub t_verify_by_tokens: Vec<(u32, f64)>,
}

impl StoredCostBench {
    /// The costs among `rows` (a run's metric rows); `None` when the run has none.
    pub fn from_rows(rows: &[MetricRow]) -> Option<StoredCostBench> {
        let ours = || {
            rows.iter()
                .filter(|m| m.source == SOURCE && m.scope == MetricScope::Run)
                .filter(|m| m.value.is_finite())
        };
        let run = |name: &str| ours().find(|m| m.name == name).map(|m| m.value / 1e3);
        let mut t_verify_by_tokens: Vec<(u32, f64)> = ours()
            .filter_map(|m| {
                let n = m.name.strip_prefix("t_verify_")?.strip_suffix("_ms")?;
                Some((n.parse().ok()?, m.value / 1e3))
            })
            .collect();
        t_verify_by_tokens.sort_by_key(|(n, _)| *n);
        Some(StoredCostBench {
            costs: CostInputs {
                t_decode: run(T_DECODE_MS)?,
                t_draft_round: run(T_DRAFT_ROUND_MS)?,
                t_verify: run(T_VERIFY_MS)?,
            },
            t_verify_by_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speed::estimated_speedup;

    /// Quantiles by hand: 1..=5 → median 3, p25 2, p75 4; four samples interpolate
    /// (p25 of [1, 2, 4, 8] is 1 + 0.75 · 1 = 1.75, the median (2 + 4) / 2, p75 4 + 0.25 · 4).
    #[test]
    fn spread_known_answers() {
        let s = Spread::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!(
            (s.median, s.p25, s.p75, s.min, s.max, s.n),
            (3.0, 2.0, 4.0, 1.0, 5.0, 5)
        );
        let s = Spread::of(&[8.0, 1.0, 4.0, 2.0]).unwrap();
        assert_eq!((s.median, s.p25, s.p75), (3.0, 1.75, 5.0));
        let one = Spread::of(&[0.25]).unwrap();
        assert_eq!((one.median, one.p25, one.p75, one.n), (0.25, 0.25, 0.25, 1));
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[1.0, f64::NAN]), None);
    }

    fn context(prompt: u32, len: u64, draft: &[f64], verify: &[(u32, &[f64])]) -> ContextSamples {
        ContextSamples {
            prompt,
            context_len: len,
            accepted: 1,
            draft_s: draft.to_vec(),
            verify_s: verify.iter().map(|(n, s)| (*n, s.to_vec())).collect(),
        }
    }

    /// Two prompts timed by hand: each cost is the median of its samples pooled over prompts and
    /// contexts, t_verify the one at B; the estimate is `speed::estimated_speedup` over them;
    /// the rows read back to the same inputs and every measured size.
    #[test]
    fn costs_rows_and_estimate_round_trip() {
        let prompts = [
            PromptSamples {
                index: 0,
                decode_step_s: vec![0.020, 0.021, 0.019],
                contexts: vec![
                    context(
                        0,
                        40,
                        &[0.004, 0.005],
                        &[(1, &[0.020, 0.022]), (4, &[0.024, 0.026])],
                    ),
                    context(0, 52, &[0.006], &[(1, &[0.021]), (4, &[0.025])]),
                ],
            },
            PromptSamples {
                index: 3,
                decode_step_s: vec![0.018, 0.030],
                contexts: vec![context(3, 9, &[0.003], &[(1, &[0.019]), (4, &[0.023])])],
            },
        ];
        let b = CostBench::of(&prompts, 4).unwrap();
        // decode: [0.018, 0.019, 0.020, 0.021, 0.030] → 0.020; draft [0.003, 0.004, 0.005,
        // 0.006] → 0.0045; verify(4) [0.023, 0.024, 0.025, 0.026] → 0.0245.
        let c = b.costs();
        assert!((c.t_decode - 0.020).abs() < 1e-15);
        assert!((c.t_draft_round - 0.0045).abs() < 1e-15);
        assert!((c.t_verify - 0.0245).abs() < 1e-15);
        assert_eq!((b.prompts, b.contexts, b.context_len), (2, 3, (9, 52)));
        assert_eq!(
            b.t_verify.iter().map(|v| v.tokens).collect::<Vec<_>>(),
            [1, 4]
        );
        assert_eq!(b.t_verify[0].spread.n, 4);
        // τ = 2.9: 2.9 · 20 / (4.5 + 24.5) = 2.0.
        assert!((estimated_speedup(2.9, &c).unwrap() - 2.0).abs() < 1e-12);

        let rows = b.rows();
        assert!(rows.iter().all(|r| r.source == SOURCE && r.unit == "ms"));
        let decode = rows.iter().find(|r| r.name == T_DECODE_MS).unwrap();
        assert_eq!(decode.count, 5);
        assert!((decode.series.as_ref().unwrap()["p75_ms"].as_f64().unwrap() - 21.0).abs() < 1e-9);
        let back = StoredCostBench::from_rows(&rows).unwrap();
        for (a, w) in [
            (back.costs.t_decode, c.t_decode),
            (back.costs.t_draft_round, c.t_draft_round),
            (back.costs.t_verify, c.t_verify),
        ] {
            assert!((a - w).abs() < 1e-15, "{a} vs {w}");
        }
        let sizes: Vec<u32> = back.t_verify_by_tokens.iter().map(|(n, _)| *n).collect();
        assert_eq!(sizes, [1, 4]);
        assert!((back.t_verify_by_tokens[0].1 - 0.0205).abs() < 1e-15);
        // Rows of the live timings (source `speed`) are not these.
        let live = crate::speed::SpeedSummary::of(&[crate::speed::PromptTiming {
            index: 0,
            greedy_s: 1.0,
            greedy_steps: 10,
            live_s: 1.0,
            rounds: 5,
            round_tokens: 10,
            draft_s: 0.1,
            verify_s: 0.8,
        }])
        .unwrap();
        assert!(StoredCostBench::from_rows(&live.rows(&[], 4)).is_none());
    }

    /// Nothing to summarise: no decode step, no draft round, or no verify pass over B tokens.
    #[test]
    fn incomplete_samples_give_none() {
        let full = PromptSamples {
            index: 0,
            decode_step_s: vec![0.02],
            contexts: vec![context(0, 10, &[0.004], &[(4, &[0.024])])],
        };
        assert!(CostBench::of(std::slice::from_ref(&full), 4).is_some());
        assert!(
            CostBench::of(std::slice::from_ref(&full), 8).is_none(),
            "B not measured"
        );
        let no_decode = PromptSamples {
            decode_step_s: vec![],
            ..full.clone()
        };
        assert!(CostBench::of(&[no_decode], 4).is_none());
        let no_context = PromptSamples {
            contexts: vec![],
            ..full
        };
        assert!(CostBench::of(&[no_context], 4).is_none());
        assert!(CostBench::of(&[], 4).is_none());
    }
}
