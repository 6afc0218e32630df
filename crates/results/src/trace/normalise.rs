//! Each engine's counting convention turned into draftlens's definition of τ (docs/metrics.md
//! §2): a verify round commits its accepted drafts plus the bonus token, never a token past the
//! end of the output; the prefill token (produced by the prompt's forward pass) is no round's;
//! τ = tokens committed / verify rounds. Every change made to an engine's counts is a named
//! [`Correction`], counted per run so the report says what was done (docs/traces.md).
//!
//! The order of the steps is the rule:
//! 1. the engine's counts as tokens committed per round ([`Correction::BonusToken`] where it
//!    counts accepted drafts; [`Correction::PrefillToken`] where its own τ counts the prefill
//!    token; [`Correction::OneDraftTooMany`] when asked);
//! 2. every round within the block: 1 ≤ tokens ≤ B (γ drafts and the bonus), else an error;
//! 3. the output cut after its first end-of-generation token ([`Correction::TokensAfterEos`]);
//! 4. the rounds fitted to the output: a round reaching past its end is trimmed and rounds
//!    after it dropped ([`Correction::EosInAcceptedBlock`], or `TokensAfterEos` when step 3 cut
//!    the output); tokens no round committed are steps the engine did not record
//!    ([`Correction::UndraftedSteps`]) where its convention says so, else an error.

use super::{EngineCounts, EngineRecord, RoundOrder, TraceRequest};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// A change draftlens makes to an engine's counts to reach its definition of τ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Correction {
    /// The engine counts accepted drafts; each round also commits the target's own token after
    /// them (vLLM `per_step_accepted`, SGLang's histogram, llama.cpp `draft_n_accepted`).
    BonusToken,
    /// The engine's τ counts the first output token, which the prompt's forward pass produced and
    /// no verify round did (SGLang `completion_tokens / spec_verify_ct`, sgl-project/sglang #3152).
    PrefillToken,
    /// A round counted accepted drafts past the end of the output (an end-of-generation token or
    /// the length limit inside the accepted block): trimmed to the output
    /// (vllm-project/vllm #56101).
    EosInAcceptedBlock,
    /// The output runs on after an end-of-generation token (sgl-project/sglang #39826): cut after
    /// the first one, with the rounds that committed the tokens after it.
    TokensAfterEos,
    /// The engine counts one draft token too many per step (lightseekorg/tokenspeed #1443): one
    /// token less per round (`--drafts-overcounted`).
    OneDraftTooMany,
    /// Steps that drafted nothing are not in the engine's per-step record (vLLM): each committed
    /// one token, counted as a round of one token.
    UndraftedSteps,
}

impl Correction {
    pub const ALL: [Correction; 6] = [
        Correction::BonusToken,
        Correction::PrefillToken,
        Correction::EosInAcceptedBlock,
        Correction::TokensAfterEos,
        Correction::OneDraftTooMany,
        Correction::UndraftedSteps,
    ];

    /// The name reports and the run's origin use.
    pub fn name(self) -> &'static str {
        match self {
            Correction::BonusToken => "bonus-token",
            Correction::PrefillToken => "prefill-token",
            Correction::EosInAcceptedBlock => "eos-in-accepted-block",
            Correction::TokensAfterEos => "tokens-after-eos",
            Correction::OneDraftTooMany => "one-draft-too-many",
            Correction::UndraftedSteps => "undrafted-steps",
        }
    }

    /// One line on what it does.
    pub fn description(self) -> &'static str {
        match self {
            Correction::BonusToken => "each round also commits the target's own token after its accepted drafts",
            Correction::PrefillToken => "the engine's τ counts the prefill token, which no verify round committed",
            Correction::EosInAcceptedBlock => "a round counted accepted drafts past the end of the output: trimmed",
            Correction::TokensAfterEos => "output after the first end-of-generation token: cut, with the rounds that committed it",
            Correction::OneDraftTooMany => "the engine counts one draft token too many per step: one token less per round",
            Correction::UndraftedSteps => "steps that drafted nothing are missing from the engine's per-step record: one-token rounds",
        }
    }
}

/// How much a correction changed: requests it applied to, rounds added, removed or changed,
/// and tokens added or removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    pub requests: u64,
    pub rounds: u64,
    pub tokens: u64,
}

