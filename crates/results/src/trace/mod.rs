//! Serving-engine traces (`draftlens trace import`, docs/traces.md): what vLLM, SGLang and
//! llama.cpp record per request, read as written, normalised to draftlens's one definition of τ
//! (docs/metrics.md §2–§3) and stored as a run whose origin is the engine.
//!
//! - one file per format reads its records into [`EngineRecord`]s, the engine's own counts
//!   with the file and line they came from: [`vllm`], [`sglang`], [`llamacpp`], [`jsonl`] (the
//!   neutral format, which is [`TraceRequest`] itself);
//! - [`normalise`] turns each engine's counting convention into draftlens's: the neutral
//!   [`TraceRequest`] (prompt id, generated token ids, tokens committed per verify round) and
//!   the [`Correction`]s it applied, each named;
//! - [`diff`] compares an imported run's rounds with what the reference drafter does on the
//!   same tokens (`draftlens trace diff`);
//! - [`run`] checks the requests against the prompt set and the target's tokenizer and builds
//!   what is stored (prompts, per-prompt statistics, native τ rows, the origin), written in one
//!   transaction by `Store::insert_finished_run_with`.
//!
//! This crate never tokenizes: the caller (the CLI, with the engine) supplies the prompt set's
//! token ids and the tokenizer's decode and end-of-generation ids through [`run::TraceTarget`].

pub mod diff;
pub mod jsonl;
pub mod llamacpp;
pub mod normalise;
pub mod run;
pub mod sglang;
pub mod vllm;

pub use normalise::{normalise, Convention, NormaliseOptions, Normalised};
pub use run::{
    build_trace_run, is_trace_origin, ImportOptions, SetPrompt, StoredCorrection, TraceReport,
    TraceRun, TraceTarget, ORIGIN_PREFIX,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// One request in draftlens's convention: the neutral record every format is normalised to,
/// and the line format of `--format jsonl`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// The prompt's id in the prompt set.
    pub prompt_id: String,
    /// The generated token ids, the prefill token (the one the prompt's forward pass produces)
    /// first, ending at the first end-of-generation token.
    pub token_ids: Vec<u32>,
    /// Tokens committed per verify round, in order: the accepted drafts plus the bonus token,
    /// never past the end of `token_ids`. They add up to `token_ids.len() − 1` (the prefill
    /// token is not a round's).
    pub rounds: Vec<u32>,
    /// What the order of `rounds` means.
    #[serde(default)]
    pub order: RoundOrder,
}

impl TraceRequest {
    /// τ of this request: tokens per verify round (None without a round).
    pub fn tau(&self) -> Option<f64> {
        let tokens: u64 = self.rounds.iter().map(|&c| c as u64).sum();
        (!self.rounds.is_empty()).then(|| tokens as f64 / self.rounds.len() as f64)
    }
}

/// How much of the rounds' order a trace holds. τ never depends on it; a round-by-round diff
/// does (docs/traces.md, "What each format can tell").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoundOrder {
    /// Decode order, as the engine verified them (vLLM detailed, the neutral JSONL).
    #[default]
    Decode,
    /// From a histogram of accepted lengths (SGLang): the counts are exact, the order is not
    /// in the trace (listed shortest first).
    Histogram,
    /// From per-request totals (llama.cpp): the number of rounds and their tokens are exact, each
    /// round's share is not in the trace (spread evenly).
    Totals,
}

/// A trace format (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Vllm,
    Sglang,
    Llamacpp,
    Jsonl,
}

impl Format {
    pub const ALL: [Format; 4] = [
        Format::Vllm,
        Format::Sglang,
        Format::Llamacpp,
        Format::Jsonl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Vllm => "vllm",
            Format::Sglang => "sglang",
            Format::Llamacpp => "llamacpp",
            Format::Jsonl => "jsonl",
        }
    }

    /// The engine's counting convention (docs/traces.md).
    pub fn convention(self) -> &'static Convention {
        match self {
            Format::Vllm => &vllm::CONVENTION,
            Format::Sglang => &sglang::CONVENTION,
            Format::Llamacpp => &llamacpp::CONVENTION,
            Format::Jsonl => &jsonl::CONVENTION,
        }
    }

    /// Reads one line of a trace file (`at` names it: `file:line`).
    fn parse_line(self, line: &str, at: &str) -> Result<EngineRecord> {
        match self {
            Format::Vllm => vllm::parse(line, at),
            Format::Sglang => sglang::parse(line, at),
            Format::Llamacpp => llamacpp::parse(line, at),
            Format::Jsonl => jsonl::parse(line, at),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match Format::ALL.into_iter().find(|f| f.as_str() == s) {
            Some(f) => Ok(f),
            None => bail!("unknown trace format {s:?} (expected vllm, sglang, llamacpp or jsonl)"),
        }
    }
}

