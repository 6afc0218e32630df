//! The verdict panel of the comparison page (and of the HTML report): drafter families side by
//! side with τ, the cost model's estimated speed-up and the measured one (docs/verdict.md).
//! Cells carry `data-*` values at full precision, which the browser test reads back.

use super::{color, fmt};
use crate::compare::verdict::PairedDelta;
use crate::compare::{fmt_delta, Comparison};
use maud::{html, Markup};

fn ci(ci: Option<(f64, f64)>) -> Markup {
    html! { @if let Some((lo, hi)) = ci { span class="ci" { "[" (format!("{lo:.3}")) ", " (format!("{hi:.3}")) "]" } } }
}

fn speedup(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}×")).unwrap_or("—".into())
}

fn data(v: Option<f64>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn delta(d: &Option<PairedDelta>) -> Markup {
    html! {
        @match d {
            Some(d) => {
                (fmt_delta(d.delta))
                @if let Some((lo, hi)) = d.ci { span class="ci" title=(d.method.map(|m| m.label()).unwrap_or("")) { "[" (fmt_delta(lo)) ", " (fmt_delta(hi)) "] n=" (d.n) } }
            }
            None => { span class="sub" { "—" } }
        }
    }
}

/// The independent costs of a run (`bench-costs` medians), as the estimate cell's title.
fn bench_title(k: &Option<draftlens_results::speed::CostInputs>) -> String {
    k.map(|k| {
        format!(
            "bench-costs medians: t_decode {:.3} ms, t_draft_round {:.3} ms, t_verify(B) {:.3} ms",
            k.t_decode * 1e3,
            k.t_draft_round * 1e3,
            k.t_verify * 1e3
        )
    })
    .unwrap_or_default()
}

pub fn panel(c: &Comparison) -> Markup {
    let v = &c.verdict;
    // The estimate from `bench-costs`' independent costs: two more columns where a run has them.
    let bench = v.rows.iter().any(|r| r.bench_costs.is_some());
    let index_of = |id: i64| c.runs.iter().position(|r| r.id == id).unwrap_or(0);
    html! {
        div class="panel flush" id="verdict" {
            div style="padding:14px 16px 4px" {
                h2 { "Verdict" }
                div class="sub" {
                    "Drafter families on one target, prompt set and backend. Estimated speed-up = τ · t_decode / (t_draft_round + t_verify(B)), τ the replayed τ pooled over prompts and the three costs measured on the run's backend by "
                    code { "draftlens live --baseline --store RUN" } "; measured speed-up = wall time of plain greedy decoding / live speculative decoding of the same prompts at batch 1."
                    @if bench { " Estimated (bench-costs): the same model over costs measured apart from live decoding by " code { "draftlens bench-costs --store RUN" } " (medians), sharing no timing with the measurement." }
                    " 95% CIs: bootstrap over prompts (" (c.reps) " replicates); Δs paired over shared prompts against #" (c.runs[v.baseline].id) "."
                }
            }
            div class="scroll" { table {
                thead { tr {
                    th { "Run" } th { "Family" } th class="num" { "τ replayed" } th class="num" { "t_decode ms" } th class="num" { "t_draft_round ms" } th class="num" { "t_verify(B) ms" }
                    th class="num" { "Estimated speed-up" } th class="num" { "Measured speed-up" } th class="num" { "Estimate vs measured" }
                    @if bench { th class="num" { "Estimated (bench-costs)" } th class="num" { "Bench vs measured" } }
                    th class="num" { "Δ τ" } th class="num" { "Δ estimated" } th class="num" { "Δ measured" }
                } }
                tbody {
                    @for (j, r) in v.rows.iter().enumerate() {
                        tr data-run=(r.run) {
                            td { span class="dot" style=(format!("background:{}", color(index_of(r.run)))) {} " #" (r.run) @if j == v.baseline { " " span class="chip base" { "baseline" } } }
                            td class="family" { code { (r.family) } }
                            td class="num tau" data-value=(data(r.tau)) { (fmt(r.tau)) (ci(r.tau_ci)) }
                            td class="num" { (r.costs.map(|k| format!("{:.3}", k.t_decode * 1e3)).unwrap_or("—".into())) }
                            td class="num" { (r.costs.map(|k| format!("{:.3}", k.t_draft_round * 1e3)).unwrap_or("—".into())) }
                            td class="num" { (r.costs.map(|k| format!("{:.3}", k.t_verify * 1e3)).unwrap_or("—".into())) }
                            td class="num est" data-value=(data(r.estimated)) { (speedup(r.estimated)) (ci(r.estimated_ci)) }
                            td class="num meas" data-value=(data(r.measured)) { (speedup(r.measured)) (ci(r.measured_ci)) }
                            td class="num err" data-value=(data(r.estimate_error_pct)) { (r.estimate_error_pct.map(|e| format!("{e:+.1}%")).unwrap_or("—".into())) }
                            @if bench {
                                td class="num est-bench" data-value=(data(r.estimated_bench)) title=(bench_title(&r.bench_costs)) { (speedup(r.estimated_bench)) (ci(r.estimated_bench_ci)) }
                                td class="num err-bench" data-value=(data(r.estimate_bench_error_pct)) { (r.estimate_bench_error_pct.map(|e| format!("{e:+.1}%")).unwrap_or("—".into())) }
                            }
                            td class="num" { (delta(&r.delta_tau)) }
                            td class="num" { (delta(&r.delta_estimated)) }
                            td class="num" { (delta(&r.delta_measured)) }
                        }
                    }
                }
            } }
            div style="padding:4px 16px 12px" {
                @if let Some(e) = v.worst_estimate_error_pct {
                    p class="hint closeness" { "The cost model's estimate is within " (format!("{:.1}", e.abs())) "% of the measured speed-up on every run with both." }
                }
                @if let Some(e) = v.worst_estimate_bench_error_pct {
                    p class="hint closeness-bench" { "Its estimate from costs measured apart from live decoding (bench-costs) is within " (format!("{:.1}", e.abs())) "% of the measured speed-up on every run with both." }
                }
                @for r in v.rows.iter().filter(|r| r.missing.is_some()) {
                    p class="hint missing" { "#" (r.run) ": " (r.missing.as_deref().unwrap_or("")) }
                }
                @for n in &v.notes { div class="note" { (n) } }
            }
        }
    }
}
