//! The mixture-of-experts combine ([`crate::backend::Backend::add_weighted_rows`]) on the device:
//! `kernels/moe.cu`, the arithmetic of the host reference (`backend/moe.rs`) per element.

use super::{derr, CudaBackend, CudaTensor};
use anyhow::Result;
use cudarc::driver::{LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// `acc[r] += Σ_j weights[r·n + j] · src[index[r·n + j]]`, one block per row (shapes checked
    /// by the trait). The term lists go up with the call (a few KB per layer).
    pub(super) fn moe_add_weighted_rows(
        &self,
        acc: &mut CudaTensor,
        src: &CudaTensor,
        index: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        if acc.rows == 0 || acc.cols == 0 {
            return Ok(());
        }
        let n = (index.len() / acc.rows) as i32;
        let (idx, w) = (self.upload(index)?, self.upload(weights)?);
        let f = self
            .kernels
            .get("elementwise", "moe_add_weighted_rows_bf16")?;
        let cols = acc.cols as i64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut acc.buf)
            .arg(&src.buf)
            .arg(&idx)
            .arg(&w)
            .arg(&cols)
            .arg(&n);
        // SAFETY: (bf16*, const bf16*, const u32*, const float*, ll, int): acc holds rows · cols
        // values, index and weights rows · n entries, every index below src's row count (checked
        // by the trait), src holds cols values per row.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (acc.rows as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("moe_add_weighted_rows_bf16"))?;
        Ok(())
    }
}
