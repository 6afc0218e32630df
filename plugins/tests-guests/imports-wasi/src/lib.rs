//! A plugin built for wasm32-unknown-unknown that imports one WASI interface by hand
//! (wasi:cli/environment, wasm32 only). It loads under the host's deny-all WASI, and
//! `evaluate` reports how many environment variables it saw: none.
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "wit", world: "wasi-user", generate_all });

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
            name: "wasi-user".into(),
            version: "0.0.1".into(),
            description: String::new(),
            metrics: vec![draftlens::metric::types::MetricSpec {
                name: "env_vars".into(),
                unit: "count".into(),
                description: "environment variables seen".into(),
                higher_is_better: false,
            }],
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
        let env = wasi::cli::environment::get_environment();
        Err(PluginError::Internal(format!(
            "read {} environment variables",
            env.len()
        )))
    }
    fn begin(_params: Vec<Param>) -> Result<Accumulator, PluginError> {
        Ok(Accumulator::new(Acc))
    }
}

export!(Plugin);
