//! Attention masks and the one place that turns them into the keys each query row sees.
//!
//! The DFlash context rule ("context key j iff j < anchor", `docs/dflash.md` §1.1) is the line
//! this product exists to audit, so it is written once: [`AttnMask::key_intervals`] gives every
//! query row its visible keys as at most two intervals of key rows, and every backend consumes
//! those intervals (the CPU reference masks its score rows with them, the CUDA kernels read them
//! as `[lo1, hi1, lo2, hi2]` quadruples). The tests below check the intervals against the
//! definition, key by key.

use super::SeqStarts;
use anyhow::{ensure, Result};
use std::ops::Range;

/// Which key rows each query row may attend to.
#[derive(Clone, Debug, PartialEq)]
pub enum AttnMask {
    /// Target model. Query row i sits at absolute position `q_start + i`; key row j sits at
    /// absolute position j (the KV cache holds positions 0..). Key j is visible iff
    /// `j <= q_start + i`.
    Causal { q_start: usize },
    /// DFlash drafter over many anchors at once.
    ///
    /// Keys are `[ctx_len context rows (positions 0..ctx_len) | anchors.len() blocks of `block` rows]`,
    /// queries are the block rows only (`anchors.len() * block` rows, block n at positions
    /// `anchors[n] .. anchors[n] + block`). A query of block n sees:
    /// - context key j iff `j < anchors[n]` (`j <= anchors[n]` when `ctx_inclusive`: the
    ///   training-time leak of docs/dflash.md §2.4 item 1);
    /// - the rows of its own block: all of them (bidirectional), or only rows at or before its
    ///   own when `causal_in_block` (sliding-window drafter layers);
    /// - with `window = Some(w)`, only keys at positions `>= q_pos - (w - 1)`;
    /// - nothing of any other block.
    ///
    /// With `ctx_inclusive = false` this is exactly one-anchor-at-a-time drafting, batched.
    Blocks {
        ctx_len: usize,
        block: usize,
        anchors: Vec<usize>,
        ctx_inclusive: bool,
        causal_in_block: bool,
        window: Option<usize>,
    },
}

/// The key rows one query row sees: the union of two half-open intervals (`0..0` when unused).
/// For [`AttnMask::Blocks`], `first` lies in the context and `second` in the query's own block;
/// for causal masks `second` is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyIntervals {
    pub first: Range<usize>,
    pub second: Range<usize>,
}

impl KeyIntervals {
    /// An interval list from two ranges, an empty range normalised to `0..0`.
    fn new(first: Range<usize>, second: Range<usize>) -> Self {
        let norm = |r: Range<usize>| if r.start < r.end { r } else { 0..0 };
        KeyIntervals {
            first: norm(first),
            second: norm(second),
        }
    }

    /// Whether key row `j` is visible.
    pub fn contains(&self, j: usize) -> bool {
        self.first.contains(&j) || self.second.contains(&j)
    }

    /// `[lo1, hi1, lo2, hi2]`, the CUDA kernels' view of a row.
    pub fn as_i32(&self) -> [i32; 4] {
        [
            self.first.start as i32,
            self.first.end as i32,
            self.second.start as i32,
            self.second.end as i32,
        ]
    }
}

impl AttnMask {
    /// The visible keys of each of `tq` query rows over `tk` key rows, checking that the mask
    /// fits those counts (one error message per misfit, shared by every backend).
    pub fn key_intervals(&self, tq: usize, tk: usize) -> Result<Vec<KeyIntervals>> {
        match self {
            AttnMask::Causal { q_start } => {
                ensure!(
                    q_start + tq <= tk,
                    "attention: causal queries end at {} but only {tk} keys exist",
                    q_start + tq
                );
                Ok((0..tq)
                    .map(|i| KeyIntervals::new(0..q_start + i + 1, 0..0))
                    .collect())
            }
            AttnMask::Blocks {
                ctx_len,
                block,
                anchors,
                ctx_inclusive,
                causal_in_block,
                window,
            } => {
                let (ctx_len, block, n) = (*ctx_len, *block, anchors.len());
                ensure!(block > 0, "attention: block size 0");
                ensure!(
                    tq == n * block,
                    "attention: {tq} query rows for {n} blocks of {block}"
                );
                ensure!(
                    tk == ctx_len + n * block,
                    "attention: {tk} keys, expected {ctx_len} context + {} block rows",
                    n * block
                );
                let mut rows = Vec::with_capacity(tq);
                for (b, &a) in anchors.iter().enumerate() {
                    // The context rule: keys before the anchor (through it when inclusive).
                    let ctx_hi = if *ctx_inclusive { a + 1 } else { a }.min(ctx_len);
                    let base = ctx_len + b * block;
                    for o in 0..block {
                        let own_hi = if *causal_in_block { o + 1 } else { block };
                        // A window keeps key positions >= q_pos - (w - 1); context key j is at
                        // position j, own-block row o' at a + o'.
                        let (ctx_lo, own_lo) = match window {
                            Some(w) => ((a + o + 1).saturating_sub(*w), (o + 1).saturating_sub(*w)),
                            None => (0, 0),
                        };
                        rows.push(KeyIntervals::new(
                            ctx_lo..ctx_hi,
                            base + own_lo..base + own_hi,
                        ));
                    }
                }
                Ok(rows)
            }
        }
    }
}

