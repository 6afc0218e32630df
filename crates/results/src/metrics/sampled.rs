//! The native metrics of a run sampled at T > 0 (`draftlens run --temperature`,
//! `docs/metrics.md` §7): the *expected* acceptance, computed exactly from the stored p (the
//! target's top-K) and q (the drafter's top-K) of every block after the run's transform, with no
//! sampling noise. The definitions (transform, α, survival, the chain's expectation) are
//! `draftlens_records::sampling`'s; this file folds them over a run's records into stored rows.
//!
//! - `alpha_sampled`: α_k = Σ_x min(p'_k(x), q'_k(x)) per position k, pooled over valid
//!   completion positions (value: k = 1);
//! - `tau_sampled_uniform`: E[A + 1] = 1 + Σ_k Π_{j≤k} α_j per completion block, pooled over
//!   blocks (the uniform-anchor convention of `tau_uniform`);
//! - `tau_sampled_replayed` per prompt: E[tokens / rounds] over the random chain of rounds a
//!   sampled decode of the prompt's sequence makes (the replayed τ of §3 in expectation);
//!   `tau_sampled_replayed_macro` (mean over prompts) and `tau_sampled_replayed_pooled`
//!   (Σ tokens / Σ E[rounds]), per run and per category.
//!
//! Rows exist only when the run's K candidates determine the transformed distributions exactly
//! ([`SamplingParams::exact_with_candidates`]: top-k ≤ K); `run` refuses other settings.

use super::PromptInfo;
use crate::store::{MetricRow, MetricScope};
use draftlens_records::sampling::{
    block_alphas, expected_chain, expected_round_tokens, ChainExpectation, SamplingParams,
};
use draftlens_records::{RecordBatch, Region};
use std::collections::{BTreeMap, HashMap};

/// The sampling settings stored in a run's config (`eval.sampling`, written by
/// `run --temperature`); None for a greedy run.
pub fn run_sampling(
    config: &serde_json::Value,
) -> Result<Option<SamplingParams>, serde_json::Error> {
    match config.get("eval").and_then(|e| e.get("sampling")) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(s) => serde_json::from_value(s.clone()).map(Some),
    }
}

fn row(
    name: &str,
    scope: MetricScope,
    value: f64,
    count: u64,
    unit: &str,
    description: String,
) -> MetricRow {
    let mut r = MetricRow::scalar(super::SOURCE, name, scope, value, count, true);
    r.unit = unit.into();
    r.description = description;
    r
}

