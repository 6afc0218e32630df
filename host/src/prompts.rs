//! Prompt sets: JSONL files of prompts, and the built-in sets installed by
//! `scripts/setup-fixtures.sh` (`builtin:humaneval`, `builtin:mtbench`, `builtin:gsm8k`).
//!
//! One JSON object per line:
//!
//! ```text
//! {"id": "q1", "prompt": "raw text, fed to the target as is (no chat template)"}
//! {"id": "q2", "messages": [{"role": "user", "content": "rendered with the model's chat template"}],
//!  "category": "math", "completion": "optional reference answer"}
//! ```
//!
//! Rules, each broken rule is an error `"<file>:<line>: <problem>"`:
//! * `id`: a non-empty string (an integer is accepted and used as its decimal string, since
//!   several public sets number their questions), unique in the file;
//! * exactly one of `prompt` (non-empty string) or `messages` (non-empty array of
//!   `{"role", "content"}` strings; role one of system/developer/user/assistant/tool);
//! * `category`, `completion`: optional strings (`null` is the same as absent);
//! * other keys are ignored, so files exported by other tools load unchanged;
//! * blank lines are skipped; a UTF-8 byte-order mark at the start of the file is skipped.
//!
//! `completion` is a reference answer kept for reports; draftlens never feeds it to the target:
//! the continuation that drafters are scored on is always the target's own greedy output.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A chat message of a prompt (the chat module's type, re-exported for callers of this module).
pub use crate::chat::ChatMessage;

/// Roles accepted in `messages`; anything else is almost always a typo that a chat template would
/// silently drop or reject much later.
pub const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Names accepted after `builtin:`.
pub const BUILTIN_SETS: &[&str] = &["humaneval", "mtbench", "gsm8k"];

/// One prompt. Exactly one of `text` (raw, no chat template) and `messages` (chat) is `Some`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    pub id: String,
    pub text: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub category: Option<String>,
    /// Reference answer from the data set, if any. Never fed to the model.
    pub completion: Option<String>,
}

/// What [`Prompt::hash`] hashes. Field order is fixed by this struct, so the JSON is canonical
/// whatever serde_json features other crates enable.
#[derive(Serialize)]
struct HashedContent<'a> {
    prompt: Option<&'a str>,
    messages: Option<Vec<HashedMessage<'a>>>,
}
#[derive(Serialize)]
struct HashedMessage<'a> {
    role: &'a str,
    content: &'a str,
}

impl Prompt {
    /// sha256 (lowercase hex) of the canonical JSON `{"prompt": text|null, "messages": [...]|null}`.
    ///
    /// Only what the model sees counts: `id`, `category` and `completion` are left out, so a prompt
    /// keeps its hash when it is renamed or re-categorised, and runs over different prompt files
    /// can be matched prompt by prompt.
    pub fn hash(&self) -> String {
        let content = HashedContent {
            prompt: self.text.as_deref(),
            messages: self.messages.as_ref().map(|ms| {
                ms.iter()
                    .map(|m| HashedMessage {
                        role: &m.role,
                        content: &m.content,
                    })
                    .collect()
            }),
        };
        let json = serde_json::to_vec(&content).expect("serialising strings to JSON cannot fail");
        crate::util::sha256_bytes(&json)
    }

    /// True when the prompt goes through the chat template.
    pub fn is_chat(&self) -> bool {
        self.messages.is_some()
    }
}

/// A loaded prompt set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptSet {
    /// `humaneval` for `builtin:humaneval`, the file stem for a path.
    pub name: String,
    /// The JSONL file the prompts came from.
    pub source: PathBuf,
    /// sha256 of the whole file (before any [`PromptSet::truncate`]).
    pub sha256: String,
    pub prompts: Vec<Prompt>,
}

