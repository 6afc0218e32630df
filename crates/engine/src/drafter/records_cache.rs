//! A drafter's records in the content-addressed cache, so that re-evaluating a checkpoint on the
//! same sequences (a cached rerun, a series whose older checkpoints were evaluated before) needs
//! neither the target's hidden states nor a drafter forward.
//!
//! The records of one sequence are a deterministic function of the target's outputs over it (its
//! hidden states and top-K: the target's identity, backend, dtype and code version, as in every
//! cache key), the drafter's files (sha256), where the prompt ends, the evaluation options and the
//! evaluation code ([`RECORDS_VERSION`]). All of it is in the key, so a hit is bit-identical to
//! what the drafter would compute again. Entries hold the record columns of
//! [`RecordBatch`] without the prompt index (a run's own numbering).

use super::eval::EvalOptions;
use crate::backend::Backend;
use crate::cache::{CacheKey, CachedData, CachedTensor};
use crate::records::RecordBatch;
use crate::session::Session;
use anyhow::Result;

/// Bumped whenever the evaluation (anchors, labels, record layout) changes what a sequence's
/// records are for the same drafter and target outputs.
pub const RECORDS_VERSION: &str = "1";

/// The key of the records of `ids` (prompt of `prompt_len` tokens + continuation) drafted by the
/// checkpoint whose files hash to `drafter_sha256`, reading the target's hidden states `taps`.
pub fn key<B: Backend>(
    s: &Session<B>,
    ids: &[u32],
    prompt_len: usize,
    taps: &[usize],
    drafter_sha256: &str,
    opts: &EvalOptions,
) -> Result<CacheKey> {
    let extra = format!(
        "drafter={drafter_sha256};prompt_len={prompt_len};eval={};records=v{RECORDS_VERSION}",
        serde_json::to_string(opts)?
    );
    s.derived_key("draft", ids, taps.to_vec(), extra)
}

fn u8s(v: &[u8]) -> CachedData {
    CachedData::U32(v.iter().map(|&x| x as u32).collect())
}

/// The entry of one sequence's records.
pub fn to_tensors(r: &RecordBatch) -> Vec<CachedTensor> {
    let t = |name: &str, data: CachedData| CachedTensor {
        name: name.into(),
        shape: vec![data.len()],
        data,
    };
    let mut out = vec![
        t("anchor", CachedData::U32(r.anchor.clone())),
        t("region", u8s(&r.region)),
        t("target", CachedData::U32(r.target.clone())),
        t("valid", u8s(&r.valid)),
        t("loss_mask", u8s(&r.loss_mask)),
        t("draft_ids", CachedData::U32(r.draft_ids.clone())),
        t("draft_logprobs", CachedData::F32(r.draft_logprobs.clone())),
    ];
    if let (Some(ids), Some(lps)) = (&r.target_ids, &r.target_logprobs) {
        out.push(t("target_ids", CachedData::U32(ids.clone())));
        out.push(t("target_logprobs", CachedData::F32(lps.clone())));
    }
    out
}

