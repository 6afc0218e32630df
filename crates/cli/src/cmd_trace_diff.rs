//! `draftlens trace diff RUN --drafter CKPT`: a trace run's verify rounds beside what the
//! reference drafter does on the engine's own tokens (docs/traces.md §6). The target runs
//! teacher-forced on prompt + the engine's output (one cached target pass, as `run` does), the
//! reference drafter drafts at every anchor the engine verified and along its own replayed
//! chain; `draftlens_results::trace::diff` compares them; the paired intervals over prompts and
//! the verdict rule are the compare page's (`draftlens_web::stats`, docs/metrics.md §8).

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
use draftlens_engine::model::Capture;
use draftlens_engine::session::{Session, SessionOptions};
use draftlens_results::metrics::{RunStats, STATS_KIND};
use draftlens_results::store::{RunInfo, RunPrompt, Store};
use draftlens_results::text::printable;
use draftlens_results::trace::diff::{diff_prompt, engine_anchors, PromptDiff, ReplayedPrompt};
use draftlens_web::stats::{paired_interval, Interval, Resamples, Rng, MIN_SHARED_PROMPTS};
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

/// Bootstrap replicates of the paired intervals (as the compare page).
const REPLICATES: usize = 1000;

/// A difference with its paired 95% interval over prompts.
#[derive(Serialize)]
struct Delta {
    /// Reference − engine.
    value: f64,
    interval: Option<Interval>,
}

#[derive(Serialize)]
struct Summary {
    /// Prompts with at least one round.
    prompts: usize,
    rounds: u64,
    rounds_fewer: u64,
    rounds_more: u64,
    engine_tau_pooled: Option<f64>,
    reference_tau_pooled: Option<f64>,
    /// Reference τ (its own chain on the engine's output) − engine τ, pooled.
    tau_delta: Option<Delta>,
    /// Tokens the reference commits at the engine's anchors − the engine's, per engine round.
    tokens_lost_per_round: Option<Delta>,
    departures: u64,
    prompts_departing: usize,
    verdict: String,
}

#[derive(Serialize)]
struct DiffOut {
    run: i64,
    drafter: PathBuf,
    summary: Summary,
    prompts: Vec<PromptDiff>,
}

pub fn diff(g: &Global, a: DiffArgs) -> Result<()> {
    let store = Store::open_existing(&a.db)?;
    let id = draftlens_web::compare::resolve_run(&store, &a.run)?;
    let Some(d) = store.run(id)? else {
        bail!("{}: no run {}", a.db.display(), a.run)
    };
    let run = d.run;
    if !run.origin.starts_with("trace:") {
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
        None if Path::new(&run.target_path).exists() => PathBuf::from(&run.target_path),
        None => g.target(&None)?,
    };
    let job = DiffJob {
        g,
        a: &a,
        run: &run,
        target: &target,
        prompts: &prompts,
        rounds: &rounds,
    };
    let diffs = dispatch(a.backend.select(g), DEFAULT_CUDA_DEVICE, job)?;
    let out = DiffOut {
        run: id,
        drafter: a.drafter.clone(),
        summary: summarize(&diffs, &run.uid),
        prompts: diffs,
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
}

impl BackendJob for DiffJob<'_> {
    type Output = Vec<PromptDiff>;
    fn run<B: Backend>(self, be: B) -> Result<Vec<PromptDiff>> {
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
        Ok(out)
    }
}

