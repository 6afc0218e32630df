//! What the UI adds to a run's per-prompt statistics: the statistics cache (`load_stats`), the
//! per-position curves with bootstrap CIs and the accepted-length histograms for charts.
//!
//! The statistics and every metric folded from them (definitions, macro or pooled, names, units)
//! are `draftlens_results::metrics`: [`PromptStats`] from records, the [`DERIVED`] table and
//! `aggregate`, the same code that computes the rows `draftlens run` stores. The web computes only
//! presentation and uncertainty on top (here, `crate::stats`, `crate::compare`).
//!
//! Per-position curves (docs/metrics.md §4, §5); γ = B−1 drafted positions per block:
//! - per-position top-1 accuracy a_k = #(valid ∧ top-1 = t_k) / #valid_k (flat, marginal);
//! - conditional acceptance c_k = #(A ≥ k) / #(A ≥ k−1 ∧ position k valid).

use crate::stats::{Resamples, Rng};
use anyhow::{Context, Result};
use draftlens_records::RecordBatch;
use draftlens_results::store::{Derived, PromptMeta, RunInfo, Store};
use serde::Serialize;
use std::collections::HashMap;

// Names other web modules (and the bundle format) use through this module.
pub use draftlens_results::metrics::{
    compute_stats, PromptStats, RunStats, DERIVED, SOURCE, STATS_KIND, STATS_VERSION,
};

/// Statistics of a run: from the derived cache when current, else computed from records and
/// cached. `Ok(None)` when the run has neither records nor imported statistics.
pub fn load_stats(store: &Store, run: &RunInfo) -> Result<Option<RunStats>> {
    if let Some(d) = store.derived(run.id, STATS_KIND)? {
        // Imported runs may carry statistics without records: keep those whatever the version.
        if d.version == STATS_VERSION || run.num_blocks == 0 {
            let s: RunStats = serde_json::from_slice(&d.data).with_context(|| {
                format!(
                    "{}: run {}: cached statistics are corrupt",
                    store.path().display(),
                    run.id
                )
            })?;
            return Ok(Some(s));
        }
    }
    if run.num_blocks == 0 {
        return Ok(None);
    }
    // Prompt by prompt, so memory is bounded by the largest prompt, not the run (a run can
    // hold a million blocks).
    let metas = store.prompt_metas(run.id)?;
    let mut stats = compute_stats(&RecordBatch::new(run.block_size, run.top_k), &metas);
    let mut by_index: HashMap<u32, usize> = stats
        .prompts
        .iter()
        .enumerate()
        .map(|(i, p)| (p.index, i))
        .collect();
    let meta_of: HashMap<u32, &PromptMeta> = metas.iter().map(|m| (m.index, m)).collect();
    for pi in store.record_prompts(run.id)? {
        let meta: Vec<PromptMeta> = meta_of
            .get(&pi)
            .map(|m| vec![(*m).clone()])
            .unwrap_or_default();
        let one = compute_stats(&store.prompt_records(run.id, pi)?, &meta);
        for p in one.prompts.into_iter().filter(|p| p.index == pi) {
            match by_index.get(&pi) {
                Some(&i) => stats.prompts[i] = p,
                None => {
                    by_index.insert(pi, stats.prompts.len());
                    stats.prompts.push(p);
                }
            }
        }
    }
    stats.prompts.sort_by_key(|p| p.index);
    // Only finished runs are cached: a running run's records still grow.
    if run.status != draftlens_results::store::RunStatus::Running {
        let data = serde_json::to_vec(&stats)?;
        // A read-only database (or a race with delete) is not an error for a cache.
        let _ = store.put_derived(
            run.id,
            &Derived {
                kind: STATS_KIND.into(),
                version: STATS_VERSION,
                data,
            },
        );
    }
    Ok(Some(stats))
}

/// Per-position curve with a bootstrap CI over prompts: (value, lo, hi) per position.
#[derive(Clone, Debug, Serialize)]
pub struct Curve {
    pub value: Vec<Option<f64>>,
    pub lo: Vec<Option<f64>>,
    pub hi: Vec<Option<f64>>,
    /// Denominator per position (blocks counted), so sparse positions can be flagged.
    pub den: Vec<f64>,
}

