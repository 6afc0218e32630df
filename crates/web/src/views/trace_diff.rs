//! A serving engine's run against its reference drafter (`draftlens trace diff`, docs/traces.md
//! §6): the compare page's panel, which shows the summary `trace diff` prints (every text from
//! `crate::compare::trace_diff`, the one definition), and the drill-down page listing the first
//! rounds that differ, by prompt then round. Cells carry `data-*` values at full precision,
//! which the browser test reads back.

use super::{link, page, Ctx};
use crate::compare::trace_diff::{summary_lines, DiffDelta, DiffSummary, DrillDown, DrillPrompt};
use crate::compare::Comparison;
use draftlens_results::store::{RunInfo, TraceDiffInfo};
use draftlens_results::trace::StoredCorrection;
use maud::{html, Markup};

fn data(v: Option<f64>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn delta_data(d: &Option<DiffDelta>) -> (String, String, String) {
    let i = d.as_ref().and_then(|d| d.interval);
    (
        data(d.as_ref().map(|d| d.value)),
        data(i.map(|i| i.lo)),
        data(i.map(|i| i.hi)),
    )
}

/// The drill-down's address for a diff (and a prompt in it).
pub fn drill_href(run: i64, diff: i64, prompt: Option<u32>) -> String {
    match prompt {
        Some(p) => format!("/runs/{run}/trace-diff?diff={diff}&prompt={p}#prompt-{p}"),
        None => format!("/runs/{run}/trace-diff?diff={diff}"),
    }
}

/// The reference drafter and what the diff ran on.
fn made_with(d: &TraceDiffInfo) -> Markup {
    html! {
        "against " code { (d.drafter_path) }
        " (weights sha256 " code title=(d.drafter_sha256) { (d.drafter_sha256.get(..12).unwrap_or(&d.drafter_sha256)) } ")"
        " · target " code { (d.target_path) } " · " (d.backend) " · " (d.created_at)
    }
}

/// The summary as `trace diff` prints it, line for line (`summary_lines`: counts, τ with the
/// paired interval, tokens lost per round, departures, the verdict, the import's corrections),
/// with the numbers at full precision in `data-*` attributes.
fn summary(s: &DiffSummary, corrections: &[StoredCorrection]) -> Markup {
    let (dv, dlo, dhi) = delta_data(&s.tau_delta);
    let (lv, llo, lhi) = delta_data(&s.tokens_lost_per_round);
    html! {
        div class="tdiff-summary" style="font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:13px; white-space:pre-wrap; margin:8px 0"
            data-prompts=(s.prompts) data-rounds=(s.rounds) data-fewer=(s.rounds_fewer) data-more=(s.rounds_more)
            data-engine-tau=(data(s.engine_tau_pooled)) data-reference-tau=(data(s.reference_tau_pooled))
            data-tau-delta=(dv) data-tau-lo=(dlo) data-tau-hi=(dhi)
            data-lost=(lv) data-lost-lo=(llo) data-lost-hi=(lhi) data-departures=(s.departures) {
            @for line in summary_lines(s, corrections) {
                @if line == s.verdict { div class="line verdict-line" { strong { (line) } } }
                @else { div class="line" { (line) } }
            }
        }
    }
}

/// The compare page's panel: one section per stored diff of each compared trace run.
pub fn panel(ctx: &Ctx, c: &Comparison) -> Markup {
    html! {
        @for t in &c.trace_diffs {
            @let r = &c.runs[t.run];
            div class="panel trace-diff" id=(format!("trace-diff-{}", t.diff.id)) data-run=(r.id) data-diff=(t.diff.id) {
                h2 { "Engine against its reference drafter" span class="sub" { " run #" (r.id) " " (r.name) " · " (r.origin) } }
                div class="sub" { (made_with(&t.diff)) }
                @if !t.reference_runs.is_empty() {
                    div class="sub" { "Compared here with the same drafter weights: "
                        @for &j in &t.reference_runs { "#" (c.runs[j].id) " " } }
                }
                (summary(&t.summary, &t.corrections))
                @if !ctx.report {
                    p { a class="drill" href=(drill_href(r.id, t.diff.id, None)) { "The first rounds that differ, by prompt →" } }
                }
            }
        }
    }
}

/// What the drill-down page shows.
pub struct DrillView<'a> {
    pub run: &'a RunInfo,
    pub drill: &'a DrillDown,
    /// The prompt opened (`?prompt=`).
    pub selected: Option<u32>,
    /// Display text of a token id (vocabulary), if known.
    pub vocab: Option<&'a [String]>,
}

/// The text of `ids` in running text (partial characters merged, as the prompt drill-down).
fn text_of(vocab: Option<&[String]>, ids: &[u32]) -> String {
    super::prompt::running_texts(vocab, ids)
        .into_iter()
        .flatten()
        .collect()
}

