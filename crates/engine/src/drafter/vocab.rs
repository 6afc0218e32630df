//! The vocabulary stored with a run: every token id's piece as text, so that the UI's drill-down
//! shows words instead of ids (docs/ui.md §4). Stored once per tokenizer and database.

use crate::tokenizer::TextTokenizer;
use anyhow::Result;
use draftlens_results::store::Store;

/// Marks a piece stored as the hex of its bytes (a token that is only part of a character).
const BYTES_MARK: char = '\u{E000}';

/// Stores the pieces of `tok` in `store` under its fingerprint, named `name` (the target's
/// path), unless they are there already: decoding 150k pieces takes a while.
pub fn store_vocab(store: &Store, tok: &TextTokenizer, name: &str) -> Result<()> {
    let fingerprint = tok.fingerprint();
    if store.has_vocab(&fingerprint)? {
        return Ok(());
    }
    store.put_vocab(&fingerprint, name, &pieces(tok))
}

/// Every id's piece as text. A token that is only part of a character (byte-level BPE, byte
/// fallback) decodes to U+FFFD; it is written as `BYTES_MARK` and its bytes in hex instead, so
/// the UI can merge it with its neighbours.
pub fn pieces(tok: &TextTokenizer) -> Vec<String> {
    use rayon::prelude::*;
    (0..tok.vocab_size() as u32)
        .into_par_iter()
        .map(|i| {
            let text = tok.decode(&[i]).unwrap_or_default();
            match tok.token_bytes(i) {
                Some(b) if text.contains('\u{FFFD}') && std::str::from_utf8(&b).is_err() => {
                    format!("{BYTES_MARK}{}", hex::encode(&b))
                }
                _ => text,
            }
        })
        .collect()
}