impl PromptSet {
    /// Loads `spec`: either `builtin:<name>` (resolved to `<data_dir>/prompts/<name>.jsonl`) or the
    /// path of a JSONL file.
    pub fn load(spec: &str, data_dir: &Path) -> Result<PromptSet> {
        match spec.strip_prefix("builtin:") {
            Some(name) => {
                if !BUILTIN_SETS.contains(&name) {
                    bail!(
                        "{spec}: unknown built-in prompt set (available: {})",
                        BUILTIN_SETS
                            .iter()
                            .map(|n| format!("builtin:{n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                let path = data_dir.join("prompts").join(format!("{name}.jsonl"));
                if !path.is_file() {
                    bail!(
                        "{spec}: {} not found; run scripts/setup-fixtures.sh from the repository root to \
                         install the built-in prompt sets",
                        path.display()
                    );
                }
                let mut set = Self::load_path(&path)?;
                set.name = name.to_string();
                Ok(set)
            }
            None => Self::load_path(Path::new(spec)),
        }
    }

    /// Loads a JSONL file. The set is named after the file stem.
    pub fn load_path(path: &Path) -> Result<PromptSet> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("{}: cannot read prompt file", path.display()))?;
        let prompts = parse_jsonl(path, &bytes)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(PromptSet {
            name,
            source: path.to_path_buf(),
            sha256: crate::util::sha256_bytes(&bytes),
            prompts,
        })
    }

    /// Keeps the first `n` prompts (the CLI's `--limit`). The order is the file's order, so a
    /// limited run is a prefix of the full run and its caches are reused.
    pub fn truncate(&mut self, n: usize) {
        self.prompts.truncate(n);
    }

    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }
}

/// Parses a whole JSONL file. `path` is used only in error messages.
fn parse_jsonl(path: &Path, bytes: &[u8]) -> Result<Vec<Prompt>> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut prompts = Vec::new();
    // id -> line of its first occurrence, for the duplicate message.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let lineno = i + 1;
        let at = || format!("{}:{lineno}", path.display());
        let line = std::str::from_utf8(raw)
            .map_err(|e| anyhow::anyhow!("{}: not valid UTF-8 ({e})", at()))?;
        if line.trim().is_empty() {
            continue;
        }
        let prompt = parse_line(line).map_err(|problem| anyhow::anyhow!("{}: {problem}", at()))?;
        if let Some(first) = seen.get(&prompt.id) {
            bail!(
                "{}: duplicate id {:?} (first used on line {first})",
                at(),
                prompt.id
            );
        }
        seen.insert(prompt.id.clone(), lineno);
        prompts.push(prompt);
    }
    if prompts.is_empty() {
        bail!(
            "{}: no prompts (the file is empty or has only blank lines)",
            path.display()
        );
    }
    Ok(prompts)
}

/// Parses one non-blank line; the error is the problem without the location.
fn parse_line(line: &str) -> std::result::Result<Prompt, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err(format!(
            "expected a JSON object, found {}",
            type_name(&value)
        ));
    };

    let id = match obj.get("id") {
        None | Some(Value::Null) => return Err("missing \"id\"".into()),
        Some(Value::String(s)) if s.trim().is_empty() => return Err("\"id\" is empty".into()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        Some(other) => {
            return Err(format!(
                "\"id\" must be a string, found {}",
                type_name(other)
            ))
        }
    };

    let text = opt_string(&obj, "prompt")?;
    let messages = match obj.get("messages") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_messages(v)?),
    };
    match (&text, &messages) {
        (Some(_), Some(_)) => {
            return Err("has both \"prompt\" and \"messages\"; give exactly one".into())
        }
        (None, None) => {
            return Err("has neither \"prompt\" nor \"messages\"; give exactly one".into())
        }
        (Some(t), None) if t.is_empty() => return Err("\"prompt\" is empty".into()),
        _ => {}
    }

    Ok(Prompt {
        id,
        text,
        messages,
        category: opt_string(&obj, "category")?,
        completion: opt_string(&obj, "completion")?,
    })
}

fn parse_messages(v: &Value) -> std::result::Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = v else {
        return Err(format!(
            "\"messages\" must be an array, found {}",
            type_name(v)
        ));
    };
    if items.is_empty() {
        return Err("\"messages\" is empty".into());
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(m) = item else {
                return Err(format!(
                    "messages[{i}] must be an object, found {}",
                    type_name(item)
                ));
            };
            let field = |name: &str| match m.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                None | Some(Value::Null) => Err(format!("messages[{i}] has no \"{name}\"")),
                Some(other) => Err(format!(
                    "messages[{i}].{name} must be a string, found {}",
                    type_name(other)
                )),
            };
            let role = field("role")?;
            if !ROLES.contains(&role.as_str()) {
                return Err(format!(
                    "messages[{i}].role {role:?} is not one of {}",
                    ROLES.join(", ")
                ));
            }
            Ok(ChatMessage {
                role,
                content: field("content")?,
            })
        })
        .collect()
}

fn opt_string(obj: &Map<String, Value>, key: &str) -> std::result::Result<Option<String>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "\"{key}\" must be a string, found {}",
            type_name(other)
        )),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
