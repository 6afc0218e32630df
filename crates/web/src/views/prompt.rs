//! Drill-down: one prompt of one run, its continuation coloured by replayed round (accepted
//! draft tokens, the first rejected draft token next to the target's token, bonus token) and
//! the drafter's top-K per position for any anchor. Token text is untrusted: maud escapes it.

use super::{fmt, link, page, Ctx};
use draftlens_records::RecordBatch;
use draftlens_results::metrics::replay_chain;
use draftlens_results::store::{RunInfo, RunPrompt};
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

/// Marks a stored piece that is only part of a character: U+E000 then its bytes in hex
/// (written by `draftlens run`, crates/engine/src/drafter/vocab.rs).
const BYTES_MARK: char = '\u{E000}';

/// The bytes of a partial-character piece, if `s` is one.
fn partial_bytes(s: &str) -> Option<Vec<u8>> {
    let hex = s.strip_prefix(BYTES_MARK)?;
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A token's text on its own (top-K tables): a partial character shows its bytes.
fn piece(v: Option<&[String]>, id: u32) -> String {
    match v.and_then(|v| v.get(id as usize)) {
        Some(s) => match partial_bytes(s) {
            Some(b) => format!(
                "⟨{}⟩",
                b.iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            None => s.clone(),
        },
        None => format!("⟨{id}⟩"),
    }
}

/// Most tokens one character can span (UTF-8 has at most 4 bytes per character).
const MAX_MERGE: usize = 4;

/// The text of each token of `ids` in running text: consecutive partial-character tokens are
/// merged until their bytes decode as UTF-8; the first token of such a group shows the whole
/// text and the others `None` (they stay separate elements, so token boundaries remain
/// visible). Bytes that never complete a character show as hex.
pub(crate) fn running_texts(v: Option<&[String]>, ids: &[u32]) -> Vec<Option<String>> {
    let partial = |i: usize| {
        v.and_then(|v| v.get(ids[i] as usize))
            .and_then(|s| partial_bytes(s))
    };
    let mut out: Vec<Option<String>> = Vec::with_capacity(ids.len());
    let mut i = 0;
    while i < ids.len() {
        let Some(first) = partial(i) else {
            out.push(Some(piece(v, ids[i])));
            i += 1;
            continue;
        };
        // Grow the group while the bytes are an incomplete prefix of UTF-8.
        let mut bytes = first;
        let mut j = i + 1;
        let settled = |b: &[u8]| match std::str::from_utf8(b) {
            Ok(_) => true,
            Err(e) => e.error_len().is_some(), // invalid, not merely incomplete: stop
        };
        let mut done = settled(&bytes);
        while !done && j < ids.len() && j - i < MAX_MERGE * 2 {
            let Some(next) = partial(j) else { break };
            bytes.extend(next);
            j += 1;
            done = settled(&bytes);
        }
        match std::str::from_utf8(&bytes) {
            Ok(text) => {
                out.push(Some(text.to_string()));
                out.extend((i + 1..j).map(|_| None));
            }
            Err(_) => {
                // Not a character: each token shows its own bytes.
                out.extend((i..j).map(|k| Some(piece(v, ids[k]))));
            }
        }
        i = j;
    }
    out
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
    let texts = running_texts(v.vocab, ids);
    let tok = |pos: usize, class: &str, text: &str, title: String| -> Markup {
        let sel = selected == Some(pos as u32);
        let cont = texts[pos].is_none();
        let cls = match (sel, cont) {
            (true, true) => format!("tok {class} cont sel"),
            (true, false) => format!("tok {class} sel"),
            (false, true) => format!("tok {class} cont"),
            (false, false) => format!("tok {class}"),
        };
        let title = if cont {
            format!(
                "{title} · bytes {}, part of the character shown before",
                piece(v.vocab, ids[pos])
            )
        } else {
            title
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
                        @for pos in 0..plen.min(ids.len()) {
                            @match &texts[pos] {
                                Some(t) => { (running(t)) }
                                None => { span class="tok cont" title=(format!("position {pos} · bytes {}, part of the character shown before", piece(v.vocab, ids[pos]))) {} }
                            }
                        }
                    }
                }
                @for (rr, seg) in &segments {
                    span class=[rr.map(|_| "round")] {
                        @for &pos in seg {
                            @let t = texts[pos].clone().unwrap_or_default();
                            @match role[pos] {
                                Role::Prefill => { (tok(pos, "pre", &t, format!("position {pos}: first completion token (prefill) · anchor a₀"))) }
                                Role::Accepted(i) => { (tok(pos, "acc", &t, format!("position {pos}: accepted draft token, round {}", i + 1))) }
                                Role::Bonus(i, rej) => {
                                    @if let Some(d) = rej {
                                        span class="tok rej" title=(format!("position {pos}: the drafter proposed this; the target disagreed")) { (running(&running_texts(v.vocab, &[d])[0].clone().unwrap_or_default())) }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary as `draftlens run` stores it for a byte-level BPE: whole characters as text,
    /// partial ones as marked hex bytes.
    fn vocab_for(chunks: &[&[u8]]) -> Vec<String> {
        chunks
            .iter()
            .map(|b| match std::str::from_utf8(b) {
                Ok(s) => s.to_string(),
                Err(_) => format!(
                    "{BYTES_MARK}{}",
                    b.iter().map(|x| format!("{x:02x}")).collect::<String>()
                ),
            })
            .collect()
    }

    #[test]
    fn byte_pieces_merge_into_characters_with_boundaries_kept() {
        // Hebrew "שלום" split 1+3 / 3+1 bytes, CJK "大" split 2+1, an emoji split 1+1+2, plain
        // text between them.
        let shalom = "שלום".as_bytes(); // 8 bytes
        let da = "大".as_bytes(); // 3 bytes
        let smile = "🙂".as_bytes(); // 4 bytes
        let chunks: Vec<&[u8]> = vec![
            &shalom[..1],
            &shalom[1..4],
            &shalom[4..7],
            &shalom[7..],
            b" and ",
            &da[..2],
            &da[2..],
            &smile[..1],
            &smile[1..2],
            &smile[2..],
        ];
        let vocab = vocab_for(&chunks);
        let ids: Vec<u32> = (0..chunks.len() as u32).collect();
        let t = running_texts(Some(&vocab), &ids);
        assert_eq!(t.len(), ids.len(), "one entry per token");
        // Every token is still there; continuation tokens carry None.
        assert_eq!(t[0].as_deref(), Some("של"));
        assert_eq!(t[1], None);
        assert_eq!(t[2].as_deref(), Some("ום"));
        assert_eq!(t[3], None);
        assert_eq!(t[4].as_deref(), Some(" and "));
        assert_eq!(t[5].as_deref(), Some("大"));
        assert_eq!(t[6], None);
        assert_eq!(t[7].as_deref(), Some("🙂"));
        assert_eq!((t[8].as_ref(), t[9].as_ref()), (None, None));
        let joined: String = t.iter().flatten().cloned().collect();
        assert_eq!(joined, "שלום and 大🙂");
        assert!(!joined.contains('\u{FFFD}'));
        // Alone (top-K tables), a partial token shows its bytes.
        assert_eq!(piece(Some(&vocab), 5), "⟨e5 a4⟩");
    }

    #[test]
    fn bytes_that_never_complete_a_character_show_as_hex() {
        let vocab = vocab_for(&[&[0xe5], b"x", &[0xff]]);
        let t = running_texts(Some(&vocab), &[0, 1, 2, 0]);
        assert_eq!(
            t,
            vec![
                Some("⟨e5⟩".to_string()),
                Some("x".to_string()),
                Some("⟨ff⟩".to_string()),
                Some("⟨e5⟩".to_string())
            ]
        );
    }
}
