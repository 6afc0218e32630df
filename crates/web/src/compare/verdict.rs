//! The verdict of a comparison (docs/verdict.md): each run's drafter family, its replayed τ, the
//! cost model's estimated speed-up from the timings stored with it (`draftlens live --store`),
//! the measured speed-up of live decoding against plain greedy decoding, how far the estimate is
//! from the measurement, and paired Δs of the three against the baseline over the prompts both
//! runs share.
//!
//! Families are strings (`RunInfo::drafter_family`): a new family needs nothing here.
//!
//! Next to the estimate from live decoding's costs, the same cost model over costs measured apart
//! from live decoding (`draftlens bench-costs --store`, source `cost_bench`): its inputs share
//! no timing with the measured speed-up, so its distance from it tests the model as a predictor.
//!
//! Intervals: a run's own 95% CIs are percentile bootstraps over its prompts (τ pooled = Σ tokens /
//! Σ rounds; the estimate is τ times the run's measured constant t_decode / (t_draft + t_verify),
//! so its CI is the τ CI times that constant: the timings are taken as fixed); paired Δs use
//! [`paired_interval`] as every other Δ of the comparison (BCa from 20 shared prompts, paired t
//! below). Every resample is seeded from the runs' uids: the same runs give the same intervals.

use crate::stats::{paired_interval, IntervalMethod, Resamples, Rng};
use anyhow::Result;
use draftlens_results::cost_bench::StoredCostBench;
use draftlens_results::metrics::{derived, RunStats};
use draftlens_results::speed::{estimated_speedup, CostInputs, StoredSpeed};
use draftlens_results::store::{RunInfo, Store};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the verdict reads of one run.
#[derive(Clone, Debug, Default)]
pub struct RunInput {
    pub id: i64,
    /// Seeds the resamples.
    pub uid: String,
    pub family: String,
    /// Prompt sha256 → (tokens, verify rounds) of the replay (τ pooled's per-prompt terms).
    pub tau: BTreeMap<String, (f64, f64)>,
    /// The stored timings, if any.
    pub speed: Option<SpeedInput>,
    /// The costs measured apart from live decoding (`bench-costs`), if any.
    pub bench: Option<CostInputs>,
}

#[derive(Clone, Debug)]
pub struct SpeedInput {
    pub costs: CostInputs,
    /// The stored measured speed-up (Σ greedy / Σ live), used when no prompt rows are stored.
    pub measured: Option<f64>,
    pub tau_live: Option<f64>,
    /// Prompt sha256 → (greedy decode seconds, live decode seconds).
    pub per_prompt: BTreeMap<String, (f64, f64)>,
}

/// A paired Δ (run − baseline) and its 95% interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairedDelta {
    pub delta: f64,
    pub ci: Option<(f64, f64)>,
    pub method: Option<IntervalMethod>,
    /// Shared prompts it is computed over.
    pub n: usize,
}

