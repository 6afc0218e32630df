//! CUDA kernels of the hybrid (Qwen3.5 / Qwen3.6 / Qwen3-Next) layers: the overrides of the
//! [`Backend`] trait's hybrid ops (`causal_conv1d_silu`, `gated_delta_rule`, `gated_rms_norm`,
//! `rms_norm_zero_centred`, `sigmoid_gate_inplace`, the `f32_*` buffer ops) and the device f32
//! buffer that holds the recurrent states.
//!
//! [`Backend`]: crate::backend::Backend
//!
//! Submodules: `conv` (causal conv1d + SiLU), `variants` (which kernel runs the chunked delta
//! rule, and its launches), `split` (the split and three-phase chunked delta rule); with the
//! `kernel-lab` feature also `lab` (the chunked-kernel variants beyond the
//! defaults and their references, the three-phase override of benchmarks) and `phases`
//! (per-launch timing for `gdn_bench --breakdown`).
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
use crate::backend::gdn::{self as reference, GdnShape};
use crate::backend::{Backend, GdnParams, SeqStarts};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

mod conv;
pub use conv::ConvKernel;
#[cfg(feature = "kernel-lab")]
mod lab;
#[cfg(feature = "kernel-lab")]
pub use lab::{set_three_phase_override, PREP2_SMEM_BYTES};
#[cfg(feature = "kernel-lab")]
mod phases;
#[cfg(feature = "kernel-lab")]
use phases::PhaseClock;
#[cfg(feature = "kernel-lab")]
pub use phases::{set_phase_timing, take_phase_times};
mod split;
pub use split::{
    hwalk_smem_bytes, ChunkPlan, HOUT_COLUMNS, HOUT_LDM_SMEM_BYTES, HOUT_SMEM_BYTES,
    HWALK_TC_SMEM_BYTES,
};
mod variants;
pub use variants::{engine_cache_tag, ChunkKernel, PREP_LDM_SMEM_BYTES, PREP_RT_SMEM_BYTES};
use variants::{ChunkLaunches, Launch, Walk, SPLIT_COLUMNS};

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

/// Chunk length of the chunked kernels (`GDN_C`).
const CHUNK: usize = 64;

/// (start, end) row pairs of the selected sequences, as the kernels read them.
fn row_pairs(seq_starts: &SeqStarts, which: &[usize]) -> Vec<i64> {
    which
        .iter()
        .flat_map(|&i| [seq_starts[i] as i64, seq_starts[i + 1] as i64])
        .collect()
}

/// Without the kernel lab the delta rule's phase marks (`gdn/phases.rs`) cost nothing.
#[cfg(not(feature = "kernel-lab"))]
struct PhaseClock;

#[cfg(not(feature = "kernel-lab"))]
impl PhaseClock {
    fn start(_: &CudaBackend) -> Result<Self> {
        Ok(PhaseClock)
    }
    fn mark(&mut self, _: &CudaBackend, _: &'static str) -> Result<()> {
        Ok(())
    }
}

/// What the delta-rule launches read for one group of sequences (the one-row sequences, or the
/// longer ones).
struct DeltaInputs<'a> {
    /// Device addresses of the q, k and v columns of `qkv`, and its row stride `ld` (elements).
    qkv: (u64, u64, u64),
    ld: i64,
    /// The gates g and β, f32 `[T, Hv]`.
    gates: (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    /// Row boundaries of every sequence of the call, and the sequences this group covers.
    seq_starts: &'a SeqStarts,
    which: &'a [usize],
    /// The uploaded (start, end) row pairs and state pointers of `which`.
    per_seq: (&'a CudaSlice<i64>, &'a CudaSlice<u64>),
    shape: GdnShape,
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
        let mut b = self.launch_builder(&f);
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
        let mut b = self.launch_builder(&f);
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
        let mut b = self.launch_builder(&f);
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

    /// [`crate::backend::Backend::gated_delta_rule`] with an explicit chunked kernel (tests check
    /// the defaults against their split references, and benchmarks time the variants; the trait
    /// method picks by profile, [`ChunkKernel::for_profile`]). Sequences of one row run the
    /// recurrent kernel, longer ones the chunked kernel.
    pub fn gated_delta_rule_with(
        &self,
        (qkv, a, b): (&CudaTensor, &CudaTensor, &CudaTensor),
        params: &GdnParams<'_, Self>,
        seq_starts: &SeqStarts,
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
        seq_starts.check_rows_and_states("gated_delta_rule", rows, states.len())?;
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
            let mut lb = self.launch_builder(&f);
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
        let ld = cd as i64;
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
            let inputs = DeltaInputs {
                qkv: (q, k, v),
                ld,
                gates: (&g, &beta),
                seq_starts,
                which: &which,
                per_seq: (&pairs, &ptrs),
                shape,
            };
            if !chunked {
                let f = self.kernels.get("gdn", "gdn_recurrent")?;
                let grid = (hv as u32, which.len() as u32, 1);
                self.launch_per_sequence(&f, ("gdn_recurrent", 0), grid, &inputs, &mut out)?;
                clock.mark(self, "recurrent")?;
                continue;
            }
            match kernel.spec().1 {
                #[cfg(feature = "kernel-lab")]
                ChunkLaunches::Fused { kernel, columns } => {
                    let f = self.kernels.get_with_smem("gdn", kernel.0, kernel.1)?;
                    let grid = ((HEAD_DIM / columns) as u32, hv as u32, which.len() as u32);
                    self.launch_per_sequence(&f, kernel, grid, &inputs, &mut out)?;
                    clock.mark(self, "chunk")?;
                }
                ChunkLaunches::Prepped { prep, walk } => {
                    let engine = kernel.engine();
                    self.split_delta_rule(prep, walk, engine, &inputs, &mut out, &mut clock)?
                }
            }
        }
        Ok(out)
    }
}

impl CudaBackend {
    /// One launch of a kernel that walks each sequence of `inputs` and writes its output
    /// (`gdn_recurrent`, the fused `gdn_chunk_*`): `launch` is its (name, dynamic shared memory),
    /// `grid` its blocks; 256 threads per block.
    fn launch_per_sequence(
        &self,
        f: &CudaFunction,
        launch: Launch,
        grid: (u32, u32, u32),
        inputs: &DeltaInputs<'_>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let &DeltaInputs {
            qkv: (q, k, v),
            ld,
            gates: (g, beta),
            per_seq: (pairs, ptrs),
            shape,
            ..
        } = inputs;
        let (hv32, ratio) = (shape.v_heads as i32, shape.group() as i32);
        let scale = (shape.k_dim as f32).powf(-0.5);
        let mut lb = self.launch_builder(f);
        lb.arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&ld)
            .arg(&ld)
            .arg(g)
            .arg(beta)
            .arg(pairs)
            .arg(&mut out.buf)
            .arg(ptrs)
            .arg(&hv32)
            .arg(&ratio)
            .arg(&scale);
        // SAFETY: (const bf16* q, k, v, ll, ll, const float* g, beta, const ll* rows,
        // bf16* out, const u64* states, int, int, float); q/k/v address columns of qkv
        // ([rows, conv_dim], checked), every state holds Hv·128·128 f32 (checked), out holds
        // rows·Hv·128; the row pairs lie inside 0..rows (SeqStarts::check_rows).
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: grid,
                block_dim: (256, 1, 1),
                shared_mem_bytes: launch.1 as u32,
            })
        }
        .map_err(derr(launch.0))?;
        Ok(())
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
        seq_starts: &SeqStarts,
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
    seq_starts: &SeqStarts,
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
