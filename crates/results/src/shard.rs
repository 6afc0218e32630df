//! Sharded evaluations (docs/scale-out.md): which prompts a shard `I/N` evaluates, and the
//! evaluation identity that every shard of one evaluation carries. The engine applies the rule to
//! its prompts (`draftlens_engine::prompts::prompts_of_shard`).
//!
//! The rule (docs/scale-out.md §1): a prompt belongs to shard
//! `u64::from_str_radix(&sha256[..16], 16) % N`, where `sha256` is the prompt's content hash (`Prompt::hash` in the engine), the hash of
//! what the model sees (text or chat messages; never the id, category, completion or line). So a
//! prompt's shard does not change when the file is reordered, and N shards partition any set.
//!
//! The identity ([`EvalIdentity`]) lists everything that can change a number of the run: the
//! target's weights, architecture and tokenizer, the drafter's weights and config, the prompt file
//! and `--limit`, the evaluation options, the backend and the code version. Its sha256 is stored
//! with every run (`run_eval.identity`); `draftlens merge` only combines shards whose identities
//! are equal.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a shard run's name ends with, before the shard `I/N` (`draftlens merge` strips it).
pub const SHARD_NAME_SEP: &str = " · shard ";

/// Shard `index` of `count` (0 ≤ index < count), written `I/N` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub fn new(index: u32, count: u32) -> Result<Shard> {
        if count == 0 {
            bail!("shard {index}/{count}: the shard count must be at least 1");
        }
        if index >= count {
            bail!("shard {index}/{count}: the index must be below the count (0-based: 0..{count})");
        }
        Ok(Shard { index, count })
    }

    /// Whether the prompt with content hash `sha256` (lowercase hex) belongs to this shard.
    pub fn owns_hash(&self, sha256: &str) -> bool {
        shard_of_hash(sha256, self.count) == self.index
    }
}

/// The shard (0..count) of the prompt whose content hash is `sha256`: its first 16 hex digits
/// read as a big-endian u64, modulo `count`. A hash too short or not hex (never produced by
/// `Prompt::hash`) goes to shard 0 rather than panicking.
pub fn shard_of_hash(sha256: &str, count: u32) -> u32 {
    let head = sha256.get(..16).unwrap_or("");
    let v = u64::from_str_radix(head, 16).unwrap_or(0);
    (v % count.max(1) as u64) as u32
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || anyhow::anyhow!("--shard {s:?}: expected I/N, e.g. 0/4 (0-based index I < N)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (i, n) = (
            i.trim().parse::<u32>().map_err(|_| bad())?,
            n.trim().parse::<u32>().map_err(|_| bad())?,
        );
        Shard::new(i, n).map_err(|e| anyhow::anyhow!("--shard {s:?}: {e}"))
    }
}

/// Everything that can change a number of an evaluation run; equal for every shard of one
/// evaluation (docs/scale-out.md §2). Paths are left out on purpose: the same model copied to
/// another machine is the same evaluation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalIdentity {
    /// sha256 of the target's weight files (`TargetIdentity::weights_sha256`).
    pub target_sha256: String,
    pub target_arch: String,
    /// Tokenizer fingerprint (vocabulary, special tokens, chat template).
    pub tokenizer: String,
    /// `checkpoint`, `builtin:oracle` or `builtin:anti-oracle`.
    pub drafter_kind: String,
    /// sha256 of the drafter's `model.safetensors` ("" for a built-in drafter).
    pub drafter_sha256: String,
    /// sha256 of the drafter's `config.json` ("" when none).
    pub drafter_config_sha256: String,
    pub block_size: u32,
    /// sha256 of the whole prompt file (before `--limit`).
    pub prompt_set_sha256: String,
    /// Prompts of the evaluated set (after `--limit`): the prompts the shards partition.
    pub prompts: u32,
    /// deployment or train-style.
    pub mode: String,
    /// The evaluation options as `run` stores them (top-K, anchors, labels, mask, anchor batch).
    pub eval: serde_json::Value,
    pub max_new_tokens: u32,
    pub backend: String,
    pub dtype: String,
    /// Gated DeltaNet numeric profile (hybrid targets; null for dense ones).
    pub gdn_profile: Option<String>,
    /// The draftlens version that computed the records.
    pub code_version: String,
    /// The workload slice (`crate::slice::Slice`, docs/slices.md); absent for the default slice,
    /// so identities computed before slices existed, or with default options, keep their sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<serde_json::Value>,
}

impl EvalIdentity {
    /// sha256 (hex) of the canonical JSON of the identity (field order fixed by the struct).
    pub fn sha256(&self) -> String {
        let json = serde_json::to_vec(self).expect("an identity serialises");
        crate::sha256_hex(&json)
    }
}

/// The version string identities carry.
pub fn code_version() -> String {
    format!("draftlens {}", env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!(
            "2/5".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 5 }
        );
        assert_eq!("0/1".parse::<Shard>().unwrap().to_string(), "0/1");
        for bad in ["5/5", "1/0", "a/2", "3", "-1/2", "1/2/3"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    /// The rule read by hand: first 16 hex digits, big-endian, modulo N.
    #[test]
    fn known_answer() {
        let h = "00000000000000ff".to_string() + &"0".repeat(48);
        assert_eq!(shard_of_hash(&h, 1), 0);
        assert_eq!(shard_of_hash(&h, 16), 15);
        assert_eq!(shard_of_hash(&h, 256), 255);
        assert_eq!(shard_of_hash(&h, 100), 55);
        let h = "ffffffffffffffff".to_string() + &"0".repeat(48);
        assert_eq!(shard_of_hash(&h, 7), (u64::MAX % 7) as u32);
        assert!(Shard::new(15, 16)
            .unwrap()
            .owns_hash(&("00000000000000ff".to_string() + &"0".repeat(48))));
    }
}
