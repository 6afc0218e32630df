//! CUDA kernels of the hybrid (Qwen3.5 / Qwen3.6 / Qwen3-Next) layers: the overrides of the
//! [`Backend`] trait's hybrid ops (`causal_conv1d_silu`, `gated_delta_rule`, `gated_rms_norm`,
//! `rms_norm_zero_centred`, `sigmoid_gate_inplace`, the `f32_*` buffer ops) and the device f32
//! buffer that holds the recurrent states.
//!
//! [`Backend`]: crate::backend::Backend
//!
//! Submodules: `conv` (causal conv1d + SiLU), `split` (the split and three-phase chunked delta
//! rule), `phases` (per-launch timing for `gdn_bench --breakdown`).
//!
//! Kernels: `kernels/gdn.cu`. What each computes, in which precision, and how the two numeric
//! profiles of the delta rule differ: docs/gdn-cuda.md. The reference they must agree with is
//! [`crate::backend::gdn`].
//!
//! Shapes the kernels are not written for run the host reference instead (download, compute,
//! upload, like the trait's defaults): delta-rule heads other than `k_dim = v_dim = 128` (every
//! released hybrid checkpoint has 128; the tiny golden models have 16), gated-norm heads that are
//! not 32..256 columns in steps of 32, convs of more than 9 taps.

use super::{blocks, derr, CudaBackend, CudaTensor};
use crate::backend::gdn::{self as reference, check_seq_starts, GdnProfile, GdnShape};
use crate::backend::{Backend, GdnParams};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

mod conv;
pub use conv::ConvKernel;
mod phases;
mod split;
use phases::PhaseClock;
pub use phases::{set_phase_timing, take_phase_times};
use split::SplitDeltaInputs;
pub use split::{
    hwalk_smem_bytes, ChunkPlan, HOUT_COLUMNS, HOUT_LDM_SMEM_BYTES, HOUT_SMEM_BYTES,
    HWALK_TC_SMEM_BYTES,
};

/// Head dims the delta-rule kernels are written for (`GDN_DK`, `GDN_DV` in kernels/gdn.cu).
const HEAD_DIM: usize = 128;
/// Longest conv history the conv-state kernel keeps in registers (`GDN_MAX_HIST`).
const MAX_CONV_HIST: usize = 8;

/// An f32 buffer in device memory: a Gated DeltaNet recurrent state (`[Hv, dk, dv]`) or the
/// layer's f32 parameters (`A_log`, `dt_bias`).
pub struct CudaF32 {
    buf: CudaSlice<f32>,
    len: usize,
}

impl CudaF32 {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Which kernel runs the chunked delta rule: the numeric profile, for the engine profile whether
/// the products use the tensor cores, and how the work is laid out.
///
/// - `ReferenceFma`, `EngineFma`, `EngineMma`: one fused launch, 32 value columns per block (four
///   blocks per head, each recomputing the head-wide products); `…V64`: 64 columns, two blocks.
/// - `Split…`: two launches: every chunk's state-independent work (L, M, W, U, the decayed
///   scores) at once, then the per-sequence walk over the chunks (64 value columns per block).
/// - `ThreePhase…`: the same first launch; then a walk that only carries the state (32 value
///   columns per block, 4 blocks per head; `…V16`: 16 columns, 8 blocks), storing every chunk's
///   start state and V′; then the output of every chunk at once (Engine on the tensor cores).
///
/// [`crate::backend::Backend::gated_delta_rule`] uses [`ChunkKernel::for_profile`]; the others
/// exist so that tests check them against each other and benchmarks compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKernel {
    ReferenceFma,
    EngineFma,
    EngineMma,
    ReferenceFmaV64,
    EngineMmaV64,
    SplitReference,
    SplitEngineFma,
    SplitEngineMma,
    ThreePhaseReference,
    ThreePhaseEngine,
    ThreePhaseReferenceV16,
    ThreePhaseEngineV16,
    /// `ThreePhaseEngine` with its prep and output products on ldmatrix-fed tensor-core fragments
    /// (`gdn_prep2_engine_ldm`, `gdn_hout_engine_ldm`): the same operands and per-tile mma
    /// chains, so the same bits, with a fraction of the shared-memory traffic.
    ThreePhaseEngineLdm,
    /// `ThreePhaseReference` with its prep's products register-tiled on 16-byte shared loads
    /// (`gdn_prep2_reference_rt`): the same fmaf chains, so the same bits.
    ThreePhaseReferenceRt,
    /// `ThreePhaseEngineLdm` with its state walk on the tensor cores too (`gdn_hwalk_engine_tc`):
    /// the same operands and roundings, tensor-core summation order in the walk's two products.
    ThreePhaseEngineTc,
}

