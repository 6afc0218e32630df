//! Text tokenizer of the target model: a Hugging Face `tokenizers::Tokenizer`, loaded either from a
//! Hugging Face folder (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`) or
//! rebuilt from a GGUF file's `tokenizer.ggml.*` metadata (docs/models.md §3.7).
//!
//! The GGUF path builds the `tokenizer.json` document that Hugging Face would ship for the same
//! vocabulary (byte-level BPE vocab + merges, the pre-tokenizer llama.cpp names in
//! `tokenizer.ggml.pre`, control tokens as special added tokens) and loads it with
//! `Tokenizer::from_str`, so both paths run the same, well-tested tokenizer code. The result is
//! checked against llama.cpp's golden token ids (`crates/engine/tests/tokenizer_golden.rs`).
//!
//! Conventions (those of `transformers`):
//! - `encode(text, add_special)`: `add_special` adds what the post-processor adds (BOS when the
//!   model wants it). Special tokens written in the text (`<|im_start|>`) are always recognised,
//!   which is what a rendered chat template needs.
//! - `encode_chat` renders the chat template and encodes with `add_special = false`, like
//!   `apply_chat_template(tokenize=True)`: the template writes the BOS itself when it wants one.
//!
//! This module holds [`TextTokenizer`] and the Hugging Face folder path; `gguf.rs` rebuilds the
//! `tokenizer.json` document from GGUF metadata.

mod gguf;

pub use gguf::GgufTokenizerParts;

use crate::chat::{ChatMessage, ChatTemplate};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Token texts that end generation when they are special tokens of the vocabulary: llama.cpp's
/// end-of-generation list (`special_eog_ids` in `src/llama-vocab.cpp`), which also matches the
/// `eos_token_id` lists of the models' `generation_config.json` (e.g. Qwen: `<|im_end|>` and
/// `<|endoftext|>`).
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// The target model's tokenizer plus what the evaluation needs around it (BOS, end-of-generation
/// ids, chat template, a fingerprint for cache keys).
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// File or folder the tokenizer was loaded from (for error messages).
    source: PathBuf,
    /// Number of token ids (largest id + 1), added tokens included.
    n_ids: usize,
    /// Rows of the model's embedding when it pads the vocabulary past `n_ids` (Qwen: 151,936
    /// rows for 151,669 ids): ids in `n_ids..model_vocab` decode as empty text.
    model_vocab: Option<usize>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eos_ids: Vec<u32>,
    chat_template: Option<String>,
    /// Where the chat template came from, e.g. "m.gguf: tokenizer.chat_template".
    chat_template_source: String,
    /// [`TextTokenizer::fingerprint`], computed on first use.
    fingerprint: OnceLock<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("source", &self.source)
            .field("n_ids", &self.n_ids)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// What a loader (GGUF or Hugging Face folder) hands to [`TextTokenizer::assemble`].
struct Assembly<'a> {
    inner: tokenizers::Tokenizer,
    /// The file or folder loaded (named in errors).
    source: &'a Path,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    /// Further end-of-generation ids (GGUF EOT/EOM, `generation_config.json`).
    extra_eos: Vec<u32>,
    chat_template: Option<String>,
    /// Where the template came from, for error messages.
    chat_template_source: String,
    /// Token ids the source declares (the largest id + 1).
    declared_ids: usize,
}

