//! `draftlens watch DIR`: evaluate each checkpoint of a training run as it appears
//! (docs/scale-out.md, "Watch").
//!
//! A checkpoint is a folder of DIR with a `config.json`. It is *complete* when every file in it
//! kept its size and modification time for the settle period and then every `*.safetensors`
//! file's header parses and its tensors end exactly at the end of the file (a file still being
//! written is shorter). A folder that settles but is not complete is *broken*: reported once and
//! skipped (a later rewrite changes its weights' sha256 and it is considered again).
//!
//! Order: checkpoints are taken in step order (the last number of the folder name), and none
//! is evaluated while a checkpoint of a lower step is still settling, so runs are stored step
//! after step.
//!
//! Memory: each (job, folder, weights sha256) dealt with is recorded in the run database
//! (`watch_checkpoint`), so a restarted watcher skips what it did; `job` identifies the
//! evaluation (target, prompt set, options, series), so watching with other options evaluates
//! again.
//!
//! Slurm (`watch --slurm`): instead of evaluating a complete checkpoint itself, the watcher
//! has [`WatchHooks::submit`] hand it to Slurm (a job running `draftlens run` on it) and
//! records the job id (`submitted`); each scan asks [`WatchHooks::poll_job`] about the
//! submitted jobs, and records the run of a job that ended (`evaluated`, the run copied into
//! the watcher's database) or its failure. A restarted watcher follows its submitted jobs
//! instead of submitting them again; `--once` returns when they have all ended.
//!
//! Stopping: [`INTERRUPTED`] (SIGINT, SIGTERM) is checked between scans, while sleeping and by
//! the evaluation between prompts. An evaluation cut short this way is abandoned: the runs it
//! created are deleted (no half-written run stays) and nothing is recorded, so the next start
//! evaluates that checkpoint again.

use crate::drafter::run::INTERRUPTED;
use anyhow::{Context, Result};
use draftlens_results::store::{now_rfc3339, Store, WatchRecord, WatchStatus};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct WatchOptions {
    pub dir: PathBuf,
    /// Identity of the evaluation (see the module doc).
    pub job: String,
    /// How long every file of a checkpoint must stay unchanged.
    pub settle: Duration,
    /// Time between scans of DIR.
    pub poll: Duration,
    /// Return once every checkpoint present has been dealt with (none settling).
    pub once: bool,
}

/// A checkpoint ready to evaluate.
#[derive(Clone, Debug, Serialize)]
pub struct ReadyCheckpoint {
    pub dir: PathBuf,
    pub step: Option<u64>,
    /// sha256 of `model.safetensors` ('' if the checkpoint has none).
    pub sha256: String,
}

/// What the watcher reports as it goes.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum WatchEvent {
    Evaluating {
        dir: PathBuf,
        step: Option<u64>,
    },
    Evaluated {
        dir: PathBuf,
        step: Option<u64>,
        run_uid: String,
    },
    Pushed {
        run_uid: String,
    },
    PushFailed {
        run_uid: String,
        error: String,
    },
    Broken {
        dir: PathBuf,
        problem: String,
    },
    Failed {
        dir: PathBuf,
        error: String,
    },
    Abandoned {
        dir: PathBuf,
    },
    /// `watch --slurm`: a job evaluates the checkpoint.
    Submitted {
        dir: PathBuf,
        step: Option<u64>,
        job: String,
    },
}

/// Where a submitted job stands ([`WatchHooks::poll_job`]).
#[derive(Clone, Debug, PartialEq)]
pub enum JobPoll {
    /// Pending or running.
    Running,
    /// Ended with a complete run, now in the watcher's database (its id there).
    Evaluated(i64),
    /// Ended without a complete run: why.
    Failed(String),
}

/// The hooks the command provides: evaluate one checkpoint into the store (returns the run id),
/// and optionally push a stored run.
pub trait WatchHooks {
    fn evaluate(&mut self, ck: &ReadyCheckpoint) -> Result<i64>;
    /// `None`: runs are only stored.
    fn push(&mut self, _run_id: i64) -> Option<Result<()>> {
        None
    }
    /// `watch --slurm`: submits a job that evaluates the checkpoint and returns its id, in place
    /// of [`WatchHooks::evaluate`]. `None`: the watcher evaluates it itself.
    fn submit(&mut self, _ck: &ReadyCheckpoint) -> Option<Result<String>> {
        None
    }
    /// `watch --slurm`: where the job of a `submitted` record stands. An error (Slurm cannot be
    /// asked now) is reported and the job asked again at the next scan.
    fn poll_job(&mut self, rec: &WatchRecord) -> Result<JobPoll> {
        anyhow::bail!(
            "{}: submitted as a Slurm job, but this watcher does not run with --slurm",
            rec.path
        )
    }
    /// sha256 of a weight file (the identity store remembers it per file version).
    fn sha256(&mut self, file: &Path) -> Result<String>;
    fn report(&mut self, event: &WatchEvent);
}

