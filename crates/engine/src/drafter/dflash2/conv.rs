//! The grouped dynamic causal convolution DFlash2 puts around each layer's attention and MLP
//! (`dflash.model.GroupedDynamicCausalConv`, docs/dflash2.md §2).
//!
//! ```text
//! dynamic = kernel_projection(h)                  [rows, 2·K·G], viewed [rows, 2, K, G]
//! prepare: h' = conv(h, base_kernel[0], dynamic[:, 0])        (before the attention / MLP)
//! finish:  y' = conv(y, base_kernel[1], dynamic[:, 1])        (on its output, same dynamic)
//! conv(x, base, dyn)[t, c] = Σ_{o<K} (base[o, c] + dyn[t, o, c / group]) · x[t − o, c]
//! ```
//! x[t − o] is zero before the block's first row: each block is its own sequence (the anchor
//! row first), never reaching into the context or another anchor's block. The dynamic kernel of
//! both halves comes from the input of `prepare`.
//!
//! The arithmetic runs on the host through the backend seam (download, convolve, upload): every
//! backend gets it without a kernel of its own; on a GPU it costs two transfers per half.

use crate::backend::Backend;
use anyhow::{ensure, Result};

/// One convolution's weights.
pub struct GroupedDynamicConv<B: Backend> {
    /// `base_kernel` `[2, K, D]` row-major (half, offset, channel).
    pub base: Vec<f32>,
    /// `kernel_projection` `[2·K·G, D]`.
    pub projection: B::Matrix,
    pub kernel: usize,
    pub group: usize,
}

/// The dynamic kernel of one `prepare`: `[rows, 2, K, G]` row-major, on the host.
pub struct DynamicKernel(Vec<f32>);

impl<B: Backend> GroupedDynamicConv<B> {
    /// The first half on `h` (`[n·block, D]`, blocks of `block` rows) and the dynamic kernel the
    /// second half needs.
    pub fn prepare(
        &self,
        be: &B,
        h: &B::Tensor,
        block: usize,
    ) -> Result<(B::Tensor, DynamicKernel)> {
        let dynamic = be.to_host(&be.matmul(h, &self.projection)?)?;
        let out = self.apply(be, h, &dynamic, 0, block)?;
        Ok((out, DynamicKernel(dynamic)))
    }

    /// The second half on `y`, the attention's or MLP's output for the rows `prepare` saw.
    pub fn finish(
        &self,
        be: &B,
        y: &B::Tensor,
        dynamic: &DynamicKernel,
        block: usize,
    ) -> Result<B::Tensor> {
        self.apply(be, y, &dynamic.0, 1, block)
    }

    fn apply(
        &self,
        be: &B,
        x: &B::Tensor,
        dynamic: &[f32],
        half: usize,
        block: usize,
    ) -> Result<B::Tensor> {
        let (rows, d) = be.dims(x);
        let k = self.kernel;
        let base = &self.base[half * k * d..(half + 1) * k * d];
        let out = convolve(
            &be.to_host(x)?,
            dynamic,
            half,
            base,
            rows,
            d,
            k,
            self.group,
            block,
        )?;
        be.from_host(&out, rows, d)
    }
}

/// `conv(x, base, dynamic[:, half])` of the module doc over `rows` rows of `d` channels in
/// blocks of `block` rows. `dynamic` is `[rows, 2, K, G]`, `base` `[K, d]`. Per output element
/// the terms are added in offset order, the static one before the dynamic one, in f32, as the
/// authors' loop (`output + kernel * values`, then `addcmul`).
#[allow(clippy::too_many_arguments)]
pub fn convolve(
    x: &[f32],
    dynamic: &[f32],
    half: usize,
    base: &[f32],
    rows: usize,
    d: usize,
    k: usize,
    group: usize,
    block: usize,
) -> Result<Vec<f32>> {
    let g = d / group;
    ensure!(
        x.len() == rows * d && dynamic.len() == rows * 2 * k * g && base.len() == k * d,
        "grouped conv: {} inputs, {} dynamic values, {} base values for {rows} rows of {d} (kernel {k}, {g} groups)",
        x.len(),
        dynamic.len(),
        base.len()
    );
    ensure!(
        block > 0 && rows % block == 0,
        "grouped conv: {rows} rows in blocks of {block}"
    );
    let mut out = vec![0f32; rows * d];
    for t in 0..rows {
        let dyn_row = &dynamic[(t * 2 + half) * k * g..(t * 2 + half + 1) * k * g];
        let out_row = &mut out[t * d..(t + 1) * d];
        // Offsets reaching before the block's first row see zeros.
        for o in 0..k.min(t % block + 1) {
            let src = &x[(t - o) * d..(t - o + 1) * d];
            let (b, dy) = (&base[o * d..(o + 1) * d], &dyn_row[o * g..(o + 1) * g]);
            for c in 0..d {
                out_row[c] += b[c] * src[c];
                out_row[c] += dy[c / group] * src[c];
            }
        }
    }
    Ok(out)
}
