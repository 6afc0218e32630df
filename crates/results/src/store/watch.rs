//! What `draftlens watch` remembers (`crate::watch`): one row per (job, checkpoint folder,
//! weights sha256) it evaluated, found broken, failed on, or submitted as a Slurm job.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchStatus {
    Evaluated,
    Broken,
    Failed,
    /// `watch --slurm`: a Slurm job evaluates it ([`WatchRecord::slurm_job`]); the watcher
    /// replaces the record once the job has ended.
    Submitted,
}

impl WatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchStatus::Evaluated => "evaluated",
            WatchStatus::Broken => "broken",
            WatchStatus::Failed => "failed",
            WatchStatus::Submitted => "submitted",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatchRecord {
    pub job: String,
    pub path: String,
    pub sha256: String,
    pub step: Option<i64>,
    pub status: WatchStatus,
    pub run_uid: Option<String>,
    pub pushed: bool,
    pub message: Option<String>,
    pub at: String,
    /// The Slurm job id (`watch --slurm`).
    pub slurm_job: Option<String>,
}

fn record_of(r: &Row) -> rusqlite::Result<WatchRecord> {
    let status: String = r.get("status")?;
    Ok(WatchRecord {
        job: r.get("job")?,
        path: r.get("path")?,
        sha256: r.get("sha256")?,
        step: r.get("step")?,
        status: match status.as_str() {
            "evaluated" => WatchStatus::Evaluated,
            "broken" => WatchStatus::Broken,
            "submitted" => WatchStatus::Submitted,
            _ => WatchStatus::Failed,
        },
        run_uid: r.get("run_uid")?,
        pushed: r.get::<_, i64>("pushed")? != 0,
        message: r.get("message")?,
        at: r.get("at")?,
        slurm_job: r.get("slurm_job")?,
    })
}

impl Store {
    /// The record of a checkpoint version, if the watcher dealt with it.
    pub fn watch_record(&self, job: &str, path: &str, sha256: &str) -> Result<Option<WatchRecord>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT * FROM watch_checkpoint WHERE job = ?1 AND path = ?2 AND sha256 = ?3",
                params![job, path, sha256],
                record_of,
            )
            .optional()?)
        })
    }

    /// Records (or replaces) what the watcher did with a checkpoint version.
    pub fn put_watch_record(&self, r: &WatchRecord) -> Result<()> {
        self.write(|c| {
            c.execute(
                "INSERT OR REPLACE INTO watch_checkpoint (job, path, sha256, step, status, run_uid, pushed, message, at, slurm_job) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![r.job, r.path, r.sha256, r.step, r.status.as_str(), r.run_uid, r.pushed as i64, r.message, r.at, r.slurm_job],
            )?;
            Ok(())
        })
    }

    /// Every record of a job, by step.
    pub fn watch_records(&self, job: &str) -> Result<Vec<WatchRecord>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT * FROM watch_checkpoint WHERE job = ?1 ORDER BY step, path, at",
            )?;
            let v = stmt
                .query_map([job], record_of)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    /// The largest run id so far (0 for none): runs created later have larger ids.
    pub fn last_run_id(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("SELECT coalesce(max(id), 0) FROM run", [], |r| r.get(0))?))
    }

    /// Runs of `drafter_path` created after run `after` (the runs of one evaluation attempt).
    pub fn runs_of_drafter_after(&self, drafter_path: &str, after: i64) -> Result<Vec<i64>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id FROM run WHERE drafter_path = ?1 AND id > ?2 ORDER BY id",
            )?;
            let v = stmt
                .query_map(params![drafter_path, after], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<i64>>>()?;
            Ok(v)
        })
    }
}