/// How one scan saw a checkpoint folder.
#[derive(Debug, PartialEq)]
enum Seen {
    Settling,
    Complete,
    Broken(String),
}

/// Files of a folder with their size and mtime (ns): what must stay unchanged to settle.
type Stamp = Vec<(String, u64, u128)>;

fn stamp(dir: &Path) -> Result<Stamp> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))? {
        let e = e?;
        let m = e.metadata()?;
        if m.is_file() {
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            v.push((e.file_name().to_string_lossy().into_owned(), m.len(), mtime));
        }
    }
    v.sort();
    Ok(v)
}

/// Whether a settled checkpoint is complete; the problem if not.
pub fn check_complete(dir: &Path) -> std::result::Result<(), String> {
    let cfg = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg).map_err(|e| format!("config.json: {e}"))?;
    serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| format!("config.json is not valid JSON: {e}"))?;
    let mut weights = 0;
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot list: {e}"))?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            weights += 1;
            check_safetensors(&e.path()).map_err(|p| format!("{name}: {p}"))?;
        }
    }
    if weights == 0 {
        return Err("no .safetensors weights".into());
    }
    Ok(())
}

/// The header parses and the largest tensor end is exactly the data section's length.
fn check_safetensors(path: &Path) -> std::result::Result<(), String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| format!("{len} bytes: shorter than a safetensors header"))?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 || 8 + n > len {
        return Err(format!(
            "header length {n} runs past the end of the {len}-byte file (truncated?)"
        ));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| e.to_string())?;
    let h: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format!("unreadable header: {e}"))?;
    let end = h
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, v)| v["data_offsets"][1].as_u64())
        .max()
        .unwrap_or(0);
    let data = len - 8 - n;
    if end != data {
        return Err(format!(
            "the tensors end at byte {end} of the data section, which has {data} bytes (incomplete or corrupt)"
        ));
    }
    Ok(())
}

/// Checkpoint folders of `dir` (with config.json), by step then name.
fn candidates(dir: &Path) -> Result<Vec<(PathBuf, Option<u64>)>> {
    let mut v: Vec<(PathBuf, Option<u64>)> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: cannot list the watched folder", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .map(|p| {
            let step = crate::drafter::DrafterCheckpoint::step_from_name(&p);
            (p, step)
        })
        .collect();
    v.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    Ok(v)
}

/// What [`watch`] did, in order.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchSummary {
    /// Checkpoints handed to Slurm (`--slurm`); each also lands in `evaluated` or `failed` once
    /// its job has ended.
    pub submitted: Vec<String>,
    pub evaluated: Vec<String>,
    pub broken: Vec<String>,
    pub failed: Vec<String>,
    /// Stopped by a signal.
    pub interrupted: bool,
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Sleeps `d`, waking early on an interruption.
fn nap(d: Duration) {
    let end = Instant::now() + d;
    while !interrupted() && Instant::now() < end {
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(100)));
    }
}

