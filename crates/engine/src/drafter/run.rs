//! One evaluation run end to end: check compatibility, create the run in the store, then per
//! prompt: greedy continuation (cached) → target pass with taps (cached; consecutive prompts'
//! passes run packed into one forward) → drafter over anchors → records stored in one
//! transaction per prompt; finally the summary metrics. An interruption
//! (error, Ctrl-C, SIGTERM) marks the run failed; caches stay valid so re-running resumes.

use super::config::DrafterFamily;
use super::eagle3::{Eagle3Config, Eagle3Drafter};
use super::eval::{evaluate_sequence, DraftTarget, Drafter, Labels, Sequence};
use super::lint::{lint, Severity};
use super::model::DFlashDrafter;
use super::records_cache;
use super::run_identity::{DrafterIdentity, RunIdentity};
pub use super::run_identity::{DrafterSpec, RunOptions};
use crate::backend::Backend;
use crate::model::Capture;
use crate::prompts::{Prompt, PromptSet};
use crate::records::RecordBatch;
use crate::session::{Packer, ResidentPass, Session};
use anyhow::{bail, Context, Result};
use draftlens_results::metrics::{sampled_rows, summarize, PromptInfo};
use draftlens_results::shard::Shard;
use draftlens_results::store::{RunPrompt, RunStatus, Store};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Set by the CLI's signal handler; checked between prompts.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// A run-level metric as `run --json` reports it: the value with its unit and convention.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MetricSummary {
    /// The value; `null` in JSON when undefined.
    pub value: f64,
    pub unit: String,
    /// What is counted: macro or pooled, bonus included or not, which anchors
    /// (`docs/metrics.md`).
    pub description: String,
    /// The denominator behind the value (prompts, rounds, blocks or positions).
    pub count: u64,
    pub higher_is_better: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RunOutcome {
    pub run_id: i64,
    pub name: String,
    pub prompts: usize,
    pub blocks: usize,
    /// Run-level metrics: source → metric name → value with unit and convention.
    pub metrics: BTreeMap<String, BTreeMap<String, MetricSummary>>,
    pub seconds: f64,
    pub timings: serde_json::Value,
}

/// The drafter of a run. Its shape (block size, taps) is known from `config.json` at once; its
/// weights are read and uploaded by the first prompt that needs a drafter forward, so a rerun
/// whose records all come from the cache never loads them. `parity --features` opens drafters
/// the same way (`crate::parity_features`).
pub(crate) struct RunDrafter<'s, B: Backend> {
    s: &'s Session<B>,
    spec: &'s DrafterSpec,
    /// A checkpoint's family (from its config.json; DFlash for the known-answer drafters).
    pub(crate) family: DrafterFamily,
    block_size: usize,
    /// The target layers whose outputs the drafter reads (empty for the known-answer drafters).
    pub(crate) target_layer_ids: Vec<usize>,
    loaded: std::cell::OnceCell<Drafter<B>>,
}

impl<'s, B: Backend> RunDrafter<'s, B> {
    /// Checks the checkpoint against the target (`lint`: config and headers only) and reads its
    /// shape; an incompatible checkpoint is an error here, before the run exists.
    pub(crate) fn open(s: &'s Session<B>, spec: &'s DrafterSpec) -> Result<Self> {
        let mut family = DrafterFamily::DFlash;
        let (block_size, target_layer_ids) = match spec {
            DrafterSpec::Checkpoint { dir, .. } => {
                let findings = lint(&s.files, dir)?;
                if let Some(f) = findings.iter().find(|f| f.severity == Severity::Error) {
                    bail!(
                        "{}: drafter is incompatible with the target {}: {}",
                        dir.display(),
                        s.files.identity.path.display(),
                        f.message
                    );
                }
                family = DrafterFamily::detect(dir)?;
                match family {
                    DrafterFamily::DFlash => {
                        let cfg = super::config::DrafterConfig::load(dir)?;
                        (cfg.block_size, cfg.target_layer_ids)
                    }
                    DrafterFamily::Eagle3 => {
                        let cfg = Eagle3Config::load(dir, s.files.spec.num_layers)?;
                        (cfg.block_size(), cfg.tap_layer_ids)
                    }
                    DrafterFamily::DFlash2 => {
                        let cfg = super::dflash2::DFlash2Config::load(dir)?.backbone;
                        (cfg.block_size, cfg.target_layer_ids)
                    }
                }
            }
            DrafterSpec::Oracle { block_size } | DrafterSpec::AntiOracle { block_size } => {
                (*block_size, Vec::new())
            }
            // The head reads the target's final-norm states: the last layer's output, index L.
            DrafterSpec::Mtp { steps } => {
                super::mtp::check_steps(*steps)?;
                let path = &s.files.identity.path;
                let cfg = super::mtp::MtpHeadConfig::read(path, &s.files.spec)?;
                super::mtp::head::MtpWeights::open(&cfg)?;
                (steps + 1, vec![s.files.spec.num_layers - 1])
            }
        };
        Ok(RunDrafter {
            s,
            spec,
            family,
            block_size,
            target_layer_ids,
            loaded: std::cell::OnceCell::new(),
        })
    }

