//! `draftlens trace diff RUN --drafter CKPT`: a trace run's verify rounds beside what the
//! reference drafter does on the engine's own tokens (docs/traces.md §6). The target runs
//! teacher-forced on prompt + the engine's output (one cached target pass, as `run` does), the
//! reference drafter drafts at every anchor the engine verified and along its own replayed
//! chain; `draftlens_results::trace::diff` compares them. The diff is stored with the run
//! (`Store::put_trace_diff`) for the web's compare page and drill-down; the summary (paired
//! intervals over prompts, the verdict rule, the printed lines) is defined once in
//! `draftlens_web::compare::trace_diff`, which the compare page shows too.

use crate::args::BackendArg;
use crate::common::Global;
use anyhow::{bail, Context, Result};
use clap::Args;
use draftlens_engine::backend::{dispatch, Backend, BackendJob, DEFAULT_CUDA_DEVICE};
use draftlens_engine::drafter::eval::{
    draft_into, evaluate_sequence, AnchorPolicy, DraftTarget, Drafter, EvalOptions, Labels,
    Sequence,
};
use draftlens_engine::drafter::lint::{lint, Severity};
use draftlens_engine::drafter::DFlashDrafter;
use draftlens_engine::identity::IdentityStore;
use draftlens_engine::model::random_target::target_exists;
use draftlens_engine::model::Capture;
use draftlens_engine::session::{Session, SessionOptions};
use draftlens_results::metrics::{RunStats, STATS_KIND};
use draftlens_results::store::{NewTraceDiff, RunInfo, RunPrompt, Store};
use draftlens_results::text::printable;
use draftlens_results::trace::diff::{diff_prompt, engine_anchors, PromptDiff, ReplayedPrompt};
use draftlens_results::trace::{is_trace_origin, StoredCorrection};
use draftlens_web::compare::trace_diff::{summarize, summary_lines, DiffSummary};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DiffArgs {
    /// The trace run (`trace import`): id, uid or a unique uid prefix.
    pub run: String,
    /// The reference drafter checkpoint folder (the weights the engine is meant to run).
    #[arg(long)]
    pub drafter: PathBuf,
    /// Target model [default: the trace run's target when that path exists, else the model
    /// `draftlens setup` installs].
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Numeric backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
}

#[derive(Serialize)]
struct DiffOut {
    run: i64,
    drafter: PathBuf,
    summary: DiffSummary,
    prompts: Vec<PromptDiff>,
    /// Not in `--json` (its shape predates storing): the stored diff and the import's corrections.
    #[serde(skip)]
    stored: i64,
    #[serde(skip)]
    corrections: Vec<StoredCorrection>,
}

pub fn diff(g: &Global, a: DiffArgs) -> Result<()> {
    let store = Store::open_existing(&a.db)?;
    let id = draftlens_web::compare::resolve_run(&store, &a.run)?;
    let Some(d) = store.run(id)? else {
        bail!("{}: no run {}", a.db.display(), a.run)
    };
    let run = d.run;
    if !is_trace_origin(&run.origin) {
        bail!(
            "run {id} is not a trace import (its origin is {:?}): trace diff compares an engine's rounds",
            printable(&run.origin)
        );
    }
    let order = run.config["trace"]["round_order"].as_str().unwrap_or("");
    if order != "decode" {
        bail!(
            "run {id}: its rounds come from {} ({order}), not in decode order: a round-by-round diff needs \
             vLLM's detailed metrics or the neutral JSONL (docs/traces.md §3)",
            printable(run.config["trace"]["engine"].as_str().unwrap_or("the engine"))
        );
    }
    let stats: RunStats = match store.derived(id, STATS_KIND)? {
        Some(s) => serde_json::from_slice(&s.data)
            .with_context(|| format!("run {id}: its statistics are corrupt"))?,
        None => bail!("run {id}: no per-prompt statistics (not a complete trace import)"),
    };
    let prompts = store.prompts(id)?;
    // Tokens per round (A + 1) of each prompt, in the prompts' order.
    let rounds: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            stats
                .prompts
                .iter()
                .find(|s| s.index == p.index)
                .map(|s| s.rounds.iter().map(|&a| a as u32 + 1).collect())
                .unwrap_or_default()
        })
        .collect();
    let target = match &a.target {
        Some(t) => t.clone(),
        // The run's target when it is still there (a `random:DIR` target: DIR).
        None if target_exists(Path::new(&run.target_path)) => PathBuf::from(&run.target_path),
        None => g.target(&None)?,
    };
    let job = DiffJob {
        g,
        a: &a,
        run: &run,
        target: &target,
        prompts: &prompts,
        rounds: &rounds,
        store: &store,
    };
    let done = dispatch(a.backend.select(g), DEFAULT_CUDA_DEVICE, job)?;
    let stored = store.put_trace_diff(
        id,
        &NewTraceDiff {
            drafter_path: &a.drafter.display().to_string(),
            drafter_sha256: &done.drafter_sha256,
            target_path: &target.display().to_string(),
            backend: done.backend,
            prompts: &done.diffs,
        },
    )?;
    let out = DiffOut {
        run: id,
        drafter: a.drafter.clone(),
        summary: summarize(&done.diffs, &run.uid),
        prompts: done.diffs,
        stored,
        corrections: StoredCorrection::of_config(&run.config),
    };
    g.emit(&out, || render(&out))
}