/// Per-position top-1 accuracy (`conditional` = false) or conditional acceptance (true).
pub fn position_curve(stats: &RunStats, conditional: bool, reps: usize, seed: &str) -> Curve {
    let ps: Vec<&PromptStats> = stats.evaluated().collect();
    let mut rng = Rng::from_str_seed(seed);
    let rs = Resamples::new(ps.len(), reps, &mut rng);
    let mut c = Curve {
        value: vec![],
        lo: vec![],
        hi: vec![],
        den: vec![],
    };
    for k in 0..stats.positions {
        let (num, den): (Vec<f64>, Vec<f64>) = if conditional {
            ps.iter()
                .map(|p| (p.accepted[k] as f64, p.reached[k] as f64))
                .unzip()
        } else {
            ps.iter()
                .map(|p| (p.correct[k] as f64, p.valid[k] as f64))
                .unzip()
        };
        let d: f64 = den.iter().sum();
        c.den.push(d);
        c.value.push((d > 0.0).then(|| num.iter().sum::<f64>() / d));
        let ci = if d > 0.0 {
            rs.ratio_ci(&num, &den)
        } else {
            None
        };
        c.lo.push(ci.map(|x| x.0));
        c.hi.push(ci.map(|x| x.1));
    }
    c
}

/// Distribution of A+1 over replayed rounds (`replayed`) or over all anchors: fractions for
/// n = 1..=γ+1.
pub fn accept_histogram(stats: &RunStats, replayed: bool) -> Vec<f64> {
    let h = if replayed {
        let mut h = vec![0u64; stats.positions + 1];
        for p in stats.evaluated() {
            for &a in &p.rounds {
                if (a as usize) < h.len() {
                    h[a as usize] += 1;
                }
            }
        }
        h
    } else {
        stats.accept_hist()
    };
    let total: u64 = h.iter().sum();
    h.iter()
        .map(|&c| {
            if total > 0 {
                c as f64 / total as f64
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use draftlens_records::Region;

    /// A batch for one prompt of `len` tokens (prompt_len 2) with B = 4, K = 2, where the drafter
    /// accepts exactly `acc[a]` tokens at completion anchor a (then misses).
    fn scripted(len: u32, acc: &dyn Fn(u32) -> usize) -> RecordBatch {
        let mut b = RecordBatch::new(4, 2);
        let y = |pos: u32| 100 + pos; // the sequence's tokens
        for a in 2..len {
            b.prompt_index.push(0);
            b.anchor.push(a);
            b.region.push(Region::Completion as u8);
            let n = acc(a);
            for k in 1..=3u32 {
                let valid = a + k < len;
                b.target.push(if valid { y(a + k) } else { 0 });
                b.valid.push(valid as u8);
                b.loss_mask.push(1);
                let top1 = if (k as usize) <= n { y(a + k) } else { 7 };
                b.draft_ids.extend([top1, y(a + k)]);
                b.draft_logprobs.extend([-0.5, -2.0]);
            }
        }
        b
    }

    fn meta(len: u32) -> Vec<PromptMeta> {
        vec![PromptMeta {
            index: 0,
            id: "p0".into(),
            sha256: "s0".into(),
            category: Some("code".into()),
            prompt_len: 2,
            num_tokens: len,
        }]
    }

    #[test]
    fn anti_oracle_accepts_nothing() {
        let anti = compute_stats(&scripted(40, &|_| 0), &meta(40));
        let cond = position_curve(&anti, true, 0, "");
        assert_eq!(cond.value[0], Some(0.0));
        // Nothing reaches position 2, so its conditional acceptance is undefined.
        assert_eq!(cond.value[1], None);
        assert_eq!(accept_histogram(&anti, false), vec![1.0, 0.0, 0.0, 0.0]);
        assert_eq!(accept_histogram(&anti, true), vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn conditional_acceptance_from_counts() {
        // A alternates 1 and 2 over anchors (all positions valid for anchors < len-3).
        let st = compute_stats(&scripted(203, &|a| 1 + (a as usize % 2)), &meta(203));
        let c = position_curve(&st, true, 200, "t");
        // P(accept 1) = 1, P(accept 2 | 1) ≈ 1/2, P(accept 3 | 2) = 0.
        assert_eq!(c.value[0], Some(1.0));
        assert!((c.value[1].unwrap() - 0.5).abs() < 0.01);
        assert_eq!(c.value[2], Some(0.0));
        let acc = position_curve(&st, false, 0, "");
        assert!((acc.value[1].unwrap() - 0.5).abs() < 0.01);
        let h = accept_histogram(&st, false);
        assert!((h[1] - 0.5).abs() < 0.02 && (h[2] - 0.5).abs() < 0.02);
    }
}
