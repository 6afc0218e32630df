//! Workload slices against real chat templates (docs/slices.md): `--thinking off` renders the
//! Qwen3 template exactly as transformers 5.17 does with `enable_thinking=False` (the goldens in
//! tests/fixtures/tokenizer/chat_templates.json, made by transformers' own renderer), the template
//! default is left alone, and templates without the switch (SmolLM2's ChatML, Llama 3.1's) are
//! refused with one error naming the template file. Plus the slice of a built-in set: MMATH's
//! MATH-500 problems in one language.

use draftlens_engine::chat::ChatMessage;
use draftlens_engine::formats::gguf::GgufFile;
use draftlens_engine::prompts::{Prompt, PromptSet};
use draftlens_engine::session::tokenize_prompt;
use draftlens_engine::slices::{apply, check_thinking_switch, PromptFormat, Slice};
use draftlens_engine::tokenizer::TextTokenizer;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Hugging Face tokenizer folder: the vocabulary of the Qwen3.5 golden GGUF (any byte-level
/// BPE encodes any text) with `template` (a file of tests/fixtures/tokenizer/templates) as its
/// chat_template.jinja.
fn tokenizer_with(template: &str, dir: &Path) -> TextTokenizer {
    let gguf = root().join("tests/fixtures/golden/qwen3_5/model.gguf");
    let file = GgufFile::open(&gguf).unwrap();
    let base = TextTokenizer::from_gguf(&file, &gguf).unwrap();
    base.inner()
        .save(dir.join("tokenizer.json"), false)
        .unwrap();
    std::fs::copy(
        root()
            .join("tests/fixtures/tokenizer/templates")
            .join(template),
        dir.join("chat_template.jinja"),
    )
    .unwrap();
    TextTokenizer::from_hf_dir(dir).unwrap()
}

/// transformers' rendering of `conversation` by `template` with `extra` (the golden file).
fn golden(template: &str, conversation: &str, extra: Value) -> (Vec<ChatMessage>, String) {
    let text = std::fs::read_to_string(root().join("tests/fixtures/tokenizer/chat_templates.json"))
        .unwrap();
    let g: Value = serde_json::from_str(&text).unwrap();
    let messages = g["conversations"][conversation]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let case = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == template
                && c["conversation"] == conversation
                && c["add_generation_prompt"] == true
                && c["extra"] == extra
        })
        .unwrap_or_else(|| panic!("no golden for {template} {conversation} {extra}"));
    (messages, case["expected"].as_str().unwrap().to_string())
}

fn chat_set(messages: Vec<ChatMessage>) -> PromptSet {
    PromptSet {
        name: "t".into(),
        source: PathBuf::from("t.jsonl"),
        sha256: "s".into(),
        prompts: vec![Prompt {
            id: "q".into(),
            text: None,
            messages: Some(messages),
            category: None,
            language: None,
            completion: None,
            enable_thinking: None,
        }],
        slice: Slice::default(),
    }
}

#[test]
fn thinking_off_renders_qwen3_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer_with("Qwen-Qwen3-0.6B.jinja", dir.path());
    let (messages, off) = golden(
        "Qwen-Qwen3-0.6B.jinja",
        "thinking_history",
        serde_json::json!({"enable_thinking": false}),
    );
    let (_, default) = golden(
        "Qwen-Qwen3-0.6B.jinja",
        "thinking_history",
        serde_json::json!({}),
    );
    assert_ne!(off, default, "the switch changes the prompt");
    assert!(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));

    let mut set = chat_set(messages);
    let unsliced = tokenize_prompt(&tok, &set.prompts[0]).unwrap();
    assert_eq!(
        unsliced,
        tok.encode(&default, false).unwrap(),
        "no slice: the template's default"
    );

    let slice = Slice {
        thinking: Some(false),
        ..Default::default()
    };
    apply(&slice, &mut set).unwrap();
    let sliced = tokenize_prompt(&tok, &set.prompts[0]).unwrap();
    assert_eq!(sliced, tok.encode(&off, false).unwrap());
    assert!(sliced.len() > unsliced.len());
}

#[test]
fn templates_without_the_switch_are_refused_naming_the_file() {
    for template in [
        "SmolLM2-135M-Instruct.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let tok = tokenizer_with(template, dir.path());
        let e = check_thinking_switch(&tok, true).unwrap_err().to_string();
        let file = dir.path().join("chat_template.jinja");
        assert_eq!(
            e,
            format!(
                "{}: --thinking on: this chat template has no thinking switch (it never reads `enable_thinking`, \
                 the variable Qwen3-style templates use); leave --thinking out for this target",
                file.display()
            ),
            "{template}"
        );
        // Tokenizing a prompt that asks for the switch fails the same way, naming the prompt.
        let mut set = chat_set(vec![ChatMessage::user("hi")]);
        apply(
            &Slice {
                thinking: Some(false),
                ..Default::default()
            },
            &mut set,
        )
        .unwrap();
        let e = format!("{:#}", tokenize_prompt(&tok, &set.prompts[0]).unwrap_err());
        assert!(
            e.starts_with("prompt q: ") && e.contains("has no thinking switch"),
            "{e}"
        );
    }
    // Qwen3.5's template has it.
    let dir = tempfile::tempdir().unwrap();
    check_thinking_switch(&tokenizer_with("Qwen3.5-4B.jinja", dir.path()), false).unwrap();
}

/// `--prompt-format raw` on a chat set: the user's text without the template, so the token ids
/// are the plain encoding of the question.
#[test]
fn raw_format_drops_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer_with("Qwen-Qwen3-0.6B.jinja", dir.path());
    let mut set = chat_set(vec![ChatMessage::user("What is the capital of France?")]);
    let chat = tokenize_prompt(&tok, &set.prompts[0]).unwrap();
    apply(
        &Slice {
            prompt_format: Some(PromptFormat::Raw),
            ..Default::default()
        },
        &mut set,
    )
    .unwrap();
    let raw = tokenize_prompt(&tok, &set.prompts[0]).unwrap();
    assert_eq!(
        raw,
        tok.encode("What is the capital of France?", true).unwrap()
    );
    assert!(raw.len() < chat.len());
}

/// The MATH-500 problems of builtin:mmath in Chinese: 311 prompts, each tagged zh and math500.
#[test]
fn mmath_math500_in_one_language() {
    let mut set = PromptSet::load("builtin:mmath").unwrap();
    let slice = Slice {
        category: Some("math500".into()),
        language: Some("zh".into()),
        ..Default::default()
    };
    apply(&slice, &mut set).unwrap();
    assert_eq!(set.len(), 311);
    assert!(set
        .prompts
        .iter()
        .all(|p| p.id.starts_with("mmath/zh/math500/")));
    assert_eq!(set.slice, slice);
    let e = apply(
        &Slice {
            language: Some("de".into()),
            ..Default::default()
        },
        &mut PromptSet::load("builtin:mmath").unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "builtin:mmath: --language de matches no prompt (the set's language values: ar, en, es, fr, ja, ko, pt, th, vi, zh)"
    );
}
