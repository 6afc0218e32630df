//! Runs in and out of a store: a run exported with its prompts, records, metrics and caches, and
//! idempotent import of exported runs (keyed by run uid), all or nothing.

use super::*;

/// Everything stored for one run, as moved between databases (export and import).
#[derive(Clone, Debug, PartialEq)]
pub struct RunExport {
    pub run: RunInfo,
    pub prompts: Vec<RunPrompt>,
    pub metrics: Vec<MetricRow>,
    pub failures: Vec<PluginFailure>,
    pub records: Option<RecordBatch>,
    pub derived: Vec<Derived>,
    /// Vocabulary of `run.tokenizer_sha256`: (name, pieces).
    pub vocab: Option<(String, Vec<String>)>,
    /// The evaluation the run belongs to (`run_eval`; None for runs stored before schema v3
    /// and for bundles written before it travelled), so an imported shard run is a shard to
    /// `merge` and to a team server (docs/scale-out.md §2, §9).
    pub eval: Option<RunEval>,
    /// Which plugins produced the run's plugin metric rows (`plugin_run`): what a merge of
    /// imported shard runs re-scores with.
    pub plugins: Vec<PluginProvenance>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ImportOutcome {
    /// uids of runs added.
    pub imported: Vec<String>,
    /// uids already present (left unchanged).
    pub skipped: Vec<String>,
}

pub(super) fn import_one(tx: &Transaction, r: &RunExport, source: &str, what: &str) -> Result<()> {
    let info = &r.run;
    let new = info.as_new_run();
    if info.uid.is_empty() || info.uid.len() > 64 {
        bail!("{what}: run uid must be 1..64 characters");
    }
    let origin = format!("import:{source}");
    let id = insert_run(tx, &new, &info.uid, &origin, what)?;
    for p in &r.prompts {
        insert_prompt(tx, id, p, what)?;
    }
    if let Some(rec) = &r.records {
        insert_records(tx, id, rec, what)?;
    }
    insert_metrics(tx, id, &r.metrics, what)?;
    for f in &r.failures {
        tx.execute(
            "INSERT INTO plugin_failure (run_id, plugin, kind, message, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, f.plugin, f.kind, f.message, f.created_at],
        )?;
    }
    for d in &r.derived {
        tx.execute(
            "INSERT OR REPLACE INTO derived (run_id, kind, version, data) VALUES (?1, ?2, ?3, ?4)",
            params![id, d.kind, d.version, d.data],
        )?;
    }
    if let Some(e) = &r.eval {
        super::evals::insert_eval(tx, id, e, what)?;
    }
    for p in &r.plugins {
        tx.execute(
            "INSERT INTO plugin_run (run_id, source, sha256, version, file, builtin, params_json, scored_at, stale_since) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![id, p.source, p.sha256, p.version, p.file, p.builtin as i64, p.params_json, p.scored_at, p.stale_since],
        )
        .with_context(|| format!("{what}: plugin provenance of {}", p.source))?;
    }
    if let (Some(sha), Some((name, pieces))) = (&info.tokenizer_sha256, &r.vocab) {
        tx.execute(
            "INSERT INTO vocab (tokenizer_sha256, name, size, pieces_json) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            params![sha, name, pieces.len() as i64, serde_json::to_string(pieces)?],
        )?;
    }
    // Keep the original outcome and times; a run exported while running stays running.
    tx.execute(
        "UPDATE run SET status = ?2, error = ?3, created_at = ?4, finished_at = ?5, timings_json = ?6, \
         num_prompts = (SELECT count(*) FROM run_prompt WHERE run_id = ?1) WHERE id = ?1",
        params![
            id,
            info.status.as_str(),
            info.error,
            info.created_at,
            info.finished_at,
            if info.timings.is_null() { "{}".to_string() } else { info.timings.to_string() }
        ],
    )?;
    Ok(())
}

impl Store {
    /// Everything stored for a run; records only when `with_records`.
    pub fn export_run(&self, id: i64, with_records: bool) -> Result<Option<RunExport>> {
        let Some(detail) = self.run(id)? else {
            return Ok(None);
        };
        let records = if with_records && detail.run.num_blocks > 0 {
            Some(self.records(id)?)
        } else {
            None
        };
        let derived = self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT kind, version, data FROM derived WHERE run_id = ?1 ORDER BY kind",
            )?;
            let v = stmt
                .query_map([id], |r| {
                    Ok(Derived {
                        kind: r.get("kind")?,
                        version: r.get("version")?,
                        data: r.get("data")?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })?;
        let vocab = match (&detail.run.tokenizer_sha256, with_records) {
            (Some(sha), true) => self.vocab(sha)?,
            _ => None,
        };
        Ok(Some(RunExport {
            eval: self.run_eval(id)?,
            plugins: self.plugin_runs(id)?,
            prompts: self.prompts(id)?,
            metrics: self.metrics(id)?,
            failures: detail.failures,
            run: detail.run,
            records,
            derived,
            vocab,
        }))
    }

    /// Imports runs in one transaction: a run whose uid is already present is skipped (so
    /// importing the same bundle twice changes nothing); any error rolls everything back.
    /// `source` names the bundle (recorded as the runs' origin); `bundle_sha256` is logged.
    pub fn import_runs(
        &self,
        source: &str,
        bundle_sha256: &str,
        runs: &[RunExport],
    ) -> Result<ImportOutcome> {
        let what = source.to_string();
        self.write(|c| {
            let tx = c.transaction()?;
            let mut outcome = ImportOutcome::default();
            for r in runs {
                let exists: Option<i64> =
                    tx.query_row("SELECT id FROM run WHERE uid = ?1", [&r.run.uid], |x| x.get(0)).optional()?;
                if exists.is_some() {
                    outcome.skipped.push(r.run.uid.clone());
                    continue;
                }
                import_one(&tx, r, source, &what).with_context(|| format!("{what}: run {}", r.run.uid))?;
                outcome.imported.push(r.run.uid.clone());
            }
            tx.execute(
                "INSERT OR REPLACE INTO import_log (bundle_sha256, source, imported_at, runs_imported, runs_skipped) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![bundle_sha256, source, now_rfc3339(), outcome.imported.len() as i64, outcome.skipped.len() as i64],
            )?;
            tx.commit()?;
            Ok(outcome)
        })
    }
}
