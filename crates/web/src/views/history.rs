//! τ against checkpoint step for one drafter series: one point per checkpoint run, with 95%
//! bootstrap CI bands over prompts.

use super::{chart, color, fmt, fmt_int, link, page, Ctx};
use crate::compare::History;
use maud::{html, Markup};

pub struct HistoryView<'a> {
    pub history: Option<&'a History>,
    pub series: &'a [String],
    pub selected: Option<&'a str>,
    pub mode: &'a str,
    pub error: Option<String>,
}

pub fn render(ctx: &Ctx, v: &HistoryView) -> Markup {
    let body = html! {
        div class="head" {
            div class="grow" {
                h1 { "τ vs checkpoint" }
                div class="sub" { "One point per evaluated checkpoint of a drafter series (same mode and prompt set); bands are 95% bootstrap CIs over prompts." }
            }
        }
        @if !ctx.report {
            form class="panel filters" method="get" action="/history" style="border-radius:10px" {
                select name="series" {
                    @for s in v.series { option value=(s) selected[v.selected == Some(s.as_str())] { (s) } }
                }
                select name="mode" {
                    option value="deployment" selected[v.mode == "deployment"] { "deployment" }
                    option value="train-style" selected[v.mode == "train-style"] { "train-style" }
                }
                button class="btn primary" type="submit" { "Show" }
            }
        }
        @if let Some(e) = &v.error { div class="note" { (e) } }
        @if let Some(h) = v.history {
            @if h.points.is_empty() {
                div class="panel empty" { "No checkpoint of " strong { (h.series) } " has stored records in " (h.mode.as_str()) " mode." }
            } @else {
                @let x: Vec<i64> = h.points.iter().map(|p| p.step).collect();
                @let data = serde_json::json!({
                    "kind": "lines", "x": x, "xlabel": "checkpoint step", "xname": "step", "ylabel": "τ (tokens / round)", "height": 320,
                    "series": [
                        {"label": "τ replayed (macro)", "color": color(0), "values": h.points.iter().map(|p| p.tau_replayed).collect::<Vec<_>>(),
                         "lo": h.points.iter().map(|p| p.tau_replayed_ci.map(|c| c.0)).collect::<Vec<_>>(), "hi": h.points.iter().map(|p| p.tau_replayed_ci.map(|c| c.1)).collect::<Vec<_>>()},
                        {"label": "τ uniform anchors (pooled)", "color": color(1), "dash": true, "values": h.points.iter().map(|p| p.tau_uniform).collect::<Vec<_>>(),
                         "lo": h.points.iter().map(|p| p.tau_uniform_ci.map(|c| c.0)).collect::<Vec<_>>(), "hi": h.points.iter().map(|p| p.tau_uniform_ci.map(|c| c.1)).collect::<Vec<_>>()}
                    ],
                    "hint": "hover for values"
                });
                div class="panel" {
                    (chart("hist-tau", &format!("{} · {} · {}", h.series, h.mode.as_str(), h.prompt_set), "replayed τ is what a greedy decode would see; uniform-anchor τ averages every anchor · bands are each run's own 95% CI (unpaired): for step-to-step changes read the paired Δ column", &data,
                        &[("τ replayed (macro)".to_string(), color(0).to_string()), ("τ uniform anchors (pooled, dashed)".to_string(), color(1).to_string())]))
                }
                div class="panel flush" {
                    table {
                        thead { tr { th class="num" { "Step" } th { "Run" } th class="num" { "τ replayed" } th class="num" { "95% CI" } th class="num" title="paired Δ of replayed τ (macro) against the previous step, over the prompts both share" { "Δ vs previous step (paired)" } th class="num" { "τ uniform" } th class="num" { "Flat accuracy" } } }
                        tbody {
                            @for p in &h.points {
                                tr {
                                    td class="num mono" { (fmt_int(p.step.max(0) as u64)) }
                                    td { (link(ctx, &format!("/runs/{}", p.run), html! { (p.name) })) " " span class="chip" { (p.status) } }
                                    td class="num" { (fmt(p.tau_replayed)) }
                                    td class="num sub" { @if let Some((lo, hi)) = p.tau_replayed_ci { "[" (fmt(Some(lo))) ", " (fmt(Some(hi))) "]" } }
                                    @match &p.step_delta {
                                        Some(d) => {
                                            td class=(format!("num delta {}", match d.verdict { crate::compare::Verdict::Better => "v-better", crate::compare::Verdict::Worse => "v-worse", _ => "v-not_significant" })) {
                                                (crate::compare::fmt_delta(d.delta))
                                                @if let Some((lo, hi)) = d.ci { span class="ci" { "[" (crate::compare::fmt_delta(lo)) ", " (crate::compare::fmt_delta(hi)) "] n=" (d.n) @if let Some(m) = d.method { " · " (m.label()) } } }
                                                @if !matches!(d.verdict, crate::compare::Verdict::Better | crate::compare::Verdict::Worse) { span class="ns" { (d.verdict.label()) } }
                                            }
                                        }
                                        None => { td class="num sub" { "—" } }
                                    }
                                    td class="num" { (fmt(p.tau_uniform)) }
                                    td class="num" { (fmt(p.flat_accuracy)) }
                                }
                            }
                        }
                    }
                    @if h.points.len() >= 2 && !ctx.report {
                        div class="pager" {
                            span class="grow" { @if h.left_out > 0 { (super::count(h.left_out as u64, "run", "runs")) " of this series left out (other mode or prompt set, no step, or no records)" } }
                            a class="btn primary" href=(format!("/compare?runs={},{}", h.points[0].run, h.points[h.points.len() - 1].run)) { "Compare first and last checkpoint" }
                        }
                    }
                }
            }
        }
    };
    page(ctx, "τ vs checkpoint", body)
}