fn tokens(vocab: Option<&[String]>, class: &str, n: u32, ids: &[u32]) -> Markup {
    let ids_text = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    html! {
        td class=(class) data-count=(n) data-ids=(ids_text) {
            strong { (n) } " "
            @if vocab.is_some() { code class="text" style="white-space:pre-wrap" { (text_of(vocab, ids)) } }
            span class="ids hint" style="display:block" { "ids " (ids_text) }
        }
    }
}

fn prompt_section(v: &DrillView, p: &DrillPrompt) -> Markup {
    let d = &v.drill.diff;
    let open = v.selected == Some(p.index);
    html! {
        details class="tdiff-prompt" id=(format!("prompt-{}", p.index)) data-index=(p.index) open[open] {
            summary {
                strong { "prompt " (p.index) } " (" (p.id) "): "
                (p.rounds_fewer + p.rounds_more) " of " (p.rounds) " rounds differ (the reference commits more in "
                (p.rounds_fewer) ", fewer in " (p.rounds_more) "); the first " (p.listed.len()) " listed"
            }
            div style="padding:6px 0 10px" {
                table class="mech tdiff-rounds" {
                    thead { tr {
                        th class="num" { "round" }
                        th class="num" title="the position (prompt + output) the round verified at" { "position" }
                        th { "the engine committed" }
                        th { "the reference would commit" }
                    } }
                    tbody {
                        @for r in &p.listed {
                            tr data-round=(r.round) data-anchor=(r.anchor) {
                                td class="num round" { (r.round) }
                                td class="num anchor" { (r.anchor) span class="hint" { " (output token " ((r.anchor + 1).saturating_sub(p.prompt_len)) ")" } }
                                (tokens(v.vocab, "engine", r.engine, &r.engine_ids))
                                (tokens(v.vocab, "reference", r.reference, &r.reference_ids))
                            }
                        }
                    }
                }
                @if p.departures > 0 {
                    p class="hint" { "The engine's token is not the target's greedy one at " (p.departures) " positions, the first at "
                        (p.departure_positions.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")) "." }
                }
                p { a href=(format!("/runs/{}/prompts/{}", v.run.id, p.index)) { "The prompt and the engine's output →" }
                    " · " a href=(drill_href(v.run.id, d.id, Some(p.index))) { "link to this prompt" } }
            }
        }
    }
}

/// The drill-down page.
pub fn render(ctx: &Ctx, v: &DrillView) -> Markup {
    let (r, dd) = (v.run, v.drill);
    let selected_missing = v
        .selected
        .filter(|s| !dd.prompts.iter().any(|p| p.index == *s));
    let body = html! {
        div class="head" { div class="grow" {
            div class="crumbs" { (link(ctx, "/", html! { "Runs" })) " / " (link(ctx, &format!("/runs/{}", r.id), html! { (r.name) })) " / trace diff" }
            h1 { "Engine against its reference drafter: the rounds that differ" }
            div class="sub" { "run #" (r.id) " · " (r.origin) }
            div class="sub" { (made_with(&dd.diff)) }
        } }
        @if dd.diffs.len() > 1 {
            div class="note" { "This run has " (dd.diffs.len()) " diffs, against other drafters: "
                @for o in dd.diffs.iter().filter(|o| o.id != dd.diff.id) {
                    a href=(drill_href(r.id, o.id, None)) { (o.drafter_path) } " "
                }
            }
        }
        div class="panel trace-diff" data-run=(r.id) data-diff=(dd.diff.id) { (summary(&dd.summary, &dd.corrections)) }
        div class="panel flush" id="tdiff-prompts" {
            div style="padding:14px 16px 4px" {
                h2 { "Prompts with rounds that differ" }
                div class="sub" { "At each anchor the engine verified, the tokens the reference drafter commits on the engine's own tokens against the engine's; the first "
                    (draftlens_results::trace::diff::LISTED) " such rounds of each prompt, by prompt then round. The reference's tokens are the target's greedy ones given the engine's tokens before them." }
                @if let Some(s) = selected_missing { div class="note" { "Prompt " (s) " has no round that differs." } }
            }
            @if dd.prompts.is_empty() {
                p class="sub" style="padding:0 16px 14px" { "No round differs: at every anchor the engine committed what the reference would." }
            } @else {
                div class="scroll" { table class="tdiff-index" {
                    thead { tr { th class="num" { "prompt" } th { "id" } th class="num" { "rounds" } th class="num" { "reference more" } th class="num" { "reference fewer" } th class="num" { "first differing round" } } }
                    tbody { @for p in &dd.prompts {
                        tr data-index=(p.index) {
                            td class="num" { a class="open-prompt" href=(drill_href(r.id, dd.diff.id, Some(p.index))) { (p.index) } }
                            td { (p.id) }
                            td class="num" { (p.rounds) }
                            td class="num" { (p.rounds_fewer) }
                            td class="num" { (p.rounds_more) }
                            td class="num" { (p.listed.first().map(|x| x.round.to_string()).unwrap_or_default()) }
                        }
                    } }
                } }
                div style="padding:8px 16px 14px" { @for p in &dd.prompts { (prompt_section(v, p)) } }
            }
        }
    };
    page(ctx, &format!("Trace diff of run {}", r.id), body)
}