/// One run's line of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerdictRow {
    pub run: i64,
    pub family: String,
    /// Replayed τ pooled over the run's prompts and its 95% CI.
    pub tau: Option<f64>,
    pub tau_ci: Option<(f64, f64)>,
    pub prompts: usize,
    /// The cost model's inputs (seconds), as stored.
    pub costs: Option<CostInputs>,
    /// τ · t_decode / (t_draft_round + t_verify(B)).
    pub estimated: Option<f64>,
    pub estimated_ci: Option<(f64, f64)>,
    /// Σ greedy / Σ live over the timed prompts.
    pub measured: Option<f64>,
    pub measured_ci: Option<(f64, f64)>,
    pub timed_prompts: usize,
    /// Live τ of the timed prompts (equals the replayed τ where live decoding is lossless).
    pub tau_live: Option<f64>,
    /// 100 · (estimated / measured − 1).
    pub estimate_error_pct: Option<f64>,
    /// The cost model's inputs measured apart from live decoding (`bench-costs`), as stored.
    pub bench_costs: Option<CostInputs>,
    /// τ · t_decode / (t_draft_round + t_verify(B)) over `bench_costs`, and its 95% CI (the τ CI
    /// times the constant, as for `estimated`).
    pub estimated_bench: Option<f64>,
    pub estimated_bench_ci: Option<(f64, f64)>,
    /// 100 · (estimated_bench / measured − 1).
    pub estimate_bench_error_pct: Option<f64>,
    /// Against the baseline (None for the baseline itself).
    pub delta_tau: Option<PairedDelta>,
    pub delta_estimated: Option<PairedDelta>,
    pub delta_measured: Option<PairedDelta>,
    /// Why a number is missing.
    pub missing: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerdictSection {
    pub baseline: usize,
    pub rows: Vec<VerdictRow>,
    /// The largest |estimate error| over runs with both numbers: how close the cost model came.
    pub worst_estimate_error_pct: Option<f64>,
    /// The same over the estimates from `bench-costs`' independent costs.
    pub worst_estimate_bench_error_pct: Option<f64>,
    pub notes: Vec<String>,
}

/// Σ num / Σ den.
fn pooled(v: &BTreeMap<String, (f64, f64)>) -> Option<f64> {
    let (n, d) = v
        .values()
        .fold((0.0, 0.0), |(a, b), &(n, d)| (a + n, b + d));
    (d > 0.0).then(|| n / d)
}

/// A run's own 95% CI of Σ num / Σ den over its prompts (None below 2 prompts).
fn own_ci(v: &BTreeMap<String, (f64, f64)>, reps: usize, seed: &str) -> Option<(f64, f64)> {
    let (num, den): (Vec<f64>, Vec<f64>) = v.values().copied().unzip();
    let rs = Resamples::new(num.len(), reps, &mut Rng::from_str_seed(seed));
    rs.ratio_ci(&num, &den)
}

/// Paired Δ of Σnum/Σden between `a` (baseline) and `b` over their shared keys, each run's
/// numerators scaled by its factor.
fn paired(
    a: &BTreeMap<String, (f64, f64)>,
    b: &BTreeMap<String, (f64, f64)>,
    (scale_a, scale_b): (f64, f64),
    reps: usize,
    seed: &str,
) -> Option<PairedDelta> {
    let shared: Vec<&String> = a.keys().filter(|k| b.contains_key(*k)).collect();
    if shared.is_empty() {
        return None;
    }
    let col = |m: &BTreeMap<String, (f64, f64)>, s: f64| -> (Vec<f64>, Vec<f64>) {
        shared.iter().map(|k| (m[*k].0 * s, m[*k].1)).unzip()
    };
    let (na, da) = col(a, scale_a);
    let (nb, db) = col(b, scale_b);
    let (sa, sb) = (da.iter().sum::<f64>(), db.iter().sum::<f64>());
    if sa <= 0.0 || sb <= 0.0 {
        return None;
    }
    let delta = nb.iter().sum::<f64>() / sb - na.iter().sum::<f64>() / sa;
    let rs = Resamples::new(shared.len(), reps, &mut Rng::from_str_seed(seed));
    let iv = paired_interval(&rs, &na, &da, &nb, &db);
    Some(PairedDelta {
        delta,
        ci: iv.map(|i| (i.lo, i.hi)),
        method: iv.map(|i| i.method),
        n: shared.len(),
    })
}

/// 100 · (estimate / measured − 1) where both are known.
fn error_pct(estimate: Option<f64>, measured: Option<f64>) -> Option<f64> {
    estimate
        .zip(measured)
        .filter(|(_, m)| *m > 0.0)
        .map(|(e, m)| 100.0 * (e / m - 1.0))
}

/// The value of largest magnitude.
fn worst(errors: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    errors.flatten().max_by(|a, b| a.abs().total_cmp(&b.abs()))
}

