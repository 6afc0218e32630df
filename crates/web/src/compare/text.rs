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
    let _ = writeln!(s, "baseline: #{} {} ({})", b.id, b.name, &b.uid);
    for (j, r) in c.runs.iter().enumerate() {
        if j != c.baseline {
            let cv = &c.coverage[j];
            let _ = writeln!(
                s,
                "run #{}: {} ({}) · {}/{} prompts shared with the baseline",
                r.id,
                r.name,
                &r.uid,
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
    for n in &c.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let _ = writeln!(
        s,
        "\nΔ = run − baseline over shared prompts (matched by prompt sha256); 95% CI over prompts: BCa bootstrap ({} replicates) from {MIN_SHARED_PROMPTS} shared prompts on, paired t-interval below (no verdict then).",
        c.reps
    );
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