    /// The drafter, loaded on first use.
    pub(crate) fn get(&self) -> Result<&Drafter<B>> {
        if let Some(d) = self.loaded.get() {
            return Ok(d);
        }
        let d = {
            let _phase = crate::timeline::phase("load drafter");
            match self.spec {
                DrafterSpec::Checkpoint { dir, .. } => match self.family {
                    DrafterFamily::DFlash => Drafter::DFlash(DFlashDrafter::load(
                        &self.s.be,
                        dir,
                        self.s.files.spec.hidden_size,
                    )?),
                    DrafterFamily::Eagle3 => {
                        Drafter::Eagle3(Eagle3Drafter::load(&self.s.be, dir, &self.s.files.spec)?)
                    }
                    DrafterFamily::DFlash2 => {
                        let spec = &self.s.files.spec;
                        Drafter::DFlash2(super::dflash2::DFlash2Drafter::load(
                            &self.s.be,
                            dir,
                            spec.hidden_size,
                            spec.vocab_size,
                        )?)
                    }
                },
                DrafterSpec::Oracle { block_size } => Drafter::Oracle {
                    block_size: *block_size,
                },
                DrafterSpec::AntiOracle { block_size } => Drafter::AntiOracle {
                    block_size: *block_size,
                },
                DrafterSpec::Mtp { steps } => Drafter::Mtp(super::mtp::MtpDrafter::load(
                    &self.s.be,
                    &self.s.files.identity.path,
                    &self.s.files.spec,
                    *steps,
                )?),
            }
        };
        Ok(self.loaded.get_or_init(|| d))
    }
}

/// Evaluate `spec` on `set` and store everything in `store`.
pub fn run_eval<B: Backend>(
    s: &Session<B>,
    spec: &DrafterSpec,
    set: &PromptSet,
    opts: &RunOptions,
    store: &Store,
) -> Result<RunOutcome> {
    run_eval_shard(s, spec, set, opts, None, store)
}

