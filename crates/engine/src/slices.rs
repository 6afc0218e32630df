//! Workload slices applied to a prompt set (docs/slices.md): `--category` / `--language` keep the
//! prompts the set tags so, `--prompt-format chat|raw` rewrites every prompt into one form, and
//! `--thinking on|off` sets the chat template's `enable_thinking` switch on every prompt.
//!
//! The slice is applied to the prompts themselves, before anything is tokenized, so what follows
//! needs no slice of its own: token ids (and so every cache key) follow from the rewritten
//! prompts, [`Prompt::hash`] covers the thinking switch, and the run's identity stores the slice
//! ([`PromptSet::slice`], read by `RunIdentity`). The stored form and the facets are
//! `draftlens_results::slice`.

use crate::chat::ChatMessage;
use crate::prompts::{Prompt, PromptSet};
use crate::tokenizer::TextTokenizer;
use anyhow::{bail, Context, Result};
pub use draftlens_results::slice::{PromptFormat, Slice};

/// The template variable `--thinking` sets (Qwen3-style templates; HF's `apply_chat_template`
/// passes it the same way, as an extra keyword).
pub const THINKING_SWITCH: &str = "enable_thinking";

/// Applies `slice` to `set` (see the module doc). Errors, each naming the set: a category or
/// language that no prompt has (listing the ones it has), thinking asked for with raw prompts.
/// The default slice leaves the set as it is.
pub fn apply(slice: &Slice, set: &mut PromptSet) -> Result<()> {
    let source = set.source.display().to_string();
    if let Some(want) = &slice.category {
        keep_tagged(set, &source, "category", want, |p| p.category.as_deref())?;
    }
    if let Some(want) = &slice.language {
        keep_tagged(set, &source, "language", want, |p| p.language.as_deref())?;
    }
    if let Some(format) = slice.prompt_format {
        for p in &mut set.prompts {
            to_format(p, format);
        }
    }
    if let Some(on) = slice.thinking {
        if slice.prompt_format == Some(PromptFormat::Raw) {
            bail!(
                "--thinking {} needs chat prompts: --prompt-format raw renders no chat template, so there is no \
                 thinking switch to set",
                on_off(on)
            );
        }
        for p in &mut set.prompts {
            if !p.is_chat() {
                bail!(
                    "{source}: prompt {:?} is raw text: --thinking sets the chat template's switch and applies only \
                     to chat prompts (add --prompt-format chat to send every prompt through the template)",
                    p.id
                );
            }
            p.enable_thinking = Some(on);
        }
    }
    set.slice = slice.clone();
    Ok(())
}

/// Keeps the prompts whose tag (`what`: category or language) equals `want`.
fn keep_tagged(
    set: &mut PromptSet,
    source: &str,
    what: &str,
    want: &str,
    tag: impl Fn(&Prompt) -> Option<&str>,
) -> Result<()> {
    let mut present: Vec<&str> = set.prompts.iter().filter_map(&tag).collect();
    present.sort_unstable();
    present.dedup();
    if !present.contains(&want) {
        if present.is_empty() {
            bail!("{source}: --{what} {want}: the set's prompts carry no {what}");
        }
        bail!(
            "{source}: --{what} {want} matches no prompt (the set's {what} values: {})",
            present.join(", ")
        );
    }
    set.prompts.retain(|p| tag(p) == Some(want));
    Ok(())
}