/// Every sampled-τ row of a run whose records are `batch` and whose prompts are `prompts` (their
/// order is the order of the per-prompt rows and of the macro mean), under `params`. Empty when
/// the stored candidates do not determine the transform exactly.
pub fn sampled_rows(
    batch: &RecordBatch,
    prompts: &[PromptInfo],
    params: &SamplingParams,
) -> Vec<MetricRow> {
    if !params.exact_with_candidates(batch.top_k as usize) || !batch.view().has_target_topk() {
        return Vec::new();
    }
    let settings = params.describe();
    let view = batch.view();
    let g = batch.positions_per_block();
    // α per completion block, and the blocks of each prompt by anchor.
    let mut alphas: Vec<Option<Vec<f64>>> = vec![None; batch.num_blocks()];
    let mut by_anchor: HashMap<u32, HashMap<u32, usize>> = HashMap::new();
    let (mut alpha_sum, mut alpha_n) = (vec![0.0; g], vec![0u64; g]);
    let (mut uniform_sum, mut blocks) = (0.0, 0u64);
    for (b, slot) in alphas.iter_mut().enumerate() {
        if view.region_of(b) != Region::Completion {
            continue;
        }
        by_anchor
            .entry(batch.prompt_index[b])
            .or_default()
            .insert(batch.anchor[b], b);
        let Some(a) = block_alphas(&view.block(b), params) else {
            continue;
        };
        for (k, &x) in a.iter().enumerate() {
            alpha_sum[k] += x;
            alpha_n[k] += 1;
        }
        uniform_sum += expected_round_tokens(&a);
        blocks += 1;
        *slot = Some(a);
    }
    let mut out = Vec::new();
    if blocks == 0 {
        return out;
    }
    let series: Vec<Option<f64>> = alpha_sum
        .iter()
        .zip(&alpha_n)
        .map(|(&s, &n)| (n > 0).then(|| s / n as f64))
        .collect();
    let mut r = row(
        "alpha_sampled",
        MetricScope::Run,
        series[0].unwrap_or(0.0),
        alpha_n.iter().sum(),
        "probability",
        format!(
            "expected acceptance α_k = Σ min(p, q) per position k ({settings}; value: k = 1), pooled over \
             valid completion positions"
        ),
    );
    r.series = Some(serde_json::json!(series));
    out.push(r);
    out.push(row(
        "tau_sampled_uniform",
        MetricScope::Run,
        uniform_sum / blocks as f64,
        blocks,
        "tokens",
        format!(
            "expected tokens per verify round, 1 + Σ_k Π α_j, pooled over completion anchors ({settings})"
        ),
    ));

    // The expected chain of each prompt in list order; a prompt whose chain needs a block that
    // was not stored (anchors subsampled) is left out, as the greedy replay leaves it out.
    let chains: Vec<(&PromptInfo, ChainExpectation)> = prompts
        .iter()
        .filter_map(|p| {
            let blocks = by_anchor.get(&p.index)?;
            let end = p.seq_len.checked_sub(1)? as u32;
            let chain = expected_chain(p.prompt_len as u32, end, |a| {
                blocks.get(&a).and_then(|&b| alphas[b].clone())
            });
            Some((p, chain.ok()??))
        })
        .collect();
    for (p, c) in &chains {
        out.push(row(
            "tau_sampled_replayed",
            MetricScope::Prompt(p.index),
            c.tau,
            c.tokens as u64,
            "tokens",
            format!("expected τ of this prompt's sampled decode, E[tokens / rounds] ({settings})"),
        ));
    }
    let mut scopes: BTreeMap<MetricScope, Vec<&ChainExpectation>> = BTreeMap::new();
    for (p, c) in &chains {
        scopes.entry(MetricScope::Run).or_default().push(c);
        if let Some(cat) = &p.category {
            scopes
                .entry(MetricScope::Category(cat.clone()))
                .or_default()
                .push(c);
        }
    }
    for (scope, cs) in scopes {
        let n = cs.len() as f64;
        let tokens: u64 = cs.iter().map(|c| c.tokens as u64).sum();
        let rounds: f64 = cs.iter().map(|c| c.rounds).sum();
        out.push(row(
            "tau_sampled_replayed_macro",
            scope.clone(),
            cs.iter().map(|c| c.tau).sum::<f64>() / n,
            cs.len() as u64,
            "tokens",
            format!(
                "expected replayed τ of a sampled decode ({settings}): per prompt E[tokens / rounds], macro over \
                 prompts"
            ),
        ));
        out.push(row(
            "tau_sampled_replayed_pooled",
            scope,
            tokens as f64 / rounds,
            tokens,
            "tokens",
            format!(
                "expected replayed τ of a sampled decode ({settings}): Σ tokens / Σ E[rounds] over prompts"
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::summarize;
    use draftlens_records::sampling::DraftSampling;

    /// One prompt of `len` tokens (prompt_len 2), B = 4, K = 2. At every position the target's
    /// top-2 is (y, .8), (y+1, .2) for the sequence's token y; the drafter's top-2 is (y, q_y),
    /// (7, 1 − q_y) where q_y = .9 at anchors divisible by 3, else the drafter misses: (7, .9),
    /// (y, .1).
    fn batch(len: u32) -> RecordBatch {
        let mut b = RecordBatch::new(4, 2);
        b.target_ids = Some(vec![]);
        b.target_logprobs = Some(vec![]);
        let y = |pos: u32| 100 + 2 * pos;
        for a in 2..len - 1 {
            b.prompt_index.push(0);
            b.anchor.push(a);
            b.region.push(0);
            for k in 1..=3u32 {
                let valid = a + k < len;
                let t = y(a + k);
                b.target.push(if valid { t } else { 0 });
                b.valid.push(valid as u8);
                b.loss_mask.push(1);
                if a % 3 == 0 {
                    b.draft_ids.extend([t, 7]);
                    b.draft_logprobs.extend([0.9f32.ln(), 0.1f32.ln()]);
                } else {
                    b.draft_ids.extend([7, t]);
                    b.draft_logprobs.extend([0.9f32.ln(), 0.1f32.ln()]);
                }
                b.target_ids.as_mut().unwrap().extend([t, t + 1]);
                b.target_logprobs
                    .as_mut()
                    .unwrap()
                    .extend([0.8f32.ln(), 0.2f32.ln()]);
            }
        }
        b
    }

    fn info(len: usize) -> Vec<PromptInfo> {
        vec![PromptInfo {
            index: 0,
            prompt_len: 2,
            seq_len: len,
            category: Some("code".into()),
        }]
    }

    fn value(rows: &[MetricRow], name: &str, scope: &MetricScope) -> f64 {
        rows.iter()
            .find(|r| r.name == name && &r.scope == scope)
            .unwrap_or_else(|| panic!("no {name} at {scope}"))
            .value
    }

    #[test]
    fn at_temperature_zero_the_expectation_is_the_greedy_replay() {
        let (b, infos) = (batch(20), info(20));
        let t0 = SamplingParams::new(0.0, None, 1.0, DraftSampling::Sampled).unwrap();
        let rows = sampled_rows(&b, &infos, &t0);
        let greedy = summarize(&b, &infos);
        for (sampled, plain, scope) in [
            (
                "tau_sampled_replayed",
                "tau_replayed",
                MetricScope::Prompt(0),
            ),
            (
                "tau_sampled_replayed_macro",
                "tau_replayed_macro",
                MetricScope::Run,
            ),
            (
                "tau_sampled_replayed_pooled",
                "tau_replayed_pooled",
                MetricScope::Run,
            ),
            ("tau_sampled_uniform", "tau_uniform", MetricScope::Run),
        ] {
            let (s, g) = (value(&rows, sampled, &scope), value(&greedy, plain, &scope));
            assert!((s - g).abs() < 1e-12, "{sampled} {s} vs {plain} {g}");
        }
        assert!(
            value(
                &rows,
                "tau_sampled_replayed_macro",
                &MetricScope::Category("code".into())
            ) > 1.0
        );
    }

    #[test]
    fn alpha_by_hand_and_no_rows_without_an_exact_transform() {
        let (b, infos) = (batch(20), info(20));
        // T = 1, top-k 2 = K: exact. Where the drafter hits, q = (y .9, 7 .1) and p = (y .8,
        // y+1 .2): α = .8; where it misses, q = (7 .9, y .1): α = .1.
        let params = SamplingParams::new(1.0, Some(2), 1.0, DraftSampling::Sampled).unwrap();
        let rows = sampled_rows(&b, &infos, &params);
        let r = rows.iter().find(|r| r.name == "alpha_sampled").unwrap();
        // Anchors 2..18, position 1 valid everywhere: 6 hits (3, 6, …, 18) of 17.
        let want = (6.0 * 0.8 + 11.0 * 0.1) / 17.0;
        assert!((r.value - want).abs() < 1e-6, "{} vs {want}", r.value);
        // Greedy drafts: α = p(top-1 of q) = .8 on a hit, p(7) = 0 on a miss.
        let greedy = SamplingParams {
            draft: DraftSampling::Greedy,
            ..params
        };
        let rows = sampled_rows(&b, &infos, &greedy);
        let v = value(&rows, "alpha_sampled", &MetricScope::Run);
        assert!((v - 6.0 * 0.8 / 17.0).abs() < 1e-6, "{v}");
        // Without top-k (or with one above K) the stored top-2 does not fix the transform.
        for top_k in [None, Some(3)] {
            let p = SamplingParams { top_k, ..params };
            assert!(sampled_rows(&b, &infos, &p).is_empty());
        }
    }

    #[test]
    fn the_settings_are_read_back_from_a_run_config() {
        let params = SamplingParams::new(0.7, Some(20), 0.95, DraftSampling::Sampled).unwrap();
        let mut sampling = serde_json::to_value(params).unwrap();
        sampling["seed"] = serde_json::json!(3);
        let config = serde_json::json!({"eval": {"top_k": 20, "sampling": sampling}});
        assert_eq!(run_sampling(&config).unwrap(), Some(params));
        assert_eq!(
            run_sampling(&serde_json::json!({"eval": {"top_k": 8}})).unwrap(),
            None
        );
    }
}