/// [`run_eval`] of one shard of `set` (docs/scale-out.md): only the prompts the shard owns are
/// evaluated, under their indices in the whole set, and the run records the shard and the
/// evaluation identity (`run_eval`), so that `draftlens merge` can put the shards together.
/// A shard that owns no prompt is a valid, complete run with no records.
pub fn run_eval_shard<B: Backend>(
    s: &Session<B>,
    spec: &DrafterSpec,
    set: &PromptSet,
    opts: &RunOptions,
    shard: Option<Shard>,
    store: &Store,
) -> Result<RunOutcome> {
    let t0 = Instant::now();
    let selected: Vec<usize> = match shard {
        Some(sh) => crate::shard::prompts_of_shard(&sh, &set.prompts),
        None => (0..set.prompts.len()).collect(),
    };
    let chosen: Vec<Prompt> = selected.iter().map(|&i| set.prompts[i].clone()).collect();
    // A sampled run's settings are checked before anything is opened or computed.
    if let Some(sampling) = &opts.eval.sampling {
        sampling.check(&opts.eval)?;
    }
    let drafter = RunDrafter::open(s, spec)?;
    if drafter.family == DrafterFamily::Eagle3 {
        super::eagle3::check_options(&opts.eval)?;
    }
    if let DrafterSpec::Mtp { .. } = spec {
        super::mtp::check_options(&opts.eval)?;
    }
    if let (DrafterFamily::DFlash2, DrafterSpec::Checkpoint { dir, .. }) = (drafter.family, spec) {
        super::dflash2::check_options(dir, &opts.eval)?;
    }
    if let Some(tree) = &opts.eval.eagle3_tree {
        let target = &s.files.spec;
        super::eagle3::tree::check_run(tree, drafter.family, spec, target, &opts.eval)?;
    }
    let taps = drafter.target_layer_ids.len();
    // Before the run is created or anything computed: every prompt must fit on the device.
    s.check_prompts_fit(&chosen, opts.max_new_tokens, taps)?;
    let drafter_identity = DrafterIdentity::of(
        spec,
        drafter.block_size,
        &crate::identity::IdentityStore::new(s.cache.root()),
        &s.target_sha256()?,
    )?;
    let tok = s.files.tokenizer()?;
    let _setup = crate::timeline::phase("run setup");
    let identity = RunIdentity::new(s, drafter_identity, set, opts, shard, selected.len())?;
    super::vocab::store_vocab(store, tok, &s.files.identity.path.display().to_string())?;
    let run_id = store.create_eval_run(&identity.new_run(), &identity.run_eval()?)?;
    drop(_setup);
    let name = identity.name;
    // A tree run drafts every prompt: its trees need the drafter's passes, which cached
    // records would skip.
    let records_sha = match opts.eval.eagle3_tree {
        Some(_) => None,
        None => identity.drafter.records_sha(),
    };
    let result = evaluate_prompts(
        s,
        &drafter,
        set,
        &selected,
        opts,
        store,
        run_id,
        records_sha,
    );
    // False when every prompt's records came from the cache: the weights were never read.
    let drafter_loaded = drafter.loaded.get().is_some();
    // The records do not depend on the cache: an entry that could not be written costs only a
    // recomputation next time, so it is a warning here (`extract`, whose product is the cache,
    // fails on it).
    if let Err(e) = s.flush_cache() {
        tracing::warn!("some cache entries were not written: {e:#}");
    }
    match result {
        Ok((infos, all, timings, trees)) => {
            let _phase = crate::timeline::phase("metrics");
            let tm = Instant::now();
            let mut metrics = summarize(&all, &infos);
            if let Some(sampling) = &opts.eval.sampling {
                metrics.extend(sampled_rows(&all, &infos, &sampling.params));
            }
            if let Some(tree) = &opts.eval.eagle3_tree {
                let depth = drafter.block_size - 1;
                metrics.extend(super::eagle3::tree::tree_rows(tree, depth, &infos, &trees));
            }
            store.add_metrics(run_id, &metrics)?;
            let metrics_s = tm.elapsed().as_secs_f64();
            let timings = serde_json::json!({ "total_s": t0.elapsed().as_secs_f64(), "target_s": timings.0, "draft_s": timings.1, "metrics_s": metrics_s, "records_cached": timings.2, "contexts_from_device": timings.3, "drafter_loaded": drafter_loaded });
            store.finish_run(run_id, RunStatus::Complete, None, &timings)?;
            let mut run_metrics: BTreeMap<String, BTreeMap<String, MetricSummary>> =
                BTreeMap::new();
            for m in metrics
                .iter()
                .filter(|m| m.scope == draftlens_results::store::MetricScope::Run)
            {
                run_metrics.entry(m.source.clone()).or_default().insert(
                    m.name.clone(),
                    MetricSummary {
                        value: m.value,
                        unit: m.unit.clone(),
                        description: m.description.clone(),
                        count: m.count,
                        higher_is_better: m.higher_is_better,
                    },
                );
            }
            Ok(RunOutcome {
                run_id,
                name,
                prompts: infos.len(),
                blocks: all.num_blocks(),
                metrics: run_metrics,
                seconds: t0.elapsed().as_secs_f64(),
                timings,
            })
        }
        Err(e) => {
            let msg = format!("{e:#}");
            store.finish_run(
                run_id,
                RunStatus::Failed,
                Some(&msg),
                &serde_json::json!({ "total_s": t0.elapsed().as_secs_f64() }),
            )?;
            Err(e.context(format!(
                "run {run_id} ({name}) failed and is marked failed in the store"
            )))
        }
    }
}

/// Prompt infos, all records, (target seconds, drafter seconds, prompts whose records came
/// from the cache, prompts whose drafter context came from taps on the device), and the EAGLE-3
/// trees' accepted lengths of a `--eagle3-tree` run (empty otherwise).
type Evaluated = (
    Vec<PromptInfo>,
    RecordBatch,
    (f64, f64, usize, usize),
    Vec<super::eagle3::tree::PromptTree>,
);

