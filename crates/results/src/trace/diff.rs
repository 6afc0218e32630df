//! `draftlens trace diff` (docs/traces.md §6): an engine's verify rounds beside what the
//! reference drafter does on the same tokens. The caller (the CLI, with the engine) runs the
//! target teacher-forced on the engine's output and the reference drafter at the engine's
//! anchors and along its own chain; this file compares, round by round:
//!
//! - the engine's anchors: a₀ = the prompt length (the prefill token's position), a_{i+1} =
//!   a_i + the tokens round i committed; at each, the reference's tokens(a) = min(A + 1, end − a)
//!   (`docs/metrics.md` §2) against the engine's;
//! - the reference's own replayed chain over the same sequence (its τ on the engine's output);
//! - the positions where the engine's output departs from the target's greedy token there.

use crate::metrics::prompt_chain;
use anyhow::{bail, Result};
use draftlens_records::{round_tokens, RecordBatch, Region, SequenceEnd};
use serde::Serialize;
use std::collections::HashMap;

/// Rounds and departures listed per prompt (the counts cover all of them).
pub const LISTED: usize = 8;

/// One prompt of a trace run with the reference's records on its tokens.
pub struct ReplayedPrompt<'a> {
    pub index: u32,
    pub id: &'a str,
    /// Tokens of the prompt (draftlens's tokenization); the engine's output follows.
    pub prompt_len: usize,
    /// Prompt + the engine's output.
    pub ids: &'a [u32],
    /// Tokens the engine committed per verify round, in decode order.
    pub engine_rounds: &'a [u32],
    /// The reference drafter's blocks on `ids`: at least every engine anchor and its own chain.
    pub records: &'a RecordBatch,
    /// The target's greedy token at each position given the engine's tokens before it
    /// (`target_greedy[t]` for t ≥ 1; the entry at 0 is unused).
    pub target_greedy: &'a [u32],
}

/// A round where the engine and the reference commit different numbers of tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoundDiff {
    /// 0-based round of the engine's decode.
    pub round: usize,
    pub anchor: u32,
    pub engine: u32,
    pub reference: u32,
    /// The tokens the reference commits there: the target's greedy tokens at positions
    /// anchor + 1 ..= anchor + reference, each given the engine's tokens before it (its accepted
    /// drafts are those tokens and its bonus token the next one). Stored for the web's
    /// drill-down; not part of `trace diff --json`, whose shape predates it.
    #[serde(skip_serializing)]
    pub reference_ids: Vec<u32>,
}

/// A position where the engine's token is not the target's greedy one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Departure {
    pub position: usize,
    pub engine_token: u32,
    pub target_token: u32,
}

/// One prompt compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PromptDiff {
    pub index: u32,
    pub id: String,
    /// The engine's rounds and tokens.
    pub rounds: u64,
    pub engine_tokens: u64,
    /// What the reference commits at the engine's anchors, over the same rounds.
    pub reference_tokens: u64,
    /// Rounds where the reference commits more than the engine, and fewer.
    pub rounds_fewer: u64,
    pub rounds_more: u64,
    /// The first such rounds, in decode order.
    pub first_rounds: Vec<RoundDiff>,
    /// The reference's own replayed chain over the engine's output: (tokens, rounds).
    pub reference_chain: (u64, u64),
    pub departures: u64,
    pub first_departures: Vec<Departure>,
}

impl PromptDiff {
    pub fn engine_tau(&self) -> Option<f64> {
        (self.rounds > 0).then(|| self.engine_tokens as f64 / self.rounds as f64)
    }
    pub fn reference_tau(&self) -> Option<f64> {
        let (t, r) = self.reference_chain;
        (r > 0).then(|| t as f64 / r as f64)
    }
}

/// Compares one prompt (see the module doc). An error when the records lack an engine anchor or
/// the engine's rounds do not cover its output.
pub fn diff_prompt(p: &ReplayedPrompt) -> Result<PromptDiff> {
    let n = p.ids.len();
    if p.prompt_len == 0 || p.prompt_len > n || p.target_greedy.len() != n {
        bail!("prompt {}: inconsistent lengths", p.id);
    }
    let end = n as u32 - 1;
    let committed: u64 = p.engine_rounds.iter().map(|&c| c as u64).sum();
    if committed != (n - p.prompt_len) as u64 - 1 {
        bail!(
            "prompt {}: the engine's rounds commit {committed} tokens but its output has {} after the prefill token",
            p.id,
            n - p.prompt_len - 1
        );
    }
    let by_anchor: HashMap<u32, usize> = (0..p.records.num_blocks())
        .filter(|&b| {
            p.records.prompt_index[b] == p.index && p.records.region[b] == Region::Completion as u8
        })
        .map(|b| (p.records.anchor[b], b))
        .collect();
    let (mut reference_tokens, mut fewer, mut more) = (0u64, 0u64, 0u64);
    let mut first_rounds = Vec::new();
    let mut a = p.prompt_len as u32;
    for (round, &engine) in p.engine_rounds.iter().enumerate() {
        let Some(&b) = by_anchor.get(&a) else {
            bail!(
                "prompt {}: no reference block at the engine's anchor {a}",
                p.id
            );
        };
        let reference = round_tokens(a, p.records.accepted_len(b) as u32, SequenceEnd::At(end));
        reference_tokens += reference as u64;
        if reference != engine {
            if reference > engine {
                fewer += 1;
            } else {
                more += 1;
            }
            if first_rounds.len() < LISTED {
                let from = a as usize + 1;
                first_rounds.push(RoundDiff {
                    round,
                    anchor: a,
                    engine,
                    reference,
                    reference_ids: p.target_greedy[from..from + reference as usize].to_vec(),
                });
            }
        }
        a += engine;
    }
    let chain = prompt_chain(p.records, &by_anchor, Some((p.prompt_len as u32, n as u32)));
    let reference_chain = (
        chain.iter().map(|r| r.tokens as u64).sum(),
        chain.len() as u64,
    );
    let mut departures = 0u64;
    let mut first_departures = Vec::new();
    for t in p.prompt_len..n {
        if p.ids[t] != p.target_greedy[t] {
            departures += 1;
            if first_departures.len() < LISTED {
                first_departures.push(Departure {
                    position: t,
                    engine_token: p.ids[t],
                    target_token: p.target_greedy[t],
                });
            }
        }
    }
    Ok(PromptDiff {
        index: p.index,
        id: p.id.to_string(),
        rounds: p.engine_rounds.len() as u64,
        engine_tokens: committed,
        reference_tokens,
        rounds_fewer: fewer,
        rounds_more: more,
        first_rounds,
        reference_chain,
        departures,
        first_departures,
    })
}

