//! Which evaluation a run belongs to (`run_eval`, docs/scale-out.md): the sha256 of its
//! evaluation identity, its shard, how many prompts the whole set and the run hold; and the
//! one-transaction insert of a finished run that `draftlens merge` writes.

use super::*;
use crate::shard::Shard;

/// A run's place in an evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunEval {
    /// sha256 (hex) of `identity_json` ([`crate::shard::EvalIdentity::sha256`]).
    pub identity: String,
    pub identity_json: serde_json::Value,
    /// The shard this run evaluated; None for an unsharded or a merged run.
    pub shard: Option<Shard>,
    /// Prompts of the evaluated set (after `--limit`).
    pub set_prompts: u32,
    /// Prompts this run is to evaluate (its shard's; the whole set when unsharded).
    pub run_prompts: u32,
    /// A merged run: the uids of the shard runs it was merged from, in shard order.
    pub merged_from: Option<Vec<String>>,
}

/// A finished run written at once ([`Store::insert_finished_run`]).
pub struct FinishedRun<'a> {
    pub run: &'a NewRun,
    pub uid: &'a str,
    /// `local`, `import:<file>`, `merge` or `trace:<format>:<file> (corrections)`.
    pub origin: &'a str,
    pub eval: &'a RunEval,
    pub prompts: &'a [RunPrompt],
    pub records: &'a RecordBatch,
    pub metrics: &'a [MetricRow],
    pub timings: &'a serde_json::Value,
}

pub(super) fn insert_eval(tx: &Transaction, run: i64, e: &RunEval, what: &str) -> Result<()> {
    tx.execute(
        "INSERT INTO run_eval (run_id, identity, identity_json, shard_index, shard_count, set_prompts, run_prompts, \
         merged_from_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            run,
            e.identity,
            e.identity_json.to_string(),
            e.shard.map(|s| s.index),
            e.shard.map(|s| s.count),
            e.set_prompts,
            e.run_prompts,
            e.merged_from.as_ref().map(|m| serde_json::json!(m).to_string()),
        ],
    )
    .with_context(|| format!("{what}: run {run}: cannot record its evaluation identity"))?;
    Ok(())
}

const EVAL_COLS: &str =
    "run_eval.identity, run_eval.identity_json, run_eval.shard_index, run_eval.shard_count, \
    run_eval.set_prompts, run_eval.run_prompts, run_eval.merged_from_json";

fn eval_from_row(r: &Row, what: &str) -> Result<RunEval> {
    let ctx = || format!("{what}: bad run_eval row");
    let ij: String = r.get("identity_json")?;
    let mf: Option<String> = r.get("merged_from_json")?;
    let (i, n): (Option<u32>, Option<u32>) = (r.get("shard_index")?, r.get("shard_count")?);
    Ok(RunEval {
        identity: r.get("identity")?,
        identity_json: serde_json::from_str(&ij).with_context(ctx)?,
        shard: match (i, n) {
            (Some(i), Some(n)) => Some(Shard::new(i, n).with_context(ctx)?),
            _ => None,
        },
        set_prompts: r.get("set_prompts")?,
        run_prompts: r.get("run_prompts")?,
        merged_from: mf
            .map(|m| serde_json::from_str(&m))
            .transpose()
            .with_context(ctx)?,
    })
}

impl Store {
    /// [`Store::create_run`] that records the run's evaluation in the same transaction.
    pub fn create_eval_run(&self, run: &NewRun, eval: &RunEval) -> Result<i64> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            let id = insert_run(&tx, run, &new_uid(), "local", &what)?;
            insert_eval(&tx, id, eval, &what)?;
            tx.commit()?;
            Ok(id)
        })
    }

    /// The evaluation a run belongs to (None for runs stored before schema v3 or imported).
    pub fn run_eval(&self, run: i64) -> Result<Option<RunEval>> {
        let what = self.what();
        self.read(|c| {
            c.query_row(
                &format!("SELECT {EVAL_COLS} FROM run_eval WHERE run_id = ?1"),
                [run],
                |r| Ok(eval_from_row(r, &what)),
            )
            .optional()?
            .transpose()
        })
    }

    /// Every shard run of the database (any status) with its evaluation, by run id.
    pub fn shard_runs(&self) -> Result<Vec<(RunInfo, RunEval)>> {
        let what = self.what();
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {RUN_COLS}, {EVAL_COLS} FROM run JOIN run_eval ON run_eval.run_id = run.id \
                 WHERE run_eval.shard_count IS NOT NULL ORDER BY run.id"
            ))?;
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push((run_from_row(r, &what)?, eval_from_row(r, &what)?));
            }
            Ok(out)
        })
    }

    /// Writes a finished (complete) run with its evaluation, prompts, records and metrics in one
    /// transaction under `uid`. When a run with that uid exists already nothing is written and
    /// its id is returned with `false` (so writing the same merge twice is idempotent).
    pub fn insert_finished_run(&self, f: &FinishedRun) -> Result<(i64, bool)> {
        self.insert_finished_run_with(f, &[])
    }

    /// [`Store::insert_finished_run`] with derived data in the same transaction: the per-prompt
    /// statistics of a run without records (a serving engine's trace, `crate::trace`).
    pub fn insert_finished_run_with(
        &self,
        f: &FinishedRun,
        derived: &[Derived],
    ) -> Result<(i64, bool)> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            let exists: Option<i64> = tx
                .query_row("SELECT id FROM run WHERE uid = ?1", [f.uid], |r| r.get(0))
                .optional()?;
            if let Some(id) = exists {
                return Ok((id, false));
            }
            let id = insert_run(&tx, f.run, f.uid, f.origin, &what)?;
            insert_eval(&tx, id, f.eval, &what)?;
            for p in f.prompts {
                insert_prompt(&tx, id, p, &what)?;
            }
            insert_records(&tx, id, f.records, &what)?;
            insert_metrics(&tx, id, f.metrics, &what)?;
            for d in derived {
                tx.execute(
                    "INSERT INTO derived (run_id, kind, version, data) VALUES (?1, ?2, ?3, ?4)",
                    params![id, d.kind, d.version, d.data],
                )?;
            }
            tx.execute(
                "UPDATE run SET status = 'complete', finished_at = ?2, timings_json = ?3, \
                 num_prompts = (SELECT count(*) FROM run_prompt WHERE run_id = ?1) WHERE id = ?1",
                params![id, now_rfc3339(), f.timings.to_string()],
            )?;
            tx.commit()?;
            Ok((id, true))
        })
    }
}
