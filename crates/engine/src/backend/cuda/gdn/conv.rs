//! The causal conv1d + SiLU of the hybrid layers on CUDA (docs/gdn-cuda.md): one of three output
//! kernels ([`ConvKernel`]: the same bits), then `gdn_conv_state` for the carried states; the host
//! reference for convs of more taps than the state kernel keeps in registers.

use super::{row_pairs, MAX_CONV_HIST};
use crate::backend::cuda::{blocks, derr, CudaBackend, CudaTensor};
use crate::backend::SeqStarts;
use anyhow::{ensure, Result};
use cudarc::driver::LaunchConfig;

/// Which kernel computes the conv outputs. All three run the same fmaf chain over the taps per
/// channel and round once, so they give the same bits (`cuda_gdn` asserts it); they differ in how
/// the work is cut (docs/gdn-cuda.md, "Round 3").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvKernel {
    /// `gdn_conv_silu`: one channel and one row per thread, any shape.
    OneChannel,
    /// `gdn_conv_silu_v8`: 8 channels (16-byte accesses) and one row per thread.
    V8,
    /// `gdn_conv_silu_rows4` (the default): 8 channels and a run of 16 rows per thread with a
    /// sliding window of the last 3 inputs in registers, for 4 taps.
    Rows,
}

impl ConvKernel {
    /// The kernel that runs for `channels` channels and `taps` taps: the one asked for where the
    /// shape allows it, else `OneChannel`.
    pub fn for_shape(self, channels: usize, taps: usize) -> ConvKernel {
        let v8 = channels.is_multiple_of(8);
        match self {
            ConvKernel::Rows if v8 && taps == 4 => ConvKernel::Rows,
            ConvKernel::V8 if v8 && taps <= 4 => ConvKernel::V8,
            _ => ConvKernel::OneChannel,
        }
    }

    fn function(self) -> &'static str {
        match self {
            ConvKernel::OneChannel => "gdn_conv_silu",
            ConvKernel::V8 => "gdn_conv_silu_v8",
            ConvKernel::Rows => "gdn_conv_silu_rows4",
        }
    }
}

/// Rows per thread of `gdn_conv_silu_rows4` (`GDN_CONV_ROWS` in kernels/gdn.cu).
const CONV_ROWS: usize = 16;

impl CudaBackend {
    /// [`crate::backend::Backend::causal_conv1d_silu`] with the output kernel picked
    /// ([`ConvKernel::for_shape`]). Every sequence in two launches (the outputs, then the
    /// states), whatever its length (one-token decode included); the trait method passes
    /// [`ConvKernel::Rows`].
    pub fn causal_conv1d_silu_with(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        seq_starts: &SeqStarts,
        states: &mut [&mut CudaTensor],
        kernel: ConvKernel,
    ) -> Result<CudaTensor> {
        let (rows, c) = (x.rows, x.cols);
        let (wc, k) = (weight.rows, weight.cols);
        ensure!(
            wc == c && k >= 1,
            "causal_conv1d: weight is [{wc}, {k}] for {c} channels"
        );
        seq_starts.check_rows_and_states("causal_conv1d", rows, states.len())?;
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
            // Past a million rows one launch of `Rows` no longer covers them: `V8` strides.
            let kernel = match kernel.for_shape(c, k) {
                ConvKernel::Rows if rows.div_ceil(CONV_ROWS) > 65535 => ConvKernel::V8,
                kernel => kernel,
            };
            let name = kernel.function();
            let f = self.kernels.get("gdn", name)?;
            let rows64 = rows as i64;
            let mut b = self.launch_builder(&f);
            b.arg(&x.buf)
                .arg(&ld)
                .arg(&weight.buf)
                .arg(&mut y.buf)
                .arg(&row_seq)
                .arg(&pairs)
                .arg(&ptrs)
                .arg(&rows64)
                .arg(&c32);
            if kernel != ConvKernel::Rows {
                b.arg(&k32);
            }
            let (threads, grid_y) = match kernel {
                ConvKernel::OneChannel => (c, rows.min(65535)),
                ConvKernel::V8 => (c / 8, rows.min(65535)),
                ConvKernel::Rows => (c / 8, rows.div_ceil(CONV_ROWS)),
            };
            // SAFETY: (const bf16* x, ll, const bf16* w, bf16* y, const int*, const ll*, const u64*,
            // ll, int[, int]); every state holds (k−1)·c values (checked above). V8 and Rows: x is
            // [rows, c], ld = c a multiple of 8, so every 8-channel group is 16-byte aligned in x,
            // y and the states. OneChannel and V8 stride over rows past 65535; Rows covers
            // 16 rows per block row, at most 65535 block rows (above).
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (blocks(threads, 128), grid_y as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr(name))?;
        }
        if k > 1 && nseq > 0 {
            let f = self.kernels.get("gdn", "gdn_conv_state")?;
            let n32 = nseq as i32;
            let mut b = self.launch_builder(&f);
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
