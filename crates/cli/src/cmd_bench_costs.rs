//! `bench-costs` (docs/verdict.md §9): the cost model's inputs (t_decode, t_draft_round,
//! t_verify(B)) measured on the backend apart from live decoding, each operation timed on its
//! own at several contexts of every prompt (`draftlens_engine::drafter::cost_bench`), summarised
//! as medians with their spread (`draftlens_results::cost_bench`) and, with `--store RUN`, stored
//! with the replayed run as the metric source `cost_bench`, where the verdict shows the estimate
//! from these costs next to the one from live decoding's own rounds.

use crate::args::{TargetArgs, TimingStoreArgs};
use crate::cmd_live_speed::TargetRun;
use crate::common::Global;
use anyhow::{bail, Result};
use clap::Args;
use draftlens_engine::backend::{dispatch, Backend, BackendJob, DEFAULT_CUDA_DEVICE};
use draftlens_engine::drafter::cost_bench::{bench_prompt, CostBenchOptions};
use draftlens_engine::drafter::live::LiveDrafter;
use draftlens_results::cost_bench::{CostBench, PromptSamples, Spread, SOURCE};
use draftlens_results::speed::estimated_speedup;
use draftlens_results::store::MetricScope;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args)]
pub struct BenchCostsArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Drafter checkpoint folder or GGUF drafter file (DFlash, DFlash2 or EAGLE-3), or
    /// target:mtp[:K], as `live` takes it.
    #[arg(long)]
    pub drafter: PathBuf,
    /// Timed repetitions of a round (draft, verify passes, context update) at each context.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub reps: usize,
    /// Untimed repetitions at each context before the timed ones (the first prompt is also
    /// decoded once, untimed, before any timing).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Contexts per prompt: anchors spread evenly over its greedy continuation, from the first
    /// round to the last.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub contexts: usize,
    /// Tokens a verify pass to time besides the drafter's B (each in 1..=B) [default: 1 and B/2].
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub verify_sizes: Vec<usize>,
    #[command(flatten)]
    pub timings: TimingStoreArgs,
}

/// What `bench-costs` measured (its `--json`).
#[derive(Serialize)]
pub struct CostBenchReport {
    pub backend: &'static str,
    pub dtype: &'static str,
    pub block_size: usize,
    pub max_new_tokens: usize,
    pub warmup: usize,
    pub reps: usize,
    /// Every timed sample, per prompt and context (seconds).
    pub prompts: Vec<PromptSamples>,
    /// Medians and spreads; null when nothing was timed.
    pub summary: Option<CostBench>,
    /// t_decode / (t_draft_round + t_verify(B)) of the medians: the estimate is τ times this.
    pub per_tau: Option<f64>,
    /// With --store: the run's replayed τ (pooled) and the estimate at it.
    pub tau_replayed: Option<f64>,
    pub estimated_speedup: Option<f64>,
    pub stored_with_run: Option<i64>,
}

struct Job<'a> {
    g: &'a Global,
    a: &'a BenchCostsArgs,
    target_run: Option<&'a TargetRun>,
}

impl BackendJob for Job<'_> {
    type Output = CostBenchReport;
    fn run<B: Backend>(self, be: B) -> Result<CostBenchReport> {
        let a = self.a;
        let set = a.target.prompt_set()?;
        let s = a.target.session(be, self.g)?;
        let d = crate::cmd_eval::load_linted_drafter(&s, &a.drafter)?;
        let block_size = LiveDrafter::from(&d).block_size();
        let max_new = a.target.max_new_tokens;
        let opts = CostBenchOptions {
            max_new,
            contexts: a.contexts,
            warmup: a.warmup,
            reps: a.reps,
            verify_sizes: a.verify_sizes.clone(),
        };
        // Bad sizes are refused before any decoding.
        opts.sizes(block_size)?;
        if let Some(t) = self.target_run {
            t.check(&s, &a.drafter, block_size, max_new)?;
        }
        let mut indices = Vec::with_capacity(set.prompts.len());
        for (n, p) in set.prompts.iter().enumerate() {
            indices.push(match self.target_run {
                Some(t) => t.index_of(p)?,
                None => n as u32,
            });
        }
        let eos = s.eos_ids();
        let model = s.model()?;
        if let Some(p) = set.prompts.first() {
            // Warm-up (kernels compiled, buffers allocated): the first prompt's greedy decoding
            // and one round at its first context, untimed.
            let once = CostBenchOptions {
                contexts: 1,
                warmup: 1,
                reps: 0,
                ..opts.clone()
            };
            bench_prompt(&s.be, model, &d, 0, &s.prompt_ids(p)?, &eos, &once)?;
        }
        let pb = draftlens_engine::progress::bar(set.prompts.len() as u64, "bench-costs");
        let mut prompts = Vec::with_capacity(set.prompts.len());
        for (p, &index) in set.prompts.iter().zip(&indices) {
            let ids = s.prompt_ids(p)?;
            prompts.push(bench_prompt(&s.be, model, &d, index, &ids, &eos, &opts)?);
            pb.inc(1);
        }
        pb.finish_and_clear();
        let summary = CostBench::of(&prompts, block_size as u32);
        Ok(CostBenchReport {
            backend: s.be.name(),
            dtype: s.be.dtype(),
            block_size,
            max_new_tokens: max_new,
            warmup: a.warmup,
            reps: a.reps,
            per_tau: summary.as_ref().and_then(|b| b.costs().per_tau()),
            prompts,
            summary,
            tau_replayed: None,
            estimated_speedup: None,
            stored_with_run: None,
        })
    }
}