/// A prompt whose sequence is known and whose target pass waits for its pack.
struct Pending {
    index: usize,
    ids: Vec<u32>,
    prompt_len: usize,
}

/// Per prompt: sequence (prompt + labels) → target pass → drafter → records stored. The target
/// passes of consecutive prompts run packed ([`Session::target_passes`], at most
/// `s.pack_tokens` tokens per window), then each prompt is drafted and stored in order.
/// `selected`: the indices (into `set.prompts`, ascending) of the prompts to evaluate.
fn evaluate_prompts<B: Backend>(
    s: &Session<B>,
    drafter: &RunDrafter<'_, B>,
    set: &PromptSet,
    selected: &[usize],
    opts: &RunOptions,
    store: &Store,
    run_id: i64,
    records_sha: Option<String>,
) -> Result<Evaluated> {
    std::thread::scope(|scope| {
        let sink = RecordSink::start(scope, store, run_id);
        let mut ev = evaluation(s, drafter, set, selected, opts, sink, records_sha)?;
        let result = evaluate_into(&mut ev, selected);
        // The records of every prompt drafted so far are stored before returning, whether the
        // loop finished or stopped (`--fail-after`, an interrupt, an error).
        let stored = ev.sink.finish();
        result?;
        stored?;
        ev.pb.finish_and_clear();
        Ok((
            ev.infos,
            ev.all,
            (
                ev.target_s,
                ev.draft_s,
                ev.records_cached,
                ev.contexts_from_device,
            ),
            ev.eagle3_trees,
        ))
    })
}

fn evaluation<'a, 's, B: Backend>(
    s: &'a Session<B>,
    drafter: &'a RunDrafter<'a, B>,
    set: &'a PromptSet,
    selected: &[usize],
    opts: &'a RunOptions,
    sink: RecordSink<'s>,
    records_sha: Option<String>,
) -> Result<Evaluation<'a, 's, B>> {
    let layer_ids = drafter.target_layer_ids.clone();
    let mut ev = Evaluation {
        s,
        drafter,
        set,
        opts,
        sink,
        capture: Capture::for_layer_ids(&layer_ids, s.files.spec.num_layers)?,
        tap_idx: layer_ids.iter().map(|i| i + 1).collect(),
        all: RecordBatch::new(drafter.block_size as u32, opts.eval.top_k as u32),
        infos: Vec::new(),
        target_s: 0.0,
        draft_s: 0.0,
        records_sha,
        records_cached: 0,
        contexts_from_device: 0,
        eagle3_trees: Vec::new(),
        pb: crate::progress::bar(selected.len() as u64, "evaluate"),
        total: selected.len(),
    };
    ev.all.target_ids = Some(Vec::new());
    ev.all.target_logprobs = Some(Vec::new());
    Ok(ev)
}

/// The prompt loop of [`evaluate_prompts`].
fn evaluate_into<B: Backend>(ev: &mut Evaluation<'_, '_, B>, selected: &[usize]) -> Result<()> {
    let (s, set, opts) = (ev.s, ev.set, ev.opts);
    let mut window = Packer::new(s.options().pack_tokens);
    let batch = s.gen_batch();
    for (c, chunk_idx) in selected.chunks(batch).enumerate() {
        ev.check_interrupted()?;
        // The target's continuations of a chunk of prompts are decoded together
        // (Session::continuations); everything after runs prompt by prompt.
        let t = Instant::now();
        let chunk: Vec<Prompt> = chunk_idx.iter().map(|&i| set.prompts[i].clone()).collect();
        let seqs = chunk_sequences(s, set, opts, &chunk)?;
        ev.target_s += t.elapsed().as_secs_f64();
        for (j, (ids, prompt_len)) in seqs.into_iter().enumerate() {
            // k: position among the evaluated prompts; index: the prompt's index in the set.
            let k = c * batch + j;
            ev.check_interrupted()?;
            if opts.fail_after == Some(k) {
                // The prompts before k are stored, as the option promises.
                ev.flush(window.finish())?;
                bail!("stopped after {k} prompts (--fail-after)");
            }
            let len = ids.len();
            let pending = Pending {
                index: chunk_idx[j],
                ids,
                prompt_len,
            };
            if let Some(full) = window.push(pending, len) {
                ev.flush(full)?;
            }
        }
    }
    ev.flush(window.finish())
}

