//! `draftlens slurm`: an evaluation split into shards as a Slurm job array, plus a merge job that
//! runs once every task succeeded (docs/scale-out.md §4). It writes two scripts; `--submit` hands
//! them to `sbatch`. Slurm schedules; draftlens only says what each task runs.
//!
//! Layout under `--dir`: `eval.sbatch` (the array: task i runs `draftlens run --shard i/N` into
//! `shards/shard-i.sqlite`), `merge.sbatch` (`draftlens merge shards/shard-*.sqlite --db DB`),
//! `logs/`. A failed task is resubmitted alone with `sbatch --array=i eval.sbatch`; its shard's
//! target states come from the cache, and `merge` takes the complete run of each shard.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::common::Global;

#[derive(Args)]
pub struct SlurmArgs {
    /// Number of shards: one array task each.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..))]
    pub shards: u32,
    /// Folder of the scripts, the shard databases (shards/) and the logs (logs/); on a file
    /// system every node sees.
    #[arg(long, default_value = "draftlens-slurm")]
    pub dir: PathBuf,
    /// Database the merge job writes the merged run to [default: DIR/merged.sqlite].
    #[arg(long)]
    pub db: Option<PathBuf>,
    #[command(flatten)]
    pub job: JobArgs,
    /// At most this many array tasks at once (`--array=0-N%M`).
    #[arg(long)]
    pub max_parallel: Option<u32>,
    /// Submit both jobs with sbatch (else only write the scripts and print how to submit them).
    #[arg(long)]
    pub submit: bool,
    /// `draftlens run` options of the evaluation, after `--` (without --shard and --db), e.g.
    /// `-- --target m.gguf --drafter ckpt/ --prompts p.jsonl`.
    #[arg(last = true, required = true, value_name = "RUN OPTIONS")]
    pub run: Vec<String>,
}

/// Where Slurm runs an evaluation job and with what: the flags `slurm` and `watch --slurm`
/// share.
#[derive(Args, Clone, Debug)]
pub struct JobArgs {
    /// GPUs per evaluation job or array task (`#SBATCH --gpus`; 0 for a CPU evaluation).
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// Slurm partition of every job.
    #[arg(long)]
    pub partition: Option<String>,
    /// CPUs per evaluation job or array task.
    #[arg(long)]
    pub cpus_per_task: Option<u32>,
    /// Time limit per evaluation job or array task (Slurm's format, e.g. 2:00:00).
    #[arg(long)]
    pub time: Option<String>,
    /// Another `#SBATCH` option for every job (repeatable), e.g. --sbatch=--account=ml.
    #[arg(long = "sbatch", value_name = "OPTION", allow_hyphen_values = true)]
    pub sbatch: Vec<String>,
}

impl JobArgs {
    /// The `#SBATCH` lines of an evaluation job's resources (GPUs, CPUs, time).
    pub fn resource_lines(&self) -> String {
        let mut o = String::new();
        if self.gpus > 0 {
            let _ = writeln!(o, "#SBATCH --gpus={}", self.gpus);
        }
        if let Some(c) = self.cpus_per_task {
            let _ = writeln!(o, "#SBATCH --cpus-per-task={c}");
        }
        if let Some(t) = &self.time {
            let _ = writeln!(o, "#SBATCH --time={t}");
        }
        o
    }

    /// The `#SBATCH` lines every job shares: working folder, partition, the extra options.
    pub fn common_lines(&self, cwd: &Path) -> String {
        let mut o = format!("#SBATCH --chdir={}\n", cwd.display());
        if let Some(p) = &self.partition {
            let _ = writeln!(o, "#SBATCH --partition={p}");
        }
        for x in &self.sbatch {
            let _ = writeln!(o, "#SBATCH {x}");
        }
        o
    }
}

#[derive(Serialize)]
struct Out {
    eval_script: PathBuf,
    merge_script: PathBuf,
    db: PathBuf,
    shards: u32,
    /// Slurm job ids (with --submit).
    array_job: Option<String>,
    merge_job: Option<String>,
}

