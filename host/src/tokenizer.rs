//! Text tokenizer of the target model: a Hugging Face `tokenizers::Tokenizer`, loaded either from a
//! Hugging Face folder (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`) or
//! rebuilt from a GGUF file's `tokenizer.ggml.*` metadata (docs/models.md §3.7).
//!
//! The GGUF path builds the `tokenizer.json` document that Hugging Face would ship for the same
//! vocabulary (byte-level BPE vocab + merges, the pre-tokenizer llama.cpp names in
//! `tokenizer.ggml.pre`, control tokens as special added tokens) and loads it with
//! `Tokenizer::from_str`, so both paths run the same, well-tested tokenizer code. The result is
//! checked against llama.cpp's golden token ids (`host/tests/tokenizer_golden.rs`).
//!
//! Conventions (those of `transformers`):
//! - `encode(text, add_special)`: `add_special` adds what the post-processor adds (BOS when the
//!   model wants it). Special tokens written in the text (`<|im_start|>`) are always recognised,
//!   which is what a rendered chat template needs.
//! - `encode_chat` renders the chat template and encodes with `add_special = false`, like
//!   `apply_chat_template(tokenize=True)`: the template writes the BOS itself when it wants one.

use crate::chat::{ChatMessage, ChatTemplate};
use crate::formats::gguf::{GgufFile, GgufValue};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

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

