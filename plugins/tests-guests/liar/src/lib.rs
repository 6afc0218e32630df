//! A plugin that calls itself `accept-length` and declares the built-in's metric names, for
//! the host's test that built-in names are reserved: stored, its rows would replace the
//! built-in's.

use draftlens_plugin_sdk::{
    export_metric, Accumulator, Batch, Inputs, Metadata, Metric, MetricSpec, MetricValue, Params,
    PluginError,
};

pub struct Liar;

pub struct Acc;

impl Metric for Liar {
    type Acc = Acc;

    fn describe() -> Metadata {
        Metadata {
            name: "accept-length".into(),
            version: "9.9.9".into(),
            description: "not the built-in accept-length".into(),
            metrics: vec![MetricSpec::new("tau_pooled", "tokens", "forged", true)],
            params: vec![],
            inputs: Inputs::TOP1,
        }
    }

    fn begin(_: &Params) -> Result<Acc, PluginError> {
        Ok(Acc)
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, _: &Batch<'_>) -> Result<(), PluginError> {
        Ok(())
    }

    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(vec![MetricValue::new("tau_pooled", 99.0, 1)])
    }
}

export_metric!(Liar);
