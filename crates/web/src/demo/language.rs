//! The synthetic language of the demo runs: a vocabulary whose tokens are easy (whitespace,
//! punctuation, keywords), common words or hard (identifiers, numbers), and seeded prompts with
//! their target continuations in three categories (code, math, chat).

use super::DemoSpec;
use crate::stats::Rng;
use draftlens_results::store::RunPrompt;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Whitespace, punctuation, keywords: drafted well.
    Easy,
    /// Common words.
    Word,
    /// Identifiers, numbers, rare words: drafted badly.
    Hard,
}

pub(super) struct Vocab {
    pub(super) pieces: Vec<String>,
    pub(super) class: Vec<Class>,
    index: HashMap<String, u32>,
}

impl Vocab {
    pub(super) fn new() -> Self {
        let mut v = Vocab {
            pieces: vec![],
            class: vec![],
            index: HashMap::new(),
        };
        for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
            v.intern(s, Class::Easy);
        }
        v
    }
    fn intern(&mut self, s: &str, c: Class) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.pieces.len() as u32;
        self.pieces.push(s.to_string());
        self.class.push(c);
        self.index.insert(s.to_string(), i);
        i
    }
}

const IDENTS: &[&str] = &[
    "items", "result", "total", "count", "values", "index", "node", "left", "right", "buffer",
    "key", "acc", "matrix", "row", "col", "prefix", "window", "seen", "queue", "stack", "graph",
    "dist", "memo", "score", "word", "chars", "pairs", "limit",
];
const FUNCS: &[&str] = &[
    "has_close_elements",
    "separate_paren_groups",
    "truncate_number",
    "below_zero",
    "mean_absolute_deviation",
    "intersperse",
    "parse_nested_parens",
    "filter_by_substring",
    "sum_product",
    "rolling_max",
    "make_palindrome",
    "string_xor",
    "longest",
    "greatest_common_divisor",
    "all_prefixes",
    "count_distinct_characters",
    "sort_numbers",
    "find_closest_elements",
];
const WORDS: &[&str] = &[
    "the", "a", "of", "to", "and", "is", "in", "that", "it", "for", "we", "this", "can", "with",
    "as", "be", "on", "are", "an", "by", "so", "if", "then", "each", "number", "list", "value",
    "first", "next", "step", "result", "answer", "all", "which", "when", "there", "one", "two",
    "more", "than", "our", "use", "here", "how", "should", "would", "like", "time", "good", "make",
    "sure", "also", "same", "way", "because", "only", "new", "some", "what", "do", "you", "your",
    "help",
];
const RARE: &[&str] = &[
    "quarterly",
    "photosynthesis",
    "itinerary",
    "Lisbon",
    "sourdough",
    "mitochondria",
    "regression",
    "Kyoto",
    "watercolor",
    "amortized",
    "Byzantine",
    "marathon",
    "espresso",
    "telescope",
    "harmonica",
    "glacier",
    "volcanic",
    "sonnet",
];

struct Sentence<'a> {
    v: &'a mut Vocab,
    ids: Vec<u32>,
}
impl Sentence<'_> {
    fn push(&mut self, s: &str, c: Class) {
        let id = self.v.intern(s, c);
        self.ids.push(id);
    }
}

fn pick<'a>(rng: &mut Rng, xs: &[&'a str]) -> &'a str {
    xs[rng.below(xs.len())]
}

