//! The built-in metric plugins, embedded in the binary (built from plugins/<name>/ by this
//! crate's build.rs), so they are there wherever draftlens runs and after `cargo install`.
//!
//! Their names are reserved: a plugin calling itself `accept-length` that is not the embedded
//! `accept-length` (same sha256) is refused before it can replace the built-in's rows.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// One embedded built-in plugin.
#[derive(Clone, Copy, Debug)]
pub struct Builtin {
    /// Its name (what `describe()` returns and `--plugin NAME` looks up).
    pub name: &'static str,
    /// The component (`.wasm` bytes).
    pub wasm: &'static [u8],
}

impl Builtin {
    /// The path shown for it in messages and stored with its rows: `builtin:NAME`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("builtin:{}", self.name))
    }

    /// sha256 of its bytes (hex).
    pub fn sha256(&self) -> &'static str {
        hashes()
            .iter()
            .find(|(_, n)| **n == self.name)
            .map(|(h, _)| h.as_str())
            .unwrap_or_default()
    }
}

static BUILTINS: &[Builtin] = include!(concat!(env!("OUT_DIR"), "/builtins.rs"));

/// Every embedded built-in plugin, sorted by name. What an installer copies out, and what
/// `--plugin NAME` finds first.
pub fn builtins() -> &'static [Builtin] {
    BUILTINS
}

/// The built-in named `name` (`-` and `_` are the same).
pub fn find(name: &str) -> Option<&'static Builtin> {
    let norm = |s: &str| s.replace('_', "-");
    BUILTINS.iter().find(|b| norm(b.name) == norm(name))
}

/// sha256 (hex) → name of every built-in.
fn hashes() -> &'static BTreeMap<String, &'static str> {
    static H: OnceLock<BTreeMap<String, &'static str>> = OnceLock::new();
    H.get_or_init(|| {
        BUILTINS
            .iter()
            .map(|b| (hex::encode(Sha256::digest(b.wasm)), b.name))
            .collect()
    })
}

/// Whether `name` is the name of a built-in plugin (reserved for it).
pub fn is_reserved(name: &str) -> bool {
    BUILTINS.iter().any(|b| b.name == name)
}

/// The built-in whose bytes have this sha256 (a copy in plugins/dist counts as the built-in).
pub fn by_sha256(sha256: &str) -> Option<&'static str> {
    hashes().get(sha256).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_embedded_and_is_a_component() {
        let names: Vec<&str> = builtins().iter().map(|b| b.name).collect();
        assert_eq!(
            names,
            [
                "accept-length",
                "acceptance",
                "ddtree",
                "masked-accuracy",
                "replayed-tau",
                "sampling",
                "top1-accuracy",
                "topk"
            ]
        );
        for b in builtins() {
            assert_eq!(&b.wasm[..8], b"\0asm\x0d\0\x01\0", "{}", b.name);
            assert_eq!(by_sha256(b.sha256()), Some(b.name));
        }
        assert_eq!(find("top1_accuracy").unwrap().name, "top1-accuracy");
        assert!(find("nope").is_none());
        assert!(is_reserved("ddtree") && !is_reserved("my-metric"));
    }
}
