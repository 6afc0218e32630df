//! The backend seam: every numeric operation the model code needs, implemented once per device.
//!
//! Model code (`crate::model`) is generic over [`Backend`] and never touches device memory
//! directly. The CPU backend ([`cpu::CpuBackend`]) is the reference: f32 weights and
//! activations, f32 accumulation. A CUDA backend implements the same trait with bf16 storage
//! and fp32 accumulation; `draftlens parity` compares the two.
//!
//! Layout conventions: a [`Backend::Tensor`] is a row-major 2-D activation `[rows, cols]`
//! (one row per token); a [`Backend::Matrix`] is a weight stored PyTorch-style `[out, in]`, so a
//! projection is `y = x · Wᵀ`.
//!
//! This file holds the [`Backend`] trait (one trait, so one file: its public ops with their shape
//! checks, the `*_impl` methods backends provide, and the default hybrid-model ops);
//! `types.rs` the values its methods take and return.

pub mod compose;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod gdn;
pub mod gpt_oss;
pub mod host_rows;
pub mod mask;
pub mod memory;
pub mod moe;
pub mod mxfp4;
pub mod raw;
mod select;
mod seq_starts;
mod types;

pub use compose::{
    attention_decode_per_row, attention_decode_per_row_ext, attention_decode_qkv_unfused,
    attention_varlen_qkv_unfused,
};
pub use gdn::{GdnLayerHost, GdnProfile, GdnShape, HostF32};
pub use gpt_oss::{AttnExtras, RopeFreqs};
pub use host_rows::{HostRows, HostRowsRef};
pub use mask::{varlen_key_intervals, AttnMask, KeyIntervals};
pub use select::{cuda_availability, dispatch, BackendJob, BackendKind, DEFAULT_CUDA_DEVICE};
pub use seq_starts::SeqStarts;
pub use types::{AttnShape, BackendError, GdnParams, KvSlot, QkNorm, Rope, RopeStyle, TopK};

use anyhow::{anyhow, bail, ensure, Result};
use std::any::Any;

