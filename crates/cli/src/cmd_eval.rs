//! `run`, `live`, `lint`, `runs`: drafter evaluation.

use crate::args::{AnchorArgs, TargetArgs};
use crate::common::Global;
use crate::metrics_json::{by_source, scoped, BySource, ScopedMetrics, SCHEMA_VERSION};
use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use draftlens_engine::backend::{dispatch, Backend, BackendJob, DEFAULT_CUDA_DEVICE};
use draftlens_engine::drafter::eagle3::TreeShape;
use draftlens_engine::drafter::eval::{EvalOptions, Labels};
use draftlens_engine::drafter::lint::{lint, Severity};
use draftlens_engine::drafter::live::{first_divergence, live_decode, load_drafter, LiveDrafter};
use draftlens_engine::drafter::run::RunOutcome;
use draftlens_engine::drafter::run::{run_eval_shard, DrafterSpec, RunOptions};
use draftlens_engine::drafter::sampling::{
    live_decode_sampled, prompt_stream, SampledEval, SamplingRng,
};
use draftlens_engine::drafter::speed::time_prompt;
use draftlens_engine::drafter::DrafterCheckpoint;
use draftlens_engine::model::TargetFiles;
use draftlens_records::sampling::{check_temperature, check_top_p, DraftSampling, SamplingParams};
use draftlens_results::store::{MetricRow, MetricScope, RunFilter, RunMode, Store};
use draftlens_results::text::printable;
use serde::Serialize;
use std::path::PathBuf;

/// `--mode`. The engine's `RunMode` lives in draftlens-results, which has no clap (its
/// dependencies stay records, rusqlite and serde), so the values are named here.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// Isolated per-anchor drafting: what deployment sees.
    Deployment,
    /// Reproduce training-time metrics: shared forward, training mask, optional data labels.
    TrainStyle,
}

/// `--mask`. The engine holds the rule as `EvalOptions::ctx_inclusive`, a bool that is part of
/// every stored evaluation identity, so the values are named here.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MaskArg {
    /// Context strictly before the anchor (correct).
    Strict,
    /// Context up to and including the anchor (the known training leak).
    Inclusive,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Drafter checkpoint folder (DFlash or EAGLE-3, told from its config.json), a GGUF drafter
    /// file as llama.cpp writes it (docs/gguf-drafters.md), a folder of
    /// checkpoints (every one is run, step from the name), builtin:oracle /
    /// builtin:anti-oracle (known-answer drafters), or target:mtp[:K] (the target's own MTP
    /// head drafting K tokens a round, default 3; docs/mtp.md).
    #[arg(long)]
    pub drafter: String,
    /// Series the checkpoint runs belong to [default: the checkpoints' folder's name] (what
    /// `watch --drafter-series` names; `watch --slurm` passes it on).
    #[arg(long)]
    pub drafter_series: Option<String>,
    /// Block size of the built-in drafters.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// SQLite database of runs.
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Evaluate only shard I of N (0-based) of the prompt set, prompts assigned by content
    /// hash; `draftlens merge` puts the shard runs together (docs/scale-out.md).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<draftlens_results::shard::Shard>,
    /// Run name (default: series/checkpoint · prompt set · mode).
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, value_enum, default_value_t = ModeArg::Deployment)]
    pub mode: ModeArg,
    /// Train-style mask rule.
    #[arg(long, value_enum, default_value_t = MaskArg::Strict)]
    pub mask: MaskArg,
    /// Train-style labels: the target's greedy tokens or the prompt line's reference `completion`.
    #[arg(long, value_enum, default_value_t = Labels::Target)]
    pub labels: Labels,
    #[command(flatten)]
    pub anchors: AnchorArgs,
    /// Also evaluate anchors inside the prompt.
    #[arg(long)]
    pub prompt_anchors: bool,
    /// Evaluate speculative sampling at temperature T > 0 (docs/metrics.md §7): each prompt's
    /// continuation is drawn from the target instead of decoded greedily, and the run adds the
    /// expected acceptance computed exactly from the stored p and q. 0: greedy.
    #[arg(long, default_value_t = 0.0, value_parser = parse_temperature, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Top-p of the sampling transform, in (0, 1] (1: none).
    #[arg(long, default_value_t = 1.0, value_parser = parse_top_p, allow_negative_numbers = true)]
    pub top_p: f64,
    /// Top-k of the sampling transform; at T > 0 it is required and at most --top-k (the
    /// candidates stored), which then give p and q exactly.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub sampling_top_k: Option<u32>,
    /// Seed of the sampled continuations (each prompt draws from its own stream of it) [default: 0].
    #[arg(long)]
    pub sampling_seed: Option<u64>,
    /// How drafts are chosen at T > 0 [default: sampled].
    #[arg(long, value_enum)]
    pub draft_sampling: Option<DraftSamplingArg>,
    /// Also evaluate an EAGLE-3 drafter's dynamic tree (docs/eagle3.md §3.1): TOPK children per
    /// expanded node and kept per depth, TOTAL tokens per tree with the root (SGLang's
    /// --speculative-eagle-topk and --speculative-num-draft-tokens), depth = the chain's K. Adds
    /// the tree's τ (eagle3_tree_tau_*) next to the chain's.
    #[arg(long, value_name = "TOPK,TOTAL", value_parser = parse_eagle3_tree)]
    pub eagle3_tree: Option<TreeShape>,
    /// Stop with an error after N prompts (for testing interruption).
    #[arg(long, hide = true)]
    pub fail_after: Option<usize>,
    /// Metric plugins scored over the stored records once the evaluation is done.
    #[command(flatten)]
    pub plugins: crate::cmd_plugins::PluginArgs,
}

