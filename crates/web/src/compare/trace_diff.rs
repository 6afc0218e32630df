//! A serving engine's run against its reference drafter (`draftlens trace diff`, docs/traces.md
//! §6), defined once for the CLI and the web: the run-level summary of the per-prompt
//! comparisons ([`draftlens_results::trace::diff::PromptDiff`]) — engine τ against the
//! reference's τ on the same tokens with their paired interval over prompts, the tokens the
//! engine loses per round, the departures from the target's greedy tokens, the verdict — its
//! text, the corrections the import applied, and the compare page's and drill-down's view
//! models over the diffs `trace diff` stored.
//!
//! The intervals are the compare page's ([`paired_interval`]: a paired t-interval below
//! [`MIN_SHARED_PROMPTS`] prompts, a BCa bootstrap from there on), seeded by the trace run's uid,
//! so the CLI, the page and a stored diff read back give the same numbers.

use super::DEFAULT_REPS;
use crate::stats::{paired_interval, Interval, Resamples, Rng, MIN_SHARED_PROMPTS};
use anyhow::Result;
use draftlens_results::store::{RunInfo, Store, TraceDiffInfo};
use draftlens_results::trace::diff::PromptDiff;
use draftlens_results::trace::{is_trace_origin, StoredCorrection};
use serde::Serialize;

/// A difference (reference − engine) with its paired 95% interval over prompts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffDelta {
    pub value: f64,
    pub interval: Option<Interval>,
}

/// The run-level comparison (the `summary` of `trace diff --json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffSummary {
    /// Prompts with at least one round.
    pub prompts: usize,
    pub rounds: u64,
    pub rounds_fewer: u64,
    pub rounds_more: u64,
    pub engine_tau_pooled: Option<f64>,
    pub reference_tau_pooled: Option<f64>,
    /// Reference τ (its own chain on the engine's output) − engine τ, pooled.
    pub tau_delta: Option<DiffDelta>,
    /// Tokens the reference commits at the engine's anchors − the engine's, per engine round.
    pub tokens_lost_per_round: Option<DiffDelta>,
    pub departures: u64,
    pub prompts_departing: usize,
    pub verdict: String,
}

/// The run-level comparison: paired intervals over the prompts with rounds, and the verdict
/// (none below [`MIN_SHARED_PROMPTS`], as on the compare page). `seed`: the trace run's uid.
pub fn summarize(diffs: &[PromptDiff], seed: &str) -> DiffSummary {
    let with: Vec<&PromptDiff> = diffs.iter().filter(|d| d.rounds > 0).collect();
    let col =
        |f: &dyn Fn(&PromptDiff) -> u64| -> Vec<f64> { with.iter().map(|d| f(d) as f64).collect() };
    let (eng_tok, eng_rounds) = (col(&|d| d.engine_tokens), col(&|d| d.rounds));
    let (ref_tok, ref_rounds) = (col(&|d| d.reference_chain.0), col(&|d| d.reference_chain.1));
    let at_anchors = col(&|d| d.reference_tokens);
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let ratio = |n: &[f64], d: &[f64]| (sum(d) > 0.0).then(|| sum(n) / sum(d));
    let rs = Resamples::new(with.len(), DEFAULT_REPS, &mut Rng::from_str_seed(seed));
    let delta = |na: &[f64], da: &[f64], nb: &[f64], db: &[f64]| {
        Some(DiffDelta {
            value: ratio(nb, db)? - ratio(na, da)?,
            interval: paired_interval(&rs, na, da, nb, db),
        })
    };
    let tau_delta = delta(&eng_tok, &eng_rounds, &ref_tok, &ref_rounds);
    let lost = delta(&eng_tok, &eng_rounds, &at_anchors, &eng_rounds);
    let departing = diffs.iter().filter(|d| d.departures > 0).count();
    let verdict = match &lost {
        None => "no verdict: no prompt has a verify round".to_string(),
        Some(_) if with.len() < MIN_SHARED_PROMPTS => format!(
            "no verdict: {} prompts, a verdict needs at least {MIN_SHARED_PROMPTS} (docs/metrics.md §8)",
            with.len()
        ),
        Some(DiffDelta { value, interval: Some(i) }) => {
            let ci = format!("95% CI [{:+.3}, {:+.3}], {} over {} prompts", i.lo, i.hi, i.method.label(), with.len());
            if i.lo > 0.0 {
                format!("the integration loses {value:.3} tokens per round against the reference drafter ({ci})")
            } else if i.hi < 0.0 {
                format!("the engine commits {:.3} tokens per round more than the reference drafter ({ci})", -value)
            } else {
                format!("consistent: {value:+.3} tokens per round ({ci} includes 0)")
            }
        }
        Some(DiffDelta { interval: None, .. }) => "no verdict: no interval".to_string(),
    };
    DiffSummary {
        prompts: with.len(),
        rounds: sum(&eng_rounds) as u64,
        rounds_fewer: diffs.iter().map(|d| d.rounds_fewer).sum(),
        rounds_more: diffs.iter().map(|d| d.rounds_more).sum(),
        engine_tau_pooled: ratio(&eng_tok, &eng_rounds),
        reference_tau_pooled: ratio(&ref_tok, &ref_rounds),
        tau_delta,
        tokens_lost_per_round: lost,
        departures: diffs.iter().map(|d| d.departures).sum(),
        prompts_departing: departing,
        verdict,
    }
}

