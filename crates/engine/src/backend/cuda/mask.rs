//! The attention masks as the kernels see them: per query row, the key intervals
//! `[lo1, hi1, lo2, hi2]` of [`crate::backend::KeyIntervals`] (the masks' one interpretation,
//! `backend/mask.rs`), flattened to i32.

use crate::backend::{varlen_key_intervals, AttnMask, KeyIntervals, SeqStarts};
use anyhow::Result;

/// The mask of one attention call; also the key of the uploaded-mask cache (a new upload happens
/// only when it changes).
#[derive(Clone, PartialEq)]
pub(super) enum MaskKey {
    /// A [`Backend::attention`](crate::backend::Backend::attention) mask over (queries, keys).
    Mask(AttnMask, usize, usize),
    /// Packed causal sequences starting at these rows.
    Varlen(SeqStarts),
}

impl MaskKey {
    /// `[lo1, hi1, lo2, hi2]` of each of the `tq` query rows.
    pub(super) fn intervals(&self, tq: usize) -> Result<Vec<i32>> {
        let rows = match self {
            MaskKey::Mask(mask, tq, tk) => mask.key_intervals(*tq, *tk)?,
            MaskKey::Varlen(seq_starts) => varlen_key_intervals(seq_starts, tq)?,
        };
        Ok(rows.iter().flat_map(KeyIntervals::as_i32).collect())
    }

    /// Whether the first attention kernel walks query blocks last-first (causal masks: the
    /// heaviest blocks first).
    pub(super) fn reverse(&self) -> bool {
        !matches!(self, MaskKey::Mask(AttnMask::Blocks { .. }, _, _))
    }
}
