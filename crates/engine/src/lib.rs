//! draftlens engine: model formats, numeric backends, target models, hidden-state cache and
//! drafter evaluation. What it produces (records, metrics, runs) goes into `draftlens-results`;
//! the `draftlens` CLI (crates/cli) drives it.

pub mod backend;
pub mod chat;
pub mod drafter;
pub mod formats;
pub mod generate;
pub mod hidden_cache;
pub mod identity;
pub mod model;
pub mod parity;
pub mod parity_features;
pub mod parity_report;
pub mod progress;
pub mod prompts;
pub mod records;
pub mod session;
pub mod shard;
pub mod slices;
pub mod timeline;
pub mod tokenizer;
pub mod util;
pub mod watch;