/// Stores each prompt's records on a thread of its own: SQLite's commit of one prompt (~2 ms)
/// then overlaps the drafting of the next instead of leaving the GPU idle. Prompts are stored in
/// the order they are sent; the first error stops the writer, and the next [`RecordSink::send`]
/// or [`RecordSink::finish`] returns it.
struct RecordSink<'s> {
    tx: Option<std::sync::mpsc::SyncSender<(RunPrompt, RecordBatch)>>,
    writer: Option<std::thread::ScopedJoinHandle<'s, Result<()>>>,
}

impl<'s> RecordSink<'s> {
    /// Prompts that may wait (each ~250 KB of records): a prompt is drafted in ~10 ms on an
    /// H200 while one commit behind the cache writer's fsyncs can take ~100 ms.
    const QUEUE: usize = 32;

    fn start<'e>(
        scope: &'s std::thread::Scope<'s, 'e>,
        store: &'s Store,
        run_id: i64,
    ) -> RecordSink<'s> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(RunPrompt, RecordBatch)>(Self::QUEUE);
        let writer = scope.spawn(move || -> Result<()> {
            for (prompt, records) in rx {
                let _work = crate::timeline::background("store records");
                store.add_prompt_records(run_id, &prompt, &records)?;
            }
            Ok(())
        });
        RecordSink {
            tx: Some(tx),
            writer: Some(writer),
        }
    }

    fn send(&mut self, prompt: RunPrompt, records: RecordBatch) -> Result<()> {
        let tx = self.tx.as_ref().context("the record writer has finished")?;
        if tx.send((prompt, records)).is_err() {
            // The writer stopped on an error: report it.
            self.finish()?;
            bail!("the record writer stopped");
        }
        Ok(())
    }

    /// Waits until everything sent is stored; the writer's first error, if any.
    fn finish(&mut self) -> Result<()> {
        drop(self.tx.take());
        match self.writer.take() {
            Some(w) => w
                .join()
                .map_err(|_| anyhow::anyhow!("the record writer panicked"))?,
            None => Ok(()),
        }
    }
}

/// Each prompt of `chunk` as (prompt + labels, prompt length): the labels are the target's greedy
/// continuation (decoded for the whole chunk at once), its sampled one at T > 0 (`run
/// --temperature`: drawn prompt by prompt, each on its own stream) or, with `--labels data`, the
/// prompt's reference completion.
fn chunk_sequences<B: Backend>(
    s: &Session<B>,
    set: &PromptSet,
    opts: &RunOptions,
    chunk: &[Prompt],
) -> Result<Vec<(Vec<u32>, usize)>> {
    let with_labels = |mut ids: Vec<u32>, labels: &[u32]| {
        let prompt_len = ids.len();
        ids.extend(labels);
        (ids, prompt_len)
    };
    match opts.eval.labels {
        Labels::Target => match &opts.eval.sampling {
            None => Ok(s
                .prompts_with_continuations(chunk, opts.max_new_tokens)?
                .into_iter()
                .map(|(ids, c)| with_labels(ids, &c.ids))
                .collect()),
            Some(sampling) => chunk
                .iter()
                .map(|p| {
                    let ids = s.prompt_ids(p)?;
                    let eos = s.eos_ids();
                    let c = sampling.continuation(
                        &s.be,
                        s.model()?,
                        &ids,
                        opts.max_new_tokens,
                        &eos,
                        &p.hash(),
                    )?;
                    Ok(with_labels(ids, &c))
                })
                .collect(),
        },
        Labels::Data => {
            let tok = s.files.tokenizer()?;
            chunk
                .iter()
                .map(|p| {
                    let c = p.completion.as_deref().with_context(|| {
                        format!(
                            "{}: prompt {} has no reference `completion` (needed for --labels data)",
                            set.source.display(),
                            p.id
                        )
                    })?;
                    let mut labels = tok.encode(c, false)?;
                    labels.truncate(opts.max_new_tokens);
                    Ok(with_labels(s.prompt_ids(p)?, &labels))
                })
                .collect()
        }
    }
}

