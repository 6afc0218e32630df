//! SGLang: a response of the native `/generate` endpoint (`text`, `output_ids`, `meta_info`),
//! one per line, with the prompt's id in the set added as `"prompt_id"` (docs/traces.md). The
//! accepted-drafts histogram is in `meta_info` when the request asks for
//! `return_spec_tokens_details`.
//!
//! Fields read (sgl-project/sglang/python/sglang/srt/managers/tokenizer_manager.py,
//! `_calculate_spec_decoding_metrics`; sgl-project/sglang #33518 for the identities between them):
//! - `output_ids`: the generated ids;
//! - `meta_info.completion_tokens`, `meta_info.prompt_tokens`;
//! - `meta_info.spec_verify_ct`: verify steps;
//! - `meta_info.spec_correct_drafts_histogram` (older name `spec_accept_histogram`): index j =
//!   steps that accepted j drafts, bonus excluded;
//! - `meta_info.spec_num_proposed_drafts` (older `spec_proposed_drafts`) = steps × γ, from which
//!   the block size follows;
//! - `meta_info.spec_accept_length` = completion_tokens / spec_verify_ct: SGLang's τ, whose
//!   numerator counts the prefill token (sgl-project/sglang #3152).
//!
//! Convention: the histogram holds no order; reasoning tokens past an end-of-generation token
//! have been returned and counted (sgl-project/sglang #39826).

use super::normalise::Convention;
use super::{
    block_from_drafts, number, object, prompt_id, u32_array, uint, EngineCounts, EngineRecord,
};
use anyhow::{bail, Result};

pub static CONVENTION: Convention = Convention {
    engine: "sglang",
    engine_tau: "spec_accept_length = completion_tokens / spec_verify_ct (prefill token included)",
    counts_prefill_token: true,
    omits_undrafted_steps: false,
    may_count_past_end: true,
};

pub fn parse(line: &str, at: &str) -> Result<EngineRecord> {
    let o = object(line, at)?;
    let prompt_id = prompt_id(&o, at)?;
    let token_ids = match o.get("output_ids") {
        Some(v) if !v.is_null() => u32_array(v, at, "output_ids")?,
        _ => {
            bail!("{at}: no output_ids: record the response of SGLang's native /generate endpoint")
        }
    };
    let Some(meta) = o.get("meta_info").and_then(|m| m.as_object()) else {
        bail!("{at}: no meta_info: not an SGLang /generate response");
    };
    let completion = match meta.get("completion_tokens") {
        Some(v) => uint(v, at, "meta_info.completion_tokens")?,
        None => bail!("{at}: no meta_info.completion_tokens"),
    };
    if completion != token_ids.len() as u64 {
        bail!(
            "{at}: meta_info.completion_tokens is {completion} but output_ids holds {} ids",
            token_ids.len()
        );
    }
    let verify = match meta.get("spec_verify_ct") {
        Some(v) => uint(v, at, "meta_info.spec_verify_ct")?,
        None => {
            bail!("{at}: no meta_info.spec_verify_ct: the server ran without speculative decoding")
        }
    };
    let histogram = match meta
        .get("spec_correct_drafts_histogram")
        .or_else(|| meta.get("spec_accept_histogram"))
    {
        Some(v) if !v.is_null() => u32_array(v, at, "meta_info.spec_correct_drafts_histogram")?,
        _ => bail!(
            "{at}: no meta_info.spec_correct_drafts_histogram: send the request with \"return_spec_tokens_details\": true \
             (without it SGLang reports only the number of verify steps)"
        ),
    };
    let steps: u64 = histogram.iter().map(|&x| x as u64).sum();
    if steps != verify {
        bail!("{at}: the histogram counts {steps} steps but meta_info.spec_verify_ct is {verify}");
    }
    let proposed = meta
        .get("spec_num_proposed_drafts")
        .or_else(|| meta.get("spec_proposed_drafts"))
        .filter(|v| !v.is_null());
    // Proposed drafts = steps × γ (speculative_num_draft_tokens − 1).
    let block_size = match proposed {
        Some(v) if verify > 0 => {
            let p = uint(v, at, "meta_info.spec_num_proposed_drafts")?;
            if p % verify != 0 {
                bail!("{at}: meta_info.spec_num_proposed_drafts ({p}) is not a multiple of spec_verify_ct ({verify})");
            }
            Some(block_from_drafts(
                p / verify,
                at,
                "drafts per step (spec_num_proposed_drafts / spec_verify_ct)",
            )?)
        }
        _ => None,
    };
    let prompt_tokens = match meta.get("prompt_tokens").filter(|v| !v.is_null()) {
        Some(v) => Some(uint(v, at, "meta_info.prompt_tokens")? as usize),
        None => None,
    };
    Ok(EngineRecord {
        at: at.to_string(),
        prompt_id,
        token_ids,
        prompt_token_ids: None,
        prompt_tokens,
        counts: EngineCounts::AcceptedHistogram(histogram.into_iter().map(u64::from).collect()),
        block_size,
        engine_tau: number(meta.get("spec_accept_length")),
    })
}
