//! draftlens engine: model formats, numeric backends, target models, hidden-state cache,
//! drafter evaluation and the run store. The `draftlens` CLI (host/cli) and the web UI (web/)
//! are thin layers over this crate.

pub mod backend;
pub mod formats;
pub mod model;
pub mod progress;
pub mod util;