/// The run-level comparison: paired intervals over the prompts with rounds, and the verdict
/// (none below [`MIN_SHARED_PROMPTS`], as on the compare page).
fn summarize(diffs: &[PromptDiff], seed: &str) -> Summary {
    let with: Vec<&PromptDiff> = diffs.iter().filter(|d| d.rounds > 0).collect();
    let col =
        |f: &dyn Fn(&PromptDiff) -> u64| -> Vec<f64> { with.iter().map(|d| f(d) as f64).collect() };
    let (eng_tok, eng_rounds) = (col(&|d| d.engine_tokens), col(&|d| d.rounds));
    let (ref_tok, ref_rounds) = (col(&|d| d.reference_chain.0), col(&|d| d.reference_chain.1));
    let at_anchors = col(&|d| d.reference_tokens);
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let ratio = |n: &[f64], d: &[f64]| (sum(d) > 0.0).then(|| sum(n) / sum(d));
    let rs = Resamples::new(with.len(), REPLICATES, &mut Rng::from_str_seed(seed));
    let delta = |na: &[f64], da: &[f64], nb: &[f64], db: &[f64]| {
        Some(Delta {
            value: ratio(nb, db)? - ratio(na, da)?,
            interval: paired_interval(&rs, na, da, nb, db),
        })
    };
    let tau_delta = delta(&eng_tok, &eng_rounds, &ref_tok, &ref_rounds);
    let lost = delta(&eng_tok, &eng_rounds, &at_anchors, &eng_rounds);
    let departing = diffs.iter().filter(|d| d.departures > 0).count();
    let verdict = match &lost {
        None => "no verdict: no prompt has a verify round".to_string(),
        Some(_) if with.len() < MIN_SHARED_PROMPTS => format!(
            "no verdict: {} prompts, a verdict needs at least {MIN_SHARED_PROMPTS} (docs/metrics.md §8)",
            with.len()
        ),
        Some(Delta { value, interval: Some(i) }) => {
            let ci = format!("95% CI [{:+.3}, {:+.3}], {} over {} prompts", i.lo, i.hi, i.method.label(), with.len());
            if i.lo > 0.0 {
                format!("the integration loses {value:.3} tokens per round against the reference drafter ({ci})")
            } else if i.hi < 0.0 {
                format!("the engine commits {:.3} tokens per round more than the reference drafter ({ci})", -value)
            } else {
                format!("consistent: {value:+.3} tokens per round ({ci} includes 0)")
            }
        }
        Some(Delta { interval: None, .. }) => "no verdict: no interval".to_string(),
    };
    Summary {
        prompts: with.len(),
        rounds: sum(&eng_rounds) as u64,
        rounds_fewer: diffs.iter().map(|d| d.rounds_fewer).sum(),
        rounds_more: diffs.iter().map(|d| d.rounds_more).sum(),
        engine_tau_pooled: ratio(&eng_tok, &eng_rounds),
        reference_tau_pooled: ratio(&ref_tok, &ref_rounds),
        tau_delta,
        tokens_lost_per_round: lost,
        departures: diffs.iter().map(|d| d.departures).sum(),
        prompts_departing: departing,
        verdict,
    }
}

fn render(o: &DiffOut) -> String {
    let s = &o.summary;
    let f = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.4}"));
    let delta = |d: &Option<Delta>| match d {
        None => "–".to_string(),
        Some(Delta { value, interval }) => match interval {
            Some(i) => format!(
                "{value:+.4} [{:+.4}, {:+.4}] ({})",
                i.lo,
                i.hi,
                i.method.label()
            ),
            None => format!("{value:+.4}"),
        },
    };
    let mut t = format!(
        "trace diff: run {} against {}\n  {} prompts, {} engine rounds: the reference commits more in {}, fewer in {}\n",
        o.run,
        o.drafter.display(),
        s.prompts,
        s.rounds,
        s.rounds_fewer,
        s.rounds_more
    );
    t += &format!(
        "  τ engine {} · reference {} on the same tokens · Δ {}\n  tokens lost per engine round {}\n",
        f(s.engine_tau_pooled),
        f(s.reference_tau_pooled),
        delta(&s.tau_delta),
        delta(&s.tokens_lost_per_round)
    );
    if s.departures > 0 {
        t += &format!(
            "  the engine's output departs from the target's greedy token at {} positions in {} prompts\n",
            s.departures, s.prompts_departing
        );
    }
    t += &format!("  {}\n", s.verdict);
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
    t
}