/// One request as its engine records it, before normalisation: what a format's parser reads.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRecord {
    /// Where the record is: `file:line`.
    pub at: String,
    pub prompt_id: String,
    /// The generated token ids as the engine returned them, the prefill token first.
    pub token_ids: Vec<u32>,
    /// The prompt's token ids as the engine saw them, when the record holds them.
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The number of prompt tokens the engine reports, when it holds only the count.
    pub prompt_tokens: Option<usize>,
    pub counts: EngineCounts,
    /// The block size B = γ + 1 the record states (γ: the most drafts one round verifies).
    pub block_size: Option<u32>,
    /// The engine's own τ for this request, in its own convention (for the report).
    pub engine_tau: Option<f64>,
}

/// The per-request counts a format records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineCounts {
    /// Tokens committed per verify round, in decode order, bonus included, prefill token not
    /// (the neutral JSONL: already draftlens's convention).
    Committed(Vec<u32>),
    /// Accepted drafts per verify step, in decode order, bonus excluded (vLLM
    /// `per_step_accepted`).
    AcceptedPerStep(Vec<u32>),
    /// Verify steps by number of accepted drafts (index j: steps that accepted j drafts), bonus
    /// excluded, order unknown (SGLang `spec_correct_drafts_histogram`).
    AcceptedHistogram(Vec<u64>),
    /// Accepted drafts over the whole request, bonus excluded (llama.cpp `draft_n_accepted`):
    /// the number of rounds follows from the generated tokens.
    AcceptedTotal(u64),
}

/// Largest trace file read (a trace of 10,000 requests of 8k tokens is about 400 MB of JSON).
pub const MAX_TRACE_BYTES: u64 = 4 << 30;

/// Reads every record of a trace file: one JSON object per non-empty line. An error names the
/// file and line.
pub fn read_trace(path: &Path, format: Format) -> Result<Vec<EngineRecord>> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("{}: cannot read trace file", path.display()))?;
    if meta.len() > MAX_TRACE_BYTES {
        bail!(
            "{}: the trace file is {} bytes, over the limit of {MAX_TRACE_BYTES}",
            path.display(),
            meta.len()
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "{}: cannot read trace file (is it UTF-8 text?)",
            path.display()
        )
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(format.parse_line(line, &format!("{name}:{}", i + 1))?);
    }
    if out.is_empty() {
        bail!("{}: the trace holds no record", path.display());
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Field readers shared by the formats: each error names the record and the key.
// ---------------------------------------------------------------------------------------------

/// A line as a JSON object.
fn object(line: &str, at: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => bail!("{at}: a record must be a JSON object"),
        Err(e) => bail!("{at}: not JSON: {e}"),
    }
}

/// `prompt_id`: the prompt-set id the capture added to the engine's response.
fn prompt_id(o: &serde_json::Map<String, serde_json::Value>, at: &str) -> Result<String> {
    match o.get("prompt_id") {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(_) => bail!("{at}: prompt_id must be a non-empty string"),
        None => bail!(
            "{at}: no prompt_id: each record is the engine's response with the prompt's id in the set added as \"prompt_id\" (docs/traces.md)"
        ),
    }
}

/// A non-negative integer that fits in u64.
fn uint(v: &serde_json::Value, at: &str, key: &str) -> Result<u64> {
    v.as_u64()
        .with_context(|| format!("{at}: {key} must be a non-negative integer, not {v}"))
}

/// A required non-negative integer field of `o`.
fn uint_field(o: &serde_json::Map<String, serde_json::Value>, at: &str, key: &str) -> Result<u64> {
    match o.get(key) {
        Some(v) => uint(v, at, key),
        None => bail!("{at}: no {key}"),
    }
}

/// An array of non-negative integers below 2³².
fn u32_array(v: &serde_json::Value, at: &str, key: &str) -> Result<Vec<u32>> {
    let Some(items) = v.as_array() else {
        bail!("{at}: {key} must be an array of integers");
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .with_context(|| format!("{at}: {key}[{i}] must be an integer in 0..2^32, not {x}"))
        })
        .collect()
}

/// An optional finite number (the engine's own τ and the like).
fn number(v: Option<&serde_json::Value>) -> Option<f64> {
    v.and_then(|x| x.as_f64()).filter(|x| x.is_finite())
}

/// A block size B = γ + 1 from a number of drafts γ, refusing what no run may hold.
fn block_from_drafts(gamma: u64, at: &str, key: &str) -> Result<u32> {
    let max = crate::store::MAX_BLOCK_SIZE as u64;
    if gamma == 0 || gamma + 1 > max {
        bail!(
            "{at}: {key} is {gamma}: a round drafts 1 to {} tokens",
            max - 1
        );
    }
    Ok(gamma as u32 + 1)
}

#[cfg(test)]
pub(crate) mod tests;