struct RunJob<'a> {
    g: &'a Global,
    a: &'a RunArgs,
}

impl BackendJob for RunJob<'_> {
    type Output = Vec<draftlens_engine::drafter::run::RunOutcome>;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output> {
        let a = self.a;
        let set = a.target.prompt_set()?;
        let specs: Vec<DrafterSpec> = match DrafterSpec::builtin(&a.drafter, a.block_size)? {
            Some(builtin) => vec![builtin],
            None => {
                let d = a.drafter.as_str();
                let path = PathBuf::from(d);
                let series = path
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default();
                let cks = DrafterCheckpoint::discover(&path)?;
                let single = cks.len() == 1 && cks[0].dir == path;
                cks.into_iter()
                    .map(|c| {
                        let series = if single {
                            c.dir
                                .parent()
                                .and_then(|p| p.file_name())
                                .map(|n| n.to_string_lossy().to_string())
                                .unwrap_or(series.clone())
                        } else {
                            series.clone()
                        };
                        DrafterSpec::Checkpoint {
                            dir: c.dir,
                            step: c.step,
                            series: a.drafter_series.clone().unwrap_or(series),
                        }
                    })
                    .collect()
            }
        };
        let s = a.target.session(be, self.g)?;
        draftlens_engine::drafter::run_identity::prewarm_identities(&s, &specs);
        let store = Store::open(&a.db)?;
        let mode = match a.mode {
            ModeArg::Deployment => RunMode::Deployment,
            ModeArg::TrainStyle => RunMode::TrainStyle,
        };
        if !matches!(mode, RunMode::TrainStyle)
            && (matches!(a.mask, MaskArg::Inclusive) || a.labels == Labels::Data)
        {
            bail!("--mask inclusive and --labels data reproduce training bugs: use them with --mode train-style");
        }
        let eval = EvalOptions {
            top_k: a.anchors.top_k,
            anchors: a.anchors.policy(),
            prompt_anchors: a.prompt_anchors,
            ctx_inclusive: matches!(a.mask, MaskArg::Inclusive),
            labels: a.labels,
            anchor_batch: a.anchors.anchor_batch,
            sampling: run_sampling(a)?,
            eagle3_tree: a.eagle3_tree,
        };
        let mut outs = Vec::new();
        for spec in &specs {
            let opts = RunOptions {
                name: a.name.clone(),
                mode,
                eval: eval.clone(),
                max_new_tokens: a.target.max_new_tokens,
                fail_after: a.fail_after,
            };
            outs.push(run_eval_shard(&s, spec, &set, &opts, a.shard, &store)?);
        }
        Ok(outs)
    }
}

