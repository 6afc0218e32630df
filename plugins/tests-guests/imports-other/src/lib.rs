//! A plugin that imports an interface the host does not provide (wasm32 only). The host must
//! refuse it at load, before any of its code runs.
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "wit", world: "spy-user", generate_all });

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
    fn describe() -> Metadata {
        Metadata {
            name: "spy-user".into(),
            version: "0.0.1".into(),
            description: String::new(),
            metrics: vec![],
            params: vec![],
            inputs: draftlens::metric::types::Inputs {
                candidates: 1,
                draft_logprobs: false,
                target_topk: false,
            },
        }
    }
    fn evaluate(_params: Vec<Param>, _batch: Batch) -> Result<Vec<MetricValue>, PluginError> {
        // Uses the import, so the toolchain cannot elide it.
        Err(PluginError::Internal(test::spy::spy::peek()))
    }
    fn begin(_params: Vec<Param>) -> Result<Accumulator, PluginError> {
        Ok(Accumulator::new(Acc))
    }
}

export!(Plugin);