/// A τ as the summary shows it.
pub fn tau_text(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.4}"))
}

/// A difference with its interval and method as the summary shows it.
pub fn delta_text(d: &Option<DiffDelta>) -> String {
    match d {
        None => "–".to_string(),
        Some(DiffDelta { value, interval }) => match interval {
            Some(i) => format!(
                "{value:+.4} [{:+.4}, {:+.4}] ({})",
                i.lo,
                i.hi,
                i.method.label()
            ),
            None => format!("{value:+.4}"),
        },
    }
}

/// The counts line: prompts, engine rounds, rounds where the reference commits more and fewer.
fn rounds_text(s: &DiffSummary) -> String {
    format!(
        "{} prompts, {} engine rounds: the reference commits more in {}, fewer in {}",
        s.prompts, s.rounds, s.rounds_fewer, s.rounds_more
    )
}

/// The departures line (None when the engine's output is the target's greedy one throughout).
fn departures_text(s: &DiffSummary) -> Option<String> {
    (s.departures > 0).then(|| {
        format!(
            "the engine's output departs from the target's greedy token at {} positions in {} prompts",
            s.departures, s.prompts_departing
        )
    })
}

/// The heading of the corrections the import applied.
const CORRECTIONS_HEADING: &str = "corrections applied at import";

/// The summary's lines as `trace diff` prints them after its first line (each without its
/// indentation): the counts, τ, the tokens lost per round, the departures, the verdict and
/// the corrections the import applied (`corrections`: the trace run's, from its configuration).
pub fn summary_lines(s: &DiffSummary, corrections: &[StoredCorrection]) -> Vec<String> {
    let mut out = vec![
        rounds_text(s),
        format!(
            "τ engine {} · reference {} on the same tokens · Δ {}",
            tau_text(s.engine_tau_pooled),
            tau_text(s.reference_tau_pooled),
            delta_text(&s.tau_delta)
        ),
        format!(
            "tokens lost per engine round {}",
            delta_text(&s.tokens_lost_per_round)
        ),
    ];
    out.extend(departures_text(s));
    out.push(s.verdict.clone());
    if corrections.is_empty() {
        out.push(format!("{CORRECTIONS_HEADING}: none"));
    } else {
        out.push(format!("{CORRECTIONS_HEADING}:"));
        out.extend(corrections.iter().map(|c| format!("  {}", c.line())));
    }
    out
}

/// One stored diff of a compared trace run, summarised (the compare page's panel).
#[derive(Clone, Debug, Serialize)]
pub struct TraceDiffSection {
    /// Index of the trace run among the comparison's runs.
    pub run: usize,
    pub diff: TraceDiffInfo,
    pub summary: DiffSummary,
    pub corrections: Vec<StoredCorrection>,
    /// Compared runs of the same drafter weights: draftlens's own runs of the reference.
    pub reference_runs: Vec<usize>,
}

/// The stored diffs of the compared trace runs, newest first per run.
pub fn of_runs(store: &Store, runs: &[RunInfo]) -> Result<Vec<TraceDiffSection>> {
    let mut out = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        if !is_trace_origin(&r.origin) {
            continue;
        }
        for info in store.trace_diffs(r.id)? {
            let Some((info, prompts)) = store.trace_diff(info.id)? else {
                continue; // replaced between the two reads
            };
            let reference_runs = (0..runs.len())
                .filter(|&j| j != i && runs[j].drafter_sha256 == info.drafter_sha256)
                .collect();
            out.push(TraceDiffSection {
                run: i,
                summary: summarize(&prompts, &r.uid),
                corrections: StoredCorrection::of_config(&r.config),
                diff: info,
                reference_runs,
            });
        }
    }
    Ok(out)
}