/// An engine's counting convention: what [`normalise`] corrects for its format.
#[derive(Debug)]
pub struct Convention {
    /// The engine as the run's origin names it.
    pub engine: &'static str,
    /// Its own per-request τ, as it computes it (for the report).
    pub engine_tau: &'static str,
    /// Its τ counts the prefill token.
    pub counts_prefill_token: bool,
    /// Steps that drafted nothing are missing from its per-step record.
    pub omits_undrafted_steps: bool,
    /// Its counts may run past the end of the output (an end-of-generation token inside an
    /// accepted block).
    pub may_count_past_end: bool,
}

/// What normalisation needs besides the record.
#[derive(Clone, Debug)]
pub struct NormaliseOptions<'a> {
    /// B = γ + 1: a round commits at most B tokens.
    pub block_size: u32,
    /// The target's end-of-generation ids.
    pub eos_ids: &'a [u32],
    /// Cut the output after its first end-of-generation token (off for traces generated with
    /// `ignore_eos`, whose tokens after one are part of the decode).
    pub cut_at_eos: bool,
    /// The engine counts one draft token too many per step.
    pub drafts_overcounted: bool,
}

/// A normalised request and the corrections applied to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalised {
    pub request: TraceRequest,
    pub applied: Vec<(Correction, Effect)>,
}

/// Tokens committed per round, their order, and the corrections reading them took.
type Committed = (Vec<u32>, RoundOrder, Vec<(Correction, Effect)>);

/// Tokens committed per round in the engine's counts, with their order and the corrections that
/// reading them as draftlens's tokens took (step 1 of the module doc).
fn committed(rec: &EngineRecord, conv: &Convention, opts: &NormaliseOptions) -> Result<Committed> {
    let at = &rec.at;
    let mut applied = Vec::new();
    let per_round = |n: usize| Effect {
        requests: 1,
        rounds: n as u64,
        tokens: n as u64,
    };
    let (mut rounds, order) = match &rec.counts {
        EngineCounts::Committed(c) => (c.clone(), RoundOrder::Decode),
        EngineCounts::AcceptedPerStep(a) => {
            applied.push((Correction::BonusToken, per_round(a.len())));
            (
                a.iter().map(|&x| x.saturating_add(1)).collect(),
                RoundOrder::Decode,
            )
        }
        EngineCounts::AcceptedHistogram(h) => {
            let mut r = Vec::new();
            for (j, &steps) in h.iter().enumerate() {
                if j as u64 + 1 > opts.block_size as u64 && steps > 0 {
                    bail!(
                        "{at}: {steps} steps accepted {j} drafts, more than the {} a round of block size {} drafts",
                        opts.block_size - 1,
                        opts.block_size
                    );
                }
                // Bounded by the check above and the length of the output (checked below).
                if steps > rec.token_ids.len() as u64 {
                    bail!(
                        "{at}: {steps} steps accepted {j} drafts, more steps than the {} generated tokens",
                        rec.token_ids.len()
                    );
                }
                r.extend(std::iter::repeat_n(j as u32 + 1, steps as usize));
            }
            applied.push((Correction::BonusToken, per_round(r.len())));
            (r, RoundOrder::Histogram)
        }
        EngineCounts::AcceptedTotal(accepted) => {
            if opts.drafts_overcounted {
                bail!("{at}: --drafts-overcounted corrects per-round counts; this format records only totals");
            }
            // Every decode step commits its accepted drafts and one token of the target's own:
            // tokens after the prefill one = accepted + steps.
            let after_prefill = rec.token_ids.len() as u64 - 1;
            if *accepted > after_prefill || (*accepted == after_prefill && after_prefill > 0) {
                bail!(
                    "{at}: {accepted} accepted drafts but {after_prefill} tokens after the prefill token: every verify round \
                     commits one token besides its accepted drafts, so the counts cannot be normalised"
                );
            }
            let steps = after_prefill - accepted;
            let spread = spread_evenly(after_prefill, steps);
            applied.push((Correction::BonusToken, per_round(spread.len())));
            (spread, RoundOrder::Totals)
        }
    };
    if conv.counts_prefill_token {
        applied.push((
            Correction::PrefillToken,
            Effect {
                requests: 1,
                rounds: 0,
                tokens: 1,
            },
        ));
    }
    if opts.drafts_overcounted {
        for (i, c) in rounds.iter_mut().enumerate() {
            if *c <= 1 {
                bail!(
                    "{at}: round {} commits {c} token(s) with one draft token too many counted: it would commit none",
                    i + 1
                );
            }
            *c -= 1;
        }
        applied.push((Correction::OneDraftTooMany, per_round(rounds.len())));
    }
    Ok((rounds, order, applied))
}

