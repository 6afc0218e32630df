//! A drafter's records in the content-addressed cache, so that re-evaluating a checkpoint on the
//! same sequences (a cached rerun, a series whose older checkpoints were evaluated before) needs
//! neither the target's hidden states nor a drafter forward.
//!
//! The records of one sequence are a deterministic function of the target's outputs over it (its
//! hidden states and top-K: the target's identity, backend, dtype and code version, as in every
//! cache key), the drafter's files (sha256), where the prompt ends, the evaluation options and the
//! evaluation code ([`RECORDS_VERSION`]). All of it is in the key, so a hit is bit-identical to
//! what the drafter would compute again. Entries hold the record columns of
//! [`RecordBatch`] (`draftlens_records::COLUMNS`) without the prompt index (a run's own
//! numbering), one tensor per column under its name.

use super::eval::EvalOptions;
use crate::backend::Backend;
use crate::hidden_cache::{CacheKey, CachedData, CachedTensor};
use crate::records::{columns_per_prompt, ColumnData, ColumnRef, Element, RecordBatch};
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

/// A column as a tensor's data: u8 columns are widened to u32 (safetensors' U8 is not a
/// dtype the cache writes).
fn to_cached(col: ColumnRef<'_>) -> CachedData {
    match col {
        ColumnRef::U8(v) => CachedData::U32(v.iter().map(|&x| x as u32).collect()),
        ColumnRef::U32(v) => CachedData::U32(v.to_vec()),
        ColumnRef::F32(v) => CachedData::F32(v.to_vec()),
    }
}

/// A tensor's data as a column of `element`; `None` when it is another type or a u8 column
/// holds a value over 255.
fn from_cached(data: CachedData, element: Element) -> Option<ColumnData> {
    match (data, element) {
        (CachedData::U32(v), Element::U8) => v
            .into_iter()
            .map(|x| u8::try_from(x).ok())
            .collect::<Option<Vec<u8>>>()
            .map(ColumnData::U8),
        (CachedData::U32(v), Element::U32) => Some(ColumnData::U32(v)),
        (CachedData::F32(v), Element::F32) => Some(ColumnData::F32(v)),
        _ => None,
    }
}

/// The entry of one sequence's records: one tensor per record column but the prompt index,
/// named as the column (an optional column only when present).
pub fn to_tensors(r: &RecordBatch) -> Vec<CachedTensor> {
    columns_per_prompt()
        .iter()
        .filter_map(|c| {
            let data = to_cached(r.column(c)?);
            Some(CachedTensor {
                name: c.name.into(),
                shape: vec![data.len()],
                data,
            })
        })
        .collect()
}

/// The records of an entry, numbered `prompt_index`; `None` when the entry does not hold a
/// well-formed batch of this block size and top-K (it is then recomputed).
pub fn from_tensors(
    tensors: Vec<CachedTensor>,
    block_size: u32,
    top_k: u32,
    prompt_index: u32,
) -> Option<RecordBatch> {
    let mut tensors: std::collections::HashMap<String, CachedData> =
        tensors.into_iter().map(|t| (t.name, t.data)).collect();
    if block_size == 0 {
        return None;
    }
    let mut batch = RecordBatch::new(block_size, top_k);
    for c in columns_per_prompt() {
        let data = match tensors.remove(c.name) {
            Some(data) => Some(from_cached(data, c.element)?),
            None => None,
        };
        batch.set_column(c, data).ok()?;
    }
    batch.prompt_index = vec![prompt_index; batch.num_blocks()];
    // Complete columns, and the optional ones (the target's top-K) all present or all absent.
    let present: Vec<bool> = columns_per_prompt()
        .iter()
        .filter(|c| c.is_optional())
        .map(|c| batch.column(c).is_some())
        .collect();
    let together = present.windows(2).all(|w| w[0] == w[1]);
    (batch.check().is_ok() && together).then_some(batch)
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
        use crate::hidden_cache::tensors_checksum;
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
