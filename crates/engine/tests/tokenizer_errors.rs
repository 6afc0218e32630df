//! Bad tokenizer input gives one clear error naming the file and the problem, never a panic.
//!
//! Most cases build GGUF tokenizer metadata by hand ([`GgufTokenizerParts`]); a few write a real,
//! tiny GGUF file (header + metadata, no tensors) to go through `GgufFile` as well.

use draftlens_engine::formats::gguf::GgufFile;
use draftlens_engine::tokenizer::{GgufTokenizerParts, TextTokenizer};
use std::path::Path;

const FILE: &str = "models/tiny.gguf";

/// A valid byte-level BPE vocabulary: "ab" and " ab" are single tokens.
fn tiny() -> GgufTokenizerParts<'static> {
    GgufTokenizerParts {
        model: Some("gpt2"),
        pre: Some("smollm"),
        tokens: Some(vec![
            "<|endoftext|>",
            "a",
            "b",
            "ab",
            "Ġ",
            "Ġab",
            "1",
            "<|im_end|>",
        ]),
        token_types: Some(vec![3, 1, 1, 1, 1, 1, 1, 3]),
        merges: Some(vec!["a b", "Ġ ab"]),
        bos_id: Some(0),
        eos_id: Some(7),
        add_bos: Some(false),
        ..Default::default()
    }
}

fn err_of(parts: &GgufTokenizerParts) -> String {
    format!(
        "{:#}",
        TextTokenizer::from_gguf_parts(parts, Path::new(FILE)).unwrap_err()
    )
}

fn assert_msg(err: &str, parts: &[&str]) {
    assert!(
        err.starts_with(FILE),
        "error should start with the file name: {err}"
    );
    for p in parts {
        assert!(err.contains(p), "error should mention {p:?}: {err}");
    }
}

#[test]
fn tiny_vocab_works() {
    let tok = TextTokenizer::from_gguf_parts(&tiny(), Path::new(FILE)).unwrap();
    assert_eq!(tok.encode("ab ab", false).unwrap(), vec![3, 5]);
    assert_eq!(tok.encode("ab<|im_end|>", false).unwrap(), vec![3, 7]);
    assert_eq!(tok.decode(&[3, 5, 7]).unwrap(), "ab ab<|im_end|>");
    assert_eq!(tok.eos_ids(), vec![0, 7]);
    assert_eq!(tok.vocab_size(), 8);

    // add_bos_token = true puts BOS in front only when special tokens are asked for.
    let mut with_bos = tiny();
    with_bos.add_bos = Some(true);
    let tok = TextTokenizer::from_gguf_parts(&with_bos, Path::new(FILE)).unwrap();
    assert_eq!(tok.encode("ab", true).unwrap(), vec![0, 3]);
    assert_eq!(tok.encode("ab", false).unwrap(), vec![3]);
}

#[test]
fn missing_tokens() {
    let mut p = tiny();
    p.tokens = None;
    assert_msg(&err_of(&p), &["no tokenizer.ggml.tokens"]);
    p.tokens = Some(vec![]);
    p.token_types = None;
    assert_msg(&err_of(&p), &["tokenizer.ggml.tokens is empty"]);
}

#[test]
fn missing_merges() {
    let mut p = tiny();
    p.merges = None;
    assert_msg(&err_of(&p), &["no tokenizer.ggml.merges"]);
}

#[test]
fn malformed_and_dangling_merges() {
    let mut p = tiny();
    p.merges = Some(vec!["a b", "ab"]);
    assert_msg(
        &err_of(&p),
        &["tokenizer.ggml.merges[1]", "\"ab\"", "left right"],
    );
    // A merge of tokens that are not in the vocabulary: rejected by the BPE model.
    p.merges = Some(vec!["a b", "x y"]);
    assert_msg(
        &err_of(&p),
        &["tokenizer.ggml.merges[1] = \"x y\": \"x\" is not in tokenizer.ggml.tokens"],
    );
}

#[test]
fn unknown_pre_tokenizer() {
    let mut p = tiny();
    p.pre = Some("deepseek-coder");
    assert_msg(
        &err_of(&p),
        &[
            "unsupported tokenizer.ggml.pre \"deepseek-coder\"",
            "smollm",
        ],
    );
    p.pre = None;
    assert_msg(&err_of(&p), &["no tokenizer.ggml.pre"]);
}

#[test]
fn unsupported_tokenizer_model() {
    let mut p = tiny();
    p.model = Some("llama");
    assert_msg(
        &err_of(&p),
        &["unsupported tokenizer.ggml.model \"llama\"", "gpt2"],
    );
}

#[test]
fn token_type_length_mismatch() {
    let mut p = tiny();
    p.token_types = Some(vec![3, 1, 1]);
    assert_msg(
        &err_of(&p),
        &[
            "tokenizer.ggml.token_type has 3 entries",
            "tokenizer.ggml.tokens has 8",
        ],
    );
}

#[test]
fn special_token_id_out_of_range() {
    let mut p = tiny();
    p.eos_id = Some(8);
    assert_msg(
        &err_of(&p),
        &["tokenizer.ggml.eos_token_id = 8 is out of range (8 tokens)"],
    );
    let mut p = tiny();
    p.bos_id = None;
    p.add_bos = Some(true);
    assert_msg(
        &err_of(&p),
        &["add_bos_token is true but there is no bos_token_id"],
    );
}

