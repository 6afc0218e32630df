//! Norms, RoPE and SwiGLU launches (`kernels/elementwise.cu`, `kernels/fused.cu`,
//! `qk_norm_rope*` in `kernels/attention.cu`), with the RoPE tables cached across layers; gpt-oss's
//! rotation from given frequencies and its clamped SwiGLU.

use super::{blocks, derr, CudaBackend, CudaTensor};
use crate::backend::{AttnShape, Backend, QkNorm, Rope, RopeFreqs, RopeStyle};
use anyhow::{ensure, Result};
use cudarc::driver::LaunchConfig;

/// Rows from which [`CudaBackend::rms_norm_rows`] takes `rms_norm_many_rows_bf16` (packed
/// prefills) instead of one block per 8 rows (decode steps, drafter blocks).
pub const MANY_ROWS: usize = 1024;

/// Widest rows of the narrow whole-row norm kernels (16 chunks of 8 values per lane) and of the
/// `_wide` ones (32 chunks), `kernels/fused.cu`'s MAXC · 256.
pub const ROW_NORM_COLS: usize = 4096;
pub const ROW_NORM_WIDE_COLS: usize = 8192;

/// Which heads of a fused QKV row [`CudaBackend::qk_norm_rope_launch`] normalises.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum QkHeads {
    /// q and k, the (cos, sin) computed in the kernel.
    QAndK,
    /// k only (q's are normalised inside flash_attention2), reading the (cos, sin) table at `cs`
    /// ([`CudaBackend::with_rope_cs_table`]; the vectorised kernel only).
    KOnly { cs: u64 },
}

impl CudaBackend {
    /// Runs `f` with the device tables RoPE needs — positions (u32) and the address of the
    /// inverse frequencies of `rope` (f32, HF's `1 / θ^(2i / rotary_dim)`) — uploading each only
    /// when it changed (every layer of a forward shares them). The position cache stays locked
    /// while `f` queues its launch.
    pub(super) fn with_rope_tables<R>(
        &self,
        positions: &[u32],
        rope: &Rope,
        f: impl FnOnce(u64, &u64) -> Result<R>,
    ) -> Result<R> {
        let freqs = self.rope_inv_freq(rope)?;
        self.with_rope_positions(positions, freqs, f)
    }

    /// [`CudaBackend::with_rope_tables`] with the address of an inverse-frequency table already
    /// on the device.
    fn with_rope_positions<R>(
        &self,
        positions: &[u32],
        freqs: u64,
        f: impl FnOnce(u64, &u64) -> Result<R>,
    ) -> Result<R> {
        if let Some(pos) = self.recording_positions(positions)? {
            return f(pos, &freqs);
        }
        let mut pc = self.pos_cache.lock().unwrap_or_else(|e| e.into_inner());
        if pc
            .as_ref()
            .map(|(p, _)| p.as_slice() != positions)
            .unwrap_or(true)
        {
            *pc = Some((positions.to_vec(), self.upload(positions)?));
        }
        let pos = self.ptr(&pc.as_ref().expect("filled above").1);
        f(pos, &freqs)
    }

