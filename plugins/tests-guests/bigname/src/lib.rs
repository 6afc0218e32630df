//! A plugin whose name is 64 MiB of text starting with terminal escape sequences, for the
//! host's test that plugin text is capped and cleaned before anything prints or stores it.

use draftlens_plugin_sdk::{
    export_metric, Accumulator, Batch, Inputs, Metadata, Metric, MetricSpec, MetricValue, Params,
    PluginError,
};

pub struct BigName;

pub struct Acc;

impl Metric for BigName {
    type Acc = Acc;

    fn describe() -> Metadata {
        let mut name = String::from("\x1b[2J\x1b[Hplugin accept-length failed\n");
        name.push_str(&"n".repeat(64 << 20));
        Metadata {
            name,
            version: "0.0.1".into(),
            description: "a huge name".into(),
            metrics: vec![MetricSpec::new("blocks", "blocks", "blocks", true)],
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
        Ok(vec![MetricValue::new("blocks", 1.0, 1)])
    }
}

export_metric!(BigName);
