//! A plugin built against `draftlens:metric@0.1.1`, a semver-compatible (additive) version of
//! the contract: a 0.1.0 host must load and run it (wasm32 only).
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "wit", world: "metric-plugin" });

use draftlens::metric::types::{Inputs, MetricSpec};
use exports::draftlens::metric::evaluator::{
    Accumulator, Batch, Guest, GuestAccumulator, Metadata, MetricValue, Param, PluginError,
};
use std::cell::Cell;

struct Plugin;
struct Acc(Cell<u64>);

fn blocks(n: u64) -> Vec<MetricValue> {
    vec![MetricValue {
        name: "blocks".into(),
        value: n as f64,
        count: n,
        series: None,
    }]
}

impl GuestAccumulator for Acc {
    fn accumulate(&self, batch: Batch) -> Result<(), PluginError> {
        self.0.set(self.0.get() + batch.anchor.len() as u64);
        Ok(())
    }
    fn finish(&self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(blocks(self.0.get()))
    }
}

impl Guest for Plugin {
    type Accumulator = Acc;
    fn describe() -> Metadata {
        Metadata {
            name: "patch-version".into(),
            version: "0.1.1".into(),
            description: "counts blocks".into(),
            metrics: vec![MetricSpec {
                name: "blocks".into(),
                unit: "blocks".into(),
                description: "blocks seen".into(),
                higher_is_better: true,
            }],
            params: vec![],
            inputs: Inputs {
                candidates: 1,
                draft_logprobs: false,
                target_topk: false,
            },
        }
    }
    fn evaluate(_params: Vec<Param>, batch: Batch) -> Result<Vec<MetricValue>, PluginError> {
        Ok(blocks(batch.anchor.len() as u64))
    }
    fn begin(_params: Vec<Param>) -> Result<Accumulator, PluginError> {
        Ok(Accumulator::new(Acc(Cell::new(0))))
    }
    fn contract_note() -> String {
        "0.1.1".into()
    }
}

export!(Plugin);
