//! One run: identity, headline numbers, charts, all metrics, categories, prompts (paged), config.

use super::{
    chart, color, drafter_label, fmt, fmt_int, histogram_chart_data, link, mode_chip, origin_chip,
    page, position_chart_data, sparkline, status_chip, Ctx,
};
use crate::compare::RunCurves;
use crate::qs::Query;
use draftlens_results::store::{MetricRow, RunDetail};
use maud::{html, Markup};

pub struct PromptRow {
    pub index: u32,
    pub id: String,
    pub category: Option<String>,
    pub tokens: u32,
    pub prompt_len: u32,
    pub blocks: u32,
    pub tau_replayed: Option<f64>,
    pub tau_uniform: Option<f64>,
    pub flat_accuracy: Option<f64>,
}

pub struct CategoryRow {
    pub name: String,
    pub prompts: usize,
    pub tau_replayed: Option<f64>,
    pub tau_uniform: Option<f64>,
    pub flat_accuracy: Option<f64>,
}

pub struct Headline {
    pub tau_replayed: Option<f64>,
    pub tau_replayed_pooled: Option<f64>,
    pub tau_uniform: Option<f64>,
    pub flat_accuracy: Option<f64>,
    pub rounds: u64,
    /// Completion blocks the statistics count (also for imported runs without records).
    pub blocks: u64,
}

pub struct RunView<'a> {
    pub detail: &'a RunDetail,
    pub headline: Option<Headline>,
    pub curves: Option<&'a RunCurves>,
    pub metrics: &'a [MetricRow],
    pub categories: &'a [CategoryRow],
    pub prompts: &'a [PromptRow],
    pub prompt_total: usize,
    pub offset: usize,
    pub per_page: usize,
    pub query: &'a Query,
    pub is_baseline: bool,
    pub series_runs: usize,
}

