//! `draftlens merge`: the shard runs of one evaluation put together into one run that equals an
//! unsharded run of it, bit for bit (docs/scale-out.md §3).
//!
//! Exactness comes from recomputing, never combining: the merged run's prompts are the shards'
//! prompts in index order, its records are the shards' records in prompt-index order (each
//! prompt's blocks in the order its shard stored them — the order an unsharded run stores
//! them), and its native metrics come from [`summarize`], the function `draftlens run` calls, on
//! those records. Plugin values are re-scored on the merged records by the caller (the CLI) with
//! the plugins the shards were scored with ([`MergePlan::plugins`]).
//!
//! [`plan`] checks everything and writes nothing: one identity, one shard count, exactly one
//! complete run per shard (a failed or unfinished run of a shard that also has a complete run is
//! superseded, as after a resubmitted Slurm task), disjoint prompts that cover the set, each in
//! the shard the rule assigns it, and the same plugins everywhere. [`execute`] then writes the
//! merged run in one transaction under a uid derived from the shard runs' uids, so merging the
//! same shards twice finds the run of the first merge and writes nothing.
//!
//! [`merge_received`] is the same merge done by a team server inside its own database, when
//! pushed shard runs complete an evaluation (docs/scale-out.md §9).

use crate::metrics::{run_sampling, sampled_rows, summarize, PromptInfo};
use crate::shard::{shard_of_hash, Shard, SHARD_NAME_SEP};
use crate::store::{
    FinishedRun, MetricRow, MetricScope, NewRun, PluginProvenance, RunEval, RunInfo, RunPrompt,
    RunStatus, Store,
};
use anyhow::{anyhow, bail, Context, Result};
use draftlens_records::RecordBatch;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// A database the shards are read from, with the name errors use for it.
pub struct Source<'a> {
    pub name: String,
    pub store: &'a Store,
}

/// One shard run found in a source.
#[derive(Clone, Debug)]
pub struct ShardRun {
    /// Index into the sources.
    pub source: usize,
    pub run: RunInfo,
    pub eval: RunEval,
}

impl ShardRun {
    fn shard(&self) -> Shard {
        self.eval.shard.expect("shard runs have a shard")
    }
}

