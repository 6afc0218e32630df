//! `watch DIR --slurm`: each complete checkpoint becomes a Slurm job (docs/scale-out.md §10).
//!
//! The watcher runs no model. For a checkpoint it writes `SLURM_DIR/NAME.sbatch`, a job that
//! runs `draftlens run --drafter CHECKPOINT --drafter-series SERIES --db SLURM_DIR/NAME.sqlite`
//! with the watch's target and every other option of the watch command line that `run` takes, as
//! given (resources from the flags `draftlens slurm` takes, the same `#SBATCH` lines), submits it
//! with `sbatch` and records the job id in `watch_checkpoint` (status `submitted`). At every scan
//! it asks `squeue` about its jobs; a job that has ended is judged by its database: a complete
//! run of the checkpoint there is copied into the watcher's database (the same uid, records,
//! metrics and plugin values) and recorded as evaluated (and pushed with `--server`); anything
//! else is recorded as failed, with Slurm's state, the run's error and the job's log. Each job
//! writes its own SQLite file: SQLite's WAL mode needs one host per database, so the watcher's
//! file is written by the watcher only.

use super::{eval_options, job_key, push_options, report, watch_options, WatchArgs};
use crate::cmd_slurm::{abs, draftlens_cmd, exec_run, sbatch, sh};
use crate::common::Global;
use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Args, ValueHint};
use draftlens_engine::identity::IdentityStore;
use draftlens_engine::watch::{
    watch, JobPoll, ReadyCheckpoint, WatchEvent, WatchHooks, WatchSummary,
};
use draftlens_results::store::{RunStatus, Store, WatchRecord};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The watch options each job sets itself rather than taking them from the watch command line.
const SET_BY_THE_JOB: [&str; 3] = ["target", "drafter_series", "db"];

/// The `draftlens run` options of a job: `--target` (absolute: the job may start elsewhere), then
/// every option of the watch command line (`watch`: its matches) that `run` takes too, as the
/// user gave it, paths made absolute. So an option added to a group both commands flatten
/// reaches the jobs without a line here; one the user left out takes `run`'s default, which is
/// the watch's own (the same group).
pub(crate) fn run_args(watch: &ArgMatches, target: &Path) -> Result<Vec<String>> {
    let run_cmd = crate::cmd_eval::RunArgs::augment_args(clap::Command::new("run"));
    let watch_cmd = WatchArgs::augment_args(clap::Command::new("watch"));
    let mut v = vec!["--target".to_string(), abs(target)?.display().to_string()];
    for arg in watch_cmd.get_arguments() {
        let id = arg.get_id().as_str();
        let passed_on = !SET_BY_THE_JOB.contains(&id)
            && run_cmd.get_arguments().any(|r| r.get_id() == arg.get_id())
            && watch
                .value_source(id)
                .is_some_and(|s| s != ValueSource::DefaultValue);
        if !passed_on {
            continue;
        }
        let flag = format!("--{}", arg.get_long().unwrap_or(id));
        if !arg.get_action().takes_values() {
            v.push(flag);
            continue;
        }
        for value in watch.get_raw(id).into_iter().flatten() {
            let value = value
                .to_str()
                .with_context(|| format!("{flag}: the value is not UTF-8"))?;
            v.extend([flag.clone(), job_value(arg, value)?]);
        }
    }
    Ok(v)
}

/// `value` of `arg` for a job: absolute when it names a file, as the job may start elsewhere.
fn job_value(arg: &Arg, value: &str) -> Result<String> {
    let is_path = match arg.get_id().as_str() {
        // `builtin:NAME` or a file.
        "prompts" => !value.starts_with("builtin:"),
        // A path, not a built-in's or an installed plugin's name.
        "plugins" => value.contains('/') || value.ends_with(".wasm"),
        _ => arg.get_value_hint() == ValueHint::AnyPath,
    };
    Ok(if is_path {
        abs(Path::new(value))?.display().to_string()
    } else {
        value.to_string()
    })
}

/// The file name (without extension) of a checkpoint version's job: its folder's name and the
/// start of its weights' sha256, so a checkpoint rewritten in place gets a job of its own.
pub(crate) fn job_name(path: &str, sha256: &str) -> String {
    let folder: String = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{folder}-{}", &sha256[..12.min(sha256.len())])
}