/// Rewrites `p` into `format`: a raw prompt becomes one user message; a chat prompt becomes the
/// contents of its messages joined by a blank line (roles are dropped: raw text has none).
fn to_format(p: &mut Prompt, format: PromptFormat) {
    match (format, p.text.take(), p.messages.take()) {
        (PromptFormat::Chat, Some(text), None) => p.messages = Some(vec![ChatMessage::user(text)]),
        (PromptFormat::Raw, None, Some(messages)) => {
            let contents: Vec<String> = messages.into_iter().map(|m| m.content).collect();
            p.text = Some(contents.join("\n\n"));
        }
        (_, text, messages) => {
            p.text = text;
            p.messages = messages;
        }
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// Errors unless `tok`'s chat template has the thinking switch (reads [`THINKING_SWITCH`]).
pub fn check_thinking_switch(tok: &TextTokenizer, on: bool) -> Result<()> {
    let Some(template) = tok.chat_template() else {
        bail!(
            "{}: --thinking {}: the tokenizer has no chat template, so there is no thinking switch",
            tok.source().display(),
            on_off(on)
        );
    };
    if !template.contains(THINKING_SWITCH) {
        bail!(
            "{}: --thinking {}: this chat template has no thinking switch (it never reads `{THINKING_SWITCH}`, the \
             variable Qwen3-style templates use); leave --thinking out for this target",
            tok.chat_template_source(),
            on_off(on)
        );
    }
    Ok(())
}

/// Errors when a prompt of `set` sets the thinking switch and `tok`'s template has none: checked
/// before a run is created, so a refused slice stores nothing.
pub fn check_set(set: &PromptSet, tok: &TextTokenizer) -> Result<()> {
    match set.prompts.iter().find_map(|p| p.enable_thinking) {
        Some(on) => check_thinking_switch(tok, on),
        None => Ok(()),
    }
}

/// The token ids of chat `messages` with the thinking switch set to `on` (generation prompt on),
/// like `apply_chat_template(messages, add_generation_prompt=True, enable_thinking=on)`.
pub fn encode_chat_thinking(
    tok: &TextTokenizer,
    messages: &[ChatMessage],
    on: bool,
) -> Result<Vec<u32>> {
    check_thinking_switch(tok, on)?;
    let mut extra = serde_json::Map::new();
    extra.insert(THINKING_SWITCH.into(), serde_json::Value::Bool(on));
    let text = tok
        .render_chat_with(messages, true, &extra)
        .context("rendering the chat template with the thinking switch")?;
    tok.encode(&text, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn prompt(id: &str, chat: bool, category: Option<&str>, language: Option<&str>) -> Prompt {
        Prompt {
            id: id.into(),
            text: (!chat).then(|| format!("text of {id}")),
            messages: chat.then(|| {
                vec![
                    ChatMessage::system("be brief"),
                    ChatMessage::user(format!("question {id}")),
                ]
            }),
            category: category.map(String::from),
            language: language.map(String::from),
            completion: None,
            enable_thinking: None,
        }
    }

    fn set(prompts: Vec<Prompt>) -> PromptSet {
        PromptSet {
            name: "t".into(),
            source: PathBuf::from("t.jsonl"),
            sha256: "s".into(),
            prompts,
            slice: Slice::default(),
        }
    }

    fn ids(set: &PromptSet) -> Vec<&str> {
        set.prompts.iter().map(|p| p.id.as_str()).collect()
    }

    #[test]
    fn default_slice_changes_nothing() {
        let mut s = set(vec![
            prompt("a", true, Some("x"), None),
            prompt("b", false, None, None),
        ]);
        let before = s.clone();
        apply(&Slice::default(), &mut s).unwrap();
        assert_eq!(s, before);
    }

    #[test]
    fn category_and_language_keep_their_prompts_in_order() {
        let mut s = set(vec![
            prompt("a", true, Some("math"), Some("en")),
            prompt("b", true, Some("code"), Some("en")),
            prompt("c", true, Some("math"), Some("zh")),
            prompt("d", true, Some("math"), Some("en")),
        ]);
        let slice = Slice {
            category: Some("math".into()),
            language: Some("en".into()),
            ..Default::default()
        };
        apply(&slice, &mut s).unwrap();
        assert_eq!(ids(&s), ["a", "d"]);
        assert_eq!(s.slice, slice);
    }

    #[test]
    fn a_filter_matching_nothing_is_one_error_listing_the_values() {
        let mut s = set(vec![
            prompt("a", true, Some("math"), None),
            prompt("b", true, Some("code"), None),
        ]);
        let e = apply(
            &Slice {
                category: Some("poetry".into()),
                ..Default::default()
            },
            &mut s,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "t.jsonl: --category poetry matches no prompt (the set's category values: code, math)"
        );
        let e = apply(
            &Slice {
                language: Some("en".into()),
                ..Default::default()
            },
            &mut s,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "t.jsonl: --language en: the set's prompts carry no language"
        );
    }

    #[test]
    fn formats_rewrite_prompts_and_their_hashes() {
        let mut s = set(vec![
            prompt("a", true, None, None),
            prompt("b", false, None, None),
        ]);
        let hashes: Vec<String> = s.prompts.iter().map(Prompt::hash).collect();
        let mut raw = s.clone();
        apply(
            &Slice {
                prompt_format: Some(PromptFormat::Raw),
                ..Default::default()
            },
            &mut raw,
        )
        .unwrap();
        assert_eq!(
            raw.prompts[0].text.as_deref(),
            Some("be brief\n\nquestion a")
        );
        assert!(raw.prompts[0].messages.is_none());
        assert_eq!(raw.prompts[1], s.prompts[1], "a raw prompt stays as it is");
        assert_ne!(raw.prompts[0].hash(), hashes[0]);

        apply(
            &Slice {
                prompt_format: Some(PromptFormat::Chat),
                ..Default::default()
            },
            &mut s,
        )
        .unwrap();
        assert_eq!(
            s.prompts[1].messages.as_deref(),
            Some(&[ChatMessage::user("text of b")][..])
        );
        assert!(s.prompts[1].text.is_none());
        assert_eq!(
            s.prompts[0].hash(),
            hashes[0],
            "a chat prompt stays as it is"
        );
        assert_ne!(s.prompts[1].hash(), hashes[1]);
    }

    #[test]
    fn thinking_sets_the_switch_and_refuses_raw_prompts() {
        let mut s = set(vec![prompt("a", true, None, None)]);
        let before = s.prompts[0].hash();
        apply(
            &Slice {
                thinking: Some(false),
                ..Default::default()
            },
            &mut s,
        )
        .unwrap();
        assert_eq!(s.prompts[0].enable_thinking, Some(false));
        assert_ne!(
            s.prompts[0].hash(),
            before,
            "the switch is part of what the model sees"
        );

        let mut mixed = set(vec![
            prompt("a", true, None, None),
            prompt("b", false, None, None),
        ]);
        let e = apply(
            &Slice {
                thinking: Some(true),
                ..Default::default()
            },
            &mut mixed,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.jsonl: prompt \"b\" is raw text")
                && e.contains("--prompt-format chat"),
            "{e}"
        );

        let e = apply(
            &Slice {
                thinking: Some(true),
                prompt_format: Some(PromptFormat::Raw),
                ..Default::default()
            },
            &mut set(vec![prompt("a", true, None, None)]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--prompt-format raw renders no chat template"),
            "{e}"
        );
    }
}
