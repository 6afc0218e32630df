//! A plugin whose `describe()` loops forever: loading it must cost one time limit, however
//! many places need its metadata (each plugin is loaded, and described, once).

use draftlens_plugin_sdk::{
    export_metric, Accumulator, Batch, Metadata, Metric, MetricValue, Params, PluginError,
};

pub struct DescribeLoop;
pub struct Acc;

impl Metric for DescribeLoop {
    type Acc = Acc;

    fn describe() -> Metadata {
        let mut x = 0u64;
        loop {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    fn begin(_params: &Params) -> Result<Acc, PluginError> {
        Ok(Acc)
    }
}

impl Accumulator for Acc {
    fn accumulate(&mut self, _batch: &Batch<'_>) -> Result<(), PluginError> {
        Ok(())
    }
    fn finish(self) -> Result<Vec<MetricValue>, PluginError> {
        Ok(vec![])
    }
}

export_metric!(DescribeLoop);