/// The records of an entry, numbered `prompt_index`; `None` when the entry does not hold a
/// well-formed batch of this block size and top-K (it is then recomputed).
pub fn from_tensors(
    tensors: Vec<CachedTensor>,
    block_size: u32,
    top_k: u32,
    prompt_index: u32,
) -> Option<RecordBatch> {
    let mut cols: std::collections::HashMap<String, CachedData> =
        tensors.into_iter().map(|t| (t.name, t.data)).collect();
    let mut u32s = |name: &str| match cols.remove(name) {
        Some(CachedData::U32(v)) => Some(v),
        _ => None,
    };
    let anchor = u32s("anchor")?;
    let narrow = |v: Vec<u32>| {
        v.into_iter()
            .map(u8::try_from)
            .collect::<Result<Vec<u8>, _>>()
    };
    let region = narrow(u32s("region")?).ok()?;
    let target = u32s("target")?;
    let valid = narrow(u32s("valid")?).ok()?;
    let loss_mask = narrow(u32s("loss_mask")?).ok()?;
    let draft_ids = u32s("draft_ids")?;
    let target_ids = u32s("target_ids");
    let mut f32s = |name: &str| match cols.remove(name) {
        Some(CachedData::F32(v)) => Some(v),
        _ => None,
    };
    let draft_logprobs = f32s("draft_logprobs")?;
    let target_logprobs = f32s("target_logprobs");
    let n = anchor.len();
    let positions = n * (block_size as usize).checked_sub(1)?;
    let candidates = positions * top_k as usize;
    let ok = region.len() == n
        && [target.len(), valid.len(), loss_mask.len()] == [positions; 3]
        && draft_ids.len() == candidates
        && draft_logprobs.len() == candidates
        && target_ids.as_ref().map(Vec::len) == target_logprobs.as_ref().map(Vec::len)
        && target_ids.as_ref().is_none_or(|v| v.len() == candidates);
    ok.then(|| RecordBatch {
        block_size,
        top_k,
        prompt_index: vec![prompt_index; n],
        anchor,
        region,
        target,
        valid,
        loss_mask,
        draft_ids,
        draft_logprobs,
        target_ids,
        target_logprobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> RecordBatch {
        let (b, k) = (3u32, 2u32);
        RecordBatch {
            block_size: b,
            top_k: k,
            prompt_index: vec![7, 7],
            anchor: vec![4, 5],
            region: vec![1, 1],
            target: vec![10, 11, 12, 0],
            valid: vec![1, 1, 1, 0],
            loss_mask: vec![1, 1, 1, 0],
            draft_ids: (0..8).collect(),
            draft_logprobs: (0..8).map(|x| -(x as f32) / 3.0).collect(),
            target_ids: Some((10..18).collect()),
            target_logprobs: Some(vec![-0.5; 8]),
        }
    }

    #[test]
    fn records_round_trip_and_take_the_runs_prompt_index() {
        let r = batch();
        let back = from_tensors(to_tensors(&r), 3, 2, 9).expect("well-formed");
        assert_eq!(back.prompt_index, vec![9, 9]);
        assert_eq!(
            RecordBatch {
                prompt_index: r.prompt_index.clone(),
                ..back
            },
            r
        );
    }

    /// The entry's tensors (names, dtypes, shapes, little-endian bytes) are pinned: entries
    /// written by an earlier build must keep reading as hits under the same key.
    #[test]
    fn entry_tensors_are_pinned() {
        use crate::cache::tensors_checksum;
        let checksum = |r: &RecordBatch| {
            let tensors = to_tensors(r);
            let bytes: Vec<(safetensors::Dtype, Vec<u8>)> = tensors
                .iter()
                .map(|t| match &t.data {
                    CachedData::U32(v) => (
                        safetensors::Dtype::U32,
                        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    ),
                    CachedData::F32(v) => (
                        safetensors::Dtype::F32,
                        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    ),
                    other => panic!("{}: unexpected data {other:?}", t.name),
                })
                .collect();
            let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            let sum = tensors_checksum(
                &tensors
                    .iter()
                    .zip(&bytes)
                    .map(|(t, (dt, b))| (t.name.as_str(), *dt, t.shape.as_slice(), b.as_slice()))
                    .collect::<Vec<_>>(),
            );
            (names.join(","), sum)
        };
        let mut no_target = batch();
        no_target.target_ids = None;
        no_target.target_logprobs = None;
        assert_eq!(
            [checksum(&batch()), checksum(&no_target)],
            [
                (
                    "anchor,region,target,valid,loss_mask,draft_ids,draft_logprobs,target_ids,\
                     target_logprobs"
                        .to_string(),
                    "sha256:49a8778ef91341bcc2a84446613c803f0cf1d91aba241970aa652efb96e89f6d"
                        .to_string()
                ),
                (
                    "anchor,region,target,valid,loss_mask,draft_ids,draft_logprobs".to_string(),
                    "sha256:f629309f48a0e084ea6c8bd4f43bd19c648b98fad7313a422ca001e5b1ad6f3e"
                        .to_string()
                ),
            ]
        );
        assert_eq!(RECORDS_VERSION, "1");
    }

    #[test]
    fn malformed_entries_are_misses() {
        let r = batch();
        // Another block size or top-K than the run's: not these records.
        assert!(from_tensors(to_tensors(&r), 4, 2, 0).is_none());
        assert!(from_tensors(to_tensors(&r), 3, 3, 0).is_none());
        // A column missing, of the wrong type, or too short.
        let mut t = to_tensors(&r);
        t.retain(|x| x.name != "valid");
        assert!(from_tensors(t, 3, 2, 0).is_none());
        let mut t = to_tensors(&r);
        t[0].data = CachedData::F32(vec![4.0, 5.0]);
        assert!(from_tensors(t, 3, 2, 0).is_none());
        let mut t = to_tensors(&r);
        if let CachedData::U32(v) = &mut t[5].data {
            v.pop();
        }
        assert!(from_tensors(t, 3, 2, 0).is_none());
        // A flag that does not fit a byte.
        let mut t = to_tensors(&r);
        t[1].data = CachedData::U32(vec![1, 300]);
        assert!(from_tensors(t, 3, 2, 0).is_none());
    }
}
