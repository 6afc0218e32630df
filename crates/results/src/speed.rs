//! The speed numbers of the verdict (docs/verdict.md), defined once: the cost model's estimated
//! speed-up and the measured one, and the metric rows (source [`SOURCE`]) that store a run's
//! timings so that both can be recomputed from the database.
//!
//! Cost model, batch 1, greedy: speculative decoding spends one draft round and one verify pass
//! over B tokens per round and commits τ tokens per round (bonus included; τ pooled over the
//! prompts: Σ tokens / Σ rounds); plain greedy decoding spends one decode step per token. So
//!
//! ```text
//! speed-up ≈ τ · t_decode / (t_draft_round + t_verify(B))
//! ```
//!
//! The inputs are measured by `draftlens live --baseline` on the backend of the run:
//! `t_decode` over plain greedy decoding of the same prompts (one token per step, KV cache),
//! `t_draft_round` and `t_verify(B)` over live decoding's own rounds. The measured speed-up is
//! Σ greedy decode time / Σ live decode time over the same prompts (each after the target's
//! prefill and first token, which both do alike).
//!
//! The same estimate over costs measured apart from live decoding (`draftlens bench-costs`) reads
//! its inputs from [`crate::cost_bench`].

use crate::store::{MetricRow, MetricScope};
use serde::Serialize;

/// The metric source of the timing rows (reserved: no plugin may write it).
pub const SOURCE: &str = "speed";

/// Run-scope rows: the cost model's inputs (milliseconds) and the measured speed-up.
pub const T_DECODE_MS: &str = "t_decode_ms";
pub const T_DRAFT_ROUND_MS: &str = "t_draft_round_ms";
pub const T_VERIFY_MS: &str = "t_verify_ms";
pub const SPEEDUP_MEASURED: &str = "speedup_measured";
/// Live τ (pooled) of the timed prompts, next to the replayed τ the estimate reads.
pub const TAU_LIVE: &str = "tau_live";
/// Prompt-scope rows: seconds of plain greedy decoding (count: decode steps) and of live
/// decoding (count: verify rounds) of each prompt after its prefill.
pub const GREEDY_DECODE_S: &str = "greedy_decode_s";
pub const LIVE_DECODE_S: &str = "live_decode_s";

/// The cost model's inputs, in seconds, measured on one backend.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CostInputs {
    /// One plain greedy decode step of the target (one token, batch 1, KV cache).
    pub t_decode: f64,
    /// One draft round: the drafter's proposals for one anchor and its context update.
    pub t_draft_round: f64,
    /// One verify pass of the target over B tokens (the anchor token and B − 1 drafts).
    pub t_verify: f64,
}

impl CostInputs {
    /// The speed-up per token committed per round: t_decode / (t_draft_round + t_verify).
    /// `None` unless every input is finite and positive.
    pub fn per_tau(&self) -> Option<f64> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        (ok(self.t_decode) && ok(self.t_draft_round + self.t_verify) && self.t_draft_round >= 0.0)
            .then(|| self.t_decode / (self.t_draft_round + self.t_verify))
    }
}

/// The cost model: τ · t_decode / (t_draft_round + t_verify(B)). `None` when an input is missing
/// or not positive.
pub fn estimated_speedup(tau: f64, c: &CostInputs) -> Option<f64> {
    (tau.is_finite() && tau > 0.0).then_some(())?;
    Some(tau * c.per_tau()?)
}

/// What was timed for one prompt.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PromptTiming {
    /// The run's prompt index (its `prompt:<index>` scope).
    pub index: u32,
    /// Plain greedy decoding after the prefill: seconds and decode steps.
    pub greedy_s: f64,
    pub greedy_steps: u64,
    /// Live decoding after the prefill: seconds, verify rounds, tokens committed by them.
    pub live_s: f64,
    pub rounds: u64,
    pub round_tokens: u64,
    /// Of `live_s`: seconds in draft rounds and in verify passes.
    pub draft_s: f64,
    pub verify_s: f64,
}

/// The run-level timings of a set of prompts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpeedSummary {
    pub costs: CostInputs,
    /// Σ greedy_s / Σ live_s.
    pub speedup_measured: f64,
    /// Σ round_tokens / Σ rounds.
    pub tau_live: f64,
    pub prompts: usize,
    pub rounds: u64,
    pub greedy_steps: u64,
}