/// The verdict over `runs` against `runs[baseline]`, with `reps` bootstrap replicates.
pub fn verdict(runs: &[RunInput], baseline: usize, reps: usize) -> VerdictSection {
    let base = &runs[baseline];
    let per_tau = |r: &RunInput| r.speed.as_ref().and_then(|s| s.costs.per_tau());
    let rows: Vec<VerdictRow> = runs
        .iter()
        .enumerate()
        .map(|(j, r)| {
            let tau = pooled(&r.tau);
            let tau_ci = own_ci(&r.tau, reps, &format!("verdict:tau:{}", r.uid));
            let scale = per_tau(r);
            let estimated = tau.and_then(|t| estimated_speedup(t, &r.speed.as_ref()?.costs));
            let estimated_bench = tau.and_then(|t| estimated_speedup(t, r.bench.as_ref()?));
            let bench_scale = r.bench.as_ref().and_then(CostInputs::per_tau);
            let (measured, measured_ci, timed) = match &r.speed {
                Some(s) if !s.per_prompt.is_empty() => (
                    pooled(&s.per_prompt),
                    own_ci(&s.per_prompt, reps, &format!("verdict:measured:{}", r.uid)),
                    s.per_prompt.len(),
                ),
                Some(s) => (s.measured, None, 0),
                None => (None, None, 0),
            };
            let against = |f: &dyn Fn(&RunInput) -> Option<PairedDelta>| {
                (j != baseline).then(|| f(r)).flatten()
            };
            let seed = |what: &str| format!("verdict:{what}:{}:{}", base.uid, r.uid);
            let missing = match (&r.speed, tau) {
                (_, None) => Some("no replayed τ (a run without records)".to_string()),
                (None, _) if r.bench.is_some() => Some(format!(
                    "no live timings stored with run #{}: `draftlens live --baseline --store {}` measures the speed-up where live decoding supports the {} family",
                    r.id, r.id, r.family
                )),
                (None, _) => Some(format!(
                    "no timings stored with run #{}: `draftlens live --baseline --store {}` measures them where live decoding supports the {} family (`draftlens bench-costs --store {}` the costs alone)",
                    r.id, r.id, r.family, r.id
                )),
                _ => None,
            };
            VerdictRow {
                run: r.id,
                family: r.family.clone(),
                tau,
                tau_ci,
                prompts: r.tau.len(),
                costs: r.speed.as_ref().map(|s| s.costs),
                estimated,
                estimated_ci: tau_ci.zip(scale).map(|((lo, hi), c)| (lo * c, hi * c)),
                measured,
                measured_ci,
                timed_prompts: timed,
                tau_live: r.speed.as_ref().and_then(|s| s.tau_live),
                estimate_error_pct: error_pct(estimated, measured),
                bench_costs: r.bench,
                estimated_bench,
                estimated_bench_ci: tau_ci.zip(bench_scale).map(|((lo, hi), c)| (lo * c, hi * c)),
                estimate_bench_error_pct: error_pct(estimated_bench, measured),
                delta_tau: against(&|r| paired(&base.tau, &r.tau, (1.0, 1.0), reps, &seed("tau"))),
                delta_estimated: against(&|r| {
                    paired(&base.tau, &r.tau, (per_tau(base)?, per_tau(r)?), reps, &seed("estimated"))
                }),
                delta_measured: against(&|r| {
                    let (a, b) = (base.speed.as_ref()?, r.speed.as_ref()?);
                    paired(&a.per_prompt, &b.per_prompt, (1.0, 1.0), reps, &seed("measured"))
                }),
                missing,
            }
        })
        .collect();
    VerdictSection {
        baseline,
        worst_estimate_error_pct: worst(rows.iter().map(|r| r.estimate_error_pct)),
        worst_estimate_bench_error_pct: worst(rows.iter().map(|r| r.estimate_bench_error_pct)),
        rows,
        notes: Vec::new(),
    }
}

