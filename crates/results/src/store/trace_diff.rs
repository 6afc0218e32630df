//! Stored `draftlens trace diff` results (schema v7, docs/traces.md §6): a trace run's verify
//! rounds against a reference drafter replayed on the engine's own tokens, as
//! [`crate::trace::diff::diff_prompt`] computed them per prompt. The CLI writes them; the web's
//! compare page summarises them and its drill-down lists the rounds that differ.
//!
//! A diff is written in one transaction after every prompt has been checked against the run, so
//! a bad one stores nothing; diffing a run again against the same drafter weights replaces the
//! earlier diff.

use super::*;
use crate::trace::diff::{Departure, PromptDiff, RoundDiff};
use crate::trace::is_trace_origin;
use std::collections::{HashMap, HashSet};

/// What one stored diff was made with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceDiffInfo {
    pub id: i64,
    pub run_id: i64,
    /// The reference drafter: where it was read from and the sha256 of its weights file.
    pub drafter_path: String,
    pub drafter_sha256: String,
    pub target_path: String,
    pub backend: String,
    pub created_at: String,
}

/// A diff to store: what it was made with and every prompt's comparison.
#[derive(Clone, Copy, Debug)]
pub struct NewTraceDiff<'a> {
    pub drafter_path: &'a str,
    pub drafter_sha256: &'a str,
    pub target_path: &'a str,
    pub backend: &'a str,
    pub prompts: &'a [PromptDiff],
}

impl Store {
    /// Stores the diff of trace run `run` in one transaction, replacing an earlier diff of the
    /// run against the same drafter weights, and returns its id. An error, with nothing
    /// written, when the run is not a trace import or a prompt is not one of its prompts, comes
    /// twice, or holds counts that contradict each other.
    pub fn put_trace_diff(&self, run: i64, d: &NewTraceDiff) -> Result<i64> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            let origin: Option<String> = tx
                .query_row("SELECT origin FROM run WHERE id = ?1", [run], |r| r.get(0))
                .optional()?;
            let Some(origin) = origin else {
                bail!("{what}: run {run} does not exist");
            };
            if !is_trace_origin(&origin) {
                bail!(
                    "{what}: run {run} is not a trace import (origin {:?}): only a trace run has a trace diff",
                    crate::text::printable(&origin)
                );
            }
            let ids: HashMap<u32, String> = {
                let mut stmt = tx.prepare("SELECT idx, prompt_id FROM run_prompt WHERE run_id = ?1")?;
                let rows = stmt.query_map([run], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let mut seen = HashSet::new();
            for p in d.prompts {
                check_prompt(p, &ids, &mut seen)
                    .with_context(|| format!("{what}: trace diff of run {run}"))?;
            }
            tx.execute(
                "DELETE FROM trace_diff WHERE run_id = ?1 AND drafter_sha256 = ?2",
                params![run, d.drafter_sha256],
            )?;
            tx.execute(
                "INSERT INTO trace_diff (run_id, drafter_path, drafter_sha256, target_path, backend, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![run, d.drafter_path, d.drafter_sha256, d.target_path, d.backend, now_rfc3339()],
            )?;
            let id = tx.last_insert_rowid();
            for p in d.prompts {
                insert_prompt_diff(&tx, id, p)?;
            }
            tx.commit()?;
            Ok(id)
        })
    }

    /// The diffs stored for a run, newest first.
    pub fn trace_diffs(&self, run: i64) -> Result<Vec<TraceDiffInfo>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT * FROM trace_diff WHERE run_id = ?1 ORDER BY created_at DESC, id DESC",
            )?;
            let rows = stmt.query_map([run], info_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// One stored diff with every prompt's comparison, in prompt order (each prompt's listed
    /// rounds in decode order); `None` when there is no diff `diff`.
    pub fn trace_diff(&self, diff: i64) -> Result<Option<(TraceDiffInfo, Vec<PromptDiff>)>> {
        let what = self.what();
        self.read(|c| {
            let info = c
                .query_row(
                    "SELECT * FROM trace_diff WHERE id = ?1",
                    [diff],
                    info_from_row,
                )
                .optional()?;
            let Some(info) = info else { return Ok(None) };
            let mut rounds: HashMap<u32, Vec<RoundDiff>> = HashMap::new();
            let mut stmt = c.prepare_cached(
                "SELECT idx, round, anchor, engine, reference, reference_ids FROM trace_diff_round \
                 WHERE diff_id = ?1 ORDER BY idx, round",
            )?;
            let mut rows = stmt.query([diff])?;
            while let Some(r) = rows.next()? {
                let idx: u32 = r.get("idx")?;
                let round: i64 = r.get("round")?;
                rounds.entry(idx).or_default().push(RoundDiff {
                    round: round as usize,
                    anchor: r.get("anchor")?,
                    engine: r.get("engine")?,
                    reference: r.get("reference")?,
                    reference_ids: le_to_u32s(
                        r.get_ref("reference_ids")?.as_blob()?,
                        &format!("{what}: trace diff {diff} prompt {idx} round {round}"),
                    )?,
                });
            }
            let mut stmt = c.prepare_cached(
                "SELECT d.*, p.prompt_id FROM trace_diff_prompt d \
                 JOIN run_prompt p ON p.run_id = ?2 AND p.idx = d.idx \
                 WHERE d.diff_id = ?1 ORDER BY d.idx",
            )?;
            let mut rows = stmt.query(params![diff, info.run_id])?;
            let mut prompts = Vec::new();
            while let Some(r) = rows.next()? {
                let index: u32 = r.get("idx")?;
                let departures: String = r.get("first_departures_json")?;
                let first_departures: Vec<(usize, u32, u32)> = serde_json::from_str(&departures)
                    .with_context(|| {
                        format!("{what}: trace diff {diff} prompt {index}: departures")
                    })?;
                prompts.push(PromptDiff {
                    index,
                    id: r.get("prompt_id")?,
                    rounds: r.get::<_, i64>("rounds")? as u64,
                    engine_tokens: r.get::<_, i64>("engine_tokens")? as u64,
                    reference_tokens: r.get::<_, i64>("reference_tokens")? as u64,
                    rounds_fewer: r.get::<_, i64>("rounds_fewer")? as u64,
                    rounds_more: r.get::<_, i64>("rounds_more")? as u64,
                    first_rounds: rounds.remove(&index).unwrap_or_default(),
                    reference_chain: (
                        r.get::<_, i64>("chain_tokens")? as u64,
                        r.get::<_, i64>("chain_rounds")? as u64,
                    ),
                    departures: r.get::<_, i64>("departures")? as u64,
                    first_departures: first_departures
                        .into_iter()
                        .map(|(position, engine_token, target_token)| Departure {
                            position,
                            engine_token,
                            target_token,
                        })
                        .collect(),
                });
            }
            Ok(Some((info, prompts)))
        })
    }
}