pub fn render(ctx: &Ctx, v: &RunView) -> Markup {
    let r = &v.detail.run;
    let q = v.query;
    let base = format!("/runs/{}", r.id);
    let psort = q.get("psort").unwrap_or("index");
    let plink = |key: &str| {
        format!(
            "{base}{}",
            q.with("psort", Some(key))
                .without(&["ppage"])
                .to_string_with_qmark()
        )
    };
    let body = html! {
        div class="head" {
            div class="grow" {
                div class="crumbs" { (link(ctx, "/", html! { "Runs" })) " / #" (r.id) }
                h1 { (r.name) }
                div class="runhead" {
                    (status_chip(r.status)) (mode_chip(r.mode)) (origin_chip(r))
                    @if v.is_baseline { span class="chip base" { "pinned baseline" } }
                    span class="chip mono" title="run uid" { (r.uid) }
                    span class="chip" { "created " (r.created_at) }
                    @if let Some(f) = &r.finished_at { span class="chip" { "finished " (f) } }
                }
            }
            @if !ctx.report {
                div class="actions" {
                    a class="btn" href=(format!("/?drafter={}", crate::qs::encode(&r.drafter_series))) { "Same drafter" }
                    @if v.series_runs > 1 {
                        a class="btn" href=(format!("/history?series={}&mode={}", crate::qs::encode(&r.drafter_series), r.mode.as_str())) { "τ vs step" }
                    }
                    a class="btn" href=(format!("/report?runs={}", r.id)) download { "Export report" }
                    @if ctx.can_write {
                        form class="inline" method="post" action="/baseline" {
                            input type="hidden" name="run" value=(r.id);
                            @if v.is_baseline {
                                input type="hidden" name="unpin" value="1";
                                button class="btn" type="submit" { "Unpin baseline" }
                            } @else {
                                button class="btn" type="submit" title="Comparisons that include this run use it as the baseline" { "Pin as baseline" }
                            }
                        }
                        details style="display:inline-block" {
                            summary class="btn danger" style="list-style:none" { "Delete…" }
                            form method="post" action=(format!("/runs/{}/delete", r.id)) style="margin-top:6px" {
                                button class="btn danger" type="submit" { "Delete run #" (r.id) " and its records" }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(e) = &r.error { div class="err" { strong { "Run failed: " } (e) } }
        @if r.status == draftlens_results::store::RunStatus::Running {
            div class="note" { "This run has not finished (or its process was interrupted): its numbers may be partial and it is never treated as complete." }
        }
        @if !v.detail.failures.is_empty() {
            div class="panel" {
                h2 { "Plugin failures" span class="chip failed" { (v.detail.failures.len()) } }
                table {
                    thead { tr { th { "Plugin" } th { "Kind" } th { "Message" } th { "When" } } }
                    tbody { @for f in &v.detail.failures { tr { td class="mono" { (f.plugin) } td { (f.kind) } td { code { (f.message) } } td class="sub" { (f.created_at) } } } }
                }
            }
        }
        @if let Some(h) = &v.headline {
            div class="cards" {
                div class="card" { div class="k" { "τ replayed (macro)" } div class="v" { (fmt(h.tau_replayed)) } div class="d" { "tokens per verify round, bonus included · " (fmt_int(h.rounds)) " rounds" } }
                div class="card" { div class="k" { "τ replayed (pooled)" } div class="v" { (fmt(h.tau_replayed_pooled)) } div class="d" { "Σ tokens / Σ rounds over all prompts" } }
                div class="card" { div class="k" { "τ uniform anchors" } div class="v" { (fmt(h.tau_uniform)) } div class="d" { "Σ(A+1) / Σ blocks over every completion anchor (pooled)" } }
                div class="card" { div class="k" { "Flat top-1 accuracy" } div class="v" { (fmt(h.flat_accuracy)) } div class="d" { "all valid drafted positions — not acceptance" } }
                div class="card" { div class="k" { "Evaluated" } div class="v" { (fmt_int(h.blocks)) } div class="d" { (if h.blocks == 1 { "block" } else { "blocks" }) " over " (super::count(r.num_prompts, "prompt", "prompts")) " · B=" (r.block_size) " K=" (r.top_k) @if r.num_blocks == 0 { " · records not stored" } } }
            }
        }
        @if let Some(c) = v.curves {
            @let label = format!("#{} {}", r.id, r.name);
            @let col = color(0).to_string();
            div class="grid3" {
                div class="panel" { (chart("c-acc", "Top-1 accuracy by position", "marginal P(draft_k = t_k), pooled over blocks", &position_chart_data("accuracy", &[(label.clone(), col.clone(), &c.accuracy)], r.block_size as usize - 1), &[])) }
                div class="panel" { (chart("c-cond", "Conditional acceptance by position", "P(accept k | accepted 1..k−1)", &position_chart_data("acceptance", &[(label.clone(), col.clone(), &c.acceptance)], r.block_size as usize - 1), &[])) }
                div class="panel" { (chart("c-hist", "Tokens per round", "replayed rounds vs every completion anchor", &histogram_chart_data(&[("replayed".into(), col.clone(), &c.hist_replayed), ("uniform anchors".into(), color(1).into(), &c.hist_uniform)]), &[("replayed rounds".into(), col.clone()), ("uniform anchors".into(), color(1).into())])) }
            }
        } @else if r.num_blocks == 0 {
            div class="note" { "No records are stored for this run, so per-position charts and the token drill-down are unavailable." }
        }
        div class="grid2" {
            div class="panel" {
                h2 { "Identity" }
                dl class="kv" {
                    dt { "Target" } dd { (r.target_arch) " · " code { (r.target_path) } br; span class="hint mono" { (r.target_sha256) } }
                    dt { "Drafter" } dd { (drafter_label(r)) " · " code { (r.drafter_path) } br; span class="hint mono" { (r.drafter_sha256) } }
                    dt { "Drafter family" } dd class="family" { code { (r.drafter_family) } }
                    dt { "Prompt set" } dd { (r.prompt_set_name) br; span class="hint mono" { (r.prompt_set_sha256) } }
                    dt { "Backend" } dd { (r.backend) " · " (r.dtype) }
                    dt { "Block / top-K" } dd { "B = " (r.block_size) " (γ = " (r.block_size - 1) " drafted) · K = " (r.top_k) }
                    @if let Some(t) = &r.train_style { dt { "Train-style" } dd { "mask " (t.mask_rule) " · labels " (t.labels) } }
                    dt { "Origin" } dd { (r.origin) }
                }
            }
            div class="panel" {
                h2 { "Configuration & timings" }
                pre class="json" { (serde_json::to_string_pretty(&r.config).unwrap_or_default()) }
                @if r.timings.as_object().map(|o| !o.is_empty()).unwrap_or(false) {
                    pre class="json" { (serde_json::to_string_pretty(&r.timings).unwrap_or_default()) }
                }
            }
        }
        @if !v.metrics.is_empty() {
            div class="panel flush" {
                div style="padding:14px 16px 0" { h2 { "Metrics" span class="sub" { (v.metrics.len()) " run-level values" } } }
                table {
                    thead { tr { th { "Source" } th { "Metric" } th class="num" { "Value" } th class="num" { "n" } th { "Unit" } th { "Series" } th { "Definition" } } }
                    tbody {
                        @for m in v.metrics {
                            tr {
                                td class="mono sub" { (m.source) }
                                td { strong { (m.name) } " " span class="hint" { (if m.higher_is_better { "↑" } else { "↓" }) } }
                                td class="num" { (fmt(Some(m.value))) }
                                td class="num sub" { (fmt_int(m.count)) }
                                td class="sub" { (m.unit) }
                                td { @if let Some(s) = m.series.as_ref().and_then(|s| s.as_array()) { (sparkline(&s.iter().map(|x| x.as_f64()).collect::<Vec<_>>())) } }
                                td class="sub" { (m.description) }
                            }
                        }
                    }
                }
            }
        }
        @if !v.categories.is_empty() {
            div class="panel flush" {
                div style="padding:14px 16px 0" { h2 { "By category" } }
                table {
                    thead { tr { th { "Category" } th class="num" { "Prompts" } th class="num" { "τ replayed" } th class="num" { "τ uniform" } th class="num" { "Flat accuracy" } } }
                    tbody { @for c in v.categories { tr { td { (c.name) } td class="num" { (c.prompts) } td class="num" { (fmt(c.tau_replayed)) } td class="num" { (fmt(c.tau_uniform)) } td class="num" { (fmt(c.flat_accuracy)) } } } }
                }
            }
        }
        @if !v.prompts.is_empty() {
            div class="panel flush" {
                div style="padding:14px 16px 0" { h2 { "Prompts" span class="sub" { (v.prompt_total) " · click one to see its rounds token by token" } } }
                table {
                    thead { tr {
                        th class="num" { a href=(plink("index")) { "#" } }
                        th { "Prompt" }
                        th { "Category" }
                        th class="num" { "Tokens" }
                        th class="num" { "Blocks" }
                        th class="num" { a href=(plink("tau")) class=[(psort == "tau").then_some("sorted")] title="sort worst first" { "τ replayed" } }
                        th class="num" { a href=(plink("tauu")) class=[(psort == "tauu").then_some("sorted")] title="sort worst first" { "τ uniform" } }
                        th class="num" { a href=(plink("acc")) class=[(psort == "acc").then_some("sorted")] title="sort worst first" { "Flat accuracy" } }
                    } }
                    tbody {
                        @for p in v.prompts {
                            tr {
                                td class="num mono" { (p.index) }
                                td { (link(ctx, &format!("/runs/{}/prompts/{}", r.id, p.index), html! { (p.id) })) }
                                td { (p.category.clone().unwrap_or_default()) }
                                td class="num" { (p.prompt_len) " + " (p.tokens - p.prompt_len) }
                                td class="num" { (p.blocks) }
                                td class="num" { (fmt(p.tau_replayed)) }
                                td class="num" { (fmt(p.tau_uniform)) }
                                td class="num" { (fmt(p.flat_accuracy)) }
                            }
                        }
                    }
                }
                @if !ctx.report && v.prompt_total > v.per_page {
                    div class="pager" {
                        span class="grow" { (v.offset + 1) "–" (v.offset + v.prompts.len()) " of " (v.prompt_total) }
                        @let pno = v.offset / v.per_page;
                        @if pno > 0 { a class="btn" href=(format!("{base}{}", q.with("ppage", Some(&pno.to_string())).to_string_with_qmark())) { "← Previous" } }
                        @if v.offset + v.prompts.len() < v.prompt_total { a class="btn" href=(format!("{base}{}", q.with("ppage", Some(&(pno + 2).to_string())).to_string_with_qmark())) { "Next →" } }
                    }
                }
            }
        }
    };
    page(ctx, &r.name, body)
}
