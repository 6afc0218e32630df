//! HTML views (maud: everything interpolated is escaped). The same functions render the live
//! pages and the single-file report; `Ctx::report` switches links off and inlines the assets.

pub mod compare;
pub mod history;
pub mod misc;
pub mod prompt;
pub mod run;
pub mod runs;
pub mod trace_diff;
pub mod verdict;

use draftlens_results::store::{RunInfo, RunMode, RunStatus};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Serialize;

pub const UPLOT_JS: &str = include_str!("../../assets/vendor/uPlot-1.6.32/uPlot.iife.min.js");
pub const UPLOT_CSS: &str = include_str!("../../assets/vendor/uPlot-1.6.32/uPlot.min.css");
pub const APP_JS: &str = include_str!("../../assets/app.js");
pub const APP_CSS: &str = include_str!("../../assets/app.css");

/// Colours of compared runs, in order (readable on white, distinct for the common colour-blind
/// types for the first four).
pub const PALETTE: &[&str] = &[
    "#3454d1", "#e8590c", "#12a37f", "#c2255c", "#7048e8", "#f59f00", "#1098ad", "#5c940d",
];

pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    Runs,
    Compare,
    History,
    Import,
    None,
}

/// Rendering context.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// Rendering a static single-file report: no links to server routes, assets inlined.
    pub report: bool,
    /// May the viewer change things (import, delete, pin, share)?
    pub can_write: bool,
    /// Team mode (shown in the header).
    pub team: bool,
    /// Path and query of this page (what "share" saves).
    pub current: String,
    pub nav: Nav,
    /// Asset version (cache busting).
    pub asset_version: String,
}

impl Ctx {
    pub fn report() -> Ctx {
        Ctx {
            report: true,
            can_write: false,
            team: false,
            current: String::new(),
            nav: Nav::None,
            asset_version: String::new(),
        }
    }
}

/// A link, or plain text in a static report.
pub fn link(ctx: &Ctx, href: &str, body: Markup) -> Markup {
    if ctx.report {
        html! { span { (body) } }
    } else {
        html! { a href=(href) { (body) } }
    }
}