struct DiffJob<'a> {
    g: &'a Global,
    a: &'a DiffArgs,
    run: &'a RunInfo,
    target: &'a Path,
    prompts: &'a [RunPrompt],
    rounds: &'a [Vec<u32>],
    /// Where the tokenizer's vocabulary goes (the drill-down decodes the rounds' tokens with it).
    store: &'a Store,
}

/// What the job computed, and with which drafter weights and backend.
struct Diffed {
    diffs: Vec<PromptDiff>,
    drafter_sha256: String,
    backend: &'static str,
}

impl BackendJob for DiffJob<'_> {
    type Output = Diffed;
    fn run<B: Backend>(self, be: B) -> Result<Diffed> {
        let (a, run) = (self.a, self.run);
        let s = Session::load(be, self.target, self.g.cache()?, SessionOptions::default())?;
        let tok = s.files.tokenizer()?;
        if run.tokenizer_sha256.as_deref() != Some(tok.fingerprint().as_str()) {
            bail!(
                "{}: its tokenizer is not the one run {} was imported with: the token ids would mean other tokens",
                self.target.display(),
                run.id
            );
        }
        if let Some(f) = lint(&s.files, &a.drafter)?
            .iter()
            .find(|f| f.severity == Severity::Error)
        {
            bail!(
                "{}: drafter is incompatible with the target: {}",
                a.drafter.display(),
                f.message
            );
        }
        let drafter_sha256 = IdentityStore::new(s.cache.root())
            .file_sha256(&draftlens_engine::drafter::gguf::weights_file(&a.drafter))?;
        // A shared cache per tokenizer (as `run` stores it), not part of the diff.
        draftlens_engine::drafter::vocab::store_vocab(
            self.store,
            &tok,
            &self.target.display().to_string(),
        )?;
        let d = DFlashDrafter::load(&s.be, &a.drafter, s.files.spec.hidden_size)?;
        if d.cfg.block_size != run.block_size as usize {
            bail!(
                "{}: block size {} but the engine verified rounds of block size {}: the rounds would not compare",
                a.drafter.display(),
                d.cfg.block_size,
                run.block_size
            );
        }
        let layer_ids = d.cfg.target_layer_ids.clone();
        let capture = Capture::for_layer_ids(&layer_ids, s.files.spec.num_layers)?;
        let drafter = Drafter::DFlash(d);
        let Drafter::DFlash(dflash) = &drafter else {
            unreachable!("built as DFlash above")
        };
        // The reference's own chain starts at the first completion anchor; evaluate_sequence
        // walks it from there (one anchor chosen: the stride is past any sequence).
        let opts = EvalOptions {
            top_k: 1,
            anchors: AnchorPolicy::Stride(usize::MAX),
            ..Default::default()
        };
        let head = DraftTarget::Head(s.draft_target()?);
        let pb = draftlens_engine::progress::bar(self.prompts.len() as u64, "trace diff");
        let mut out = Vec::with_capacity(self.prompts.len());
        for (p, engine) in self.prompts.iter().zip(self.rounds) {
            let ids = &p.token_ids;
            let pass = s.target_pass(ids, &capture, opts.top_k)?;
            let mut seq = Sequence::new(
                p.index,
                ids,
                p.prompt_len as usize,
                &pass.topk,
                Labels::Target,
            );
            let taps = layer_ids
                .iter()
                .map(|&l| pass.hidden(l + 1).context("tap not captured"))
                .collect::<Result<Vec<_>>>()?;
            seq.ctx = Some(dflash.context(&s.be, &taps, pass.hidden_size)?);
            let mut records = evaluate_sequence(&s.be, head, &drafter, &seq, &opts)?;
            let missing: Vec<usize> = engine_anchors(p.prompt_len as usize, engine)
                .into_iter()
                .filter(|&x| !records.anchor.contains(&(x as u32)))
                .collect();
            draft_into(&s.be, head, &drafter, &seq, &missing, &opts, &mut records)?;
            out.push(
                diff_prompt(&ReplayedPrompt {
                    index: p.index,
                    id: &p.id,
                    prompt_len: p.prompt_len as usize,
                    ids,
                    engine_rounds: engine,
                    records: &records,
                    target_greedy: &seq.labels,
                })
                .with_context(|| format!("run {}", run.id))?,
            );
            pb.inc(1);
        }
        pb.finish_and_clear();
        Ok(Diffed {
            diffs: out,
            drafter_sha256,
            backend: s.be.name(),
        })
    }
}

fn render(o: &DiffOut) -> String {
    let mut t = format!(
        "trace diff: run {} against {}\n",
        o.run,
        o.drafter.display()
    );
    for line in summary_lines(&o.summary, &o.corrections) {
        t += &format!("  {line}\n");
    }
    for p in o
        .prompts
        .iter()
        .filter(|p| !p.first_rounds.is_empty() || p.departures > 0)
    {
        t += &format!("  prompt {} ({}):", p.index, printable(&p.id));
        for r in &p.first_rounds {
            t += &format!(
                " round {} at {}: engine {} reference {};",
                r.round, r.anchor, r.engine, r.reference
            );
        }
        if let Some(d) = p.first_departures.first() {
            t += &format!(
                " first departure at {}: engine {} target {}",
                d.position, d.engine_token, d.target_token
            );
        }
        t += "\n";
    }
    t += &format!(
        "  stored as trace diff {}: `draftlens serve` shows it on the compare page and at /runs/{}/trace-diff\n",
        o.stored, o.run
    );
    t
}