/// What a merge will do, checked in full before anything is written.
#[derive(Clone, Debug)]
pub struct MergePlan {
    /// sha256 of the evaluation identity.
    pub identity: String,
    pub count: u32,
    /// The complete run of every shard, in shard order.
    pub shards: Vec<ShardRun>,
    /// Failed or unfinished runs left out because their shard has a complete run.
    pub superseded: Vec<String>,
    /// uid of the merged run (a function of the identity and the shard runs' uids).
    pub uid: String,
    /// The plugins every shard with records was scored with: the merged run is re-scored with
    /// them (built-in plugins by name, others from the file, which must still have this sha256).
    pub plugins: Vec<PluginProvenance>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct MergeOutcome {
    pub run_id: i64,
    pub uid: String,
    pub name: String,
    /// False when the merged run existed already (nothing was written).
    pub created: bool,
    pub shards: u32,
    pub prompts: u64,
    pub blocks: u64,
    pub seconds: f64,
}

fn label(sources: &[Source], r: &ShardRun) -> String {
    format!(
        "{} run {} (shard {}, {})",
        sources[r.source].name,
        r.run.id,
        r.shard(),
        r.run.status
    )
}

/// Checks the shard runs found in `sources` (optionally only those whose identity starts with
/// `identity_prefix`) and says how they merge; refuses with one error naming every problem.
pub fn plan(sources: &[Source], identity_prefix: Option<&str>) -> Result<MergePlan> {
    let mut all: Vec<ShardRun> = Vec::new();
    let mut seen_uids = BTreeSet::new();
    for (i, src) in sources.iter().enumerate() {
        for (run, eval) in src.store.shard_runs()? {
            // The same run in two files (a copied database) counts once.
            if seen_uids.insert(run.uid.clone()) {
                all.push(ShardRun {
                    source: i,
                    run,
                    eval,
                });
            }
        }
    }
    let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
    if all.is_empty() {
        bail!(
            "cannot merge: no shard runs (runs made with --shard I/N) in {}",
            names.join(", ")
        );
    }
    if let Some(p) = identity_prefix {
        all.retain(|r| r.eval.identity.starts_with(p));
        if all.is_empty() {
            bail!(
                "cannot merge: no shard runs of an evaluation whose identity starts with {p} in {}",
                names.join(", ")
            );
        }
    }

    // One evaluation.
    let mut by_identity: BTreeMap<&str, Vec<&ShardRun>> = BTreeMap::new();
    for r in &all {
        by_identity.entry(&r.eval.identity).or_default().push(r);
    }
    if by_identity.len() > 1 {
        let groups: Vec<String> = by_identity
            .iter()
            .map(|(id, runs)| {
                let l: Vec<String> = runs.iter().map(|r| label(sources, r)).collect();
                format!("identity {} ({})", &id[..12.min(id.len())], l.join(", "))
            })
            .collect();
        let mut firsts = by_identity.values().map(|v| &v[0].eval.identity_json);
        let (a, b) = (firsts.next().unwrap(), firsts.next().unwrap());
        bail!(
            "cannot merge shards of different evaluations (they differ in {}): {}; pass --identity PREFIX to \
             merge one of them",
            differing_fields(a, b).join(", "),
            groups.join("; ")
        );
    }
    let identity = all[0].eval.identity.clone();

    // One shard count.
    let counts: BTreeSet<u32> = all.iter().map(|r| r.shard().count).collect();
    if counts.len() > 1 {
        let l: Vec<String> = all.iter().map(|r| label(sources, r)).collect();
        bail!(
            "cannot merge overlapping shards: the runs split the prompt set into {} shards: {}",
            counts
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(" and "),
            l.join(", ")
        );
    }
    let count = *counts.iter().next().unwrap();

    // Exactly one complete run per shard.
    let (mut overlapping, mut unfinished, mut missing, mut superseded) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut chosen: Vec<ShardRun> = Vec::new();
    for i in 0..count {
        let runs: Vec<&ShardRun> = all.iter().filter(|r| r.shard().index == i).collect();
        let complete: Vec<&&ShardRun> = runs
            .iter()
            .filter(|r| r.run.status == RunStatus::Complete)
            .collect();
        let others = runs.iter().filter(|r| r.run.status != RunStatus::Complete);
        match complete.len() {
            0 if runs.is_empty() => missing.push(format!("{i}/{count}")),
            0 => unfinished.extend(others.map(|r| {
                let why = match (&r.run.status, &r.run.error) {
                    (RunStatus::Failed, Some(e)) => format!("failed: {e}"),
                    (RunStatus::Failed, None) => "failed".into(),
                    _ => "not finished (still running, or its process died)".into(),
                };
                format!("{} is {why}", label(sources, r))
            })),
            1 => {
                superseded.extend(others.map(|r| label(sources, r)));
                chosen.push((*complete[0]).clone());
            }
            _ => overlapping.push(format!(
                "shard {i}/{count} has {} complete runs ({})",
                complete.len(),
                complete
                    .iter()
                    .map(|r| label(sources, r))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    let mut problems = Vec::new();
    if !overlapping.is_empty() {
        problems.push(format!("overlapping shards: {}", overlapping.join("; ")));
    }
    if !unfinished.is_empty() {
        problems.push(format!(
            "incomplete shards (rerun them; the cache makes it cheap): {}",
            unfinished.join("; ")
        ));
    }
    if !missing.is_empty() {
        problems.push(format!(
            "missing shards {} (no run of them in {})",
            missing.join(", "),
            names.join(", ")
        ));
    }
    if !problems.is_empty() {
        bail!("cannot merge: {}", problems.join("; "));
    }

    // The prompts: each complete run holds all of its shard's prompts, in the shard the rule
    // assigns, and together they cover the set once.
    let set_prompts = chosen[0].eval.set_prompts;
    let mut owner: BTreeMap<u32, usize> = BTreeMap::new();
    for (k, r) in chosen.iter().enumerate() {
        let store = sources[r.source].store;
        let metas = store.prompt_metas(r.run.id)?;
        if metas.len() as u64 != r.eval.run_prompts as u64
            || r.run.num_prompts != metas.len() as u64
        {
            problems.push(format!(
                "{} holds {} of its {} prompts",
                label(sources, r),
                metas.len(),
                r.eval.run_prompts
            ));
        }
        for m in &metas {
            if m.index >= set_prompts {
                problems.push(format!(
                    "{}: prompt {} is outside the set of {set_prompts} prompts",
                    label(sources, r),
                    m.index
                ));
            } else if shard_of_hash(&m.sha256, count) != r.shard().index {
                problems.push(format!(
                    "{}: prompt {} ({}) belongs to shard {}/{count}",
                    label(sources, r),
                    m.index,
                    m.id,
                    shard_of_hash(&m.sha256, count)
                ));
            } else if let Some(&other) = owner.get(&m.index) {
                problems.push(format!(
                    "overlapping shards: prompt {} is in {} and in {}",
                    m.index,
                    label(sources, &chosen[other]),
                    label(sources, r)
                ));
            } else {
                owner.insert(m.index, k);
            }
        }
    }
    if problems.is_empty() && owner.len() as u32 != set_prompts {
        let absent: Vec<String> = (0..set_prompts)
            .filter(|i| !owner.contains_key(i))
            .take(10)
            .map(|i| i.to_string())
            .collect();
        problems.push(format!(
            "the shards hold {} of the set's {set_prompts} prompts (missing: {}…)",
            owner.len(),
            absent.join(", ")
        ));
    }
    if !problems.is_empty() {
        bail!("cannot merge: {}", problems.join("; "));
    }

    let plugins = plugin_set(sources, &chosen)?;
    let uid = {
        let mut h = format!("draftlens merge\n{identity}\n");
        for r in &chosen {
            h += &r.run.uid;
            h.push('\n');
        }
        crate::sha256_hex(h.as_bytes())[..32].to_string()
    };
    Ok(MergePlan {
        identity,
        count,
        shards: chosen,
        superseded,
        uid,
        plugins,
    })
}

/// The plugins the shards with records were scored with; refuses shards scored differently,
/// with stale rows or with recorded plugin failures (their values cannot be reproduced).
fn plugin_set(sources: &[Source], chosen: &[ShardRun]) -> Result<Vec<PluginProvenance>> {
    let key = |p: &PluginProvenance| (p.source.clone(), p.sha256.clone(), p.params_json.clone());
    let mut first: Option<(&ShardRun, Vec<PluginProvenance>)> = None;
    let mut problems = Vec::new();
    for r in chosen.iter().filter(|r| r.run.num_blocks > 0) {
        let store = sources[r.source].store;
        let prov = store.plugin_runs(r.run.id)?;
        for p in prov.iter().filter(|p| p.stale_since.is_some()) {
            problems.push(format!(
                "{}: the rows of plugin {} are stale (a later scoring failed)",
                label(sources, r),
                p.source
            ));
        }
        for f in store.plugin_failures(r.run.id)? {
            problems.push(format!(
                "{}: plugin {} failed ({}): {}",
                label(sources, r),
                f.plugin,
                f.kind,
                f.message
            ));
        }
        match &first {
            None => first = Some((r, prov)),
            Some((f, want)) => {
                let a: BTreeSet<_> = want.iter().map(key).collect();
                let b: BTreeSet<_> = prov.iter().map(key).collect();
                if a != b {
                    let show = |s: &BTreeSet<(String, String, String)>| {
                        let v: Vec<String> = s
                            .iter()
                            .map(|(n, sha, p)| format!("{n} {} {p}", &sha[..12.min(sha.len())]))
                            .collect();
                        if v.is_empty() {
                            "none".to_string()
                        } else {
                            v.join(", ")
                        }
                    };
                    problems.push(format!(
                        "{} was scored with plugins [{}] but {} with [{}]",
                        label(sources, f),
                        show(&a),
                        label(sources, r),
                        show(&b)
                    ));
                }
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "cannot merge: the shards' plugin values differ: {}; rescore the shards with the same plugins \
             (draftlens rescore) first",
            problems.join("; ")
        );
    }
    Ok(first.map(|f| f.1).unwrap_or_default())
}

/// Top-level keys of two identity JSON objects whose values differ.
fn differing_fields(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let keys: BTreeSet<&String> = a
        .as_object()
        .into_iter()
        .chain(b.as_object())
        .flat_map(|o| o.keys())
        .collect();
    keys.into_iter()
        .filter(|k| a.get(k.as_str()) != b.get(k.as_str()))
        .cloned()
        .collect()
}

/// The merged run as [`execute`] stores it, before storing.
pub struct Merged {
    pub run: NewRun,
    pub eval: RunEval,
    pub prompts: Vec<RunPrompt>,
    pub records: RecordBatch,
    pub metrics: Vec<MetricRow>,
}

/// Reads the planned shard runs and builds the merged run: prompts and records in prompt-index
/// order, native metrics recomputed by [`summarize`] (and [`sampled_rows`] for a sampled run).
pub fn build(sources: &[Source], plan: &MergePlan) -> Result<Merged> {
    let first = &plan.shards[0];
    let (b, k) = (first.run.block_size, first.run.top_k);
    let mut prompts: Vec<RunPrompt> = Vec::new();
    let mut all = RecordBatch::new(b, k);
    let mut any = false;
    for r in &plan.shards {
        let store = sources[r.source].store;
        let what = || format!("{}: run {}", sources[r.source].name, r.run.id);
        prompts.extend(store.prompts(r.run.id).with_context(what)?);
        if r.run.num_blocks == 0 {
            continue;
        }
        let rec = store.records(r.run.id).with_context(what)?;
        if rec.num_blocks() as u64 != r.run.num_blocks {
            bail!(
                "{}: holds {} blocks but says {}",
                what(),
                rec.num_blocks(),
                r.run.num_blocks
            );
        }
        if any {
            all.extend(&rec);
        } else {
            all = rec;
            any = true;
        }
    }
    prompts.sort_by_key(|p| p.index);
    // A stable sort by prompt index: each prompt's blocks keep the order its shard stored them
    // in, which is the order an unsharded run stores them in.
    let mut order: Vec<usize> = (0..all.num_blocks()).collect();
    order.sort_by_key(|&i| all.prompt_index[i]);
    let records = if order.windows(2).all(|w| w[0] < w[1]) {
        all
    } else {
        all.select(&order)
    };
    let infos: Vec<PromptInfo> = prompts
        .iter()
        .map(|p| PromptInfo {
            index: p.index,
            prompt_len: p.prompt_len as usize,
            seq_len: p.token_ids.len(),
            category: p.category.clone(),
        })
        .collect();
    let mut metrics = summarize(&records, &infos);
    // A run sampled at T > 0 (`run --temperature`) adds its expected acceptance.
    let sampling = run_sampling(&first.run.config)
        .with_context(|| format!("run {}: its eval.sampling settings", first.run.id))?;
    if let Some(params) = sampling {
        metrics.extend(sampled_rows(&records, &infos, &params));
    }

    let info = &first.run;
    let mut config = info.config.clone();
    if let Some(o) = config.as_object_mut() {
        o.remove("shard");
    }
    let name = match info.name.rsplit_once(SHARD_NAME_SEP) {
        Some((base, _)) => base.to_string(),
        None => info.name.clone(),
    };
    let run = NewRun {
        name,
        config,
        block_size: b,
        top_k: k,
        ..info.as_new_run()
    };
    let eval = RunEval {
        identity: plan.identity.clone(),
        identity_json: first.eval.identity_json.clone(),
        shard: None,
        set_prompts: first.eval.set_prompts,
        run_prompts: first.eval.set_prompts,
        merged_from: Some(plan.shards.iter().map(|r| r.run.uid.clone()).collect()),
    };
    Ok(Merged {
        run,
        eval,
        prompts,
        records,
        metrics,
    })
}

/// Builds the merged run and writes it to `dest` in one transaction (with the tokenizer's
/// vocabulary when `dest` lacks it). When `dest` holds the run of this merge already, nothing is
/// read or written.
pub fn execute(sources: &[Source], plan: &MergePlan, dest: &Store) -> Result<MergeOutcome> {
    let t0 = Instant::now();
    if let Some(id) = dest.run_id_by_uid(&plan.uid)? {
        let r = dest
            .run(id)?
            .context("the merged run vanished while reading it")?
            .run;
        return Ok(MergeOutcome {
            run_id: id,
            uid: plan.uid.clone(),
            name: r.name,
            created: false,
            shards: plan.count,
            prompts: r.num_prompts,
            blocks: r.num_blocks,
            seconds: t0.elapsed().as_secs_f64(),
        });
    }
    let m = build(sources, plan)?;
    if let Some(sha) = &m.run.tokenizer_sha256 {
        if !dest.has_vocab(sha)? {
            for s in sources {
                if let Some((name, pieces)) = s.store.vocab(sha)? {
                    dest.put_vocab(sha, &name, &pieces)?;
                    break;
                }
            }
        }
    }
    let shard_seconds: Vec<f64> = plan
        .shards
        .iter()
        .map(|r| r.run.timings["total_s"].as_f64().unwrap_or(f64::NAN))
        .collect();
    let timings = serde_json::json!({
        "merge_s": t0.elapsed().as_secs_f64(),
        "shard_total_s": shard_seconds,
    });
    let (run_id, created) = dest.insert_finished_run(&FinishedRun {
        run: &m.run,
        uid: &plan.uid,
        origin: "merge",
        eval: &m.eval,
        prompts: &m.prompts,
        records: &m.records,
        metrics: &m.metrics,
        timings: &timings,
    })?;
    Ok(MergeOutcome {
        run_id,
        uid: plan.uid.clone(),
        name: m.run.name,
        created,
        shards: plan.count,
        prompts: m.prompts.len() as u64,
        blocks: m.records.num_blocks() as u64,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The run-scope metrics of a stored run, for printing a merge's result.
pub fn run_metrics(store: &Store, run: i64) -> Result<Vec<MetricRow>> {
    store.metrics_in_scope(run, &MetricScope::Run)
}

/// Re-scores a merged run with the plugins its shards were scored with. The library cannot run
/// plugins; the command line provides this (the plugin host), so that a team server started
/// by `draftlens serve` re-scores a merge as `draftlens merge` does.
pub trait PluginScorer: Send + Sync + std::fmt::Debug {
    /// Whether every plugin loads as it did for the shards (a built-in by name, another from its
    /// file with the same sha256); checked before the merged run is written.
    fn check(&self, plugins: &[PluginProvenance]) -> Result<()>;
    /// Scores `run` of `store` with them; returns the plugins that failed (their failure is
    /// recorded with the run).
    fn score(&self, store: &Store, run: i64, plugins: &[PluginProvenance]) -> Result<Vec<String>>;
}

/// Whether the merged run `run` lacks exactly these plugins' values (it is re-scored then; a
/// second merge of the same shards finds them and scores nothing).
pub fn needs_rescore(dest: &Store, run: i64, plugins: &[PluginProvenance]) -> Result<bool> {
    let key = |p: &PluginProvenance| (p.source.clone(), p.sha256.clone(), p.params_json.clone());
    let have: Vec<_> = dest.plugin_runs(run)?.iter().map(key).collect();
    let want: Vec<_> = plugins.iter().map(key).collect();
    Ok(have != want)
}

/// What a team server did about one evaluation after receiving a shard run of it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SetOutcome {
    /// sha256 of the evaluation identity.
    pub identity: String,
    /// N of the shards `I/N` received.
    pub shards: u32,
    /// `merged`, `already-merged`, `waiting` (not every shard has a complete run here yet) or
    /// `refused` (the set is complete but does not merge; `message` says why).
    pub state: &'static str,
    /// The merged run's uid (merged, already-merged).
    pub run_uid: Option<String>,
    pub message: String,
}

/// Merges, inside `store`, each evaluation that the runs `uids` (just imported) are shards of,
/// when every one of its N shards has a complete run in `store`: with [`plan`] and [`execute`],
/// the code of `draftlens merge`, so the merged run equals an unsharded run bit for bit and a
/// second call (the same shards pushed again, or in another order) finds it and writes
/// nothing. An incomplete set waits (`waiting`, naming the missing shards and any run of them
/// that belongs to a different evaluation); a complete set `plan` refuses is `refused`, with
/// its message. Shards scored with plugins are re-scored by `scorer`; without one they are
/// refused (their values could not be reproduced). `name` names the database in messages.
pub fn merge_received(
    store: &Store,
    name: &str,
    uids: &[String],
    scorer: Option<&dyn PluginScorer>,
) -> Result<Vec<SetOutcome>> {
    let mut sets: BTreeSet<(String, u32)> = BTreeSet::new();
    for uid in uids {
        let Some(id) = store.run_id_by_uid(uid)? else {
            continue;
        };
        if let Some(RunEval {
            identity,
            shard: Some(sh),
            ..
        }) = store.run_eval(id)?
        {
            sets.insert((identity, sh.count));
        }
    }
    if sets.is_empty() {
        return Ok(Vec::new());
    }
    let all = store.shard_runs()?;
    let mut out = Vec::new();
    for (identity, count) in sets {
        let short = &identity[..12.min(identity.len())];
        let mine =
            |e: &RunEval| e.identity == identity && e.shard.is_some_and(|s| s.count == count);
        let complete: BTreeSet<u32> = all
            .iter()
            .filter(|(r, e)| mine(e) && r.status == RunStatus::Complete)
            .filter_map(|(_, e)| e.shard.map(|s| s.index))
            .collect();
        let mut outcome = SetOutcome {
            identity: identity.clone(),
            shards: count,
            state: "waiting",
            run_uid: None,
            message: String::new(),
        };
        if complete.len() < count as usize {
            let missing: Vec<u32> = (0..count).filter(|i| !complete.contains(i)).collect();
            let show = |v: &[u32]| {
                v.iter()
                    .map(|i| format!("{i}/{count}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            outcome.message = format!(
                "evaluation {short}: {} of {count} shards complete here; waiting for {}",
                complete.len(),
                show(&missing)
            );
            // Runs of the missing shards that belong to another evaluation: say why they are
            // not used (a different drafter, option or draftlens version).
            let ours = all
                .iter()
                .find(|(_, e)| mine(e))
                .map(|(_, e)| &e.identity_json);
            let others: Vec<String> = all
                .iter()
                .filter(|(_, e)| {
                    e.identity != identity
                        && e.shard
                            .is_some_and(|s| s.count == count && missing.contains(&s.index))
                })
                .map(|(r, e)| {
                    let fields = ours
                        .map(|o| differing_fields(o, &e.identity_json).join(", "))
                        .unwrap_or_default();
                    format!(
                        "run {} (shard {}, evaluation {}, differing in {fields})",
                        r.uid,
                        e.shard.map(|s| s.to_string()).unwrap_or_default(),
                        &e.identity[..12.min(e.identity.len())]
                    )
                })
                .collect();
            if !others.is_empty() {
                outcome.message += &format!(
                    "; not merged with shards of a different evaluation: {}",
                    others.join("; ")
                );
            }
            out.push(outcome);
            continue;
        }
        let merged = merge_set(store, name, &identity, scorer);
        match merged {
            Ok((m, failed)) => {
                outcome.state = if m.created {
                    "merged"
                } else {
                    "already-merged"
                };
                outcome.message = format!(
                    "evaluation {short}: {} {count} shards into run {} · {} ({} prompts, {} blocks)",
                    if m.created { "merged" } else { "already merged" },
                    m.uid,
                    m.name,
                    m.prompts,
                    m.blocks
                );
                if !failed.is_empty() {
                    outcome.message +=
                        &format!("; re-scoring failed for plugins {}", failed.join(", "));
                }
                outcome.run_uid = Some(m.uid);
            }
            Err(e) => {
                outcome.state = "refused";
                outcome.message = format!("evaluation {short}: {e:#}");
            }
        }
        out.push(outcome);
    }
    Ok(out)
}

/// [`merge_received`]'s merge of one complete set: plan, check the plugins can be re-scored,
/// write, re-score. Returns the merge and the plugins whose re-scoring failed.
fn merge_set(
    store: &Store,
    name: &str,
    identity: &str,
    scorer: Option<&dyn PluginScorer>,
) -> Result<(MergeOutcome, Vec<String>)> {
    let src = [Source {
        name: name.to_string(),
        store,
    }];
    let plan = plan(&src, Some(identity))?;
    if !plan.plugins.is_empty() {
        scorer
            .ok_or_else(|| {
                anyhow!(
                    "cannot merge: the shards were scored with plugins, whose values must be \
                     re-scored on the merged records, and this server cannot run plugins"
                )
            })?
            .check(&plan.plugins)?;
    }
    let m = execute(&src, &plan, store)?;
    let mut failed = Vec::new();
    if let Some(s) = scorer {
        if m.blocks > 0
            && !plan.plugins.is_empty()
            && needs_rescore(store, m.run_id, &plan.plugins)?
        {
            failed = s.score(store, m.run_id, &plan.plugins)?;
        }
    }
    Ok((m, failed))
}