/// `s` quoted for a POSIX shell: in single quotes, each `'` written as `'\''`. Every word a
/// job script takes from the user or from a path goes through it.
pub fn sh(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `exec` line of a job script: `dl run`, the options the script sets itself (`own`,
/// shell words already), then the user's `run` options, each quoted, as given.
pub fn exec_run(dl: &str, own: &str, user: &[String]) -> String {
    let user: Vec<String> = user.iter().map(|x| sh(x)).collect();
    format!("exec {dl} run {own} {}\n", user.join(" "))
}

pub fn abs(p: &Path) -> Result<PathBuf> {
    // A `random:DIR` target: its folder made absolute, the prefix kept.
    if let Some(dir) = draftlens_engine::model::random_target::random_dir(p) {
        let prefix = draftlens_engine::model::random_target::PREFIX;
        return Ok(PathBuf::from(format!("{prefix}{}", abs(&dir)?.display())));
    }
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// `draftlens` with the global options the jobs must share with this invocation.
pub fn draftlens_cmd(g: &Global) -> Result<String> {
    let exe = std::env::current_exe().context("cannot find the draftlens executable")?;
    let mut c = sh(&exe.display().to_string());
    if let Some(d) = &g.cache_dir {
        c += &format!(" --cache-dir {}", sh(&abs(d)?.display().to_string()));
    }
    if let Some(d) = &g.data_dir {
        c += &format!(" --data-dir {}", sh(&abs(d)?.display().to_string()));
    }
    Ok(c)
}

/// Runs `sbatch ARGS` (with `--parsable`) and returns the job id it printed.
pub fn sbatch(args: &[&str]) -> Result<String> {
    let o = Command::new("sbatch")
        .args(args)
        .output()
        .context("cannot run sbatch (is Slurm installed and on PATH?)")?;
    if !o.status.success() {
        bail!(
            "sbatch {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    // --parsable prints "id" or "id;cluster".
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        bail!("sbatch {}: unexpected output {out:?}", args.join(" "));
    }
    Ok(id)
}

pub fn run(g: &Global, a: SlurmArgs) -> Result<()> {
    for x in &a.run {
        let flag = x.split('=').next().unwrap_or("");
        if matches!(flag, "--shard" | "--db" | "--json") {
            bail!(
                "draftlens slurm sets {flag} of each task itself: leave it out of the run options"
            );
        }
    }
    let dir = abs(&a.dir)?;
    for sub in ["shards", "logs"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("{}: cannot create folder", dir.join(sub).display()))?;
    }
    let db = abs(&a.db.clone().unwrap_or_else(|| dir.join("merged.sqlite")))?;
    let cwd = std::env::current_dir()?;
    let dl = draftlens_cmd(g)?;
    let n = a.shards;
    let shards_dir = sh(&dir.join("shards").display().to_string());

    let mut eval = String::from("#!/bin/bash\n");
    let _ = writeln!(
        eval,
        "# Written by `draftlens slurm` (docs/scale-out.md): one array task per shard of {n}.\n\
         # Resubmit failed task i alone: sbatch --array=i {}",
        dir.join("eval.sbatch").display()
    );
    let _ = writeln!(eval, "#SBATCH --job-name=draftlens-eval");
    let array = match a.max_parallel {
        Some(m) => format!("0-{}%{m}", n - 1),
        None => format!("0-{}", n - 1),
    };
    let _ = writeln!(eval, "#SBATCH --array={array}");
    let _ = writeln!(
        eval,
        "#SBATCH --output={}/logs/shard-%a.%A.out",
        dir.display()
    );
    eval += &a.job.resource_lines();
    eval += &a.job.common_lines(&cwd);
    eval += "set -euo pipefail\n\
             i=\"${SLURM_ARRAY_TASK_ID:?not a Slurm array task}\"\n";
    eval += &exec_run(
        &dl,
        &format!("--shard \"$i/{n}\" --db {shards_dir}/shard-\"$i\".sqlite"),
        &a.run,
    );

    let mut merge = String::from("#!/bin/bash\n");
    let _ = writeln!(
        merge,
        "# Written by `draftlens slurm` (docs/scale-out.md): merges the {n} shard databases once the\n\
         # array succeeded (submitted with --dependency=afterok:<array job>)."
    );
    let _ = writeln!(merge, "#SBATCH --job-name=draftlens-merge");
    let _ = writeln!(
        merge,
        "#SBATCH --output={}/logs/merge.%j.out",
        dir.display()
    );
    // A dependency that can never be met (a task failed) cancels the merge job instead of
    // leaving it pending forever; resubmit it after the failed tasks.
    let _ = writeln!(merge, "#SBATCH --kill-on-invalid-dep=yes");
    merge += &a.job.common_lines(&cwd);
    let _ = write!(
        merge,
        "set -euo pipefail\n\
         exec {dl} merge --db {} {shards_dir}/shard-*.sqlite\n",
        sh(&db.display().to_string())
    );

    let (ep, mp) = (dir.join("eval.sbatch"), dir.join("merge.sbatch"));
    for (p, text) in [(&ep, &eval), (&mp, &merge)] {
        std::fs::write(p, text).with_context(|| format!("{}: cannot write", p.display()))?;
    }
    let (mut array_job, mut merge_job) = (None, None);
    if a.submit {
        let id = sbatch(&["--parsable", &ep.display().to_string()])?;
        let dep = format!("--dependency=afterok:{id}");
        merge_job = Some(sbatch(&["--parsable", &dep, &mp.display().to_string()])?);
        array_job = Some(id);
    }
    let out = Out {
        eval_script: ep.clone(),
        merge_script: mp.clone(),
        db: db.clone(),
        shards: n,
        array_job,
        merge_job,
    };
    g.emit(&out, || {
        let mut o = format!(
            "wrote {} ({n} array tasks) and {}\n",
            ep.display(),
            mp.display()
        );
        match (&out.array_job, &out.merge_job) {
            (Some(arr), Some(m)) => {
                o += &format!(
                    "submitted array job {arr} and merge job {m} (after the array succeeds) → {}\n\
                     a failed task i: sbatch --array=i {}, then sbatch --dependency=afterok:<its job id> {}\n",
                    db.display(),
                    ep.display(),
                    mp.display()
                );
            }
            _ => {
                o += &format!(
                    "submit: id=$(sbatch --parsable {}) && sbatch --dependency=afterok:$id {}\n",
                    ep.display(),
                    mp.display()
                );
            }
        }
        o
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_random_target_keeps_its_prefix_when_made_absolute() {
        let cwd = std::env::current_dir().unwrap();
        let want = format!("random:{}", cwd.join("q35").display());
        assert_eq!(abs(Path::new("random:q35")).unwrap(), PathBuf::from(want));
        assert_eq!(
            abs(Path::new("random:/m/q35")).unwrap(),
            PathBuf::from("random:/m/q35")
        );
        assert_eq!(abs(Path::new("/m/q35")).unwrap(), PathBuf::from("/m/q35"));
    }
}