/// The verdict of stored runs (`stats[i]`: run i's statistics, None without records), with a
/// note where the runs are not of one target, prompt set and backend.
pub fn of_runs(
    store: &Store,
    runs: &[RunInfo],
    stats: &[Option<Arc<RunStats>>],
    baseline: usize,
    reps: usize,
) -> Result<VerdictSection> {
    let tau_metric = derived("tau_replayed_pooled");
    let mut inputs = Vec::with_capacity(runs.len());
    for (r, st) in runs.iter().zip(stats) {
        let tau: BTreeMap<String, (f64, f64)> = st
            .iter()
            .flat_map(|st| st.evaluated())
            .filter(|p| !p.sha256.is_empty())
            .filter_map(|p| Some((p.sha256.clone(), (tau_metric.per_prompt)(p)?)))
            .collect();
        let sha_of: HashMap<u32, String> = store
            .prompt_metas(r.id)?
            .into_iter()
            .map(|p| (p.index, p.sha256))
            .collect();
        let metric_rows = store.metrics(r.id)?;
        let speed = StoredSpeed::from_rows(&metric_rows).map(|s| SpeedInput {
            costs: s.costs,
            measured: s.speedup_measured,
            tau_live: s.tau_live,
            per_prompt: s
                .per_prompt
                .iter()
                .filter_map(|&(i, g, l)| Some((sha_of.get(&i)?.clone(), (g, l))))
                .collect(),
        });
        inputs.push(RunInput {
            id: r.id,
            uid: r.uid.clone(),
            family: r.drafter_family.clone(),
            tau,
            speed,
            bench: StoredCostBench::from_rows(&metric_rows).map(|b| b.costs),
        });
    }
    let mut v = verdict(&inputs, baseline, reps);
    let b = &runs[baseline];
    for r in runs {
        let mut differs = Vec::new();
        if r.target_sha256 != b.target_sha256 {
            differs.push("target");
        }
        if r.prompt_set_sha256 != b.prompt_set_sha256 {
            differs.push("prompt set");
        }
        if (&r.backend, &r.dtype) != (&b.backend, &b.dtype) {
            differs.push("backend");
        }
        if !differs.is_empty() {
            v.notes.push(format!(
                "run #{} differs from the baseline in its {}: the verdict compares drafters on one target, prompt set and backend",
                r.id,
                differs.join(", ")
            ));
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prompts p0..p{n-1} with τ terms (tokens, rounds) from `f`.
    fn taus(n: usize, f: impl Fn(usize) -> (f64, f64)) -> BTreeMap<String, (f64, f64)> {
        (0..n).map(|i| (format!("p{i}"), f(i))).collect()
    }

    fn run(id: i64, family: &str, tau: BTreeMap<String, (f64, f64)>) -> RunInput {
        RunInput {
            id,
            uid: format!("uid{id}"),
            family: family.into(),
            tau,
            speed: None,
            bench: None,
        }
    }

    fn spread(i: usize) -> (f64, f64) {
        // 10 rounds a prompt, 25..42 tokens: τ between 2.5 and 4.2.
        (25.0 + (i * 7 % 18) as f64, 10.0)
    }

    fn costs() -> CostInputs {
        CostInputs {
            t_decode: 0.020,
            t_draft_round: 0.004,
            t_verify: 0.024,
        }
    }

    /// Identical runs: every paired Δ is exactly 0 with a degenerate interval [0, 0], from the
    /// BCa bootstrap (30 prompts) and from the paired t-interval (5 prompts).
    #[test]
    fn identical_runs_give_a_degenerate_interval_at_zero() {
        for n in [30, 5] {
            let mut a = run(1, "dflash", taus(n, spread));
            let mut b = run(2, "eagle3", taus(n, spread));
            let timed = taus(n, |i| (0.5 + i as f64 * 0.01, 0.2 + (i % 3) as f64 * 0.01));
            for r in [&mut a, &mut b] {
                r.speed = Some(SpeedInput {
                    costs: costs(),
                    measured: None,
                    tau_live: None,
                    per_prompt: timed.clone(),
                });
            }
            let v = verdict(&[a, b], 0, 1000);
            let row = &v.rows[1];
            for d in [&row.delta_tau, &row.delta_estimated, &row.delta_measured] {
                let d = d.as_ref().expect("a paired Δ");
                assert_eq!(d.delta, 0.0);
                assert_eq!(d.ci, Some((0.0, 0.0)), "{n} prompts: {d:?}");
                assert_eq!(d.n, n);
            }
            let method = row.delta_tau.as_ref().unwrap().method;
            let want = if n >= 20 {
                IntervalMethod::Bca
            } else {
                IntervalMethod::PairedT
            };
            assert_eq!(method, Some(want));
            assert!(v.rows[0].delta_tau.is_none(), "the baseline has no Δ");
        }
    }

    /// A run whose every prompt commits 5 more tokens over its 10 rounds (τ + 0.5 on each
    /// prompt): Δτ = 0.5 exactly and its interval excludes 0; the estimate's Δ is the shift
    /// times the cost constant (20 / 28).
    #[test]
    fn a_shifted_run_has_an_interval_that_excludes_zero() {
        let a = run(1, "dflash", taus(30, spread));
        let b = run(2, "dflash2", taus(30, |i| (spread(i).0 + 5.0, 10.0)));
        let mut with_costs = [a, b];
        for r in with_costs.iter_mut() {
            r.speed = Some(SpeedInput {
                costs: costs(),
                measured: None,
                tau_live: None,
                per_prompt: BTreeMap::new(),
            });
        }
        let v = verdict(&with_costs, 0, 1000);
        let d = v.rows[1].delta_tau.as_ref().unwrap();
        assert!((d.delta - 0.5).abs() < 1e-12);
        let (lo, hi) = d.ci.unwrap();
        assert!(lo > 0.0 && lo <= 0.5 && hi >= 0.5, "{lo} {hi}");
        let e = v.rows[1].delta_estimated.as_ref().unwrap();
        assert!((e.delta - 0.5 * 20.0 / 28.0).abs() < 1e-12);
        assert!(e.ci.unwrap().0 > 0.0);
        // The estimate itself: τ · 20 / 28, and its CI the τ CI scaled the same way.
        let r = &v.rows[0];
        let tau = r.tau.unwrap();
        assert!((r.estimated.unwrap() - tau * 20.0 / 28.0).abs() < 1e-12);
        let ((tl, th), (el, eh)) = (r.tau_ci.unwrap(), r.estimated_ci.unwrap());
        assert!((el - tl * 20.0 / 28.0).abs() < 1e-12 && (eh - th * 20.0 / 28.0).abs() < 1e-12);
        assert!(tl < tau && tau < th);
    }

    /// The same inputs give the same intervals (seeded from the uids); other uids other
    /// resamples.
    #[test]
    fn deterministic_under_its_seed() {
        let mk = |uid_b: &str| {
            let a = run(1, "dflash", taus(30, spread));
            let mut b = run(2, "eagle3", taus(30, |i| (spread(29 - i).0 + 1.0, 10.0)));
            b.uid = uid_b.into();
            verdict(&[a, b], 0, 500)
        };
        assert_eq!(mk("x"), mk("x"));
        assert_ne!(
            mk("x").rows[1].delta_tau.as_ref().unwrap().ci,
            mk("y").rows[1].delta_tau.as_ref().unwrap().ci
        );
    }

    /// The measured speed-up and the estimate's distance from it: hand-computed.
    #[test]
    fn measured_and_estimate_error() {
        let mut a = run(7, "dflash", taus(4, |_| (30.0, 10.0))); // τ = 3
        a.speed = Some(SpeedInput {
            costs: costs(), // estimate 3 · 20 / 28 = 2.142857…
            measured: Some(2.0),
            tau_live: Some(3.0),
            per_prompt: taus(4, |i| (0.4 + 0.1 * i as f64, 0.2 + 0.05 * i as f64)), // Σ 2.2 / Σ 1.1
        });
        let v = verdict(&[a, run(8, "eagle3", taus(4, |_| (20.0, 10.0)))], 0, 200);
        let r = &v.rows[0];
        assert!((r.measured.unwrap() - 2.0).abs() < 1e-12);
        assert!((r.estimated.unwrap() - 60.0 / 28.0).abs() < 1e-12);
        let want = 100.0 * (60.0 / 28.0 / 2.0 - 1.0);
        assert!((r.estimate_error_pct.unwrap() - want).abs() < 1e-9);
        assert_eq!(v.worst_estimate_error_pct, r.estimate_error_pct);
        assert_eq!(r.timed_prompts, 4);
        // The other run has no timings: its estimate is missing and says how to get one.
        let other = &v.rows[1];
        assert_eq!((other.estimated, other.measured), (None, None));
        assert!(other.missing.as_deref().unwrap().contains("--store 8"));
        assert!(other.delta_estimated.is_none() && other.delta_measured.is_none());
        assert!(other.delta_tau.is_some());
    }

    /// The estimate from independent costs (`bench-costs`): the same cost model over the other
    /// inputs, its distance from the measured speed-up, its CI the τ CI times its constant; a
    /// run with independent costs and no live timings gets that estimate and no measurement.
    #[test]
    fn estimate_from_independent_costs() {
        let mut a = run(7, "dflash", taus(4, |i| (28.0 + i as f64, 10.0))); // τ = 2.95
        a.speed = Some(SpeedInput {
            costs: costs(),
            measured: None,
            tau_live: None,
            per_prompt: taus(4, |i| (0.4 + 0.1 * i as f64, 0.2 + 0.05 * i as f64)), // 2.0
        });
        // 20 / (5 + 25): the estimate is τ · 2/3.
        let bench = CostInputs {
            t_decode: 0.020,
            t_draft_round: 0.005,
            t_verify: 0.025,
        };
        a.bench = Some(bench);
        let mut b = run(8, "eagle3", taus(4, |_| (20.0, 10.0))); // τ = 2
        b.bench = Some(CostInputs {
            t_decode: 0.030,
            ..bench
        });
        let v = verdict(&[a, b], 0, 200);
        let r = &v.rows[0];
        let tau = r.tau.unwrap();
        assert!((tau - 2.95).abs() < 1e-12);
        assert!((r.estimated_bench.unwrap() - 2.95 * 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(r.bench_costs, Some(bench));
        let want = 100.0 * (2.95 * 2.0 / 3.0 / 2.0 - 1.0); // −1.67 %
        assert!((r.estimate_bench_error_pct.unwrap() - want).abs() < 1e-9);
        let ((tl, th), (el, eh)) = (r.tau_ci.unwrap(), r.estimated_bench_ci.unwrap());
        assert!((el - tl * 2.0 / 3.0).abs() < 1e-12 && (eh - th * 2.0 / 3.0).abs() < 1e-12);
        // The live estimate is untouched: τ · 20 / 28.
        assert!((r.estimated.unwrap() - 2.95 * 20.0 / 28.0).abs() < 1e-12);
        // The EAGLE-3 run: an estimate (2 · 30 / 30 = 2) and nothing to compare it with.
        let o = &v.rows[1];
        assert!((o.estimated_bench.unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(
            (o.estimated, o.measured, o.estimate_bench_error_pct),
            (None, None, None)
        );
        assert!(o.missing.as_deref().unwrap().contains("no live timings"));
        assert!(o.missing.as_deref().unwrap().contains("--store 8"));
        assert_eq!(v.worst_estimate_bench_error_pct, r.estimate_bench_error_pct);
        // Without independent costs nothing of theirs is shown.
        let plain = verdict(&[run(1, "dflash", taus(4, |_| (30.0, 10.0)))], 0, 200);
        assert_eq!(plain.rows[0].estimated_bench, None);
        assert_eq!(plain.worst_estimate_bench_error_pct, None);
    }
}
