// The body the test guests share that only lie about who they are (`bigname`, `liar`): a
// well-behaved metric with a given description whose accumulators return one given value.
// Included with `include!` (each guest is a one-file crate whose only dependency is the SDK), so
// it holds no inner doc comment.

/// Defines plugin `$plugin` (top-1 inputs, no parameters) and exports it.
macro_rules! fixed_metric {
    (
        plugin: $plugin:ident,
        name: $name:expr,
        version: $version:expr,
        description: $description:expr,
        metric: $metric:expr,
        value: $value:expr $(,)?
    ) => {
        pub struct $plugin;

        pub struct Acc;

        impl ::draftlens_plugin_sdk::Metric for $plugin {
            type Acc = Acc;

            fn describe() -> ::draftlens_plugin_sdk::Metadata {
                ::draftlens_plugin_sdk::Metadata {
                    name: $name,
                    version: $version.into(),
                    description: $description.into(),
                    metrics: vec![$metric],
                    params: vec![],
                    inputs: ::draftlens_plugin_sdk::Inputs::TOP1,
                }
            }

            fn begin(
                _: &::draftlens_plugin_sdk::Params,
            ) -> Result<Acc, ::draftlens_plugin_sdk::PluginError> {
                Ok(Acc)
            }
        }

        impl ::draftlens_plugin_sdk::Accumulator for Acc {
            fn accumulate(
                &mut self,
                _: &::draftlens_plugin_sdk::Batch<'_>,
            ) -> Result<(), ::draftlens_plugin_sdk::PluginError> {
                Ok(())
            }

            fn finish(
                self,
            ) -> Result<Vec<::draftlens_plugin_sdk::MetricValue>, ::draftlens_plugin_sdk::PluginError>
            {
                Ok(vec![$value])
            }
        }

        ::draftlens_plugin_sdk::export_metric!($plugin);
    };
}