/// A round where the engine and the reference commit different numbers of tokens.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrillRound {
    /// 0-based round of the engine's decode.
    pub round: usize,
    /// Where it verified: the position (in prompt + output) of the token the round follows.
    pub anchor: u32,
    pub engine: u32,
    pub reference: u32,
    /// The tokens the engine committed (the run's output after the anchor).
    pub engine_ids: Vec<u32>,
    /// The tokens the reference commits there (the target's greedy ones on the engine's tokens).
    pub reference_ids: Vec<u32>,
}

/// A prompt with rounds that differ.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrillPrompt {
    pub index: u32,
    pub id: String,
    pub prompt_len: u32,
    pub rounds: u64,
    pub rounds_fewer: u64,
    pub rounds_more: u64,
    /// The first rounds that differ (at most `trace::diff::LISTED`), in decode order.
    pub listed: Vec<DrillRound>,
    pub departures: u64,
    /// The first positions where the engine's token is not the target's greedy one.
    pub departure_positions: Vec<usize>,
}

/// The drill-down of one stored diff: its summary and the prompts whose rounds differ, in
/// prompt order.
#[derive(Clone, Debug, Serialize)]
pub struct DrillDown {
    pub diff: TraceDiffInfo,
    pub summary: DiffSummary,
    pub corrections: Vec<StoredCorrection>,
    pub prompts: Vec<DrillPrompt>,
    /// Every diff stored for the run (this one included), newest first.
    pub diffs: Vec<TraceDiffInfo>,
}