/// GPT-2's pre-tokenizer regex with llama.cpp's case-insensitive contractions, as used by
/// LLaMA-3 (`llama-bpe`): numbers in groups of up to three digits.
const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2/Qwen3: as LLaMA-3 but every digit on its own.
const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.*` metadata of a GGUF file that the tokenizer is built from. Separate from
/// [`GgufFile`] so that the construction can be tested on hand-made metadata.
#[derive(Clone, Debug, Default)]
pub struct GgufTokenizerParts<'a> {
    /// `tokenizer.ggml.model` (only `"gpt2"`, byte-level BPE, is supported).
    pub model: Option<&'a str>,
    /// `tokenizer.ggml.pre`: llama.cpp's pre-tokenizer name.
    pub pre: Option<&'a str>,
    pub tokens: Option<Vec<&'a str>>,
    /// `tokenizer.ggml.token_type`, one per token (optional in the format: all normal if absent).
    pub token_types: Option<Vec<i64>>,
    /// `"left right"` strings.
    pub merges: Option<Vec<&'a str>>,
    pub bos_id: Option<u64>,
    pub eos_id: Option<u64>,
    /// `tokenizer.ggml.eot_token_id` / `eom_token_id`: further end-of-generation tokens.
    pub eot_id: Option<u64>,
    pub eom_id: Option<u64>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub chat_template: Option<&'a str>,
    /// `tokenizer.huggingface.json`: the original `tokenizer.json`, when the converter kept it.
    pub hf_json: Option<&'a str>,
}

impl<'a> GgufTokenizerParts<'a> {
    /// Reads the tokenizer keys. A key that is present with the wrong type is an error here; a
    /// missing key is left `None` (whether it is required is decided when building).
    pub fn read(file: &'a GgufFile) -> Result<GgufTokenizerParts<'a>> {
        let p = file.path().display();
        let wrong = |key: &str, want: &str| {
            let have = file
                .metadata()
                .get(key)
                .map(GgufValue::type_name)
                .unwrap_or("?");
            anyhow!("{p}: metadata {key} should be {want} but is {have}")
        };
        let present = |key: &str| file.metadata().contains_key(key);
        let str_ = |key: &str| -> Result<Option<&'a str>> {
            match file.get_str(key) {
                Some(s) => Ok(Some(s)),
                None if present(key) => Err(wrong(key, "a string")),
                None => Ok(None),
            }
        };
        let strs = |key: &str| -> Result<Option<Vec<&'a str>>> {
            match file.get_str_array(key) {
                Some(s) => Ok(Some(s)),
                None if present(key) => Err(wrong(key, "an array of strings")),
                None => Ok(None),
            }
        };
        let uint = |key: &str| -> Result<Option<u64>> {
            match file.get_u64(key) {
                Some(v) => Ok(Some(v)),
                None if present(key) => Err(wrong(key, "a non-negative integer")),
                None => Ok(None),
            }
        };
        let boolean = |key: &str| -> Result<Option<bool>> {
            match file.get_bool(key) {
                Some(v) => Ok(Some(v)),
                None if present(key) => Err(wrong(key, "a bool")),
                None => Ok(None),
            }
        };
        let token_types = match file.get_i64_array("tokenizer.ggml.token_type") {
            Some(v) => Some(v),
            None if present("tokenizer.ggml.token_type") => {
                return Err(wrong("tokenizer.ggml.token_type", "an array of integers"))
            }
            None => None,
        };
        Ok(GgufTokenizerParts {
            model: str_("tokenizer.ggml.model")?,
            pre: str_("tokenizer.ggml.pre")?,
            tokens: strs("tokenizer.ggml.tokens")?,
            token_types,
            merges: strs("tokenizer.ggml.merges")?,
            bos_id: uint("tokenizer.ggml.bos_token_id")?,
            eos_id: uint("tokenizer.ggml.eos_token_id")?,
            eot_id: uint("tokenizer.ggml.eot_token_id")?,
            eom_id: uint("tokenizer.ggml.eom_token_id")?,
            add_bos: boolean("tokenizer.ggml.add_bos_token")?,
            add_eos: boolean("tokenizer.ggml.add_eos_token")?,
            chat_template: str_("tokenizer.chat_template")?,
            hf_json: str_("tokenizer.huggingface.json")?,
        })
    }
}

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
    /// Builds the tokenizer from a GGUF file's `tokenizer.*` metadata. `path` names the file in
    /// errors.
    pub fn from_gguf(file: &GgufFile, path: &Path) -> Result<TextTokenizer> {
        let parts = GgufTokenizerParts::read(file)?;
        TextTokenizer::from_gguf_parts(&parts, path)
    }

    /// Builds the tokenizer from GGUF tokenizer metadata (see [`GgufTokenizerParts`]).
    pub fn from_gguf_parts(parts: &GgufTokenizerParts, path: &Path) -> Result<TextTokenizer> {
        let p = path.display();
        let tokens = parts
            .tokens
            .as_ref()
            .with_context(|| format!("{p}: GGUF metadata has no tokenizer.ggml.tokens"))?;
        if tokens.is_empty() {
            bail!("{p}: tokenizer.ggml.tokens is empty");
        }
        let n = tokens.len();
        let id_key = |key: &str, id: Option<u64>| -> Result<Option<u32>> {
            match id {
                None => Ok(None),
                Some(id) if (id as usize) < n => Ok(Some(id as u32)),
                Some(id) => bail!("{p}: {key} = {id} is out of range ({n} tokens)"),
            }
        };
        let bos_id = id_key("tokenizer.ggml.bos_token_id", parts.bos_id)?;
        let eos_id = id_key("tokenizer.ggml.eos_token_id", parts.eos_id)?;
        let eot_id = id_key("tokenizer.ggml.eot_token_id", parts.eot_id)?;
        let eom_id = id_key("tokenizer.ggml.eom_token_id", parts.eom_id)?;

        let inner = match parts.hf_json {
            // The converter kept the original tokenizer.json: prefer it (docs/models.md §3.7).
            Some(doc) => tokenizers::Tokenizer::from_str(doc)
                .map_err(|e| anyhow!("{p}: cannot load tokenizer.huggingface.json: {e}"))?,
            None => {
                let doc = hf_document_from_gguf(parts, tokens, bos_id, eos_id, path)?;
                tokenizers::Tokenizer::from_str(&doc).map_err(|e| {
                    anyhow!("{p}: cannot build a tokenizer from the GGUF vocab: {e}")
                })?
            }
        };

        let template_source = format!("{p}: tokenizer.chat_template");
        TextTokenizer::assemble(Assembly {
            inner,
            source: path,
            bos_id,
            eos_id,
            extra_eos: [eot_id, eom_id].into_iter().flatten().collect(),
            chat_template: parts.chat_template.map(str::to_string),
            chat_template_source: template_source,
            declared_ids: n,
        })
    }

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
        for text in END_OF_GENERATION_TEXTS {
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

/// The `tokenizer.json` document Hugging Face would ship for this GGUF vocabulary (docs/models.md §3.7).
fn hf_document_from_gguf(
    parts: &GgufTokenizerParts,
    tokens: &[&str],
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    path: &Path,
) -> Result<String> {
    let p = path.display();
    match parts.model {
        Some("gpt2") => {}
        Some(other) => bail!(
            "{p}: unsupported tokenizer.ggml.model {other:?} (only \"gpt2\", byte-level BPE, is supported)"
        ),
        None => bail!("{p}: GGUF metadata has no tokenizer.ggml.model"),
    }
    let merges = parts
        .merges
        .as_ref()
        .with_context(|| format!("{p}: GGUF metadata has no tokenizer.ggml.merges"))?;
    if let Some(types) = &parts.token_types {
        if types.len() != tokens.len() {
            bail!(
                "{p}: tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                types.len(),
                tokens.len()
            );
        }
    }
    let pre = parts.pre.with_context(|| {
        format!("{p}: GGUF metadata has no tokenizer.ggml.pre (pre-tokenizer name)")
    })?;
    let PreTokenizer {
        normalizer,
        pre_tokenizer,
        ignore_merges,
        default_add_bos,
    } = pre_tokenizer_for(pre)
        .with_context(|| format!("{p}: unsupported tokenizer.ggml.pre {pre:?}"))?;

    // Vocab: token text -> id. llama.cpp keeps the *last* id of a duplicated text in its
    // text->id map; a JSON object does the same, so duplicates behave as in llama.cpp.
    let distinct: HashSet<&str> = tokens.iter().copied().collect();
    if distinct.len() != tokens.len() {
        tracing::warn!(
            "{p}: tokenizer.ggml.tokens has {} duplicated texts; only their last id is reachable by encoding",
            tokens.len() - distinct.len()
        );
    }
    // Checked here so that the error names the merge, not a column of the generated JSON.
    for (i, m) in merges.iter().enumerate() {
        let Some((left, right)) = m.split_once(' ') else {
            bail!("{p}: tokenizer.ggml.merges[{i}] = {m:?} is not of the form \"left right\"");
        };
        for side in [left, right] {
            if !distinct.contains(side) {
                bail!("{p}: tokenizer.ggml.merges[{i}] = {m:?}: {side:?} is not in tokenizer.ggml.tokens");
            }
        }
    }

    let mut added = Vec::new();
    for (id, &ty) in parts.token_types.iter().flatten().enumerate() {
        let special = match ty {
            TOKEN_TYPE_CONTROL => true,
            TOKEN_TYPE_USER_DEFINED => false,
            _ => continue,
        };
        added.push(json!({
            "id": id,
            "content": tokens[id],
            "single_word": false,
            "lstrip": false,
            "rstrip": false,
            // llama.cpp stores control and user-defined tokens pre-normalised (as text): match
            // them in the raw input.
            "normalized": false,
            "special": special,
        }));
    }

    // Post-processor: ByteLevel (offsets only) then BOS/EOS as the GGUF asks.
    let add_bos = parts.add_bos.unwrap_or(default_add_bos);
    let add_eos = parts.add_eos.unwrap_or(false);
    let mut post = vec![
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}),
    ];
    if add_bos || add_eos {
        let mut specials = Map::new();
        let mut special = |key: &str, id: Option<u32>| -> Result<Value> {
            let id = id.with_context(|| {
                format!(
                    "{p}: tokenizer.ggml.add_{key}_token is true but there is no {key}_token_id"
                )
            })?;
            let text = tokens[id as usize];
            specials.insert(
                text.to_string(),
                json!({"id": text, "ids": [id], "tokens": [text]}),
            );
            Ok(json!(text))
        };
        let bos = if add_bos {
            Some(special("bos", bos_id)?)
        } else {
            None
        };
        let eos = if add_eos {
            Some(special("eos", eos_id)?)
        } else {
            None
        };
        // [BOS] $A [EOS]; pairs repeat it for $B with type id 1 (what HF's LLaMA-3 file does).
        let wrap = |seq: &str, type_id: u32| -> Vec<Value> {
            let tok = |t: &Value| json!({"SpecialToken": {"id": t, "type_id": type_id}});
            bos.iter()
                .map(tok)
                .chain([json!({"Sequence": {"id": seq, "type_id": type_id}})])
                .chain(eos.iter().map(tok))
                .collect()
        };
        let single = wrap("A", 0);
        let pair: Vec<Value> = wrap("A", 0).into_iter().chain(wrap("B", 1)).collect();
        post.push(json!({
            "type": "TemplateProcessing",
            "single": single,
            "pair": pair,
            "special_tokens": specials,
        }));
    }

    let doc = HfDocument {
        version: "1.0",
        truncation: Value::Null,
        padding: Value::Null,
        added_tokens: added,
        normalizer,
        pre_tokenizer,
        post_processor: json!({"type": "Sequence", "processors": post}),
        decoder: json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
        model: HfBpe {
            kind: "BPE",
            dropout: None,
            unk_token: None,
            continuing_subword_prefix: None,
            end_of_word_suffix: None,
            fuse_unk: false,
            byte_fallback: false,
            ignore_merges,
            vocab: VocabInIdOrder(tokens),
            merges,
        },
    };
    serde_json::to_string(&doc)
        .with_context(|| format!("{p}: cannot serialise the tokenizer document"))
}

/// A `tokenizer.json` document. Typed rather than a `serde_json::Value` so that the vocab and
/// merges (150k entries each for Qwen) are written straight from the GGUF strings.
#[derive(Serialize)]
struct HfDocument<'a> {
    version: &'static str,
    truncation: Value,
    padding: Value,
    added_tokens: Vec<Value>,
    normalizer: Value,
    pre_tokenizer: Value,
    post_processor: Value,
    decoder: Value,
    model: HfBpe<'a>,
}

#[derive(Serialize)]
struct HfBpe<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    dropout: Option<f32>,
    unk_token: Option<&'a str>,
    continuing_subword_prefix: Option<&'a str>,
    end_of_word_suffix: Option<&'a str>,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: VocabInIdOrder<'a>,
    merges: &'a [&'a str],
}

/// `{token text: id}` in id order. A duplicated text appears twice; like llama.cpp's text->id map,
/// the reader keeps the last id.
struct VocabInIdOrder<'a>(&'a [&'a str]);

impl Serialize for VocabInIdOrder<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().enumerate().map(|(id, t)| (*t, id)))
    }
}

struct PreTokenizer {
    normalizer: Value,
    pre_tokenizer: Value,
    /// LLaMA-3: a pre-token that is itself in the vocab is emitted whole, merges are not
    /// consulted (HF `ignore_merges`, llama.cpp `ignore_merges` for the LLAMA3 pre type).
    ignore_merges: bool,
    /// llama.cpp's default for `add_bos` when the GGUF does not say.
    default_add_bos: bool,
}

/// The Hugging Face normalizer/pre-tokenizer equivalent to llama.cpp's pre-tokenizer type
/// (`llama_vocab::impl::load`, `src/llama-vocab.cpp`; regexes in `unicode.cpp`).
fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizer> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    Ok(match pre {
        // llama.cpp: `\p{N}` isolated, then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" => PreTokenizer {
            normalizer: Value::Null,
            pre_tokenizer: json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]}),
            ignore_merges: false,
            default_add_bos: false,
        },
        // llama.cpp writes "gpt-2" (the name of its test vocab); "gpt2" is the same type.
        "gpt2" | "gpt-2" => PreTokenizer {
            normalizer: Value::Null,
            pre_tokenizer: byte_level(true),
            ignore_merges: false,
            default_add_bos: false,
        },
        "qwen2" => PreTokenizer {
            normalizer: json!({"type": "NFC"}),
            pre_tokenizer: json!({"type": "Sequence", "pretokenizers": [
                split(QWEN2_SPLIT_REGEX),
                byte_level(false),
            ]}),
            ignore_merges: false,
            default_add_bos: false,
        },
        "llama-bpe" | "llama3" | "llama-v3" => PreTokenizer {
            normalizer: Value::Null,
            pre_tokenizer: json!({"type": "Sequence", "pretokenizers": [
                split(LLAMA3_SPLIT_REGEX),
                byte_level(false),
            ]}),
            ignore_merges: true,
            default_add_bos: true,
        },
        _ => bail!(
            "no Hugging Face equivalent is implemented (supported: smollm, starcoder, refact, \
             gpt2/gpt-2, qwen2, llama-bpe/llama3)"
        ),
    })
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