/// Watches `opts.dir` until interrupted (or, with `once`, until nothing is left to do).
pub fn watch(
    opts: &WatchOptions,
    store: &Store,
    hooks: &mut dyn WatchHooks,
) -> Result<WatchSummary> {
    if !opts.dir.is_dir() {
        anyhow::bail!("{}: not a folder", opts.dir.display());
    }
    let mut summary = WatchSummary::default();
    // Per folder: its last stamp and since when it has been unchanged.
    let mut stamps: HashMap<PathBuf, (Stamp, Instant)> = HashMap::new();
    loop {
        if interrupted() {
            summary.interrupted = true;
            return Ok(summary);
        }
        let mut settling = false;
        let mut running = follow_jobs(opts, store, hooks, &mut summary)?;
        for (dir, step) in candidates(&opts.dir)? {
            let seen = match stamp(&dir) {
                Err(_) => Seen::Settling, // vanished or unreadable for now
                Ok(st) => {
                    let now = Instant::now();
                    let e = stamps.entry(dir.clone()).or_insert((st.clone(), now));
                    if e.0 != st {
                        *e = (st, now);
                    }
                    if e.1.elapsed() < opts.settle {
                        Seen::Settling
                    } else {
                        match check_complete(&dir) {
                            Ok(()) => Seen::Complete,
                            Err(p) => Seen::Broken(p),
                        }
                    }
                }
            };
            if seen == Seen::Settling {
                // Nothing of a higher step goes before this one.
                settling = true;
                break;
            }
            let weights = dir.join("model.safetensors");
            // A complete checkpoint's weights are readable; one that fails to hash now is
            // recorded under '' and reported by the evaluation.
            let sha = if weights.is_file() {
                hooks.sha256(&weights).unwrap_or_default()
            } else {
                String::new()
            };
            let path = dir.display().to_string();
            if let Some(done) = store.watch_record(&opts.job, &path, &sha)? {
                retry_push(store, hooks, done)?;
                continue;
            }
            let mut rec = WatchRecord {
                job: opts.job.clone(),
                path: path.clone(),
                sha256: sha.clone(),
                step: step.map(|s| s as i64),
                status: WatchStatus::Evaluated,
                run_uid: None,
                pushed: false,
                message: None,
                at: String::new(),
                slurm_job: None,
            };
            if let Seen::Broken(problem) = seen {
                hooks.report(&WatchEvent::Broken {
                    dir: dir.clone(),
                    problem: problem.clone(),
                });
                rec.status = WatchStatus::Broken;
                rec.message = Some(problem);
                rec.at = now_rfc3339();
                store.put_watch_record(&rec)?;
                summary.broken.push(path);
                continue;
            }
            let ck = ReadyCheckpoint {
                dir: dir.clone(),
                step,
                sha256: sha,
            };
            match hooks.submit(&ck) {
                None => {}
                Some(Ok(job)) => {
                    hooks.report(&WatchEvent::Submitted {
                        dir: dir.clone(),
                        step,
                        job: job.clone(),
                    });
                    rec.status = WatchStatus::Submitted;
                    rec.slurm_job = Some(job);
                    rec.at = now_rfc3339();
                    store.put_watch_record(&rec)?;
                    summary.submitted.push(path);
                    running += 1;
                    continue;
                }
                Some(Err(e)) => {
                    // Nothing is recorded: the next scan submits it again (with --once, the
                    // next start does).
                    hooks.report(&WatchEvent::Failed {
                        dir: dir.clone(),
                        error: format!(
                            "cannot submit the Slurm job (tried again at the next scan): {e:#}"
                        ),
                    });
                    summary.failed.push(path);
                    continue;
                }
            }
            hooks.report(&WatchEvent::Evaluating {
                dir: dir.clone(),
                step,
            });
            let before = store.last_run_id()?;
            match hooks.evaluate(&ck) {
                Ok(run_id) => {
                    let uid = store
                        .run(run_id)?
                        .map(|d| d.run.uid)
                        .with_context(|| format!("run {run_id} vanished"))?;
                    hooks.report(&WatchEvent::Evaluated {
                        dir: dir.clone(),
                        step,
                        run_uid: uid.clone(),
                    });
                    rec.run_uid = Some(uid);
                    rec.at = now_rfc3339();
                    store.put_watch_record(&rec)?;
                    summary.evaluated.push(path);
                    retry_push(store, hooks, rec)?;
                }
                Err(_) if interrupted() => {
                    // Abandon: no half-written run stays, nothing is recorded.
                    for id in store.runs_of_drafter_after(&path, before)? {
                        store.delete_run(id)?;
                    }
                    hooks.report(&WatchEvent::Abandoned { dir });
                    summary.interrupted = true;
                    return Ok(summary);
                }
                Err(e) => {
                    let error = format!("{e:#}");
                    hooks.report(&WatchEvent::Failed {
                        dir: dir.clone(),
                        error: error.clone(),
                    });
                    rec.status = WatchStatus::Failed;
                    rec.run_uid = store
                        .runs_of_drafter_after(&path, before)?
                        .last()
                        .and_then(|&id| store.run(id).ok().flatten())
                        .map(|d| d.run.uid);
                    rec.message = Some(error);
                    rec.at = now_rfc3339();
                    store.put_watch_record(&rec)?;
                    summary.failed.push(path);
                }
            }
            if interrupted() {
                summary.interrupted = true;
                return Ok(summary);
            }
        }
        if opts.once && !settling && running == 0 {
            return Ok(summary);
        }
        nap(opts.poll);
    }
}

