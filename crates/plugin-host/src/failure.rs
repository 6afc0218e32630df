//! Why a plugin failed, classified so that reports and the run store can say it plainly.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The class of a plugin failure. Each one is a property of the plugin (or its file), never of
/// the host: the host drops the plugin's store and goes on with the other plugins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// The file could not be read.
    Io,
    /// The file is not WebAssembly at all.
    NotWasm,
    /// WebAssembly, but a core module or an invalid component (not built with wasm-component-ld).
    NotComponent,
    /// Built against another contract version, or exports something else.
    IncompatibleContract,
    /// Imports something other than `draftlens:metric/host` (WASI, anything).
    CapabilityDenied,
    /// Ran past its wall-clock limit (epoch deadline).
    Timeout,
    /// Ran out of its fuel budget.
    FuelExhausted,
    /// Tried to grow its linear memories past the cap.
    MemoryLimit,
    /// Exhausted the wasm call stack.
    StackOverflow,
    /// Panicked (message from the SDK's panic hook).
    Panic,
    /// Any other trap.
    Trap,
    /// Returned metadata or results that break the contract's rules.
    BadOutput,
    /// Returned more than the per-run output budget (entries or bytes over all its groups):
    /// nothing of it is stored, everything of the other plugins is.
    TooMuchOutput,
    /// Calls itself by the name of a built-in plugin (or a source draftlens writes itself) but
    /// is not that built-in: its rows would replace the built-in's.
    ReservedName,
    /// Rejected its parameters.
    InvalidParams,
    /// Returned an error on purpose (invalid batch, internal error).
    PluginError,
}

impl FailureKind {
    /// Short label used in tables ("timeout", "memory-limit", ...).
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Io => "io",
            FailureKind::NotWasm => "not-wasm",
            FailureKind::NotComponent => "not-component",
            FailureKind::IncompatibleContract => "incompatible-contract",
            FailureKind::CapabilityDenied => "capability-denied",
            FailureKind::Timeout => "timeout",
            FailureKind::FuelExhausted => "fuel-exhausted",
            FailureKind::MemoryLimit => "memory-limit",
            FailureKind::StackOverflow => "stack-overflow",
            FailureKind::Panic => "panic",
            FailureKind::Trap => "trap",
            FailureKind::BadOutput => "bad-output",
            FailureKind::TooMuchOutput => "too-much-output",
            FailureKind::ReservedName => "reserved-name",
            FailureKind::InvalidParams => "invalid-params",
            FailureKind::PluginError => "plugin-error",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A classified failure of one plugin, with a message that names the file and the problem.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PluginFailure {
    pub kind: FailureKind,
    /// The plugin file.
    pub path: PathBuf,
    /// What happened, in words (without the path).
    pub message: String,
}

impl PluginFailure {
    /// The message is capped and stripped of control characters (it may quote the plugin).
    pub fn new(kind: FailureKind, path: &Path, message: impl Into<String>) -> Self {
        let message = message.into();
        PluginFailure {
            kind,
            path: path.to_path_buf(),
            message: crate::text::clean(&message, 2 * crate::text::MAX_MESSAGE_BYTES),
        }
    }

    /// The file, printable (a file name may hold control characters too).
    pub fn file(&self) -> String {
        crate::text::clean(&self.path.display().to_string(), 1024)
    }
}

impl fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [{}]", self.file(), self.message, self.kind)
    }
}

impl std::error::Error for PluginFailure {}