    /// Runs `f` with the address of RoPE's (cos, sin) table at `positions` (`rope_cs_table_f32`
    /// in kernels/attention.cu: per row, rotary_dim / 2 pairs of f32 holding bf16 values, the
    /// values `qk_norm_rope_vec_bf16` computes for itself), computed on the device when the
    /// positions or the rope changed: every layer of a forward shares it. The table stays locked
    /// while `f` queues its launches.
    pub(super) fn with_rope_cs_table<R>(
        &self,
        positions: &[u32],
        rope: &Rope,
        f: impl FnOnce(u64) -> Result<R>,
    ) -> Result<R> {
        let half = rope.rotary_dim / 2;
        let key = (rope.theta.to_bits(), rope.rotary_dim);
        let mut cc = self.cs_cache.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = cc
            .as_ref()
            .is_some_and(|(p, k, _)| *k == key && p.as_slice() == positions);
        if !fresh {
            self.not_recording("RoPE's (cos, sin) table")?;
            *cc = None;
            let n = positions.len() * half;
            let mut table = self.alloc::<f32>((2 * n).max(2))?;
            if n > 0 {
                self.with_rope_tables(positions, rope, |pos, freqs| {
                    let f = self.kernels.get("attention", "rope_cs_table_f32")?;
                    let (rows, h32) = (positions.len() as i64, half as i32);
                    let mut b = self.launch_builder(&f);
                    b.arg(&pos).arg(freqs).arg(&rows).arg(&h32).arg(&mut table);
                    // SAFETY: (const u32*, const float*, ll, int, float2*); `pos` holds `rows`
                    // positions, `freqs` half values, `table` 2 · rows · half floats.
                    unsafe {
                        b.launch(LaunchConfig {
                            grid_dim: (blocks(n, 256).min(4096), 1, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: 0,
                        })
                    }
                    .map_err(derr("rope_cs_table_f32"))
                })?;
            }
            *cc = Some((positions.to_vec(), key, table));
        }
        let table = &cc.as_ref().expect("filled above").2;
        f(self.ptr(table))
    }

    /// Whether the vectorised q/k norm + RoPE (`qk_norm_rope_vec_bf16`, and the same arithmetic
    /// inside the decode attention) covers heads of `hd` values in rows of `cols`: whole 16-byte
    /// chunks, and a rotary part that whole chunks cover (rotate-half: pairs a power-of-two number
    /// of chunks apart).
    pub(super) fn qk_norm_rope_vec_fits(hd: usize, cols: usize, rope: &Rope) -> bool {
        let rd = rope.rotary_dim;
        hd.is_multiple_of(8)
            && cols.is_multiple_of(8)
            && match rope.style {
                RopeStyle::Interleaved => rd.is_multiple_of(8),
                RopeStyle::RotateHalf => {
                    rd.is_multiple_of(16) && (rd == 0 || (rd / 16).is_power_of_two())
                }
            }
    }

    /// Whether q/k norms of this call can be applied inside another kernel with
    /// `qk_norm_rope_vec_bf16`'s arithmetic (the decode attention, flash_attention2): the
    /// vectorised shapes, and arguments that pass [`CudaBackend::check_qk_norm_rope`].
    pub(super) fn qk_norm_in_kernel_fits(
        qkv: &CudaTensor,
        shape: AttnShape,
        norm: &QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
    ) -> bool {
        Self::qk_norm_rope_vec_fits(shape.head_dim, qkv.cols, rope)
            && Self::check_qk_norm_rope(qkv, shape, norm, positions, rope).is_ok()
    }

    /// That `qkv` is a fused QKV output of `shape`: (heads + 2 · kv_heads) · head_dim columns.
    pub(super) fn check_qkv_cols(what: &str, qkv: &CudaTensor, shape: AttnShape) -> Result<()> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        ensure!(
            qkv.cols == (heads + 2 * kv_heads) * hd,
            "{what}: {} columns, expected (heads {heads} + 2 × {kv_heads}) × {hd}",
            qkv.cols
        );
        Ok(())
    }

    /// The checks of a q/k norm + RoPE over a fused QKV output, with the offending values.
    pub(super) fn check_qk_norm_rope(
        qkv: &CudaTensor,
        shape: AttnShape,
        norm: &QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
    ) -> Result<()> {
        let hd = shape.head_dim;
        Self::check_qkv_cols("qk_norm_rope_packed", qkv, shape)?;
        ensure!(
            norm.q.rows * norm.q.cols == hd && norm.k.rows * norm.k.cols == hd,
            "qk_norm_rope_packed: norm weights must have head_dim = {hd} values"
        );
        ensure!(
            positions.len() == qkv.rows,
            "qk_norm_rope_packed: {} positions for {} rows",
            positions.len(),
            qkv.rows
        );
        ensure!(
            hd > 0 && hd <= 256 && rope.head_dim == hd,
            "qk_norm_rope_packed: head_dim {hd} (rope's {}) must be 1..=256",
            rope.head_dim
        );
        ensure!(
            rope.rotary_dim <= hd && rope.rotary_dim.is_multiple_of(2),
            "qk_norm_rope_packed: bad rotary_dim {}",
            rope.rotary_dim
        );
        Ok(())
    }

