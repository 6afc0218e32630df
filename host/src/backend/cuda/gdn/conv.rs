//! The causal conv1d + SiLU of the hybrid layers on CUDA (docs/gdn-cuda.md): `gdn_conv_silu` or
//! the 8-channel `gdn_conv_silu_v8` for the outputs, then `gdn_conv_state` for the carried states;
//! the host reference for convs of more taps than the state kernel keeps in registers.

use super::{row_pairs, MAX_CONV_HIST};
use crate::backend::cuda::{blocks, derr, CudaBackend, CudaTensor};
use crate::backend::gdn::check_seq_starts;
use anyhow::{ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// [`crate::backend::Backend::causal_conv1d_silu`] with the output kernel picked: `vectorised`
    /// runs `gdn_conv_silu_v8` (8 channels per thread, the same bits; docs/gdn-cuda.md, "Round 2")
    /// where the shape allows it (channels a multiple of 8, at most 4 taps), else `gdn_conv_silu`.
    /// Every sequence in two launches (the outputs, then the states), whatever its length
    /// (one-token decode included); the trait method passes `vectorised = false`.
    pub fn causal_conv1d_silu_with(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        seq_starts: &[usize],
        states: &mut [&mut CudaTensor],
        vectorised: bool,
    ) -> Result<CudaTensor> {
        let (rows, c) = (x.rows, x.cols);
        let (wc, k) = (weight.rows, weight.cols);
        ensure!(
            wc == c && k >= 1,
            "causal_conv1d: weight is [{wc}, {k}] for {c} channels"
        );
        check_seq_starts("causal_conv1d", seq_starts, rows, states.len())?;
        for st in states.iter() {
            ensure!(
                (st.rows, st.cols) == (k - 1, c),
                "causal_conv1d: state is [{}, {}], expected [{}, {c}]",
                st.rows,
                st.cols,
                k - 1
            );
        }
        if k - 1 > MAX_CONV_HIST {
            return crate::backend::host_causal_conv1d_silu(self, x, weight, seq_starts, states);
        }
        let mut y = self.new_tensor(rows, c)?;
        // No rows: every state is already the last k−1 inputs.
        if c == 0 || rows == 0 {
            return Ok(y);
        }
        let nseq = states.len();
        let pairs = self.upload(&row_pairs(seq_starts, &(0..nseq).collect::<Vec<_>>()))?;
        let ptrs: Vec<u64> = states.iter().map(|s| self.ptr(&s.buf)).collect();
        let ptrs = self.upload(&ptrs)?;
        let (ld, c32, k32) = (c as i64, c as i32, k as i32);
        {
            let mut row_seq = Vec::with_capacity(rows);
            for (i, w) in seq_starts.windows(2).enumerate() {
                row_seq.extend(std::iter::repeat_n(i as i32, w[1] - w[0]));
            }
            let row_seq = self.upload(&row_seq)?;
            let v8 = vectorised && c.is_multiple_of(8) && k <= 4;
            let name = if v8 {
                "gdn_conv_silu_v8"
            } else {
                "gdn_conv_silu"
            };
            let f = self.kernels.get("gdn", name)?;
            let rows64 = rows as i64;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&x.buf)
                .arg(&ld)
                .arg(&weight.buf)
                .arg(&mut y.buf)
                .arg(&row_seq)
                .arg(&pairs)
                .arg(&ptrs)
                .arg(&rows64)
                .arg(&c32)
                .arg(&k32);
            // SAFETY: (const bf16* x, ll, const bf16* w, bf16* y, const int*, const ll*, const u64*,
            // ll, int, int); every state holds (k−1)·c values (checked above).
            // (v8: x is [rows, c], ld = c a multiple of 8, so every 8-channel group is 16-byte
            // aligned in x, y and the states.)
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (
                        blocks(if v8 { c / 8 } else { c }, 128),
                        rows.min(65535) as u32,
                        1,
                    ),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr(name))?;
        }
        if k > 1 && nseq > 0 {
            let f = self.kernels.get("gdn", "gdn_conv_state")?;
            let n32 = nseq as i32;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&x.buf)
                .arg(&ld)
                .arg(&pairs)
                .arg(&ptrs)
                .arg(&n32)
                .arg(&c32)
                .arg(&k32);
            // SAFETY: (const bf16*, ll, const ll*, const u64*, int, int, int), as above.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (blocks(c, 128), nseq as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("gdn_conv_state"))?;
        }
        Ok(y)
    }
}
