//! The run list: filters, sortable metric columns, server-side paging, selection → compare.

use super::{count, drafter_label, fmt, fmt_int, mode_chip, origin_chip, page, status_chip, Ctx};
use crate::qs::Query;
use draftlens_results::store::{Facets, MetricKey, RunSummary};
use maud::{html, Markup};

pub struct RunsView<'a> {
    pub rows: &'a [RunSummary],
    pub total: usize,
    pub query: &'a Query,
    pub facets: &'a Facets,
    /// Shown metric columns with their direction.
    pub columns: &'a [(MetricKey, bool)],
    /// All run-scope metric keys (for the column picker).
    pub all_keys: &'a [(MetricKey, usize, bool)],
    pub offset: usize,
    pub per_page: usize,
    pub baselines: &'a [i64],
    pub flash: Option<&'a str>,
    /// Workload-slice facets (docs/slices.md) with the values stored runs show; filtered by
    /// `slice_FACET=VALUE`.
    pub slice_menus: &'a [(&'static str, Vec<String>)],
}

fn select(name: &str, label: &str, options: &[String], current: Option<&str>) -> Markup {
    html! {
        select name=(name) title=(label) {
            option value="" { (label) ": any" }
            @for o in options {
                option value=(o) selected[current == Some(o.as_str())] { (o) }
            }
        }
    }
}

fn metric_label(k: &MetricKey) -> String {
    if k.source == crate::analysis::SOURCE {
        k.name.clone()
    } else {
        k.to_string()
    }
}

