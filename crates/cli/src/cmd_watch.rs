//! `watch DIR --drafter-series NAME`: evaluate each new checkpoint of a training run as it
//! appears, through the same path as `run` (the logic is `draftlens_engine::watch`). With `--slurm`
//! each checkpoint is a Slurm job running `draftlens run` on it (`cmd_watch_slurm.rs`).

#[path = "cmd_watch_slurm.rs"]
mod slurm;

use crate::args::{AnchorArgs, TargetArgs};
use crate::common::Global;
use anyhow::Result;
use clap::Args;
use draftlens_engine::backend::{dispatch, Backend, BackendJob, DEFAULT_CUDA_DEVICE};
use draftlens_engine::drafter::eval::{EvalOptions, Labels};
use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
use draftlens_engine::identity::IdentityStore;
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::session::Session;
use draftlens_engine::watch::{watch, ReadyCheckpoint, WatchEvent, WatchHooks, WatchOptions};
use draftlens_results::store::{RunMode, Store};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub struct WatchArgs {
    /// The folder a training run writes its checkpoints into (one sub-folder with a
    /// config.json per checkpoint, the step in its name).
    pub dir: PathBuf,
    /// Series the runs belong to (the τ-vs-step page groups runs by it).
    #[arg(long)]
    pub drafter_series: String,
    #[command(flatten)]
    pub target: TargetArgs,
    /// SQLite database of runs (also remembers which checkpoints were evaluated).
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Seconds every file of a checkpoint must stay unchanged before it is taken as complete.
    #[arg(long, default_value_t = 60.0)]
    pub settle: f64,
    /// Seconds between scans of DIR.
    #[arg(long, default_value_t = 10.0)]
    pub poll: f64,
    /// Deal with the checkpoints present now, then exit (instead of watching for more).
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub anchors: AnchorArgs,
    /// Also push each run to this team server (token: DRAFTLENS_TOKEN or --token-file).
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, requires = "server")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub plugins: crate::cmd_plugins::PluginArgs,
    /// Submit each complete checkpoint as a Slurm job (`draftlens run` on it with these
    /// options; --gpus, --partition, --cpus-per-task, --time, --sbatch as for `draftlens
    /// slurm`) instead of evaluating it here (docs/scale-out.md §10).
    #[arg(long)]
    pub slurm: bool,
    /// With --slurm: folder of the job scripts, the jobs' databases and logs, on a file system
    /// the nodes share [default: DB.slurm].
    #[arg(long, requires = "slurm")]
    pub slurm_dir: Option<PathBuf>,
    #[command(flatten)]
    pub job: crate::cmd_slurm::JobArgs,
}

/// Prints a watch event (a JSON line with --json).
pub(crate) fn report(g: &Global, e: &WatchEvent) {
    if g.json {
        println!("{}", serde_json::to_string(e).unwrap_or_default());
        return;
    }
    let step = |s: &Option<u64>| s.map(|s| format!(" (step {s})")).unwrap_or_default();
    match e {
        WatchEvent::Evaluating { dir, step: s } => {
            println!("evaluating {}{}", dir.display(), step(s))
        }
        WatchEvent::Submitted { dir, step: s, job } => {
            println!("submitted Slurm job {job} for {}{}", dir.display(), step(s))
        }
        WatchEvent::Evaluated { dir, run_uid, .. } => {
            println!("stored run {run_uid} for {}", dir.display())
        }
        WatchEvent::Pushed { run_uid } => println!("pushed run {run_uid}"),
        WatchEvent::PushFailed { run_uid, error } => {
            println!("push of run {run_uid} failed (retried at the next scan): {error}")
        }
        WatchEvent::Broken { dir, problem } => {
            println!("skipping broken checkpoint {}: {problem}", dir.display())
        }
        WatchEvent::Failed { dir, error } => {
            println!("evaluation of {} failed: {error}", dir.display())
        }
        WatchEvent::Abandoned { dir } => println!(
            "stopped: {} abandoned (its partial run was deleted; it is evaluated on the next start)",
            dir.display()
        ),
    }
}

/// The push options of `--server`.
pub(crate) fn push_options(a: &WatchArgs) -> Result<Option<draftlens_web::push::PushOptions>> {
    Ok(match &a.server {
        Some(url) => Some(draftlens_web::push::PushOptions::new(
            url,
            draftlens_web::cli::push_token(a.token_file.as_deref())?,
        )),
        None => None,
    })
}

/// The evaluation options of the watch (`run`'s defaults for what watch does not expose).
pub(crate) fn eval_options(a: &WatchArgs) -> EvalOptions {
    EvalOptions {
        top_k: a.anchors.top_k,
        anchors: a.anchors.policy(),
        prompt_anchors: false,
        ctx_inclusive: false,
        labels: Labels::Target,
        anchor_batch: a.anchors.anchor_batch,
        sampling: None,
        eagle3_tree: None,
    }
}

