//! What a trace import stores: a complete run whose origin is the engine, with no records (an
//! engine records no drafter candidates) but with what τ needs, so that `runs ls`, `runs show`,
//! the web UI and `compare` show the engine's τ under draftlens's definition:
//! - the prompts, each with draftlens's tokenization of the prompt and the engine's continuation;
//! - per-prompt statistics ([`PromptStats`]) holding the engine's verify rounds (accepted length
//!   and tokens; no block, position or candidate counts, which the engine does not record),
//!   stored where the web keeps statistics ([`STATS_KIND`]);
//! - the native replayed-τ rows those rounds give ([`crate::metrics::summarize_rounds`]) and the
//!   engine's own τ as it computes it (source `trace`);
//! - the origin `trace:<format>:<file> (corrections)` and, under `trace` in the configuration,
//!   the [`TraceReport`]: engine, file hash, block size, corrections with their counts.
//!
//! Every check runs before anything is written, and the run is written in one transaction
//! ([`TraceRun::store`]), so a bad trace stores nothing.

use super::normalise::{Correction, Effect, NormaliseOptions};
use super::{normalise, EngineRecord, Format, RoundOrder, TraceRequest};
use crate::metrics::{summarize_rounds, PromptStats, RunStats, SOURCE, STATS_KIND, STATS_VERSION};
use crate::store::{
    Derived, FinishedRun, MetricRow, MetricScope, NewRun, RunEval, RunMode, RunPrompt, Store,
    MAX_BLOCK_SIZE,
};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Source of the metric row holding the engine's own τ.
pub const ENGINE_SOURCE: &str = "trace";

/// How a trace run's origin starts: `trace:<format>:<file> (corrections)`.
pub const ORIGIN_PREFIX: &str = "trace:";

/// Whether a run's origin says it is a trace import.
pub fn is_trace_origin(origin: &str) -> bool {
    origin.starts_with(ORIGIN_PREFIX)
}

/// A prompt of the set (the CLI reads the set with the engine).
#[derive(Clone, Debug)]
pub struct SetPrompt {
    pub id: String,
    /// Content hash: pairs this run's prompts with other runs' (`Prompt::hash` in the engine).
    pub sha256: String,
    pub category: Option<String>,
}

/// The target's tokenizer, as the importer needs it (the CLI implements it with the engine).
pub trait TraceTarget {
    /// draftlens's token ids of prompt `index` of the set: the chat template applied as
    /// `draftlens run` applies it.
    fn prompt_ids(&self, index: usize) -> Result<Vec<u32>>;
    /// The text of `ids`; an error for an id the tokenizer cannot decode.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Every token that ends generation.
    fn eos_ids(&self) -> Vec<u32>;
}

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    pub format: Format,
    /// The trace file's name (the run's origin) and the sha256 of its bytes.
    pub file_name: String,
    pub file_sha256: String,
    /// `--block-size`: B = γ + 1; required when the records do not say.
    pub block_size: Option<u32>,
    /// Cut each output after its first end-of-generation token (off: `--ignore-eos`).
    pub cut_at_eos: bool,
    pub drafts_overcounted: bool,
    /// The run: name (empty: one is made up), target, drafter label, prompt set and tokenizer.
    /// Mode, block size, top-k, backend and configuration are the importer's.
    pub run: NewRun,
}

/// A correction applied over the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppliedCorrection {
    pub name: &'static str,
    pub description: &'static str,
    #[serde(flatten)]
    pub effect: Effect,
}

impl AppliedCorrection {
    /// The line `trace import` prints for it (and `trace diff` and the compare page repeat).
    pub fn line(&self) -> String {
        correction_line(self.name, &self.effect, self.description)
    }
}

/// One correction as a trace run's configuration holds it (`trace.corrections`), read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCorrection {
    pub name: String,
    pub description: String,
    #[serde(flatten)]
    pub effect: Effect,
}

impl StoredCorrection {
    /// The corrections a trace run's import applied, from its configuration (none for a run
    /// that is not a trace import, or whose configuration holds no such list).
    pub fn of_config(config: &serde_json::Value) -> Vec<StoredCorrection> {
        serde_json::from_value(config["trace"]["corrections"].clone()).unwrap_or_default()
    }

    pub fn line(&self) -> String {
        correction_line(&self.name, &self.effect, &self.description)
    }
}

/// A correction with what it changed, as one line: name, requests, rounds, tokens, what it does.
fn correction_line(name: &str, e: &Effect, description: &str) -> String {
    format!(
        "{:<22} {:>6} requests {:>7} rounds {:>8} tokens  {}",
        name, e.requests, e.rounds, e.tokens, description
    )
}

