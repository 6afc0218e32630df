//! Chat templates rendered by draftlens (minijinja) against transformers' own renders.
//!
//! tests/fixtures/tokenizer/chat_templates.json holds, for every template of llama.cpp's
//! `models/templates/` (llama-cpp-python 0.3.36 sdist) plus SmolLM2's, the output of
//! `transformers.utils.chat_template_utils.render_jinja_template` (transformers 5.17.0,
//! jinja2 3.1.6) for a few conversations, or the error transformers raised. Regenerate with
//! `scripts/fetch-tokenizer-fixtures.sh --chat-goldens <python with transformers>`.
//!
//! The templates of the models draftlens targets are committed (tests/fixtures/tokenizer/templates/)
//! and must match exactly; the rest are read from data/tokenizer/templates/ when fetched and must
//! match too unless listed in `KNOWN_DIFFERENCES` with the reason.

use draftlens_engine::chat::{ChatMessage, ChatTemplate};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Templates that must be present (committed) and match on every conversation.
const REQUIRED: &[&str] = &[
    "SmolLM2-135M-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen3.5-4B.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
];

/// (template, reason) for templates whose render differs from transformers'. Each entry must still
/// differ (a fixed difference should leave this list).
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    // Tool-use-only templates: `{% for tool in tools %}` with `tools = None`. Jinja2 raises
    // "TypeError: 'NoneType' object is not iterable"; minijinja iterates none as empty and renders.
    // draftlens never passes tools, and such a template is not usable without them in either engine.
    (
        "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
        "for-loop over tools=None",
    ),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        "for-loop over tools=None",
    ),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "for-loop over tools=None",
    ),
];

fn load_messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

#[test]
fn chat_templates_render_like_transformers() {
    let root = repo_root();
    let golden_path = root.join("tests/fixtures/tokenizer/chat_templates.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&golden_path).unwrap()).unwrap();
    let bos = doc["bos_token"].as_str().unwrap();
    let eos = doc["eos_token"].as_str().unwrap();
    let conversations: BTreeMap<String, Vec<ChatMessage>> = doc["conversations"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), load_messages(v)))
        .collect();
    let dirs = [
        root.join("tests/fixtures/tokenizer/templates"),
        root.join("data/tokenizer/templates"),
    ];

    let mut per_template: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut missing = BTreeMap::new();
    let mut failures = Vec::new();
    let (mut matched_ok, mut matched_err) = (0, 0);
    for case in doc["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let Some(path) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) else {
            *missing.entry(name.to_string()).or_insert(0) += 1;
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let messages = &conversations[case["conversation"].as_str().unwrap()];
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let extra = case["extra"].as_object().unwrap();
        let got = ChatTemplate::new(path.display().to_string(), text)
            .and_then(|t| t.render_with(messages, gen, bos, eos, extra));
        let entry = per_template.entry(name.to_string()).or_insert((0, 0));
        entry.1 += 1;
        let label = format!("{name} / {} / gen={gen} / {extra:?}", case["conversation"]);
        match (&got, case.get("expected").and_then(Value::as_str)) {
            (Ok(out), Some(want)) if out == want => {
                entry.0 += 1;
                matched_ok += 1;
            }
            // transformers refused this input (raise_exception, missing variable): so must we.
            (Err(_), None) => {
                entry.0 += 1;
                matched_err += 1;
            }
            (Ok(out), Some(want)) => failures.push(format!(
                "{label}: render differs\n--- transformers\n{want}\n--- draftlens\n{out}"
            )),
            (Err(e), Some(_)) => failures.push(format!("{label}: draftlens error: {e:#}")),
            (Ok(_), None) => failures.push(format!(
                "{label}: transformers raised {:?} but draftlens rendered",
                case["error"].as_str().unwrap_or("")
            )),
        }
    }

    for (name, (ok, n)) in &per_template {
        eprintln!("{name}: {ok}/{n}");
    }
    eprintln!(
        "templates: {} checked, {} not fetched (run scripts/fetch-tokenizer-fixtures.sh); cases: {} identical renders, {} refused by both, {} differ",
        per_template.len(),
        missing.len(),
        matched_ok,
        matched_err,
        failures.len()
    );
    for r in REQUIRED {
        assert!(
            !missing.contains_key(*r),
            "{r} must be committed in tests/fixtures/tokenizer/templates"
        );
    }
    for (t, why) in KNOWN_DIFFERENCES {
        if per_template.contains_key(*t) {
            assert!(
                failures.iter().any(|f| f.starts_with(&format!("{t} /"))),
                "{t} is listed as a known difference ({why}) but now renders like transformers"
            );
        }
    }
    let unexplained: Vec<&String> = failures
        .iter()
        .filter(|f| {
            !KNOWN_DIFFERENCES
                .iter()
                .any(|(t, _)| f.starts_with(&format!("{t} /")))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} unexplained differences:\n{}",
        unexplained.len(),
        unexplained
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}
