//! draftlens results: what is about runs, not about models.
//!
//! - [`store`]: the SQLite run store (runs, prompts, records, metrics, vocabularies, sharing);
//! - [`metrics`]: the native metrics of a run, every run-level row a fold of [`metrics::PromptStats`];
//! - [`shard`]: the shard rule and the evaluation identity that every shard of one evaluation carries;
//! - [`merge`]: the exact merge of shards (`draftlens merge`, pushes to a team server);
//! - [`slice`]: workload slices (chat/raw, thinking, category, language) stored with a run;
//! - [`speed`]: the verdict's cost model (estimated speed-up) and the stored timings of `live`;
//! - [`cost_bench`]: the cost model's inputs measured apart from live decoding (`bench-costs`);
//! - [`text`]: the one cleaning rule for text from outside (plugins, imports, pushes) on its way
//!   into the store and to a terminal;
//! - [`trace`]: serving-engine traces (vLLM, SGLang, llama.cpp, neutral JSONL) normalised to
//!   draftlens's τ and stored as runs whose origin is the engine (`draftlens trace import`).
//!
//! The engine (models, backends, drafters) writes into this crate; the web UI and the plugin host
//! read from it and never depend on the engine (ARCHITECTURE.md).

pub mod cost_bench;
pub mod merge;
pub mod metrics;
pub mod shard;
pub mod slice;
pub mod speed;
pub mod store;
pub mod text;
pub mod trace;

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}