/// Whether [`ChunkKernel::for_profile`] picks the three-phase kernels. They passed `cuda_gdn` on
/// the H200 (Reference bit-identical to `SplitReference`; Engine states bit-identical to
/// `SplitEngineFma`) and ran 8.2 / 10.3 ms against the split kernels' 9.6 / 12.1 ms at 4 × 4096
/// tokens, Qwen3.6-27B shapes (docs/benchmarks-cuda.md, "Gated DeltaNet"). The CUDA engine
/// profile's cache keys follow it ([`engine_cache_tag`]), since its tensor-core output phase sums
/// in another order than `SplitEngineFma`.
const THREE_PHASE_DEFAULT: bool = true;

/// Benchmark override of [`THREE_PHASE_DEFAULT`] for the whole process: 0 = none, 1 = split,
/// 2 = three-phase ([`set_three_phase_override`]).
static THREE_PHASE_OVERRIDE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// For A/B benchmarks of the whole forward (`cuda_bench --only target`): makes
/// [`ChunkKernel::for_profile`] pick the three-phase (`Some(true)`) or split (`Some(false)`)
/// kernels, or the built-in default (`None`). Cache keys follow ([`engine_cache_tag`]).
pub fn set_three_phase_override(on: Option<bool>) {
    let v = match on {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    THREE_PHASE_OVERRIDE.store(v, std::sync::atomic::Ordering::Relaxed);
}

fn three_phase_default() -> bool {
    match THREE_PHASE_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => THREE_PHASE_DEFAULT,
    }
}

/// Suffix of the CUDA engine profile's cache keys (crates/engine/src/session): names the default engine
/// kernel's summation order, so cached results of one never pass for the other's.
pub fn engine_cache_tag() -> &'static str {
    match ChunkKernel::for_profile(GdnProfile::Engine) {
        // The walk's products on the tensor cores: another summation order than gdn_hwalk_engine.
        ChunkKernel::ThreePhaseEngineTc => "-3p-tc",
        k if k.three_phase() => "-3p",
        _ => "",
    }
}

