//! The attention masks as the kernels see them: per query row, the key intervals
//! `[lo1, hi1, lo2, hi2]`.

use super::CudaBackend;
use crate::backend::AttnMask;
use anyhow::{ensure, Result};

impl CudaBackend {
    /// Key intervals of each query row: `[lo1, hi1, lo2, hi2]` (the kernel's whole view of a mask).
    pub(super) fn mask_intervals(mask: &AttnMask, tq: usize, tk: usize) -> Result<Vec<i32>> {
        let mut r = Vec::with_capacity(tq * 4);
        match mask {
            AttnMask::Causal { q_start } => {
                ensure!(
                    q_start + tq <= tk,
                    "attention: causal queries end at {} but only {tk} keys exist",
                    q_start + tq
                );
                for i in 0..tq {
                    r.extend_from_slice(&[0, (q_start + i + 1) as i32, 0, 0]);
                }
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
                for (b, &a) in anchors.iter().enumerate() {
                    let ctx_hi = if *ctx_inclusive {
                        (a + 1).min(ctx_len)
                    } else {
                        a.min(ctx_len)
                    };
                    for o in 0..block {
                        let qpos = a + o;
                        let (mut lo1, hi1) = (0usize, ctx_hi);
                        let (mut olo, ohi) = (0usize, if *causal_in_block { o + 1 } else { block });
                        if let Some(w) = window {
                            // key position >= qpos - (w - 1)
                            lo1 = lo1.max((qpos + 1).saturating_sub(*w));
                            olo = olo.max((o + 1).saturating_sub(*w));
                        }
                        let (lo1, hi1) = if lo1 < hi1 { (lo1, hi1) } else { (0, 0) };
                        let base = ctx_len + b * block;
                        let (lo2, hi2) = if olo < ohi {
                            (base + olo, base + ohi)
                        } else {
                            (0, 0)
                        };
                        r.extend_from_slice(&[lo1 as i32, hi1 as i32, lo2 as i32, hi2 as i32]);
                    }
                }
            }
        }
        Ok(r)
    }

    pub(super) fn varlen_intervals(seq_starts: &[usize], rows: usize) -> Result<Vec<i32>> {
        ensure!(
            seq_starts.first() == Some(&0) && seq_starts.last() == Some(&rows),
            "attention_varlen: sequence starts must run from 0 to {rows}, got {:?}..{:?}",
            seq_starts.first(),
            seq_starts.last()
        );
        let mut r = Vec::with_capacity(rows * 4);
        for w in seq_starts.windows(2) {
            ensure!(
                w[0] <= w[1],
                "attention_varlen: sequence starts are not increasing"
            );
            for i in w[0]..w[1] {
                r.extend_from_slice(&[w[0] as i32, (i + 1) as i32, 0, 0]);
            }
        }
        Ok(r)
    }
}
