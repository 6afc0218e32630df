//! The GGUF tokenizer's `gpt-4o` pre-tokenizer (o200k: GPT-4o, gpt-oss's o200k_harmony, Llama 4)
//! against tests/fixtures/tokenizer/gpt4o_pretokenizer.json (tools/golden/make_gpt4o_tokenizer_golden.py).
//!
//! The golden's pre-token pieces come from the o200k regex run by Python's `regex` module, its ids
//! from a plain-Python BPE over a small byte-level vocabulary whose merges were trained across
//! pre-token boundaries (so a wrong boundary changes the ids too). The tokenizer here is built
//! from GGUF-style metadata only (`tokenizer.ggml.pre = "gpt-4o"`), as for a llama.cpp file.

use draftlens_engine::tokenizer::{GgufTokenizerParts, TextTokenizer};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

const FILE: &str = "models/gpt-oss-vocab.gguf";
const TOKEN_TYPE_CONTROL: i64 = 3;

struct Golden {
    tokens: Vec<String>,
    token_types: Vec<i64>,
    merges: Vec<String>,
    /// (text, pieces, ids)
    cases: Vec<(String, Vec<String>, Vec<u32>)>,
}

fn golden() -> Golden {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer/gpt4o_pretokenizer.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let cases = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            (
                c["text"].as_str().unwrap().to_string(),
                strings(&c["pieces"]),
                ids,
            )
        })
        .collect();
    Golden {
        tokens: strings(&doc["tokens"]),
        token_types: doc["token_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap())
            .collect(),
        merges: strings(&doc["merges"]),
        cases,
    }
}

fn parts<'a>(g: &'a Golden, pre: &'a str) -> GgufTokenizerParts<'a> {
    GgufTokenizerParts {
        model: Some("gpt2"),
        pre: Some(pre),
        tokens: Some(g.tokens.iter().map(String::as_str).collect()),
        token_types: Some(g.token_types.clone()),
        merges: Some(g.merges.iter().map(String::as_str).collect()),
        ..Default::default()
    }
}

fn build(g: &Golden, pre: &str) -> TextTokenizer {
    TextTokenizer::from_gguf_parts(&parts(g, pre), Path::new(FILE)).unwrap()
}

/// `text` cut at the control tokens (which the tokenizer matches before pre-tokenizing):
/// (segment, is a control token).
fn split_specials<'t>(text: &'t str, specials: &[&str]) -> Vec<(&'t str, bool)> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let next = specials
            .iter()
            .filter_map(|s| rest.find(s).map(|at| (at, s.len())))
            .min();
        match next {
            Some((at, len)) => {
                if at > 0 {
                    out.push((&rest[..at], false));
                }
                out.push((&rest[at..at + len], true));
                rest = &rest[at + len..];
            }
            None => {
                out.push((rest, false));
                rest = "";
            }
        }
    }
    out
}

/// The pieces the built tokenizer's own pre-tokenizer cuts `text` into (raw text, not byte-level).
fn pieces_of(tok: &TextTokenizer, text: &str, specials: &[&str]) -> Vec<String> {
    let pre = tok.inner().get_pre_tokenizer().expect("a pre-tokenizer");
    let mut pieces = Vec::new();
    for (seg, special) in split_specials(text, specials) {
        if special {
            pieces.push(seg.to_string());
            continue;
        }
        let mut pts = PreTokenizedString::from(seg);
        pre.pre_tokenize(&mut pts).unwrap();
        for (_, (a, b), _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            pieces.push(seg[a..b].to_string());
        }
    }
    pieces
}

fn specials(g: &Golden) -> Vec<&str> {
    g.tokens
        .iter()
        .zip(&g.token_types)
        .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL)
        .map(|(t, _)| t.as_str())
        .collect()
}

#[test]
fn gpt4o_pre_token_pieces_match_the_o200k_regex() {
    let g = golden();
    let specials = specials(&g);
    let tok = build(&g, "gpt-4o");
    assert!(g.cases.len() >= 20);
    for (text, want, _) in &g.cases {
        let got = pieces_of(&tok, text, &specials);
        assert_eq!(&got, want, "pieces of {text:?}");
    }
}

#[test]
fn gpt4o_ids_match_the_reference_bpe() {
    let g = golden();
    let tok = build(&g, "gpt-4o");
    for (text, _, want) in &g.cases {
        assert_eq!(&tok.encode(text, false).unwrap(), want, "ids of {text:?}");
        assert_eq!(&tok.decode(want).unwrap(), text, "decode of {text:?}");
    }
}

#[test]
fn llama4_is_the_same_pre_tokenizer() {
    let g = golden();
    let tok = build(&g, "llama4");
    for (text, _, want) in &g.cases {
        assert_eq!(&tok.encode(text, false).unwrap(), want, "ids of {text:?}");
    }
}

/// llama.cpp's GPT4O type leaves `ignore_merges` off: a vocabulary token that no merge builds
/// (" qqq") is not emitted whole.
#[test]
fn gpt4o_does_not_ignore_merges() {
    let g = golden();
    let tok = build(&g, "gpt-4o");
    let qqq = tok
        .token_to_id("Ġqqq")
        .expect("the golden has the unreachable token");
    let ids = tok.encode(" qqq", false).unwrap();
    assert!(ids.len() > 1 && !ids.contains(&qqq), "{ids:?}");
}

/// llama.cpp's GPT4O type does not add BOS unless the GGUF says `add_bos_token = true`.
#[test]
fn gpt4o_adds_no_bos_by_default() {
    let g = golden();
    let bos = g.tokens.iter().position(|t| t == "<|endoftext|>").unwrap() as u64;
    let mut p = parts(&g, "gpt-4o");
    p.bos_id = Some(bos);
    let tok = TextTokenizer::from_gguf_parts(&p, Path::new(FILE)).unwrap();
    let plain = tok.encode("Hello", false).unwrap();
    assert_eq!(tok.encode("Hello", true).unwrap(), plain);

    p.add_bos = Some(true);
    let tok = TextTokenizer::from_gguf_parts(&p, Path::new(FILE)).unwrap();
    let with_bos = tok.encode("Hello", true).unwrap();
    assert_eq!(with_bos[0] as u64, bos);
    assert_eq!(&with_bos[1..], &plain[..]);
}

/// Names llama.cpp maps to the same type but whose tokenizer.json was not checked stay refused.
#[test]
fn unchecked_gpt4o_aliases_are_refused() {
    let g = golden();
    for pre in ["kanana2", "talkie"] {
        let err = format!(
            "{:#}",
            TextTokenizer::from_gguf_parts(&parts(&g, pre), Path::new(FILE)).unwrap_err()
        );
        assert!(
            err.starts_with(FILE)
                && err.contains(&format!("unsupported tokenizer.ggml.pre {pre:?}")),
            "{err}"
        );
    }
}