/// The state of [`evaluate_prompts`]: what every prompt needs and what the run accumulates.
struct Evaluation<'a, 's, B: Backend> {
    s: &'a Session<B>,
    drafter: &'a RunDrafter<'a, B>,
    set: &'a PromptSet,
    opts: &'a RunOptions,
    /// Where each prompt's records go (stored in order on the sink's thread).
    sink: RecordSink<'s>,
    capture: Capture,
    /// HF hidden-state indices of the drafter's taps.
    tap_idx: Vec<usize>,
    all: RecordBatch,
    infos: Vec<PromptInfo>,
    target_s: f64,
    draft_s: f64,
    /// The DFlash checkpoint's files hash, under which its records are cached (`None`: the
    /// known-answer drafters, which are not cached).
    records_sha: Option<String>,
    records_cached: usize,
    /// Prompts whose drafter context was built from taps still on the device
    /// (`Session::target_passes_for_drafting`), not uploaded from host copies.
    contexts_from_device: usize,
    /// Per prompt, the EAGLE-3 tree's accepted lengths (`--eagle3-tree` runs only).
    eagle3_trees: Vec<super::eagle3::tree::PromptTree>,
    pb: indicatif::ProgressBar,
    /// Prompts this run evaluates.
    total: usize,
}

impl<B: Backend> Evaluation<'_, '_, B> {
    fn check_interrupted(&self) -> Result<()> {
        if INTERRUPTED.load(Ordering::Relaxed) {
            bail!(
                "interrupted after {} of {} prompts",
                self.infos.len(),
                self.total
            );
        }
        Ok(())
    }

