//! Native summary metrics over stored records (docs/metrics.md). The metric plugins compute the same
//! definitions in WASM; these are the reference the run command stores directly.
//!
//! Conventions (defined in `docs/metrics.md`; A, the tokens of a round and the replay chain come
//! from `draftlens-records`):
//! - τ counts the bonus token: a round at anchor a yields min(A+1, T−1−a) tokens (the last round
//!   of a sequence has no bonus past the end).
//! - replayed τ: anchors a₀ = first completion position, a_{i+1} = a_i + A(a_i) + 1; macro = mean
//!   of per-prompt τ, pooled = Σ tokens / Σ rounds.
//! - uniform τ and per-position metrics use completion-region blocks only.

use draftlens_records::{RecordBatch, Region, SequenceEnd};
use crate::store::{MetricRow, MetricScope};
use std::collections::{BTreeMap, HashMap};

/// What the metrics need to know about each prompt of a run.
#[derive(Clone, Debug)]
pub struct PromptInfo {
    pub index: u32,
    pub prompt_len: usize,
    pub seq_len: usize,
    pub category: Option<String>,
}

/// The replayed chain of one prompt (`docs/metrics.md` §3, computed by
/// [`draftlens_records::replay`], the function the web UI and the `replayed-tau` plugin call):
/// (rounds, tokens), or None when a chain anchor has no block.
pub fn replay(
    batch: &RecordBatch,
    blocks_by_anchor: &HashMap<u32, usize>,
    prompt_len: usize,
    seq_len: usize,
) -> Option<(u64, u64)> {
    let end = SequenceEnd::At(seq_len.saturating_sub(1) as u32);
    let chain = draftlens_records::replay(prompt_len as u32, end, |a| {
        blocks_by_anchor
            .get(&a)
            .map(|&b| batch.accepted_len(b) as u32)
    })
    .ok()?;
    let tokens = chain.iter().map(|r| r.tokens as u64).sum();
    Some((chain.len() as u64, tokens))
}

const SRC: &str = "native";

fn row(
    name: &str,
    scope: MetricScope,
    value: f64,
    count: u64,
    unit: &str,
    desc: &str,
    series: Option<serde_json::Value>,
) -> MetricRow {
    let mut r = MetricRow::scalar(SRC, name, scope, value, count, true);
    r.unit = unit.into();
    r.description = desc.into();
    r.series = series;
    r
}