/// The watch's memory key (docs/scale-out.md, "Watch") from its parts.
pub(crate) fn job_key(job_json: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(job_json.to_string().as_bytes()))
}

pub(crate) fn watch_options(a: &WatchArgs, job: String) -> WatchOptions {
    WatchOptions {
        dir: a.dir.clone(),
        job,
        settle: Duration::from_secs_f64(a.settle.max(0.0)),
        poll: Duration::from_secs_f64(a.poll.max(0.01)),
        once: a.once,
    }
}

struct Hooks<'a, B: Backend> {
    s: &'a Session<B>,
    set: &'a PromptSet,
    a: &'a WatchArgs,
    g: &'a Global,
    opts: RunOptions,
    store: Store,
    ids: IdentityStore,
    plugins: Option<crate::cmd_rescore::Prepared>,
    push: Option<draftlens_web::push::PushOptions>,
}

impl<B: Backend> WatchHooks for Hooks<'_, B> {
    fn evaluate(&mut self, ck: &ReadyCheckpoint) -> Result<i64> {
        let spec = DrafterSpec::Checkpoint {
            dir: ck.dir.clone(),
            step: ck.step,
            series: self.a.drafter_series.clone(),
        };
        let out = run_eval(self.s, &spec, self.set, &self.opts, &self.store)?;
        crate::cmd_rescore::score_runs(self.plugins.as_ref(), &self.a.db, [out.run_id])?;
        Ok(out.run_id)
    }

    fn push(&mut self, run_id: i64) -> Option<Result<()>> {
        let p = self.push.as_ref()?;
        Some(draftlens_web::push::push_runs(&self.store, &[run_id], p).map(|_| ()))
    }

    fn sha256(&mut self, file: &Path) -> Result<String> {
        self.ids.file_sha256(file)
    }

    fn report(&mut self, e: &WatchEvent) {
        report(self.g, e)
    }
}

struct Job<'a> {
    g: &'a Global,
    a: &'a WatchArgs,
}

impl BackendJob for Job<'_> {
    type Output = draftlens_engine::watch::WatchSummary;
    fn run<B: Backend>(self, be: B) -> Result<Self::Output> {
        let (a, g) = (self.a, self.g);
        let set = a.target.prompt_set()?;
        let s = a.target.session(be, g)?;
        let eval = eval_options(a);
        // What makes two watchers the same evaluation (docs/scale-out.md, "Watch").
        let job_json = serde_json::json!({
            "target": s.files.identity.weights_sha256()?, "prompts": set.sha256,
            "max_new_tokens": a.target.max_new_tokens, "eval": eval, "backend": s.be.name(),
            "dtype": s.be.dtype(), "series": a.drafter_series,
        });
        let job = job_key(&job_json);
        let push = push_options(a)?;
        let mut hooks = Hooks {
            s: &s,
            set: &set,
            a,
            g,
            opts: RunOptions {
                name: None,
                mode: RunMode::Deployment,
                eval,
                max_new_tokens: a.target.max_new_tokens,
                fail_after: None,
            },
            store: Store::open(&a.db)?,
            ids: IdentityStore::new(s.cache.root()),
            plugins: crate::cmd_rescore::Prepared::new(&a.plugins)?,
            push,
        };
        let opts = watch_options(a, job);
        let store = Store::open(&a.db)?;
        watch(&opts, &store, &mut hooks)
    }
}

/// `matches`: the watch command's own, whose options `--slurm` passes on to its jobs.
pub fn run(g: &Global, a: WatchArgs, matches: &clap::ArgMatches) -> Result<()> {
    let j = &a.job;
    if !a.slurm
        && (j.gpus != 1
            || j.partition.is_some()
            || j.cpus_per_task.is_some()
            || j.time.is_some()
            || !j.sbatch.is_empty())
    {
        anyhow::bail!(
            "--gpus, --partition, --cpus-per-task, --time and --sbatch are Slurm job options: \
             add --slurm to evaluate each checkpoint as a Slurm job"
        );
    }
    let summary = if a.slurm {
        slurm::watch_slurm(g, &a, matches)?
    } else {
        dispatch(
            a.target.backend.select(g),
            DEFAULT_CUDA_DEVICE,
            Job { g, a: &a },
        )?
    };
    if !g.json {
        if !summary.submitted.is_empty() {
            print!("{} submitted to Slurm, ", summary.submitted.len());
        }
        println!(
            "{} evaluated, {} broken, {} failed{}",
            summary.evaluated.len(),
            summary.broken.len(),
            summary.failed.len(),
            if summary.interrupted {
                " (stopped by a signal)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
