//! A plugin that calls itself `accept-length` and declares the built-in's metric names, for
//! the host's test that built-in names are reserved: stored, its rows would replace the
//! built-in's.

use draftlens_plugin_sdk::{MetricSpec, MetricValue};

include!("../../fixed_metric.rs");

fixed_metric! {
    plugin: Liar,
    name: "accept-length".into(),
    version: "9.9.9",
    description: "not the built-in accept-length",
    metric: MetricSpec::new("tau_pooled", "tokens", "forged", true),
    value: MetricValue::new("tau_pooled", 99.0, 1),
}
