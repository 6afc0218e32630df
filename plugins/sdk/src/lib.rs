//! Guest SDK for draftlens metric plugins.
//!
//! A plugin implements [`Metric`] (what it is, which parameters it takes) and [`Accumulator`]
//! (fold batches of blocks, then produce values), and calls [`export_metric!`]. The same code
//! builds natively as an ordinary Rust library (used by its tests and by the host's wasm == native
//! check) and for `wasm32-unknown-unknown`, where `export_metric!` wires it to the WIT contract
//! `draftlens:metric@0.1.0` (plugins/wit/metric.wit).
//!
//! The types a plugin builds and returns ([`Metadata`], [`MetricValue`], ...) are the ones
//! wit-bindgen generates from that contract, on every target (as zed's extension API re-exports
//! its generated types); the batch and parameters are the record contract's own types, which the
//! generated code uses directly. `guest.rs` lists which Rust type stands for which WIT type.
//!
//! ```
//! use draftlens_plugin_sdk::*;
//!
//! pub struct MeanAccepted;
//! pub struct Acc { sum: u64, blocks: u64 }
//!
//! impl Metric for MeanAccepted {
//!     type Acc = Acc;
//!     fn describe() -> Metadata {
//!         Metadata {
//!             name: "mean-accepted".into(),
//!             version: "0.1.0".into(),
//!             description: "mean accepted length".into(),
//!             metrics: vec![MetricSpec::new("mean_accepted", "tokens", "mean A over blocks", true)],
//!             params: vec![],
//!             inputs: Inputs::TOP1, // only the drafter's top-1 is read
//!         }
//!     }
//!     fn begin(_params: &Params) -> Result<Acc, PluginError> { Ok(Acc { sum: 0, blocks: 0 }) }
//! }
//!
//! impl Accumulator for Acc {
//!     fn accumulate(&mut self, batch: &Batch) -> Result<(), PluginError> {
//!         for block in batch.blocks() {
//!             self.sum += block.accepted_len() as u64;
//!             self.blocks += 1;
//!         }
//!         Ok(())
//!     }
//!     fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
//!         Ok(vec![MetricValue::ratio("mean_accepted", self.sum as f64, self.blocks)])
//!     }
//! }
//!
//! export_metric!(MeanAccepted);
//!
//! // Natively the same code runs as a library (this is how plugin tests work):
//! let batch = testdata::oracle(&testdata::Shape::new(4, 1, 1, 2, 10));
//! let values = evaluate::<MeanAccepted>(&[], &batch.as_batch()).unwrap();
//! assert_eq!(values[0].count, 10);
//! ```

// Lets the generated bindings name this crate by its external path from inside the crate too.
extern crate self as draftlens_plugin_sdk;

mod params;
pub mod testdata;
mod types;

/// The record contract (batch layout, accepted length, replay chain), shared with the host.
pub use draftlens_records as records;
/// A borrowed batch as a plugin receives it ([`records::BatchView`]).
pub use draftlens_records::BatchView as Batch;
/// An owned batch, for building test data ([`records::RecordBatch`], the engine's own type).
pub use draftlens_records::RecordBatch as OwnedBatch;
pub use draftlens_records::{Block, Candidates, Position, PositionSpec, Region};
pub use params::{region_param, Params, RegionFilter};
pub use types::{
    ratio, Inputs, Level, Metadata, MetricSpec, MetricValue, Param, ParamSpec, ParamValue,
    PluginError, Series, SeriesKind,
};

#[doc(hidden)]
pub mod guest;

/// A metric plugin: its static description and how to start an accumulation.
pub trait Metric: 'static {
    type Acc: Accumulator;
    /// Name, version, metrics and parameters. Must not depend on parameters.
    fn describe() -> Metadata;
    /// Start an accumulation with resolved parameters (defaults filled in, kinds checked).
    fn begin(params: &Params) -> Result<Self::Acc, PluginError>;
}

/// Folds batches of blocks into metric values. Batches may split anywhere between blocks (even
/// inside one prompt's blocks); the result must not depend on where.
pub trait Accumulator: 'static {
    /// Fold one checked batch.
    fn accumulate(&mut self, batch: &Batch<'_>) -> Result<(), PluginError>;
    /// Produce the values.
    fn finish(self) -> Result<Vec<MetricValue>, PluginError>;
}

