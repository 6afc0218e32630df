//! `draftlens trace import` (`trace diff`: cmd_trace_diff.rs): what a serving engine recorded per request (vLLM, SGLang, llama.cpp
//! or the neutral JSONL) stored as a run whose origin is the engine, its τ normalised to
//! draftlens's definition (docs/traces.md). Reading, normalising and storing are
//! `draftlens_results::trace`; this file resolves the prompt set and the target's tokenizer
//! (the engine) and prints the report.

use crate::common::Global;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use draftlens_engine::model::TargetFiles;
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::tokenizer::TextTokenizer;
use draftlens_results::store::{NewRun, Store};
use draftlens_results::text::printable;
use draftlens_results::trace::{self, Format, ImportOptions, SetPrompt, TraceReport, TraceTarget};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum TraceCmd {
    /// Store what a serving engine recorded per request as a run whose origin is the engine,
    /// its τ normalised to draftlens's definition; prints each correction it applied.
    Import(ImportArgs),
    /// Replay the reference drafter on a trace run's own tokens and report, round by round, where
    /// the engine committed fewer tokens than the reference would have, the positions where its
    /// output departs from the target's greedy tokens, and a verdict when the statistics allow.
    Diff(crate::cmd_trace_diff::DiffArgs),
}

#[derive(Args)]
pub struct ImportArgs {
    /// The trace: one record per line, the engine's response with the prompt's id in the set
    /// added as "prompt_id" (docs/traces.md).
    pub file: PathBuf,
    /// What wrote the trace.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(Format::ALL.map(Format::as_str)))]
    pub format: String,
    /// The prompt set the trace's prompt ids are from: builtin:NAME or a JSONL file.
    #[arg(long)]
    pub prompts: String,
    /// Target model the engine served, whose tokenizer decodes the trace and tokenizes the
    /// prompts [default: the model `draftlens setup` installs in the data folder].
    #[arg(long)]
    pub target: Option<PathBuf>,
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Block size B = γ + 1, γ the most drafts a round verifies; required when the trace does
    /// not say, checked against it when it does.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// The engine generated with ignore_eos: tokens after an end-of-generation token are part of
    /// the output (by default the output ends at the first one).
    #[arg(long)]
    pub ignore_eos: bool,
    /// The engine counts one draft token too many per verify step (lightseekorg/tokenspeed
    /// #1443): one token less per round.
    #[arg(long)]
    pub drafts_overcounted: bool,
    /// Run name [default: "<engine> trace <file name>"].
    #[arg(long)]
    pub name: Option<String>,
    /// The drafter the engine ran (a path or hub name), recorded as the run's drafter.
    #[arg(long)]
    pub drafter: Option<String>,
}

pub fn run(g: &Global, c: TraceCmd) -> Result<()> {
    match c {
        TraceCmd::Import(a) => import(g, a),
        TraceCmd::Diff(a) => crate::cmd_trace_diff::diff(g, a),
    }
}

/// The target's tokenizer and the prompt set, as the importer asks for them.
struct Target<'a> {
    tok: &'a TextTokenizer,
    set: &'a PromptSet,
}

impl TraceTarget for Target<'_> {
    fn prompt_ids(&self, index: usize) -> Result<Vec<u32>> {
        // The tokenization `draftlens run` uses (chat template with the generation prompt).
        draftlens_engine::session::tokenize_prompt(self.tok, &self.set.prompts[index])
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tok.decode(ids)
    }
    fn eos_ids(&self) -> Vec<u32> {
        self.tok.eos_ids()
    }
}

#[derive(Serialize)]
struct Imported<'a> {
    run: i64,
    uid: &'a str,
    /// False when the same trace was imported before (nothing was written).
    new: bool,
    origin: &'a str,
    report: &'a TraceReport,
}