/// Asks about every submitted job of this watch; records the outcome of those that ended.
/// Returns how many are still pending or running.
fn follow_jobs(
    opts: &WatchOptions,
    store: &Store,
    hooks: &mut dyn WatchHooks,
    summary: &mut WatchSummary,
) -> Result<usize> {
    let mut running = 0;
    for mut rec in store.watch_records(&opts.job)? {
        if rec.status != WatchStatus::Submitted {
            continue;
        }
        let dir = PathBuf::from(&rec.path);
        let job = rec.slurm_job.clone().unwrap_or_default();
        match hooks.poll_job(&rec) {
            Ok(JobPoll::Running) => running += 1,
            Ok(JobPoll::Evaluated(run_id)) => {
                let uid = store
                    .run(run_id)?
                    .map(|d| d.run.uid)
                    .with_context(|| format!("run {run_id} vanished"))?;
                hooks.report(&WatchEvent::Evaluated {
                    dir,
                    step: rec.step.map(|s| s as u64),
                    run_uid: uid.clone(),
                });
                rec.status = WatchStatus::Evaluated;
                rec.run_uid = Some(uid);
                rec.at = now_rfc3339();
                store.put_watch_record(&rec)?;
                summary.evaluated.push(rec.path.clone());
                retry_push(store, hooks, rec)?;
            }
            Ok(JobPoll::Failed(why)) => {
                let error = format!("Slurm job {job}: {why}");
                hooks.report(&WatchEvent::Failed {
                    dir,
                    error: error.clone(),
                });
                rec.status = WatchStatus::Failed;
                rec.message = Some(error);
                rec.at = now_rfc3339();
                store.put_watch_record(&rec)?;
                summary.failed.push(rec.path.clone());
            }
            Err(e) => {
                // Slurm could not be asked now: ask again at the next scan.
                hooks.report(&WatchEvent::Failed {
                    dir,
                    error: format!(
                        "cannot ask Slurm about job {job} (asked again at the next scan): {e:#}"
                    ),
                });
                running += 1;
            }
        }
    }
    Ok(running)
}

/// Pushes an evaluated run not pushed yet (when the command pushes); a failure is reported
/// and retried at the next scan.
fn retry_push(store: &Store, hooks: &mut dyn WatchHooks, mut rec: WatchRecord) -> Result<()> {
    if rec.status != WatchStatus::Evaluated || rec.pushed {
        return Ok(());
    }
    let Some(uid) = rec.run_uid.clone() else {
        return Ok(());
    };
    let Some(id) = store.run_id_by_uid(&uid)? else {
        return Ok(());
    };
    match hooks.push(id) {
        None => Ok(()),
        Some(Ok(())) => {
            hooks.report(&WatchEvent::Pushed { run_uid: uid });
            rec.pushed = true;
            store.put_watch_record(&rec)
        }
        Some(Err(e)) => {
            hooks.report(&WatchEvent::PushFailed {
                run_uid: uid,
                error: format!("{e:#}"),
            });
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(path: &Path, truncate: usize) {
        let data = vec![0u8; 64];
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![16], &data).unwrap();
        let mut bytes = safetensors::serialize([("w", view)], None).unwrap();
        bytes.truncate(bytes.len() - truncate);
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn complete_truncated_and_garbage_checkpoints_are_told_apart() {
        let d = tempfile::tempdir().unwrap();
        let ck = d.path().join("step-1");
        std::fs::create_dir_all(&ck).unwrap();
        assert!(check_complete(&ck).unwrap_err().contains("config.json"));
        std::fs::write(ck.join("config.json"), "{}").unwrap();
        assert!(check_complete(&ck).unwrap_err().contains("no .safetensors"));
        write_st(&ck.join("model.safetensors"), 0);
        check_complete(&ck).unwrap();
        write_st(&ck.join("model.safetensors"), 10);
        let e = check_complete(&ck).unwrap_err();
        assert!(
            e.contains("model.safetensors") && e.contains("incomplete"),
            "{e}"
        );
        std::fs::write(ck.join("model.safetensors"), b"not a checkpoint at all").unwrap();
        let e = check_complete(&ck).unwrap_err();
        assert!(e.contains("runs past the end"), "{e}");
        std::fs::write(ck.join("config.json"), "{").unwrap();
        assert!(check_complete(&ck).unwrap_err().contains("not valid JSON"));
    }
}
