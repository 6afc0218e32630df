//! What the SDK adds to the WIT types (plugins/wit/metric.wit): constructors and constants on
//! the generated types (`guest.rs` says which Rust type stands for which WIT type), and the one
//! WIT type written by hand, [`PluginError`], for its readable `Display`. The batch layout and
//! parameters are not here: they are the record contract of `draftlens-records`, shared with the
//! host.

use std::fmt;

pub use crate::guest::bindings::draftlens::metric::host::Level;
pub use crate::guest::bindings::draftlens::metric::types::{
    Inputs, Metadata, MetricSpec, MetricValue, ParamSpec, Series, SeriesKind,
};
pub use draftlens_records::{Param, ParamValue};

/// A parameter a plugin accepts (WIT `param-spec`).
impl ParamSpec {
    pub fn new(name: &str, description: &str, default: ParamValue) -> Self {
        ParamSpec {
            name: name.into(),
            description: description.into(),
            default,
        }
    }
}

/// A metric a plugin produces (WIT `metric-spec`; a name ending in `_*` declares a family).
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

/// Which parts of a batch a plugin reads (WIT `inputs`); the host sends only those.
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

/// One result of a plugin (WIT `metric-value`): `value` is NaN exactly when `count` is 0.
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

/// Errors a plugin reports on purpose: the WIT `plugin-error` (the bindings use this type as is).
#[derive(Clone, Debug, PartialEq)]
pub enum PluginError {
    /// A parameter is unknown, of the wrong kind or out of range.
    InvalidParams(String),
    /// The batch is inconsistent or lacks what the metric needs.
    InvalidBatch(String),
    /// Anything else.
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
