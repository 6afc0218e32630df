//! draftlens metric-plugin runtime: sandboxed WebAssembly components (wasmtime, component model)
//! that score stored records.
//!
//! * Contract: `draftlens:metric@0.1.0` (plugins/wit/metric.wit), guest SDK in plugins/sdk.
//! * Sandbox: a plugin gets a bounded `log` and a deny-all WASI 0.2 ([`wasi`]: no files, network
//!   or environment, a fixed clock, seeded randomness); a component importing anything else is
//!   refused at load. Every job runs in a fresh `Store` with a wall-clock limit (epoch
//!   interruption), optional fuel, and a cap on the sum of its linear memories.
//! * Failures are classified ([`FailureKind`]) and reported per plugin; the others go on.
//! * Compiled code is cached as `.cwasm` keyed by sha256 of the `.wasm` and the engine's
//!   compatibility hash.
//! * Per-prompt and per-category values are computed by the host ([`Grouping`]).
//!
//! Entry points: [`score_batch`] over a batch; [`stored::score_stored_run`] over a stored run
//! (what `run --plugin` and `rescore` use), which also stores the metrics and failures.

pub mod builtins;
pub mod check;
pub mod discover;
mod failure;
mod job;
mod runtime;
pub mod scaffold;
mod score;
pub mod stored;
pub mod text;
mod types;
mod validate;
pub mod wasi;
mod wit;

pub use failure::{FailureKind, PluginFailure};
pub use job::Job;
pub use runtime::{
    cache_key_file, default_cache_dir, Limits, LoadedPlugin, Runtime, RuntimeConfig,
};
pub use score::{
    score_batch, score_batch_with, Grouping, PluginOutcome, PluginRequest, Scores, CHUNK_CANDIDATES,
};
pub use stored::{
    score_stored_run, score_stored_run_prepared, PreparedPlugin, StoredOutcome, StoredScoring,
};
pub use types::{
    ContractVersion, Inputs, LogLevel, LogLine, Metadata, MetricResult, MetricSpec, Param,
    ParamSpec, ParamValue, SeriesKind, SeriesResult,
};
pub use wit::{BatchRef, ProjectionBuf};

/// The guest SDK, natively (synthetic test data, native reference runs).
pub use draftlens_plugin_sdk as sdk;