/// The sbatch script evaluating one checkpoint: `dl` is the draftlens command (with its global
/// options), `run_args` [`run_args`], `jobs` the job folder, `cwd` the job's working folder.
pub(crate) fn job_script(
    dl: &str,
    a: &WatchArgs,
    run_args: &[String],
    ck_dir: &Path,
    name: &str,
    jobs: &Path,
    cwd: &Path,
) -> String {
    let mut o = String::from("#!/bin/bash\n");
    let _ = writeln!(
        o,
        "# Written by `draftlens watch --slurm` (docs/scale-out.md §10): evaluates one checkpoint\n\
         # into its own database, which the watcher copies into its own once the job has ended."
    );
    let _ = writeln!(o, "#SBATCH --job-name=draftlens-watch-{name}");
    let _ = writeln!(o, "#SBATCH --output={}/logs/{name}.%j.out", jobs.display());
    o += &a.job.resource_lines();
    o += &a.job.common_lines(cwd);
    o += "set -euo pipefail\n";
    o += &exec_run(
        dl,
        &format!(
            "--drafter {} --drafter-series {} --db {}",
            sh(&ck_dir.display().to_string()),
            sh(&a.drafter_series),
            sh(&jobs.join(format!("{name}.sqlite")).display().to_string()),
        ),
        run_args,
    );
    o
}

/// Slurm's state of a job (`squeue -t all`); `None` once Slurm has forgotten it (it ended a
/// while ago). An error when Slurm cannot be asked.
fn squeue_state(job: &str) -> Result<Option<String>> {
    let o = Command::new("squeue")
        .args(["-h", "-t", "all", "-j", job, "-o", "%T"])
        .output()
        .context("cannot run squeue (is Slurm installed and on PATH?)")?;
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        if err.contains("Invalid job id") {
            return Ok(None);
        }
        bail!("squeue -j {job} failed: {}", err.trim());
    }
    let out = String::from_utf8_lossy(&o.stdout);
    Ok(out
        .lines()
        .next()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty()))
}

/// Whether a job in this state has ended (Slurm's job state codes).
fn ended(state: &str) -> bool {
    [
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    ]
    .iter()
    .any(|s| state.starts_with(s))
}

/// The last non-empty line of a job's log (its error, when `draftlens run` failed), shortened.
fn last_log_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    Some(line.chars().take(300).collect())
}

struct SlurmHooks<'a> {
    g: &'a Global,
    a: &'a WatchArgs,
    store: Store,
    ids: IdentityStore,
    push: Option<draftlens_web::push::PushOptions>,
    dl: String,
    run_args: Vec<String>,
    jobs: PathBuf,
    cwd: PathBuf,
}