impl ChunkKernel {
    pub fn for_profile(p: GdnProfile) -> Self {
        match (p, three_phase_default()) {
            // The split kernels (state-independent work over all chunks at once, then the
            // sequential walk) passed cuda_gdn on the H200 and ran 9.6 ms / 12.1 ms against the
            // fused kernels' 12.3 ms / 16.4 ms at 4 × 4096 tokens, Qwen3.6-27B shapes
            // (docs/benchmarks-cuda.md, "Gated DeltaNet").
            (GdnProfile::Reference, false) => ChunkKernel::SplitReference,
            (GdnProfile::Engine, false) => ChunkKernel::SplitEngineFma,
            // docs/gdn-cuda.md, "Three-phase kernels" and "Round 2": the round-2 variants give
            // the same bits as ThreePhaseReference / ThreePhaseEngine (cuda_gdn, H200) and ran
            // 7.9 / 5.9 ms against their 8.2 / 10.3 ms at 4 × 4096 tokens (docs/benchmarks-cuda.md,
            // "Session 9"). Round 3 moves the engine walk to the tensor cores
            // (ThreePhaseEngineTc: another summation order, so the engine cache tag "-3p-tc").
            (GdnProfile::Reference, true) => ChunkKernel::ThreePhaseReferenceRt,
            (GdnProfile::Engine, true) => ChunkKernel::ThreePhaseEngineTc,
        }
    }
    fn name(self) -> &'static str {
        match self {
            ChunkKernel::ReferenceFma => "gdn_chunk_reference",
            ChunkKernel::EngineFma => "gdn_chunk_engine_fma",
            ChunkKernel::EngineMma => "gdn_chunk_engine_mma",
            ChunkKernel::ReferenceFmaV64 => "gdn_chunk_reference_v64",
            ChunkKernel::EngineMmaV64 => "gdn_chunk_engine_mma_v64",
            ChunkKernel::SplitReference => "gdn_walk_reference",
            ChunkKernel::SplitEngineFma => "gdn_walk_engine_fma",
            ChunkKernel::SplitEngineMma => "gdn_walk_engine_mma",
            ChunkKernel::ThreePhaseReference => "gdn_hwalk_reference",
            ChunkKernel::ThreePhaseEngine => "gdn_hwalk_engine",
            ChunkKernel::ThreePhaseReferenceV16 => "gdn_hwalk_reference_v16",
            ChunkKernel::ThreePhaseEngineV16 => "gdn_hwalk_engine_v16",
            ChunkKernel::ThreePhaseEngineLdm => "gdn_hwalk_engine",
            ChunkKernel::ThreePhaseReferenceRt => "gdn_hwalk_reference",
            ChunkKernel::ThreePhaseEngineTc => "gdn_hwalk_engine_tc",
        }
    }
    /// The state-independent first launch of a split kernel.
    fn prep_name(self) -> Option<&'static str> {
        match self {
            ChunkKernel::SplitReference => Some("gdn_prep_reference"),
            ChunkKernel::SplitEngineFma | ChunkKernel::SplitEngineMma => {
                Some("gdn_prep_engine_mma")
            }
            // The same arithmetic with V read late, in less shared memory (two blocks per SM).
            ChunkKernel::ThreePhaseReference | ChunkKernel::ThreePhaseReferenceV16 => {
                Some("gdn_prep2_reference")
            }
            ChunkKernel::ThreePhaseEngine | ChunkKernel::ThreePhaseEngineV16 => {
                Some("gdn_prep2_engine_mma")
            }
            ChunkKernel::ThreePhaseEngineLdm | ChunkKernel::ThreePhaseEngineTc => {
                Some("gdn_prep2_engine_ldm")
            }
            ChunkKernel::ThreePhaseReferenceRt => Some("gdn_prep2_reference_rt"),
            _ => None,
        }
    }
    /// The state walk, its value columns per block, and the output launch of a three-phase kernel.
    fn three_phase_launches(self) -> Option<(&'static str, usize, &'static str)> {
        let output = match self {
            ChunkKernel::ThreePhaseEngineLdm | ChunkKernel::ThreePhaseEngineTc => {
                "gdn_hout_engine_ldm"
            }
            _ if self.engine() => "gdn_hout_engine_mma",
            _ => "gdn_hout_reference",
        };
        match self {
            ChunkKernel::ThreePhaseReference
            | ChunkKernel::ThreePhaseEngine
            | ChunkKernel::ThreePhaseEngineLdm
            | ChunkKernel::ThreePhaseEngineTc
            | ChunkKernel::ThreePhaseReferenceRt => Some((self.name(), 32, output)),
            ChunkKernel::ThreePhaseReferenceV16 | ChunkKernel::ThreePhaseEngineV16 => {
                Some((self.name(), 16, output))
            }
            _ => None,
        }
    }
    fn three_phase(self) -> bool {
        self.three_phase_launches().is_some()
    }
    pub fn engine(self) -> bool {
        !matches!(
            self,
            ChunkKernel::ReferenceFma
                | ChunkKernel::ReferenceFmaV64
                | ChunkKernel::SplitReference
                | ChunkKernel::ThreePhaseReference
                | ChunkKernel::ThreePhaseReferenceV16
                | ChunkKernel::ThreePhaseReferenceRt
        )
    }
    /// Value columns per block (`DVS` in kernels/gdn.cu) of the fused and split kernels (the
    /// three-phase kernels' are in [`ChunkKernel::three_phase_launches`] and [`HOUT_COLUMNS`]).
    fn dv_slice(self) -> usize {
        match self {
            ChunkKernel::ReferenceFma | ChunkKernel::EngineFma | ChunkKernel::EngineMma => 32,
            _ => 64,
        }
    }
    /// Dynamic shared memory (bytes) of the fused or walk kernel, as kernels/gdn.cu lays it out.
    fn smem_bytes(self) -> usize {
        let ldv = self.dv_slice() + 1;
        let floats = if self.prep_name().is_some() {
            // gdn_walk_impl: K, Q, W, the scores, U, V', Q S, S, gam.
            3 * 64 * 129 + 64 * 65 + 3 * 64 * ldv + 128 * ldv + 64
        } else {
            // gdn_chunk_impl: K, Q, W, V, Q S, S, L, M, the scores, beta, gam.
            3 * 64 * 129 + 2 * 64 * ldv + 128 * ldv + 3 * 64 * 65 + 2 * 64
        };
        floats * 4
    }
}