fn import(g: &Global, a: ImportArgs) -> Result<()> {
    let format: Format = a.format.parse()?;
    let set = PromptSet::load(&a.prompts)?;
    if set.prompts.is_empty() {
        bail!("{}: the prompt set is empty", set.source.display());
    }
    let target_path = g.target(&a.target)?;
    let files = TargetFiles::open(&target_path)?;
    let Some(tok) = files.tokenizer.as_ref() else {
        bail!(
            "{}: the target has no tokenizer (tokenizer.json): its token ids cannot be checked",
            target_path.display()
        );
    };
    // Every record is read and checked before the database is touched: a bad trace stores nothing.
    let records = trace::read_trace(&a.file, format)?;
    let bytes = std::fs::read(&a.file)
        .with_context(|| format!("{}: cannot read trace file", a.file.display()))?;
    let set_prompts: Vec<SetPrompt> = set
        .prompts
        .iter()
        .map(|p| SetPrompt {
            id: p.id.clone(),
            sha256: p.hash(),
            category: p.category.clone(),
        })
        .collect();
    let file_name = a
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| a.file.display().to_string());
    let opts = ImportOptions {
        format,
        file_name,
        file_sha256: draftlens_results::sha256_hex(&bytes),
        block_size: a.block_size,
        cut_at_eos: !a.ignore_eos,
        drafts_overcounted: a.drafts_overcounted,
        run: NewRun {
            name: a.name.clone().unwrap_or_default(),
            target_path: target_path.display().to_string(),
            target_sha256: files.identity.weights_sha256()?,
            target_arch: files.identity.arch.clone(),
            drafter_path: a.drafter.clone().unwrap_or_default(),
            prompt_set_name: set.name.clone(),
            prompt_set_sha256: set.sha256.clone(),
            tokenizer_sha256: Some(tok.fingerprint()),
            ..Default::default()
        },
    };
    let built = trace::build_trace_run(&records, &set_prompts, &Target { tok, set: &set }, &opts)?;

    let store = Store::open(&a.db)?;
    let (id, new) = built.store(&store)?;
    let out = Imported {
        run: id,
        uid: &built.uid,
        new,
        origin: &built.origin,
        report: &built.report,
    };
    g.emit(&out, || render(&out, &a.db))
}

fn render(o: &Imported, db: &std::path::Path) -> String {
    let r = o.report;
    let fmt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.4}"));
    let mut s = if o.new {
        format!(
            "trace import: {} · {} → {} run {}\n",
            r.engine,
            printable(&r.file),
            db.display(),
            o.run
        )
    } else {
        format!(
            "trace import: {} · {}: already imported as run {} of {} (same trace, target, prompts and options); nothing stored\n",
            r.engine,
            printable(&r.file),
            o.run,
            db.display()
        )
    };
    s += &format!(
        "  {} requests of the {} prompts of the set · block size {} (γ = {}; from {})\n",
        r.requests,
        r.set_prompts,
        r.block_size,
        r.block_size - 1,
        r.block_size_from
    );
    s += &format!(
        "  τ {} macro, {} pooled over {} verify rounds and {} tokens (draftlens: tokens per verify round, bonus included, prefill token not)\n",
        fmt(r.tau_macro),
        fmt(r.tau_pooled),
        r.rounds,
        r.tokens
    );
    s += &match r.engine_tau_macro {
        Some(v) => format!(
            "  the engine's own τ {v:.4} ({})\n",
            r.engine_tau_definition
        ),
        None => format!(
            "  the engine's own τ: not in the trace ({})\n",
            r.engine_tau_definition
        ),
    };
    if r.corrections.is_empty() {
        s += "  corrections: none\n";
    } else {
        s += "  corrections:\n";
        for c in &r.corrections {
            s += &format!("    {}\n", c.line());
        }
    }
    if r.prompt_mismatches > 0 {
        s += &format!(
            "  warning: in {} of {} requests the engine's prompt differs from draftlens's tokenization (chat template, BOS?); the run stores draftlens's\n",
            r.prompt_mismatches, r.requests
        );
        for e in &r.prompt_mismatch_examples {
            s += &format!("    {}\n", printable(e));
        }
    }
    s
}