impl TextTokenizer {
    /// Loads a Hugging Face tokenizer folder: `tokenizer.json` (required), `tokenizer_config.json`
    /// (BOS/EOS tokens, chat template), `chat_template.jinja` (takes precedence over the config's
    /// template, as in transformers) and `generation_config.json` (further EOS ids).
    pub fn from_hf_dir(dir: &Path) -> Result<TextTokenizer> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            bail!("{}: no tokenizer.json in this folder", dir.display());
        }
        let inner = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| anyhow!("{}: cannot load tokenizer: {e}", tok_path.display()))?;

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_json_if_present(&cfg_path)?;
        let cfg_str = |key: &str| -> Option<String> {
            // Either "<s>" or an AddedToken object {"content": "<s>", ...}.
            match cfg.as_ref()?.get(key)? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let lookup = |key: &str| -> Result<Option<u32>> {
            match cfg_str(key) {
                None => Ok(None),
                Some(t) => inner.token_to_id(&t).map(Some).with_context(|| {
                    format!(
                        "{}: {key} {t:?} is not in tokenizer.json",
                        cfg_path.display()
                    )
                }),
            }
        };
        let bos_id = lookup("bos_token")?;
        let eos_id = lookup("eos_token")?;

        let mut extra_eos = Vec::new();
        let gen_path = dir.join("generation_config.json");
        if let Some(gen) = read_json_if_present(&gen_path)? {
            match gen.get("eos_token_id") {
                Some(Value::Number(v)) => extra_eos.extend(v.as_u64()),
                Some(Value::Array(vs)) => extra_eos.extend(vs.iter().filter_map(Value::as_u64)),
                _ => {}
            }
        }
        let extra_eos = extra_eos.into_iter().map(|v| v as u32).collect();

        let jinja_path = dir.join("chat_template.jinja");
        let (template, template_source) = if jinja_path.is_file() {
            let t = std::fs::read_to_string(&jinja_path)
                .with_context(|| format!("{}: cannot read", jinja_path.display()))?;
            (Some(t), jinja_path.display().to_string())
        } else {
            let t = match cfg.as_ref().and_then(|c| c.get("chat_template")) {
                Some(Value::String(s)) => Some(s.clone()),
                // Named templates: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            };
            (t, format!("{}: chat_template", cfg_path.display()))
        };
        // Model ids need not be contiguous: the count is the largest id + 1.
        let n = inner
            .get_vocab(false)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        TextTokenizer::assemble(Assembly {
            inner,
            source: dir,
            bos_id,
            eos_id,
            extra_eos,
            chat_template: template,
            chat_template_source: template_source,
            declared_ids: n,
        })
    }

    /// The checks and the end-of-generation set shared by both loaders.
    fn assemble(a: Assembly<'_>) -> Result<TextTokenizer> {
        let Assembly {
            inner,
            source,
            bos_id,
            eos_id,
            extra_eos,
            chat_template,
            chat_template_source,
            declared_ids,
        } = a;
        // Added tokens may sit past the model vocabulary (or past padding): count by largest id.
        let added = inner.get_added_tokens_decoder();
        let max_added = added.keys().copied().max().map_or(0, |m| m as usize + 1);
        let n_ids = declared_ids.max(max_added);

        let mut eos: BTreeSet<u32> = eos_id.into_iter().chain(extra_eos).collect();
        // o200k_harmony (gpt-oss): `<|end|>` closes a message (the analysis channel's, before the
        // final one), not the generation, which ends at `<|return|>` or `<|call|>` (gpt-oss's
        // generation_config.json). llama.cpp drops `<|end|>` from its end-of-generation ids when
        // both are present (src/llama-vocab.cpp, the o200k_harmony workaround); so does draftlens.
        let special = |t: &str| inner.token_to_id(t).filter(|id| added.contains_key(id));
        let harmony = special("<|return|>").is_some() && special("<|call|>").is_some();
        for text in END_OF_GENERATION_TEXTS {
            if harmony && *text == "<|end|>" {
                continue;
            }
            if let Some(id) = inner.token_to_id(text) {
                // Only as a special/added token: a plain vocabulary entry that happens to read
                // "<EOT>" is text, not a stop signal.
                if added.contains_key(&id) {
                    eos.insert(id);
                }
            }
        }

        // Fail at load on a template minijinja cannot parse, naming the file and line.
        if let Some(t) = &chat_template {
            ChatTemplate::new(chat_template_source.clone(), t.clone())?;
        }

        if let Some(bad) = eos.iter().find(|&&id| id as usize >= n_ids) {
            bail!(
                "{}: end-of-generation token id {bad} is outside the vocabulary ({n_ids} ids)",
                source.display()
            );
        }
        let eos_ids: Vec<u32> = eos.into_iter().collect();

        Ok(TextTokenizer {
            inner,
            source: source.to_path_buf(),
            n_ids,
            model_vocab: None,
            bos_id,
            eos_id,
            eos_ids,
            chat_template,
            chat_template_source,
            fingerprint: OnceLock::new(),
        })
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS as the tokenizer's post-processor says
    /// (for GGUF: BOS only when `tokenizer.ggml.add_bos_token` is true). Special tokens written in
    /// `text` are always recognised.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| anyhow!("{}: cannot encode text: {e}", self.source.display()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included (`skip_special_tokens = false`).
    ///
    /// Ids past the tokenizer but inside the model's padded vocabulary
    /// ([`TextTokenizer::set_model_vocab`]) decode as empty text, as transformers does: an
    /// untrained model may well pick them. Ids past the model's vocabulary are an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let limit = self.model_vocab.unwrap_or(0).max(self.n_ids);
        // The tokenizers crate silently drops unknown ids; an id no model row exists for means a
        // bug or a mismatched model, so say so.
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= limit) {
            let model = match self.model_vocab {
                Some(v) if v > self.n_ids => format!(" and the model's vocabulary {v}"),
                _ => String::new(),
            };
            bail!(
                "{}: cannot decode token id {bad}: the tokenizer has {} ids{model}",
                self.source.display(),
                self.n_ids
            );
        }
        // Padded ids: empty text, as the tokenizers crate does for ids it does not know.
        let known: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| (id as usize) < self.n_ids)
            .collect();
        self.inner
            .decode(&known, false)
            .map_err(|e| anyhow!("{}: cannot decode ids: {e}", self.source.display()))
    }

    /// Record the model's vocabulary size (embedding rows), so padded ids decode as empty text.
    /// Callers check it first ([`TextTokenizer::check_vocab`]).
    pub fn set_model_vocab(&mut self, rows: usize) {
        self.model_vocab = Some(rows);
    }

    /// Number of token ids (largest id + 1, added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.n_ids
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The declared EOS token (`tokenizer.ggml.eos_token_id` / `eos_token`).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Every token that ends generation: EOS, EOT/EOM, `generation_config.json`'s `eos_token_id`
    /// and the special tokens of llama.cpp's end-of-generation list present in the vocabulary
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, …). Sorted, no duplicates.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// Where the chat template came from, e.g. "m.gguf: tokenizer.chat_template" (for errors).
    pub fn chat_template_source(&self) -> &str {
        &self.chat_template_source
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes token `id` stands for, where a token can be part of a character: the tokens of
    /// a byte-level BPE (GPT-2's byte-to-unicode alphabet, decoder `ByteLevel`) and byte-fallback
    /// tokens `<0xNN>`. `None` for other tokens (their text is [`TextTokenizer::decode`]'s).
    /// The web UI's drill-down merges such bytes across tokens into characters.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let t = self.inner.id_to_token(id)?;
        if let Some(hex) = t.strip_prefix("<0x").and_then(|r| r.strip_suffix('>')) {
            if hex.len() == 2 {
                return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
            }
        }
        let byte_level = self
            .inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|s| s.contains("\"ByteLevel\""));
        if !byte_level {
            return None;
        }
        // GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100.. in
        // byte order.
        t.chars()
            .map(|c| {
                let u = c as u32;
                let printable = |b: u32| {
                    (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
                };
                if u < 256 && printable(u) {
                    return Some(u as u8);
                }
                let k = u.checked_sub(256)? as usize;
                (0u32..256)
                    .filter(|&b| !printable(b))
                    .nth(k)
                    .map(|b| b as u8)
            })
            .collect()
    }

    /// The wrapped Hugging Face tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The file or folder the tokenizer came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Hex sha256 over a canonical serialisation of everything that decides which ids a chat
    /// prompt becomes and where generation stops: the tokenizer (as `tokenizer.json` with sorted
    /// keys), BOS, the end-of-generation ids and the chat template.
    ///
    /// Computed on first use (serialising Qwen's tokenizer takes ~0.5 s; `inspect` never needs
    /// it). tokenizers serialises deterministically (vocab and added tokens in id order, merges
    /// in rank order, maps with sorted keys), so its JSON is the canonical form.
    pub fn fingerprint(&self) -> String {
        self.fingerprint
            .get_or_init(|| {
                let canonical = self.inner.to_string(false).unwrap_or_else(|e| {
                    // Cannot happen for a tokenizer that loaded; stay deterministic anyway.
                    tracing::error!("{}: cannot serialise tokenizer: {e}", self.source.display());
                    format!("unserialisable tokenizer {}: {e}", self.source.display())
                });
                fingerprint_of(
                    &canonical,
                    self.bos_id,
                    &self.eos_ids,
                    self.chat_template.as_deref(),
                )
            })
            .clone()
    }

    /// Renders the chat template (with this tokenizer's BOS/EOS token texts).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat_with(messages, add_generation_prompt, &Map::new())
    }

    /// [`render_chat`](Self::render_chat) with extra template variables (e.g. `enable_thinking`).
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
    ) -> Result<String> {
        let text = self.chat_template.as_ref().with_context(|| {
            format!(
                "{}: the tokenizer has no chat template; give one or use raw prompts",
                self.source.display()
            )
        })?;
        let template = ChatTemplate::new(self.chat_template_source.clone(), text.clone())?;
        let tok_text = |id: Option<u32>| {
            id.and_then(|i| self.inner.id_to_token(i))
                .unwrap_or_default()
        };
        template.render_with(
            messages,
            add_generation_prompt,
            &tok_text(self.bos_id),
            &tok_text(self.eos_id),
            extra,
        )
    }

    /// Renders the chat template and encodes the result without adding special tokens, like
    /// `apply_chat_template(..., tokenize=True)`.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let text = self.render_chat(messages, add_generation_prompt)?;
        self.encode(&text, false)
    }

    /// Errors when the tokenizer can produce ids the model has no embedding row for. Fewer
    /// tokenizer ids than rows is normal (embeddings are padded, e.g. Qwen's 151,936 rows).
    /// `file` names the model in the message.
    pub fn check_vocab(&self, model_vocab_rows: usize, file: &Path) -> Result<()> {
        if self.n_ids > model_vocab_rows {
            bail!(
                "{}: tokenizer/vocab size mismatch: the tokenizer ({}) has {} token ids but the \
                 model's embedding has {} rows",
                file.display(),
                self.source.display(),
                self.n_ids,
                model_vocab_rows
            );
        }
        Ok(())
    }
}

fn read_json_if_present(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let v = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", path.display()))?;
    Ok(Some(v))
}

fn fingerprint_of(
    tokenizer_json: &str,
    bos: Option<u32>,
    eos_ids: &[u32],
    chat_template: Option<&str>,
) -> String {
    // Length-prefixed fields, so that no two different inputs hash the same bytes.
    let meta = json!({
        "format": "draftlens-tokenizer-v1",
        "bos_id": bos,
        "eos_ids": eos_ids,
        "chat_template": chat_template,
    })
    .to_string();
    let mut h = Sha256::new();
    for part in [meta.as_bytes(), tokenizer_json.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}
