//! A comparison as terminal text (`draftlens compare`), and the number formats the pages share.

use super::{Comparison, ConfigRow};
use crate::stats::MIN_SHARED_PROMPTS;

pub fn fmt_value(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(x) if x.is_nan() => "—".into(),
        Some(x) if x.abs() >= 1000.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.2}"),
        Some(x) => format!("{x:.3}"),
    }
}

pub fn fmt_delta(d: f64) -> String {
    if d.abs() >= 10.0 {
        format!("{d:+.2}")
    } else {
        format!("{d:+.3}")
    }
}

/// The comparison as a plain-text table (for `draftlens compare`).
pub fn comparison_text(c: &Comparison) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let b = &c.runs[c.baseline];
    let _ = writeln!(
        s,
        "baseline: #{} {} ({}) · {}",
        b.id, b.name, &b.uid, b.drafter_family
    );
    for (j, r) in c.runs.iter().enumerate() {
        if j != c.baseline {
            let cv = &c.coverage[j];
            let _ = writeln!(
                s,
                "run #{}: {} ({}) · {} · {}/{} prompts shared with the baseline",
                r.id,
                r.name,
                &r.uid,
                r.drafter_family,
                cv.shared,
                cv.prompts.max(cv.baseline_prompts)
            );
        }
    }
    let _ = writeln!(s);
    let mut header = vec!["metric".to_string()];
    for (j, r) in c.runs.iter().enumerate() {
        header.push(if j == c.baseline {
            format!("#{} (base)", r.id)
        } else {
            format!("#{}", r.id)
        });
        if j != c.baseline {
            header.push("Δ".into());
            header.push("Δ%".into());
            header.push("95% CI".into());
            header.push("n".into());
            header.push("verdict".into());
        }
    }
    let mut rows = vec![header];
    for m in &c.metrics {
        let mut row = vec![format!(
            "{} {}",
            m.key,
            if m.is_count {
                "(count)"
            } else if m.higher_is_better {
                "↑"
            } else {
                "↓"
            }
        )];
        for j in 0..c.runs.len() {
            row.push(fmt_value(m.values[j]));
            if j == c.baseline {
                continue;
            }
            match &m.deltas[j] {
                None => row.extend(["—".into(), "—".into(), "—".into(), "—".into(), "—".into()]),
                Some(d) => {
                    row.push(fmt_delta(d.delta));
                    row.push(
                        d.delta_pct
                            .map(|p| format!("{p:+.1}%"))
                            .unwrap_or("—".into()),
                    );
                    row.push(
                        d.ci.map(|(lo, hi)| format!("[{}, {}]", fmt_delta(lo), fmt_delta(hi)))
                            .unwrap_or("—".into()),
                    );
                    row.push(if d.paired {
                        d.n.to_string()
                    } else {
                        "unpaired".into()
                    });
                    row.push(d.verdict.label().into());
                }
            }
        }
        rows.push(row);
    }
    s.push_str(&table(&rows));
    let diff: Vec<&ConfigRow> = c.config.iter().filter(|r| r.differs).collect();
    if !diff.is_empty() && c.runs.len() > 1 {
        let _ = writeln!(s, "\nconfig (differing keys only):");
        let mut rows = vec![std::iter::once("key".to_string())
            .chain(c.runs.iter().map(|r| format!("#{}", r.id)))
            .collect::<Vec<_>>()];
        for r in diff {
            rows.push(
                std::iter::once(r.key.clone())
                    .chain(r.values.iter().map(|v| v.clone().unwrap_or("—".into())))
                    .collect(),
            );
        }
        s.push_str(&table(&rows));
    }
    if !c.inflation.is_empty() {
        let _ = writeln!(s, "\ntraining-style vs deployment (by mechanism):");
        let mut rows = vec![vec![
            "run".into(),
            "evaluation".into(),
            "flat acc".into(),
            "τ uniform".into(),
            "τ replayed".into(),
            "what changed".into(),
        ]];
        for r in &c.inflation {
            rows.push(vec![
                format!("#{}", c.runs[r.run].id),
                r.label.clone(),
                fmt_value(r.flat_accuracy),
                fmt_value(r.tau_uniform),
                fmt_value(r.tau_replayed),
                r.mechanism.clone(),
            ]);
        }
        s.push_str(&table(&rows));
    }
    s.push_str(&verdict_text(c));
    for n in c.notes.iter().chain(&c.verdict.notes) {
        let _ = writeln!(s, "note: {n}");
    }
    let _ = writeln!(
        s,
        "\nΔ = run − baseline over shared prompts (matched by prompt sha256); 95% CI over prompts: BCa bootstrap ({} replicates) from {MIN_SHARED_PROMPTS} shared prompts on, paired t-interval below (no verdict then).",
        c.reps
    );
    s
}

/// `[lo, hi]` of an interval, or —.
fn fmt_ci(ci: Option<(f64, f64)>, f: fn(f64) -> String) -> String {
    ci.map(|(lo, hi)| format!("[{}, {}]", f(lo), f(hi)))
        .unwrap_or("—".into())
}

