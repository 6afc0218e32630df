//! Evaluated drafter blocks in columnar form: what the drafter evaluation produces, what the store
//! keeps, and what metric plugins read.
//!
//! The contract is written once, in the dependency-free crate `draftlens-records`
//! (`crates/records/src/lib.rs`), which the plugin host, the plugin SDK and every plugin share; this
//! module re-exports it under the engine's path. Definitions: `docs/metrics.md` §1–§3.

pub use draftlens_records::*;
