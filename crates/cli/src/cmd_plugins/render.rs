//! Text output of plugin scoring: metric values, per-plugin outcomes, what scoring a stored run
//! stored, and the warnings (failures, plugin logs) printed on stderr.

use draftlens_plugin_host::text::clean;
use draftlens_plugin_host::{
    FailureKind, LogLevel, MetricResult, PluginOutcome, StoredOutcome, StoredScoring,
};

/// Text rendering of metric values ("name = value (n=count)").
pub fn render_values(indent: &str, values: &[MetricResult]) -> String {
    let mut s = String::new();
    for v in values {
        let value = v
            .value
            .map_or("undefined".to_string(), |x| format!("{x:.6}"));
        s += &format!("{indent}{:<28} = {value} (n={})\n", v.name, v.count);
    }
    s
}

/// Text rendering of scoring outcomes for `run` / `rescore`: overall values per plugin, and
/// each failure with its class.
pub fn render_outcomes(outcomes: &[PluginOutcome]) -> String {
    let mut s = String::new();
    for o in outcomes {
        let name = o.metadata.as_ref().map_or_else(
            || clean(&o.path.display().to_string(), 1024),
            |m| format!("{} {}", m.name, m.version),
        );
        match (&o.scores, &o.failure) {
            (Some(sc), _) => {
                s += &format!("{name}\n");
                s += &render_values("  ", &sc.overall);
            }
            (_, Some(f)) => s += &format!("{name}: FAILED [{}] {}\n", f.kind, f.message),
            _ => {}
        }
        if o.logs_dropped > 0 {
            s += &format!("  ({} log lines dropped)\n", o.logs_dropped);
        }
    }
    s
}

/// Text table of what scoring a stored run stored: the run-scope values of every plugin that
/// worked, how many rows it stored (and replaced), and every failure with its class.
pub fn render_stored(s: &StoredScoring) -> String {
    let mut o = format!(
        "plugins over run {}: {} blocks, {} prompts, {} categories\n",
        s.run,
        s.blocks,
        s.prompts,
        s.categories.len()
    );
    let ok: Vec<&StoredOutcome> = s.plugins.iter().filter(|p| p.is_ok()).collect();
    if !ok.is_empty() {
        o += &format!(
            "  {:<18} {:<28} {:>12} {:>9}\n",
            "plugin", "metric", "value", "n"
        );
        for p in &ok {
            for m in &p.metrics {
                let v = if m.value.is_nan() {
                    "undefined".to_string()
                } else {
                    format!("{:.6}", m.value)
                };
                o += &format!("  {:<18} {:<28} {v:>12} {:>9}\n", p.plugin, m.name, m.count);
            }
        }
    }
    for p in &s.plugins {
        match &p.failure {
            None => {
                o += &format!(
                    "  {}: {} rows stored (run, per prompt, per category){}\n",
                    p.plugin,
                    p.rows,
                    if p.replaced > 0 {
                        format!(", replacing {} earlier rows", p.replaced)
                    } else {
                        String::new()
                    }
                )
            }
            Some(f) => {
                o += &format!("  {}: FAILED [{}] {}\n", p.plugin, f.kind, f.message);
                if p.stale_rows > 0 {
                    o += &format!(
                        "  {}: its {} rows from an earlier scoring are kept and marked stale\n",
                        p.plugin, p.stale_rows
                    );
                }
            }
        }
    }
    o
}

/// On stderr: one warning line per failed plugin (naming it and the failure class), and what
/// the plugins logged themselves at the user's level: warnings and errors, info with `-v`,
/// debug with `-vv`. (Plugin text is already capped and stripped of control characters.)
pub fn warn_stored(s: &StoredScoring, verbose: u8) {
    for p in &s.plugins {
        // A panic's message is logged by the SDK's panic hook and is also the failure message:
        // say it once.
        let panicked = p
            .failure
            .as_ref()
            .is_some_and(|f| f.kind == FailureKind::Panic);
        for l in &p.outcome.logs {
            let level = match l.level {
                LogLevel::Warn => "warn",
                LogLevel::Error if !panicked => "error",
                LogLevel::Info if verbose >= 1 => "info",
                LogLevel::Debug if verbose >= 2 => "debug",
                _ => continue,
            };
            let times = if l.repeats > 0 {
                format!(" (×{})", l.repeats + 1)
            } else {
                String::new()
            };
            eprintln!("plugin {} [{level}]: {}{times}", p.plugin, l.message);
        }
        if let Some(f) = &p.failure {
            eprintln!(
                "warning: plugin {} failed [{}]: {} ({}); recorded with run {}, the other plugins' metrics are stored",
                p.plugin,
                f.kind,
                f.message,
                f.file(),
                s.run
            );
            if p.stale_rows > 0 {
                eprintln!(
                    "warning: plugin {}: the {} rows an earlier scoring stored are kept and marked stale",
                    p.plugin, p.stale_rows
                );
            }
        }
    }
}