/// One synthetic prompt: (category, prompt ids, continuation ids).
fn gen_prompt(
    v: &mut Vocab,
    rng: &mut Rng,
    i: usize,
    min_new: usize,
    max_new: usize,
) -> (String, Vec<u32>, Vec<u32>) {
    let cat = ["code", "math", "chat"][i % 3].to_string();
    let target_len = min_new + rng.below(max_new - min_new + 1);
    let mut s = Sentence { v, ids: vec![] };
    s.push("<|im_start|>", Class::Easy);
    s.push("user", Class::Easy);
    s.push("\n", Class::Easy);
    let func = pick(rng, FUNCS);
    match cat.as_str() {
        "code" => {
            for w in ["Write", " a", " Python", " function", " `"] {
                s.push(w, Class::Word);
            }
            s.push(func, Class::Hard);
            for w in [
                "`", " that", " takes", " a", " list", " and", " returns", " the", " answer", ".",
            ] {
                s.push(w, Class::Word);
            }
        }
        "math" => {
            let (a, b) = (2 + rng.below(90), 2 + rng.below(90));
            for w in ["What", " is"] {
                s.push(w, Class::Word);
            }
            s.push(&format!(" {a}"), Class::Hard);
            s.push(" ×", Class::Easy);
            s.push(&format!(" {b}"), Class::Hard);
            for w in [
                " plus", " the", " sum", " of", " its", " digits", "?", " Please", " reason",
                " step", " by", " step", ".",
            ] {
                s.push(w, Class::Word);
            }
        }
        _ => {
            for w in ["Plan", " a", " short", " trip", " to"] {
                s.push(w, Class::Word);
            }
            s.push(&format!(" {}", pick(rng, RARE)), Class::Hard);
            for w in [" with", " a", " focus", " on"] {
                s.push(w, Class::Word);
            }
            s.push(&format!(" {}", pick(rng, RARE)), Class::Hard);
            s.push(".", Class::Easy);
        }
    }
    s.push("<|im_end|>", Class::Easy);
    s.push("\n", Class::Easy);
    s.push("<|im_start|>", Class::Easy);
    s.push("assistant", Class::Easy);
    s.push("\n", Class::Easy);
    let prompt = std::mem::take(&mut s.ids);
    while s.ids.len() < target_len {
        match cat.as_str() {
            "code" => {
                if s.ids.is_empty() {
                    s.push("def", Class::Easy);
                    s.push(&format!(" {func}"), Class::Hard);
                    s.push("(", Class::Easy);
                    s.push(pick(rng, IDENTS), Class::Hard);
                    s.push("):", Class::Easy);
                    s.push("\n", Class::Easy);
                }
                let indent = 1 + rng.below(3);
                s.push(&"    ".repeat(indent), Class::Easy);
                match rng.below(5) {
                    0 => {
                        s.push("for", Class::Easy);
                        s.push(&format!(" {}", pick(rng, IDENTS)), Class::Hard);
                        s.push(" in", Class::Easy);
                        s.push(&format!(" {}", pick(rng, IDENTS)), Class::Hard);
                        s.push(":", Class::Easy);
                    }
                    1 => {
                        s.push("if", Class::Easy);
                        s.push(&format!(" {}", pick(rng, IDENTS)), Class::Hard);
                        s.push(" >", Class::Easy);
                        s.push(&format!(" {}", rng.below(10)), Class::Hard);
                        s.push(":", Class::Easy);
                    }
                    2 => {
                        s.push("return", Class::Easy);
                        s.push(&format!(" {}", pick(rng, IDENTS)), Class::Hard);
                    }
                    _ => {
                        s.push(pick(rng, IDENTS), Class::Hard);
                        s.push(" =", Class::Easy);
                        s.push(&format!(" {}", pick(rng, IDENTS)), Class::Hard);
                        s.push("[", Class::Easy);
                        s.push(pick(rng, IDENTS), Class::Hard);
                        s.push("]", Class::Easy);
                    }
                }
                s.push("\n", Class::Easy);
            }
            "math" => {
                let (a, b) = (rng.below(100), rng.below(100));
                for w in [pick(rng, &["First", "Next", "Then", "So"]), ","] {
                    s.push(w, Class::Word);
                }
                s.push(&format!(" {a}"), Class::Hard);
                s.push(" +", Class::Easy);
                s.push(&format!(" {b}"), Class::Hard);
                s.push(" =", Class::Easy);
                s.push(&format!(" {}", a + b), Class::Hard);
                s.push(".", Class::Easy);
                if rng.below(3) == 0 {
                    s.push("\n\n", Class::Easy);
                }
            }
            _ => {
                let n = 4 + rng.below(8);
                for j in 0..n {
                    if rng.below(7) == 0 {
                        s.push(&format!(" {}", pick(rng, RARE)), Class::Hard);
                    } else {
                        let w = pick(rng, WORDS);
                        let w = if j == 0 {
                            format!("{}{}", w[..1].to_uppercase(), &w[1..])
                        } else {
                            format!(" {w}")
                        };
                        s.push(&w, Class::Word);
                    }
                }
                s.push(".", Class::Easy);
                if rng.below(4) == 0 {
                    s.push("\n\n", Class::Easy);
                } else {
                    s.push(" ", Class::Easy);
                }
            }
        }
    }
    s.ids.truncate(target_len);
    s.push("<|im_end|>", Class::Easy);
    let cont = s.ids;
    (cat, prompt, cont)
}

pub(super) struct PromptSet {
    pub(super) prompts: Vec<(RunPrompt, Vec<Class>)>,
    pub(super) sha256: String,
}

pub(super) fn gen_prompt_set(v: &mut Vocab, spec: &DemoSpec) -> PromptSet {
    let mut rng = Rng::new(spec.seed ^ 0x5eed);
    let mut out = Vec::new();
    let mut set_hash = Sha256::new();
    for i in 0..spec.prompts {
        let (cat, prompt, cont) =
            gen_prompt(v, &mut rng, i, spec.min_new_tokens, spec.max_new_tokens);
        let prompt_text: String = prompt
            .iter()
            .map(|&t| v.pieces[t as usize].as_str())
            .collect();
        let sha = hex::encode(Sha256::digest(format!("{i}:{prompt_text}").as_bytes()));
        set_hash.update(sha.as_bytes());
        let mut ids = prompt.clone();
        ids.extend(&cont);
        let text: String = ids.iter().map(|&t| v.pieces[t as usize].as_str()).collect();
        let classes = ids.iter().map(|&t| v.class[t as usize]).collect();
        out.push((
            RunPrompt {
                index: i as u32,
                id: format!("{}/{}", cat, i),
                sha256: sha,
                category: Some(cat),
                prompt_len: prompt.len() as u32,
                token_ids: ids,
                text,
            },
            classes,
        ));
    }
    PromptSet {
        prompts: out,
        sha256: hex::encode(set_hash.finalize()),
    }
}
