//! `TextTokenizer::token_bytes` on the default target's byte-level BPE (SmolLM2, GGUF): the bytes
//! of the tokens of a Hebrew / CJK / emoji text concatenate to the text's UTF-8, including tokens
//! that are only part of a character (what the web drill-down merges; docs/ui.md §4). Needs
//! `scripts/setup-fixtures.sh`.

use draftlens_engine::formats::gguf::GgufFile;
use draftlens_engine::tokenizer::TextTokenizer;
use std::path::Path;

#[test]
fn byte_level_tokens_concatenate_to_the_text() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup-fixtures.sh first",
        path.display()
    );
    let file = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&file, &path).unwrap();
    let text = "שלום עולם, 大家好 🙂 café";
    let ids = tok.encode(text, false).unwrap();
    let mut bytes = Vec::new();
    let mut partial = 0;
    for &id in &ids {
        let b = tok
            .token_bytes(id)
            .unwrap_or_else(|| panic!("no bytes for token {id}"));
        if std::str::from_utf8(&b).is_err() {
            partial += 1;
            // What the stored vocabulary would otherwise hold for it: a replacement character.
            assert!(tok.decode(&[id]).unwrap().contains('\u{FFFD}'));
        }
        bytes.extend(b);
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    assert!(partial > 0, "expected some tokens that split a character");
}
