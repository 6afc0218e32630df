//! `draftlens parity --features FILE` (docs/parity-features.md): hidden states another pipeline
//! computed (a training framework's offline feature cache, a transformers `output_hidden_states`
//! dump) against draftlens's own for the same token ids, per layer (relative L2, cosine, the worst
//! positions), and a drafter's replayed τ and per-position acceptance on each set of states.
//!
//! draftlens's states are the reference: every divergence is ‖features − draftlens‖ / ‖draftlens‖.
//! For the drafter, only the taps differ between the two evaluations: the sequence, the anchors,
//! the target's top-K and the labels (the target's greedy token at every position, teacher-forced
//! on the sequence) come from draftlens in both, so a τ difference is the features' alone.
//!
//! Every check on the file (names, prompt ids, dtypes, shapes, the drafter's layers, token ids)
//! runs before the first comparison, and nothing is stored: the report is the only output.

mod file;
mod format;

pub use file::{Expect, FeatureRecord, FeaturesFile};
pub use format::format_report;

use crate::backend::{Backend, HostRowsRef};
use crate::drafter::eval::{
    evaluate_sequence, DraftTarget, Drafter, EvalOptions, Labels, Sequence,
};
use crate::drafter::run::{DrafterSpec, RunDrafter};
use crate::model::Capture;
use crate::parity::{diff, Diff};
use crate::parity_report::POSITION_METRIC;
use crate::prompts::PromptSet;
use crate::records::RecordBatch;
use crate::session::Session;
use anyhow::{bail, Context, Result};
use draftlens_results::metrics::{summarize, PromptInfo};
use draftlens_results::store::{MetricRow, MetricScope};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The version of [`FeaturesReport`]'s JSON shape (docs/json.md §1).
pub const SCHEMA_VERSION: u32 = 1;

/// The τ the report leads with (docs/metrics.md): replayed, macro over prompts.
pub const TAU_METRIC: &str = "tau_replayed_macro";

/// Prompts whose target passes run in one call (packed by the session).
const WINDOW: usize = 16;

/// What `parity --features` runs.
pub struct FeaturesOptions {
    pub features: PathBuf,
    /// A drafter to evaluate on both sets of hidden states.
    pub drafter: Option<DrafterSpec>,
    /// Positions listed per layer as the worst.
    pub worst: usize,
}

/// The whole report (`draftlens parity --features FILE --json`).
#[derive(Debug, Serialize)]
pub struct FeaturesReport {
    pub schema_version: u32,
    pub features: String,
    pub target: String,
    /// The backend draftlens's own hidden states come from.
    pub backend: String,
    pub tokens: usize,
    pub prompts: Vec<FeaturePrompt>,
    /// One entry per layer id in the file, ascending.
    pub layers: Vec<LayerDivergence>,
    pub drafter: Option<DrafterComparison>,
}

/// One prompt of the file.
#[derive(Debug, Serialize)]
pub struct FeaturePrompt {
    pub id: String,
    pub prompt_tokens: usize,
    pub tokens: usize,
    /// `file` (`PROMPT.input_ids`) or `draftlens` (the prompt and the target's greedy
    /// continuation, as `extract --out` wrote them).
    pub token_ids_from: &'static str,
    /// Replayed τ of this prompt on draftlens's taps and on the file's (with `--drafter`; null
    /// when the sequence has no token after the prompt).
    pub tau_draftlens: Option<f64>,
    pub tau_features: Option<f64>,
}

/// One layer compared over every token of every prompt.
#[derive(Debug, Serialize)]
pub struct LayerDivergence {
    /// Decoder layer id (the L of `PROMPT.layerL`).
    pub layer_id: usize,
    /// The Hugging Face `hidden_states` index (L + 1).
    pub hidden_state_index: usize,
    /// Pooled over all rows, draftlens as the reference.
    pub diff: Diff,
    /// The rows of largest relative L2, worst first (rows equal to draftlens's are not listed).
    pub worst_positions: Vec<WorstPosition>,
}

/// One row (prompt, position) of a layer.
#[derive(Clone, Debug, Serialize)]
pub struct WorstPosition {
    pub prompt_id: String,
    /// 0-based position in the sequence.
    pub position: usize,
    pub token_id: u32,
    /// The position is inside the prompt (else in the continuation).
    pub in_prompt: bool,
    pub rel_l2: f64,
    pub cosine: f64,
}