/// JSON for a `<script type="application/json">` block: `<`, `>`, `&` and the JS line
/// separators are \u-escaped, so no string inside can close the element or open a comment.
pub fn safe_json<T: Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).unwrap_or_else(|_| "null".into());
    let mut out = String::with_capacity(s.len() + 16);
    for ch in s.chars() {
        match ch {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

pub fn json_script<T: Serialize>(id: &str, v: &T) -> Markup {
    html! { script type="application/json" id=(id) { (PreEscaped(safe_json(v))) } }
}

/// A chart container plus its data; `legend` lists (label, colour).
pub fn chart(
    id: &str,
    title: &str,
    subtitle: &str,
    data: &serde_json::Value,
    legend: &[(String, String)],
) -> Markup {
    html! {
        div class="chart-box" {
            h3 { (title) }
            @if !subtitle.is_empty() { div class="sub" { (subtitle) } }
            div class="chart" data-src=(id) {}
            @if !legend.is_empty() {
                div class="legend" {
                    @for (label, c) in legend {
                        span { span class="dot" style=(format!("background:{c}")) {} (label) }
                    }
                }
            }
            (json_script(id, data))
        }
    }
}

pub fn status_chip(s: RunStatus) -> Markup {
    html! { span class=(format!("chip {}", s.as_str())) { (s.as_str()) } }
}

pub fn mode_chip(m: RunMode) -> Markup {
    match m {
        RunMode::Deployment => html! { span class="chip" { "deployment" } },
        RunMode::TrainStyle => html! { span class="chip train-style" { "train-style" } },
    }
}

pub fn origin_chip(r: &RunInfo) -> Markup {
    html! {
        @if r.origin != "local" { span class="chip imported" title=(r.origin) { "imported" } }
    }
}

pub fn fmt(v: Option<f64>) -> String {
    crate::compare::fmt_value(v)
}

/// A short column label for a metric key (the full key is in the column's title): the
/// headline native metrics by name, others as `source/name`.
pub fn metric_short_label(k: &draftlens_results::store::MetricKey) -> String {
    if k.source == crate::analysis::SOURCE {
        match k.name.as_str() {
            "tau_replayed_macro" => "τ replayed".into(),
            "tau_replayed_pooled" => "τ replayed (pooled)".into(),
            "tau_uniform" => "τ uniform".into(),
            "first_position_acceptance" | "survival" => "1st-token accept".into(),
            "flat_accuracy" | "acc_top1" => "flat acc.".into(),
            other => other.into(),
        }
    } else {
        k.to_string()
    }
}

/// "1 run", "2 runs", "1,000 runs" (thousands separated).
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", fmt_int(n), if n == 1 { one } else { many })
}

pub fn fmt_int(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "drafter @ step" for tables.
pub fn drafter_label(r: &RunInfo) -> String {
    let name = if r.drafter_series.is_empty() {
        r.drafter_path.rsplit('/').next().unwrap_or("").to_string()
    } else {
        r.drafter_series.clone()
    };
    match r.drafter_step {
        Some(s) => format!("{name} @ {}", fmt_int(s.max(0) as u64)),
        None => name,
    }
}

/// A tiny inline SVG line for a metric series (values may be null).
pub fn sparkline(values: &[Option<f64>]) -> Markup {
    let pts: Vec<(usize, f64)> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.filter(|x| x.is_finite()).map(|x| (i, x)))
        .collect();
    if pts.len() < 2 {
        return html! {};
    }
    let (w, h) = (90.0, 22.0);
    let lo = pts
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let hi = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let n = values.len().max(2) - 1;
    let path: Vec<String> = pts
        .iter()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                *i as f64 / n as f64 * w,
                h - 2.0 - (v - lo) / span * (h - 4.0)
            )
        })
        .collect();
    html! {
        svg class="spark" width="90" height="22" viewBox="0 0 90 22" {
            polyline points=(path.join(" ")) fill="none" stroke="#3454d1" stroke-width="1.5" {}
        }
    }
}

/// The page shell.
pub fn page(ctx: &Ctx, title: &str, body: Markup) -> Markup {
    let v = &ctx.asset_version;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if ctx.report {
                    // A report may load nothing from anywhere: the policy enforces it.
                    meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";
                }
                title { (title) " · draftlens" }
                link rel="icon" href="data:,";
                @if ctx.report {
                    style { (PreEscaped(UPLOT_CSS)) (PreEscaped(APP_CSS)) }
                } @else {
                    link rel="stylesheet" href=(format!("/assets/uPlot-1.6.32.min.css")) ;
                    link rel="stylesheet" href=(format!("/assets/app.css?v={v}"));
                }
            }
            body class=[ctx.report.then_some("report")] {
                header class="top" {
                    @if ctx.report {
                        span class="logo" { span class="mark" { i{} i{} i{} i{} } "draftlens" }
                        span class="who" { "report" }
                    } @else {
                        a class="logo" href="/" { span class="mark" { i{} i{} i{} i{} } "draftlens" }
                        nav {
                            a class=[(ctx.nav == Nav::Runs).then_some("on")] href="/" { "Runs" }
                            a class=[(ctx.nav == Nav::History).then_some("on")] href="/history" { "Checkpoints" }
                            a class=[(ctx.nav == Nav::Import).then_some("on")] href="/import" { "Import" }
                        }
                        span class="spacer" {}
                        @if ctx.team {
                            span class="who" { (if ctx.can_write { "team server · write access" } else { "team server · read-only" }) }
                        }
                        @if ctx.can_write && !ctx.current.is_empty() && ctx.nav != Nav::Import {
                            form class="inline" method="post" action="/share" {
                                input type="hidden" name="state" value=(ctx.current);
                                button class="btn" type="submit" title="Save this view under a short link" { "Share" }
                            }
                        }
                    }
                }
                main { (body) }
                footer {
                    @if ctx.report { "Single-file draftlens report · works offline · the data is embedded as a versioned JSON bundle that `draftlens import` accepts" }
                    @else { "draftlens · speculative-decoding drafter evaluation" }
                }
                @if ctx.report {
                    script { (PreEscaped(inline_js(UPLOT_JS))) }
                    script { (PreEscaped(inline_js(APP_JS))) }
                } @else {
                    script src="/assets/uPlot-1.6.32.iife.min.js" {}
                    script src=(format!("/assets/app.js?v={v}")) {}
                }
            }
        }
    }
}