pub fn run(g: &Global, a: RunArgs) -> Result<()> {
    // Sampling settings are checked before any model is loaded.
    run_sampling(&a)?;
    // Plugins are found and their parameters checked before any model runs.
    let plugins = crate::cmd_rescore::Prepared::new(&a.plugins)?;
    let outs = dispatch(
        a.target.backend.select(g),
        DEFAULT_CUDA_DEVICE,
        RunJob { g, a: &a },
    )?;
    // A failing plugin is a warning (recorded with the run), never a failed run.
    let scored = {
        let _phase = draftlens_engine::timeline::phase("plugins");
        // A shard that owns no prompt has no records to score (docs/scale-out.md).
        let scorable = outs.iter().filter(|r| a.shard.is_none() || r.blocks > 0);
        crate::cmd_rescore::score_runs(plugins.as_ref(), &a.db, scorable.map(|r| r.run_id))?
    };
    // The metrics as stored (the native ones and the plugins' just scored), in the shape
    // `runs show --json` gives them.
    let stored = {
        let store = Store::open_existing(&a.db)?;
        outs.iter()
            .map(|r| store.metrics_in_scope(r.run_id, &MetricScope::Run))
            .collect::<Result<Vec<_>>>()?
    };
    let json: Vec<RunJson> = crate::cmd_rescore::with_plugins(&outs, &scored)
        .into_iter()
        .zip(&stored)
        .map(|(r, rows)| RunJson::new(r, rows))
        .collect();
    g.emit(&json, || {
        let mut o = String::new();
        for r in &outs {
            o += &format!(
                "run {} · {} · {} prompts, {} blocks, {:.1}s\n",
                r.run_id, r.name, r.prompts, r.blocks, r.seconds
            );
            // A histogram's scalar is only its count (the blocks above): its bins are in
            // `runs show --json` and the web UI.
            for (name, m) in r.metrics.values().flatten() {
                if name != "accept_hist" {
                    o += &format!("  {name:<22} {:.4}\n", m.value);
                }
            }
            if let Some(s) = scored.iter().find(|s| s.run == r.run_id) {
                o += &crate::cmd_plugins::render_stored(s);
            }
        }
        o += &format!(
            "stored in {} — browse with: draftlens serve --db {}\n",
            a.db.display(),
            a.db.display()
        );
        o
    })
}

/// One run in `run --json`: the run's outcome with its metrics as stored, in the shape of
/// `runs show --json` (docs/json.md).
#[derive(Serialize)]
struct RunJson<'a> {
    schema_version: u32,
    run_id: i64,
    name: &'a str,
    prompts: usize,
    blocks: usize,
    /// Run-level metrics, keyed source → name: the native ones and every plugin's.
    metrics: BySource,
    seconds: f64,
    timings: &'a serde_json::Value,
    /// What scoring each plugin did (absent when no plugin was given).
    #[serde(skip_serializing_if = "Option::is_none")]
    plugins: Option<&'a draftlens_plugin_host::StoredScoring>,
}

impl<'a> RunJson<'a> {
    fn new(r: crate::cmd_rescore::RunWithPlugins<'a>, stored: &[MetricRow]) -> Self {
        // Every field of the outcome but its metrics, which come from the store: a field added
        // to RunOutcome fails to compile here until it is placed in the JSON too.
        let RunOutcome {
            run_id,
            name,
            prompts,
            blocks,
            metrics: _,
            seconds,
            timings,
        } = r.run;
        RunJson {
            schema_version: SCHEMA_VERSION,
            run_id: *run_id,
            name,
            prompts: *prompts,
            blocks: *blocks,
            metrics: by_source(stored),
            seconds: *seconds,
            timings,
            plugins: r.plugins,
        }
    }
}

/// `--draft-sampling`: how the drafter's tokens are chosen at T > 0.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DraftSamplingArg {
    /// Each drafted position drawn from the drafter's transformed q_k (vLLM's
    /// draft_sample_method "probabilistic").
    Sampled,
    /// The drafter's most likely token, q a point mass (z-lab's dflash_generate, vLLM's default).
    Greedy,
}

fn parse_temperature(s: &str) -> Result<f64, String> {
    let t = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    check_temperature(t).map_err(|e| e.to_string())
}

fn parse_eagle3_tree(s: &str) -> Result<TreeShape, String> {
    TreeShape::parse(s).map_err(|e| format!("{e:#}"))
}

fn parse_top_p(s: &str) -> Result<f64, String> {
    let p = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    check_top_p(p).map_err(|e| e.to_string())
}

/// The sampling settings of `--temperature`, `--top-p`, the top-k and the draft flag; None at
/// T = 0 (greedy), where giving any other sampling flag is an error rather than ignored.
fn sampling_params(
    temperature: f64,
    top_k: (Option<u32>, &str),
    top_p: f64,
    seed: (Option<u64>, &str),
    draft: Option<DraftSamplingArg>,
) -> Result<Option<SamplingParams>> {
    if temperature == 0.0 {
        let given: Vec<&str> = [
            (top_k.0.is_some(), top_k.1),
            (top_p != 1.0, "--top-p"),
            (seed.0.is_some(), seed.1),
            (draft.is_some(), "--draft-sampling"),
        ]
        .into_iter()
        .filter_map(|(on, flag)| on.then_some(flag))
        .collect();
        if !given.is_empty() {
            bail!(
                "{} set the sampling at T > 0: give --temperature too (0, the default, is greedy decoding)",
                given.join(", ")
            );
        }
        return Ok(None);
    }
    let draft = match draft.unwrap_or(DraftSamplingArg::Sampled) {
        DraftSamplingArg::Sampled => DraftSampling::Sampled,
        DraftSamplingArg::Greedy => DraftSampling::Greedy,
    };
    let params = SamplingParams::new(temperature, top_k.0, top_p, draft)?;
    Ok(Some(params))
}