/// A drafter's metrics on draftlens's taps and on the file's.
#[derive(Debug, Serialize)]
pub struct DrafterComparison {
    pub drafter: String,
    /// The layers it reads (its taps).
    pub layer_ids: Vec<usize>,
    /// [`TAU_METRIC`] on both.
    pub tau: MetricPair,
    /// Every run-level scalar metric (τ variants, acceptance, accuracy …) on both.
    pub metrics: BTreeMap<String, MetricPair>,
    /// Acceptance at position k conditional on all earlier accepted (`cond_accept`), k = 1 first.
    pub per_position: Vec<PositionPair>,
    /// One sentence: how much τ the features lose or gain.
    pub verdict: String,
}

/// One metric on draftlens's taps and on the file's; `delta` = features − draftlens.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MetricPair {
    pub draftlens: f64,
    pub features: f64,
    pub delta: f64,
}

impl MetricPair {
    fn new(draftlens: f64, features: f64) -> Self {
        MetricPair {
            draftlens,
            features,
            delta: features - draftlens,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct PositionPair {
    pub k: usize,
    pub draftlens: Option<f64>,
    pub features: Option<f64>,
    pub delta: Option<f64>,
}

/// The sums behind [`crate::parity::diff`], accumulated row by row so that a layer is compared
/// over every prompt without holding all of them (same definitions: draftlens is the reference,
/// non-finite feature values are counted, not summed).
#[derive(Default)]
struct DiffSums {
    n: usize,
    ee: f64,
    rr: f64,
    oo: f64,
    ro: f64,
    max_abs: f64,
    non_finite: usize,
}

impl DiffSums {
    fn add(&mut self, reference: &[f32], other: &[f32]) {
        self.n += reference.len();
        for (&r, &o) in reference.iter().zip(other) {
            if !o.is_finite() && r.is_finite() {
                self.non_finite += 1;
                continue;
            }
            let (r, o) = (r as f64, o as f64);
            let e = o - r;
            self.ee += e * e;
            self.rr += r * r;
            self.oo += o * o;
            self.ro += r * o;
            self.max_abs = self.max_abs.max(e.abs());
        }
    }

    fn finish(&self) -> Diff {
        let (ee, rr, oo, ro) = (self.ee, self.rr, self.oo, self.ro);
        Diff {
            n: self.n,
            rel_l2: if rr > 0.0 {
                (ee / rr).sqrt()
            } else if ee > 0.0 {
                f64::INFINITY
            } else {
                0.0
            },
            max_abs: self.max_abs,
            cosine: if rr > 0.0 && oo > 0.0 {
                ro / (rr.sqrt() * oo.sqrt())
            } else if rr == 0.0 && oo == 0.0 {
                1.0
            } else {
                0.0
            },
            ref_rms: if self.n > 0 {
                (rr / self.n as f64).sqrt()
            } else {
                0.0
            },
            non_finite: self.non_finite,
        }
    }
}

/// One layer while prompts are being compared.
struct LayerAcc {
    sums: DiffSums,
    worst: Vec<WorstPosition>,
}

/// A NaN row is worse than any number.
fn worse(a: &WorstPosition, b: &WorstPosition) -> std::cmp::Ordering {
    let key = |w: &WorstPosition| {
        if w.rel_l2.is_nan() {
            f64::INFINITY
        } else {
            w.rel_l2
        }
    };
    key(b).total_cmp(&key(a))
}

/// A prompt of the file with the token ids its rows are for.
struct Item<'f> {
    rec: &'f FeatureRecord,
    ids: Vec<u32>,
    prompt_len: usize,
}

/// The token ids of every record, checked against draftlens's tokenisation of its prompt. A
/// record without `input_ids` is for draftlens's own sequence: the prompt and the target's
/// greedy continuation, as long as the rows say.
fn sequences<'f, B: Backend>(
    s: &Session<B>,
    set: &PromptSet,
    file: &'f FeaturesFile,
    taps: usize,
) -> Result<Vec<Item<'f>>> {
    let p = file.path.display();
    let prompts: Vec<_> = file
        .records
        .iter()
        .map(|r| set.prompts[r.prompt_index].clone())
        .collect();
    let prompt_ids = s.prompt_ids_many(&prompts)?;
    let tok = s.files.tokenizer()?;
    let show = |id: u32| {
        tok.decode(&[id])
            .map(|t| format!("{id} {t:?}"))
            .unwrap_or_else(|_| id.to_string())
    };
    // Records without ids, grouped by continuation length (decoded together).
    let mut to_continue: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut items = Vec::with_capacity(file.records.len());
    for (n, (rec, pids)) in file.records.iter().zip(&prompt_ids).enumerate() {
        let id = &rec.prompt_id;
        let how = if set.prompts[rec.prompt_index].messages.is_some() {
            "with the target's chat template"
        } else {
            "its raw text"
        };
        let ids = match &rec.input_ids {
            Some(ids) => {
                if let Some(pos) = (0..pids.len().min(ids.len())).find(|&i| ids[i] != pids[i]) {
                    bail!("{p}: tensor {id}.input_ids differs from the prompt's tokenisation at position {pos}: the file has {}, draftlens {} (the prompt is {} tokens, {how}; docs/parity-features.md)", show(ids[pos]), show(pids[pos]), pids.len());
                }
                if ids.len() < pids.len() {
                    bail!("{p}: tensor {id}.input_ids holds {} token ids, fewer than the prompt's {} ({how}); the features must cover the whole prompt", ids.len(), pids.len());
                }
                ids.clone()
            }
            None => {
                if rec.rows < pids.len() {
                    bail!("{p}: prompt {id:?}: its tensors have {} rows, fewer than the prompt's {} tokens ({how}); add {id}.input_ids with the token ids the rows are for", rec.rows, pids.len());
                }
                if rec.rows > pids.len() {
                    to_continue
                        .entry(rec.rows - pids.len())
                        .or_default()
                        .push(n);
                }
                pids.clone()
            }
        };
        items.push(Item {
            rec,
            ids,
            prompt_len: pids.len(),
        });
    }
    let longest = items
        .iter()
        .map(|i| i.rec.rows - i.prompt_len)
        .max()
        .unwrap_or(0);
    s.check_prompts_fit(&prompts, longest, taps)?;
    for (max_new, group) in to_continue {
        let refs: Vec<&[u32]> = group.iter().map(|&n| items[n].ids.as_slice()).collect();
        let conts = s.continuations(&refs, max_new)?;
        for (&n, c) in group.iter().zip(conts) {
            let it = &mut items[n];
            it.ids.extend(&c.ids);
            if it.ids.len() != it.rec.rows {
                let id = &it.rec.prompt_id;
                bail!("{p}: prompt {id:?}: its tensors have {} rows, but draftlens's sequence is {} tokens ({} of the prompt, then the target's greedy continuation, which ended at an end-of-generation token); add {id}.input_ids with the token ids the rows are for", it.rec.rows, it.ids.len(), it.prompt_len);
            }
        }
    }
    Ok(items)
}

