//! Plain Rust forms of the WIT types (plugins/wit/metric.wit) that plugin authors build and
//! return. Plugins and native reference builds use these; on wasm32 the export glue converts them
//! to and from the generated bindings. The batch layout and parameters are not here: they are the
//! record contract of `draftlens-records`, shared with the host.

use std::fmt;

pub use draftlens_records::{Param, ParamValue};

/// A parameter a plugin accepts.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub description: String,
    pub default: ParamValue,
}

impl ParamSpec {
    pub fn new(name: &str, description: &str, default: ParamValue) -> Self {
        ParamSpec {
            name: name.into(),
            description: description.into(),
            default,
        }
    }
}

/// A metric a plugin produces (a name ending in `_*` declares a family).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSpec {
    pub name: String,
    pub unit: String,
    pub description: String,
    pub higher_is_better: bool,
}

impl MetricSpec {
    pub fn new(name: &str, unit: &str, description: &str, higher_is_better: bool) -> Self {
        MetricSpec {
            name: name.into(),
            unit: unit.into(),
            description: description.into(),
            higher_is_better,
        }
    }
}

/// Which parts of a batch a plugin reads; the host sends only those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inputs {
    /// Candidates per position (best first); 0 = all stored.
    pub candidates: u32,
    /// Whether `draft_logprobs` are read (else sent empty).
    pub draft_logprobs: bool,
    /// Whether the target's top-K is read (else sent as None).
    pub target_topk: bool,
}

impl Inputs {
    /// Everything: all candidates with log-probs, and the target's top-K when stored.
    pub const ALL: Inputs = Inputs {
        candidates: 0,
        draft_logprobs: true,
        target_topk: true,
    };
    /// The drafter's top-1 id per position (plus the per-block and per-position columns).
    pub const TOP1: Inputs = Inputs {
        candidates: 1,
        draft_logprobs: false,
        target_topk: false,
    };
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs::ALL
    }
}

/// What `describe` returns.
#[derive(Clone, Debug, PartialEq)]
pub struct Metadata {
    pub name: String,
    pub version: String,
    pub description: String,
    pub metrics: Vec<MetricSpec>,
    pub params: Vec<ParamSpec>,
    /// What the plugin reads ([`Inputs::ALL`] is always safe; narrower is faster).
    pub inputs: Inputs,
}

/// How to read a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesKind {
    /// values[i] belongs to draft position k = i + 1.
    PerPosition,
    /// values[i] belongs to the integer outcome i.
    Histogram,
}

/// Per-position values or a histogram, with the denominator (or raw count) of every entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub kind: SeriesKind,
    pub values: Vec<f64>,
    pub counts: Vec<u64>,
}

/// One result of a plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricValue {
    pub name: String,
    /// NaN exactly when undefined (count = 0).
    pub value: f64,
    /// The denominator behind `value`.
    pub count: u64,
    pub series: Option<Series>,
}

impl MetricValue {
    /// `num / den`, NaN when `den` is 0; `count` = `den`.
    pub fn ratio(name: &str, num: f64, den: u64) -> Self {
        MetricValue {
            name: name.into(),
            value: ratio(num, den),
            count: den,
            series: None,
        }
    }
    /// A value with an explicit count.
    pub fn new(name: &str, value: f64, count: u64) -> Self {
        MetricValue {
            name: name.into(),
            value,
            count,
            series: None,
        }
    }
    /// Attach per-position ratios `nums[i] / dens[i]`.
    pub fn with_per_position(mut self, nums: &[f64], dens: &[u64]) -> Self {
        self.series = Some(Series {
            kind: SeriesKind::PerPosition,
            values: nums.iter().zip(dens).map(|(&n, &d)| ratio(n, d)).collect(),
            counts: dens.to_vec(),
        });
        self
    }
    /// Attach an explicit series.
    pub fn with_series(mut self, series: Series) -> Self {
        self.series = Some(series);
        self
    }
}

/// `num / den`, NaN when `den` is 0 (the contract's "undefined").
pub fn ratio(num: f64, den: u64) -> f64 {
    if den == 0 {
        f64::NAN
    } else {
        num / den as f64
    }
}

/// Errors a plugin reports on purpose.
#[derive(Clone, Debug, PartialEq)]
pub enum PluginError {
    InvalidParams(String),
    InvalidBatch(String),
    Internal(String),
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginError::InvalidParams(m) => write!(f, "invalid parameters: {m}"),
            PluginError::InvalidBatch(m) => write!(f, "invalid batch: {m}"),
            PluginError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for PluginError {}

/// An inconsistent batch is the plugin's `invalid-batch` error.
impl From<draftlens_records::LayoutError> for PluginError {
    fn from(e: draftlens_records::LayoutError) -> Self {
        PluginError::InvalidBatch(e.0)
    }
}

/// Log levels of the host's `log` import.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}