impl SpeedSummary {
    /// The summary of `prompts`; `None` without a single timed round and decode step.
    pub fn of(prompts: &[PromptTiming]) -> Option<SpeedSummary> {
        let sum = |f: fn(&PromptTiming) -> f64| prompts.iter().map(f).sum::<f64>();
        let rounds: u64 = prompts.iter().map(|p| p.rounds).sum();
        let steps: u64 = prompts.iter().map(|p| p.greedy_steps).sum();
        let live = sum(|p| p.live_s);
        if rounds == 0 || steps == 0 || live <= 0.0 {
            return None;
        }
        Some(SpeedSummary {
            costs: CostInputs {
                t_decode: sum(|p| p.greedy_s) / steps as f64,
                t_draft_round: sum(|p| p.draft_s) / rounds as f64,
                t_verify: sum(|p| p.verify_s) / rounds as f64,
            },
            speedup_measured: sum(|p| p.greedy_s) / live,
            tau_live: prompts.iter().map(|p| p.round_tokens).sum::<u64>() as f64 / rounds as f64,
            prompts: prompts.len(),
            rounds,
            greedy_steps: steps,
        })
    }

    /// The rows stored with the run (source [`SOURCE`]): the summary at run scope and each
    /// prompt's two decode times at its prompt scope.
    pub fn rows(&self, prompts: &[PromptTiming], block_size: u32) -> Vec<MetricRow> {
        let row = |name: &str,
                   scope: MetricScope,
                   value: f64,
                   count: u64,
                   unit: &str,
                   description: String,
                   higher: bool| MetricRow {
            unit: unit.into(),
            description,
            ..MetricRow::scalar(SOURCE, name, scope, value, count, higher)
        };
        let ms = 1e3;
        let c = &self.costs;
        let mut rows = vec![
            row(T_DECODE_MS, MetricScope::Run, c.t_decode * ms, self.greedy_steps, "ms",
                "one plain greedy decode step of the target at batch 1 (mean over the steps of the timed prompts)".into(), false),
            row(T_DRAFT_ROUND_MS, MetricScope::Run, c.t_draft_round * ms, self.rounds, "ms",
                "one draft round of live decoding: proposals for one anchor and the drafter's context update".into(), false),
            row(T_VERIFY_MS, MetricScope::Run, c.t_verify * ms, self.rounds, "ms",
                format!("one verify pass of the target over B = {block_size} tokens in live decoding"), false),
            row(SPEEDUP_MEASURED, MetricScope::Run, self.speedup_measured, self.prompts as u64, "×",
                "wall time of plain greedy decoding / live speculative decoding, same prompts and backend, batch 1, after the prefill".into(), true),
            row(TAU_LIVE, MetricScope::Run, self.tau_live, self.rounds, "tokens/round",
                "tokens committed per verify round in the timed live decoding (pooled)".into(), true),
        ];
        for p in prompts {
            let scope = MetricScope::Prompt(p.index);
            rows.push(row(
                GREEDY_DECODE_S,
                scope.clone(),
                p.greedy_s,
                p.greedy_steps,
                "s",
                "plain greedy decoding of this prompt after its prefill".into(),
                false,
            ));
            rows.push(row(
                LIVE_DECODE_S,
                scope,
                p.live_s,
                p.rounds,
                "s",
                "live speculative decoding of this prompt after its prefill".into(),
                false,
            ));
        }
        rows
    }
}

/// A run's stored timings, read back from its metric rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredSpeed {
    pub costs: CostInputs,
    pub speedup_measured: Option<f64>,
    pub tau_live: Option<f64>,
    /// Per prompt index: (greedy decode seconds, live decode seconds).
    pub per_prompt: Vec<(u32, f64, f64)>,
}

