//! Text that comes from a plugin (its name, messages, log lines, descriptions) is untrusted: it
//! is capped and stripped of control characters and bidi controls before any terminal, database
//! or page sees it. An escape sequence could otherwise clear the screen or forge a line such as
//! "plugin accept-length failed"; a 100 MiB message would be printed, stored and served whole.
//! The cleaning rule is the results crate's ([`draftlens_results::text`]), shared with the
//! store's imports and the CLI's printing.

pub use draftlens_results::text::{clean, preview};

/// Bytes kept of a failure message (plugin error text, panic message).
pub const MAX_MESSAGE_BYTES: usize = 4096;
