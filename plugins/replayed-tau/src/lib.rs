//! Replayed τ: the chain of anchors a real greedy speculative decode visits, instead of every
//! anchor uniformly. Per prompt: a₀ = its first completion anchor, a_{i+1} = a_i + A(a_i) + 1
//! (the accepted drafts plus the bonus token), until the chain leaves the stored anchors.
//! τ of the replay = tokens produced / verify rounds along that chain. The chain and the tokens of
//! each round come from `draftlens_records::replay`, the function the native metrics and the web
//! UI call (`docs/metrics.md` §3): the last round of a sequence yields only the tokens left, its
//! bonus token counts only when the sequence has a position for it. A plugin does not receive the
//! sequence length: the end is where the blocks cut by it stop being valid (a block with fewer
//! valid positions than B−1); a prompt without such a block has no known end and every round
//! counts A + 1.
//!
//! The replay needs a block for every completion anchor it lands on. A prompt whose chain lands
//! on a missing anchor inside its stored range (anchors were subsampled) cannot be replayed: it is
//! left out, counted in `replayed_prompts_incomplete`, and logged.

use std::collections::BTreeMap;

use draftlens_plugin_sdk::records::{replay, MissingAnchor, SequenceEnd};
use draftlens_plugin_sdk::{
    export_metric, log, Accumulator, Batch, Inputs, Level, Metadata, Metric, MetricSpec,
    MetricValue, Params, PluginError, Region,
};

pub struct ReplayedTau;

pub struct Acc {
    /// Per prompt: completion anchor → accepted length A.
    anchors: BTreeMap<u32, BTreeMap<u32, u32>>,
    /// Per prompt: the last position of the sequence, from the blocks the sequence end cuts
    /// (anchor + valid positions).
    ends: BTreeMap<u32, u32>,
}

