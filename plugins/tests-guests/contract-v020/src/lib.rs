//! A plugin built against a future, incompatible contract `draftlens:metric@0.2.0` (wasm32 only).
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "wit", world: "metric-plugin" });

use exports::draftlens::metric::evaluator::{
    Accumulator, Batch, Guest, GuestAccumulator, Metadata, MetricValue, Param, PluginError,
};

struct Plugin;
struct Acc;

impl GuestAccumulator for Acc {
    fn accumulate(&self, _batch: Batch) -> Result<(), PluginError> {
        Ok(())
    }
    fn finish(&self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(vec![])
    }
}

impl Guest for Plugin {
    type Accumulator = Acc;
    fn describe(_locale: String) -> Metadata {
        Metadata {
            name: "future".into(),
            version: "2.0.0".into(),
            description: String::new(),
            metrics: vec![],
            params: vec![],
        }
    }
    fn evaluate(_params: Vec<Param>, _batch: Batch) -> Result<Vec<MetricValue>, PluginError> {
        Ok(vec![])
    }
    fn begin(_params: Vec<Param>) -> Result<Accumulator, PluginError> {
        Ok(Accumulator::new(Acc))
    }
}

export!(Plugin);
