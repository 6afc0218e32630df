//! The plain-text report of `parity --features` (the `--json` shape is [`super::FeaturesReport`]).

use super::{FeaturesReport, TAU_METRIC};
use std::fmt::Write as _;

/// Metrics shown in the text report besides τ, in this order (`--json` has them all).
const SHOWN: &[&str] = &[
    "tau_replayed_pooled",
    "tau_uniform",
    "first_position_acceptance",
    "flat_accuracy",
    "topk_accuracy",
    "draft_nll",
];

pub fn format_report(r: &FeaturesReport) -> String {
    let mut o = String::new();
    let from_file = r
        .prompts
        .iter()
        .filter(|p| p.token_ids_from == "file")
        .count();
    let _ = writeln!(
        o,
        "{} vs draftlens ({}) on {} prompts ({} tokens; token ids: {} from the file, {} draftlens's own prompt + greedy continuation)",
        r.features,
        r.backend,
        r.prompts.len(),
        r.tokens,
        from_file,
        r.prompts.len() - from_file
    );
    let _ = writeln!(
        o,
        "{:>6} {:>14} {:>10} {:>12} {:>10}  worst positions (prompt:position rel_l2)",
        "layer", "hidden_states", "rel_l2", "cosine", "max_abs"
    );
    for l in &r.layers {
        let worst: Vec<String> = l
            .worst_positions
            .iter()
            .map(|w| format!("{}:{} {:.2e}", w.prompt_id, w.position, w.rel_l2))
            .collect();
        let worst = if worst.is_empty() {
            "none: every row equal".to_string()
        } else {
            worst.join(", ")
        };
        let nonfinite = if l.diff.non_finite > 0 {
            format!("  ({} non-finite values)", l.diff.non_finite)
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "{:>6} {:>14} {:>10.3e} {:>12.8} {:>10.3e}  {}{nonfinite}",
            l.layer_id,
            format!("[{}]", l.hidden_state_index),
            l.diff.rel_l2,
            l.diff.cosine,
            l.diff.max_abs,
            worst
        );
    }
    let Some(d) = &r.drafter else {
        return o;
    };
    let _ = writeln!(
        o,
        "\ndrafter {} (reads layers {:?}): draftlens's hidden states vs the file's",
        d.drafter, d.layer_ids
    );
    let _ = writeln!(
        o,
        "  {:<28} {:>10} {:>10} {:>10}",
        "metric", "draftlens", "features", "Δ"
    );
    let row = |o: &mut String, name: &str, m: &super::MetricPair| {
        let _ = writeln!(
            o,
            "  {name:<28} {:>10.4} {:>10.4} {:>+10.4}",
            m.draftlens, m.features, m.delta
        );
    };
    row(&mut o, TAU_METRIC, &d.tau);
    for name in SHOWN {
        if let Some(m) = d.metrics.get(*name) {
            row(&mut o, name, m);
        }
    }
    let _ = write!(o, "  acceptance by position (draftlens → features):");
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for p in &d.per_position {
        let _ = write!(o, "  k={} {}→{}", p.k, f(p.draftlens), f(p.features));
    }
    o.push('\n');
    let _ = write!(o, "  τ per prompt (draftlens → features):");
    for p in &r.prompts {
        let _ = write!(o, "  {} {}→{}", p.id, f(p.tau_draftlens), f(p.tau_features));
    }
    o.push('\n');
    let _ = writeln!(o, "{}", d.verdict);
    o
}