    /// The target passes of `window` (packed), then each prompt drafted and stored in order.
    /// Prompts whose records this checkpoint produced before come from the cache and need
    /// neither a target pass nor a drafter forward.
    fn flush(&mut self, window: Vec<Pending>) -> Result<()> {
        if window.is_empty() {
            return Ok(());
        }
        let (s, opts) = (self.s, self.opts);
        let (b, k) = (self.drafter.block_size as u32, opts.eval.top_k as u32);
        let keys = match &self.records_sha {
            Some(sha) => window
                .iter()
                .map(|w| {
                    records_cache::key(s, &w.ids, w.prompt_len, &self.tap_idx, sha, &opts.eval)
                        .map(Some)
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![None; window.len()],
        };
        let mut cached: Vec<Option<RecordBatch>> = if self.records_sha.is_some() {
            let _phase = crate::timeline::phase("cache read (records)");
            let keys: Vec<_> = keys.iter().flatten().cloned().collect();
            s.cache_get_many(&keys)?
                .into_iter()
                .zip(&window)
                .map(|(hit, w)| {
                    hit.and_then(|t| records_cache::from_tensors(t, b, k, w.index as u32))
                })
                .collect()
        } else {
            vec![None; window.len()]
        };
        self.records_cached += cached.iter().flatten().count();
        let t = Instant::now();
        let todo: Vec<&[u32]> = window
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(w, _)| w.ids.as_slice())
            .collect();
        let mut passes = if todo.is_empty() {
            Vec::new()
        } else {
            s.target_passes_for_drafting(&todo, &self.capture, opts.eval.top_k)?
        }
        .into_iter();
        self.target_s += t.elapsed().as_secs_f64();
        let tok = s.files.tokenizer()?;
        for ((w, hit), key) in window.iter().zip(cached.iter_mut()).zip(keys) {
            self.check_interrupted()?;
            let (i, ids) = (w.index, &w.ids);
            let p = &self.set.prompts[i];
            let rec = match hit.take() {
                Some(rec) => rec,
                None => {
                    let (pass, device) = passes.next().context("target pass missing")?;
                    let rec = self.draft(w, &pass, device.as_deref())?;
                    let _phase = crate::timeline::phase("records: cache");
                    if let Some(key) = key {
                        let entry = records_cache::to_tensors(&rec);
                        s.cache_put(key, move || entry)?;
                    }
                    rec
                }
            };
            let _phase = crate::timeline::phase("records: store");
            self.all.extend(&rec);
            let prompt = RunPrompt {
                index: i as u32,
                id: p.id.clone(),
                sha256: p.hash(),
                category: p.category.clone(),
                prompt_len: w.prompt_len as u32,
                token_ids: ids.clone(),
                text: tok.decode(ids)?,
            };
            self.sink.send(prompt, rec)?;
            self.infos.push(PromptInfo {
                index: i as u32,
                prompt_len: w.prompt_len,
                seq_len: ids.len(),
                category: p.category.clone(),
            });
            self.pb.inc(1);
        }
        Ok(())
    }
}

impl<B: Backend> Evaluation<'_, '_, B> {
    /// The drafter's taps, in its `target_layer_ids` order, from `get` (HF index → tap).
    fn drafter_taps<'p, T>(&self, get: impl Fn(usize) -> Option<&'p T>) -> Result<Vec<&'p T>> {
        self.tap_idx
            .iter()
            .map(|&x| get(x).context("tap not captured"))
            .collect()
    }

    /// The records of one prompt from its target pass: the drafter's context (from the taps
    /// still on the device when `device` has them, else uploaded from the pass), then every
    /// anchor.
    fn draft(
        &mut self,
        w: &Pending,
        pass: &crate::session::TargetPass,
        device: Option<&ResidentPass<B::Tensor>>,
    ) -> Result<RecordBatch> {
        let (s, opts) = (self.s, self.opts);
        let _drafting = crate::timeline::phase("drafter");
        let t = Instant::now();
        let mut seq = Sequence::new(
            w.index as u32,
            &w.ids,
            w.prompt_len,
            &pass.topk,
            opts.eval.labels,
        );
        let drafter = self.drafter.get()?;
        // Target weights (embedding and LM head) only for a drafter that reads them: DFlash, and
        // an EAGLE-3 drafter without an embedding of its own.
        let target = match drafter {
            Drafter::DFlash(_) | Drafter::DFlash2(_) => DraftTarget::Head(s.draft_target()?),
            Drafter::Eagle3(d) if d.needs_target_embedding() => {
                DraftTarget::Head(s.draft_target()?)
            }
            Drafter::Mtp(_) => DraftTarget::Head(s.draft_target()?),
            _ => DraftTarget::Vocab(s.files.spec.vocab_size),
        };
        match drafter {
            // DFlash2's context is its backbone's.
            Drafter::DFlash(d)
            | Drafter::DFlash2(super::dflash2::DFlash2Drafter { backbone: d, .. }) => {
                let ctx = match device {
                    Some(dev) => {
                        let taps = self.drafter_taps(|x| dev.tap(x))?;
                        let _phase = crate::timeline::phase("drafter context");
                        self.contexts_from_device += 1;
                        d.context_from_tensors(&s.be, &taps)?
                    }
                    None => {
                        let taps = self.drafter_taps(|x| pass.hidden(x))?;
                        let _phase = crate::timeline::phase("drafter context");
                        d.context(&s.be, &taps, pass.hidden_size)?
                    }
                };
                seq.ctx = Some(ctx);
            }
            Drafter::Eagle3(d) => {
                let head = target.head();
                seq.eagle3 = match device {
                    Some(dev) => {
                        let taps = self.drafter_taps(|x| dev.tap(x))?;
                        let _phase = crate::timeline::phase("drafter context");
                        self.contexts_from_device += 1;
                        d.context_from_tensors(&s.be, head, &taps, &w.ids)?
                    }
                    None => {
                        let taps = self.drafter_taps(|x| pass.hidden(x))?;
                        let _phase = crate::timeline::phase("drafter context");
                        d.context(&s.be, head, &taps, pass.hidden_size, &w.ids)?
                    }
                };
            }
            Drafter::Mtp(d) => {
                let DraftTarget::Head(head) = target else {
                    bail!("an MTP head needs the target's embedding and LM head");
                };
                seq.mtp = match device {
                    Some(dev) => {
                        let [state] = self.drafter_taps(|x| dev.tap(x))?[..] else {
                            bail!("an MTP head reads one target state");
                        };
                        let _phase = crate::timeline::phase("drafter context");
                        self.contexts_from_device += 1;
                        d.context_from_tensor(&s.be, head, state, &w.ids)?
                    }
                    None => {
                        let [state] = self.drafter_taps(|x| pass.hidden(x))?[..] else {
                            bail!("an MTP head reads one target state");
                        };
                        let _phase = crate::timeline::phase("drafter context");
                        d.context(&s.be, head, state, &w.ids)?
                    }
                };
            }
            Drafter::Oracle { .. } | Drafter::AntiOracle { .. } => {}
        }
        let rec = evaluate_sequence(&s.be, target, drafter, &seq, &opts.eval)?;
        if let (Some(shape), Drafter::Eagle3(d)) = (opts.eval.eagle3_tree, drafter) {
            let (be, head) = (&s.be, target.head());
            let accepted =
                super::eagle3::tree::tree_accepted(be, head, d, &seq, shape, &opts.eval)?;
            let index = w.index as u32;
            self.eagle3_trees
                .push(super::eagle3::tree::PromptTree { index, accepted });
        }
        self.draft_s += t.elapsed().as_secs_f64();
        Ok(rec)
    }
}