    /// The device address of the RoPE inverse-frequency table of `rope` (uploaded once per
    /// (theta, rotary_dim); entries live as long as the backend).
    pub(super) fn rope_inv_freq(&self, rope: &Rope) -> Result<u64> {
        let half = rope.rotary_dim / 2;
        let mut fc = self.freq_cache.lock().unwrap_or_else(|e| e.into_inner());
        let fkey = (rope.theta.to_bits(), rope.rotary_dim);
        if let Some((_, t)) = fc.iter().find(|(k, _)| *k == fkey) {
            return Ok(self.ptr(t));
        }
        // HF: inv_freq = 1 / theta^(2i / rotary_dim), in f32.
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / rope.theta.powf((2 * i) as f32 / rope.rotary_dim as f32))
            .collect();
        let t = self.upload(&inv)?;
        let p = self.ptr(&t);
        fc.push((fkey, t));
        Ok(p)
    }

    /// [`Backend::rope_inplace`] (checked by the trait): `rope_bf16` with the table of `rope`
    /// and a scale of 1.
    pub(super) fn rope_plain(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        rope: &Rope,
    ) -> Result<()> {
        let freqs = self.rope_inv_freq(rope)?;
        let geometry = (rope.head_dim, rope.rotary_dim, rope.style);
        let heads = x.cols / rope.head_dim.max(1);
        self.rope_launch(x, heads, positions, freqs, geometry, 1.0)
    }

    /// [`Backend::rope_freqs_inplace`] (checked by the trait): `rope_bf16` with the given inverse
    /// frequencies (uploaded once per content) and `attention_scaling` on cos and sin, in f32
    /// before their cast to bf16, as transformers' `GptOssRotaryEmbedding` and the host's
    /// `rope_table` order it. With [`RopeFreqs::of_rope`] it is [`Backend::rope_inplace`] bit for
    /// bit (the same table values, a scale of 1).
    pub(super) fn rope_with_freqs(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> Result<()> {
        let heads = x.cols / freqs.head_dim.max(1);
        self.rope_heads_with_freqs(x, heads, positions, freqs)
    }

    /// [`CudaBackend::rope_with_freqs`] on the first `heads` heads of each row of `x` only (a
    /// fused QKV row's q and k heads; the caller checks that they lie within the row).
    pub(super) fn rope_heads_with_freqs(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> Result<()> {
        let table = self.f32_table(&freqs.inv_freq)?;
        let geometry = (freqs.head_dim, freqs.rotary_dim, freqs.style);
        self.rope_launch(
            x,
            heads,
            positions,
            table,
            geometry,
            freqs.attention_scaling,
        )
    }

    /// One `rope_bf16` launch over the first `n_heads` heads of every row of `x` (rows x.cols
    /// apart): `geometry` is (head_dim, rotary_dim, style), `freqs` the address of rotary_dim / 2
    /// inverse frequencies.
    fn rope_launch(
        &self,
        x: &mut CudaTensor,
        n_heads: usize,
        positions: &[u32],
        freqs: u64,
        geometry: (usize, usize, RopeStyle),
        scale: f32,
    ) -> Result<()> {
        let (head_dim, rotary_dim, style) = geometry;
        ensure!(
            n_heads * head_dim <= x.cols && positions.len() == x.rows,
            "rope: {n_heads} heads of {head_dim} in rows of {} columns, {} positions for {} rows",
            x.cols,
            positions.len(),
            x.rows
        );
        let half = rotary_dim / 2;
        let total = x.rows * n_heads * half;
        if total == 0 {
            return Ok(());
        }
        self.with_rope_positions(positions, freqs, |pos, freqs| {
            let f = self.kernels.get("elementwise", "rope_bf16")?;
            let (rows, nh, hd, rd) = (
                x.rows as i32,
                n_heads as i32,
                head_dim as i32,
                rotary_dim as i32,
            );
            let inter = matches!(style, RopeStyle::Interleaved) as i32;
            let ld = x.cols as i64;
            let mut b = self.launch_builder(&f);
            b.arg(&mut x.buf)
                .arg(&pos)
                .arg(freqs)
                .arg(&rows)
                .arg(&nh)
                .arg(&hd)
                .arg(&rd)
                .arg(&inter)
                .arg(&scale)
                .arg(&ld);
            // SAFETY: (bf16*, const u32*, const float*, int x5, float, ll); one thread per rotated
            // pair of the first n_heads heads of each row, which lie within its ld = cols values
            // (checked above); `pos` holds a position per row, `freqs` rotary_dim / 2 values (the
            // trait's checks).
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (blocks(total, 256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("rope_bf16"))?;
            Ok(())
        })
    }

    /// gpt-oss's clamped SwiGLU of a fused gate|up output `[T, 2·I]` → `[T, I]`
    /// (`clamped_swiglu_packed_bf16`: [`crate::backend::gpt_oss::clamped_swiglu`]'s f32
    /// arithmetic, one bf16 rounding), for [`Backend::clamped_swiglu_packed`] and the routed
    /// experts (`moe.rs`).
    pub(super) fn clamped_swiglu_packed_on_device(
        &self,
        gu: &CudaTensor,
        alpha: f32,
        limit: f32,
    ) -> Result<CudaTensor> {
        ensure!(
            gu.cols.is_multiple_of(2) && gu.cols / 2 < i32::MAX as usize,
            "clamped_swiglu: {} columns cannot be gate | up halves",
            gu.cols
        );
        let inter = gu.cols / 2;
        let mut y = self.new_tensor(gu.rows, inter)?;
        let n = gu.rows * inter;
        if n == 0 {
            return Ok(y);
        }
        let (f, cfg) = self.unary_launch("clamped_swiglu_packed_bf16", n, 1)?;
        let (rows, i32c) = (gu.rows as i64, inter as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&gu.buf)
            .arg(&mut y.buf)
            .arg(&rows)
            .arg(&i32c)
            .arg(&alpha)
            .arg(&limit);
        // SAFETY: (const bf16*, bf16*, ll, int, float, float); one thread per output value, gu
        // holds rows × 2·inter values, y rows × inter.
        unsafe { b.launch(cfg) }.map_err(derr("clamped_swiglu_packed_bf16"))?;
        Ok(y)
    }

    /// Per-head RMSNorm (q heads with `q_norm`, k heads with `k_norm`) and RoPE of the q and k
    /// columns of a fused QKV output `[T, (H + 2·Hkv)·hd]`, in place; the v columns are untouched.
    /// Bit-identical to `rms_norm(·, group = hd)` followed by `rope_inplace` on the split q and k,
    /// in one pass instead of four (plus the split copies).
    pub fn qk_norm_rope_packed(
        &self,
        qkv: &mut CudaTensor,
        shape: AttnShape,
        norm: QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
    ) -> Result<()> {
        Self::check_qk_norm_rope(qkv, shape, &norm, positions, rope)?;
        self.qk_norm_rope_launch(qkv, shape, norm, positions, rope, QkHeads::QAndK)
    }

    /// `qk_norm_rope_*_bf16` over the heads of `qkv` that `which` names. Arguments checked by
    /// the caller ([`CudaBackend::check_qk_norm_rope`]).
    pub(super) fn qk_norm_rope_launch(
        &self,
        qkv: &mut CudaTensor,
        shape: AttnShape,
        norm: QkNorm<'_, CudaTensor>,
        positions: &[u32],
        rope: &Rope,
        which: QkHeads,
    ) -> Result<()> {
        let QkNorm {
            q: q_norm,
            k: k_norm,
            eps,
        } = norm;
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        // k heads only: the kernel sees the row from the first k column on, with no q heads.
        let (first_col, heads, cs) = match which {
            QkHeads::QAndK => (0, heads, 0),
            QkHeads::KOnly { cs } => (heads * hd, 0, cs),
        };
        let warps = qkv.rows * (heads + kv_heads);
        if warps == 0 {
            return Ok(());
        }
        // The vectorised kernel covers head dims that are whole 16-byte chunks and rotary parts
        // that whole chunks cover (rotate-half: pairs a power-of-two number of chunks apart).
        let vec = Self::qk_norm_rope_vec_fits(hd, qkv.cols, rope);
        let func = if vec {
            "qk_norm_rope_vec_bf16"
        } else {
            "qk_norm_rope_bf16"
        };
        ensure!(
            cs == 0 || vec,
            "qk_norm_rope: a (cos, sin) table needs the vectorised kernel"
        );
        let f = self.kernels.get("attention", func)?;
        let x = self.ptr(&qkv.buf) + (first_col * 2) as u64;
        let (ld, rows) = (qkv.cols as i64, qkv.rows as i64);
        let (hq, hk, hd32, rd) = (
            heads as i32,
            kv_heads as i32,
            hd as i32,
            rope.rotary_dim as i32,
        );
        let inter = matches!(rope.style, RopeStyle::Interleaved) as i32;
        self.with_rope_tables(positions, rope, |pos, freqs| {
            let mut b = self.launch_builder(&f);
            b.arg(&x)
                .arg(&ld)
                .arg(&rows)
                .arg(&hq)
                .arg(&hk)
                .arg(&hd32)
                .arg(&q_norm.buf)
                .arg(&k_norm.buf)
                .arg(&eps)
                .arg(&pos)
                .arg(freqs)
                .arg(&rd)
                .arg(&inter);
            if vec {
                b.arg(&cs);
            }
            // SAFETY: (bf16*, ll, ll, int, int, int, const bf16*, const bf16*, float, const u32*,
            // const float*, int, int[, const float2*]); shapes checked by qk_norm_rope_packed; `x`
            // is the row's first normalised column (the first k column with `KOnly`, rows keep
            // their stride `ld`); `cs` is null or holds rows × rotary_dim / 2 pairs.
            // Without a table one block per row (grid-stride past 65 535 rows); with one, blocks
            // of 256 / G (row, head) pairs, G = the head's 16-byte chunks rounded up to a power
            // of two, grid-stride from 8 blocks per multiprocessor.
            let grid = if cs == 0 {
                qkv.rows.min(65535)
            } else {
                let per_block = 256 / (hd / 8).next_power_of_two().max(1);
                (qkv.rows * (heads + kv_heads))
                    .div_ceil(per_block)
                    .min(8 * self.info.multiprocessors.max(1) as usize)
            };
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (grid as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr(func))?;
            Ok(())
        })
    }

    /// Whether the whole-row norm kernels (`rms_norm_rows_bf16`, `rms_norm_many_rows_bf16` and
    /// their `_wide` instances) cover rows of `cols` values: a multiple of 8 up to 8192 (at most
    /// 32 chunks of 8 values per lane of a warp; the narrow instances take up to 4096, 16 chunks).
    /// Until session 28 they took multiples of 256 up to 4096 only, which left gpt-oss's 2880 and
    /// dense Qwen3-14B and 32B's 5120 columns on the grouped kernel's one-load-at-a-time loop.
    pub(super) fn rows_kernel_fits(cols: usize) -> bool {
        cols.is_multiple_of(8) && cols > 0 && cols <= ROW_NORM_WIDE_COLS
    }

    /// [`Backend::rms_norm`] over whole rows (group = cols), bit-identical, with every load of a
    /// row in flight at once and one read of it (`kernels/fused.cu`); rows whose width is not a
    /// multiple of 8 up to 8192 go to the grouped kernel (as [`Backend::rms_norm`] routes them).
    pub fn rms_norm_rows(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        let cols = x.cols;
        if !Self::rows_kernel_fits(cols) {
            // The checked trait method, which routes such rows to the grouped kernel.
            return Backend::rms_norm(self, x, weight, eps, cols);
        }
        ensure!(
            weight.rows * weight.cols == cols,
            "rms_norm_rows: weight has {} values, rows have {cols}",
            weight.rows * weight.cols
        );
        let mut y = self.new_tensor(x.rows, cols)?;
        if x.rows == 0 {
            return Ok(y);
        }
        // Many rows (a packed prefill): the weights staged in shared memory once per block, two
        // blocks per multiprocessor walking the rows; few rows (decode steps): one block per 8
        // rows, every warp fetching the weights itself. The same bits either way.
        let many = x.rows >= MANY_ROWS;
        let func = match (many, cols > ROW_NORM_COLS) {
            (true, false) => "rms_norm_many_rows_bf16",
            (true, true) => "rms_norm_many_rows_wide_bf16",
            (false, false) => "rms_norm_rows_bf16",
            (false, true) => "rms_norm_rows_wide_bf16",
        };
        let f = self.kernels.get("elementwise", func)?;
        let grid = if many {
            blocks(x.rows, 8).min(2 * self.info.multiprocessors.max(1) as u32)
        } else {
            blocks(x.rows, 8)
        };
        let (rows, c32) = (x.rows as i64, cols as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&x.buf)
            .arg(&weight.buf)
            .arg(&mut y.buf)
            .arg(&rows)
            .arg(&c32)
            .arg(&eps);
        // SAFETY: (const bf16*, const bf16*, bf16*, ll, int, float) for both kernels; one warp
        // per row (grid-stride in the many-rows kernel), 8 per block; cols is a multiple of 8 up
        // to the instance's MAXC · 256 values (4096 or, `_wide`, 8192: its lanes' chunks and the
        // many-rows kernel's shared copy of the weights).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr(func))?;
        Ok(y)
    }

    /// SwiGLU of a fused gate|up output `[T, 2·I]` → `[T, I]` (same arithmetic as
    /// [`Backend::swiglu`] on the two halves).
    pub fn swiglu_packed(&self, gu: &CudaTensor) -> Result<CudaTensor> {
        ensure!(
            gu.cols.is_multiple_of(2),
            "swiglu_packed: {} columns is not gate|up",
            gu.cols
        );
        let inter = gu.cols / 2;
        let mut y = self.new_tensor(gu.rows, inter)?;
        let n = gu.rows * inter;
        if n == 0 {
            return Ok(y);
        }
        // kernels/fused.cu: 2-D grid, 8 columns per thread on x, rows grid-stride on y.
        let f = self.kernels.get("elementwise", "swiglu_packed_rows_bf16")?;
        let x_blocks = blocks(inter.div_ceil(8), 256);
        let cfg = LaunchConfig {
            // Enough row strides for 8 blocks of 256 threads per multiprocessor; each thread
            // walks its column chunk down the rows, 4 rows' loads at a time.
            grid_dim: (
                x_blocks,
                gu.rows.min(
                    (8 * self.info.multiprocessors.max(1) as usize).div_ceil(x_blocks as usize),
                ) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rows, i32c) = (gu.rows as i64, inter as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&gu.buf).arg(&mut y.buf).arg(&rows).arg(&i32c);
        // SAFETY: (const bf16*, bf16*, ll, int); gu holds rows × 2·inter values.
        unsafe { b.launch(cfg) }.map_err(derr("swiglu_packed_rows_bf16"))?;
        Ok(y)
    }

    /// [`Backend::rms_norm`] with the grouped kernel (one warp per group of any width): the
    /// reference the row kernels must match bit for bit (`crates/engine/tests/cuda_ops.rs`). Shapes are
    /// checked by the trait method.
    pub fn rms_norm_groups(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        ensure!(group < i32::MAX as usize, "rms_norm: group too large");
        let mut y = self.new_tensor(x.rows, x.cols)?;
        let n_groups = x.rows * (x.cols / group);
        if n_groups == 0 {
            return Ok(y);
        }
        let f = self.kernels.get("elementwise", "rms_norm_bf16")?;
        let (ng, g) = (n_groups as i64, group as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&x.buf)
            .arg(&weight.buf)
            .arg(&mut y.buf)
            .arg(&ng)
            .arg(&g)
            .arg(&eps);
        // SAFETY: (const bf16*, const bf16*, bf16*, ll, int, float); one warp per group, 8 per block.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks(n_groups, 8), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("rms_norm_bf16"))?;
        Ok(y)
    }

    pub(super) fn unary_launch(
        &self,
        func: &'static str,
        n: usize,
        per_thread: usize,
    ) -> Result<(cudarc::driver::CudaFunction, LaunchConfig)> {
        let f = self.kernels.get("elementwise", func)?;
        Ok((
            f,
            LaunchConfig {
                grid_dim: (blocks(n.div_ceil(per_thread), 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
        ))
    }
}