/// Every native metric of a run: run scope, per prompt, per category.
pub fn summarize(batch: &RecordBatch, prompts: &[PromptInfo]) -> Vec<MetricRow> {
    let p = batch.positions_per_block();
    let mut out = Vec::new();
    let mut per_prompt_blocks: BTreeMap<u32, HashMap<u32, usize>> = BTreeMap::new();
    for b in 0..batch.num_blocks() {
        per_prompt_blocks
            .entry(batch.prompt_index[b])
            .or_default()
            .insert(batch.anchor[b], b);
    }

    // Replayed τ per prompt, macro and pooled; per category macro.
    let (mut sum_tau, mut n_tau, mut rounds_all, mut tokens_all) = (0.0, 0u64, 0u64, 0u64);
    let mut cat: BTreeMap<String, (f64, u64, u64, u64)> = BTreeMap::new();
    for info in prompts {
        let empty = HashMap::new();
        let blocks = per_prompt_blocks.get(&info.index).unwrap_or(&empty);
        if let Some((r, t)) = replay(batch, blocks, info.prompt_len, info.seq_len) {
            if r == 0 {
                continue;
            }
            let tau = t as f64 / r as f64;
            out.push(row(
                "tau_replayed",
                MetricScope::Prompt(info.index),
                tau,
                r,
                "tokens/round",
                "replayed τ of this prompt (bonus included)",
                None,
            ));
            sum_tau += tau;
            n_tau += 1;
            rounds_all += r;
            tokens_all += t;
            if let Some(c) = &info.category {
                let e = cat.entry(c.clone()).or_default();
                e.0 += tau;
                e.1 += 1;
                e.2 += r;
                e.3 += t;
            }
        }
    }
    if n_tau > 0 {
        out.push(row("tau_replayed_macro", MetricScope::Run, sum_tau / n_tau as f64, n_tau, "tokens/round", "replayed τ: mean over prompts of per-prompt mean tokens per verify round (bonus included)", None));
        out.push(row(
            "tau_replayed_pooled",
            MetricScope::Run,
            tokens_all as f64 / rounds_all as f64,
            rounds_all,
            "tokens/round",
            "replayed τ: Σ tokens / Σ verify rounds over all prompts (bonus included)",
            None,
        ));
    }
    for (c, (s, n, r, t)) in &cat {
        out.push(row(
            "tau_replayed_macro",
            MetricScope::Category(c.clone()),
            s / *n as f64,
            *n,
            "tokens/round",
            "replayed τ, macro over the category's prompts",
            None,
        ));
        out.push(row(
            "tau_replayed_pooled",
            MetricScope::Category(c.clone()),
            *t as f64 / *r as f64,
            *r,
            "tokens/round",
            "replayed τ, pooled over the category's prompts",
            None,
        ));
    }

    // Uniform-anchor statistics over completion blocks.
    let mut hist = vec![0u64; p + 1];
    let mut correct = vec![0u64; p];
    let mut valid = vec![0u64; p];
    let (mut masked_ok, mut masked_n) = (0u64, 0u64);
    let mut per_prompt_uniform: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    // Per prompt: (Σ −log q(top-1), top-K hits) over valid completion positions. The NLL is
    // summed per prompt and then over prompts in index order: the order the web UI's per-prompt
    // statistics add them in, so both give the same value to the last bit.
    let mut per_prompt_nll: BTreeMap<u32, (f64, u64)> = BTreeMap::new();
    let kk = batch.top_k as usize;
    for b in 0..batch.num_blocks() {
        for k in 1..=p {
            let i = batch.pos_index(b, k);
            if batch.loss_mask[i] == 1 {
                masked_n += 1;
                masked_ok += (batch.draft_top1(b, k) == batch.target[i]) as u64;
            }
        }
        if batch.region[b] != Region::Completion as u8 {
            continue;
        }
        let a = batch.accepted_len(b);
        hist[a] += 1;
        let e = per_prompt_uniform.entry(batch.prompt_index[b]).or_default();
        e.0 += a as u64 + 1;
        e.1 += 1;
        let nll = per_prompt_nll.entry(batch.prompt_index[b]).or_default();
        for k in 1..=p {
            let i = batch.pos_index(b, k);
            if batch.valid[i] == 1 {
                valid[k - 1] += 1;
                correct[k - 1] += (batch.draft_top1(b, k) == batch.target[i]) as u64;
                nll.0 += -(batch.draft_logprobs[i * kk] as f64);
                nll.1 += batch.draft_ids[i * kk..(i + 1) * kk].contains(&batch.target[i]) as u64;
            }
        }
    }
    let blocks: u64 = hist.iter().sum();
    if blocks > 0 {
        let sum_a: u64 = hist.iter().enumerate().map(|(a, n)| a as u64 * n).sum();
        out.push(row(
            "tau_uniform",
            MetricScope::Run,
            (sum_a + blocks) as f64 / blocks as f64,
            blocks,
            "tokens/round",
            "uniform-anchor τ: Σ(A+1) / Σ blocks over every completion anchor (pooled, bonus included)",
            None,
        ));
        out.push(row(
            "mean_streak",
            MetricScope::Run,
            sum_a as f64 / blocks as f64,
            blocks,
            "tokens",
            "mean accepted length A over completion anchors (bonus excluded)",
            None,
        ));
        // Survival P(A ≥ k) and conditional acceptance c_k = P(A ≥ k) / P(A ≥ k−1).
        let mut at_least = vec![0u64; p + 1];
        for a in 0..=p {
            at_least[a] = hist[a..].iter().sum();
        }
        let survival: Vec<f64> = (1..=p)
            .map(|k| at_least[k] as f64 / blocks as f64)
            .collect();
        let cond: Vec<Option<f64>> = (1..=p)
            .map(|k| (at_least[k - 1] > 0).then(|| at_least[k] as f64 / at_least[k - 1] as f64))
            .collect();
        out.push(row(
            "survival",
            MetricScope::Run,
            survival[0],
            blocks,
            "probability",
            "P(A ≥ k) per position k (value: k = 1)",
            Some(serde_json::json!(survival)),
        ));
        out.push(row(
            "cond_accept",
            MetricScope::Run,
            cond[0].unwrap_or(0.0),
            blocks,
            "probability",
            "P(d_k = t_k | all earlier accepted) per position k (value: k = 1)",
            Some(serde_json::json!(cond)),
        ));
        out.push(row(
            "accept_hist",
            MetricScope::Run,
            blocks as f64,
            blocks,
            "blocks",
            "histogram of accepted length A = 0..B−1 over completion anchors",
            Some(serde_json::json!(hist)),
        ));
        let acc: Vec<Option<f64>> = (0..p)
            .map(|k| (valid[k] > 0).then(|| correct[k] as f64 / valid[k] as f64))
            .collect();
        let flat = correct.iter().sum::<u64>() as f64 / valid.iter().sum::<u64>().max(1) as f64;
        out.push(row("acc_top1", MetricScope::Run, flat, valid.iter().sum(), "fraction", "top-1 accuracy per position k over completion anchors (value: flat over all valid positions)", Some(serde_json::json!(acc))));
        // Headline scalars (docs/metrics.md §5, §6): the values the UI's run list and
        // comparisons show; `draftlens-web` recomputes them per prompt from records (for CIs)
        // with the same definitions, tested to agree to the last digit.
        let n_valid: u64 = valid.iter().sum();
        out.push(row(
            "first_position_acceptance",
            MetricScope::Run,
            at_least[1] as f64 / blocks as f64,
            blocks,
            "fraction",
            "P(A ≥ 1): the first drafted token is accepted; pooled over completion anchors",
            None,
        ));
        if n_valid > 0 {
            let hits: u64 = per_prompt_nll.values().map(|x| x.1).sum();
            let nll: f64 = per_prompt_nll.values().map(|x| x.0).sum();
            out.push(row(
                "flat_accuracy",
                MetricScope::Run,
                correct.iter().sum::<u64>() as f64 / n_valid as f64,
                n_valid,
                "fraction",
                "flat top-1 accuracy over all valid drafted completion positions (what training logs as acc); pooled",
                None,
            ));
            out.push(row(
                "topk_accuracy",
                MetricScope::Run,
                hits as f64 / n_valid as f64,
                n_valid,
                "fraction",
                "target token within the drafter's top-K, over all valid drafted completion positions; pooled",
                None,
            ));
            let mut r = row(
                "draft_nll",
                MetricScope::Run,
                nll / n_valid as f64,
                n_valid,
                "nats",
                "mean −log q of the drafter's top-1 over valid completion positions (confidence, lower = more confident); pooled",
                None,
            );
            r.higher_is_better = false;
            out.push(r);
        }
        for (pi, (t, n)) in per_prompt_uniform {
            out.push(row(
                "tau_uniform",
                MetricScope::Prompt(pi),
                t as f64 / n as f64,
                n,
                "tokens/round",
                "mean(A+1) over this prompt's completion anchors",
                None,
            ));
        }
    }
    if masked_n > 0 {
        out.push(row(
            "acc_flat_masked",
            MetricScope::Run,
            masked_ok as f64 / masked_n as f64,
            masked_n,
            "fraction",
            "flat top-1 accuracy over loss-mask positions (what training logs as acc)",
            None,
        ));
    }
    out
}
