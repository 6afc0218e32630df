//! The bindings of the WIT contract `draftlens:metric@0.1.0` (plugins/wit/metric.wit) and the glue
//! behind [`crate::export_metric!`]. Plugin authors never use this module directly: the crate root
//! re-exports the types.
//!
//! Every WIT type has one Rust definition, which the generated lifting and lowering code uses as
//! is (no conversion code, no mirrored copy):
//! * `batch`, `param`, `param-value` are the record contract's own types
//!   ([`draftlens_records::RecordBatch`], [`draftlens_records::Param`],
//!   [`draftlens_records::ParamValue`]), named in `with`: the crate the host also uses owns the
//!   layout, and the generated code constructs these structs field by field, so a field that
//!   differed from the WIT record would not compile;
//! * `plugin-error` is [`crate::PluginError`] (named in `with` too), whose `Display` reads
//!   "invalid parameters: …" where the generated one would print its `Debug` form;
//! * everything else (`metadata`, `metric-spec`, `param-spec`, `inputs`, `metric-value`,
//!   `series`, `series-kind`, `level`) is the generated type itself; `types.rs` adds
//!   constructors.
//!
//! The bindings compile natively as well (wit-bindgen turns each import into `unreachable!()`
//! off wasm32), so plugins and their tests build as ordinary Rust libraries; natively the SDK
//! never calls an import ([`crate::log`] keeps lines in a thread-local there).

use std::cell::RefCell;
use std::sync::Once;

pub use wit_bindgen;

pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "metric-plugin",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "::draftlens_plugin_sdk::guest::bindings",
        runtime_path: "::draftlens_plugin_sdk::guest::wit_bindgen::rt",
        with: {
            "draftlens:metric/types@0.1.0/batch": ::draftlens_records::RecordBatch,
            "draftlens:metric/types@0.1.0/param": ::draftlens_records::Param,
            "draftlens:metric/types@0.1.0/param-value": ::draftlens_records::ParamValue,
            "draftlens:metric/types@0.1.0/plugin-error": crate::PluginError,
        },
        additional_derives: [PartialEq],
        additional_type_attributes: {
            "draftlens:metric/types@0.1.0/inputs": [#[derive(Eq)]],
        },
    });
}

pub use bindings::exports::draftlens::metric::evaluator::{
    Accumulator as WitAccumulator, Guest, GuestAccumulator,
};

use crate::{Accumulator, Level, Metadata, Metric, MetricValue, OwnedBatch, Param, PluginError};

/// Send one line to the host's log (wasm32 only: natively the import is unreachable).
pub fn host_log(level: Level, message: &str) {
    bindings::draftlens::metric::host::log(level, message);
}

/// Panics abort on wasm32-unknown-unknown (an `unreachable` trap). The hook sends the message
/// first, so the host can report "plugin panicked: <message>" instead of a bare trap.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            host_log(Level::Error, &format!("panic: {info}"));
        }))
    });
}

/// `describe` export.
pub fn describe<M: Metric>() -> Metadata {
    install_panic_hook();
    M::describe()
}

/// `evaluate` export.
pub fn evaluate<M: Metric>(
    params: Vec<Param>,
    batch: OwnedBatch,
) -> Result<Vec<MetricValue>, PluginError> {
    install_panic_hook();
    crate::evaluate::<M>(&params, &batch.view())
}

/// `begin` export.
pub fn begin<M: Metric>(params: Vec<Param>) -> Result<WitAccumulator, PluginError> {
    install_panic_hook();
    let acc = crate::begin::<M>(&params)?;
    Ok(WitAccumulator::new(AccHandle(RefCell::new(Some(acc)))))
}

/// The resource behind `accumulator`: wit-bindgen hands out `&self`, hence the `RefCell`;
/// `None` after `finish`.
pub struct AccHandle<A>(RefCell<Option<A>>);

impl<A: Accumulator + 'static> GuestAccumulator for AccHandle<A> {
    fn accumulate(&self, batch: OwnedBatch) -> Result<(), PluginError> {
        let mut slot = self.0.borrow_mut();
        let acc = slot
            .as_mut()
            .ok_or_else(|| PluginError::Internal("accumulate after finish".into()))?;
        let view = batch.view();
        view.check()?;
        acc.accumulate(&view)
    }

    fn finish(&self) -> Result<Vec<MetricValue>, PluginError> {
        let acc = self
            .0
            .borrow_mut()
            .take()
            .ok_or_else(|| PluginError::Internal("finish called twice".into()))?;
        acc.finish()
    }
}