pub fn render(ctx: &Ctx, v: &RunsView) -> Markup {
    let q = v.query;
    let sort = q.get("sort").unwrap_or("created");
    let desc = q.get("dir").map(|d| d != "asc").unwrap_or(true);
    let sort_link = |key: &str| -> String {
        let dir = if sort == key && desc { "asc" } else { "desc" };
        format!(
            "/{}",
            q.with("sort", Some(key))
                .with("dir", Some(dir))
                .without(&["page"])
                .to_string_with_qmark()
        )
    };
    let arrow = |key: &str| -> &'static str {
        if sort == key {
            if desc {
                " ↓"
            } else {
                " ↑"
            }
        } else {
            ""
        }
    };
    let page_no = v.offset / v.per_page.max(1);
    let last_page = if v.total == 0 {
        0
    } else {
        (v.total - 1) / v.per_page.max(1)
    };
    let steps: Vec<String> = v.facets.steps.iter().map(|s| s.to_string()).collect();
    let body = html! {
        div class="head" {
            div class="grow" {
                h1 { "Runs" }
                div class="sub" { (count(v.total as u64, "run matches", "runs match")) " · select two or more to compare them against a baseline" }
            }
            div class="actions" {
                a class="btn" href="/history" { "τ vs checkpoint" }
                @if ctx.can_write { a class="btn" href="/import" { "Import report" } }
            }
        }
        @if let Some(f) = v.flash { div class="ok" { (f) } }
        div class="panel flush" {
            form class="filters" method="get" action="/" {
                input type="search" name="q" placeholder="Search name, uid, target, drafter, prompt set…" value=[q.get("q")];
                (select("target", "target", &v.facets.targets, q.get("target")))
                (select("drafter", "drafter", &v.facets.drafters, q.get("drafter")))
                (select("step", "step", &steps, q.get("step")))
                (select("prompts", "prompts", &v.facets.prompt_sets, q.get("prompts")))
                (select("backend", "backend", &v.facets.backends, q.get("backend")))
                (select("mode", "mode", &["deployment".to_string(), "train-style".to_string()], q.get("mode")))
                (select("status", "status", &["complete".to_string(), "running".to_string(), "failed".to_string()], q.get("status")))
                @for (facet, values) in v.slice_menus.iter().filter(|(_, values)| values.len() > 1) {
                    (select(&format!("slice_{facet}"), facet, values, q.get(&format!("slice_{facet}"))))
                }
                @for (k, val) in q.0.iter().filter(|(k, _)| k == "sort" || k == "dir" || k == "cols") {
                    input type="hidden" name=(k) value=(val);
                }
                button class="btn primary" type="submit" { "Filter" }
                a class="btn" href="/" { "Clear" }
                details {
                    summary class="toggle" { "Columns" }
                    div style="position:absolute; background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px 12px; z-index:5; max-height:320px; overflow:auto; box-shadow:0 6px 24px rgba(0,0,0,.08)" {
                        @for (k, n, _) in v.all_keys {
                            label style="display:block; white-space:nowrap" {
                                input type="checkbox" name="cols" value=(k.to_string()) checked[v.columns.iter().any(|c| &c.0 == k)];
                                " " (metric_label(k)) " " span class="hint" { "(" (count(*n as u64, "run", "runs")) ")" }
                            }
                        }
                        button class="btn" type="submit" style="margin-top:6px" { "Apply" }
                    }
                }
            }
            @if v.rows.is_empty() {
                div class="empty" {
                    @if v.total == 0 && q.0.is_empty() {
                        p { strong { "No runs yet." } }
                        p { "Evaluate a drafter with " code { "draftlens run --target T --drafter D --prompts P" } ", or import a teammate's report." }
                    } @else {
                        p { "No runs match these filters. " a href="/" { "Clear filters" } }
                    }
                }
            } @else {
                form method="get" action="/compare" id="sel" {
                    div class="scroll" { table class="runs" {
                        thead { tr {
                            th style="width:28px" {}
                            th class="num" { a class=[(sort == "created").then_some("sorted")] href=(sort_link("created")) { "#" (arrow("created")) } }
                            th { a class=[(sort == "name").then_some("sorted")] href=(sort_link("name")) { "Run" (arrow("name")) } }
                            th { a class=[(sort == "status").then_some("sorted")] href=(sort_link("status")) { "Status" (arrow("status")) } }
                            th { "Target" }
                            th { a class=[(sort == "step").then_some("sorted")] href=(sort_link("step")) { "Drafter @ step" (arrow("step")) } }
                            th { "Prompt set" }
                            th class="num" title="prompts in the run" { "Prompts" }
                            @for (i, (k, hib)) in v.columns.iter().enumerate() {
                                @let key = format!("m{i}");
                                th class="num" title=(format!("{k} · {}", if *hib { "higher is better" } else { "lower is better" })) {
                                    a class=[(sort == key).then_some("sorted")] href=(sort_link(&key)) {
                                        (super::metric_short_label(k)) (if *hib { " ↑" } else { " ↓" }) (arrow(&key))
                                    }
                                }
                            }
                            th { "Created" }
                        } }
                        tbody {
                            @for r in v.rows {
                                @let run = &r.run;
                                tr {
                                    td { input type="checkbox" name="run" value=(run.id) aria-label=(format!("select run {}", run.id)); }
                                    td class="num mono" { (run.id) }
                                    td class="name" {
                                        a href=(format!("/runs/{}", run.id)) { (run.name) }
                                        @if v.baselines.contains(&run.id) { " " span class="chip base" title="pinned baseline" { "baseline" } }
                                        " " (origin_chip(run))
                                        span class="tiny mono" { (run.uid) }
                                    }
                                    td { (status_chip(run.status)) @if run.mode != draftlens_results::store::RunMode::Deployment { " " (mode_chip(run.mode)) } }
                                    td class="nw" { (run.target_arch) span class="tiny" { (run.backend) " · " (run.dtype) } }
                                    td class="nw" { (drafter_label(run)) span class="tiny" { "B=" (run.block_size) " · K=" (run.top_k) } }
                                    td class="nw" { (run.prompt_set_name) span class="tiny" { @if run.num_blocks > 0 { (count(run.num_blocks, "block", "blocks")) } @else { "records not stored" } } }
                                    td class="num" { (fmt_int(run.num_prompts)) }
                                    @for m in &r.metrics { td class="num" { (fmt(*m)) } }
                                    td class="sub nw" { (run.created_at.replace('T', " ").trim_end_matches('Z')) }
                                }
                            }
                        }
                    } }
                    div class="selbar" {
                        button class="btn primary" type="submit" { "Compare selected" }
                        span class="hint" { "the topmost selected run is the baseline unless one is pinned; change it on the comparison page" }
                    }
                }
                div class="pager" {
                    span class="grow" { "Showing " (fmt_int((v.offset + 1) as u64)) "–" (fmt_int((v.offset + v.rows.len()) as u64)) " of " (fmt_int(v.total as u64)) }
                    @if page_no > 0 {
                        a class="btn" href=(format!("/{}", q.with("page", Some(&(page_no).to_string())).to_string_with_qmark())) { "← Previous" }
                    }
                    span { "page " (page_no + 1) " of " (last_page + 1) }
                    @if page_no < last_page {
                        a class="btn" href=(format!("/{}", q.with("page", Some(&(page_no + 2).to_string())).to_string_with_qmark())) { "Next →" }
                    }
                }
            }
        }
    };
    page(ctx, "Runs", body)
}