/// What an import did: printed by the CLI and stored under `trace` in the run's configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceReport {
    pub engine: &'static str,
    pub format: Format,
    pub file: String,
    pub file_sha256: String,
    pub requests: usize,
    pub set_prompts: usize,
    pub block_size: u32,
    /// Where the block size came from: `--block-size` or the record key.
    pub block_size_from: String,
    pub rounds: u64,
    pub tokens: u64,
    /// draftlens's τ (the stored `tau_replayed_macro` / `_pooled`).
    pub tau_macro: Option<f64>,
    pub tau_pooled: Option<f64>,
    /// The engine's own τ, macro over the requests that report it, and how it computes it.
    pub engine_tau_macro: Option<f64>,
    pub engine_tau_definition: &'static str,
    pub round_order: RoundOrder,
    pub cut_at_eos: bool,
    pub drafts_overcounted: bool,
    pub corrections: Vec<AppliedCorrection>,
    /// Requests whose prompt tokens (or their count) differ from draftlens's tokenization of the
    /// prompt, and the first few of them (`file:line: …`).
    pub prompt_mismatches: usize,
    pub prompt_mismatch_examples: Vec<String>,
}

/// Everything an import stores, checked and ready to write.
#[derive(Debug)]
pub struct TraceRun {
    pub run: NewRun,
    /// Derived from the evaluation identity: importing the same trace again changes nothing.
    pub uid: String,
    pub origin: String,
    pub eval: RunEval,
    pub prompts: Vec<RunPrompt>,
    pub metrics: Vec<MetricRow>,
    pub derived: Vec<Derived>,
    pub requests: Vec<TraceRequest>,
    pub report: TraceReport,
}

impl TraceRun {
    /// Writes the run in one transaction; `(id, false)` when the same import is already stored.
    pub fn store(&self, store: &Store) -> Result<(i64, bool)> {
        let f = FinishedRun {
            run: &self.run,
            uid: &self.uid,
            origin: &self.origin,
            eval: &self.eval,
            prompts: &self.prompts,
            records: &draftlens_records::RecordBatch::new(self.run.block_size, self.run.top_k),
            metrics: &self.metrics,
            timings: &serde_json::json!({}),
        };
        store.insert_finished_run_with(&f, &self.derived)
    }
}

/// Example mismatches kept in the report.
const MISMATCH_EXAMPLES: usize = 3;

/// The run's block size: `--block-size` or what the records say, which must agree.
fn block_size(records: &[EngineRecord], opts: &ImportOptions) -> Result<(u32, String)> {
    let mut found: Option<(u32, &str)> = None;
    for r in records {
        let Some(b) = r.block_size else { continue };
        if let Some(given) = opts.block_size {
            if b != given {
                bail!(
                    "{}: the record says block size {b} (γ = {}) but --block-size is {given}",
                    r.at,
                    b - 1
                );
            }
        }
        match found {
            Some((first, first_at)) if first != b => bail!(
                "{}: block size {b} (γ = {}), but {first_at} says {first}: one run has one block size",
                r.at,
                b - 1
            ),
            _ => found = Some((b, &r.at)),
        }
    }
    let key = match opts.format {
        Format::Vllm => "num_spec_tokens + 1",
        Format::Sglang => "spec_num_proposed_drafts / spec_verify_ct + 1",
        Format::Llamacpp => "speculative.n_max + 1",
        Format::Jsonl => "block_size",
    };
    let (b, from) = match (opts.block_size, found) {
        (Some(b), _) => (b, "--block-size".to_string()),
        (None, Some((b, _))) => (b, format!("the trace ({key})")),
        (None, None) => bail!(
            "{}: the trace does not say how many tokens a round drafts ({key}); pass --block-size B (γ + 1)",
            opts.file_name
        ),
    };
    if !(2..=MAX_BLOCK_SIZE).contains(&b) {
        bail!("block size {b} is outside 2..={MAX_BLOCK_SIZE}");
    }
    Ok((b, from))
}

/// The evaluation identity of an import: what can change its numbers. Field order is fixed by
/// this struct, so its JSON (and the run's uid) is canonical.
#[derive(Serialize)]
struct TraceIdentity<'a> {
    kind: &'static str,
    format: Format,
    file_sha256: &'a str,
    target_sha256: &'a str,
    tokenizer_sha256: &'a str,
    prompt_set_sha256: &'a str,
    block_size: u32,
    cut_at_eos: bool,
    drafts_overcounted: bool,
}

