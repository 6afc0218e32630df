//! The attention masks as the kernels see them: per query row, the key intervals
//! `[lo1, hi1, lo2, hi2]` of [`crate::backend::KeyIntervals`] (the masks' one interpretation,
//! `backend/mask.rs`), flattened to i32.

use super::CudaBackend;
use crate::backend::{varlen_key_intervals, AttnMask, KeyIntervals};
use anyhow::Result;

fn flatten(rows: Vec<KeyIntervals>) -> Vec<i32> {
    rows.iter().flat_map(KeyIntervals::as_i32).collect()
}

impl CudaBackend {
    /// Key intervals of each query row: `[lo1, hi1, lo2, hi2]` (the kernel's whole view of a mask).
    pub(super) fn mask_intervals(mask: &AttnMask, tq: usize, tk: usize) -> Result<Vec<i32>> {
        Ok(flatten(mask.key_intervals(tq, tk)?))
    }

    /// Key intervals of packed causal sequences ([`varlen_key_intervals`]).
    pub(super) fn varlen_intervals(seq_starts: &[usize], rows: usize) -> Result<Vec<i32>> {
        Ok(flatten(varlen_key_intervals(seq_starts, rows)?))
    }
}
