//! Host-side values of the contract, serialisable for the run store and reports.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::wit;

/// `major.minor.patch` of the contract a plugin was built against.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ContractVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl ContractVersion {
    /// The contract this host implements.
    pub const HOST: ContractVersion = ContractVersion {
        major: wit::VERSION.0,
        minor: wit::VERSION.1,
        patch: wit::VERSION.2,
    };

    pub fn parse(s: &str) -> Option<ContractVersion> {
        let mut it = s.split('.');
        let v = ContractVersion {
            major: it.next()?.parse().ok()?,
            minor: it.next()?.parse().ok()?,
            patch: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(v)
    }

    /// Semver compatibility as wasmtime resolves component names: same major, and for 0.x the
    /// same minor; the patch may differ both ways.
    pub fn compatible_with_host(&self) -> bool {
        let h = ContractVersion::HOST;
        self.major == h.major && (h.major != 0 || self.minor == h.minor)
    }
}

impl fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Parameters are part of the record contract (`draftlens-records`), shared with the SDK.
pub use draftlens_records::{Param, ParamValue};

impl From<&ParamValue> for wit::ParamValue {
    fn from(v: &ParamValue) -> Self {
        match v {
            ParamValue::Int(x) => wit::ParamValue::Int(*x),
            ParamValue::Float(x) => wit::ParamValue::Float(*x),
            ParamValue::Flag(x) => wit::ParamValue::Flag(*x),
            ParamValue::Text(x) => wit::ParamValue::Text(x.clone()),
        }
    }
}

impl From<wit::ParamValue> for ParamValue {
    fn from(v: wit::ParamValue) -> Self {
        match v {
            wit::ParamValue::Int(x) => ParamValue::Int(x),
            wit::ParamValue::Float(x) => ParamValue::Float(x),
            wit::ParamValue::Flag(x) => ParamValue::Flag(x),
            wit::ParamValue::Text(x) => ParamValue::Text(x),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    pub name: String,
    pub description: String,
    pub default: ParamValue,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricSpec {
    /// A name, or a family `prefix_*`.
    pub name: String,
    pub unit: String,
    pub description: String,
    pub higher_is_better: bool,
}

impl MetricSpec {
    /// Whether `name` is this metric or a member of this family.
    pub fn covers(&self, name: &str) -> bool {
        match self.name.strip_suffix('*') {
            Some(prefix) => name.strip_prefix(prefix).is_some_and(|rest| {
                !rest.is_empty()
                    && rest
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            }),
            None => self.name == name,
        }
    }
}

/// Which parts of a batch a plugin reads; the host sends only those.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inputs {
    /// Candidates per position, best first; 0 = all stored.
    pub candidates: u32,
    pub draft_logprobs: bool,
    pub target_topk: bool,
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs {
            candidates: 0,
            draft_logprobs: true,
            target_topk: true,
        }
    }
}

/// What a plugin says about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub name: String,
    pub version: String,
    pub description: String,
    pub metrics: Vec<MetricSpec>,
    pub params: Vec<ParamSpec>,
    pub inputs: Inputs,
}

impl Metadata {
    /// The spec that declares `name` (exact name first, then families).
    pub fn spec_for(&self, name: &str) -> Option<&MetricSpec> {
        self.metrics
            .iter()
            .find(|s| s.name == name)
            .or_else(|| self.metrics.iter().find(|s| s.covers(name)))
    }
}

impl From<wit::Metadata> for Metadata {
    fn from(m: wit::Metadata) -> Self {
        Metadata {
            name: m.name,
            version: m.version,
            description: m.description,
            metrics: m
                .metrics
                .into_iter()
                .map(|s| MetricSpec {
                    name: s.name,
                    unit: s.unit,
                    description: s.description,
                    higher_is_better: s.higher_is_better,
                })
                .collect(),
            params: m
                .params
                .into_iter()
                .map(|p| ParamSpec {
                    name: p.name,
                    description: p.description,
                    default: p.default.into(),
                })
                .collect(),
            inputs: Inputs {
                candidates: m.inputs.candidates,
                draft_logprobs: m.inputs.draft_logprobs,
                target_topk: m.inputs.target_topk,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeriesKind {
    /// values[i] belongs to draft position k = i + 1.
    PerPosition,
    /// values[i] belongs to the integer outcome i.
    Histogram,
}

/// A checked series; undefined entries (NaN from the plugin) are `None`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesResult {
    pub kind: SeriesKind,
    pub values: Vec<Option<f64>>,
    pub counts: Vec<u64>,
}

/// One checked metric value; `value` is None when the plugin reported it undefined (NaN), so it
/// can be stored as SQL NULL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricResult {
    pub name: String,
    pub value: Option<f64>,
    pub count: u64,
    pub series: Option<SeriesResult>,
}

impl MetricResult {
    /// A value without a series (`None` = undefined, e.g. an empty denominator).
    pub fn scalar(name: &str, value: Option<f64>, count: u64) -> MetricResult {
        MetricResult {
            name: name.into(),
            value,
            count,
            series: None,
        }
    }
}

/// Log severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One line a plugin logged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
    /// How many more times the same line came right after (each group's accumulator tends to
    /// say the same thing).
    #[serde(default)]
    pub repeats: u64,
}
