//! A tokenizer from a GGUF file's `tokenizer.ggml.*` metadata (docs/models.md §3.7): the
//! `tokenizer.json` document Hugging Face would ship for the same vocabulary (byte-level BPE vocab
//! and merges, the pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`, control tokens as
//! special added tokens), loaded by the same `tokenizers` code as the Hugging Face path.

use super::{Assembly, TextTokenizer};
use crate::formats::gguf::{GgufFile, GgufValue};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;

/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// GPT-2's pre-tokenizer regex with llama.cpp's case-insensitive contractions, as used by
/// LLaMA-3 (`llama-bpe`): numbers in groups of up to three digits.
const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2/Qwen3: as LLaMA-3 but every digit on its own.
const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// OpenAI's o200k (GPT-4o; gpt-oss's o200k_harmony; Llama 4): tiktoken's `o200k_base` pat_str
/// (`tiktoken_ext/openai_public.py`), which is also the `Split` regex of those models'
/// `tokenizer.json`. llama.cpp quotes it as the "original regex from tokenizer.json" for
/// LLAMA_VOCAB_PRE_TYPE_GPT4O and runs a rewrite of it, because its own regex engine lacks
/// `\p{Lu}`-style classes (`src/llama-vocab.cpp`); the original is what Hugging Face runs.
/// Letters split at lower->upper case changes ("camelCase" -> "camel", "Case"), a contraction stays
/// on its word, digits in groups of up to three, punctuation keeps trailing newlines and slashes.
const O200K_SPLIT_REGEX: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

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
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O (`src/llama-vocab.cpp`, `llama_vocab::impl::load`):
        // "gpt-4o" is what its converter writes for GPT-4o's and gpt-oss's o200k tokenizers,
        // "llama4" for Llama 4's (transformers' Llama4Converter: TikTokenConverter with
        // O200K_PATTERN). The pre-tokenizer of their tokenizer.json: Split(o200k, Isolated), then
        // ByteLevel without regex; no normaliser. llama.cpp leaves ignore_merges and add_bos off
        // for this type (HF's TikTokenConverter sets ignore_merges, which only matters for a token
        // that no merge sequence builds; we follow llama.cpp, which reads the GGUF). llama.cpp maps
        // "kanana2" and "talkie" to the same type too; their tokenizer.json is not checked here,
        // so they stay refused.
        "gpt-4o" | "llama4" => PreTokenizer {
            normalizer: Value::Null,
            pre_tokenizer: json!({"type": "Sequence", "pretokenizers": [
                split(O200K_SPLIT_REGEX),
                byte_level(false),
            ]}),
            ignore_merges: false,
            default_add_bos: false,
        },
        _ => bail!(
            "no Hugging Face equivalent is implemented (supported: smollm, starcoder, refact, \
             gpt2/gpt-2, qwen2, llama-bpe/llama3, gpt-4o/llama4)"
        ),
    })
}