impl WatchHooks for SlurmHooks<'_> {
    fn evaluate(&mut self, ck: &ReadyCheckpoint) -> Result<i64> {
        bail!(
            "{}: watch --slurm submits checkpoints, it does not evaluate them",
            ck.dir.display()
        )
    }

    fn submit(&mut self, ck: &ReadyCheckpoint) -> Option<Result<String>> {
        let name = job_name(&ck.dir.display().to_string(), &ck.sha256);
        let script = job_script(
            &self.dl,
            self.a,
            &self.run_args,
            &ck.dir,
            &name,
            &self.jobs,
            &self.cwd,
        );
        let path = self.jobs.join(format!("{name}.sbatch"));
        Some(
            std::fs::write(&path, script)
                .with_context(|| format!("{}: cannot write", path.display()))
                .and_then(|()| sbatch(&["--parsable", &path.display().to_string()])),
        )
    }

    fn poll_job(&mut self, rec: &WatchRecord) -> Result<JobPoll> {
        let job = rec.slurm_job.as_deref().unwrap_or_default();
        let state = squeue_state(job)?;
        if state.as_deref().is_some_and(|s| !ended(s)) {
            return Ok(JobPoll::Running);
        }
        let state = state.unwrap_or_else(|| "ended".into());
        let name = job_name(&rec.path, &rec.sha256);
        let log = self.jobs.join("logs").join(format!("{name}.{job}.out"));
        let db = self.jobs.join(format!("{name}.sqlite"));
        if !db.is_file() {
            return Ok(JobPoll::Failed(format!(
                "{state} without writing {} (log: {}{})",
                db.display(),
                log.display(),
                last_log_line(&log)
                    .map(|l| format!(", ending: {l}"))
                    .unwrap_or_default()
            )));
        }
        let js = Store::open(&db)?;
        let mut last_error = None;
        for id in js.runs_of_drafter_after(&rec.path, 0)?.into_iter().rev() {
            let Some(d) = js.run(id)? else { continue };
            if d.run.status != RunStatus::Complete {
                last_error.get_or_insert(format!(
                    "its run is {}{}",
                    d.run.status,
                    d.run.error.map(|e| format!(": {e}")).unwrap_or_default()
                ));
                continue;
            }
            let ex = js
                .export_run(id, true)?
                .with_context(|| format!("{}: run {id} vanished", db.display()))?;
            let source = format!("slurm-job-{job}");
            self.store
                .import_runs(&source, &source, std::slice::from_ref(&ex))
                .with_context(|| format!("copying run {id} of {}", db.display()))?;
            let here = self
                .store
                .run_id_by_uid(&ex.run.uid)?
                .context("the copied run is missing")?;
            return Ok(JobPoll::Evaluated(here));
        }
        Ok(JobPoll::Failed(format!(
            "{state} without a complete run in {} ({}; log: {}{})",
            db.display(),
            last_error.unwrap_or_else(|| "no run of the checkpoint".into()),
            log.display(),
            last_log_line(&log)
                .map(|l| format!(", ending: {l}"))
                .unwrap_or_default()
        )))
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

/// `watch --slurm`: the watcher of `draftlens_engine::watch` with jobs in place of evaluations.
pub(crate) fn watch_slurm(g: &Global, a: &WatchArgs, matches: &ArgMatches) -> Result<WatchSummary> {
    // Bad prompts, a missing target or an unknown plugin fail here, not in every job.
    let set = a.target.prompt_set()?;
    let target = abs(&g.target(&a.target.target)?)?;
    if !draftlens_engine::model::random_target::target_exists(&target) {
        bail!("{}: no such target", target.display());
    }
    crate::cmd_rescore::Prepared::new(&a.plugins)?;
    let jobs = abs(&match &a.slurm_dir {
        Some(d) => d.clone(),
        None => {
            let mut s = a.db.as_os_str().to_owned();
            s.push(".slurm");
            PathBuf::from(s)
        }
    })?;
    std::fs::create_dir_all(jobs.join("logs"))
        .with_context(|| format!("{}: cannot create", jobs.join("logs").display()))?;
    // The watcher opens no model: its memory is keyed by the target's path, not its weights.
    let job_json = serde_json::json!({
        "target_path": target, "prompts": set.sha256, "max_new_tokens": a.target.max_new_tokens,
        "eval": eval_options(a), "backend": a.target.backend.name(),
        "series": a.drafter_series, "slurm": true,
    });
    let mut hooks = SlurmHooks {
        g,
        a,
        store: Store::open(&a.db)?,
        ids: IdentityStore::new(g.cache()?.root()),
        push: push_options(a)?,
        dl: draftlens_cmd(g)?,
        run_args: run_args(matches, &target)?,
        jobs,
        cwd: std::env::current_dir()?,
    };
    let store = Store::open(&a.db)?;
    watch(&watch_options(a, job_key(&job_json)), &store, &mut hooks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        w: WatchArgs,
    }

    /// A watch command line parsed, with its matches (what `run_args` reads).
    fn parse<const N: usize>(argv: [&str; N]) -> (WatchArgs, ArgMatches) {
        let m = Cli::command().get_matches_from(argv);
        (Cli::from_arg_matches(&m).unwrap().w, m)
    }

    /// The job script of a CPU watch with a plugin: the `#SBATCH` lines of the flags, and a
    /// `draftlens run` with the target and the watch options the user gave (quoted, paths
    /// absolute).
    #[test]
    fn job_script_runs_draftlens_run_with_the_watch_options() {
        let (a, m) = parse([
            "w",
            "/ckpts",
            "--drafter-series",
            "my run",
            "--slurm",
            "--target",
            "/m/t.gguf",
            "--prompts",
            "builtin:mtbench",
            "--max-new-tokens",
            "8",
            "--backend",
            "cpu",
            "--stride",
            "4",
            "--plugin",
            "accept-length",
            "--gpus",
            "0",
            "--partition",
            "ci",
            "--cpus-per-task",
            "2",
            "--time",
            "1:00:00",
            "--sbatch=--account=ml",
        ]);
        let a = &a;
        let args = run_args(&m, Path::new("/m/t.gguf")).unwrap();
        let name = job_name("/ckpts/step 258", &"ab".repeat(32));
        assert_eq!(name, "step_258-abababababab");
        let s = job_script(
            "'/bin/draftlens' --cache-dir '/c'",
            a,
            &args,
            Path::new("/ckpts/step 258"),
            &name,
            Path::new("/j"),
            Path::new("/work"),
        );
        let want = "#!/bin/bash\n\
            # Written by `draftlens watch --slurm` (docs/scale-out.md §10): evaluates one checkpoint\n\
            # into its own database, which the watcher copies into its own once the job has ended.\n\
            #SBATCH --job-name=draftlens-watch-step_258-abababababab\n\
            #SBATCH --output=/j/logs/step_258-abababababab.%j.out\n\
            #SBATCH --cpus-per-task=2\n\
            #SBATCH --time=1:00:00\n\
            #SBATCH --chdir=/work\n\
            #SBATCH --partition=ci\n\
            #SBATCH --account=ml\n\
            set -euo pipefail\n\
            exec '/bin/draftlens' --cache-dir '/c' run --drafter '/ckpts/step 258' --drafter-series 'my run' \
            --db '/j/step_258-abababababab.sqlite' '--target' '/m/t.gguf' '--prompts' 'builtin:mtbench' \
            '--max-new-tokens' '8' '--backend' 'cpu' '--stride' '4' '--plugin' 'accept-length'\n";
        assert_eq!(s, want);
        // A GPU job asks for its GPUs.
        let c = Cli::parse_from([
            "w",
            "/ckpts",
            "--drafter-series",
            "s",
            "--slurm",
            "--gpus",
            "2",
        ]);
        assert!(c.w.job.resource_lines().contains("#SBATCH --gpus=2\n"));
    }

    /// Every option given to the watch that `run` takes too reaches the job's `draftlens run` as
    /// given (paths made absolute), flags without a value included; the options the job sets
    /// itself are not passed on a second time.
    #[test]
    fn options_given_to_the_watch_reach_the_job() {
        let (a, m) = parse([
            "w",
            "/ckpts",
            "--drafter-series",
            "s",
            "--slurm",
            "--db",
            "w.sqlite",
            "--gen-batch",
            "7",
            "--gdn-profile",
            "engine",
            "--limit",
            "3",
            "--prompts",
            "p.jsonl",
            "--top-k",
            "4",
            "--sample",
            "5",
            "--seed",
            "9",
            "--anchor-batch",
            "32",
            "--plugin",
            "my-plugins/x.wasm",
            "--plugin",
            "accept-length",
            "--param",
            "accept-length:k=1",
            "--plugin-dir",
            "pd",
            "--plugin-fuel",
            "100",
            "--no-plugin-cache",
        ]);
        let args = run_args(&m, Path::new("/m/t.gguf")).unwrap();
        let cwd = std::env::current_dir().unwrap();
        let abs = |p: &str| cwd.join(p).display().to_string();
        let want = [
            "--target",
            "/m/t.gguf",
            "--prompts",
            &abs("p.jsonl"),
            "--limit",
            "3",
            "--gen-batch",
            "7",
            "--gdn-profile",
            "engine",
            "--top-k",
            "4",
            "--sample",
            "5",
            "--seed",
            "9",
            "--anchor-batch",
            "32",
            "--plugin",
            &abs("my-plugins/x.wasm"),
            "--plugin",
            "accept-length",
            "--param",
            "accept-length:k=1",
            "--plugin-dir",
            &abs("pd"),
            "--plugin-fuel",
            "100",
            "--no-plugin-cache",
        ];
        assert_eq!(args, want);
        let script = job_script("dl", &a, &args, Path::new("/c"), "n", Path::new("/j"), &cwd);
        assert!(script.contains(" '--gen-batch' '7' "), "{script}");
        // The options the job sets itself are options of both commands (else the list is stale).
        let watch = WatchArgs::augment_args(clap::Command::new("watch"));
        let run = crate::cmd_eval::RunArgs::augment_args(clap::Command::new("run"));
        for id in SET_BY_THE_JOB {
            for cmd in [&watch, &run] {
                assert!(cmd.get_arguments().any(|x| x.get_id() == id), "{id}");
            }
        }
    }

    #[test]
    fn job_states() {
        for s in [
            "COMPLETED",
            "FAILED",
            "CANCELLED by 0",
            "TIMEOUT",
            "OUT_OF_MEMORY",
        ] {
            assert!(ended(s), "{s}");
        }
        for s in [
            "PENDING",
            "RUNNING",
            "COMPLETING",
            "CONFIGURING",
            "SUSPENDED",
        ] {
            assert!(!ended(s), "{s}");
        }
    }
}
