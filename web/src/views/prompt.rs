//! Drill-down: one prompt of one run, its continuation coloured by replayed round (accepted
//! draft tokens, the first rejected draft token next to the target's token, bonus token) and
//! the drafter's top-K per position for any anchor. Token text is untrusted: maud escapes it.

use super::{fmt, link, page, Ctx};
use crate::analysis::replay_chain;
use draftlens::records::RecordBatch;
use draftlens::store::{RunInfo, RunPrompt};
use maud::{html, Markup};
use std::collections::HashMap;

pub struct PromptView<'a> {
    pub run: &'a RunInfo,
    pub prompt: &'a RunPrompt,
    pub records: &'a RecordBatch,
    /// Display text of a token id (vocabulary), if known.
    pub vocab: Option<&'a [String]>,
    pub selected: Option<u32>,
    pub prev: Option<u32>,
    pub next: Option<u32>,
}

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Prompt,
    /// The anchor token of the first round (produced by the prefill).
    Prefill,
    Accepted(usize),
    /// Bonus token of a round; carries the rejected draft token when the round stopped early.
    Bonus(usize, Option<u32>),
    Unvisited,
}

fn piece(v: Option<&[String]>, id: u32) -> String {
    match v.and_then(|v| v.get(id as usize)) {
        Some(s) => s.clone(),
        None => format!("⟨{id}⟩"),
    }
}

/// A token's text for chips and tables: whitespace made visible.
fn visible(s: &str) -> String {
    let t = s.replace('\n', "↵").replace('\t', "⇥");
    if t.starts_with(' ') {
        format!("␣{}", &t[1..])
    } else if t.is_empty() {
        "∅".into()
    } else {
        t
    }
}

/// A token in running text: newlines stay newlines (with a faint ↵ so they can be hovered).
fn running(s: &str) -> Markup {
    if s.contains('\n') {
        let parts: Vec<&str> = s.split('\n').collect();
        html! {
            @for (i, p) in parts.iter().enumerate() {
                @if i > 0 { span class="nl" { "↵" } "\n" }
                (p)
            }
        }
    } else {
        html! { (s) }
    }
}