impl Metric for ReplayedTau {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "replayed-tau".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "tau along the anchors a greedy decode visits: a0 = first completion anchor, \
                          a(i+1) = a(i) + A(a(i)) + 1"
                .into(),
            metrics: vec![
                MetricSpec::new(
                    "replayed_tau_pooled",
                    "tokens",
                    "tokens / verify rounds over the replayed chains of all prompts (bonus included, none past the sequence end)",
                    true,
                ),
                MetricSpec::new(
                    "replayed_tau_macro",
                    "tokens",
                    "mean over prompts of each replayed chain's tokens / rounds (count = prompts)",
                    true,
                ),
                MetricSpec::new(
                    "replayed_rounds",
                    "rounds",
                    "verify rounds per prompt along the replayed chain, mean over prompts (count = prompts)",
                    false,
                ),
                MetricSpec::new(
                    "replayed_prompts_incomplete",
                    "prompts",
                    "prompts left out because their chain landed on an anchor without a stored block \
                     (count = prompts with completion anchors)",
                    false,
                ),
            ],
            params: vec![],
            // Only the drafter's top-1 is read: the host sends 1 candidate id per position.
            inputs: Inputs::TOP1,
        }
    }

    fn begin(_params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc {
            anchors: BTreeMap::new(),
            ends: BTreeMap::new(),
        })
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError> {
        for b in 0..batch.num_blocks() {
            if batch.region_of(b) != Region::Completion {
                continue;
            }
            let a = batch.accepted_len(b) as u32;
            let prompt = batch.prompt_index[b];
            let anchor = batch.anchor[b];
            if let Some(cut) = batch.cut_end(b) {
                let end = self.ends.entry(prompt).or_insert(0);
                *end = (*end).max(cut);
            }
            if self
                .anchors
                .entry(prompt)
                .or_default()
                .insert(anchor, a)
                .is_some()
            {
                return Err(PluginError::InvalidBatch(format!(
                    "prompt {prompt} has two blocks at anchor {anchor}"
                )));
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        let mut tokens = 0u64;
        let mut rounds = 0u64;
        let mut macro_sum = 0.0f64;
        let mut rounds_sum = 0.0f64;
        let mut complete = 0u64;
        let mut incomplete = Vec::new();
        for (&prompt, anchors) in &self.anchors {
            let (&first, _) = anchors
                .first_key_value()
                .expect("prompts enter with a block");
            let (&last_anchor, _) = anchors.last_key_value().expect("non-empty");
            let end = match self.ends.get(&prompt) {
                Some(&e) => SequenceEnd::At(e),
                None => SequenceEnd::Unknown { last_anchor },
            };
            match replay(first, end, |a| anchors.get(&a).copied()) {
                // Nothing left to produce after the first anchor: no round to count.
                Ok(chain) if chain.is_empty() => {}
                Ok(chain) => {
                    let t: u64 = chain.iter().map(|r| r.tokens as u64).sum();
                    let r = chain.len() as u64;
                    tokens += t;
                    rounds += r;
                    macro_sum += t as f64 / r as f64;
                    rounds_sum += r as f64;
                    complete += 1;
                }
                Err(MissingAnchor(missing)) => incomplete.push((prompt, missing)),
            }
        }
        if let Some(&(prompt, missing)) = incomplete.first() {
            log(
                Level::Warn,
                &format!(
                    "replayed tau: {} prompt(s) skipped because anchors are missing (e.g. prompt {prompt} has no \
                     block at anchor {missing}); the replay needs a block for every completion anchor",
                    incomplete.len()
                ),
            );
        }
        let seen = self.anchors.len() as u64;
        Ok(vec![
            MetricValue::ratio("replayed_tau_pooled", tokens as f64, rounds),
            MetricValue::ratio("replayed_tau_macro", macro_sum, complete),
            MetricValue::ratio("replayed_rounds", rounds_sum, complete),
            // Of no prompt, none is incomplete: undefined (NaN with count 0, as the host requires).
            MetricValue::new(
                "replayed_prompts_incomplete",
                if seen == 0 {
                    f64::NAN
                } else {
                    incomplete.len() as f64
                },
                seen,
            ),
        ])
    }
}

export_metric!(ReplayedTau);

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_plugin_sdk::testdata::{chunks, metric, oracle, random, Shape};
    use draftlens_plugin_sdk::{
        evaluate, evaluate_chunks, take_native_logs, OwnedBatch, PositionSpec,
    };

    /// B = 4 (P = 3), K = 1, block at `anchor` with accepted length `a` (all positions valid).
    fn push(b: &mut OwnedBatch, prompt: u32, anchor: u32, a: usize) {
        let ps: Vec<PositionSpec> = (0..3)
            .map(|i| PositionSpec {
                target: Some(1),
                loss_mask: true,
                draft: vec![(if i < a { 1 } else { 2 }, -0.1)],
                target_top: None,
            })
            .collect();
        b.push_block(prompt, anchor, Region::Completion, &ps);
    }

    #[test]
    fn hand_built_chain() {
        // Prompt 0, anchors 10..=19 with A: 10→2, 13→0, 14→3, 18→1 (others 3, never visited).
        // Chain: 10 (3 tok) → 13 (1) → 14 (4) → 18 (2) → 20 > 19: 10 tokens in 4 rounds.
        let mut b = OwnedBatch::new(4, 1);
        let a_of = |a: u32| match a {
            10 => 2,
            13 => 0,
            14 => 3,
            18 => 1,
            _ => 3,
        };
        for a in 10..20 {
            push(&mut b, 0, a, a_of(a));
        }
        // Prompt 1: anchors 5..=7 all A = 0: 3 rounds, 3 tokens.
        for a in 5..8 {
            push(&mut b, 1, a, 0);
        }
        let vs = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap();
        let pooled = metric(&vs, "replayed_tau_pooled");
        assert_eq!((pooled.value, pooled.count), (13.0 / 7.0, 7));
        let m = metric(&vs, "replayed_tau_macro");
        assert_eq!((m.value, m.count), ((2.5 + 1.0) / 2.0, 2));
        assert_eq!(metric(&vs, "replayed_rounds").value, 3.5);
        assert_eq!(metric(&vs, "replayed_prompts_incomplete").value, 0.0);
    }

    #[test]
    fn chunk_boundaries_inside_a_prompt_do_not_matter() {
        let b = random(4, &Shape::new(6, 2, 5, 3, 60), 0.7, 0.1);
        let one = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap();
        let parts = chunks(&b, 23);
        assert_eq!(
            one,
            evaluate_chunks::<ReplayedTau>(&[], parts.iter().map(|c| c.as_batch())).unwrap()
        );
        // Replayed τ is computed from the same A values as the uniform τ, along a sub-chain.
        assert!(metric(&one, "replayed_tau_pooled").value >= 1.0);
    }

    #[test]
    fn oracle_replay_jumps_a_full_block() {
        // 7 prompt tokens, 100 completion tokens (positions 7..=106, anchors 7..=106), B = 16:
        // the chain visits 7, 23, 39, 55, 71, 87, 103 → 6 × 16 tokens + the last block at 103,
        // whose 3 valid positions are the last 3 tokens: no bonus past the end → 3. The 99
        // tokens after the first completion token in 7 rounds, as a greedy decode produces them.
        let o = oracle(&Shape::new(16, 3, 2, 7, 100));
        let vs = evaluate::<ReplayedTau>(&[], &o.as_batch()).unwrap();
        let pooled = metric(&vs, "replayed_tau_pooled");
        assert_eq!(pooled.count, 14);
        assert_eq!(pooled.value, 2.0 * 99.0 / 14.0);
        // 97 completion tokens: 96 after the first = 6 full rounds of 16, τ = B exactly.
        let o = oracle(&Shape::new(16, 3, 2, 7, 97));
        let vs = evaluate::<ReplayedTau>(&[], &o.as_batch()).unwrap();
        let pooled = metric(&vs, "replayed_tau_pooled");
        assert_eq!((pooled.value, pooled.count), (16.0, 12));
    }

    /// B = 4 (P = 3), K = 1, block at `anchor` whose first `valid` positions are inside the
    /// sequence, accepted length `a` ≤ `valid`.
    fn push_cut(b: &mut OwnedBatch, prompt: u32, anchor: u32, valid: usize, a: usize) {
        let ps: Vec<PositionSpec> = (0..3)
            .map(|i| PositionSpec {
                target: (i < valid).then_some(1),
                loss_mask: i < valid,
                draft: vec![(if i < a { 1 } else { 2 }, -0.1)],
                target_top: None,
            })
            .collect();
        b.push_block(prompt, anchor, Region::Completion, &ps);
    }

    #[test]
    fn the_last_round_has_no_bonus_past_the_sequence_end() {
        // Sequence positions ..=12 (end 12), anchors 5..=11 as draftlens stores them (the last
        // anchor has one valid position). Chain: 5 (A = 3, 4 tokens) → 9 (A = 2: the drafts at
        // 10, 11 accepted, the bonus is 12) → 12 = end. 7 tokens in 2 rounds.
        let mut b = OwnedBatch::new(4, 1);
        for a in 5..12u32 {
            let valid = (12 - a).min(3) as usize;
            let acc = match a {
                5 => 3,
                9 => 2,
                _ => 0,
            };
            push_cut(&mut b, 0, a, valid, acc);
        }
        let vs = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap();
        let pooled = metric(&vs, "replayed_tau_pooled");
        assert_eq!((pooled.value, pooled.count), (3.5, 2));
        // Chain 5 (A = 3) → 9 (A = 3: 10, 11, 12 accepted, no position left for a bonus): 4 + 3.
        let mut b = OwnedBatch::new(4, 1);
        for a in 5..12u32 {
            let valid = (12 - a).min(3) as usize;
            let acc = if a == 5 || a == 9 { valid } else { 0 };
            push_cut(&mut b, 0, a, valid, acc);
        }
        let vs = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap();
        let pooled = metric(&vs, "replayed_tau_pooled");
        assert_eq!((pooled.value, pooled.count), (3.5, 2));
        // Only the last anchor, at the end: nothing to produce, the prompt is not counted.
        let mut b = OwnedBatch::new(4, 1);
        push_cut(&mut b, 0, 12, 0, 0);
        let vs = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap();
        assert_eq!(metric(&vs, "replayed_tau_macro").count, 0);
    }

    #[test]
    fn missing_anchors_are_reported() {
        let mut b = OwnedBatch::new(4, 1);
        // Chain 0 → 1 → (2 missing) although anchor 3 exists.
        push(&mut b, 0, 0, 0);
        push(&mut b, 0, 1, 0);
        push(&mut b, 0, 3, 0);
        push(&mut b, 1, 0, 3);
        take_native_logs();
        let vs = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap();
        let inc = metric(&vs, "replayed_prompts_incomplete");
        assert_eq!((inc.value, inc.count), (1.0, 2));
        assert_eq!(metric(&vs, "replayed_tau_pooled").value, 4.0);
        let logs = take_native_logs();
        assert!(
            logs.iter()
                .any(|(l, m)| *l == Level::Warn && m.contains("prompt 0 has no block at anchor 2")),
            "{logs:?}"
        );
    }

    #[test]
    fn duplicate_anchor_is_an_error() {
        let mut b = OwnedBatch::new(4, 1);
        push(&mut b, 0, 0, 0);
        push(&mut b, 0, 0, 1);
        let e = evaluate::<ReplayedTau>(&[], &b.as_batch()).unwrap_err();
        assert!(
            e.to_string()
                .contains("prompt 0 has two blocks at anchor 0"),
            "{e}"
        );
    }
}