/// The engine's anchors of a prompt: where each of its rounds verified (the anchors the caller
/// drafts the reference at).
pub fn engine_anchors(prompt_len: usize, engine_rounds: &[u32]) -> Vec<usize> {
    let mut a = prompt_len;
    engine_rounds
        .iter()
        .map(|&c| {
            let at = a;
            a += c as usize;
            at
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of one prompt (prompt_len 2, 12 tokens y_t = 100 + t) with B = 4, K = 1, where the
    /// drafter accepts `acc(a)` drafts at anchor a (then misses).
    fn records(acc: &dyn Fn(u32) -> usize) -> RecordBatch {
        let mut b = RecordBatch::new(4, 1);
        for a in 2..12u32 {
            b.prompt_index.push(0);
            b.anchor.push(a);
            b.region.push(0);
            for k in 1..=3u32 {
                let valid = a + k < 12;
                b.target.push(if valid { 100 + a + k } else { 0 });
                b.valid.push(valid as u8);
                b.loss_mask.push(1);
                b.draft_ids.push(if (k as usize) <= acc(a) {
                    100 + a + k
                } else {
                    7
                });
                b.draft_logprobs.push(-0.1);
            }
        }
        b
    }

    #[test]
    fn rounds_compared_at_the_engine_anchors() {
        let ids: Vec<u32> = (0..12).map(|t| 100 + t).collect();
        let mut greedy = ids.clone();
        greedy[7] = 55; // the engine's token at 7 is not the target's greedy one
                        // The reference accepts 3 everywhere: at anchors 2, 6 it commits 4; at 10, 1 (the end).
        let rec = records(&|_| 3);
        // The engine committed 4 at anchor 2, 1 at 6 (3 fewer than the reference) and 4 at 7:
        // the 9 tokens after the prefill one (positions 3..=11).
        let engine = [4, 1, 4];
        assert_eq!(engine_anchors(2, &engine), [2, 6, 7]);
        let d = diff_prompt(&ReplayedPrompt {
            index: 0,
            id: "p0",
            prompt_len: 2,
            ids: &ids,
            engine_rounds: &engine,
            records: &rec,
            target_greedy: &greedy,
        })
        .unwrap();
        // Anchor 6: reference min(4, 11 − 6) = 4 vs engine 1; anchor 7: min(4, 4) = 4 = engine.
        assert_eq!(
            d.first_rounds,
            [RoundDiff {
                round: 1,
                anchor: 6,
                engine: 1,
                reference: 4,
                // Positions 7..=10: the target's greedy tokens, 55 where the engine departs.
                reference_ids: vec![55, 108, 109, 110],
            }]
        );
        assert_eq!((d.rounds, d.engine_tokens, d.reference_tokens), (3, 9, 12));
        assert_eq!((d.rounds_fewer, d.rounds_more), (1, 0));
        // Its own chain: 2 → 6 → 10: 4 + 4 + 1 = 9 tokens in 3 rounds.
        assert_eq!(d.reference_chain, (9, 3));
        assert_eq!(d.engine_tau(), Some(3.0));
        assert_eq!(d.reference_tau(), Some(3.0));
        assert_eq!(
            d.first_departures,
            [Departure {
                position: 7,
                engine_token: 107,
                target_token: 55
            }]
        );
    }

    #[test]
    fn a_missing_anchor_or_rounds_that_do_not_cover_the_output_are_errors() {
        let ids: Vec<u32> = (0..12).map(|t| 100 + t).collect();
        let rec = records(&|_| 0);
        let p = |engine: &'static [u32]| ReplayedPrompt {
            index: 0,
            id: "p0",
            prompt_len: 2,
            ids: &ids,
            engine_rounds: engine,
            records: &rec,
            target_greedy: &ids,
        };
        let err = diff_prompt(&p(&[4, 4])).unwrap_err().to_string();
        assert!(
            err.contains("commit 8 tokens but its output has 9"),
            "{err}"
        );
        let keep: Vec<usize> = (0..rec.num_blocks())
            .filter(|&b| rec.anchor[b] != 6)
            .collect();
        let sparse = rec.select(&keep);
        let q = ReplayedPrompt {
            records: &sparse,
            ..p(&[4, 5])
        };
        let err = diff_prompt(&q).unwrap_err().to_string();
        assert!(
            err.contains("no reference block at the engine's anchor 6"),
            "{err}"
        );
    }
}
