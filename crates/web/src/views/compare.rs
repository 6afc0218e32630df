//! The comparison page: runs against a baseline with Δ, Δ%, paired CIs, charts, the
//! training-style vs deployment breakdown and the config diff.

use super::{
    chart, color, drafter_label, fmt, histogram_chart_data, link, mode_chip, page,
    position_chart_data, status_chip, Ctx,
};
use crate::compare::{fmt_delta, Comparison, Verdict};
use crate::qs::Query;
use maud::{html, Markup};

fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Better => "v-better",
        Verdict::Worse => "v-worse",
        Verdict::NotSignificant => "v-not_significant",
        Verdict::Unknown => "v-unknown",
        Verdict::TooFewPrompts => "v-too_few",
        Verdict::Inflation => "v-inflation",
        Verdict::Count => "v-count",
    }
}

fn metric_label(k: &draftlens_results::store::MetricKey) -> String {
    if k.source == crate::analysis::SOURCE {
        k.name.clone()
    } else {
        k.to_string()
    }
}

pub fn render(ctx: &Ctx, c: &Comparison, query: &Query) -> Markup {
    let ids: Vec<String> = c.runs.iter().map(|r| r.id.to_string()).collect();
    let base_q = query.with("runs", Some(&ids.join(","))).without(&["run"]);
    let show_all = query.get("config") == Some("all");
    let b = c.baseline;
    let label = |i: usize| format!("#{} {}", c.runs[i].id, c.runs[i].name);
    let positions = c
        .runs
        .iter()
        .map(|r| r.block_size as usize - 1)
        .max()
        .unwrap_or(1);
    let with_curves: Vec<usize> = (0..c.runs.len())
        .filter(|&i| c.curves[i].is_some())
        .collect();
    let legend: Vec<(String, String)> = with_curves
        .iter()
        .map(|&i| (label(i), color(i).to_string()))
        .collect();
    let others: Vec<usize> = (0..c.runs.len()).filter(|&i| i != b).collect();
    let body = html! {
        div class="head" {
            div class="grow" {
                div class="crumbs" { (link(ctx, "/", html! { "Runs" })) " / compare" }
                h1 { "Comparing " (c.runs.len()) " runs" }
                div class="runhead" {
                    @for (i, r) in c.runs.iter().enumerate() {
                        span class="runchip" {
                            span class="dot" style=(format!("background:{}", color(i))) {}
                            (link(ctx, &format!("/runs/{}", r.id), html! { (r.name) }))
                            span class="id" { "#" (r.id) }
                            span class="chip family" title="drafter family" { (r.drafter_family) }
                            (status_chip(r.status))
                            @if r.mode != draftlens_results::store::RunMode::Deployment { (mode_chip(r.mode)) }
                            @if i == b { span class="chip base" { "baseline" } }
                            @else if !ctx.report {
                                a class="mk" href=(format!("/compare{}", base_q.with("baseline", Some(&r.id.to_string())).to_string_with_qmark())) title="make this run the baseline" { "set as baseline" }
                            }
                        }
                    }
                }
            }
            @if !ctx.report {
                div class="actions" {
                    a class="btn" href=(format!("/report{}", base_q.with("baseline", Some(&c.runs[b].id.to_string())).to_string_with_qmark())) download { "Export report" }
                    a class="btn" href=(format!("/compare{}", base_q.with("format", Some("json")).to_string_with_qmark())) { "JSON" }
                }
            }
        }
        @for n in &c.notes { div class="note" { (n) } }
        (super::verdict::panel(c))
        (super::trace_diff::panel(ctx, c))
        div class="panel flush" {
            div style="padding:14px 16px 4px" {
                h2 { "Metrics" }
                div class="sub" {
                    "Δ = run − baseline over the prompts both runs share (matched by prompt sha256). 95% CI over prompts: BCa bootstrap ("
                    (c.reps) " replicates) from " (crate::stats::MIN_SHARED_PROMPTS) " shared prompts on, paired t-interval below (no colour then). Green = significantly better, red = significantly worse (direction from each metric's ↑/↓), grey = not significant; train-style against deployment is inflation, never better."
                }
                div class="runhead" style="margin-bottom:10px" {
                    @for &j in &others {
                        @let cv = &c.coverage[j];
                        span class="chip" {
                            span class="dot" style=(format!("background:{}", color(j))) {}
                            "#" (c.runs[j].id) ": " (cv.shared) "/" (cv.prompts.max(cv.baseline_prompts)) " prompts shared"
                        }
                    }
                }
            }
            div class="scroll" { table {
                thead {
                    tr {
                        th { "Metric" }
                        th class="num" style=(format!("border-top:3px solid {}", color(b))) { "#" (c.runs[b].id) " (baseline)" }
                        @for &j in &others {
                            th class="num" style=(format!("border-top:3px solid {}", color(j))) { "#" (c.runs[j].id) }
                            th class="num" { "Δ · Δ% (95% CI)" }
                        }
                    }
                }
                tbody {
                    @for m in &c.metrics {
                        tr {
                            td title=(m.description) {
                                strong { (metric_label(&m.key)) } " " span class="hint" { (if m.is_count { "count" } else if m.higher_is_better { "↑" } else { "↓" }) }
                                span class="tiny" style="display:block; font-size:11.5px; color:var(--faint)" { (m.convention) @if !m.unit.is_empty() { " · " (m.unit) } }
                            }
                            td class="num" { (fmt(m.values[b])) }
                            @for &j in &others {
                                td class="num" { (fmt(m.values[j])) }
                                @match &m.deltas[j] {
                                    Some(d) => {
                                        td class=(format!("num delta {}", verdict_class(d.verdict))) {
                                            (fmt_delta(d.delta))
                                            " · " (d.delta_pct.map(|p| format!("{p:+.1}%")).unwrap_or("—".into()))
                                            @if let Some((lo, hi)) = d.ci { span class="ci" title=(d.method.map(|m| m.label()).unwrap_or("")) { "[" (fmt_delta(lo)) ", " (fmt_delta(hi)) "] n=" (d.n) @if let Some(m) = d.method { " · " (m.label()) } } }
                                            @match d.verdict {
                                                Verdict::Better | Verdict::Worse => {}
                                                Verdict::Unknown => { span class="ns" { (if d.paired { "too few prompts for a CI" } else { "no per-prompt values: no CI" }) } }
                                                v => { span class="ns" { (v.label()) } }
                                            }
                                        }
                                    }
                                    None => { td class="num sub" { "—" } }
                                }
                            }
                        }
                    }
                }
            } }
        }
        @if !with_curves.is_empty() {
            @let acc: Vec<(String, String, &crate::analysis::Curve)> = with_curves.iter().map(|&i| (label(i), color(i).to_string(), &c.curves[i].as_ref().unwrap().accuracy)).collect();
            @let cond: Vec<(String, String, &crate::analysis::Curve)> = with_curves.iter().map(|&i| (label(i), color(i).to_string(), &c.curves[i].as_ref().unwrap().acceptance)).collect();
            @let hist: Vec<(String, String, &[f64])> = with_curves.iter().map(|&i| (label(i), color(i).to_string(), c.curves[i].as_ref().unwrap().hist_replayed.as_slice())).collect();
            div class="grid2" {
                div class="panel" { (chart("cmp-acc", "Top-1 accuracy by draft position", "marginal, pooled over blocks; bands: 95% bootstrap CI over prompts", &position_chart_data("accuracy", &acc, positions), &legend)) }
                div class="panel" { (chart("cmp-cond", "Conditional acceptance by draft position", "P(accept k | accepted 1..k−1); bands: 95% CI", &position_chart_data("acceptance", &cond, positions), &legend)) }
            }
            div class="panel" { (chart("cmp-hist", "Tokens per verify round (replayed decode)", "distribution of A+1 over the rounds a greedy decode visits", &histogram_chart_data(&hist), &legend)) }
        }
        @if !c.inflation.is_empty() {
            div class="panel" {
                h2 { "Training-style vs deployment" span class="sub" { "how the training-time numbers get inflated, mechanism by mechanism (docs/dflash.md §2.4)" } }
                @let dep: Vec<usize> = with_curves.iter().copied().filter(|&i| c.runs[i].mode == draftlens_results::store::RunMode::Deployment).collect();
                @let ts: Vec<usize> = with_curves.iter().copied().filter(|&i| c.runs[i].mode == draftlens_results::store::RunMode::TrainStyle).collect();
                @if !dep.is_empty() && !ts.is_empty() {
                    @let mk = |ids: &[usize]| -> Vec<(String, String, &crate::analysis::Curve)> { ids.iter().map(|&i| (label(i), color(i).to_string(), &c.curves[i].as_ref().unwrap().accuracy)).collect() };
                    div class="grid2" {
                        div { (chart("inf-dep", "Deployment: accuracy by position", "isolated per-anchor evaluation", &position_chart_data("accuracy", &mk(&dep), positions), &dep.iter().map(|&i| (label(i), color(i).to_string())).collect::<Vec<_>>())) }
                        div { (chart("inf-ts", "Train-style: accuracy by position", "shared forward, training mask and labels", &position_chart_data("accuracy", &mk(&ts), positions), &ts.iter().map(|&i| (label(i), color(i).to_string())).collect::<Vec<_>>())) }
                    }
                }
                table class="mech" style="margin-top:12px" {
                    thead { tr { th { "Run" } th { "Evaluation" } th class="num" { "Flat accuracy" } th class="num" { "τ uniform" } th class="num" { "τ replayed" } th { "What changed from the row above" } } }
                    tbody {
                        @for (n, row) in c.inflation.iter().enumerate() {
                            @let prev = (n > 0).then(|| &c.inflation[n - 1]);
                            tr {
                                td { span class="dot" style=(format!("background:{}", color(row.run))) {} " #" (c.runs[row.run].id) }
                                td { (row.label) }
                                td class="num" { (fmt(row.flat_accuracy)) (step_delta(prev.and_then(|p| p.flat_accuracy), row.flat_accuracy)) }
                                td class="num" { (fmt(row.tau_uniform)) (step_delta(prev.and_then(|p| p.tau_uniform), row.tau_uniform)) }
                                td class="num" { (fmt(row.tau_replayed)) (step_delta(prev.and_then(|p| p.tau_replayed), row.tau_replayed)) }
                                td class="sub" { (row.mechanism) }
                            }
                        }
                    }
                }
                p class="hint" { "Flat accuracy counts every drafted position; τ needs a prefix of matches (mechanism 4). Replayed τ visits only the anchors a real decode reaches, right after draft errors (mechanism 7)." }
            }
        }
        div class="panel flush" {
            div style="padding:14px 16px 4px; display:flex; align-items:center; gap:12px" {
                h2 style="margin:0" { "Configuration" }
                span class="sub" { (c.config.iter().filter(|r| r.differs).count()) " of " (c.config.len()) " keys differ" }
                span class="spacer" style="flex:1" {}
                @if !ctx.report {
                    @if show_all { a class="toggle" href=(format!("/compare{}", base_q.without(&["config"]).to_string_with_qmark())) { "Show differing keys only" } }
                    @else { a class="toggle" href=(format!("/compare{}", base_q.with("config", Some("all")).to_string_with_qmark())) { "Show all keys" } }
                }
            }
            div class="scroll" { table {
                thead { tr { th { "Key" } @for (i, r) in c.runs.iter().enumerate() { th style=(format!("border-top:3px solid {}", color(i))) { "#" (r.id) span class="tiny" { (drafter_label(r)) } } } } }
                tbody {
                    @for row in c.config.iter().filter(|r| r.differs || show_all) {
                        tr class=[(!row.differs).then_some("same")] {
                            td class="diffkey" { (row.key) }
                            @for (i, v) in row.values.iter().enumerate() {
                                td class=[(row.differs && i != b && v != &row.values[b]).then_some("changed")] { code { (v.clone().unwrap_or_else(|| "—".into())) } }
                            }
                        }
                    }
                    @if c.config.iter().all(|r| !r.differs) && !show_all { tr { td colspan="99" class="sub" { "The runs have identical configurations." } } }
                }
            } }
        }
    };
    page(ctx, &format!("Compare {} runs", c.runs.len()), body)
}

fn step_delta(prev: Option<f64>, cur: Option<f64>) -> Markup {
    match (prev, cur) {
        (Some(p), Some(c)) => {
            let d = c - p;
            html! { span class="ci" { (fmt_delta(d)) } }
        }
        _ => html! {},
    }
}