/// `run`'s sampled evaluation (`--temperature` > 0), checked against its other options.
fn run_sampling(a: &RunArgs) -> Result<Option<SampledEval>> {
    let Some(params) = sampling_params(
        a.temperature,
        (a.sampling_top_k, "--sampling-top-k"),
        a.top_p,
        (a.sampling_seed, "--sampling-seed"),
        a.draft_sampling,
    )?
    else {
        return Ok(None);
    };
    let sampled = SampledEval {
        params,
        seed: a.sampling_seed.unwrap_or(0),
    };
    sampled.check(&EvalOptions {
        top_k: a.anchors.top_k,
        anchors: a.anchors.policy(),
        labels: a.labels,
        ..EvalOptions::default()
    })?;
    Ok(Some(sampled))
}

#[derive(Args)]
pub struct LiveArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Drafter checkpoint folder or GGUF drafter file (DFlash, DFlash2 or EAGLE-3, told from its
    /// config), or target:mtp[:K] (the target's own MTP head drafting K tokens a round, default
    /// 3; docs/live.md).
    #[arg(long)]
    pub drafter: PathBuf,
    /// Fail (exit status 1, after printing every prompt's result) when a prompt's output departs
    /// from plain greedy decoding. Without it each divergence is reported as data and the
    /// command succeeds: τ and the output are kept (docs/live.md).
    #[arg(long)]
    pub strict: bool,
    /// Speculative sampling at temperature T > 0 (docs/live.md): drafts accepted with
    /// probability min(1, p/q), the residual norm(max(0, p − q)) at a rejection. 0: greedy.
    #[arg(long, default_value_t = 0.0, value_parser = parse_temperature, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Top-p of the sampling transform, in (0, 1] (1: none).
    #[arg(long, default_value_t = 1.0, value_parser = parse_top_p, allow_negative_numbers = true)]
    pub top_p: f64,
    /// Top-k of the sampling transform [default: none].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// Seed: each prompt draws from its own stream of it (ChaCha20, stream from the prompt's
    /// sha256), so its output does not depend on the other prompts [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// How drafts are chosen at T > 0 [default: sampled].
    #[arg(long, value_enum)]
    pub draft_sampling: Option<DraftSamplingArg>,
    /// Also decode every prompt by plain greedy decoding at batch 1 on the same backend, timed,
    /// and print the measured speed-up and the cost model's inputs (docs/verdict.md). Greedy
    /// (T = 0) only; the first prompt is decoded once more, untimed, to warm up.
    #[arg(long)]
    pub baseline: bool,
    #[command(flatten)]
    pub timings: crate::args::TimingStoreArgs,
}

impl LiveArgs {
    /// The sampling settings and seed at `--temperature` > 0; None for greedy decoding.
    fn sampling(&self) -> Result<Option<(SamplingParams, u64)>> {
        let params = sampling_params(
            self.temperature,
            (self.top_k, "--top-k"),
            self.top_p,
            (self.seed, "--seed"),
            self.draft_sampling,
        )?;
        if params.is_some() && self.strict {
            bail!("--strict compares the output with greedy decoding: it applies at --temperature 0 only");
        }
        if params.is_some() && (self.baseline || self.timings.store.is_some()) {
            bail!(
                "--baseline and --store time greedy decoding: they apply at --temperature 0 only"
            );
        }
        Ok(params.map(|p| (p, self.seed.unwrap_or(0))))
    }
}

#[derive(Serialize)]
pub struct LiveRow {
    pub id: String,
    pub tau: f64,
    pub rounds: usize,
    pub new_tokens: usize,
    /// Output equals plain greedy decoding token for token; null at T > 0, where the output is a
    /// sample (losslessness there is in distribution, tested statistically).
    pub lossless: Option<bool>,
    pub text: String,
    /// Where the output first departs from plain greedy decoding; null when lossless.
    pub divergence: Option<LiveDivergence>,
    /// `--baseline`: this prompt's decode times (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<draftlens_results::speed::PromptTiming>,
}