/// Script text safe inside an inline `<script>` element.
fn inline_js(js: &str) -> String {
    js.replace("</script", "<\\/script")
        .replace("<!--", "<\\!--")
}

/// Fewest blocks a position needs to be drawn in a per-position chart.
pub const MIN_DEN: f64 = 20.0;

/// Builds the data of a per-position chart for several runs: (label, colour, curve).
pub fn position_chart_data(
    title_y: &str,
    runs: &[(String, String, &crate::analysis::Curve)],
    positions: usize,
) -> serde_json::Value {
    let x: Vec<usize> = (1..=positions).collect();
    let series: Vec<serde_json::Value> = runs
        .iter()
        .map(|(label, c, curve)| {
            // Positions counted over fewer than MIN_DEN blocks are too noisy to draw.
            let pad = |v: &Vec<Option<f64>>| -> Vec<Option<f64>> {
                (0..positions).map(|i| v.get(i).copied().flatten().filter(|_| curve.den.get(i).copied().unwrap_or(0.0) >= MIN_DEN)).collect()
            };
            serde_json::json!({"label": label, "color": c, "values": pad(&curve.value), "lo": pad(&curve.lo), "hi": pad(&curve.hi)})
        })
        .collect();
    serde_json::json!({
        "kind": "lines", "x": x, "xsplits": x, "xlabel": "draft position k", "xname": "position", "ylabel": title_y,
        "ymin": 0.0, "ymax": 1.0, "series": series, "height": 250,
        "hint": format!("hover for values · bands are 95% bootstrap CIs over prompts · positions with < {MIN_DEN} blocks are not drawn")
    })
}

/// Grouped bars of accepted-length distributions: (label, colour, fractions for A+1 = 1..).
pub fn histogram_chart_data(runs: &[(String, String, &[f64])]) -> serde_json::Value {
    let buckets = runs.iter().map(|r| r.2.len()).max().unwrap_or(0);
    let r = runs.len().max(1);
    // Every bucket has r slots plus one empty slot, evenly spaced, so bars are equally wide.
    let slot = 1.0 / (r as f64 + 1.0);
    let mut x = Vec::new();
    let mut vals: Vec<Vec<Option<f64>>> = vec![Vec::new(); r];
    for b in 0..buckets {
        for s in 0..=r {
            x.push((b + 1) as f64 + (s as f64 - (r as f64 - 1.0) / 2.0) * slot);
            for (j, v) in vals.iter_mut().enumerate() {
                v.push(if s == j {
                    runs[j].2.get(b).copied()
                } else {
                    None
                });
            }
        }
    }
    let xsplits: Vec<usize> = (1..=buckets).collect();
    let xlabels: serde_json::Map<String, serde_json::Value> = xsplits
        .iter()
        .map(|i| (i.to_string(), serde_json::Value::from(i.to_string())))
        .collect();
    let series: Vec<serde_json::Value> = runs
        .iter()
        .zip(vals)
        .map(|((label, c, _), v)| serde_json::json!({"label": label, "color": c, "values": v}))
        .collect();
    serde_json::json!({
        "kind": "bars", "x": x, "xsplits": xsplits, "xlabels": xlabels, "xlabel": "tokens per round (A+1, bonus included)",
        "xname": "A+1 =", "ylabel": "share of rounds", "ymin": 0.0, "series": series, "height": 250,
        "xrange": [0.4, buckets as f64 + 0.6]
    })
}
