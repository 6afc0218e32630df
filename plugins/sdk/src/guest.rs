//! The wasm32 glue behind [`crate::export_metric!`]: the generated bindings of
//! `draftlens:metric@0.1.0` and the conversions between them and the SDK's plain types.
//! Plugin authors never use this module directly.

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
    });
}

use bindings::draftlens::metric::host as wit_host;
use bindings::draftlens::metric::types as wit;
pub use bindings::exports::draftlens::metric::evaluator::{
    Accumulator as WitAccumulator, Guest, GuestAccumulator,
};

use crate::{
    Accumulator, Level, Metadata, Metric, MetricValue, Param, ParamValue, PluginError, SeriesKind,
};

/// Send one line to the host's log.
pub fn host_log(level: Level, message: &str) {
    let level = match level {
        Level::Debug => wit_host::Level::Debug,
        Level::Info => wit_host::Level::Info,
        Level::Warn => wit_host::Level::Warn,
        Level::Error => wit_host::Level::Error,
    };
    wit_host::log(level, message);
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

fn param_from_wit(p: wit::Param) -> Param {
    let value = match p.value {
        wit::ParamValue::Int(v) => ParamValue::Int(v),
        wit::ParamValue::Float(v) => ParamValue::Float(v),
        wit::ParamValue::Flag(v) => ParamValue::Flag(v),
        wit::ParamValue::Text(v) => ParamValue::Text(v),
    };
    Param {
        name: p.name,
        value,
    }
}

fn param_value_to_wit(v: ParamValue) -> wit::ParamValue {
    match v {
        ParamValue::Int(v) => wit::ParamValue::Int(v),
        ParamValue::Float(v) => wit::ParamValue::Float(v),
        ParamValue::Flag(v) => wit::ParamValue::Flag(v),
        ParamValue::Text(v) => wit::ParamValue::Text(v),
    }
}

fn metadata_to_wit(m: Metadata) -> wit::Metadata {
    wit::Metadata {
        name: m.name,
        version: m.version,
        description: m.description,
        metrics: m
            .metrics
            .into_iter()
            .map(|s| wit::MetricSpec {
                name: s.name,
                unit: s.unit,
                description: s.description,
                higher_is_better: s.higher_is_better,
            })
            .collect(),
        params: m
            .params
            .into_iter()
            .map(|p| wit::ParamSpec {
                name: p.name,
                description: p.description,
                default: param_value_to_wit(p.default),
            })
            .collect(),
        inputs: wit::Inputs {
            candidates: m.inputs.candidates,
            draft_logprobs: m.inputs.draft_logprobs,
            target_topk: m.inputs.target_topk,
        },
    }
}

fn value_to_wit(v: MetricValue) -> wit::MetricValue {
    wit::MetricValue {
        name: v.name,
        value: v.value,
        count: v.count,
        series: v.series.map(|s| wit::Series {
            kind: match s.kind {
                SeriesKind::PerPosition => wit::SeriesKind::PerPosition,
                SeriesKind::Histogram => wit::SeriesKind::Histogram,
            },
            values: s.values,
            counts: s.counts,
        }),
    }
}

fn error_to_wit(e: PluginError) -> wit::PluginError {
    match e {
        PluginError::InvalidParams(m) => wit::PluginError::InvalidParams(m),
        PluginError::InvalidBatch(m) => wit::PluginError::InvalidBatch(m),
        PluginError::Internal(m) => wit::PluginError::Internal(m),
    }
}

fn view(b: &wit::Batch) -> crate::Batch<'_> {
    crate::Batch {
        block_size: b.block_size,
        top_k: b.top_k,
        prompt_index: &b.prompt_index,
        anchor: &b.anchor,
        region: &b.region,
        target: &b.target,
        valid: &b.valid,
        loss_mask: &b.loss_mask,
        draft_ids: &b.draft_ids,
        draft_logprobs: &b.draft_logprobs,
        target_ids: b.target_ids.as_deref(),
        target_logprobs: b.target_logprobs.as_deref(),
    }
}

/// `describe` export.
pub fn describe<M: Metric>() -> wit::Metadata {
    install_panic_hook();
    metadata_to_wit(M::describe())
}

/// `evaluate` export.
pub fn evaluate<M: Metric>(
    params: Vec<wit::Param>,
    batch: wit::Batch,
) -> Result<Vec<wit::MetricValue>, wit::PluginError> {
    install_panic_hook();
    let params: Vec<Param> = params.into_iter().map(param_from_wit).collect();
    crate::evaluate::<M>(&params, &view(&batch))
        .map(|vs| vs.into_iter().map(value_to_wit).collect())
        .map_err(error_to_wit)
}

/// `begin` export.
pub fn begin<M: Metric>(params: Vec<wit::Param>) -> Result<WitAccumulator, wit::PluginError> {
    install_panic_hook();
    let params: Vec<Param> = params.into_iter().map(param_from_wit).collect();
    let acc = crate::begin::<M>(&params).map_err(error_to_wit)?;
    Ok(WitAccumulator::new(AccHandle(RefCell::new(Some(acc)))))
}

/// The resource behind `accumulator`: wit-bindgen hands out `&self`, hence the `RefCell`;
/// `None` after `finish`.
pub struct AccHandle<A>(RefCell<Option<A>>);

impl<A: Accumulator + 'static> GuestAccumulator for AccHandle<A> {
    fn accumulate(&self, batch: wit::Batch) -> Result<(), wit::PluginError> {
        let mut slot = self.0.borrow_mut();
        let acc = slot
            .as_mut()
            .ok_or_else(|| wit::PluginError::Internal("accumulate after finish".into()))?;
        let view = view(&batch);
        view.check()
            .map_err(|e| error_to_wit(PluginError::from(e)))?;
        acc.accumulate(&view).map_err(error_to_wit)
    }

    fn finish(&self) -> Result<Vec<wit::MetricValue>, wit::PluginError> {
        let acc = self
            .0
            .borrow_mut()
            .take()
            .ok_or_else(|| wit::PluginError::Internal("finish called twice".into()))?;
        acc.finish()
            .map(|vs| vs.into_iter().map(value_to_wit).collect())
            .map_err(error_to_wit)
    }
}