/// Start an accumulation: resolve `params` against `M::describe()` and call `M::begin`.
pub fn begin<M: Metric>(params: &[Param]) -> Result<M::Acc, PluginError> {
    let resolved = Params::resolve(&M::describe().params, params)?;
    M::begin(&resolved)
}

/// One-shot evaluation: `begin`, one `accumulate`, `finish`.
pub fn evaluate<M: Metric>(
    params: &[Param],
    batch: &Batch<'_>,
) -> Result<Vec<MetricValue>, PluginError> {
    batch.check()?;
    let mut acc = begin::<M>(params)?;
    acc.accumulate(batch)?;
    acc.finish()
}

/// Streaming evaluation over several batches (what the host does with chunks).
pub fn evaluate_chunks<'a, M: Metric>(
    params: &[Param],
    batches: impl IntoIterator<Item = Batch<'a>>,
) -> Result<Vec<MetricValue>, PluginError> {
    let mut acc = begin::<M>(params)?;
    for b in batches {
        b.check()?;
        acc.accumulate(&b)?;
    }
    acc.finish()
}

/// Log one line through the host (bounded by the host: long lines are cut, excess lines dropped).
/// Natively (tests, reference builds) lines are kept in a thread-local buffer, see [`take_native_logs`].
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    guest::host_log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    NATIVE_LOGS.with(|l| l.borrow_mut().push((level, message.to_string())));
}

#[cfg(not(target_arch = "wasm32"))]
thread_local! {
    static NATIVE_LOGS: std::cell::RefCell<Vec<(Level, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Lines logged by native builds on this thread since the last call.
#[cfg(not(target_arch = "wasm32"))]
pub fn take_native_logs() -> Vec<(Level, String)> {
    NATIVE_LOGS.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// Export a [`Metric`] as the component's `draftlens:metric/evaluator` (wasm32 only; natively
/// this expands to nothing, so the same crate builds as a plain library).
#[macro_export]
macro_rules! export_metric {
    ($metric:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __DraftlensMetricExport;
            impl $crate::guest::Guest for __DraftlensMetricExport {
                type Accumulator = $crate::guest::AccHandle<<$metric as $crate::Metric>::Acc>;
                fn describe() -> $crate::Metadata {
                    $crate::guest::describe::<$metric>()
                }
                fn evaluate(
                    params: ::std::vec::Vec<$crate::Param>,
                    batch: $crate::OwnedBatch,
                ) -> ::std::result::Result<::std::vec::Vec<$crate::MetricValue>, $crate::PluginError> {
                    $crate::guest::evaluate::<$metric>(params, batch)
                }
                fn begin(
                    params: ::std::vec::Vec<$crate::Param>,
                ) -> ::std::result::Result<$crate::guest::WitAccumulator, $crate::PluginError> {
                    $crate::guest::begin::<$metric>(params)
                }
            }
            $crate::guest::bindings::export!(__DraftlensMetricExport with_types_in $crate::guest::bindings);
        };
    };
}

/// Per-position ratio counters (numerator as f64 so fractional contributions work too).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerPosition {
    pub num: Vec<f64>,
    pub den: Vec<u64>,
}

impl PerPosition {
    pub fn new(positions: usize) -> Self {
        PerPosition {
            num: vec![0.0; positions],
            den: vec![0; positions],
        }
    }
    /// Grow to `positions` entries (batches of one run share B; this keeps the first batch's).
    pub fn ensure(&mut self, positions: usize) {
        if self.num.len() < positions {
            self.num.resize(positions, 0.0);
            self.den.resize(positions, 0);
        }
    }
    /// Pooled over positions: Σnum / Σden, with per-position series attached.
    pub fn pooled(&self, name: &str) -> MetricValue {
        let num: f64 = self.num.iter().sum();
        let den: u64 = self.den.iter().sum();
        MetricValue::ratio(name, num, den).with_per_position(&self.num, &self.den)
    }
}
