//! `impl Backend for CudaBackend`: the trait's ops, each a launch or a call into the modules
//! beside this one.

use super::mask::MaskKey;
use super::memory::Cols;
use super::{decode, derr, gdn, CudaBackend, CudaMatrix, CudaTensor, MAX_DECODE_ROWS};
use crate::backend::{
    attention_decode_qkv_unfused, attention_varlen_qkv_unfused, host_rows, AttnExtras, AttnMask,
    AttnShape, Backend, HostRows, KvSlot, QkNorm, Rope, SeqStarts, TopK,
};
use anyhow::{ensure, Result};
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::CudaSlice;
use half::bf16;

/// Host-to-device copies of bf16 activations from this size on use the page-locked staging.
const STAGED_UPLOAD_MIN_BYTES: usize = 1 << 20;

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Matrix = CudaMatrix;
    type F32Buf = gdn::CudaF32;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn dtype(&self) -> &'static str {
        "bf16"
    }
    /// The engine profile's default kernel ([`gdn::engine_cache_tag`]); every reference kernel
    /// gives the same bits (tests/cuda_gdn.rs), so the reference profile has no tag.
    fn gdn_cache_tag(&self, profile: crate::backend::GdnProfile) -> &'static str {
        match profile {
            crate::backend::GdnProfile::Reference => "",
            crate::backend::GdnProfile::Engine => gdn::engine_cache_tag(),
        }
    }

    fn from_host_impl(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        self.from_host_bf16_impl(&host_rows::f32_to_bf16(data), rows, cols)
    }
    fn from_host_bf16_impl(&self, data: &[bf16], rows: usize, cols: usize) -> Result<CudaTensor> {
        // Megabytes (a drafter's context taps, once per prompt and checkpoint) go through the
        // weights' page-locked staging (upload.rs): an asynchronous copy instead of a pageable
        // one the host waits for while the GPU sits idle.
        let buf = if std::mem::size_of_val(data) >= STAGED_UPLOAD_MIN_BYTES {
            let part = crate::backend::raw::RawPart::from_bf16(data, rows, cols);
            self.upload_stacked(&[part])?.buf
        } else {
            self.upload(data)?
        };
        Ok(CudaTensor { buf, rows, cols })
    }
    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        // Widened on all cores: a packed forward's taps are hundreds of millions of values.
        Ok(host_rows::bf16_to_f32(&self.to_host_bf16(t)?))
    }
    fn to_host_rows(&self, t: &CudaTensor) -> Result<HostRows> {
        Ok(HostRows::BF16(self.to_host_bf16(t)?))
    }
    fn to_host_rows_split(&self, t: &CudaTensor, row_starts: &[usize]) -> Result<Vec<HostRows>> {
        crate::backend::check_row_starts(row_starts, t.rows)?;
        Ok(match self.to_host_bf16_staged(t, row_starts)? {
            Some(parts) => parts.into_iter().map(HostRows::BF16).collect(),
            None => host_rows::split_rows(self.to_host_rows(t)?, t.cols, row_starts),
        })
    }
    fn dims(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }
    fn matrix_impl(&self, data: &[f32], out: usize, inp: usize) -> Result<CudaMatrix> {
        Ok(CudaMatrix {
            buf: self.upload_bf16(data)?,
            out,
            inp,
            mxfp4: None,
        })
    }
    /// Kept packed (mxfp4.rs) unless `DRAFTLENS_MXFP4=bf16`.
    fn matrix_mxfp4_impl(
        &self,
        blocks: &[u8],
        scales: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<CudaMatrix> {
        self.upload_mxfp4(blocks, scales, out, inp)
    }
    fn mxfp4_packed(&self) -> bool {
        self.mxfp4_packed_mode().unwrap_or(false)
    }
    fn matrix_dims(&self, m: &CudaMatrix) -> (usize, usize) {
        (m.out, m.inp)
    }
    // Raw weight upload and free memory: upload.rs.
    fn matrix_stacked_raw(&self, parts: &[crate::backend::raw::RawPart<'_>]) -> Result<CudaMatrix> {
        self.upload_stacked(parts)
    }
    fn matrix_raw_transposed(
        &self,
        stored: crate::backend::raw::RawPart<'_>,
        interleaved: bool,
    ) -> Result<CudaMatrix> {
        self.upload_transposed(stored, interleaved)
    }
    fn free_memory(&self) -> Option<u64> {
        self.free_device_memory()
    }

    fn matmul_impl(&self, x: &CudaTensor, w: &CudaMatrix) -> Result<CudaTensor> {
        if w.mxfp4.is_some() {
            return self.matmul_impl(x, &self.mxfp4_to_bf16(w)?);
        }
        let y = self.new_tensor(x.rows, w.out)?;
        if x.rows <= MAX_DECODE_ROWS {
            // Batch-invariant: a row's bits do not depend on its batch-mates (decode.rs).
            let g = self.operands(x, w, self.ptr(&y.buf));
            self.decode_gemm_raw(g, decode::Epilogue::Bf16)?;
            return Ok(y);
        }
        let g = self.operands(x, w, self.ptr(&y.buf));
        self.gemm_raw(g, blas_sys::cudaDataType::CUDA_R_16BF, 0.0)?;
        Ok(y)
    }

    fn add_row_bias_impl(&self, x: &mut CudaTensor, bias: &CudaTensor) -> Result<()> {
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        let (f, cfg) = self.unary_launch("add_row_bias_bf16", n, 1)?;
        let (rows, cols) = (x.rows as i64, x.cols as i32);
        let mut b = self.launch_builder(&f);
        b.arg(&mut x.buf).arg(&bias.buf).arg(&rows).arg(&cols);
        // SAFETY: (bf16*, const bf16*, ll, int), sizes checked.
        unsafe { b.launch(cfg) }.map_err(derr("add_row_bias_bf16"))?;
        Ok(())
    }

    fn add_inplace_impl(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        let (f, cfg) = self.unary_launch("add_bf16", n, 8)?;
        let n64 = n as i64;
        let mut b = self.launch_builder(&f);
        b.arg(&mut x.buf).arg(&y.buf).arg(&n64);
        // SAFETY: (bf16*, const bf16*, ll), equal sizes.
        unsafe { b.launch(cfg) }.map_err(derr("add_bf16"))?;
        Ok(())
    }

    /// Whole-row norms (group = cols) go to [`CudaBackend::rms_norm_rows`] when its
    /// preconditions hold (bit-identical, one read of each row with every load in flight at once:
    /// the layer norms of every forward); per-head norms to the grouped kernel.
    fn rms_norm_impl(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        if group == x.cols && Self::rows_kernel_fits(x.cols) {
            self.rms_norm_rows(x, weight, eps)
        } else {
            self.rms_norm_groups(x, weight, eps, group)
        }
    }

    /// `rope_bf16` ([`CudaBackend::rope_plain`], in elementwise.rs).
    fn rope_inplace_impl(&self, x: &mut CudaTensor, positions: &[u32], rope: &Rope) -> Result<()> {
        self.rope_plain(x, positions, rope)
    }

    fn attention_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<CudaTensor> {
        self.attention_ext_impl(q, k, v, shape, mask, AttnExtras::NONE)
    }

    fn attention_varlen_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
    ) -> Result<CudaTensor> {
        self.attention_varlen_ext_impl(q, k, v, shape, seq_starts, AttnExtras::NONE)
    }

    /// gpt-oss's sinks and sliding window in the same kernels as plain attention
    /// (`flash_attention2`: the window in each row's key interval, the sink in its softmax
    /// state; head dims 64, 128 and 256).
    fn supports_attention_sinks(&self) -> bool {
        true
    }

    fn attention_ext_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        mask: &AttnMask,
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        let key = MaskKey::Mask {
            mask: mask.clone(),
            tq: q.rows,
            tk: k.rows,
            window: extras.window,
        };
        self.attention_with((q, k, v), shape, key, extras.sinks)
    }

    fn attention_varlen_ext_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        let key = MaskKey::varlen(seq_starts, extras.window);
        self.attention_with((q, k, v), shape, key, extras.sinks)
    }

    /// All sequences in one launch, as [`Backend::attention_decode`] (`DaExtras` in
    /// kernels/decode_attention.cu).
    fn attention_decode_ext_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, CudaTensor>],
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        self.attention_decode_batched(q, k, v, shape, caches, extras)
    }

    /// Fused path when the model has q/k norms and flash_attention2 covers the head dim (64,
    /// 128, 256): the k heads' norm + RoPE in place, then flash_attention2 normalising q itself
    /// ([`CudaBackend::attention_varlen_qkv_norm_in_kernel`]), or where that does not fit
    /// [`CudaBackend::qk_norm_rope_packed`] over q and k, then
    /// [`CudaBackend::attention_varlen_packed`] reading q/k/v from the QKV columns; else the
    /// unfused composition.
    fn attention_varlen_qkv(
        &self,
        mut qkv: CudaTensor,
        shape: AttnShape,
        qk_norm: Option<QkNorm<'_, CudaTensor>>,
        positions: &[u32],
        rope: &Rope,
        seq_starts: &SeqStarts,
    ) -> Result<CudaTensor> {
        let fused_attention = self.uses_fa2(shape.head_dim);
        match qk_norm {
            Some(n) if fused_attention => {
                if self.q_norm_in_attention_fits(&qkv, shape, &n, positions, rope) {
                    return self.attention_varlen_qkv_norm_in_kernel(
                        qkv, shape, n, positions, rope, seq_starts,
                    );
                }
                self.qk_norm_rope_packed(&mut qkv, shape, n, positions, rope)?;
                self.attention_varlen_packed(&qkv, shape, seq_starts)
            }
            _ => {
                attention_varlen_qkv_unfused(self, qkv, shape, qk_norm, positions, rope, seq_starts)
            }
        }
    }

    fn swiglu_impl(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        let mut y = self.new_tensor(gate.rows, gate.cols)?;
        let n = gate.rows * gate.cols;
        if n == 0 {
            return Ok(y);
        }
        let (f, cfg) = self.unary_launch("swiglu_bf16", n, 8)?;
        let n64 = n as i64;
        let mut b = self.launch_builder(&f);
        b.arg(&gate.buf).arg(&up.buf).arg(&mut y.buf).arg(&n64);
        // SAFETY: (const bf16*, const bf16*, bf16*, ll), equal sizes.
        unsafe { b.launch(cfg) }.map_err(derr("swiglu_bf16"))?;
        Ok(y)
    }

    /// [`CudaBackend::swiglu_packed`]: reads gate and up from the fused output in place.
    fn swiglu_packed(&self, gu: &CudaTensor) -> Result<CudaTensor> {
        CudaBackend::swiglu_packed(self, gu)
    }

    /// [`CudaBackend::matmul_acc`]: the residual add in the GEMM epilogue.
    fn matmul_acc(&self, x: &CudaTensor, w: &CudaMatrix, acc: &mut CudaTensor) -> Result<()> {
        if w.mxfp4.is_some() {
            return CudaBackend::matmul_acc(self, x, &self.mxfp4_to_bf16(w)?, acc);
        }
        CudaBackend::matmul_acc(self, x, w, acc)
    }

    /// A row gather of the table.
    fn embed_impl(&self, table: &CudaMatrix, ids: &[u32]) -> Result<CudaTensor> {
        // A recorded decode step reads its ids from its arena, rewritten at every replay.
        let recorded = self.recording_ids(ids)?;
        self.gather(&table.buf, table.inp, ids, recorded)
    }

    fn concat_rows_impl(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let cols = parts.first().map(|p| p.cols).unwrap_or(0);
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let mut y = self.new_tensor(rows, cols)?;
        let mut off = 0;
        for p in parts {
            let n = p.rows * p.cols;
            if n > 0 {
                self.stream
                    .memcpy_dtod(&p.buf.slice(0..n), &mut y.buf.slice_mut(off..off + n))
                    .map_err(derr("device copy"))?;
            }
            off += n;
        }
        Ok(y)
    }

    fn concat_cols_impl(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let rows = parts.first().map(|p| p.rows).unwrap_or(0);
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut y = self.new_tensor(rows, cols)?;
        let mut c0 = 0;
        for p in parts {
            self.copy_rows(
                (&mut y.buf, Cols { ld: cols, col0: c0 }),
                (&p.buf, Cols::rows(p.cols)),
                None,
                (rows, p.cols),
            )?;
            c0 += p.cols;
        }
        Ok(y)
    }

    fn split_cols_impl(&self, x: &CudaTensor, widths: &[usize]) -> Result<Vec<CudaTensor>> {
        let mut out = Vec::with_capacity(widths.len());
        let mut c0 = 0;
        for &w in widths {
            let mut t = self.new_tensor(x.rows, w)?;
            self.copy_rows(
                (&mut t.buf, Cols::rows(w)),
                (
                    &x.buf,
                    Cols {
                        ld: x.cols,
                        col0: c0,
                    },
                ),
                None,
                (x.rows, w),
            )?;
            out.push(t);
            c0 += w;
        }
        Ok(out)
    }

    /// [`MAX_DECODE_ROWS`]: up to 64 rows every GEMM runs on the batch-invariant decode kernel
    /// (decode.rs) and every other op already works row by row (one warp, block or thread per
    /// row or element; attention per sequence).
    fn max_independent_rows(&self) -> usize {
        MAX_DECODE_ROWS
    }

    /// Recorded decode steps as CUDA graphs: step_graph.rs.
    fn records_steps(&self) -> bool {
        CudaBackend::records_steps(self)
    }

    fn record_step(
        &self,
        dims: (usize, usize),
        steps: usize,
        step: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<Option<(u64, CudaTensor)>> {
        self.record_step_graph(dims, steps, step)
    }

    fn replay_step(&self, id: u64, ids: &[u32]) -> Result<CudaTensor> {
        self.replay_step_graph(id, ids)
    }

    fn forget_step(&self, id: u64) {
        self.forget_step_graph(id)
    }
    fn feeds_steps(&self) -> bool {
        CudaBackend::feeds_steps(self)
    }
    fn feed_greedy(&self, hidden: &CudaTensor, head: &CudaMatrix) -> Result<()> {
        CudaBackend::feed_greedy(self, hidden, head)
    }
    fn replay_step_fed(&self, id: u64) -> Result<()> {
        CudaBackend::replay_step_fed(self, id)
    }
    fn take_fed_tokens(&self, id: u64) -> Result<Vec<u32>> {
        CudaBackend::take_fed_tokens(self, id)
    }

    fn reserve_rows(&self, x: &mut CudaTensor, extra: usize) -> Result<()> {
        CudaBackend::reserve_rows(self, x, extra)
    }

    fn set_rows(&self, x: &mut CudaTensor, rows: usize) -> Result<()> {
        ensure!(
            x.buf.len() >= rows * x.cols,
            "set_rows: {rows} rows of {} columns in a buffer of {} values",
            x.cols,
            x.buf.len()
        );
        x.rows = rows;
        Ok(())
    }

    /// In place, with spare capacity (KV caches): decode.rs.
    fn append_rows_impl(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        self.append_rows_in_place(x, y)
    }

    /// All sequences in one launch (decode.rs, `kernels/decode_attention.cu`).
    fn attention_decode(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, CudaTensor>],
    ) -> Result<CudaTensor> {
        self.attention_decode_batched(q, k, v, shape, caches, AttnExtras::NONE)
    }

    /// The rows appended first, then one decode-attention launch ([`CudaBackend::attention_verify_rows`]).
    fn attention_verify(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: AttnShape,
        slot: KvSlot<'_, CudaTensor>,
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        extras.check(shape, None)?;
        self.attention_verify_rows(q, k, v, shape, slot, extras)
    }

    /// Fused path ([`CudaBackend::attention_decode_packed`]: norm + RoPE in place, the attention
    /// reading q/k/v from the QKV columns) when the model has q/k norms and the decode kernel
    /// covers the shape; else the unfused composition.
    fn attention_decode_qkv(
        &self,
        qkv: CudaTensor,
        shape: AttnShape,
        qk_norm: Option<QkNorm<'_, CudaTensor>>,
        positions: &[u32],
        rope: &Rope,
        caches: &mut [KvSlot<'_, CudaTensor>],
    ) -> Result<CudaTensor> {
        match qk_norm {
            Some(n) if Self::decode_attention_fits(shape) => {
                self.attention_decode_packed(qkv, shape, n, positions, rope, caches)
            }
            _ => attention_decode_qkv_unfused(self, qkv, shape, qk_norm, positions, rope, caches),
        }
    }

    /// [`CudaBackend::attention_decode_packed_ext`] (decode.rs).
    fn attention_decode_qkv_ext(
        &self,
        qkv: CudaTensor,
        shape: AttnShape,
        positions: &[u32],
        freqs: &crate::backend::RopeFreqs,
        caches: &mut [KvSlot<'_, CudaTensor>],
        extras: AttnExtras<'_>,
    ) -> Result<CudaTensor> {
        self.attention_decode_packed_ext(qkv, shape, positions, freqs, caches, extras)
    }

    fn slice_rows_impl(&self, x: &CudaTensor, start: usize, end: usize) -> Result<CudaTensor> {
        let mut y = self.new_tensor(end - start, x.cols)?;
        let n = (end - start) * x.cols;
        if n > 0 {
            self.stream
                .memcpy_dtod(
                    &x.buf.slice(start * x.cols..end * x.cols),
                    &mut y.buf.slice_mut(0..n),
                )
                .map_err(derr("device copy"))?;
        }
        Ok(y)
    }

    fn gather_rows_impl(&self, x: &CudaTensor, rows: &[u32]) -> Result<CudaTensor> {
        self.gather(&x.buf, x.cols, rows, None)
    }

    fn add_weighted_rows_impl(
        &self,
        acc: &mut CudaTensor,
        src: &CudaTensor,
        index: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        self.moe_add_weighted_rows(acc, src, index, weights)
    }

    /// Decode steps: moe.rs (routing, grouped GEMMs and combine on the device).
    fn moe_routed_acc(
        &self,
        x: &CudaTensor,
        logits: &CudaTensor,
        experts: &crate::backend::moe::MoeExperts<'_, CudaMatrix, CudaTensor>,
        shared_out: Option<&CudaTensor>,
        routing: &crate::backend::moe::MoeRouting,
        h: &mut CudaTensor,
    ) -> Result<bool> {
        self.moe_routed_on_device(x, logits, experts, shared_out, routing, h)
    }

    /// gpt-oss's YaRN rotation: `rope_bf16` with the given frequencies and scale
    /// ([`CudaBackend::rope_with_freqs`], in elementwise.rs).
    fn rope_freqs_impl(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        freqs: &crate::backend::RopeFreqs,
    ) -> Result<()> {
        self.rope_with_freqs(x, positions, freqs)
    }

    /// `clamped_swiglu_packed_bf16` ([`CudaBackend::clamped_swiglu_packed_on_device`]).
    fn clamped_swiglu_impl(&self, gu: &CudaTensor, alpha: f32, limit: f32) -> Result<CudaTensor> {
        self.clamped_swiglu_packed_on_device(gu, alpha, limit)
    }

    /// The fused path for more than 64 rows when chosen, else the unfused one (lm_head.rs).
    fn lm_head_topk_impl(&self, x: &CudaTensor, head: &CudaMatrix, k: usize) -> Result<TopK> {
        self.lm_head_topk_on_device(x, head, k)
    }

    // ---- Hybrid-layer ops: kernels/gdn.cu through gdn.rs (docs/gdn-cuda.md).
    fn f32_from_host(&self, data: &[f32]) -> Result<gdn::CudaF32> {
        self.gdn_f32_from_host(data)
    }
    fn f32_to_host(&self, b: &gdn::CudaF32) -> Result<Vec<f32>> {
        self.gdn_f32_to_host(b)
    }
    fn f32_copy(&self, b: &gdn::CudaF32) -> Result<gdn::CudaF32> {
        self.gdn_f32_copy(b)
    }
    fn rms_norm_zero_centred(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        self.gdn_rms_norm_zc(x, weight, eps, group)
    }
    fn gated_rms_norm(
        &self,
        x: &CudaTensor,
        z: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        self.gdn_gated_rms_norm(x, z, weight, eps, group)
    }
    fn sigmoid_gate_inplace(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<()> {
        self.gdn_sigmoid_gate(x, gate)
    }
    fn causal_conv1d_silu(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        seq_starts: &SeqStarts,
        states: &mut [&mut CudaTensor],
    ) -> Result<CudaTensor> {
        self.causal_conv1d_silu_with(x, weight, seq_starts, states, gdn::ConvKernel::Rows)
    }
    fn gated_delta_rule(
        &self,
        qkv: &CudaTensor,
        a: &CudaTensor,
        b: &CudaTensor,
        params: &crate::backend::GdnParams<'_, Self>,
        seq_starts: &SeqStarts,
        states: &mut [&mut gdn::CudaF32],
    ) -> Result<CudaTensor> {
        gdn::gated_delta_rule(self, qkv, a, b, params, seq_starts, states)
    }
}

/// What several trait ops above share.
impl CudaBackend {
    /// `data` rounded to bf16 (round to nearest even) on the device.
    fn upload_bf16(&self, data: &[f32]) -> Result<CudaSlice<bf16>> {
        self.upload(&host_rows::f32_to_bf16(data))
    }

    /// Rows `rows` of the row-major `[_, cols]` bf16 buffer `src`, as a new `[rows.len(), cols]`
    /// tensor (the caller has checked the row ids); the ids are read from `on_device` when the
    /// caller placed them there, else uploaded.
    fn gather(
        &self,
        src: &CudaSlice<bf16>,
        cols: usize,
        rows: &[u32],
        on_device: Option<u64>,
    ) -> Result<CudaTensor> {
        let mut y = self.new_tensor(rows.len(), cols)?;
        if rows.is_empty() {
            return Ok(y);
        }
        // Kept until the launch is queued (its free is stream-ordered after it).
        let uploaded;
        let idx = match on_device {
            Some(p) => p,
            None => {
                uploaded = self.upload(rows)?;
                self.ptr(&uploaded)
            }
        };
        self.copy_rows(
            (&mut y.buf, Cols::rows(cols)),
            (src, Cols::rows(cols)),
            Some(idx),
            (rows.len(), cols),
        )?;
        Ok(y)
    }
}