/// `tokens` spread over `rounds` rounds as evenly as whole tokens go, larger shares first.
fn spread_evenly(tokens: u64, rounds: u64) -> Vec<u32> {
    if rounds == 0 {
        return Vec::new();
    }
    let (base, extra) = (tokens / rounds, tokens % rounds);
    (0..rounds)
        .map(|i| (base + u64::from(i < extra)) as u32)
        .collect()
}

/// Draftlens's convention of one engine record (the module doc gives the steps).
pub fn normalise(
    rec: &EngineRecord,
    conv: &Convention,
    opts: &NormaliseOptions,
) -> Result<Normalised> {
    let at = &rec.at;
    if rec.token_ids.is_empty() {
        bail!("{at}: no generated token ids");
    }
    let (rounds, order, mut applied) = committed(rec, conv, opts)?;

    // Step 2: within the block.
    let b = opts.block_size;
    for (i, &c) in rounds.iter().enumerate() {
        if c == 0 {
            bail!("{at}: round {} commits no token: a verify round commits at least the target's own token", i + 1);
        }
        if c > b {
            let hint = if c == b + 1 && !opts.drafts_overcounted {
                " (one more than the block holds: if the engine counts one draft token too many per step, \
                 lightseekorg/tokenspeed #1443, --drafts-overcounted corrects it)"
            } else {
                ""
            };
            bail!(
                "{at}: round {} commits {c} tokens, more than a round of block size {b} can ({} drafts and the bonus \
                 token): the counts cannot be normalised{hint}",
                i + 1,
                b - 1
            );
        }
    }

    // Step 3: the output ends at its first end-of-generation token.
    let mut token_ids = rec.token_ids.clone();
    let mut cut = false;
    if opts.cut_at_eos {
        if let Some(k) = token_ids.iter().position(|t| opts.eos_ids.contains(t)) {
            if k + 1 < token_ids.len() {
                let dropped = token_ids.len() - (k + 1);
                token_ids.truncate(k + 1);
                cut = true;
                applied.push((
                    Correction::TokensAfterEos,
                    Effect {
                        requests: 1,
                        rounds: 0,
                        tokens: dropped as u64,
                    },
                ));
            }
        }
    }

    // Step 4: the rounds fitted to the output.
    let after_prefill = token_ids.len() as u64 - 1;
    let claimed: u64 = rounds.iter().map(|&c| c as u64).sum();
    let mismatch = || {
        format!(
            "{at}: the rounds commit {claimed} tokens but the output has {after_prefill} after the prefill token \
             (the first generated token, which no verify round commits)"
        )
    };
    let mut fitted = Vec::with_capacity(rounds.len());
    let (mut p, mut changed_rounds, mut trimmed) = (0u64, 0u64, 0u64);
    for &c in &rounds {
        let keep = (c as u64).min(after_prefill - p);
        if keep < c as u64 {
            changed_rounds += 1;
            trimmed += c as u64 - keep;
        }
        if keep > 0 {
            fitted.push(keep as u32);
        }
        p += keep;
    }
    if trimmed > 0 {
        if !(cut || conv.may_count_past_end) {
            bail!("{}", mismatch());
        }
        let effect = Effect {
            requests: 1,
            rounds: changed_rounds,
            tokens: trimmed,
        };
        if cut {
            // The cut's entry counts the output tokens; the rounds it removed or trimmed join it.
            let entry = applied
                .iter_mut()
                .find(|(c, _)| *c == Correction::TokensAfterEos)
                .expect("the cut was recorded");
            entry.1.rounds += effect.rounds;
        } else {
            applied.push((Correction::EosInAcceptedBlock, effect));
        }
    }
    if p < after_prefill {
        if !conv.omits_undrafted_steps {
            bail!("{}", mismatch());
        }
        let gap = after_prefill - p;
        fitted.extend(std::iter::repeat_n(1, gap as usize));
        applied.push((
            Correction::UndraftedSteps,
            Effect {
                requests: 1,
                rounds: gap,
                tokens: gap,
            },
        ));
    }
    Ok(Normalised {
        request: TraceRequest {
            prompt_id: rec.prompt_id.clone(),
            token_ids,
            rounds: fitted,
            order,
        },
        applied,
    })
}