/// The engine's `Divergence` with the two tokens decoded (docs/live.md).
#[derive(Serialize)]
pub struct LiveDivergence {
    /// Index into the generated tokens (0 = the first token after the prompt).
    pub position: usize,
    /// The token live decoding produced there (null where its output ended first).
    pub live_token: Option<u32>,
    pub live_text: Option<String>,
    /// The token plain greedy decoding produced there (null where its output ended first).
    pub greedy_token: Option<u32>,
    pub greedy_text: Option<String>,
    /// logit(live_token) − logit(greedy_token) of the target at that position (null where one
    /// output ended first).
    pub logit_margin: Option<f32>,
}

/// What `live` measured, with what it needs to explain a divergence.
pub struct LiveReport {
    pub rows: Vec<LiveRow>,
    /// Tokens per verify pass (the drafter's block size).
    pub block_size: usize,
    pub backend: &'static str,
    pub dtype: &'static str,
    /// The sampling settings and seed at T > 0 (`T=1 top-k=off top-p=1 draft=sampled seed=0`).
    pub sampling: Option<String>,
    /// `--baseline`: the timings over every prompt.
    pub speed: Option<draftlens_results::speed::SpeedSummary>,
}

struct LiveJob<'a> {
    g: &'a Global,
    a: &'a LiveArgs,
    /// `--temperature` > 0: the settings and the seed.
    sampling: Option<(SamplingParams, u64)>,
    /// `--store`: the run the timings go with.
    target_run: Option<&'a crate::cmd_live_speed::TargetRun>,
}

impl BackendJob for LiveJob<'_> {
    type Output = LiveReport;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output> {
        let a = self.a;
        let set = a.target.prompt_set()?;
        let s = a.target.session(be, self.g)?;
        let d = load_linted_drafter(&s, &a.drafter)?;
        let block_size = LiveDrafter::from(&d).block_size();
        let eos = s.eos_ids();
        let tok = s.files.tokenizer()?;
        let max_new = a.target.max_new_tokens;
        let timed = a.baseline || self.target_run.is_some();
        if let Some(t) = self.target_run {
            t.check(&s, &a.drafter, block_size, max_new)?;
        }
        if let (true, Some(p)) = (timed, set.prompts.first()) {
            // Warm-up (kernels compiled, buffers allocated): not timed.
            time_prompt(&s.be, s.model()?, &d, 0, &s.prompt_ids(p)?, max_new, &eos)?;
        }
        let pb = draftlens_engine::progress::bar(set.prompts.len() as u64, "live");
        let mut rows = Vec::new();
        for (n, p) in set.prompts.iter().enumerate() {
            let ids = s.prompt_ids(p)?;
            if let Some((params, seed)) = &self.sampling {
                // A sample equals greedy decoding only by chance: no divergence to report.
                let mut rng = SamplingRng::for_prompt(*seed, prompt_stream(&p.hash())?);
                let max_new = a.target.max_new_tokens;
                let live = live_decode_sampled(
                    &s.be,
                    s.model()?,
                    &d,
                    &ids,
                    max_new,
                    &eos,
                    params,
                    &mut rng,
                )?;
                rows.push(LiveRow {
                    id: p.id.clone(),
                    tau: live.tau(),
                    rounds: live.round_tokens.len(),
                    new_tokens: live.ids.len(),
                    lossless: None,
                    text: tok.decode(&live.ids)?,
                    divergence: None,
                    timing: None,
                });
                pb.inc(1);
                continue;
            }
            let (live, timing) = if timed {
                let index = match self.target_run {
                    Some(t) => t.index_of(p)?,
                    None => n as u32,
                };
                let t = time_prompt(&s.be, s.model()?, &d, index, &ids, max_new, &eos)?;
                (t.live, Some(t.timing))
            } else {
                (
                    live_decode(&s.be, s.model()?, &d, &ids, max_new, &eos)?,
                    None,
                )
            };
            let greedy = s.continuation(&ids, a.target.max_new_tokens)?;
            let divergence = first_divergence(&s.be, s.model()?, &ids, &live.ids, &greedy.ids)?;
            let text_of = |t: Option<u32>| t.map(|t| tok.decode(&[t])).transpose();
            rows.push(LiveRow {
                id: p.id.clone(),
                tau: live.tau(),
                rounds: live.round_tokens.len(),
                new_tokens: live.ids.len(),
                lossless: Some(divergence.is_none()),
                text: tok.decode(&live.ids)?,
                divergence: match divergence {
                    None => None,
                    Some(d) => Some(LiveDivergence {
                        position: d.position,
                        live_text: text_of(d.live_token)?,
                        live_token: d.live_token,
                        greedy_text: text_of(d.greedy_token)?,
                        greedy_token: d.greedy_token,
                        logit_margin: d.logit_margin,
                    }),
                },
                timing,
            });
            pb.inc(1);
        }
        pb.finish_and_clear();
        let timings: Vec<_> = rows.iter().filter_map(|r| r.timing.clone()).collect();
        Ok(LiveReport {
            speed: draftlens_results::speed::SpeedSummary::of(&timings),
            rows,
            block_size,
            backend: s.be.name(),
            dtype: s.be.dtype(),
            sampling: self
                .sampling
                .map(|(params, seed)| format!("{} seed={seed}", params.describe())),
        })
    }
}

