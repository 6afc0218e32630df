//! llama.cpp: a response of `llama-server`'s native `/completion` endpoint requested with
//! `"return_tokens": true` and without streaming, one per line, with the prompt's id in the set
//! added as `"prompt_id"` (docs/traces.md).
//!
//! Fields read (ggml-org/llama.cpp/tools/server/server-task.cpp @17f5f8a:
//! `server_task_result_cmpl_final::to_json_non_oaicompat`, `result_timings::to_json`,
//! `task_params::to_json`):
//! - `tokens`: the generated ids (`slot.generated_tokens`); `tokens_predicted` (n_decoded),
//!   `tokens_evaluated` (prompt tokens), `stop_type`;
//! - `timings.draft_n`, `timings.draft_n_accepted`: drafted and accepted tokens over the request
//!   (both absent when nothing was drafted);
//! - `generation_settings["speculative.n_max"]`: the most drafts a round verifies (γ).
//!
//! Convention: only totals. Every decode step commits its accepted drafts and one token of the
//! target's, so steps = tokens after the prefill token − accepted; each step's share is not in
//! the response. An end-of-generation token inside an accepted block leaves its later drafts
//! counted as accepted (as in ikawrakow/ik_llama.cpp #2358), which totals cannot show.

use super::normalise::Convention;
use super::{
    block_from_drafts, object, prompt_id, u32_array, uint, uint_field, EngineCounts, EngineRecord,
};
use anyhow::{bail, Result};

pub static CONVENTION: Convention = Convention {
    engine: "llamacpp",
    engine_tau:
        "llama-server reports draft acceptance = draft_n_accepted / draft_n per request, no τ",
    counts_prefill_token: false,
    omits_undrafted_steps: false,
    may_count_past_end: false,
};

pub fn parse(line: &str, at: &str) -> Result<EngineRecord> {
    let o = object(line, at)?;
    let prompt_id = prompt_id(&o, at)?;
    let token_ids = match o.get("tokens") {
        Some(v) if !v.is_null() => u32_array(v, at, "tokens")?,
        _ => bail!("{at}: no tokens: not a llama-server /completion response"),
    };
    let predicted = uint_field(&o, at, "tokens_predicted")?;
    if token_ids.is_empty() && predicted > 0 {
        bail!(
            "{at}: tokens is empty but {predicted} tokens were predicted: request /completion with \"return_tokens\": \
             true and without streaming (a streamed response carries its tokens in the chunks)"
        );
    }
    if predicted != token_ids.len() as u64 {
        bail!(
            "{at}: tokens_predicted is {predicted} but tokens holds {} ids",
            token_ids.len()
        );
    }
    let Some(timings) = o.get("timings").and_then(|t| t.as_object()) else {
        bail!("{at}: no timings: not a llama-server /completion response");
    };
    // Both are absent when nothing was drafted (`result_timings::to_json`).
    let field = |k: &str| -> Result<u64> {
        match timings.get(k) {
            Some(v) => uint(v, at, &format!("timings.{k}")),
            None => Ok(0),
        }
    };
    let (drafted, accepted) = (field("draft_n")?, field("draft_n_accepted")?);
    if accepted > drafted {
        bail!(
            "{at}: timings.draft_n_accepted ({accepted}) is more than timings.draft_n ({drafted})"
        );
    }
    let block_size = match o
        .get("generation_settings")
        .and_then(|g| g.get("speculative.n_max"))
        .filter(|v| !v.is_null())
    {
        Some(v) => Some(block_from_drafts(
            uint(v, at, "generation_settings[\"speculative.n_max\"]")?,
            at,
            "generation_settings[\"speculative.n_max\"]",
        )?),
        None => None,
    };
    let prompt_tokens = match o.get("tokens_evaluated").filter(|v| !v.is_null()) {
        Some(v) => Some(uint(v, at, "tokens_evaluated")? as usize),
        None => None,
    };
    Ok(EngineRecord {
        at: at.to_string(),
        prompt_id,
        token_ids,
        prompt_token_ids: None,
        prompt_tokens,
        counts: EngineCounts::AcceptedTotal(accepted),
        block_size,
        engine_tau: None,
    })
}