/// Dynamic shared memory of `gdn_prep_*`: K, Q, V, L, M, beta, gam.
const PREP_SMEM_BYTES: usize = (3 * 64 * 129 + 2 * 64 * 65 + 2 * 64) * 4;
/// Dynamic shared memory of `gdn_prep2_*`: V takes K's place once K is read.
pub const PREP2_SMEM_BYTES: usize = (2 * 64 * 129 + 2 * 64 * 65 + 2 * 64) * 4;
/// Dynamic shared memory of `gdn_prep2_engine_ldm`: three bf16 tiles of 64 × 136 (Q then
/// K diag(βe^γ), K, V), L and M f32 (64 × 65), M bf16 (64 × 72), β, γ.
pub const PREP_LDM_SMEM_BYTES: usize =
    3 * 64 * 136 * 2 + 2 * 64 * 65 * 4 + 64 * 72 * 2 + 2 * 64 * 4;
/// Dynamic shared memory of `gdn_prep2_reference_rt`: K then diag(β) V and Q then K diag(βe^γ)
/// (64 × 132 f32 each), L and M (64 × 68 f32 each), β, γ.
pub const PREP_RT_SMEM_BYTES: usize = (2 * 64 * 132 + 2 * 64 * 68 + 2 * 64) * 4;
/// Chunk length of the chunked kernels (`GDN_C`).
const CHUNK: usize = 64;

/// (start, end) row pairs of the selected sequences, as the kernels read them.
fn row_pairs(seq_starts: &[usize], which: &[usize]) -> Vec<i64> {
    which
        .iter()
        .flat_map(|&i| [seq_starts[i] as i64, seq_starts[i + 1] as i64])
        .collect()
}

/// Largest group of `rms_norm_zero_centred` that one warp normalises (`gdn_rms_norm_zc_heads`).
const ZC_WARP_GROUP: usize = 256;

impl CudaBackend {
    pub(super) fn gdn_f32_from_host(&self, data: &[f32]) -> Result<CudaF32> {
        Ok(CudaF32 {
            buf: self.upload(data)?,
            len: data.len(),
        })
    }