impl LiveReport {
    fn diverged(&self) -> usize {
        self.rows.iter().filter(|r| r.divergence.is_some()).count()
    }

    /// One line: how many prompts diverged and why that happens; None when none did.
    fn divergence_summary(&self) -> Option<String> {
        let n = self.diverged();
        (n > 0).then(|| {
            format!(
                "{n} of {} prompts diverged from plain greedy decoding on {} ({}); their τ and output are kept as measured: \
                 the verify pass over {} tokens and the one-token decode step can round a near-tie between two logits \
                 differently in low precision (a small |logit margin|); on the f32 CPU backend both give the same bits, \
                 so a divergence there, or a large margin anywhere, points to a bug (docs/live.md)",
                self.rows.len(),
                self.backend,
                self.dtype,
                self.block_size,
            )
        })
    }

    fn render(&self) -> String {
        let mut o: String = self
            .rows
            .iter()
            .map(|r| {
                format!(
                    "{:<24} τ {:.3}  {} rounds  {} tokens  {}\n",
                    r.id,
                    r.tau,
                    r.rounds,
                    r.new_tokens,
                    match (&r.divergence, r.lossless) {
                        (Some(d), _) => render_divergence(d),
                        (None, Some(_)) => "lossless".to_string(),
                        (None, None) => "sampled".to_string(),
                    }
                )
            })
            .collect();
        let macro_tau =
            self.rows.iter().map(|r| r.tau).sum::<f64>() / self.rows.len().max(1) as f64;
        o += &format!(
            "live τ (macro over {} prompts): {:.3}{}\n",
            self.rows.len(),
            macro_tau,
            self.sampling
                .as_ref()
                .map(|s| format!(", sampled at {s}"))
                .unwrap_or_default()
        );
        if let Some(line) = self.divergence_summary() {
            o += &line;
            o.push('\n');
        }
        o
    }

    /// The command's outcome once everything is printed: a divergence fails it only with
    /// `--strict`.
    fn verdict(&self, strict: bool) -> Result<()> {
        let n = self.diverged();
        if strict && n > 0 {
            bail!(
                "--strict: {n} of {} prompts diverged from plain greedy decoding",
                self.rows.len()
            );
        }
        Ok(())
    }
}

/// `diverges at token K: live ID "text" vs greedy ID "text", logit margin M`.
fn render_divergence(d: &LiveDivergence) -> String {
    // A token's text is often whitespace or a control character: quoted and escaped (`{:?}`
    // escapes control characters and bidi controls alike).
    let side = |id: Option<u32>, text: &Option<String>| match (id, text) {
        (Some(id), Some(t)) => format!("{id} {t:?}"),
        (Some(id), None) => id.to_string(),
        _ => "(output ended)".to_string(),
    };
    format!(
        "diverges from greedy at token {}: live {} vs greedy {}{}",
        d.position,
        side(d.live_token, &d.live_text),
        side(d.greedy_token, &d.greedy_text),
        d.logit_margin
            .map(|m| format!(", logit margin {m:+.4}"))
            .unwrap_or_default()
    )
}

/// The drafter `live` and `bench-costs` name (`load_drafter`), a checkpoint linted first as
/// `run` lints it (an error finding refuses it); the MTP head is checked by its loader.
pub fn load_linted_drafter<B: Backend>(
    s: &draftlens_engine::session::Session<B>,
    drafter: &std::path::Path,
) -> Result<draftlens_engine::drafter::Drafter<B>> {
    let is_mtp = drafter
        .to_str()
        .and_then(draftlens_engine::drafter::mtp::steps_of_name)
        .is_some();
    if !is_mtp {
        let findings = lint(&s.files, drafter)?;
        if let Some(f) = findings.iter().find(|f| f.severity == Severity::Error) {
            bail!(
                "{}: drafter is incompatible with the target: {}",
                drafter.display(),
                f.message
            );
        }
    }
    load_drafter(&s.be, drafter, &s.files.identity.path, &s.files.spec)
}

