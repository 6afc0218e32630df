//! The attention masks as the kernels see them: per query row, the key intervals
//! `[lo1, hi1, lo2, hi2]` of [`crate::backend::KeyIntervals`] (the masks' one interpretation,
//! `backend/mask.rs`), flattened to i32.

use crate::backend::mask::{causal_window, window_causal_rows};
use crate::backend::{varlen_key_intervals, AttnMask, KeyIntervals, SeqStarts};
use anyhow::Result;

/// The mask of one attention call; also the key of the uploaded-mask cache (a new upload happens
/// only when it changes). `window`: gpt-oss's sliding window on a causal mask
/// ([`crate::backend::AttnExtras::window`]), `None` for plain attention.
#[derive(Clone, PartialEq)]
pub(super) enum MaskKey {
    /// A [`Backend::attention`](crate::backend::Backend::attention) mask over (queries, keys).
    Mask {
        mask: AttnMask,
        tq: usize,
        tk: usize,
        window: Option<usize>,
    },
    /// Packed causal sequences starting at these rows.
    Varlen {
        seq_starts: SeqStarts,
        window: Option<usize>,
    },
}

impl MaskKey {
    /// Packed causal sequences starting at `seq_starts`, cut to `window` keys if given.
    pub(super) fn varlen(seq_starts: &SeqStarts, window: Option<usize>) -> MaskKey {
        MaskKey::Varlen {
            seq_starts: seq_starts.clone(),
            window,
        }
    }

    /// `[lo1, hi1, lo2, hi2]` of each of the `tq` query rows.
    pub(super) fn intervals(&self, tq: usize) -> Result<Vec<i32>> {
        let rows = match self {
            MaskKey::Mask {
                mask,
                tq,
                tk,
                window,
            } => {
                let mut iv = mask.key_intervals(*tq, *tk)?;
                if let Some(w) = *window {
                    causal_window(mask, &mut iv, w)?;
                }
                iv
            }
            MaskKey::Varlen { seq_starts, window } => {
                let mut iv = varlen_key_intervals(seq_starts, tq)?;
                if let Some(w) = *window {
                    window_causal_rows(&mut iv, w);
                }
                iv
            }
        };
        Ok(rows.iter().flat_map(KeyIntervals::as_i32).collect())
    }

    /// Whether the first attention kernel walks query blocks last-first (causal masks: the
    /// heaviest blocks first).
    pub(super) fn reverse(&self) -> bool {
        !matches!(
            self,
            MaskKey::Mask {
                mask: AttnMask::Blocks { .. },
                ..
            }
        )
    }
}