    pub(super) fn gdn_f32_to_host(&self, b: &CudaF32) -> Result<Vec<f32>> {
        let mut out = vec![0f32; b.len];
        if b.len > 0 {
            self.stream
                .memcpy_dtoh(&b.buf.slice(0..b.len), &mut out)
                .map_err(derr("device-to-host copy"))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// [`crate::backend::Backend::f32_copy`]: a device-to-device copy (state snapshots before a verify forward).
    pub(super) fn gdn_f32_copy(&self, b: &CudaF32) -> Result<CudaF32> {
        let mut buf = self.alloc::<f32>(b.len)?;
        if b.len > 0 {
            self.stream
                .memcpy_dtod(&b.buf.slice(0..b.len), &mut buf.slice_mut(0..b.len))
                .map_err(derr("device copy"))?;
        }
        Ok(CudaF32 { buf, len: b.len })
    }

    /// [`crate::backend::Backend::rms_norm_zero_centred`]: f32 statistic and `1 + w`; groups of at
    /// most 256 columns one warp each (`gdn_rms_norm_zc_heads`), larger ones one block each
    /// (`gdn_rms_norm_zc`), the same sums in the same order.
    pub(super) fn gdn_rms_norm_zc(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        self.rms_norm_zero_centred_with(x, w, eps, group, group <= ZC_WARP_GROUP)
    }

    /// [`CudaBackend::gdn_rms_norm_zc`] with the kernel chosen: `per_warp` (groups of at most
    /// 256 columns) or one block per group (any size). Public for the test that holds the two to
    /// the same bits.
    pub fn rms_norm_zero_centred_with(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
        group: usize,
        per_warp: bool,
    ) -> Result<CudaTensor> {
        ensure!(
            group > 0 && x.cols.is_multiple_of(group) && w.rows * w.cols == group,
            "rms_norm_zero_centred: {} columns, group {group}, weight of {} values",
            x.cols,
            w.rows * w.cols
        );
        let mut y = self.new_tensor(x.rows, x.cols)?;
        let groups = (x.rows * x.cols / group) as i64;
        if groups == 0 {
            return Ok(y);
        }
        ensure!(
            groups < i32::MAX as i64,
            "rms_norm_zero_centred: too many rows"
        );
        ensure!(
            !per_warp || group <= ZC_WARP_GROUP,
            "rms_norm_zero_centred: the per-warp kernel takes groups of at most {ZC_WARP_GROUP} columns, not {group}"
        );
        let name = if per_warp {
            "gdn_rms_norm_zc_heads"
        } else {
            "gdn_rms_norm_zc"
        };
        let f = self.kernels.get("gdn", name)?;
        let g32 = group as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.buf)
            .arg(&w.buf)
            .arg(&mut y.buf)
            .arg(&groups)
            .arg(&g32)
            .arg(&eps);
        let grid = if per_warp {
            blocks(groups as usize * 32, 256)
        } else {
            groups as u32
        };
        // SAFETY: (const bf16*, const bf16*, bf16*, ll, int, float) for both kernels; x and y
        // hold groups·group values; one warp (≤ 256 columns) or one block per group.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr(name))?;
        Ok(y)
    }

    /// [`crate::backend::Backend::gated_rms_norm`]: one warp per (row, head); heads of 32..256 columns.
    pub(super) fn gdn_gated_rms_norm(
        &self,
        x: &CudaTensor,
        z: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
        group: usize,
    ) -> Result<CudaTensor> {
        ensure!(
            (z.rows, z.cols) == (x.rows, x.cols),
            "gated_rms_norm: x is [{}, {}], z is [{}, {}]",
            x.rows,
            x.cols,
            z.rows,
            z.cols
        );
        ensure!(
            group > 0 && x.cols.is_multiple_of(group) && w.rows * w.cols == group,
            "gated_rms_norm: {} columns, group {group}, weight of {} values",
            x.cols,
            w.rows * w.cols
        );
        if !(group.is_multiple_of(32) && group <= 256) {
            // Not a shape of the kernel: the host reference.
            let (xh, zh, wh) = (self.to_host(x)?, self.to_host(z)?, self.to_host(w)?);
            let y = reference::gated_rms_norm(&xh, &zh, &wh, eps, group);
            return self.from_host(&y, x.rows, x.cols);
        }
        let mut y = self.new_tensor(x.rows, x.cols)?;
        let warps = x.rows * (x.cols / group);
        if warps == 0 {
            return Ok(y);
        }
        let f = self.kernels.get("gdn", "gdn_gated_rms_norm")?;
        let (rows, cols, hd) = (x.rows as i64, x.cols as i32, group as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.buf)
            .arg(&z.buf)
            .arg(&w.buf)
            .arg(&mut y.buf)
            .arg(&rows)
            .arg(&cols)
            .arg(&hd)
            .arg(&eps);
        // SAFETY: (const bf16* x, const bf16* z, const bf16* w, bf16* y, ll, int, int, float).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks(warps * 32, 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr("gdn_gated_rms_norm"))?;
        Ok(y)
    }

    /// [`crate::backend::Backend::sigmoid_gate_inplace`].
    pub(super) fn gdn_sigmoid_gate(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<()> {
        ensure!(
            (gate.rows, gate.cols) == (x.rows, x.cols),
            "sigmoid_gate: x is [{}, {}], gate is [{}, {}]",
            x.rows,
            x.cols,
            gate.rows,
            gate.cols
        );
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        // Whole 16-byte groups of 8 values (every hybrid's heads): 8 per thread, same arithmetic.
        let v8 = n.is_multiple_of(8);
        let name = if v8 {
            "gdn_sigmoid_gate_v8"
        } else {
            "gdn_sigmoid_gate"
        };
        let f = self.kernels.get("gdn", name)?;
        let items = if v8 { n / 8 } else { n };
        let n64 = items as i64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut x.buf).arg(&gate.buf).arg(&n64);
        // SAFETY: (bf16*, const bf16*, ll); both hold n values, `items` = n (or n / 8 groups of 8
        // values for the 16-byte kernel; device allocations are 16-byte aligned).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks(items, 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(derr(name))?;
        Ok(())
    }

    /// [`crate::backend::Backend::gated_delta_rule`] with an explicit chunked kernel (tests and benchmarks pick
    /// the engine profile's FMA or tensor-core variant; the trait method picks by profile).
    /// Sequences of one row run the recurrent kernel, longer ones the chunked kernel.
    pub fn gated_delta_rule_with(
        &self,
        (qkv, a, b): (&CudaTensor, &CudaTensor, &CudaTensor),
        params: &GdnParams<'_, Self>,
        seq_starts: &[usize],
        states: &mut [&mut CudaF32],
        kernel: ChunkKernel,
    ) -> Result<CudaTensor> {
        let shape: GdnShape = params.shape;
        shape.check()?;
        let hv = shape.v_heads;
        let (rows, cd) = (qkv.rows, qkv.cols);
        ensure!(
            cd == shape.conv_dim(),
            "gated_delta_rule: qkv has {cd} columns, expected {}",
            shape.conv_dim()
        );
        ensure!(
            (a.rows, a.cols) == (rows, hv) && (b.rows, b.cols) == (rows, hv),
            "gated_delta_rule: a is [{}, {}], b is [{}, {}], expected [{rows}, {hv}]",
            a.rows,
            a.cols,
            b.rows,
            b.cols
        );
        ensure!(
            params.a_log.len == hv && params.dt_bias.len == hv,
            "gated_delta_rule: A_log has {} values, dt_bias {}, expected {hv}",
            params.a_log.len,
            params.dt_bias.len
        );
        check_seq_starts("gated_delta_rule", seq_starts, rows, states.len())?;
        for st in states.iter() {
            ensure!(
                st.len == shape.state_len(),
                "gated_delta_rule: state has {} values, expected {}",
                st.len,
                shape.state_len()
            );
        }
        if shape.k_dim != HEAD_DIM || shape.v_dim != HEAD_DIM {
            return self.host_delta_rule(qkv, a, b, params, seq_starts, states);
        }
        let mut out = self.new_tensor(rows, shape.value_dim())?;
        if rows == 0 {
            return Ok(out);
        }
        let mut clock = PhaseClock::start(self)?;
        // Gates, f32 [T, Hv].
        let mut g = self.alloc::<f32>(rows * hv)?;
        let mut beta = self.alloc::<f32>(rows * hv)?;
        {
            let f = self.kernels.get("gdn", "gdn_gates")?;
            let (ld, rows64, hv32) = (hv as i64, rows as i64, hv as i32);
            let round_beta = kernel.engine() as i32;
            let mut lb = self.stream.launch_builder(&f);
            lb.arg(&a.buf)
                .arg(&ld)
                .arg(&b.buf)
                .arg(&ld)
                .arg(&params.a_log.buf)
                .arg(&params.dt_bias.buf)
                .arg(&mut g)
                .arg(&mut beta)
                .arg(&rows64)
                .arg(&hv32)
                .arg(&round_beta);
            // SAFETY: (const bf16*, ll, const bf16*, ll, const float*, const float*, float*, float*,
            // ll, int, int); a, b, g, beta hold rows·hv values, A_log and dt_bias hv.
            unsafe {
                lb.launch(LaunchConfig {
                    grid_dim: (blocks(rows * hv, 256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(derr("gdn_gates"))?;
        }
        clock.mark(self, "gates")?;
        let (single, multi): (Vec<usize>, Vec<usize>) = (0..states.len())
            .filter(|&i| seq_starts[i + 1] > seq_starts[i])
            .partition(|&i| seq_starts[i + 1] - seq_starts[i] == 1);
        let base = self.ptr(&qkv.buf);
        let (q, k, v) = (
            base,
            base + 2 * shape.key_dim() as u64,
            base + 4 * shape.key_dim() as u64,
        );
        let (ld, hv32, ratio) = (cd as i64, hv as i32, shape.group() as i32);
        let scale = (shape.k_dim as f32).powf(-0.5);
        for (which, chunked) in [(single, false), (multi, true)] {
            if which.is_empty() {
                continue;
            }
            ensure!(
                which.len() <= 65535,
                "gated_delta_rule: {} sequences in one call (at most 65535)",
                which.len()
            );
            let pairs = self.upload(&row_pairs(seq_starts, &which))?;
            let ptrs: Vec<u64> = which.iter().map(|&i| self.ptr(&states[i].buf)).collect();
            let ptrs = self.upload(&ptrs)?;
            if chunked && kernel.prep_name().is_some() {
                let inputs = SplitDeltaInputs {
                    qkv: (q, k, v),
                    ld,
                    gates: (&g, &beta),
                    seq_starts,
                    which: &which,
                    per_seq: (&pairs, &ptrs),
                    shape,
                };
                self.split_delta_rule(kernel, &inputs, &mut out, &mut clock)?;
                continue;
            }
            let (f, cfg) = if chunked {
                (
                    self.kernels
                        .get_with_smem("gdn", kernel.name(), kernel.smem_bytes())?,
                    LaunchConfig {
                        grid_dim: (
                            (HEAD_DIM / kernel.dv_slice()) as u32,
                            hv as u32,
                            which.len() as u32,
                        ),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: kernel.smem_bytes() as u32,
                    },
                )
            } else {
                (
                    self.kernels.get("gdn", "gdn_recurrent")?,
                    LaunchConfig {
                        grid_dim: (hv as u32, which.len() as u32, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    },
                )
            };
            let mut lb = self.stream.launch_builder(&f);
            lb.arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&ld)
                .arg(&ld)
                .arg(&g)
                .arg(&beta)
                .arg(&pairs)
                .arg(&mut out.buf)
                .arg(&ptrs)
                .arg(&hv32)
                .arg(&ratio)
                .arg(&scale);
            // SAFETY: (const bf16* q, k, v, ll, ll, const float* g, beta, const ll* rows,
            // bf16* out, const u64* states, int, int, float); q/k/v address columns of qkv
            // ([rows, conv_dim], checked), every state holds Hv·128·128 f32 (checked), out holds
            // rows·Hv·128; the row pairs lie inside 0..rows (check_seq_starts).
            unsafe { lb.launch(cfg) }.map_err(derr(if chunked {
                kernel.name()
            } else {
                "gdn_recurrent"
            }))?;
            clock.mark(self, if chunked { "chunk" } else { "recurrent" })?;
        }
        Ok(out)
    }
}

impl CudaBackend {
    /// The delta rule through the host reference (shapes checked by the caller): the trait's
    /// default, for head dims the kernels are not written for.
    fn host_delta_rule(
        &self,
        qkv: &CudaTensor,
        a: &CudaTensor,
        b: &CudaTensor,
        params: &GdnParams<'_, Self>,
        seq_starts: &[usize],
        states: &mut [&mut CudaF32],
    ) -> Result<CudaTensor> {
        let shape = params.shape;
        let (rows, cd, hv) = (qkv.rows, qkv.cols, shape.v_heads);
        let (a_log, dt_bias) = (
            self.gdn_f32_to_host(params.a_log)?,
            self.gdn_f32_to_host(params.dt_bias)?,
        );
        let (xh, ah, bh) = (self.to_host(qkv)?, self.to_host(a)?, self.to_host(b)?);
        let mut out = Vec::with_capacity(rows * shape.value_dim());
        for (w, st) in seq_starts.windows(2).zip(states.iter_mut()) {
            if w[0] == w[1] {
                continue;
            }
            let mut sh = self.gdn_f32_to_host(st)?;
            out.extend(reference::gated_delta_rule_seq(
                (
                    &xh[w[0] * cd..w[1] * cd],
                    &ah[w[0] * hv..w[1] * hv],
                    &bh[w[0] * hv..w[1] * hv],
                ),
                reference::GdnLayerHost {
                    a_log: &a_log,
                    dt_bias: &dt_bias,
                    shape,
                    profile: params.profile,
                },
                &mut sh,
            ));
            **st = self.gdn_f32_from_host(&sh)?;
        }
        self.from_host(&out, rows, shape.value_dim())
    }
}

/// `Backend::gated_delta_rule` of the CUDA backend (the trait method forwards here).
pub(super) fn gated_delta_rule(
    be: &CudaBackend,
    qkv: &CudaTensor,
    a: &CudaTensor,
    b: &CudaTensor,
    params: &GdnParams<'_, CudaBackend>,
    seq_starts: &[usize],
    states: &mut [&mut CudaF32],
) -> Result<CudaTensor> {
    let kernel = ChunkKernel::for_profile(params.profile);
    be.gated_delta_rule_with((qkv, a, b), params, seq_starts, states, kernel)
}

/// Kernel names of `kernels/gdn.cu`, for [`CudaBackend::kernel_report`]-style diagnostics.
pub const KERNELS: &[&str] = &[
    "gdn_chunk_reference",
    "gdn_chunk_engine_fma",
    "gdn_chunk_engine_mma",
    "gdn_chunk_reference_v64",
    "gdn_chunk_engine_mma_v64",
    "gdn_prep_reference",
    "gdn_prep_engine_mma",
    "gdn_prep2_reference",
    "gdn_prep2_engine_mma",
    "gdn_walk_reference",
    "gdn_walk_engine_fma",
    "gdn_walk_engine_mma",
    "gdn_hwalk_reference",
    "gdn_hwalk_engine",
    "gdn_hwalk_reference_v16",
    "gdn_hwalk_engine_v16",
    "gdn_hout_reference",
    "gdn_hout_engine_mma",
    "gdn_prep2_engine_ldm",
    "gdn_prep2_reference_rt",
    "gdn_hout_engine_ldm",
    "gdn_hwalk_engine_tc",
    "gdn_recurrent",
    "gdn_conv_silu",
    "gdn_conv_silu_v8",
    "gdn_conv_silu_rows4",
    "gdn_conv_state",
    "gdn_gates",
    "gdn_gated_rms_norm",
    "gdn_rms_norm_zc",
    "gdn_sigmoid_gate",
];

impl CudaBackend {
    /// Registers / spills / static shared memory of every `kernels/gdn.cu` kernel.
    pub fn gdn_kernel_report(&self) -> Result<Vec<String>> {
        KERNELS
            .iter()
            .map(|f| self.kernels.resources("gdn", f))
            .collect()
    }
}