/// Checks a trace's records against the prompt set and the target's tokenizer, normalises them
/// and builds what is stored. Any bad record is an error naming it (`file:line`).
pub fn build_trace_run(
    records: &[EngineRecord],
    set: &[SetPrompt],
    target: &dyn TraceTarget,
    opts: &ImportOptions,
) -> Result<TraceRun> {
    let conv = opts.format.convention();
    let (b, block_size_from) = block_size(records, opts)?;
    let eos = target.eos_ids();
    let nopts = NormaliseOptions {
        block_size: b,
        eos_ids: &eos,
        cut_at_eos: opts.cut_at_eos,
        drafts_overcounted: opts.drafts_overcounted,
    };
    let index_of: HashMap<&str, usize> = set
        .iter()
        .enumerate()
        .map(|(i, p)| (p.id.as_str(), i))
        .collect();
    let mut seen: HashMap<usize, &str> = HashMap::new();
    let mut applied: BTreeMap<Correction, Effect> = BTreeMap::new();
    let mut rows: Vec<(usize, TraceRequest, RunPrompt)> = Vec::with_capacity(records.len());
    let (mut mismatches, mut examples) = (0usize, Vec::new());
    let mut engine_taus = Vec::new();
    for rec in records {
        let at = &rec.at;
        let Some(&index) = index_of.get(rec.prompt_id.as_str()) else {
            bail!(
                "{at}: prompt {:?} is not in the prompt set {:?} ({} prompts)",
                rec.prompt_id,
                opts.run.prompt_set_name,
                set.len()
            );
        };
        if let Some(first) = seen.insert(index, at) {
            bail!(
                "{at}: a second record for prompt {:?} (the first is {first})",
                rec.prompt_id
            );
        }
        target.decode(&rec.token_ids).with_context(|| {
            format!("{at}: the generated token ids do not decode with the target's tokenizer")
        })?;
        let n = normalise(rec, conv, &nopts)?;
        for (c, e) in &n.applied {
            let t = applied.entry(*c).or_default();
            t.requests += e.requests;
            t.rounds += e.rounds;
            t.tokens += e.tokens;
        }
        let prompt_ids = target
            .prompt_ids(index)
            .with_context(|| format!("{at}: prompt {:?}", rec.prompt_id))?;
        let differs = match (&rec.prompt_token_ids, rec.prompt_tokens) {
            (Some(ids), _) => (*ids != prompt_ids).then(|| {
                format!(
                    "the engine's prompt ids differ from draftlens's ({} tokens against {})",
                    ids.len(),
                    prompt_ids.len()
                )
            }),
            (None, Some(count)) => (count != prompt_ids.len()).then(|| {
                format!(
                    "the engine's prompt has {count} tokens, draftlens's {}",
                    prompt_ids.len()
                )
            }),
            (None, None) => None,
        };
        if let Some(what) = differs {
            mismatches += 1;
            if examples.len() < MISMATCH_EXAMPLES {
                examples.push(format!("{at}: {what}"));
            }
        }
        engine_taus.extend(rec.engine_tau);
        let mut sequence = prompt_ids.clone();
        sequence.extend_from_slice(&n.request.token_ids);
        let text = target.decode(&sequence).with_context(|| {
            format!(
                "{at}: the prompt and its continuation do not decode with the target's tokenizer"
            )
        })?;
        let p = &set[index];
        rows.push((
            index,
            n.request,
            RunPrompt {
                index: index as u32,
                id: p.id.clone(),
                sha256: p.sha256.clone(),
                category: p.category.clone(),
                prompt_len: prompt_ids.len() as u32,
                token_ids: sequence,
                text,
            },
        ));
    }
    // Set order: the order of the per-prompt rows and of the sums of the macro τ.
    rows.sort_by_key(|r| r.0);

    let gamma = (b - 1) as usize;
    let stats: Vec<PromptStats> = rows
        .iter()
        .map(|(index, req, prompt)| PromptStats {
            index: *index as u32,
            sha256: prompt.sha256.clone(),
            category: prompt.category.clone(),
            // No block was evaluated: the engine records no drafter candidates.
            blocks: 0,
            valid: vec![0; gamma],
            correct: vec![0; gamma],
            topk_correct: vec![0; gamma],
            reached: vec![0; gamma],
            accepted: vec![0; gamma],
            hist: vec![0; gamma + 1],
            nll_sum: 0.0,
            // A round commits A accepted drafts and the bonus token (within the block: ≤ B).
            rounds: req.rounds.iter().map(|&c| (c - 1) as u16).collect(),
            replay_tokens: Some(req.rounds.iter().map(|&c| c as u64).sum()),
        })
        .collect();
    let listed: Vec<&PromptStats> = stats.iter().collect();
    let mut metrics = summarize_rounds(&listed);
    let run_value = |name: &str| {
        metrics
            .iter()
            .find(|m| m.source == SOURCE && m.name == name && m.scope == MetricScope::Run)
            .map(|m| m.value)
    };
    let (tau_macro, tau_pooled) = (
        run_value("tau_replayed_macro"),
        run_value("tau_replayed_pooled"),
    );
    let engine_tau_macro = (!engine_taus.is_empty())
        .then(|| engine_taus.iter().sum::<f64>() / engine_taus.len() as f64);
    if let Some(v) = engine_tau_macro {
        let mut r = MetricRow::scalar(
            ENGINE_SOURCE,
            "engine_tau_macro",
            MetricScope::Run,
            v,
            engine_taus.len() as u64,
            true,
        );
        r.unit = "tokens/round".into();
        r.description = format!(
            "the engine's own τ, mean over requests, in its convention: {}",
            conv.engine_tau
        );
        metrics.push(r);
    }
    let derived = vec![Derived {
        kind: STATS_KIND.into(),
        version: STATS_VERSION,
        data: serde_json::to_vec(&RunStats {
            positions: gamma,
            top_k: 1,
            prompts: stats,
        })?,
    }];

    let round_order = rows.first().map(|r| r.1.order).unwrap_or_default();
    let corrections: Vec<AppliedCorrection> = applied
        .into_iter()
        .map(|(c, effect)| AppliedCorrection {
            name: c.name(),
            description: c.description(),
            effect,
        })
        .collect();
    let requests: Vec<TraceRequest> = rows.iter().map(|r| r.1.clone()).collect();
    let report = TraceReport {
        engine: conv.engine,
        format: opts.format,
        file: opts.file_name.clone(),
        file_sha256: opts.file_sha256.clone(),
        requests: requests.len(),
        set_prompts: set.len(),
        block_size: b,
        block_size_from,
        rounds: requests.iter().map(|r| r.rounds.len() as u64).sum(),
        tokens: requests
            .iter()
            .flat_map(|r| &r.rounds)
            .map(|&c| c as u64)
            .sum(),
        tau_macro,
        tau_pooled,
        engine_tau_macro,
        engine_tau_definition: conv.engine_tau,
        round_order,
        cut_at_eos: opts.cut_at_eos,
        drafts_overcounted: opts.drafts_overcounted,
        corrections,
        prompt_mismatches: mismatches,
        prompt_mismatch_examples: examples,
    };

    let mut run = opts.run.clone();
    if run.name.is_empty() {
        run.name = format!("{} trace {}", conv.engine, opts.file_name);
    }
    run.mode = RunMode::Deployment;
    run.train_style = None;
    run.block_size = b;
    // No candidates are stored; a run holds at least one per position.
    run.top_k = 1;
    run.backend = conv.engine.to_string();
    run.config = serde_json::json!({ "trace": report });
    let identity = TraceIdentity {
        kind: "trace",
        format: opts.format,
        file_sha256: &opts.file_sha256,
        target_sha256: &run.target_sha256,
        tokenizer_sha256: run.tokenizer_sha256.as_deref().unwrap_or(""),
        prompt_set_sha256: &run.prompt_set_sha256,
        block_size: b,
        cut_at_eos: opts.cut_at_eos,
        drafts_overcounted: opts.drafts_overcounted,
    };
    let identity_bytes = serde_json::to_vec(&identity)?;
    let identity_sha = crate::sha256_hex(&identity_bytes);
    let names: Vec<&str> = report.corrections.iter().map(|c| c.name).collect();
    let origin = format!(
        "{ORIGIN_PREFIX}{}:{}{}",
        opts.format,
        crate::text::printable(&opts.file_name),
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        }
    );
    Ok(TraceRun {
        uid: identity_sha[..32].to_string(),
        eval: RunEval {
            identity: identity_sha,
            identity_json: serde_json::from_slice(&identity_bytes)?,
            shard: None,
            set_prompts: set.len() as u32,
            run_prompts: rows.len() as u32,
            merged_from: None,
        },
        prompts: rows.into_iter().map(|r| r.2).collect(),
        origin,
        run,
        metrics,
        derived,
        requests,
        report,
    })
}
