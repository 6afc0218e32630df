//! Runs in and out of a store: a run exported with its prompts, records, metrics and caches, and
//! idempotent import of exported runs (keyed by run uid), all or nothing.
//!
//! An imported run (a report, a bundle, a run pushed to a team server) is text from outside: its
//! free-text fields are cleaned on the way in ([`crate::text`]: no escape sequences, no bidi
//! controls in `runs ls`, `runs show` or the pages). Prompt ids, texts and categories are kept
//! byte for byte: they are hashed and paired across runs, and shown only escaped.

use super::*;
use crate::text::clean_in_place;

/// The run's free text, cleaned (see the module doc).
fn cleaned_run(run: &RunInfo) -> RunInfo {
    let mut r = run.clone();
    for s in [
        &mut r.name,
        &mut r.created_at,
        &mut r.target_path,
        &mut r.target_sha256,
        &mut r.target_arch,
        &mut r.drafter_path,
        &mut r.drafter_sha256,
        &mut r.drafter_series,
        &mut r.prompt_set_name,
        &mut r.prompt_set_sha256,
        &mut r.backend,
        &mut r.dtype,
        &mut r.drafter_family,
    ] {
        clean_in_place(s);
    }
    for s in [&mut r.error, &mut r.finished_at, &mut r.tokenizer_sha256]
        .into_iter()
        .flatten()
    {
        clean_in_place(s);
    }
    if let Some(t) = &mut r.train_style {
        clean_in_place(&mut t.labels);
        clean_in_place(&mut t.mask_rule);
    }
    r
}

/// A metric row's free text, cleaned (the scope is kept: it names a prompt or a category).
fn cleaned_metric(m: &MetricRow) -> MetricRow {
    let mut m = m.clone();
    for s in [&mut m.source, &mut m.name, &mut m.unit, &mut m.description] {
        clean_in_place(s);
    }
    m
}

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
    let info = &cleaned_run(&r.run);
    let new = info.as_new_run();
    if info.uid.is_empty() || info.uid.len() > 64 {
        bail!("{what}: run uid must be 1..64 characters");
    }
    let origin = format!("import:{}", crate::text::printable(source));
    let id = insert_run(tx, &new, &info.uid, &origin, what)?;
    for p in &r.prompts {
        insert_prompt(tx, id, p, what)?;
    }
    if let Some(rec) = &r.records {
        insert_records(tx, id, rec, what)?;
    }
    let metrics: Vec<MetricRow> = r.metrics.iter().map(cleaned_metric).collect();
    insert_metrics(tx, id, &metrics, what)?;
    for f in &r.failures {
        let mut f = f.clone();
        for s in [
            &mut f.plugin,
            &mut f.kind,
            &mut f.message,
            &mut f.created_at,
        ] {
            clean_in_place(s);
        }
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
        let mut p = p.clone();
        for s in [
            &mut p.source,
            &mut p.sha256,
            &mut p.version,
            &mut p.file,
            &mut p.scored_at,
        ] {
            clean_in_place(s);
        }
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
            params![sha, crate::text::printable(name).as_ref(), pieces.len() as i64, serde_json::to_string(pieces)?],
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn new_run(name: &str) -> NewRun {
        NewRun {
            name: name.into(),
            config: json!({}),
            block_size: 4,
            top_k: 2,
            ..Default::default()
        }
    }

    /// Issue 39: an imported report or a team push could put ESC sequences and U+202E into
    /// `runs ls` / `runs show`.
    #[test]
    fn imported_text_is_cleaned_on_the_way_in() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let src = Store::open(&a.path().join("a.sqlite")).unwrap();
        let evil = "x\u{1b}]0;owned\u{7}\u{202e}gpj.exe\u{2066}";
        let mut run = new_run(evil);
        run.drafter_path = evil.into();
        run.backend = evil.into();
        let id = src.create_run(&run).unwrap();
        let mut m = MetricRow::scalar("plug\u{1b}[31m", "tau", MetricScope::Run, 2.0, 3, true);
        m.description = evil.into();
        m.unit = "\u{202e}s".into();
        src.add_metrics(id, &[m]).unwrap();
        src.add_plugin_failure(id, "p", "trap", evil).unwrap();
        src.finish_run(id, RunStatus::Failed, Some(evil), &json!({}))
            .unwrap();
        let mut ex = src.export_run(id, false).unwrap().unwrap();
        ex.plugins.push(PluginProvenance {
            source: "p".into(),
            sha256: String::new(),
            version: "1.0\u{202e}".into(),
            file: evil.into(),
            builtin: false,
            params_json: "[]".into(),
            scored_at: "t".into(),
            stale_since: None,
        });

        let t = Store::open(&b.path().join("b.sqlite")).unwrap();
        t.import_runs("team\u{1b}[2J.html", "00", &[ex]).unwrap();
        let (runs, _) = t.runs(&RunFilter::default()).unwrap();
        let r = &runs[0].run;
        let clean = "x ]0;owned \u{fffd}gpj.exe\u{fffd}";
        assert_eq!(
            (
                r.name.as_str(),
                r.drafter_path.as_str(),
                r.backend.as_str(),
                r.error.as_deref()
            ),
            (clean, clean, clean, Some(clean))
        );
        assert_eq!(r.origin, "import:team [2J.html");
        let m = &t.metrics(r.id).unwrap()[0];
        assert_eq!(
            (m.source.as_str(), m.unit.as_str(), m.description.as_str()),
            ("plug [31m", "\u{fffd}s", clean)
        );
        let d = t.run(r.id).unwrap().unwrap();
        assert_eq!(d.failures[0].message, clean);
        let p = &t.plugin_runs(r.id).unwrap()[0];
        assert_eq!(
            (p.version.as_str(), p.file.as_str()),
            ("1.0\u{fffd}", clean)
        );
    }
}
