//! draftlens engine: model formats, numeric backends, target models, hidden-state cache,
//! drafter evaluation and the run store. The `draftlens` CLI (host/cli) and the web UI (web/)
//! are thin layers over this crate.

pub mod backend;
pub mod cache;
pub mod cache_shared;
pub mod cache_writer;
pub mod chat;
pub mod drafter;
pub mod formats;
pub mod generate;
pub mod identity;
pub mod merge;
pub mod model;
pub mod parity;
pub mod parity_report;
pub mod progress;
pub mod prompts;
pub mod records;
pub mod session;
pub mod shard;
pub mod store;
pub mod timeline;
pub mod tokenizer;
pub mod util;
pub mod watch;