impl StoredSpeed {
    /// The timings among `rows` (a run's metric rows); `None` when the run has no cost inputs.
    pub fn from_rows(rows: &[MetricRow]) -> Option<StoredSpeed> {
        let run = |name: &str| {
            rows.iter()
                .find(|m| m.source == SOURCE && m.name == name && m.scope == MetricScope::Run)
                .map(|m| m.value)
                .filter(|v| v.is_finite())
        };
        let costs = CostInputs {
            t_decode: run(T_DECODE_MS)? / 1e3,
            t_draft_round: run(T_DRAFT_ROUND_MS)? / 1e3,
            t_verify: run(T_VERIFY_MS)? / 1e3,
        };
        let mut greedy = std::collections::BTreeMap::new();
        let mut live = std::collections::BTreeMap::new();
        for m in rows
            .iter()
            .filter(|m| m.source == SOURCE && m.value.is_finite())
        {
            if let MetricScope::Prompt(i) = m.scope {
                match m.name.as_str() {
                    GREEDY_DECODE_S => greedy.insert(i, m.value),
                    LIVE_DECODE_S => live.insert(i, m.value),
                    _ => None,
                };
            }
        }
        let per_prompt = greedy
            .iter()
            .filter_map(|(i, g)| live.get(i).map(|l| (*i, *g, *l)))
            .collect();
        Some(StoredSpeed {
            costs,
            speedup_measured: run(SPEEDUP_MEASURED),
            tau_live: run(TAU_LIVE),
            per_prompt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-computed case: τ = 3.5, t_decode = 20 ms, t_draft = 4 ms, t_verify(B) = 24 ms:
    /// 3.5 · 20 / (4 + 24) = 70 / 28 = 2.5.
    #[test]
    fn cost_model_known_answer() {
        let c = CostInputs {
            t_decode: 0.020,
            t_draft_round: 0.004,
            t_verify: 0.024,
        };
        assert!((estimated_speedup(3.5, &c).unwrap() - 2.5).abs() < 1e-12);
        // A free drafter and a verify pass as cheap as one decode step: the speed-up is τ.
        let free = CostInputs {
            t_decode: 0.01,
            t_draft_round: 0.0,
            t_verify: 0.01,
        };
        assert!((estimated_speedup(4.0, &free).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(estimated_speedup(0.0, &c), None);
        assert_eq!(estimated_speedup(f64::NAN, &c), None);
        let broken = CostInputs { t_decode: 0.0, ..c };
        assert_eq!(estimated_speedup(3.0, &broken), None);
    }

    /// Two prompts timed by hand: the summary's inputs are sums over steps and rounds, the
    /// measured speed-up a ratio of sums; the rows read back to the same inputs.
    #[test]
    fn summary_and_rows_round_trip() {
        let prompts = [
            PromptTiming {
                index: 0,
                greedy_s: 0.30,
                greedy_steps: 15,
                live_s: 0.20,
                rounds: 5,
                round_tokens: 15,
                draft_s: 0.05,
                verify_s: 0.14,
            },
            PromptTiming {
                index: 3,
                greedy_s: 0.10,
                greedy_steps: 5,
                live_s: 0.10,
                rounds: 3,
                round_tokens: 5,
                draft_s: 0.03,
                verify_s: 0.06,
            },
        ];
        let s = SpeedSummary::of(&prompts).unwrap();
        assert!((s.costs.t_decode - 0.40 / 20.0).abs() < 1e-12);
        assert!((s.costs.t_draft_round - 0.08 / 8.0).abs() < 1e-12);
        assert!((s.costs.t_verify - 0.20 / 8.0).abs() < 1e-12);
        assert!((s.speedup_measured - 0.40 / 0.30).abs() < 1e-12);
        assert!((s.tau_live - 20.0 / 8.0).abs() < 1e-12);
        let rows = s.rows(&prompts, 4);
        let back = StoredSpeed::from_rows(&rows).unwrap();
        for (a, b) in [
            (back.costs.t_decode, s.costs.t_decode),
            (back.costs.t_draft_round, s.costs.t_draft_round),
            (back.costs.t_verify, s.costs.t_verify),
        ] {
            assert!((a - b).abs() < 1e-15);
        }
        assert_eq!(back.per_prompt, vec![(0, 0.30, 0.20), (3, 0.10, 0.10)]);
        assert_eq!(back.speedup_measured, Some(s.speedup_measured));
        assert!(SpeedSummary::of(&[]).is_none());
        assert!(StoredSpeed::from_rows(&[]).is_none());
    }
}