fn info_from_row(r: &Row) -> rusqlite::Result<TraceDiffInfo> {
    Ok(TraceDiffInfo {
        id: r.get("id")?,
        run_id: r.get("run_id")?,
        drafter_path: r.get("drafter_path")?,
        drafter_sha256: r.get("drafter_sha256")?,
        target_path: r.get("target_path")?,
        backend: r.get("backend")?,
        created_at: r.get("created_at")?,
    })
}

/// One prompt's comparison against the run's prompts (`ids`: index → prompt id) and itself.
fn check_prompt(p: &PromptDiff, ids: &HashMap<u32, String>, seen: &mut HashSet<u32>) -> Result<()> {
    let at = format!("prompt {} ({})", p.index, crate::text::printable(&p.id));
    match ids.get(&p.index) {
        None => bail!("{at}: the run has no prompt {}", p.index),
        Some(id) if *id != p.id => bail!(
            "{at}: the run's prompt {} is {:?}",
            p.index,
            crate::text::printable(id)
        ),
        Some(_) => {}
    }
    if !seen.insert(p.index) {
        bail!("{at}: compared twice");
    }
    let differing = p.rounds_fewer + p.rounds_more;
    if differing > p.rounds || (p.first_rounds.len() as u64) > differing {
        bail!(
            "{at}: {} rounds, {} where the reference commits more, {} fewer and {} listed",
            p.rounds,
            p.rounds_fewer,
            p.rounds_more,
            p.first_rounds.len()
        );
    }
    let mut previous: Option<usize> = None;
    for r in &p.first_rounds {
        if r.round as u64 >= p.rounds || previous.is_some_and(|q| r.round <= q) {
            bail!(
                "{at}: listed round {} is not in decode order within its {} rounds",
                r.round,
                p.rounds
            );
        }
        if r.engine == r.reference || r.reference_ids.len() != r.reference as usize {
            bail!(
                "{at}: round {}: engine {} and reference {} tokens with {} reference token ids",
                r.round,
                r.engine,
                r.reference,
                r.reference_ids.len()
            );
        }
        previous = Some(r.round);
    }
    if (p.first_departures.len() as u64) > p.departures {
        bail!(
            "{at}: {} departures listed of {}",
            p.first_departures.len(),
            p.departures
        );
    }
    Ok(())
}

fn insert_prompt_diff(tx: &Transaction, diff: i64, p: &PromptDiff) -> Result<()> {
    let departures: Vec<(usize, u32, u32)> = p
        .first_departures
        .iter()
        .map(|d| (d.position, d.engine_token, d.target_token))
        .collect();
    tx.prepare_cached(
        "INSERT INTO trace_diff_prompt (diff_id, idx, rounds, engine_tokens, reference_tokens, rounds_fewer, \
         rounds_more, chain_tokens, chain_rounds, departures, first_departures_json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        diff,
        p.index,
        p.rounds as i64,
        p.engine_tokens as i64,
        p.reference_tokens as i64,
        p.rounds_fewer as i64,
        p.rounds_more as i64,
        p.reference_chain.0 as i64,
        p.reference_chain.1 as i64,
        p.departures as i64,
        serde_json::to_string(&departures)?,
    ])?;
    for r in &p.first_rounds {
        tx.prepare_cached(
            "INSERT INTO trace_diff_round (diff_id, idx, round, anchor, engine, reference, reference_ids) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            diff,
            p.index,
            r.round as i64,
            r.anchor,
            r.engine,
            r.reference,
            u32s_to_le(&r.reference_ids),
        ])?;
    }
    Ok(())
}
