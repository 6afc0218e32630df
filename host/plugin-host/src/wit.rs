//! Host bindings of the contract `draftlens:metric@0.1.0` (plugins/wit/metric.wit).

use wasmtime::component::{ComponentType, Lower};

wasmtime::component::bindgen!({
    path: "../../plugins/wit",
    world: "metric-plugin",
});

pub use self::draftlens::metric::types::{Metadata, MetricValue, Param, ParamValue, PluginError, SeriesKind};
pub use self::draftlens::metric::host::Level;

/// The contract version this host implements and the interface it looks up.
pub const VERSION: (u64, u64, u64) = (0, 1, 0);
pub const EVALUATOR: &str = "draftlens:metric/evaluator@0.1.0";

/// A borrowed view of a batch, lowered straight from the host's columns into the guest's memory
/// (the generated `Batch` owns `Vec`s, which would cost one more copy of every column). Field
/// names and order mirror `record batch` in metric.wit; wasmtime type-checks this against the
/// component's own type when the function is looked up.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub struct BatchRef<'a> {
    #[component(name = "block-size")]
    pub block_size: u32,
    #[component(name = "top-k")]
    pub top_k: u32,
    #[component(name = "prompt-index")]
    pub prompt_index: &'a [u32],
    #[component(name = "anchor")]
    pub anchor: &'a [u32],
    #[component(name = "region")]
    pub region: &'a [u8],
    #[component(name = "target")]
    pub target: &'a [u32],
    #[component(name = "valid")]
    pub valid: &'a [u8],
    #[component(name = "loss-mask")]
    pub loss_mask: &'a [u8],
    #[component(name = "draft-ids")]
    pub draft_ids: &'a [u32],
    #[component(name = "draft-logprobs")]
    pub draft_logprobs: &'a [f32],
    #[component(name = "target-ids")]
    pub target_ids: Option<&'a [u32]>,
    #[component(name = "target-logprobs")]
    pub target_logprobs: Option<&'a [f32]>,
}

impl<'a> BatchRef<'a> {
    /// Blocks `range` of `batch` (whose columns were checked with `RecordBatch::check`).
    pub fn slice(batch: &'a ::draftlens::records::RecordBatch, range: std::ops::Range<usize>) -> BatchRef<'a> {
        let p = batch.positions_per_block();
        let k = batch.top_k as usize;
        let pos = range.start * p..range.end * p;
        let cand = pos.start * k..pos.end * k;
        BatchRef {
            block_size: batch.block_size,
            top_k: batch.top_k,
            prompt_index: &batch.prompt_index[range.clone()],
            anchor: &batch.anchor[range.clone()],
            region: &batch.region[range],
            target: &batch.target[pos.clone()],
            valid: &batch.valid[pos.clone()],
            loss_mask: &batch.loss_mask[pos],
            draft_ids: &batch.draft_ids[cand.clone()],
            draft_logprobs: &batch.draft_logprobs[cand.clone()],
            target_ids: batch.target_ids.as_deref().map(|c| &c[cand.clone()]),
            target_logprobs: batch.target_logprobs.as_deref().map(|c| &c[cand]),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.anchor.len()
    }
}