/// `iv` (causal rows: each row's first interval ends just after the key at the query's own
/// position, as [`AttnMask::Causal`] and [`varlen_key_intervals`] give them) cut to a sliding
/// window of `window` keys: a query at position p keeps the keys at positions `p − window + 1
/// ..= p` (transformers' `sliding_window_overlay`: `kv_idx > q_idx − sliding_window`; gpt-oss's
/// `sliding_attention` layers). Refused for [`AttnMask::Blocks`], whose window is its own field.
pub fn causal_window(mask: &AttnMask, iv: &mut [KeyIntervals], window: usize) -> Result<()> {
    ensure!(
        matches!(mask, AttnMask::Causal { .. }),
        "attention: a sliding window on drafter blocks goes in AttnMask::Blocks"
    );
    window_causal_rows(iv, window);
    Ok(())
}

/// [`causal_window`] on rows known to be causal (each row's first interval ending just after
/// its own position: [`AttnMask::Causal`], [`varlen_key_intervals`]).
pub fn window_causal_rows(iv: &mut [KeyIntervals], window: usize) {
    for row in iv {
        let lo = row.first.start.max(row.first.end.saturating_sub(window));
        *row = KeyIntervals::new(lo..row.first.end, row.second.clone());
    }
}

/// Causal attention over sequences packed row-wise (`seq_starts` runs from 0 to `rows`): a row
/// sees the rows of its own sequence at or before itself.
pub fn varlen_key_intervals(seq_starts: &SeqStarts, rows: usize) -> Result<Vec<KeyIntervals>> {
    seq_starts.check_rows("attention_varlen", rows)?;
    let mut r = Vec::with_capacity(rows);
    for w in seq_starts.windows(2) {
        r.extend((w[0]..w[1]).map(|i| KeyIntervals::new(w[0]..i + 1, 0..0)));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition of [`AttnMask::Blocks`] as its doc states it, one (query, key) pair at a
    /// time, with positions spelled out.
    fn blocks_visible(m: &AttnMask, q: usize, j: usize) -> bool {
        let AttnMask::Blocks {
            ctx_len,
            block,
            anchors,
            ctx_inclusive,
            causal_in_block,
            window,
        } = m
        else {
            unreachable!()
        };
        let (b, o) = (q / block, q % block);
        let q_pos = anchors[b] + o;
        let (k_pos, seen) = if j < *ctx_len {
            // Context key j: j < anchor (j <= anchor when inclusive).
            let seen = if *ctx_inclusive {
                j <= anchors[b]
            } else {
                j < anchors[b]
            };
            (j, seen)
        } else {
            let (kb, ko) = ((j - ctx_len) / block, (j - ctx_len) % block);
            (anchors[b] + ko, kb == b && (!causal_in_block || ko <= o))
        };
        seen && window.is_none_or(|w| k_pos + w > q_pos)
    }

    #[test]
    fn blocks_intervals_match_the_definition_key_by_key() {
        let mut checked = 0;
        for ctx_len in [0, 1, 5, 9] {
            for block in [1, 2, 4] {
                for anchors in [vec![], vec![0], vec![3], vec![0, 4, 8], vec![9, 2, 12]] {
                    for ctx_inclusive in [false, true] {
                        for causal_in_block in [false, true] {
                            for window in [None, Some(1), Some(2), Some(3), Some(7)] {
                                let m = AttnMask::Blocks {
                                    ctx_len,
                                    block,
                                    anchors: anchors.clone(),
                                    ctx_inclusive,
                                    causal_in_block,
                                    window,
                                };
                                let (tq, tk) =
                                    (anchors.len() * block, ctx_len + anchors.len() * block);
                                let iv = m.key_intervals(tq, tk).unwrap();
                                assert_eq!(iv.len(), tq);
                                for (q, row) in iv.iter().enumerate() {
                                    assert!(
                                        row.first.end <= ctx_len,
                                        "context interval leaves the context"
                                    );
                                    for j in 0..tk {
                                        assert_eq!(
                                            row.contains(j),
                                            blocks_visible(&m, q, j),
                                            "{m:?} query {q} key {j}: {row:?}"
                                        );
                                        checked += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn causal_and_varlen_intervals_match_the_definition() {
        for q_start in [0, 1, 6] {
            for tq in [0, 1, 5] {
                let tk = q_start + tq + 2;
                let iv = AttnMask::Causal { q_start }.key_intervals(tq, tk).unwrap();
                for (i, row) in iv.iter().enumerate() {
                    for j in 0..tk {
                        assert_eq!(row.contains(j), j <= q_start + i, "{q_start} {i} {j}");
                    }
                }
            }
        }
        let starts = SeqStarts::new(vec![0, 3, 3, 7, 8]).unwrap();
        let iv = varlen_key_intervals(&starts, 8).unwrap();
        let seq = |r: usize| {
            starts
                .windows(2)
                .position(|w| w[0] <= r && r < w[1])
                .unwrap()
        };
        for (i, row) in iv.iter().enumerate() {
            for j in 0..8 {
                assert_eq!(row.contains(j), seq(j) == seq(i) && j <= i, "{i} {j}");
            }
        }
    }

    #[test]
    fn causal_window_keeps_the_last_window_positions() {
        for q_start in [0, 3, 9] {
            for window in [1, 2, 4, 64] {
                let (tq, tk) = (6, q_start + 6);
                let mask = AttnMask::Causal { q_start };
                let mut iv = mask.key_intervals(tq, tk).unwrap();
                causal_window(&mask, &mut iv, window).unwrap();
                for (i, row) in iv.iter().enumerate() {
                    let q_pos = q_start + i;
                    for j in 0..tk {
                        // transformers: kv_idx <= q_idx and kv_idx > q_idx - sliding_window.
                        let want = j <= q_pos && j as i64 > q_pos as i64 - window as i64;
                        assert_eq!(row.contains(j), want, "{q_start} {window} {i} {j}");
                    }
                }
            }
        }
        let blocks = AttnMask::Blocks {
            ctx_len: 0,
            block: 1,
            anchors: vec![0],
            ctx_inclusive: false,
            causal_in_block: true,
            window: None,
        };
        assert!(causal_window(&blocks, &mut [], 2).is_err());
    }

    #[test]
    fn masks_that_do_not_fit_the_shapes_are_errors() {
        let e = AttnMask::Causal { q_start: 3 }
            .key_intervals(4, 6)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "attention: causal queries end at 7 but only 6 keys exist"
        );
        let m = |block| AttnMask::Blocks {
            ctx_len: 4,
            block,
            anchors: vec![1, 2],
            ctx_inclusive: false,
            causal_in_block: false,
            window: None,
        };
        assert_eq!(
            m(0).key_intervals(0, 4).unwrap_err().to_string(),
            "attention: block size 0"
        );
        assert_eq!(
            m(3).key_intervals(5, 10).unwrap_err().to_string(),
            "attention: 5 query rows for 2 blocks of 3"
        );
        assert_eq!(
            m(3).key_intervals(6, 9).unwrap_err().to_string(),
            "attention: 9 keys, expected 4 context + 6 block rows"
        );
        // Starts that end before the rows; starts that are no layout at all.
        let short = SeqStarts::new(vec![0, 2]).unwrap();
        assert!(varlen_key_intervals(&short, 3).is_err());
        for bad in [vec![1, 3], vec![0, 2, 1, 3], vec![]] {
            assert!(SeqStarts::new(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
