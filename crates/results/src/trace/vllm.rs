//! vLLM: a completion or chat-completion response of the OpenAI-compatible server started with
//! `--per-request-spec-decode-metrics detailed` and requested with `"return_token_ids": true`,
//! one per line, with the prompt's id in the set added as `"prompt_id"` (docs/traces.md).
//!
//! Fields read (vllm-project/vllm/docs/features/speculative_decoding/acceptance_metrics.md
//! @02cf515; `return_token_ids` in vllm-project/vllm/vllm/entrypoints/openai/protocol.py):
//! - `choices[0].token_ids`: the generated ids (one choice: the metrics are null for n > 1);
//! - `choices[0].prompt_token_ids` or `prompt_token_ids`: the prompt as the engine saw it;
//! - `metrics.speculative_decoding.per_step_accepted` (detailed mode): accepted drafts per
//!   verification step, bonus excluded; `per_step_drafted` (drafts proposed per step),
//!   `num_spec_steps`, `num_spec_tokens` (γ, the configured `num_speculative_tokens`) and
//!   `mean_acceptance_length` (= 1 + accepted / steps, vLLM's τ).
//!
//! Convention: steps with no scheduled drafts are omitted from the arrays (the doc's "Steps with
//! no scheduled draft tokens are omitted"), and an end-of-generation token inside the accepted
//! drafts still counts the drafts after it (vllm-project/vllm #56101).

use super::normalise::Convention;
use super::{
    block_from_drafts, number, object, prompt_id, u32_array, uint, EngineCounts, EngineRecord,
};
use anyhow::{bail, Result};

pub static CONVENTION: Convention = Convention {
    engine: "vllm",
    engine_tau: "mean_acceptance_length = 1 + accepted drafts / verification steps",
    counts_prefill_token: false,
    omits_undrafted_steps: true,
    may_count_past_end: true,
};

pub fn parse(line: &str, at: &str) -> Result<EngineRecord> {
    let o = object(line, at)?;
    let prompt_id = prompt_id(&o, at)?;
    let choices = match o.get("choices").and_then(|c| c.as_array()) {
        Some(c) if c.len() == 1 => c,
        Some(c) => bail!(
            "{at}: {} choices: vLLM reports per-request metrics for single-sequence requests (n = 1) only",
            c.len()
        ),
        None => bail!("{at}: no choices: not a vLLM completion response"),
    };
    let choice = &choices[0];
    let token_ids = match choice.get("token_ids") {
        Some(v) if !v.is_null() => u32_array(v, at, "choices[0].token_ids")?,
        _ => {
            bail!("{at}: no choices[0].token_ids: send the request with \"return_token_ids\": true")
        }
    };
    let prompt_token_ids = match choice
        .get("prompt_token_ids")
        .or_else(|| o.get("prompt_token_ids"))
    {
        Some(v) if !v.is_null() => Some(u32_array(v, at, "prompt_token_ids")?),
        _ => None,
    };
    let spec = match o.get("metrics").and_then(|m| m.get("speculative_decoding")) {
        Some(s) if s.is_object() => s,
        _ => bail!(
            "{at}: no metrics.speculative_decoding: start vLLM with --per-request-spec-decode-metrics detailed \
             (it is null for n > 1 and without speculative decoding)"
        ),
    };
    let accepted = match spec.get("per_step_accepted") {
        Some(v) if !v.is_null() => u32_array(v, at, "per_step_accepted")?,
        _ => bail!(
            "{at}: no metrics.speculative_decoding.per_step_accepted: the server ran with the summary level; start it \
             with --per-request-spec-decode-metrics detailed"
        ),
    };
    if let Some(v) = spec.get("per_step_drafted").filter(|v| !v.is_null()) {
        let drafted = u32_array(v, at, "per_step_drafted")?;
        if drafted.len() != accepted.len() {
            bail!(
                "{at}: per_step_drafted has {} steps, per_step_accepted {}",
                drafted.len(),
                accepted.len()
            );
        }
        if let Some(i) = (0..accepted.len()).find(|&i| accepted[i] > drafted[i]) {
            bail!(
                "{at}: step {} accepted {} of {} drafts",
                i + 1,
                accepted[i],
                drafted[i]
            );
        }
    }
    if let Some(v) = spec.get("num_spec_steps").filter(|v| !v.is_null()) {
        let steps = uint(v, at, "num_spec_steps")?;
        if steps != accepted.len() as u64 {
            bail!(
                "{at}: num_spec_steps is {steps} but per_step_accepted has {} steps",
                accepted.len()
            );
        }
    }
    let block_size = match spec.get("num_spec_tokens").filter(|v| !v.is_null()) {
        Some(v) => Some(block_from_drafts(
            uint(v, at, "num_spec_tokens")?,
            at,
            "num_spec_tokens",
        )?),
        None => None,
    };
    Ok(EngineRecord {
        at: at.to_string(),
        prompt_id,
        token_ids,
        prompt_tokens: prompt_token_ids.as_ref().map(Vec::len),
        prompt_token_ids,
        engine_tau: number(spec.get("mean_acceptance_length")),
        counts: EngineCounts::AcceptedPerStep(accepted),
        block_size,
    })
}
