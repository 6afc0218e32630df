//! Conversions between the engine's `RecordBatch` and the SDK's batch types, for native
//! reference runs (wasm == native checks, benchmarks) and synthetic data (`plugins check`).

use draftlens::records::RecordBatch;
use draftlens_plugin_sdk::{Batch, OwnedBatch};

/// Borrow a `RecordBatch` as the SDK's view: the native build of a plugin reads the same
/// columns the wasm build receives.
pub fn sdk_view(b: &RecordBatch) -> Batch<'_> {
    Batch {
        block_size: b.block_size,
        top_k: b.top_k,
        prompt_index: &b.prompt_index,
        anchor: &b.anchor,
        region: &b.region,
        target: &b.target,
        valid: &b.valid,
        loss_mask: &b.loss_mask,
        draft_ids: &b.draft_ids,
        draft_logprobs: &b.draft_logprobs,
        target_ids: b.target_ids.as_deref(),
        target_logprobs: b.target_logprobs.as_deref(),
    }
}

/// Turn an SDK-built batch (synthetic test data) into a `RecordBatch`.
pub fn record_batch(b: OwnedBatch) -> RecordBatch {
    RecordBatch {
        block_size: b.block_size,
        top_k: b.top_k,
        prompt_index: b.prompt_index,
        anchor: b.anchor,
        region: b.region,
        target: b.target,
        valid: b.valid,
        loss_mask: b.loss_mask,
        draft_ids: b.draft_ids,
        draft_logprobs: b.draft_logprobs,
        target_ids: b.target_ids,
        target_logprobs: b.target_logprobs,
    }
}

/// SDK parameters from host parameters.
pub fn sdk_params(params: &[crate::Param]) -> Vec<draftlens_plugin_sdk::Param> {
    use crate::ParamValue as H;
    use draftlens_plugin_sdk::ParamValue as S;
    params
        .iter()
        .map(|p| draftlens_plugin_sdk::Param {
            name: p.name.clone(),
            value: match &p.value {
                H::Int(v) => S::Int(*v),
                H::Float(v) => S::Float(*v),
                H::Flag(v) => S::Flag(*v),
                H::Text(v) => S::Text(v.clone()),
            },
        })
        .collect()
}
