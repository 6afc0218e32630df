//! `live --baseline` and `live --store RUN` (docs/verdict.md): plain greedy decoding timed next
//! to live decoding, the measured speed-up and the cost model's inputs, and storing them with
//! the replayed run of the same drafter, target, prompts and backend so that `compare`, `report`
//! and the UI's verdict read them. `cmd_eval.rs` holds the `live` command itself.

use crate::args::TimingStoreArgs;
use anyhow::{bail, Context, Result};
use draftlens_engine::backend::Backend;
use draftlens_engine::identity::IdentityStore;
use draftlens_engine::prompts::Prompt;
use draftlens_engine::session::Session;
use draftlens_results::speed::{estimated_speedup, PromptTiming, SpeedSummary, SOURCE};
use draftlens_results::store::{RunInfo, RunStatus, Store};
use draftlens_results::text::printable;
use std::collections::HashMap;
use std::path::Path;

/// The replayed run `--store` attaches the timings to, opened before any model loads.
pub struct TargetRun {
    pub store: Store,
    pub run: RunInfo,
    /// The run's prompt index of each prompt content hash.
    index_by_sha: HashMap<String, u32>,
}

impl TargetRun {
    /// The run `--store` names (None without it), opened before any model loads. An MTP head
    /// (`target:mtp`) is refused: --store matches the run by the drafter's weights file.
    pub fn open_for(t: &TimingStoreArgs, drafter: &Path) -> Result<Option<TargetRun>> {
        let Some(run) = &t.store else {
            return Ok(None);
        };
        let mtp = drafter
            .to_str()
            .and_then(draftlens_engine::drafter::mtp::steps_of_name)
            .transpose()?;
        if mtp.is_some() {
            bail!("--store matches the replayed run by the drafter's weights file, and an MTP head (target:mtp) is part of the target's: time it with --baseline (docs/live.md)");
        }
        Ok(Some(TargetRun::open(&t.db, run)?))
    }

    /// Opens `db` and the run `reference` names; it must be complete and hold its prompts.
    pub fn open(db: &Path, reference: &str) -> Result<TargetRun> {
        let store = Store::open_existing(db)?;
        let id = draftlens_web::compare::resolve_run(&store, reference)?;
        let run = store
            .run(id)?
            .with_context(|| format!("{}: no run {reference}", db.display()))?
            .run;
        if run.status != RunStatus::Complete {
            bail!(
                "{}: run {id} is {}: --store attaches timings to a complete run",
                db.display(),
                run.status
            );
        }
        let index_by_sha: HashMap<String, u32> = store
            .prompt_metas(id)?
            .into_iter()
            .map(|p| (p.sha256, p.index))
            .collect();
        if index_by_sha.is_empty() {
            bail!(
                "{}: run {id} has no stored prompts to match the timed ones with",
                db.display()
            );
        }
        Ok(TargetRun {
            store,
            run,
            index_by_sha,
        })
    }

    /// Refuses a session, drafter or budget other than the run's: the timings would not be of
    /// the evaluation whose τ the estimate reads.
    pub fn check<B: Backend>(
        &self,
        s: &Session<B>,
        drafter: &Path,
        block_size: usize,
        max_new_tokens: usize,
    ) -> Result<()> {
        let r = &self.run;
        let what = format!("--store {}: run {} ({})", r.id, r.id, printable(&r.name));
        if r.target_sha256 != s.files.identity.weights_sha256()? {
            bail!(
                "{what} is of another target ({})",
                printable(&r.target_path)
            );
        }
        if r.backend != s.be.name() || r.dtype != s.be.dtype() {
            bail!(
                "{what} ran on {} ({}), these timings on {} ({}): time on the run's backend",
                printable(&r.backend),
                printable(&r.dtype),
                s.be.name(),
                s.be.dtype()
            );
        }
        let weights = draftlens_engine::drafter::gguf::weights_file(drafter);
        let sha = IdentityStore::new(s.cache.root()).file_sha256(&weights)?;
        if r.drafter_sha256 != sha {
            bail!(
                "{what} is of another drafter ({}, weights sha256 {}), not {}",
                printable(&r.drafter_path),
                printable(&r.drafter_sha256),
                drafter.display()
            );
        }
        if r.block_size as usize != block_size {
            bail!(
                "{what} has block size {}, the drafter {block_size}",
                r.block_size
            );
        }
        if let Some(n) = r.config["max_new_tokens"].as_u64() {
            if n as usize != max_new_tokens {
                bail!("{what} decoded {n} new tokens a prompt, these timings --max-new-tokens {max_new_tokens}: use the run's budget");
            }
        }
        Ok(())
    }

    /// The run's index of prompt `p`; an error when the run does not hold it.
    pub fn index_of(&self, p: &Prompt) -> Result<u32> {
        self.index_by_sha.get(&p.hash()).copied().with_context(|| {
            format!(
                "--store {}: prompt {:?} is not among the run's prompts (time the run's prompt set)",
                self.run.id, p.id
            )
        })
    }

    /// Replaces the run's timing rows with these.
    pub fn store(&self, summary: &SpeedSummary, prompts: &[PromptTiming]) -> Result<()> {
        let rows = summary.rows(prompts, self.run.block_size);
        self.store.replace_metrics(self.run.id, SOURCE, &rows)?;
        Ok(())
    }

    /// Replaces the run's independent cost rows (`bench-costs`) with these.
    pub fn store_cost_bench(&self, bench: &draftlens_results::cost_bench::CostBench) -> Result<()> {
        let source = draftlens_results::cost_bench::SOURCE;
        self.store
            .replace_metrics(self.run.id, source, &bench.rows())?;
        Ok(())
    }
}

/// The text lines `live --baseline` prints after the per-prompt rows.
pub fn render(summary: &SpeedSummary, block_size: usize, stored: Option<i64>) -> String {
    let c = &summary.costs;
    let estimate = estimated_speedup(summary.tau_live, c);
    let mut o = format!(
        "plain greedy decoding (batch 1): {:.3} ms a step over {} steps\n\
         live: draft round {:.3} ms, verify pass over B = {block_size} tokens {:.3} ms, {} rounds\n\
         measured speed-up (Σ greedy / Σ live, after the prefill, {} prompts): {:.3}×\n",
        c.t_decode * 1e3,
        summary.greedy_steps,
        c.t_draft_round * 1e3,
        c.t_verify * 1e3,
        summary.rounds,
        summary.prompts,
        summary.speedup_measured,
    );
    if let Some(e) = estimate {
        o += &format!(
            "estimated speed-up τ · t_decode / (t_draft + t_verify) with live τ {:.3}: {e:.3}× ({:+.1}% of the measured)\n",
            summary.tau_live,
            100.0 * (e / summary.speedup_measured - 1.0)
        );
    }
    if let Some(id) = stored {
        o += &format!(
            "stored with run {id} (source {SOURCE}): `draftlens compare` shows the verdict\n"
        );
    }
    o
}