/// The verdict's three tables (docs/verdict.md): the families side by side, the cost model's
/// inputs, the paired Δs against the baseline.
fn verdict_text(c: &Comparison) -> String {
    use std::fmt::Write;
    let v = &c.verdict;
    let mut s = String::new();
    let value = |x: Option<f64>| fmt_value(x);
    let times = |x: Option<f64>| x.map(|x| format!("{x:.3}×")).unwrap_or("—".into());
    let _ = writeln!(
        s,
        "\nverdict (drafter families on one target, prompt set and backend; docs/verdict.md):"
    );
    // The estimate from `bench-costs`' independent costs: two more columns where a run has them.
    let bench = v.rows.iter().any(|r| r.bench_costs.is_some());
    let mut rows = vec![[
        "run",
        "family",
        "τ replayed",
        "95% CI",
        "estimated speed-up",
        "95% CI",
        "measured speed-up",
        "95% CI",
        "estimate vs measured",
    ]
    .map(String::from)
    .to_vec()];
    if bench {
        rows[0].extend(["estimated (bench-costs)".into(), "bench vs measured".into()]);
    }
    let pct = |e: Option<f64>| e.map(|e| format!("{e:+.1}%")).unwrap_or("—".into());
    for r in &v.rows {
        let mut row = vec![
            format!("#{}", r.run),
            r.family.clone(),
            value(r.tau),
            fmt_ci(r.tau_ci, |x| format!("{x:.3}")),
            times(r.estimated),
            fmt_ci(r.estimated_ci, |x| format!("{x:.3}")),
            times(r.measured),
            fmt_ci(r.measured_ci, |x| format!("{x:.3}")),
            pct(r.estimate_error_pct),
        ];
        if bench {
            row.extend([times(r.estimated_bench), pct(r.estimate_bench_error_pct)]);
        }
        rows.push(row);
    }
    s.push_str(&table(&rows));
    if v.rows.iter().any(|r| r.costs.is_some()) {
        let _ = writeln!(
            s,
            "\ncost model inputs, measured on each run's backend (ms):"
        );
        let mut rows = vec![[
            "run",
            "B",
            "t_decode",
            "t_draft_round",
            "t_verify(B)",
            "τ live",
            "timed prompts",
        ]
        .map(String::from)
        .to_vec()];
        for (r, run) in v.rows.iter().zip(&c.runs) {
            let Some(k) = &r.costs else { continue };
            let mut row = cost_cells(r.run, run.block_size, k);
            row.extend([value(r.tau_live), r.timed_prompts.to_string()]);
            rows.push(row);
        }
        s.push_str(&table(&rows));
    }
    if bench {
        let _ = writeln!(
            s,
            "\ncost model inputs measured apart from live decoding by `draftlens bench-costs` (ms, medians):"
        );
        let mut rows = vec![["run", "B", "t_decode", "t_draft_round", "t_verify(B)"]
            .map(String::from)
            .to_vec()];
        for (r, run) in v.rows.iter().zip(&c.runs) {
            if let Some(k) = &r.bench_costs {
                rows.push(cost_cells(r.run, run.block_size, k));
            }
        }
        s.push_str(&table(&rows));
    }
    if c.runs.len() > 1 {
        let _ = writeln!(
            s,
            "\nagainst the baseline #{} (paired over shared prompts):",
            c.runs[v.baseline].id
        );
        let mut rows = vec![[
            "run",
            "Δ τ",
            "95% CI",
            "Δ estimated",
            "95% CI",
            "Δ measured",
            "95% CI",
            "n",
        ]
        .map(String::from)
        .to_vec()];
        let d = |x: &Option<super::verdict::PairedDelta>| -> [String; 2] {
            match x {
                Some(x) => [fmt_delta(x.delta), fmt_ci(x.ci, fmt_delta)],
                None => ["—".into(), "—".into()],
            }
        };
        for (j, r) in v.rows.iter().enumerate() {
            if j == v.baseline {
                continue;
            }
            let mut row = vec![format!("#{}", r.run)];
            row.extend(d(&r.delta_tau));
            row.extend(d(&r.delta_estimated));
            row.extend(d(&r.delta_measured));
            row.push(
                r.delta_tau
                    .as_ref()
                    .map(|x| x.n.to_string())
                    .unwrap_or("—".into()),
            );
            rows.push(row);
        }
        s.push_str(&table(&rows));
    }
    if let Some(e) = v.worst_estimate_error_pct {
        let _ = writeln!(
            s,
            "the cost model's estimate is within {:.1}% of the measured speed-up on every run with both",
            e.abs()
        );
    }
    if let Some(e) = v.worst_estimate_bench_error_pct {
        let _ = writeln!(
            s,
            "its estimate from costs measured apart from live decoding (bench-costs) is within {:.1}% of the measured speed-up on every run with both",
            e.abs()
        );
    }
    for r in &v.rows {
        if let Some(m) = &r.missing {
            let _ = writeln!(s, "#{}: {m}", r.run);
        }
    }
    s
}

fn table(rows: &[Vec<String>]) -> String {
    let ncol = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut w = vec![0; ncol];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c}{}", " ".repeat(w[i] - c.chars().count())))
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

/// A cost table's first cells: the run, its block size and the three cost model inputs in ms
/// (the live-measured and the `bench-costs` tables alike).
fn cost_cells(
    run: i64,
    block_size: impl ToString,
    k: &draftlens_results::speed::CostInputs,
) -> Vec<String> {
    vec![
        format!("#{run}"),
        block_size.to_string(),
        format!("{:.3}", k.t_decode * 1e3),
        format!("{:.3}", k.t_draft_round * 1e3),
        format!("{:.3}", k.t_verify * 1e3),
    ]
}