/// The drill-down of diff `diff` of trace run `run`; `None` when the run has no such diff
/// (`diff` None: its newest).
pub fn drill_down(store: &Store, run: &RunInfo, diff: Option<i64>) -> Result<Option<DrillDown>> {
    let diffs = store.trace_diffs(run.id)?;
    let Some(id) = diff.or(diffs.first().map(|d| d.id)) else {
        return Ok(None);
    };
    let Some((info, prompts)) = store.trace_diff(id)? else {
        return Ok(None);
    };
    if info.run_id != run.id {
        return Ok(None);
    }
    let mut listed = Vec::new();
    for p in prompts.iter().filter(|p| !p.first_rounds.is_empty()) {
        let Some(stored) = store.prompt(run.id, p.index)? else {
            anyhow::bail!(
                "run {}: the diffed prompt {} is not stored",
                run.id,
                p.index
            )
        };
        let engine_ids = |from: u32, n: u32| -> Vec<u32> {
            let from = from as usize + 1;
            let to = (from + n as usize).min(stored.token_ids.len());
            stored.token_ids.get(from..to).unwrap_or_default().to_vec()
        };
        listed.push(DrillPrompt {
            index: p.index,
            id: p.id.clone(),
            prompt_len: stored.prompt_len,
            rounds: p.rounds,
            rounds_fewer: p.rounds_fewer,
            rounds_more: p.rounds_more,
            listed: p
                .first_rounds
                .iter()
                .map(|r| DrillRound {
                    round: r.round,
                    anchor: r.anchor,
                    engine: r.engine,
                    reference: r.reference,
                    engine_ids: engine_ids(r.anchor, r.engine),
                    reference_ids: r.reference_ids.clone(),
                })
                .collect(),
            departures: p.departures,
            departure_positions: p.first_departures.iter().map(|d| d.position).collect(),
        });
    }
    Ok(Some(DrillDown {
        summary: summarize(&prompts, &run.uid),
        corrections: StoredCorrection::of_config(&run.config),
        diff: info,
        prompts: listed,
        diffs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_results::trace::diff::RoundDiff;

    /// A prompt of `rounds` engine rounds of `engine` tokens each where the reference commits
    /// `reference` at every anchor and along its own chain.
    fn prompt(index: u32, rounds: u64, engine: u64, reference: u64) -> PromptDiff {
        PromptDiff {
            index,
            id: format!("p{index}"),
            rounds,
            engine_tokens: rounds * engine,
            reference_tokens: rounds * reference,
            rounds_fewer: if reference > engine { rounds } else { 0 },
            rounds_more: if reference < engine { rounds } else { 0 },
            first_rounds: Vec::<RoundDiff>::new(),
            // Its own chain: `reference` tokens per round.
            reference_chain: (rounds * reference, rounds),
            departures: 0,
            first_departures: vec![],
        }
    }

    #[test]
    fn identical_rounds_are_consistent_and_a_loss_is_named() {
        // 24 prompts, the engine committing what the reference does: Δ 0 with a [0, 0] BCa.
        let same: Vec<PromptDiff> = (0..24).map(|i| prompt(i, 4 + i as u64 % 3, 2, 2)).collect();
        let s = summarize(&same, "uid");
        assert_eq!((s.prompts, s.rounds_fewer, s.rounds_more), (24, 0, 0));
        assert_eq!(s.engine_tau_pooled, Some(2.0));
        assert_eq!(s.reference_tau_pooled, Some(2.0));
        let lost = s.tokens_lost_per_round.clone().unwrap();
        assert_eq!(lost.value, 0.0);
        assert!(
            s.verdict
                .starts_with("consistent: +0.000 tokens per round (95% CI [")
                && s.verdict
                    .ends_with("BCa bootstrap over 24 prompts includes 0)"),
            "{}",
            s.verdict
        );

        // Half the prompts lose one token in every round (engine 2, reference 3): per engine
        // round the reference commits Σ(3 − 2)·rounds / Σ rounds over the lossy half more.
        let lossy: Vec<PromptDiff> = (0..24)
            .map(|i| prompt(i, 4 + i as u64 % 3, 2, if i % 2 == 0 { 3 } else { 2 }))
            .collect();
        let s = summarize(&lossy, "uid");
        let rounds: u64 = (0..24u64).map(|i| 4 + i % 3).sum();
        let lost_rounds: u64 = (0..24u64).filter(|i| i % 2 == 0).map(|i| 4 + i % 3).sum();
        let expected = lost_rounds as f64 / rounds as f64;
        let lost = s.tokens_lost_per_round.clone().unwrap();
        assert!(
            (lost.value - expected).abs() < 1e-12,
            "{} vs {expected}",
            lost.value
        );
        assert!(lost.interval.unwrap().lo > 0.0);
        assert!(
            s.verdict.starts_with(&format!(
                "the integration loses {expected:.3} tokens per round"
            )),
            "{}",
            s.verdict
        );
        assert_eq!(s.rounds_fewer, lost_rounds);
        // The same seed gives the same interval; the summary is a pure function of its input.
        assert_eq!(summarize(&lossy, "uid"), s);
    }

    #[test]
    fn below_twenty_prompts_there_is_no_verdict_and_the_lines_say_so() {
        let few: Vec<PromptDiff> = (0..5).map(|i| prompt(i, 4, 2, 3)).collect();
        let s = summarize(&few, "uid");
        assert_eq!(
            s.verdict,
            "no verdict: 5 prompts, a verdict needs at least 20 (docs/metrics.md §8)"
        );
        assert_eq!(
            s.tokens_lost_per_round
                .as_ref()
                .unwrap()
                .interval
                .unwrap()
                .method,
            crate::stats::IntervalMethod::PairedT
        );
        let c = StoredCorrection {
            name: "bonus-token".into(),
            description: "each round also commits the target's own token".into(),
            effect: draftlens_results::trace::normalise::Effect {
                requests: 5,
                rounds: 20,
                tokens: 20,
            },
        };
        let lines = summary_lines(&s, &[c.clone()]);
        assert_eq!(
            lines[0],
            "5 prompts, 20 engine rounds: the reference commits more in 20, fewer in 0"
        );
        assert!(
            lines[1]
                .starts_with("τ engine 2.0000 · reference 3.0000 on the same tokens · Δ +1.0000 ["),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].starts_with("tokens lost per engine round +1.0000 ["),
            "{}",
            lines[2]
        );
        assert_eq!(lines[3], s.verdict);
        assert_eq!(lines[4], "corrections applied at import:");
        assert_eq!(
            lines[5],
            "  bonus-token                 5 requests      20 rounds       20 tokens  each round also commits the target's own token"
        );
        assert_eq!(
            summary_lines(&s, &[]).last().unwrap(),
            "corrections applied at import: none"
        );
        // No prompt with a round: no τ, no verdict.
        assert_eq!(
            summarize(&[], "uid").verdict,
            "no verdict: no prompt has a verify round"
        );
    }
}