/// The text `bench-costs` prints.
fn render(r: &CostBenchReport) -> String {
    let Some(b) = &r.summary else {
        return format!(
            "nothing timed on {} ({}): no prompt's greedy continuation had a round (--max-new-tokens {} or an early end)\n",
            r.backend, r.dtype, r.max_new_tokens
        );
    };
    let (lo, hi) = b.context_len;
    let mut o = format!(
        "costs measured apart from live decoding on {} ({}), drafter B = {}: {} prompts, {} contexts (KV caches of {lo}–{hi} tokens), {} timed repetitions after {} warm-up\n",
        r.backend, r.dtype, r.block_size, b.prompts, b.contexts, r.reps, r.warmup
    );
    o += &format!(
        "  {:<18} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}\n",
        "ms", "median", "p25", "p75", "min", "max", "samples"
    );
    let line = |name: &str, s: &Spread| {
        format!(
            "  {:<18} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>8}\n",
            name,
            s.median * 1e3,
            s.p25 * 1e3,
            s.p75 * 1e3,
            s.min * 1e3,
            s.max * 1e3,
            s.n
        )
    };
    o += &line("t_decode", &b.t_decode);
    o += &line("t_draft_round", &b.t_draft_round);
    for v in &b.t_verify {
        let name = if v.tokens as usize == r.block_size {
            format!("t_verify({}) = B", v.tokens)
        } else {
            format!("t_verify({})", v.tokens)
        };
        o += &line(&name, &v.spread);
    }
    if let Some(k) = r.per_tau {
        o += &format!(
            "t_decode / (t_draft_round + t_verify(B)) = {k:.4}: the estimated speed-up is τ times this\n"
        );
    }
    if let (Some(tau), Some(e)) = (r.tau_replayed, r.estimated_speedup) {
        o += &format!("estimated speed-up at the run's replayed τ {tau:.3}: {e:.3}×\n");
    }
    if let Some(id) = r.stored_with_run {
        o += &format!(
            "stored with run {id} (source {SOURCE}): `draftlens compare` shows this estimate next to live decoding's\n"
        );
    }
    o
}

pub fn run(g: &Global, a: BenchCostsArgs) -> Result<()> {
    let target_run = TargetRun::open_for(&a.timings, &a.drafter)?;
    let mut report = dispatch(
        a.target.backend.select(g),
        DEFAULT_CUDA_DEVICE,
        Job {
            g,
            a: &a,
            target_run: target_run.as_ref(),
        },
    )?;
    if let Some(t) = &target_run {
        let Some(bench) = &report.summary else {
            bail!(
                "--store {}: nothing was timed (no prompt's greedy continuation had a round)",
                t.run.id
            );
        };
        t.store_cost_bench(bench)?;
        report.stored_with_run = Some(t.run.id);
        report.tau_replayed = t
            .store
            .metrics(t.run.id)?
            .into_iter()
            .find(|m| {
                m.source == "native"
                    && m.name == "tau_replayed_pooled"
                    && m.scope == MetricScope::Run
            })
            .map(|m| m.value)
            .filter(|v| v.is_finite());
        report.estimated_speedup = report
            .tau_replayed
            .and_then(|tau| estimated_speedup(tau, &bench.costs()));
    }
    g.emit(&report, || render(&report))
}