pub fn live(g: &Global, a: LiveArgs) -> Result<()> {
    // Sampling settings are checked before any model is loaded.
    let sampling = a.sampling()?;
    let target_run = crate::cmd_live_speed::TargetRun::open_for(&a.timings, &a.drafter)?;
    let report = dispatch(
        a.target.backend.select(g),
        DEFAULT_CUDA_DEVICE,
        LiveJob {
            g,
            a: &a,
            sampling,
            target_run: target_run.as_ref(),
        },
    )?;
    let stored = match (&target_run, &report.speed) {
        (Some(t), Some(speed)) => {
            let timings: Vec<_> = report
                .rows
                .iter()
                .filter_map(|r| r.timing.clone())
                .collect();
            t.store(speed, &timings)?;
            Some(t.run.id)
        }
        (Some(t), None) => bail!(
            "--store {}: nothing was timed (no prompt took a verify round)",
            t.run.id
        ),
        _ => None,
    };
    match &report.speed {
        // With --baseline the JSON is an object: the rows and the timings (docs/json.md).
        Some(speed) => g.emit(
            &serde_json::json!({"rows": &report.rows, "speed": speed, "stored_with_run": stored}),
            || report.render() + &crate::cmd_live_speed::render(speed, report.block_size, stored),
        )?,
        None => g.emit(&report.rows, || report.render())?,
    }
    // With --json stdout stays one JSON document: the summary goes to stderr.
    if g.json {
        if let Some(line) = report.divergence_summary() {
            eprintln!("warning: {line}");
        }
    }
    report.verdict(a.strict)
}