#[test]
fn tokenizer_vocab_size_mismatch() {
    let tok = TextTokenizer::from_gguf_parts(&tiny(), Path::new(FILE)).unwrap();
    tok.check_vocab(8, Path::new(FILE)).unwrap();
    tok.check_vocab(1000, Path::new(FILE)).unwrap();
    let err = tok
        .check_vocab(7, Path::new("models/other.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("models/other.gguf: tokenizer/vocab size mismatch"),
        "{err}"
    );
    assert!(
        err.contains("8 token ids") && err.contains("7 rows"),
        "{err}"
    );
}

#[test]
fn decode_out_of_range_id() {
    let tok = TextTokenizer::from_gguf_parts(&tiny(), Path::new(FILE)).unwrap();
    let err = tok.decode(&[3, 99]).unwrap_err().to_string();
    assert_msg(&err, &["cannot decode token id 99", "8 ids"]);
}

#[test]
fn chat_template_syntax_error() {
    let mut p = tiny();
    p.chat_template = Some("{% for m in messages %}\n{{ m.content }\n{% endfor %}");
    assert_msg(
        &err_of(&p),
        &[
            "models/tiny.gguf: tokenizer.chat_template: chat template syntax error",
            "line 2",
        ],
    );
}

#[test]
fn no_chat_template() {
    let tok = TextTokenizer::from_gguf_parts(&tiny(), Path::new(FILE)).unwrap();
    let err = tok.render_chat(&[], true).unwrap_err().to_string();
    assert_msg(&err, &["no chat template"]);
}

// ---- through real files ----

enum Kv<'a> {
    Str(&'a str),
    U32(u32),
    StrArray(&'a [&'a str]),
    I32Array(&'a [i32]),
}

/// A GGUF v3 file with the given metadata and no tensors.
fn write_gguf(path: &Path, kvs: &[(&str, Kv)]) {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes()); // tensors
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, v) in kvs {
        string(&mut out, key);
        match v {
            Kv::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
            Kv::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Kv::StrArray(a) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for s in *a {
                    string(&mut out, s);
                }
            }
            Kv::I32Array(a) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for x in *a {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn gguf_file_round_trip_and_type_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let tokens = ["<|endoftext|>", "a", "b", "ab", "Ġ", "Ġab"];
    let good = |extra: Option<(&'static str, Kv<'static>)>| {
        let mut kvs = vec![
            ("general.architecture", Kv::Str("llama")),
            ("tokenizer.ggml.model", Kv::Str("gpt2")),
            ("tokenizer.ggml.pre", Kv::Str("smollm")),
            ("tokenizer.ggml.tokens", Kv::StrArray(&tokens)),
            (
                "tokenizer.ggml.token_type",
                Kv::I32Array(&[3, 1, 1, 1, 1, 1]),
            ),
            ("tokenizer.ggml.merges", Kv::StrArray(&["a b", "Ġ ab"])),
            ("tokenizer.ggml.eos_token_id", Kv::U32(0)),
        ];
        if let Some((k, v)) = extra {
            kvs.retain(|(key, _)| *key != k);
            kvs.push((k, v));
        }
        kvs
    };
    write_gguf(&path, &good(None));
    let file = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&file, &path).unwrap();
    assert_eq!(tok.encode("ab ab", false).unwrap(), vec![3, 5]);

    // tokens stored as an integer array: a type error naming the key.
    write_gguf(
        &path,
        &good(Some(("tokenizer.ggml.tokens", Kv::I32Array(&[1, 2])))),
    );
    let file = GgufFile::open(&path).unwrap();
    let err = format!("{:#}", TextTokenizer::from_gguf(&file, &path).unwrap_err());
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(
        err.contains("tokenizer.ggml.tokens should be an array of strings"),
        "{err}"
    );

    // A model file without any tokenizer metadata.
    write_gguf(&path, &[("general.architecture", Kv::Str("llama"))]);
    let file = GgufFile::open(&path).unwrap();
    let err = format!("{:#}", TextTokenizer::from_gguf(&file, &path).unwrap_err());
    assert!(err.contains("no tokenizer.ggml.tokens"), "{err}");
}

#[test]
fn hf_folder_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let err = TextTokenizer::from_hf_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&d) && err.contains("no tokenizer.json"),
        "{err}"
    );

    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3").unwrap();
    let err = TextTokenizer::from_hf_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.json: cannot load tokenizer"),
        "{err}"
    );

    // A valid tokenizer.json (the tiny GGUF one), with a config naming an unknown EOS token.
    let tok = TextTokenizer::from_gguf_parts(&tiny(), Path::new(FILE)).unwrap();
    tok.inner()
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "</s>"}"#,
    )
    .unwrap();
    let err = TextTokenizer::from_hf_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json: eos_token \"</s>\" is not in tokenizer.json"),
        "{err}"
    );

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [7, 151645]}"#,
    )
    .unwrap();
    let err = TextTokenizer::from_hf_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("end-of-generation token id 151645 is outside the vocabulary (8 ids)"),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();

    std::fs::write(dir.path().join("tokenizer_config.json"), "{not json").unwrap();
    let err = format!("{:#}", TextTokenizer::from_hf_dir(dir.path()).unwrap_err());
    assert!(
        err.contains("tokenizer_config.json: not valid JSON"),
        "{err}"
    );

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>", "chat_template": "{% if %}"}"#,
    )
    .unwrap();
    let err = TextTokenizer::from_hf_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json: chat_template: chat template syntax error"),
        "{err}"
    );
}