/// The drafter's records on one set of taps (draftlens's or the file's).
fn draft_on<B: Backend>(
    s: &Session<B>,
    drafter: &Drafter<B>,
    seq: &mut Sequence<B>,
    taps: &[HostRowsRef<'_>],
    opts: &EvalOptions,
) -> Result<RecordBatch> {
    let hidden = s.files.spec.hidden_size;
    // What drafting needs of the target, as `run` decides it (drafter/run.rs).
    let target = match drafter {
        Drafter::DFlash(_) => DraftTarget::Head(s.draft_target()?),
        Drafter::Eagle3(d) if d.needs_target_embedding() => DraftTarget::Head(s.draft_target()?),
        _ => DraftTarget::Vocab(s.files.spec.vocab_size),
    };
    match drafter {
        Drafter::DFlash(d) => seq.ctx = Some(d.context(&s.be, taps, hidden)?),
        Drafter::Eagle3(d) => {
            seq.eagle3 = d.context(&s.be, target.head(), taps, hidden, seq.ids)?;
        }
        Drafter::Oracle { .. } | Drafter::AntiOracle { .. } => {}
        // `--drafter DIR` opens a checkpoint: DFlash or EAGLE-3.
        #[allow(unreachable_patterns)]
        _ => bail!("parity --features evaluates DFlash and EAGLE-3 checkpoints only"),
    }
    evaluate_sequence(&s.be, target, drafter, seq, opts)
}

/// Run-level scalars and the per-position acceptance of one evaluation, and per-prompt τ.
struct Summary {
    scalars: BTreeMap<String, f64>,
    per_position: Vec<Option<f64>>,
    per_prompt_tau: BTreeMap<u32, f64>,
}

fn summary(rows: Vec<MetricRow>) -> Summary {
    let mut out = Summary {
        scalars: BTreeMap::new(),
        per_position: Vec::new(),
        per_prompt_tau: BTreeMap::new(),
    };
    for r in rows {
        match r.scope {
            MetricScope::Run => {
                if r.name == POSITION_METRIC {
                    out.per_position = r
                        .series
                        .as_ref()
                        .and_then(|v| v.as_array())
                        .map(|a| a.iter().map(|x| x.as_f64()).collect())
                        .unwrap_or_default();
                }
                out.scalars.insert(r.name, r.value);
            }
            MetricScope::Prompt(i) if r.name == "tau_replayed" => {
                out.per_prompt_tau.insert(i, r.value);
            }
            _ => {}
        }
    }
    out
}

/// The sentence the report ends with.
fn verdict(tau: MetricPair, prompts: usize) -> String {
    let (a, b, d) = (tau.draftlens, tau.features, tau.delta);
    if !a.is_finite() || !b.is_finite() {
        return "τ is undefined: no prompt of the file has tokens after the prompt (docs/parity-features.md)".into();
    }
    let over = format!("replayed τ, macro over {prompts} prompts");
    if d.abs() < 5e-4 {
        format!("the features give the same τ as draftlens's own hidden states ({a:.3}; {over})")
    } else if d < 0.0 {
        format!(
            "the features lose {:.3} τ against draftlens's own hidden states ({a:.3} → {b:.3}; {over})",
            -d
        )
    } else {
        format!("the features gain {d:.3} τ over draftlens's own hidden states ({a:.3} → {b:.3}; {over})")
    }
}

/// Runs the comparison described in the module doc on `s` (draftlens's side) over the prompts
/// of `set` that the file names.
pub fn features_report<B: Backend>(
    s: &Session<B>,
    set: &PromptSet,
    opts: &FeaturesOptions,
) -> Result<FeaturesReport> {
    let spec = &s.files.spec;
    // The drafter is checked against the target (lint) before the file is read.
    let drafter = opts
        .drafter
        .as_ref()
        .map(|d| RunDrafter::open(s, d))
        .transpose()?;
    let taps: Vec<usize> = drafter
        .as_ref()
        .map(|d| d.target_layer_ids.clone())
        .unwrap_or_default();
    let tap_source = match drafter.as_ref().map(|d| d.family) {
        Some(crate::drafter::config::DrafterFamily::Eagle3) => "the EAGLE-3 checkpoint's taps",
        _ => "dflash_config.target_layer_ids",
    };
    let file = FeaturesFile::open(
        &opts.features,
        set,
        &Expect {
            num_layers: spec.num_layers,
            hidden_size: spec.hidden_size,
            vocab_size: spec.vocab_size,
            drafter_layers: drafter.as_ref().map(|_| (taps.as_slice(), tap_source)),
        },
    )?;
    let mut captured = file.layer_ids.clone();
    captured.extend(&taps);
    captured.sort_unstable();
    captured.dedup();
    let items = sequences(s, set, &file, captured.len())?;
    let eval = EvalOptions {
        labels: Labels::Target,
        ..EvalOptions::default()
    };
    let capture = Capture::for_layer_ids(&captured, spec.num_layers)?;
    let mut layers: BTreeMap<usize, LayerAcc> = file
        .layer_ids
        .iter()
        .map(|&l| {
            (
                l,
                LayerAcc {
                    sums: DiffSums::default(),
                    worst: Vec::new(),
                },
            )
        })
        .collect();
    let (block, top_k) = match &drafter {
        Some(d) => (d.get()?.block_size() as u32, eval.top_k as u32),
        None => (1, eval.top_k as u32),
    };
    let new_batch = || {
        let mut b = RecordBatch::new(block, top_k);
        b.target_ids = Some(Vec::new());
        b.target_logprobs = Some(Vec::new());
        b
    };
    let (mut ours_all, mut theirs_all) = (new_batch(), new_batch());
    let mut infos = Vec::new();
    let pb = crate::progress::bar(items.len() as u64, "parity --features");
    for window in items.chunks(WINDOW) {
        let seqs: Vec<&[u32]> = window.iter().map(|w| w.ids.as_slice()).collect();
        let passes = s.target_passes(&seqs, &capture, eval.top_k)?;
        for (it, pass) in window.iter().zip(&passes) {
            let rec = it.rec;
            let h = spec.hidden_size;
            // draftlens's rows and the file's, per layer id the comparison or the drafter needs.
            let mut ours: BTreeMap<usize, &crate::backend::HostRows> = BTreeMap::new();
            let mut theirs: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
            for &l in &captured {
                let mine = pass
                    .hidden(l + 1)
                    .with_context(|| format!("hidden state {} was not captured", l + 1))?;
                ours.insert(l, mine);
            }
            for (&l, acc) in layers.iter_mut() {
                let mine = ours[&l].to_f32();
                let other = file.layer(rec, l)?;
                acc.sums.add(&mine, &other);
                for (pos, (r, o)) in mine.chunks_exact(h).zip(other.chunks_exact(h)).enumerate() {
                    let d = diff(r, o);
                    if d.rel_l2 == 0.0 {
                        continue;
                    }
                    acc.worst.push(WorstPosition {
                        prompt_id: rec.prompt_id.clone(),
                        position: pos,
                        token_id: it.ids[pos],
                        in_prompt: pos < it.prompt_len,
                        rel_l2: d.rel_l2,
                        cosine: d.cosine,
                    });
                }
                acc.worst.sort_by(worse);
                acc.worst.truncate(opts.worst);
                theirs.insert(l, other);
            }
            if let Some(d) = &drafter {
                let d = d.get()?;
                let mut seq = Sequence::new(
                    rec.prompt_index as u32,
                    &it.ids,
                    it.prompt_len,
                    &pass.topk,
                    eval.labels,
                );
                let ours_taps: Vec<HostRowsRef> = taps.iter().map(|l| ours[l].view()).collect();
                let theirs_taps: Vec<HostRowsRef> = taps
                    .iter()
                    .map(|l| HostRowsRef::from(theirs[l].as_slice()))
                    .collect();
                ours_all.extend(&draft_on(s, d, &mut seq, &ours_taps, &eval)?);
                theirs_all.extend(&draft_on(s, d, &mut seq, &theirs_taps, &eval)?);
                infos.push(PromptInfo {
                    index: rec.prompt_index as u32,
                    prompt_len: it.prompt_len,
                    seq_len: it.ids.len(),
                    category: set.prompts[rec.prompt_index].category.clone(),
                });
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    // Entries the passes wrote to the hidden-state cache: a failure costs a recomputation only.
    if let Err(e) = s.flush_cache() {
        tracing::warn!("some cache entries were not written: {e:#}");
    }
    let drafter_cmp = match &opts.drafter {
        Some(spec) => {
            let ours = summary(summarize(&ours_all, &infos));
            let theirs = summary(summarize(&theirs_all, &infos));
            Some((spec, ours, theirs))
        }
        None => None,
    };
    let prompts = items
        .iter()
        .map(|it| {
            let tau = |sm: &Summary| {
                sm.per_prompt_tau
                    .get(&(it.rec.prompt_index as u32))
                    .copied()
                    .filter(|v| v.is_finite())
            };
            FeaturePrompt {
                id: it.rec.prompt_id.clone(),
                prompt_tokens: it.prompt_len,
                tokens: it.ids.len(),
                token_ids_from: if it.rec.input_ids.is_some() {
                    "file"
                } else {
                    "draftlens"
                },
                tau_draftlens: drafter_cmp.as_ref().and_then(|(_, a, _)| tau(a)),
                tau_features: drafter_cmp.as_ref().and_then(|(_, _, b)| tau(b)),
            }
        })
        .collect();
    let drafter = drafter_cmp.map(|(spec, a, b)| {
        let get = |sm: &Summary, k: &str| sm.scalars.get(k).copied().unwrap_or(f64::NAN);
        let tau = MetricPair::new(get(&a, TAU_METRIC), get(&b, TAU_METRIC));
        let metrics = a
            .scalars
            .iter()
            .filter_map(|(k, &x)| {
                b.scalars
                    .get(k)
                    .map(|&y| (k.clone(), MetricPair::new(x, y)))
            })
            .collect();
        let per_position = a
            .per_position
            .iter()
            .zip(&b.per_position)
            .enumerate()
            .map(|(k, (&x, &y))| PositionPair {
                k: k + 1,
                draftlens: x,
                features: y,
                delta: x.zip(y).map(|(x, y)| y - x),
            })
            .collect();
        DrafterComparison {
            drafter: match spec {
                DrafterSpec::Checkpoint { dir, .. } => dir.display().to_string(),
                DrafterSpec::Oracle { .. } => "oracle".into(),
                DrafterSpec::AntiOracle { .. } => "anti-oracle".into(),
                #[allow(unreachable_patterns)]
                _ => "built-in".into(),
            },
            layer_ids: taps.clone(),
            tau,
            metrics,
            per_position,
            verdict: verdict(tau, items.len()),
        }
    });
    Ok(FeaturesReport {
        schema_version: SCHEMA_VERSION,
        features: file.path.display().to_string(),
        target: s.files.identity.path.display().to_string(),
        backend: s.be.name().to_string(),
        tokens: items.iter().map(|i| i.ids.len()).sum(),
        prompts,
        layers: layers
            .into_iter()
            .map(|(l, acc)| LayerDivergence {
                layer_id: l,
                hidden_state_index: l + 1,
                diff: acc.sums.finish(),
                worst_positions: acc.worst,
            })
            .collect(),
        drafter,
    })
}
