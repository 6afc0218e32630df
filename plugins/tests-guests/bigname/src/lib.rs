//! A plugin whose name is 64 MiB of text starting with terminal escape sequences, for the
//! host's test that plugin text is capped and cleaned before anything prints or stores it.

use draftlens_plugin_sdk::{MetricSpec, MetricValue};

include!("../../fixed_metric.rs");

/// Escape sequences that would clear the screen and forge a host line, then 64 MiB.
fn big_name() -> String {
    let mut name = String::from("\x1b[2J\x1b[Hplugin accept-length failed\n");
    name.push_str(&"n".repeat(64 << 20));
    name
}

fixed_metric! {
    plugin: BigName,
    name: big_name(),
    version: "0.0.1",
    description: "a huge name",
    metric: MetricSpec::new("blocks", "blocks", "blocks", true),
    value: MetricValue::new("blocks", 1.0, 1),
}
