//! `watch DIR --slurm`: each complete checkpoint becomes a Slurm job (docs/scale-out.md §10).
//!
//! The watcher runs no model. For a checkpoint it writes `SLURM_DIR/NAME.sbatch`, a job that
//! runs `draftlens run --drafter CHECKPOINT --drafter-series SERIES --db SLURM_DIR/NAME.sqlite`
//! with the watch's target, anchor and plugin options (resources from the flags `draftlens
//! slurm` takes, the same `#SBATCH` lines), submits it with `sbatch` and records the job id in
//! `watch_checkpoint` (status `submitted`). At every scan it asks `squeue` about its jobs; a job
//! that has ended is judged by its database: a complete run of the checkpoint there is copied
//! into the watcher's database (the same uid, records, metrics and plugin values) and recorded
//! as evaluated (and pushed with `--server`); anything else is recorded as failed, with Slurm's
//! state, the run's error and the job's log. Each job writes its own SQLite file: SQLite's WAL
//! mode needs one host per database, so the watcher's file is written by the watcher only.

use super::{eval_options, job_key, push_options, report, watch_options, WatchArgs};
use crate::cmd_slurm::{abs, draftlens_cmd, sbatch, sh};
use crate::common::Global;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use draftlens_engine::identity::IdentityStore;
use draftlens_results::store::{RunStatus, Store, WatchRecord};
use draftlens_engine::watch::{watch, JobPoll, ReadyCheckpoint, WatchEvent, WatchHooks, WatchSummary};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `draftlens run` options equal to the watch's: the target's (paths made absolute: the job may
/// start elsewhere), the anchors', the plugins' and their sandbox's.
pub(crate) fn run_args(a: &WatchArgs, target: &Path) -> Result<Vec<String>> {
    let t = &a.target;
    let name = |v: Option<clap::builder::PossibleValue>| {
        v.map(|v| v.get_name().to_string()).unwrap_or_default()
    };
    let path = |p: &str| -> Result<String> {
        Ok(if p.starts_with("builtin:") {
            p.to_string()
        } else {
            abs(Path::new(p))?.display().to_string()
        })
    };
    let mut v: Vec<String> = vec![
        "--target".into(),
        abs(target)?.display().to_string(),
        "--prompts".into(),
        path(&t.prompts)?,
    ];
    if let Some(n) = t.limit {
        v.extend(["--limit".into(), n.to_string()]);
    }
    v.extend([
        "--max-new-tokens".into(),
        t.max_new_tokens.to_string(),
        "--backend".into(),
        name(t.backend.to_possible_value()),
        "--gen-batch".into(),
        t.gen_batch.to_string(),
        "--gdn-profile".into(),
        name(t.gdn_profile.to_possible_value()),
        "--top-k".into(),
        a.anchors.top_k.to_string(),
    ]);
    if let Some(n) = a.anchors.stride {
        v.extend(["--stride".into(), n.to_string()]);
    }
    if let Some(n) = a.anchors.sample {
        v.extend(["--sample".into(), n.to_string()]);
    }
    v.extend([
        "--seed".into(),
        a.anchors.seed.to_string(),
        "--anchor-batch".into(),
        a.anchors.anchor_batch.to_string(),
    ]);
    let p = &a.plugins;
    for x in &p.plugins {
        // A path (not a built-in's or an installed plugin's name) is made absolute.
        let x = if x.contains('/') || x.ends_with(".wasm") {
            path(x)?
        } else {
            x.clone()
        };
        v.extend(["--plugin".into(), x]);
    }
    for x in &p.params {
        v.extend(["--param".into(), x.clone()]);
    }
    for d in &p.dirs.plugin_dirs {
        v.extend(["--plugin-dir".into(), abs(d)?.display().to_string()]);
    }
    if !p.plugins.is_empty() {
        let sb = &p.sandbox;
        v.extend([
            "--plugin-time-limit".into(),
            sb.plugin_time_limit.to_string(),
            "--plugin-memory-mib".into(),
            sb.plugin_memory_mib.to_string(),
        ]);
        if let Some(f) = sb.plugin_fuel {
            v.extend(["--plugin-fuel".into(), f.to_string()]);
        }
        if let Some(c) = &sb.plugin_cache {
            v.extend(["--plugin-cache".into(), abs(c)?.display().to_string()]);
        }
        if sb.no_plugin_cache {
            v.push("--no-plugin-cache".into());
        }
    }
    Ok(v)
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
    let args: Vec<String> = run_args.iter().map(|x| sh(x)).collect();
    let _ = write!(
        o,
        "set -euo pipefail\n\
         exec {dl} run --drafter {} --drafter-series {} --db {} {}\n",
        sh(&ck_dir.display().to_string()),
        sh(&a.drafter_series),
        sh(&jobs.join(format!("{name}.sqlite")).display().to_string()),
        args.join(" ")
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
pub(crate) fn watch_slurm(g: &Global, a: &WatchArgs) -> Result<WatchSummary> {
    // Bad prompts, a missing target or an unknown plugin fail here, not in every job.
    let set = a.target.prompt_set()?;
    let target = abs(&g.target(&a.target.target)?)?;
    if !target.exists() {
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
        "eval": eval_options(a), "backend": a.target.backend.to_possible_value().map(|v| v.get_name().to_string()),
        "series": a.drafter_series, "slurm": true,
    });
    let mut hooks = SlurmHooks {
        g,
        a,
        store: Store::open(&a.db)?,
        ids: IdentityStore::new(g.cache()?.root()),
        push: push_options(a)?,
        dl: draftlens_cmd(g)?,
        run_args: run_args(a, &target)?,
        jobs,
        cwd: std::env::current_dir()?,
    };
    let store = Store::open(&a.db)?;
    watch(&watch_options(a, job_key(&job_json)), &store, &mut hooks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        w: WatchArgs,
    }

    /// The job script of a CPU watch with a plugin: the `#SBATCH` lines of the flags, and a
    /// `draftlens run` with every option of the watch (quoted, paths absolute).
    #[test]
    fn job_script_runs_draftlens_run_with_the_watch_options() {
        let c = Cli::parse_from([
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
        let a = &c.w;
        let args = run_args(a, Path::new("/m/t.gguf")).unwrap();
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
            '--max-new-tokens' '8' '--backend' 'cpu' '--gen-batch' '64' '--gdn-profile' 'reference' \
            '--top-k' '8' '--stride' '4' '--seed' '0' '--anchor-batch' '256' '--plugin' 'accept-length' \
            '--plugin-time-limit' '60' '--plugin-memory-mib' '256'\n";
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
