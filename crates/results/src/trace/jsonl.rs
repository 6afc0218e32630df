//! The neutral JSONL: one [`TraceRequest`](super::TraceRequest) per line, already in
//! draftlens's convention, for engines draftlens has no reader for (docs/traces.md):
//!
//! ```json
//! {"prompt_id": "HumanEval/0", "token_ids": [791, 4320, 13, 2], "rounds": [2, 1], "block_size": 16}
//! ```
//!
//! - `token_ids`: the generated ids, the prefill token first;
//! - `rounds`: tokens committed per verify round in decode order (accepted drafts + the bonus
//!   token; the prefill token is no round's), adding up to `len(token_ids) − 1`;
//! - `block_size` (optional; else `--block-size`): B = γ + 1, the most tokens a round commits;
//! - `prompt_token_ids` (optional): the prompt as the engine saw it, compared with draftlens's.
//!
//! Nothing is corrected but the output's end: tokens after an end-of-generation token are cut
//! with the rounds that committed them. Counts that do not add up are an error.

use super::normalise::Convention;
use super::{object, prompt_id, u32_array, uint, EngineCounts, EngineRecord};
use anyhow::{bail, Result};

pub static CONVENTION: Convention = Convention {
    engine: "jsonl",
    engine_tau: "the neutral format is draftlens's convention",
    counts_prefill_token: false,
    omits_undrafted_steps: false,
    may_count_past_end: false,
};

pub fn parse(line: &str, at: &str) -> Result<EngineRecord> {
    let o = object(line, at)?;
    let prompt_id = prompt_id(&o, at)?;
    let token_ids = match o.get("token_ids") {
        Some(v) => u32_array(v, at, "token_ids")?,
        None => bail!("{at}: no token_ids"),
    };
    let rounds = match o.get("rounds") {
        Some(v) => u32_array(v, at, "rounds")?,
        None => bail!("{at}: no rounds (tokens committed per verify round)"),
    };
    let block_size = match o.get("block_size").filter(|v| !v.is_null()) {
        Some(v) => {
            let b = uint(v, at, "block_size")?;
            if !(2..=crate::store::MAX_BLOCK_SIZE as u64).contains(&b) {
                bail!(
                    "{at}: block_size {b} is outside 2..={}",
                    crate::store::MAX_BLOCK_SIZE
                );
            }
            Some(b as u32)
        }
        None => None,
    };
    let prompt_token_ids = match o.get("prompt_token_ids").filter(|v| !v.is_null()) {
        Some(v) => Some(u32_array(v, at, "prompt_token_ids")?),
        None => None,
    };
    Ok(EngineRecord {
        at: at.to_string(),
        prompt_id,
        token_ids,
        prompt_tokens: prompt_token_ids.as_ref().map(Vec::len),
        prompt_token_ids,
        counts: EngineCounts::Committed(rounds),
        block_size,
        engine_tau: None,
    })
}
