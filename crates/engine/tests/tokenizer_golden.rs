//! GGUF-derived tokenizers against llama.cpp's golden token ids.
//!
//! llama.cpp ships vocab-only GGUFs (`models/ggml-vocab-*.gguf`) with test strings (`.gguf.inp`,
//! separated by `\n__ggml_vocab_test__\n`) and the ids the *original Hugging Face tokenizer*
//! produced for them (`.gguf.out`, one line per string, ids separated by spaces, written by
//! `convert_hf_to_gguf_update.py` with `add_special_tokens=False`). Reproducing them from the
//! GGUF metadata alone checks our GGUF -> tokenizer.json construction end to end: vocab, merges,
//! pre-tokenizer regexes, digit splitting, NFC, `ignore_merges`.
//!
//! The .inp/.out files are committed in tests/fixtures/tokenizer/; the GGUFs (1.7–7.8 MB each)
//! are fetched into data/tokenizer/ by scripts/fetch-tokenizer-fixtures.sh.

use draftlens_engine::formats::gguf::GgufFile;
use draftlens_engine::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Case {
    text: String,
    ids: Vec<u32>,
}

fn read_cases(inp: &Path, out: &Path) -> Vec<Case> {
    let inp_text = std::fs::read_to_string(inp).unwrap();
    let out_text = std::fs::read_to_string(out).unwrap();
    // Every string is followed by the separator, so the last piece is empty.
    let mut texts: Vec<&str> = inp_text.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(
        texts.pop(),
        Some(""),
        "{}: does not end with the separator",
        inp.display()
    );
    let lines: Vec<&str> = out_text.lines().collect();
    assert_eq!(
        texts.len(),
        lines.len(),
        "{} has {} strings but {} has {} lines",
        inp.display(),
        texts.len(),
        out.display(),
        lines.len()
    );
    texts
        .into_iter()
        .zip(lines)
        .map(|(t, l)| Case {
            text: t.to_string(),
            ids: l
                .split_whitespace()
                .map(|x| {
                    x.parse()
                        .unwrap_or_else(|_| panic!("{}: bad id {x:?}", out.display()))
                })
                .collect(),
        })
        .collect()
}

/// Checks one vocab; returns (exact matches, cases). Mismatches not in `allowed` fail the test.
fn check_vocab(name: &str, expected_pre: &str, allowed: &[&str]) -> Option<(usize, usize)> {
    let root = repo_root();
    let gguf = root.join(format!("data/tokenizer/ggml-vocab-{name}.gguf"));
    let fixtures = root.join("tests/fixtures/tokenizer");
    let inp = fixtures.join(format!("ggml-vocab-{name}.gguf.inp"));
    let out = fixtures.join(format!("ggml-vocab-{name}.gguf.out"));
    assert!(
        inp.is_file() && out.is_file(),
        "{} / {} are committed fixtures and must exist",
        inp.display(),
        out.display()
    );
    if !gguf.is_file() {
        eprintln!(
            "SKIP ggml-vocab-{name}: {} is absent; run scripts/fetch-tokenizer-fixtures.sh",
            gguf.display()
        );
        return None;
    }
    let t0 = std::time::Instant::now();
    let file = GgufFile::open(&gguf).unwrap();
    let t_open = t0.elapsed();
    assert_eq!(file.get_str("tokenizer.ggml.pre"), Some(expected_pre));
    let tok = TextTokenizer::from_gguf(&file, &gguf).unwrap();
    let t_build = t0.elapsed() - t_open;
    let cases = read_cases(&inp, &out);
    let mut exact = 0;
    let mut unexpected = Vec::new();
    for c in &cases {
        // llama.cpp's test-tokenizer-0 tokenizes with add_special = false.
        let got = tok.encode(&c.text, false).unwrap();
        if got == c.ids {
            exact += 1;
            // Byte-level BPE is lossless: the golden ids must decode back to the input
            // (qwen2 normalises to NFC first; its strings are already NFC).
            assert_eq!(
                tok.decode(&got).unwrap(),
                c.text,
                "{name}: decode of {:?}",
                c.text
            );
        } else if !allowed.contains(&c.text.as_str()) {
            unexpected.push(format!("{:?}: expected {:?}, got {:?}", c.text, c.ids, got));
        }
    }
    eprintln!(
        "ggml-vocab-{name}: {exact}/{} exact matches ({} ids; GGUF open {:.0} ms, tokenizer build {:.0} ms)",
        cases.len(),
        tok.vocab_size(),
        t_open.as_secs_f64() * 1e3,
        t_build.as_secs_f64() * 1e3
    );
    assert!(
        unexpected.is_empty(),
        "{name}: {} mismatches:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    Some((exact, cases.len()))
}

#[test]
fn gpt2_vocab_matches_llama_cpp_goldens() {
    if let Some((exact, n)) = check_vocab("gpt-2", "gpt-2", &[]) {
        assert_eq!(exact, n);
    }
}

#[test]
fn starcoder_vocab_matches_llama_cpp_goldens() {
    if let Some((exact, n)) = check_vocab("starcoder", "starcoder", &[]) {
        assert_eq!(exact, n);
    }
}

#[test]
fn refact_vocab_matches_llama_cpp_goldens() {
    if let Some((exact, n)) = check_vocab("refact", "refact", &[]) {
        assert_eq!(exact, n);
    }
}

#[test]
fn qwen2_vocab_matches_llama_cpp_goldens() {
    if let Some((exact, n)) = check_vocab("qwen2", "qwen2", &[]) {
        assert_eq!(exact, n);
    }
}

#[test]
fn llama_bpe_vocab_matches_llama_cpp_goldens() {
    if let Some((exact, n)) = check_vocab("llama-bpe", "llama-bpe", &[]) {
        assert_eq!(exact, n);
    }
}