#[derive(Args)]
pub struct LintArgs {
    /// Target model (.gguf or Hugging Face folder)
    /// [default: the model `draftlens setup` installs in the data folder]
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Drafter checkpoint folder, or a GGUF drafter file (llama.cpp's dflash / eagle3).
    #[arg(long)]
    pub drafter: PathBuf,
    /// Compare the GGUF drafter with the Hugging Face checkpoint folder it was converted from,
    /// tensor by tensor, naming the converter's mistakes (docs/gguf-drafters.md §3).
    #[arg(long, value_name = "HF_DIR")]
    pub against: Option<PathBuf>,
}

pub fn lint_cmd(g: &Global, a: LintArgs) -> Result<()> {
    let target = g.target(&a.target)?;
    let t = TargetFiles::open(&target)?;
    let mut findings = match (&a.against, lint(&t, &a.drafter)) {
        (_, Ok(findings)) => findings,
        // A file the loader refuses: --against reports that refusal (its `gguf` finding) next
        // to the named mistakes that explain it.
        (Some(_), Err(_)) => Vec::new(),
        (None, Err(e)) => return Err(e),
    };
    if let Some(hf) = &a.against {
        let more =
            draftlens_engine::drafter::gguf::against::against(&a.drafter, hf, t.spec.num_layers)?;
        findings.extend(more);
        findings.sort_by(|x, y| y.severity.cmp(&x.severity));
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    g.emit(&findings, || {
        let mut o: String = findings
            .iter()
            .map(|f| {
                format!(
                    "{:<8} {:<18} {}\n",
                    format!("{:?}", f.severity).to_lowercase(),
                    f.code,
                    f.message
                )
            })
            .collect();
        o += &format!("{} findings, {} errors\n", findings.len(), errors);
        o
    })?;
    if errors > 0 {
        bail!(
            "{}: {errors} incompatibilities with {}",
            a.drafter.display(),
            target.display()
        );
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum RunsCmd {
    /// List runs (newest first).
    Ls {
        #[arg(long, default_value = "runs.sqlite")]
        db: PathBuf,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one run: configuration, status and run-level metrics.
    Show {
        /// Run id, uid or a unique uid prefix (≥ 6 hex characters).
        run: String,
        #[arg(long, default_value = "runs.sqlite")]
        db: PathBuf,
    },
}

pub fn runs(g: &Global, c: RunsCmd) -> Result<()> {
    match c {
        RunsCmd::Ls { db, limit } => {
            let store = Store::open_existing(&db)?;
            let (rows, total) = store.runs(&RunFilter {
                limit,
                descending: true,
                ..Default::default()
            })?;
            let infos: Vec<_> = rows.iter().map(|r| &r.run).collect();
            g.emit(&infos, || {
                // Stored text may come from outside (imports, pushes): no escape sequences or
                // bidi controls reach the terminal.
                let mut o: String = infos
                    .iter()
                    .map(|r| {
                        format!(
                            "{:>5}  {:<9} {:<12} {:<8} {:<6} {}\n",
                            r.id,
                            r.status.as_str(),
                            r.mode.as_str(),
                            printable(&r.drafter_family),
                            printable(&r.backend),
                            printable(&r.name)
                        )
                    })
                    .collect();
                o += &format!("{} of {total} runs\n", infos.len());
                o
            })
        }
        RunsCmd::Show { run, db } => {
            let store = Store::open_existing(&db)?;
            let id = draftlens_web::compare::resolve_run(&store, &run)?;
            let Some(d) = store.run(id)? else {
                bail!("{}: no run {run}", db.display())
            };
            let metrics = store.metrics(id)?;
            let plugins = store.plugin_runs(id)?;
            let eval = store.run_eval(id)?;
            /// docs/json.md.
            #[derive(Serialize)]
            struct Show<'a> {
                schema_version: u32,
                run: &'a draftlens_results::store::RunDetail,
                /// `metrics` (run level, as `run --json` gives them), `prompt_metrics`,
                /// `category_metrics`: each keyed source → name.
                #[serde(flatten)]
                metrics: ScopedMetrics,
                /// Which plugin file (sha256) produced each plugin source's rows.
                plugins: &'a [draftlens_results::store::PluginProvenance],
                /// The evaluation identity and shard (docs/scale-out.md §2); null for older runs.
                eval: &'a Option<draftlens_results::store::RunEval>,
            }
            let show = Show {
                schema_version: SCHEMA_VERSION,
                run: &d,
                metrics: scoped(&metrics),
                plugins: &plugins,
                eval: &eval,
            };
            g.emit(&show, || {
                // Every stored string may come from outside (imports, pushes, plugins): no
                // escape sequences or bidi controls reach the terminal.
                let r = &d.run;
                let mut o = format!(
                    "run {} · {}\n  status {}{}\n  mode {}  backend {} ({})  B {}  top-K {}\n  target {} ({})\n  drafter {}{}\n  prompts {} ({} prompts, {} blocks)\n",
                    r.id,
                    printable(&r.name),
                    r.status.as_str(),
                    r.error.as_deref().map(|e| format!(": {}", printable(e))).unwrap_or_default(),
                    r.mode.as_str(),
                    printable(&r.backend),
                    printable(&r.dtype),
                    r.block_size,
                    r.top_k,
                    printable(&r.target_path),
                    printable(&r.target_arch),
                    printable(&r.drafter_path),
                    r.drafter_step.map(|s| format!(" step {s}")).unwrap_or_default(),
                    printable(&r.prompt_set_name),
                    r.num_prompts,
                    r.num_blocks
                );
                // Every run has a family (schema v6; older runs read as their identity's kind).
                o += &format!("  drafter family {}\n", printable(&r.drafter_family));
                if let Some(e) = &eval {
                    o += &format!(
                        "  evaluation {}{}{}\n",
                        e.identity,
                        e.shard.map(|s| format!("  shard {s} ({} of {} prompts)", e.run_prompts, e.set_prompts)).unwrap_or_default(),
                        e.merged_from.as_ref().map(|m| format!("  merged from {} shards", m.len())).unwrap_or_default()
                    );
                }
                for m in metrics.iter().filter(|m| m.scope == draftlens_results::store::MetricScope::Run) {
                    o += &format!(
                        "  {:<16} {:<26} {:>9.4}  (n={})  {}\n",
                        printable(&m.source),
                        printable(&m.name),
                        m.value,
                        m.count,
                        printable(&m.description)
                    );
                }
                for p in &plugins {
                    o += &format!(
                        "  plugin {} {} sha256 {} ({}){}\n",
                        printable(&p.source),
                        printable(&p.version),
                        if p.sha256.is_empty() { "unknown".into() } else { printable(&p.sha256) },
                        if p.builtin { "built-in".into() } else { printable(&p.file) },
                        p.stale_since
                            .as_deref()
                            .map(|t| format!(" — STALE since {t}: a later scoring failed"))
                            .unwrap_or_default()
                    );
                }
                for f in &d.failures {
                    o += &format!(
                        "  plugin {} failed ({}): {}\n",
                        printable(&f.plugin),
                        printable(&f.kind),
                        printable(&f.message)
                    );
                }
                o
            })
        }
    }
}

#[cfg(test)]
#[path = "cmd_eval_tests.rs"]
mod tests;