/// Every operation the model code needs. All methods return errors instead of panicking
/// (device failures, shape mismatches).
///
/// Shapes are checked here, once for every backend: each public op that all backends implement
/// checks its operands (one error message per misfit) and then calls the `*_impl` method the
/// backend provides, which may assume them. Which keys an attention query sees comes from
/// [`AttnMask::key_intervals`].
///
/// The hybrid-model ops (Qwen3.5 / Qwen3-Next: [`Backend::rms_norm_zero_centred`],
/// [`Backend::gated_rms_norm`], [`Backend::sigmoid_gate_inplace`],
/// [`Backend::causal_conv1d_silu`], [`Backend::gated_delta_rule`]) have default implementations
/// that download their inputs ([`Backend::to_host`], [`Backend::f32_to_host`]), run the f32
/// reference maths of [`gdn`], and upload the results: correct on every backend, fast on none
/// but the CPU. A backend with kernels overrides them; its kernels must agree with [`gdn`].
pub trait Backend: Send + Sync + 'static {
    /// A row-major `[rows, cols]` activation on the device.
    type Tensor: Send + Sync;
    /// A weight matrix `[out, in]` on the device, in the backend's storage dtype.
    type Matrix: Send + Sync;
    /// A flat f32 buffer on the device, whatever the activation dtype: the recurrent state S of a
    /// Gated DeltaNet layer (one per sequence, `v_heads · k_dim · v_dim` values, see
    /// [`Backend::gated_delta_rule`]) and the layer's f32 parameters `A_log` / `dt_bias`.
    /// [`HostF32`] (host memory) works with the default [`Backend::f32_from_host`] /
    /// [`Backend::f32_to_host`]; a backend choosing a device type must override both.
    type F32Buf: Send + Sync + 'static;

    /// Short name stored with every result ("cpu", "cuda").
    fn name(&self) -> &'static str;
    /// Storage dtype of weights and activations ("f32", "bf16").
    fn dtype(&self) -> &'static str;
    /// Names the kernels that compute the Gated DeltaNet `profile` on this backend where the
    /// choice changes the bits, as a suffix of the hybrid targets' cache keys
    /// (`crate::session`'s `kernel_version`), so that cached results of one kernel never pass
    /// for another's. "" (the default) where one set of kernels computes each profile (the CPU
    /// reference). Changing a backend's tag orphans its cached entries of that profile.
    fn gdn_cache_tag(&self, profile: GdnProfile) -> &'static str {
        let _ = profile;
        ""
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor> {
        ensure!(
            data.len() == rows * cols,
            "tensor data has {} values, shape [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        );
        self.from_host_impl(data, rows, cols)
    }
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    /// Upload rows given in either dtype (bf16 taps go to a bf16 backend unconverted).
    fn from_host_rows(&self, data: HostRowsRef, rows: usize, cols: usize) -> Result<Self::Tensor> {
        ensure!(
            data.len() == rows * cols,
            "tensor data has {} values, shape [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        );
        match data {
            HostRowsRef::F32(d) => self.from_host_impl(d, rows, cols),
            HostRowsRef::BF16(d) => self.from_host_bf16_impl(d, rows, cols),
        }
    }
    /// `t` on the host in the backend's compute dtype ([`Backend::to_host`] widens to f32).
    fn to_host_rows(&self, t: &Self::Tensor) -> Result<HostRows> {
        Ok(HostRows::F32(self.to_host(t)?))
    }
    /// [`Backend::to_host_rows`] cut into parts by rows: part i holds rows
    /// `row_starts[i]..row_starts[i + 1]` (`row_starts` ascending from 0 to the row count). The
    /// default downloads the whole tensor and copies the parts out; the CUDA backend stages it
    /// in page-locked memory it keeps, so the whole never exists as a second host copy.
    fn to_host_rows_split(&self, t: &Self::Tensor, row_starts: &[usize]) -> Result<Vec<HostRows>> {
        let (rows, cols) = self.dims(t);
        check_row_starts(row_starts, rows)?;
        Ok(host_rows::split_rows(
            self.to_host_rows(t)?,
            cols,
            row_starts,
        ))
    }
    fn dims(&self, t: &Self::Tensor) -> (usize, usize);
    fn matrix(&self, data: &[f32], out: usize, inp: usize) -> Result<Self::Matrix> {
        ensure!(
            data.len() == out * inp,
            "weight data has {} values, shape [{out}, {inp}] needs {}",
            data.len(),
            out * inp
        );
        self.matrix_impl(data, out, inp)
    }
    fn matrix_dims(&self, m: &Self::Matrix) -> (usize, usize);

    /// `x · Wᵀ`: `[T, in] × [out, in] → [T, out]`, f32 accumulation.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Matrix) -> Result<Self::Tensor> {
        let (cols, (_, inp)) = (self.dims(x).1, self.matrix_dims(w));
        ensure!(
            cols == inp,
            "matmul: input has {cols} columns, weight expects {inp}"
        );
        self.matmul_impl(x, w)
    }
    /// `x[r, c] += bias[0, c]` for every row.
    fn add_row_bias(&self, x: &mut Self::Tensor, bias: &Self::Tensor) -> Result<()> {
        let ((br, bc), cols) = (self.dims(bias), self.dims(x).1);
        ensure!(
            br * bc == cols,
            "bias has {} values, rows have {cols}",
            br * bc
        );
        self.add_row_bias_impl(x, bias)
    }
    /// `x += y` elementwise (residual add).
    fn add_inplace(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()> {
        let ((xr, xc), (yr, yc)) = (self.dims(x), self.dims(y));
        ensure!(
            (xr, xc) == (yr, yc),
            "add: shapes [{xr}, {xc}] and [{yr}, {yc}] differ"
        );
        self.add_inplace_impl(x, y)
    }
    /// RMSNorm over consecutive groups of `group` columns (group = cols for a layer norm,
    /// = head_dim for per-head q/k norms), each group scaled by `weight[0, ..group]`. The
    /// statistic is computed in f32.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        group: usize,
    ) -> Result<Self::Tensor> {
        let (cols, (wr, wc)) = (self.dims(x).1, self.dims(weight));
        ensure!(
            group > 0 && cols.is_multiple_of(group),
            "rms_norm: {cols} columns are not a multiple of group {group}"
        );
        ensure!(
            wr * wc == group,
            "rms_norm: weight has {} values, group is {group}",
            wr * wc
        );
        self.rms_norm_impl(x, weight, eps, group)
    }
    /// Rotary embedding in place on every head of `x` (`cols = n_heads * rope.head_dim`);
    /// row r is at absolute position `positions[r]`.
    fn rope_inplace(&self, x: &mut Self::Tensor, positions: &[u32], rope: &Rope) -> Result<()> {
        let (rows, cols) = self.dims(x);
        ensure!(
            positions.len() == rows,
            "rope: {} positions for {rows} rows",
            positions.len()
        );
        ensure!(
            rope.head_dim > 0 && cols.is_multiple_of(rope.head_dim),
            "rope: {cols} columns are not whole heads of {}",
            rope.head_dim
        );
        ensure!(
            rope.rotary_dim <= rope.head_dim && rope.rotary_dim.is_multiple_of(2),
            "rope: bad rotary_dim {}",
            rope.rotary_dim
        );
        self.rope_inplace_impl(x, positions, rope)
    }
    /// Scaled dot-product attention with softmax in f32. q `[Tq, heads*hd]`, k/v `[Tk, kv_heads*hd]`,
    /// output `[Tq, heads*hd]`. Query head h uses KV head `h / (heads / kv_heads)`.
    ///
    /// The mask's fit to the row counts is checked by [`AttnMask::key_intervals`], which every
    /// backend calls to learn which keys a query sees.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<Self::Tensor> {
        shape.check(self.dims(q), self.dims(k), self.dims(v))?;
        self.attention_impl(q, k, v, shape, mask)
    }
    /// Causal attention over several sequences packed into one tensor (varlen prefill): rows
    /// `seq_starts[i]..seq_starts[i + 1]` form sequence i (`seq_starts` runs from 0 to the row
    /// count); a query sees the keys of its own sequence at or before itself
    /// ([`varlen_key_intervals`]). q and k/v have the same rows.
    fn attention_varlen(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
    ) -> Result<Self::Tensor> {
        check_varlen(self, q, k, v, shape, seq_starts)?;
        self.attention_varlen_impl(q, k, v, shape, seq_starts)
    }
    /// Packed-prefill attention of a fused QKV projection output `[T, (H + 2·Hkv)·hd]` (q | k | v
    /// columns, as [`Backend::split_cols`] would split them): optional per-head q/k RMSNorm, RoPE
    /// of q and k at `positions`, then [`Backend::attention_varlen`] over `seq_starts`. Consumes
    /// `qkv` because a backend may normalise and rotate it in place.
    ///
    /// Why: the CUDA backend does norm + RoPE in one in-place pass over the QKV output and lets
    /// attention read q/k/v straight from it, saving the three split copies and four
    /// norm/RoPE launches (each a read and write of q or k) per layer. The default is exactly the
    /// unfused composition ([`attention_varlen_qkv_unfused`]).
    fn attention_varlen_qkv(
        &self,
        qkv: Self::Tensor,
        shape: AttnShape,
        qk_norm: Option<QkNorm<'_, Self::Tensor>>,
        positions: &[u32],
        rope: &Rope,
        seq_starts: &SeqStarts,
    ) -> Result<Self::Tensor> {
        attention_varlen_qkv_unfused(self, qkv, shape, qk_norm, positions, rope, seq_starts)
    }
    /// `silu(gate) ⊙ up`.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor> {
        ensure!(
            self.dims(gate) == self.dims(up),
            "swiglu: gate and up shapes differ"
        );
        self.swiglu_impl(gate, up)
    }
    /// SwiGLU of a fused gate|up projection output `[T, 2·I]` (gate columns first) → `[T, I]`.
    ///
    /// Why: one `[2·I, D]` GEMM replaces the gate and up GEMMs, and a backend can read both
    /// halves in place (CUDA) instead of copying them out. The default splits and calls
    /// [`Backend::swiglu`] (same arithmetic).
    fn swiglu_packed(&self, gu: &Self::Tensor) -> Result<Self::Tensor> {
        let (_, cols) = self.dims(gu);
        anyhow::ensure!(
            cols.is_multiple_of(2),
            "swiglu_packed: {cols} columns cannot be gate | up halves"
        );
        let parts = self.split_cols(gu, &[cols / 2, cols / 2])?;
        self.swiglu(&parts[0], &parts[1])
    }
    /// `acc += x · Wᵀ` (a projection followed by the residual add).
    ///
    /// Why: the CUDA backend does the add in the GEMM epilogue (beta = 1), saving the product's
    /// write and re-read and one launch; the epilogue may round `acc + product` once where the
    /// default rounds the product first (within one bf16 rounding, docs/cuda.md). The default is
    /// [`Backend::matmul`] then [`Backend::add_inplace`] (the CPU's exact numerics).
    fn matmul_acc(&self, x: &Self::Tensor, w: &Self::Matrix, acc: &mut Self::Tensor) -> Result<()> {
        let y = self.matmul(x, w)?;
        self.add_inplace(acc, &y)
    }
    /// One decode step's attention for several sequences: row r of q `[R, heads·hd]` and of k/v
    /// `[R, kv_heads·hd]` is the next token of the sequence whose cache is `caches[r]` (positions
    /// `0..len_r`). Appends row r of k/v to that cache and attends q row r over positions
    /// `0..=len_r`; returns `[R, heads·hd]`. Row r must not depend on the other rows.
    ///
    /// Why: per sequence, the default ([`attention_decode_per_row`]) costs a few copies and
    /// launches per row and layer; the CUDA backend does all rows in one launch and grows each
    /// cache in place.
    fn attention_decode(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, Self::Tensor>],
    ) -> Result<Self::Tensor> {
        attention_decode_per_row(self, q, k, v, shape, caches)
    }
    /// One decode step's attention ([`Backend::attention_decode`]) from a fused QKV projection
    /// output `[R, (H + 2·Hkv)·hd]` (q | k | v columns): optional per-head q/k RMSNorm and RoPE
    /// of q and k at `positions` (row r's position), then the attention of each row over its
    /// own cache. Consumes `qkv` because a backend may normalise and rotate it in place.
    ///
    /// Why: at one to 64 rows a decode step's small launches cost as much as its GEMMs; the
    /// CUDA backend does norm + RoPE in one in-place pass and lets the attention read q/k/v
    /// straight from the projection (two launches instead of eight per layer). The default is
    /// exactly the unfused composition ([`attention_decode_qkv_unfused`]).
    fn attention_decode_qkv(
        &self,
        qkv: Self::Tensor,
        shape: AttnShape,
        qk_norm: Option<QkNorm<'_, Self::Tensor>>,
        positions: &[u32],
        rope: &Rope,
        caches: &mut [KvSlot<'_, Self::Tensor>],
    ) -> Result<Self::Tensor> {
        attention_decode_qkv_unfused(self, qkv, shape, qk_norm, positions, rope, caches)
    }
    /// [`Backend::attention`] with what gpt-oss adds ([`AttnExtras`]: a sliding window on a
    /// causal mask, a sink logit per head in the softmax). With [`AttnExtras::NONE`] it is
    /// exactly [`Backend::attention`]; otherwise a backend that lacks them
    /// ([`Backend::supports_attention_sinks`]) refuses.
    fn attention_ext(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        mask: &AttnMask,
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        if extras.is_none() {
            return self.attention(q, k, v, shape, mask);
        }
        shape.check(self.dims(q), self.dims(k), self.dims(v))?;
        extras.check(shape, Some(mask))?;
        self.attention_ext_impl(q, k, v, shape, mask, extras)
    }
    /// [`Backend::attention_varlen`] with [`AttnExtras`] (every sequence causal from position
    /// 0, the window counted within it). Default: [`compose::attention_varlen_per_seq`].
    fn attention_varlen_ext(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        if extras.is_none() {
            return self.attention_varlen(q, k, v, shape, seq_starts);
        }
        check_varlen(self, q, k, v, shape, seq_starts)?;
        extras.check(shape, None)?;
        self.attention_varlen_ext_impl(q, k, v, shape, seq_starts, extras)
    }
    /// [`Backend::attention_decode`] with [`AttnExtras`] (row r at position `len_r`). Default:
    /// [`compose::attention_decode_per_row_ext`].
    fn attention_decode_ext(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, Self::Tensor>],
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        if extras.is_none() {
            return self.attention_decode(q, k, v, shape, caches);
        }
        extras.check(shape, None)?;
        self.attention_decode_ext_impl(q, k, v, shape, caches, extras)
    }
    /// One decode step's attention with [`AttnExtras`] from a fused QKV projection output
    /// `[R, (H + 2·Hkv)·hd]` (q | k | v columns, no q/k norms: gpt-oss): RoPE of q and k from
    /// explicit frequencies at `positions` (row r's), then [`Backend::attention_decode_ext`].
    /// Consumes `qkv` because a backend may rotate it in place.
    ///
    /// Why: the split into three tensors and the two rotations cost five small launches a layer
    /// of a decode step, whose GPU time is mostly such launches at batch 1; the CUDA backend
    /// rotates q and k in place in one launch and its decode attention reads q, k and v straight
    /// from the projection. Default: exactly the split composition
    /// ([`compose::attention_decode_qkv_ext_unfused`]).
    #[allow(clippy::too_many_arguments)] // the attention's inputs, the rotation, caches, extras
    fn attention_decode_qkv_ext(
        &self,
        qkv: Self::Tensor,
        shape: AttnShape,
        positions: &[u32],
        freqs: &RopeFreqs,
        caches: &mut [KvSlot<'_, Self::Tensor>],
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        compose::attention_decode_qkv_ext_unfused(
            self, qkv, shape, positions, freqs, caches, extras,
        )
    }
    /// The attention of a verify pass computed as decoding computes it: rows `0..T` of q
    /// `[T, heads·hd]` and k/v `[T, kv_heads·hd]` are the next T tokens of one sequence (cache
    /// `slot`, positions `len..len+T`); row t is appended and attends over positions `0..=len+t`
    /// with exactly the bits of a decode step at that length ([`Backend::attention_decode_ext`]
    /// of that row alone). Returns `[T, heads·hd]`.
    ///
    /// Why: a verify pass that rounds like decoding makes live speculative decoding equal plain
    /// greedy decoding bit for bit in any precision (docs/live.md, "Verify equals decoding").
    /// Default: that decode step, row after row ([`compose::attention_verify_per_row`]); the
    /// CUDA backend appends the T rows first and runs them in one decode-attention launch.
    fn attention_verify(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        slot: KvSlot<'_, Self::Tensor>,
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        compose::attention_verify_per_row(self, q, k, v, shape, slot, extras)
    }
    /// Whether [`Backend::attention_ext`] computes sinks and windows here (the CPU reference).
    /// A model with sinks is refused at load where it does not (`model::gpt_oss`).
    fn supports_attention_sinks(&self) -> bool {
        false
    }
    /// Rotary embedding in place from explicit inverse frequencies and a cos/sin scale
    /// ([`RopeFreqs`]: YaRN); row r at position `positions[r]`. With
    /// [`RopeFreqs::of_rope`]`(rope)` the same as [`Backend::rope_inplace`] with `rope`.
    fn rope_freqs_inplace(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> Result<()> {
        let (rows, cols) = self.dims(x);
        freqs.check(cols, rows, positions.len())?;
        self.rope_freqs_impl(x, positions, freqs)
    }
    /// gpt-oss's clamped SwiGLU of a fused gate|up output `[T, 2·I]` (gate columns first) →
    /// `[T, I]` ([`gpt_oss::clamped_swiglu`]).
    fn clamped_swiglu_packed(
        &self,
        gu: &Self::Tensor,
        alpha: f32,
        limit: f32,
    ) -> Result<Self::Tensor> {
        gpt_oss::check_clamped_swiglu(self.dims(gu).1)?;
        self.clamped_swiglu_impl(gu, alpha, limit)
    }
    /// Rows `ids` of an embedding table `[vocab, dim]` → `[ids.len(), dim]`.
    fn embed(&self, table: &Self::Matrix, ids: &[u32]) -> Result<Self::Tensor> {
        let vocab = self.matrix_dims(table).0;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            anyhow::bail!("token id {bad} is outside the embedding table ({vocab} rows)");
        }
        self.embed_impl(table, ids)
    }
    /// Stack tensors with equal column counts.
    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        let cols = parts.first().map(|p| self.dims(p).1).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| self.dims(p).1 == cols),
            "concat_rows: column counts differ"
        );
        self.concat_rows_impl(parts)
    }
    /// `x = concat_rows([x, y])`: how the KV cache grows. A backend may do it in place.
    fn append_rows(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()> {
        let (xc, yc) = (self.dims(x).1, self.dims(y).1);
        ensure!(xc == yc, "append_rows: {yc} columns after {xc}");
        self.append_rows_impl(x, y)
    }
    /// The most rows a call may have while every row of every op's output stays bit-identical
    /// to the same row computed alone (however many rows share the call, up to this limit).
    ///
    /// Why: batched greedy decoding ([`crate::generate::greedy_batch`]) may only group prompts
    /// when a prompt's continuation cannot depend on its batch-mates; otherwise a cached
    /// continuation would depend on which prompts ran together. [`crate::session::Session`]
    /// decodes at most this many prompts together. The CPU reference says `usize::MAX`; the CUDA
    /// backend 64 (`MAX_DECODE_ROWS`: up to 64 rows its GEMMs run on a kernel whose order of
    /// summation is fixed by the weight's shape; cuBLAS, used above that, picks algorithms by
    /// shape). The default, 1, is always safe: prompts decode one at a time.
    fn max_independent_rows(&self) -> usize {
        1
    }
    /// Whether decode steps can be recorded once and replayed ([`Backend::record_step`]): the
    /// CUDA backend's graphs (docs/cuda.md, "Recorded decode steps"), unless
    /// `DRAFTLENS_STEP_GRAPHS=off`. The default: no.
    ///
    /// Why: a decode step of a few rows is ~20 small launches a layer, and the host takes
    /// longer to issue them than the GPU to run them; a replay is one copy and one launch.
    fn records_steps(&self) -> bool {
        false
    }
    /// Records `step` — one decode step of a batch, its output `[rows, cols]` — so that it can
    /// be replayed for the next `steps - 1` steps of the same batch, runs it for this step and
    /// returns the recording's id with the output; `Ok(None)` when this step cannot be recorded
    /// (nothing ran: the caller runs it itself). The caller promises what makes a replay valid:
    /// between replays its KV caches are touched by nothing else, their rows were reserved for
    /// every step the recording serves ([`Backend::reserve_rows`]), and each replay follows the
    /// last step with one more token per row ([`crate::model::StepRecorder`] keeps that promise).
    fn record_step(
        &self,
        (rows, cols): (usize, usize),
        steps: usize,
        step: &mut dyn FnMut() -> Result<Self::Tensor>,
    ) -> Result<Option<(u64, Self::Tensor)>> {
        let _ = (rows, cols, steps, step);
        Ok(None)
    }
    /// The next step of recording `id` with the batch's new token ids (one per row): the output
    /// the recorded step would give for it. The caller then advances its caches' row counts
    /// ([`Backend::set_rows`]).
    fn replay_step(&self, id: u64, ids: &[u32]) -> Result<Self::Tensor> {
        let _ = ids;
        bail!(
            "{}: no recorded decode step {id} (this backend records none)",
            self.name()
        )
    }
    /// Drops recording `id` (its graph and buffers).
    fn forget_step(&self, id: u64) {
        let _ = id;
    }
    /// Whether greedy recordings feed themselves ([`Backend::feed_greedy`]): the CUDA backend's
    /// do while it records steps when `DRAFTLENS_STEP_FEED=on`. The default: no.
    fn feeds_steps(&self) -> bool {
        false
    }
    /// Inside [`Backend::record_step`]'s step, after it: the recorded step then feeds itself. It
    /// ends by writing each row's greedy next token — the top-1 of `hidden` under `head`, the id
    /// [`Backend::lm_head_topk`] gives for k = 1 — where the next replay reads its token ids, so
    /// that [`Backend::replay_step_fed`] runs the next step with nothing from the host; every
    /// launch of the recording (the recorded step's, each replay's) queues its tokens for
    /// [`Backend::take_fed_tokens`]. Why: the caller can launch step n + 1 before it reads step
    /// n's tokens, and the GPU does not wait on the host between steps. The default: an error
    /// (this backend records nothing).
    fn feed_greedy(&self, hidden: &Self::Tensor, head: &Self::Matrix) -> Result<()> {
        let _ = (hidden, head);
        bail!("{}: records no decode steps", self.name())
    }
    /// The next step of self-feeding recording `id` ([`Backend::feed_greedy`]), its token ids the
    /// last launch's greedy tokens: queued, not waited for. The caller then advances its caches'
    /// row counts as after [`Backend::replay_step`].
    fn replay_step_fed(&self, id: u64) -> Result<()> {
        bail!(
            "{}: no recorded decode step {id} (this backend records none)",
            self.name()
        )
    }
    /// The greedy tokens of the oldest launch of self-feeding recording `id` not taken yet,
    /// once that launch has finished (a launch queued after it may still run). At most one
    /// launch runs ahead of the tokens taken.
    fn take_fed_tokens(&self, id: u64) -> Result<Vec<u32>> {
        bail!(
            "{}: no recorded decode step {id} (this backend records none)",
            self.name()
        )
    }
    /// Makes room in `x`'s buffer for `extra` more rows appended in place, so that a cache does
    /// not move while a recorded step uses it. The default does nothing (nothing is recorded).
    fn reserve_rows(&self, x: &mut Self::Tensor, extra: usize) -> Result<()> {
        let _ = (x, extra);
        Ok(())
    }
    /// Sets `x`'s row count to `rows` within its buffer (a cache after replayed steps appended
    /// rows in place, or back after a recording that did not take); rows beyond the old count
    /// hold what the device wrote there.
    fn set_rows(&self, x: &mut Self::Tensor, rows: usize) -> Result<()> {
        let _ = (x, rows);
        bail!("{}: tensors cannot be resized in place", self.name())
    }
    /// Put tensors with equal row counts side by side (DFlash tap fusion).
    fn concat_cols(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        let rows = parts.first().map(|p| self.dims(p).0).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| self.dims(p).0 == rows),
            "concat_cols: row counts differ"
        );
        self.concat_cols_impl(parts)
    }
    /// Split the columns of `x` into consecutive tensors of the given widths (which must add up
    /// to the column count): the outputs of a fused projection (q | k | v, gate | up). Exact
    /// copies; the inverse of [`Backend::concat_cols`].
    fn split_cols(&self, x: &Self::Tensor, widths: &[usize]) -> Result<Vec<Self::Tensor>> {
        let cols = self.dims(x).1;
        ensure!(
            widths.iter().sum::<usize>() == cols,
            "split_cols: widths {widths:?} do not add up to {cols} columns"
        );
        self.split_cols_impl(x, widths)
    }
    /// Rows `start..end` (KV-cache cropping, last-token selection).
    fn slice_rows(&self, x: &Self::Tensor, start: usize, end: usize) -> Result<Self::Tensor> {
        let rows = self.dims(x).0;
        ensure!(
            start <= end && end <= rows,
            "slice_rows {start}..{end} out of {rows} rows"
        );
        self.slice_rows_impl(x, start, end)
    }
    /// Rows listed in `rows`, in that order.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor> {
        let n = self.dims(x).0;
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
            anyhow::bail!("gather_rows: row {bad} out of {n}");
        }
        self.gather_rows_impl(x, rows)
    }
    /// `acc[r] += Σ_j weights[r·n + j] · src[index[r·n + j]]` for every row r of `acc`, n =
    /// `index.len() / rows` terms per row, the products and their sum in f32 in j order, added
    /// to `acc[r]` once ([`moe::add_weighted_rows`]): how a mixture of experts adds each
    /// token's weighted expert outputs (`crate::model::moe::RoutingPlan`). Row r reads only its
    /// own terms, so it never depends on the other rows.
    ///
    /// Why: one pass over every token and expert of a layer instead of a scale and a scatter per
    /// expert. The default downloads and runs the host reference (correct on every backend);
    /// the CPU and CUDA backends work in place.
    fn add_weighted_rows(
        &self,
        acc: &mut Self::Tensor,
        src: &Self::Tensor,
        index: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        let ((rows, cols), (src_rows, src_cols)) = (self.dims(acc), self.dims(src));
        ensure!(
            src_cols == cols,
            "add_weighted_rows: source has {src_cols} columns, accumulator {cols}"
        );
        ensure!(
            index.len() == weights.len(),
            "add_weighted_rows: {} indices and {} weights",
            index.len(),
            weights.len()
        );
        ensure!(
            index.len() % rows.max(1) == 0 && (rows > 0 || index.is_empty()),
            "add_weighted_rows: {} terms for {rows} rows (the same number per row)",
            index.len()
        );
        if let Some(&bad) = index.iter().find(|&&i| i as usize >= src_rows) {
            anyhow::bail!("add_weighted_rows: row {bad} of a source of {src_rows} rows");
        }
        self.add_weighted_rows_impl(acc, src, index, weights)
    }
    /// A sparse MLP's routed experts run on the device without the host in the loop:
    /// `h[r] += Σ_j w_rj · expert_j(x[r]) (+ g_r · shared_out[r])`, with row r's experts and
    /// weights chosen from `logits[r]` (`[T, E]`, or `[T, E + 1]` with the shared expert's gate
    /// logit last, g_r its sigmoid) by `routing.rule` (Qwen's [`crate::model::moe::route`] or
    /// gpt-oss's [`crate::model::moe::route_topk_softmax`]), each expert
    /// `down(act(gate_up(x) + b_gu)) + b_down` as [`moe::MoeExperts`] describes it (biases and
    /// the clamped activation: gpt-oss), and the terms summed as [`Backend::add_weighted_rows`]
    /// sums them. Returns `Ok(false)`, having done nothing, where the backend does not (the
    /// default, so the CPU reference; CUDA with `DRAFTLENS_MOE_ROUTING=host`): the caller then
    /// routes on the host (`crate::model::moe::SparseMoe::forward_acc`,
    /// `crate::model::gpt_oss::GptOssMoe::forward_acc`), which gives the same terms.
    fn moe_routed_acc(
        &self,
        _x: &Self::Tensor,
        _logits: &Self::Tensor,
        _experts: &moe::MoeExperts<'_, Self::Matrix, Self::Tensor>,
        _shared_out: Option<&Self::Tensor>,
        _routing: &moe::MoeRouting,
        _h: &mut Self::Tensor,
    ) -> Result<bool> {
        Ok(false)
    }
    /// LM head fused with log-softmax and top-k: `x · headᵀ` per row, never returning the full
    /// vocabulary logits.
    fn lm_head_topk(&self, x: &Self::Tensor, head: &Self::Matrix, k: usize) -> Result<TopK> {
        let (cols, (vocab, inp)) = (self.dims(x).1, self.matrix_dims(head));
        ensure!(
            cols == inp,
            "lm_head: hidden has {cols} columns, head expects {inp}"
        );
        ensure!(vocab > 0, "lm_head: vocabulary of 0 rows");
        self.lm_head_topk_impl(x, head, k)
    }

    // ---- What a backend implements: the checked ops above, called after their shape checks
    // (one message per misfit, here, for every backend). A backend overrides the public method
    // only for a fused path whose own preconditions differ. ----

    #[allow(clippy::wrong_self_convention)] // named after `from_host`, as every `*_impl`
    fn from_host_impl(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// bf16 input; by default widened (exactly) and passed to `from_host_impl`.
    #[allow(clippy::wrong_self_convention)]
    fn from_host_bf16_impl(
        &self,
        data: &[half::bf16],
        rows: usize,
        cols: usize,
    ) -> Result<Self::Tensor> {
        self.from_host_impl(&host_rows::bf16_to_f32(data), rows, cols)
    }
    fn matrix_impl(&self, data: &[f32], out: usize, inp: usize) -> Result<Self::Matrix>;
    fn matmul_impl(&self, x: &Self::Tensor, w: &Self::Matrix) -> Result<Self::Tensor>;
    fn add_row_bias_impl(&self, x: &mut Self::Tensor, bias: &Self::Tensor) -> Result<()>;
    fn add_inplace_impl(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    fn rms_norm_impl(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        group: usize,
    ) -> Result<Self::Tensor>;
    fn rope_inplace_impl(&self, x: &mut Self::Tensor, positions: &[u32], rope: &Rope)
        -> Result<()>;
    fn attention_impl(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<Self::Tensor>;
    /// [`Backend::attention_varlen`] with shapes checked. The default runs
    /// [`Backend::attention`] once per sequence; the CUDA backend does all sequences in one launch.
    fn attention_varlen_impl(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
    ) -> Result<Self::Tensor> {
        compose::attention_varlen_per_seq(self, q, k, v, shape, seq_starts, AttnExtras::NONE)
    }
    fn swiglu_impl(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    fn embed_impl(&self, table: &Self::Matrix, ids: &[u32]) -> Result<Self::Tensor>;
    fn concat_rows_impl(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;
    /// [`Backend::append_rows`]; the default is [`Backend::concat_rows`].
    fn append_rows_impl(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()> {
        *x = self.concat_rows_impl(&[x, y])?;
        Ok(())
    }
    fn concat_cols_impl(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;
    fn split_cols_impl(&self, x: &Self::Tensor, widths: &[usize]) -> Result<Vec<Self::Tensor>>;
    fn slice_rows_impl(&self, x: &Self::Tensor, start: usize, end: usize) -> Result<Self::Tensor>;
    fn gather_rows_impl(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;
    /// Default: the host reference on downloaded copies, the result uploaded.
    fn add_weighted_rows_impl(
        &self,
        acc: &mut Self::Tensor,
        src: &Self::Tensor,
        index: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        let (rows, cols) = self.dims(acc);
        let mut host = self.to_host(acc)?;
        moe::add_weighted_rows(&mut host, &self.to_host(src)?, cols, index, weights);
        *acc = self.from_host(&host, rows, cols)?;
        Ok(())
    }
    fn lm_head_topk_impl(&self, x: &Self::Tensor, head: &Self::Matrix, k: usize) -> Result<TopK>;
    /// [`Backend::attention_ext`] with extras present, checked. Default: refused
    /// ([`gpt_oss::sinks_unsupported`]).
    fn attention_ext_impl(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        mask: &AttnMask,
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        let _ = (q, k, v, shape, mask, extras);
        gpt_oss::attention_ext_unsupported(self)
    }
    /// [`Backend::attention_varlen_ext`] with extras present, checked. Default: one sequence at
    /// a time ([`compose::attention_varlen_per_seq`]).
    fn attention_varlen_ext_impl(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        seq_starts: &SeqStarts,
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        compose::attention_varlen_per_seq(self, q, k, v, shape, seq_starts, extras)
    }
    /// [`Backend::attention_decode_ext`] with extras present, checked. Default: one row at a
    /// time ([`compose::attention_decode_per_row_ext`]).
    fn attention_decode_ext_impl(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: AttnShape,
        caches: &mut [KvSlot<'_, Self::Tensor>],
        extras: AttnExtras<'_>,
    ) -> Result<Self::Tensor> {
        compose::attention_decode_per_row_ext(self, q, k, v, shape, caches, extras)
    }
    /// [`Backend::rope_freqs_inplace`], checked. Default: the CPU reference's rotation on a
    /// downloaded copy, uploaded.
    fn rope_freqs_impl(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> Result<()> {
        let (rows, cols) = self.dims(x);
        let mut h = self.to_host(x)?;
        cpu::rotate_rows(&mut h, cols, positions, freqs);
        *x = self.from_host(&h, rows, cols)?;
        Ok(())
    }
    /// [`Backend::clamped_swiglu_packed`], checked. Default: the host reference
    /// ([`gpt_oss::clamped_swiglu`]).
    fn clamped_swiglu_impl(
        &self,
        gu: &Self::Tensor,
        alpha: f32,
        limit: f32,
    ) -> Result<Self::Tensor> {
        let (rows, cols) = self.dims(gu);
        let y = gpt_oss::clamped_swiglu(&self.to_host(gu)?, cols, alpha, limit);
        self.from_host(&y, rows, cols / 2)
    }

    // ---- Hybrid (Qwen3.5 / Qwen3-Next) ops. Contracts: docs/hybrid-models.md and [`gdn`]. ----

    /// Upload f32 values exactly (no rounding to the activation dtype). The default builds a
    /// [`HostF32`] and works when `F32Buf = HostF32`; otherwise it is an error.
    fn f32_from_host(&self, data: &[f32]) -> Result<Self::F32Buf> {
        let b: Box<dyn Any> = Box::new(HostF32(data.to_vec()));
        b.downcast::<Self::F32Buf>().map(|b| *b).map_err(|_| {
            anyhow!(
                "backend {}: F32Buf is not HostF32, so it must implement f32_from_host",
                self.name()
            )
        })
    }
    /// Download an f32 buffer exactly. Default: the inverse of [`Backend::f32_from_host`].
    fn f32_to_host(&self, b: &Self::F32Buf) -> Result<Vec<f32>> {
        (b as &dyn Any)
            .downcast_ref::<HostF32>()
            .map(|h| h.0.clone())
            .ok_or_else(|| {
                anyhow!(
                    "backend {}: F32Buf is not HostF32, so it must implement f32_to_host",
                    self.name()
                )
            })
    }

    /// An independent copy of an f32 buffer (the recurrent-state snapshot taken before a
    /// speculative verify forward). Default: through the host.
    fn f32_copy(&self, b: &Self::F32Buf) -> Result<Self::F32Buf> {
        self.f32_from_host(&self.f32_to_host(b)?)
    }

    /// Zero-centred RMSNorm (`Qwen3_5RMSNorm`, also the hybrids' q/k norms) over consecutive
    /// groups of `group` columns: `y = x · rsqrt(mean(x²) + eps) · (1 + w)`, the statistic in f32
    /// and `1 + w` formed in f32 from the stored weight `w` `[1, group]` (HF:
    /// `output * (1.0 + self.weight.float())`, one rounding to the activation dtype at the end).
    /// `x` `[T, cols]` → `[T, cols]`. Not the same as [`Backend::rms_norm`] with a weight of
    /// `1 + w` on a bf16 backend: `1 + w` rounded to bf16 loses the low bits of a small `w`.
    /// Default: host reference ([`gdn::rms_norm_zero_centred`]).
    fn rms_norm_zero_centred(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        group: usize,
    ) -> Result<Self::Tensor> {
        let (rows, cols) = self.dims(x);
        let w = self.to_host(weight)?;
        ensure!(
            group > 0 && cols.is_multiple_of(group) && w.len() == group,
            "rms_norm_zero_centred: {cols} columns, group {group}, weight of {} values",
            w.len()
        );
        let y = gdn::rms_norm_zero_centred(&self.to_host(x)?, &w, eps, group);
        self.from_host(&y, rows, cols)
    }

    /// Gated RMSNorm of the Gated DeltaNet output (`Qwen3_5RMSNormGated`), per group of `group`
    /// columns (= `v_dim`, one value head): `y = (w ⊙ x · rsqrt(mean(x²) + eps)) ⊙ silu(z)` with
    /// the statistic and the gate in f32; `w` `[1, group]` used as stored (NOT zero-centred).
    /// `x`, `z` `[T, v_heads · v_dim]` → `[T, v_heads · v_dim]`. Default: host reference
    /// ([`gdn::gated_rms_norm`]).
    fn gated_rms_norm(
        &self,
        x: &Self::Tensor,
        z: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        group: usize,
    ) -> Result<Self::Tensor> {
        let (rows, cols) = self.dims(x);
        let w = self.to_host(weight)?;
        ensure!(
            self.dims(z) == (rows, cols),
            "gated_rms_norm: x is {:?}, z is {:?}",
            (rows, cols),
            self.dims(z)
        );
        ensure!(
            group > 0 && cols.is_multiple_of(group) && w.len() == group,
            "gated_rms_norm: {cols} columns, group {group}, weight of {} values",
            w.len()
        );
        let y = gdn::gated_rms_norm(&self.to_host(x)?, &self.to_host(z)?, &w, eps, group);
        self.from_host(&y, rows, cols)
    }

    /// `x ⊙= sigmoid(gate)` elementwise, the gate in f32 (the gated attention's output gate:
    /// `attn_output * torch.sigmoid(gate)`). `x`, `gate` `[T, heads · head_dim]`. Default: host
    /// reference ([`gdn::sigmoid_gate`]).
    fn sigmoid_gate_inplace(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<()> {
        let (rows, cols) = self.dims(x);
        ensure!(
            self.dims(gate) == (rows, cols),
            "sigmoid_gate: x is {:?}, gate is {:?}",
            (rows, cols),
            self.dims(gate)
        );
        let mut h = self.to_host(x)?;
        gdn::sigmoid_gate(&mut h, &self.to_host(gate)?);
        *x = self.from_host(&h, rows, cols)?;
        Ok(())
    }

    /// Causal depthwise conv1d + SiLU over sequences packed row-wise, each carrying a conv state.
    ///
    /// - `x` `[T, C]`: the `in_proj_qkv` output (C = conv_dim, q | k | v columns); rows
    ///   `seq_starts[i]..seq_starts[i+1]` are sequence i's new tokens (`seq_starts` runs from 0 to
    ///   T, non-decreasing; an empty sequence leaves its state alone).
    /// - `weight` `[C, K]`: `conv1d.weight` `[C, 1, K]` squeezed; `weight[c, K−1]` weights the
    ///   current token; no bias.
    /// - `states[i]` `[K−1, C]`: sequence i's previous K−1 inputs, oldest first, in the activation
    ///   dtype (zeros for a fresh sequence: that is the causal zero padding). Replaced by the last
    ///   K−1 rows of `states[i] ++ x_i`.
    ///
    /// Output `[T, C]`: `y[t, c] = silu(Σ_j weight[c, j] · in[t − (K−1) + j, c])` with f32
    /// accumulation, `in` = state ++ rows. Default: host reference ([`gdn::causal_conv1d_silu`]).
    fn causal_conv1d_silu(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        seq_starts: &SeqStarts,
        states: &mut [&mut Self::Tensor],
    ) -> Result<Self::Tensor> {
        let (rows, c) = self.dims(x);
        let (wc, k) = self.dims(weight);
        ensure!(
            wc == c && k >= 1,
            "causal_conv1d: weight is [{wc}, {k}] for {c} channels"
        );
        seq_starts.check_rows_and_states("causal_conv1d", rows, states.len())?;
        for st in states.iter() {
            ensure!(
                self.dims(st) == (k - 1, c),
                "causal_conv1d: state is {:?}, expected [{}, {c}]",
                self.dims(st),
                k - 1
            );
        }
        host_causal_conv1d_silu(self, x, weight, seq_starts, states)
    }

    /// The gated delta rule of a Gated DeltaNet layer over sequences packed row-wise.
    ///
    /// - `qkv` `[T, 2·Hk·dk + Hv·dv]`: the conv output, columns q (Hk heads of dk) | k | v (Hv
    ///   heads of dv); value head h reads q/k head `h / (Hv/Hk)`.
    /// - `a`, `b` `[T, Hv]`: raw `in_proj_a` / `in_proj_b` outputs. Inside, in f32:
    ///   `g = −exp(A_log) · softplus(a + dt_bias)`, `β = sigmoid(b)`.
    /// - `seq_starts` as in [`Backend::causal_conv1d_silu`]; `states[i]` is sequence i's state S,
    ///   f32 `[Hv, dk, dv]` row-major (S per value head, rows indexed by the key dim, as HF's
    ///   `recurrent_state[b]`), zeros for a fresh sequence, updated in place. This is how packed
    ///   sequences reset: each starts from its own (zero) state.
    ///
    /// q and k are L2-normed per head (`x · rsqrt(Σx² + 1e-6)`), q scaled by `dk^−½`. A sequence
    /// of one row runs the recurrent form, longer ones the chunked form (chunks of 64), as
    /// transformers does for cached decode vs prefill; `params.profile` picks the numerics
    /// ([`GdnProfile`]). Output `[T, Hv·dv]`, before the gated norm. Default: host reference
    /// ([`gdn::gated_delta_rule_seq`] per sequence).
    fn gated_delta_rule(
        &self,
        qkv: &Self::Tensor,
        a: &Self::Tensor,
        b: &Self::Tensor,
        params: &GdnParams<'_, Self>,
        seq_starts: &SeqStarts,
        states: &mut [&mut Self::F32Buf],
    ) -> Result<Self::Tensor> {
        let shape = params.shape;
        shape.check()?;
        let (rows, cd) = self.dims(qkv);
        let hv = shape.v_heads;
        ensure!(
            cd == shape.conv_dim(),
            "gated_delta_rule: qkv has {cd} columns, expected {}",
            shape.conv_dim()
        );
        ensure!(
            self.dims(a) == (rows, hv) && self.dims(b) == (rows, hv),
            "gated_delta_rule: a is {:?}, b is {:?}, expected [{rows}, {hv}]",
            self.dims(a),
            self.dims(b)
        );
        seq_starts.check_rows_and_states("gated_delta_rule", rows, states.len())?;
        let (a_log, dt_bias) = (
            self.f32_to_host(params.a_log)?,
            self.f32_to_host(params.dt_bias)?,
        );
        ensure!(
            a_log.len() == hv && dt_bias.len() == hv,
            "gated_delta_rule: A_log has {} values, dt_bias {}, expected {hv}",
            a_log.len(),
            dt_bias.len()
        );
        let (xh, ah, bh) = (self.to_host(qkv)?, self.to_host(a)?, self.to_host(b)?);
        let vd = shape.value_dim();
        let mut out = Vec::with_capacity(rows * vd);
        for (w, st) in seq_starts.windows(2).zip(states.iter_mut()) {
            if w[0] == w[1] {
                continue;
            }
            let mut sh = self.f32_to_host(st)?;
            ensure!(
                sh.len() == shape.state_len(),
                "gated_delta_rule: state has {} values, expected {}",
                sh.len(),
                shape.state_len()
            );
            out.extend(gdn::gated_delta_rule_seq(
                (
                    &xh[w[0] * cd..w[1] * cd],
                    &ah[w[0] * hv..w[1] * hv],
                    &bh[w[0] * hv..w[1] * hv],
                ),
                GdnLayerHost {
                    a_log: &a_log,
                    dt_bias: &dt_bias,
                    shape,
                    profile: params.profile,
                },
                &mut sh,
            ));
            **st = self.f32_from_host(&sh)?;
        }
        self.from_host(&out, rows, vd)
    }

    /// A weight `[out, inp]` from its stored bytes ([`raw::RawPart`], borrowed from the file's
    /// memory map): the same matrix [`Backend::matrix`] builds from those values as f32.
    ///
    /// Why: a 16 GB bf16 checkpoint converted to f32 on the host takes 32 GB of RAM and most of
    /// the load time; a backend can upload the bytes as they are (`backend/cuda/upload.rs`).
    fn matrix_raw(&self, part: raw::RawPart<'_>) -> Result<Self::Matrix> {
        self.matrix_stacked_raw(&[part])
    }
    /// Parts `[rows_i, inp]` stacked by output rows into one `[Σ rows_i, inp]` matrix (fused
    /// q | k | v, gate | up). The default converts every part to f32 into one buffer, in
    /// [`raw::CONVERT_CHUNK`]-element chunks, and calls [`Backend::matrix`]: bit-identical to
    /// stacking f32 tensors on the host, as the loader always did.
    fn matrix_stacked_raw(&self, parts: &[raw::RawPart<'_>]) -> Result<Self::Matrix> {
        let inp = parts.first().map(|p| p.cols).unwrap_or(0);
        let out: usize = parts.iter().map(|p| p.rows).sum();
        let data = raw::stacked_to_f32(parts, inp)?;
        self.matrix(&data, out, inp)
    }
    /// A weight `[out, inp]` from a part stored transposed (`stored.rows` = inp, `stored.cols` =
    /// out: gpt-oss's unquantised expert stacks, which transformers multiplies as `x @ W`), its
    /// rows placed by [`raw::transposed_row`] (gate then up when `interleaved`). The default
    /// transposes the bytes on the host ([`raw::transposed`]) and calls [`Backend::matrix_raw`];
    /// the CUDA backend copies them as stored and transposes on the GPU, bit for bit the same.
    fn matrix_raw_transposed(
        &self,
        stored: raw::RawPart<'_>,
        interleaved: bool,
    ) -> Result<Self::Matrix> {
        raw::with_host_transposed(stored, interleaved, |part| self.matrix_raw(part))
    }
    /// A weight `[out, inp]` from MXFP4 blocks and scales (`blocks` `out · inp / 2` bytes,
    /// `scales` `out · inp / 32` e8m0 exponents, row-major, as [`mxfp4`] describes them; gpt-oss's
    /// experts): the matrix [`Backend::matrix`] builds from their dequantised values, or one that
    /// computes exactly as it does. Checked here ([`mxfp4::check`]: whole groups, the lengths, no
    /// scale of 255), then [`Backend::matrix_mxfp4_impl`].
    fn matrix_mxfp4(
        &self,
        blocks: &[u8],
        scales: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<Self::Matrix> {
        mxfp4::check(blocks, scales, out, inp)?;
        self.matrix_mxfp4_impl(blocks, scales, out, inp)
    }
    /// [`Backend::matrix_mxfp4`] of checked bytes. The default dequantises on the host
    /// ([`mxfp4::dequantize`], the CPU reference's values) and calls [`Backend::matrix_impl`]; the
    /// CUDA backend keeps the bytes packed on the device instead (`backend/cuda/mxfp4.rs`) unless
    /// `DRAFTLENS_MXFP4=bf16`.
    fn matrix_mxfp4_impl(
        &self,
        blocks: &[u8],
        scales: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<Self::Matrix> {
        self.matrix_impl(&mxfp4::dequantize(blocks, scales)?, out, inp)
    }
    /// Whether [`Backend::matrix_mxfp4`] keeps the bytes packed on the device (17 bytes per 32
    /// values instead of the dtype's width per value): what the memory estimate counts
    /// (`memory::MemoryModel::with_mxfp4`). False by default.
    fn mxfp4_packed(&self) -> bool {
        false
    }
    /// Device memory free for new allocations, in bytes; `None` when the backend cannot tell
    /// (the CPU: host memory is the operating system's business). The memory checks
    /// (`backend/memory.rs`) use it before any work starts.
    fn free_memory(&self) -> Option<u64> {
        None
    }
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod checks_tests;

/// The shape rule of a packed (varlen) attention: q, k and v fit `shape`, k/v have q's rows,
/// and `seq_starts` packs exactly those rows. One rule for [`Backend::attention_varlen`] and
/// [`Backend::attention_varlen_ext`].
fn check_varlen<B: Backend + ?Sized>(
    be: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    shape: AttnShape,
    seq_starts: &SeqStarts,
) -> Result<()> {
    shape.check(be.dims(q), be.dims(k), be.dims(v))?;
    let (rows, krows) = (be.dims(q).0, be.dims(k).0);
    ensure!(
        rows == krows,
        "attention_varlen: q has {rows} rows, k/v {krows}"
    );
    seq_starts.check_rows("attention_varlen", rows)
}

/// [`Backend::causal_conv1d_silu`] through the host reference ([`gdn::causal_conv1d_silu`]):
/// download, one sequence at a time, upload. Shapes are checked by the caller. The trait's
/// default, and a backend's fallback for shapes its kernels do not take.
pub(crate) fn host_causal_conv1d_silu<B: Backend + ?Sized>(
    be: &B,
    x: &B::Tensor,
    weight: &B::Tensor,
    seq_starts: &SeqStarts,
    states: &mut [&mut B::Tensor],
) -> Result<B::Tensor> {
    let ((rows, c), (_, k)) = (be.dims(x), be.dims(weight));
    let (xh, wh) = (be.to_host(x)?, be.to_host(weight)?);
    let mut out = Vec::with_capacity(rows * c);
    for (w, st) in seq_starts.windows(2).zip(states.iter_mut()) {
        if w[0] == w[1] {
            continue;
        }
        let mut sh = be.to_host(st)?;
        out.extend(gdn::causal_conv1d_silu(
            &xh[w[0] * c..w[1] * c],
            c,
            &wh,
            k,
            &mut sh,
        ));
        **st = be.from_host(&sh, k - 1, c)?;
    }
    be.from_host(&out, rows, c)
}

/// `row_starts` of [`Backend::to_host_rows_split`]: ascending, from 0 to `rows`.
pub(crate) fn check_row_starts(row_starts: &[usize], rows: usize) -> Result<()> {
    ensure!(
        row_starts.len() >= 2
            && row_starts[0] == 0
            && row_starts[row_starts.len() - 1] == rows
            && row_starts.windows(2).all(|w| w[0] <= w[1]),
        "row parts {row_starts:?} do not cover rows 0..{rows} in order"
    );
    Ok(())
}