pub fn render(ctx: &Ctx, v: &PromptView) -> Markup {
    let r = v.run;
    let p = v.prompt;
    let ids = &p.token_ids;
    let plen = p.prompt_len as usize;
    let g = v.records.positions_per_block();
    let kk = v.records.top_k as usize;
    let chain = replay_chain(v.records, Some((p.prompt_len, ids.len() as u32)));
    let by_anchor: HashMap<u32, usize> = (0..v.records.num_blocks())
        .map(|b| (v.records.anchor[b], b))
        .collect();
    let mut role = vec![Role::Unvisited; ids.len()];
    for r in role.iter_mut().take(plen.min(ids.len())) {
        *r = Role::Prompt;
    }
    if let Some(&(a0, _, _)) = chain.first() {
        if (a0 as usize) < role.len() {
            role[a0 as usize] = Role::Prefill;
        }
    }
    for (ri, &(a, b, acc)) in chain.iter().enumerate() {
        for k in 1..=acc {
            let pos = a as usize + k;
            if pos < role.len() {
                role[pos] = Role::Accepted(ri);
            }
        }
        let bonus = a as usize + acc + 1;
        if bonus < role.len() {
            let rejected = if acc < g {
                let i = v.records.pos_index(b, acc + 1);
                (v.records.valid[i] == 1).then(|| v.records.draft_ids[i * kk])
            } else {
                None
            };
            role[bonus] = Role::Bonus(ri, rejected);
        }
    }
    let rounds = chain.len();
    let tokens: u64 = chain.iter().map(|c| c.2 as u64 + 1).sum();
    let accepted: u64 = chain.iter().map(|c| c.2 as u64).sum();
    let selected = v.selected.or_else(|| chain.first().map(|c| c.0));
    let sel_block = selected.and_then(|a| by_anchor.get(&a).copied());
    let on_chain: HashMap<u32, usize> = chain.iter().enumerate().map(|(i, c)| (c.0, i)).collect();
    let here = format!("/runs/{}/prompts/{}", r.id, p.index);
    let tok = |pos: usize, class: &str, text: &str, title: String| -> Markup {
        let sel = selected == Some(pos as u32);
        let cls = if sel {
            format!("tok {class} sel")
        } else {
            format!("tok {class}")
        };
        if by_anchor.contains_key(&(pos as u32)) && !ctx.report {
            html! { a class=(cls) href=(format!("{here}?anchor={pos}#topk")) title=(title) { (running(text)) } }
        } else {
            html! { span class=(cls) title=(title) { (running(text)) } }
        }
    };
    // Group the continuation into rounds so each round gets a subtle left rule.
    let mut segments: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
    for pos in plen.min(ids.len())..ids.len() {
        let rr = match role[pos] {
            Role::Accepted(i) | Role::Bonus(i, _) => Some(i),
            _ => None,
        };
        match segments.last_mut() {
            Some((cur, v)) if *cur == rr && rr.is_some() => v.push(pos),
            _ => segments.push((rr, vec![pos])),
        }
    }
    let body = html! {
        div class="head" {
            div class="grow" {
                div class="crumbs" {
                    (link(ctx, "/", html! { "Runs" })) " / " (link(ctx, &format!("/runs/{}", r.id), html! { "#" (r.id) " " (r.name) })) " / prompt " (p.index)
                }
                h1 { (p.id) }
                div class="runhead" {
                    @if let Some(c) = &p.category { span class="chip" { (c) } }
                    span class="chip" { (p.prompt_len) " prompt + " (ids.len().saturating_sub(plen)) " continuation tokens" }
                    span class="chip" { (rounds) " replayed rounds · τ = " (fmt((rounds > 0).then(|| tokens as f64 / rounds as f64))) }
                    span class="chip" { (accepted) " draft tokens accepted" }
                    span class="chip mono" title="prompt sha256" { (p.sha256.chars().take(16).collect::<String>()) }
                }
            }
            @if !ctx.report {
                div class="actions" {
                    @if let Some(pv) = v.prev { a class="btn" href=(format!("/runs/{}/prompts/{pv}", r.id)) { "← Prompt " (pv) } }
                    @if let Some(nx) = v.next { a class="btn" href=(format!("/runs/{}/prompts/{nx}", r.id)) { "Prompt " (nx) " →" } }
                }
            }
        }
        @if v.vocab.is_none() {
            div class="note" { "No vocabulary is stored for this run's tokenizer: tokens are shown as ids." }
        }
        div class="panel" {
            div class="legend-tokens" {
                span { span class="swatch tok pre" { "token" } " prefill / anchor" }
                span { span class="swatch tok acc" { "token" } " accepted draft" }
                span { span class="swatch tok rej" { "token" } " first rejected draft" }
                span { span class="swatch tok bonus" { "token" } " target's bonus token" }
                span class="hint" { "a₀ = first completion anchor, a₍ᵢ₊₁₎ = aᵢ + A(aᵢ) + 1 · click any token to see the drafter's top-" (kk) " at that anchor" }
            }
            div class="text" {
                @if plen > 0 {
                    span class="prompt" {
                        @for pos in 0..plen.min(ids.len()) { (running(&piece(v.vocab, ids[pos]))) }
                    }
                }
                @for (rr, seg) in &segments {
                    span class=[rr.map(|_| "round")] {
                        @for &pos in seg {
                            @let t = piece(v.vocab, ids[pos]);
                            @match role[pos] {
                                Role::Prefill => { (tok(pos, "pre", &t, format!("position {pos}: first completion token (prefill) · anchor a₀"))) }
                                Role::Accepted(i) => { (tok(pos, "acc", &t, format!("position {pos}: accepted draft token, round {}", i + 1))) }
                                Role::Bonus(i, rej) => {
                                    @if let Some(d) = rej {
                                        span class="tok rej" title=(format!("position {pos}: the drafter proposed this; the target disagreed")) { (running(&piece(v.vocab, d))) }
                                    }
                                    (tok(pos, "bonus", &t, format!("position {pos}: target's token (bonus) ending round {}; next anchor", i + 1)))
                                }
                                _ => { (tok(pos, "", &t, format!("position {pos}"))) }
                            }
                        }
                    }
                }
            }
        }
        @if let (Some(a), Some(b)) = (selected, sel_block) {
            @let acc = v.records.accepted_len(b);
            div class="panel flush" id="topk" {
                div style="padding:14px 16px 4px" {
                    h2 { "Anchor " (a) span class="sub" {
                        "A = " (acc) " accepted · "
                        @match on_chain.get(&a) { Some(i) => { "round " (i + 1) " of the replayed decode" } None => { "not visited by the replayed decode (uniform-anchor evaluation only)" } }
                    } }
                    div class="sub" { "The drafter saw the taps of positions < " (a) " and the block [y" sub { (a) } ", MASK × " (g) "]. Its top-" (kk) " candidates per position, with probabilities:" }
                }
                table class="topk" {
                    thead { tr { th class="num" { "k" } th class="num" { "pos" } th { "Target token" } th { "Drafter top-" (kk) } th { "Outcome" } } }
                    tbody {
                        @for k in 1..=g {
                            @let i = v.records.pos_index(b, k);
                            @let valid = v.records.valid[i] == 1;
                            @let t = v.records.target[i];
                            tr {
                                td class="num" { (k) }
                                td class="num sub" { (a as usize + k) }
                                td { @if valid { span class="cand" { (visible(&piece(v.vocab, t))) } } @else { span class="sub" { "past the end" } } }
                                td {
                                    @for j in 0..kk {
                                        @let id = v.records.draft_ids[i * kk + j];
                                        @let prob = (v.records.draft_logprobs[i * kk + j] as f64).exp();
                                        span class=(if valid && id == t { "cand hit" } else { "cand" }) {
                                            (visible(&piece(v.vocab, id)))
                                            span class="p" { (format!("{:.0}%", prob * 100.0)) }
                                        }
                                    }
                                }
                                td {
                                    @if !valid { span class="sub" { "—" } }
                                    @else if k <= acc { span class="chip complete" { "accepted" } }
                                    @else if k == acc + 1 { span class="chip failed" { "rejected" } }
                                    @else { span class="sub" { "after the first miss" } }
                                }
                            }
                        }
                    }
                }
            }
        } @else if v.records.num_blocks() == 0 {
            div class="note" { "No records are stored for this prompt." }
        }
    };
    page(ctx, &format!("{} · prompt {}", r.name, p.index), body)
}
