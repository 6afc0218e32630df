//! The kernel lab's chunked delta-rule variants (`kernel-lab` feature): the kernels that
//! `cuda_gdn` compares with the defaults and `gdn_bench` times against them, and the process-wide
//! three-phase override of `cuda_bench --only target`. The product never runs any of them
//! (docs/gdn-cuda.md, "Kernel variants"; the lab: docs/cuda.md, "The kernel lab"). `variants.rs`
//! describes the default build's kernels.
//!
//! - `ReferenceFma`, `EngineFma`, `EngineMma`: one fused launch (`gdn_chunk_*`), 32 value
//!   columns per block (four blocks per head, each recomputing the head-wide products); `…V64`:
//!   64 columns, two blocks.
//! - `SplitEngineMma`: `SplitEngineFma` with the walk's products on the tensor cores.
//! - `ThreePhaseReference`, `ThreePhaseEngine`: the three-phase layout with `gdn_prep2_*` (V read
//!   late, in less shared memory) and the FMA-fed products the round-2 kernels replaced (same
//!   bits as `ThreePhaseReferenceRt` and `ThreePhaseEngineLdm` respectively); `…V16`: a 16-column
//!   walk, 8 blocks per head.
//! - `ThreePhaseEngineLdm`: `ThreePhaseEngineTc` with `gdn_hwalk_engine`'s FMA walk (the states
//!   in `SplitEngineFma`'s summation order).

use super::variants::{split_launches, three_phase_launches, ChunkLaunches};
use super::{
    hwalk_smem_bytes, ChunkKernel, HOUT_LDM_SMEM_BYTES, HOUT_SMEM_BYTES, PREP_LDM_SMEM_BYTES,
};
use crate::backend::gdn::GdnProfile;
use std::sync::atomic::{AtomicU8, Ordering};

/// Dynamic shared memory of `gdn_prep2_reference` and `gdn_prep2_engine_mma`: `gdn_prep_*`'s
/// layout with V in K's place once K is read.
pub const PREP2_SMEM_BYTES: usize = (2 * 64 * 129 + 2 * 64 * 65 + 2 * 64) * 4;

/// Dynamic shared memory of a fused `gdn_chunk_*` kernel (`gdn_chunk_impl`) of `columns` value
/// columns per block: K, Q, W, V, Q S, S, L, M, the scores, beta, gam.
const fn fused_smem_bytes(columns: usize) -> usize {
    let ldv = columns + 1;
    (3 * 64 * 129 + 2 * 64 * ldv + 128 * ldv + 3 * 64 * 65 + 2 * 64) * 4
}

/// The numeric profile and launches of a lab variant ([`ChunkKernel::spec`] describes the
/// others).
pub(super) fn spec(kernel: ChunkKernel) -> (GdnProfile, ChunkLaunches) {
    use GdnProfile::{Engine, Reference};
    let fused = |name, columns| ChunkLaunches::Fused {
        kernel: (name, fused_smem_bytes(columns)),
        columns,
    };
    let prep2_reference = ("gdn_prep2_reference", PREP2_SMEM_BYTES);
    let prep2_engine = ("gdn_prep2_engine_mma", PREP2_SMEM_BYTES);
    let hout_reference = ("gdn_hout_reference", HOUT_SMEM_BYTES);
    let hout_engine = ("gdn_hout_engine_mma", HOUT_SMEM_BYTES);
    match kernel {
        ChunkKernel::ReferenceFma => (Reference, fused("gdn_chunk_reference", 32)),
        ChunkKernel::EngineFma => (Engine, fused("gdn_chunk_engine_fma", 32)),
        ChunkKernel::EngineMma => (Engine, fused("gdn_chunk_engine_mma", 32)),
        ChunkKernel::ReferenceFmaV64 => (Reference, fused("gdn_chunk_reference_v64", 64)),
        ChunkKernel::EngineMmaV64 => (Engine, fused("gdn_chunk_engine_mma_v64", 64)),
        ChunkKernel::SplitEngineMma => (
            Engine,
            split_launches("gdn_prep_engine_mma", "gdn_walk_engine_mma"),
        ),
        ChunkKernel::ThreePhaseReference => (
            Reference,
            three_phase_launches(
                prep2_reference,
                ("gdn_hwalk_reference", hwalk_smem_bytes(32)),
                32,
                hout_reference,
            ),
        ),
        ChunkKernel::ThreePhaseEngine => (
            Engine,
            three_phase_launches(
                prep2_engine,
                ("gdn_hwalk_engine", hwalk_smem_bytes(32)),
                32,
                hout_engine,
            ),
        ),
        ChunkKernel::ThreePhaseReferenceV16 => (
            Reference,
            three_phase_launches(
                prep2_reference,
                ("gdn_hwalk_reference_v16", hwalk_smem_bytes(16)),
                16,
                hout_reference,
            ),
        ),
        ChunkKernel::ThreePhaseEngineV16 => (
            Engine,
            three_phase_launches(
                prep2_engine,
                ("gdn_hwalk_engine_v16", hwalk_smem_bytes(16)),
                16,
                hout_engine,
            ),
        ),
        ChunkKernel::ThreePhaseEngineLdm => (
            Engine,
            three_phase_launches(
                ("gdn_prep2_engine_ldm", PREP_LDM_SMEM_BYTES),
                ("gdn_hwalk_engine", hwalk_smem_bytes(32)),
                32,
                ("gdn_hout_engine_ldm", HOUT_LDM_SMEM_BYTES),
            ),
        ),
        ChunkKernel::ThreePhaseReferenceRt
        | ChunkKernel::ThreePhaseEngineTc
        | ChunkKernel::SplitReference
        | ChunkKernel::SplitEngineFma => {
            unreachable!("{kernel:?} is described by ChunkKernel::spec")
        }
    }
}

/// The whole process's override of `THREE_PHASE_DEFAULT` (gdn.rs): 0 = none, 1 = split,
/// 2 = three-phase ([`set_three_phase_override`]).
static THREE_PHASE_OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// For A/B benchmarks of the whole forward (`cuda_bench --only target`): makes
/// [`ChunkKernel::for_profile`] pick the three-phase (`Some(true)`) or split (`Some(false)`)
/// kernels, or the built-in default (`None`). Cache keys follow (`engine_cache_tag`).
pub fn set_three_phase_override(on: Option<bool>) {
    let v = match on {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    THREE_PHASE_OVERRIDE.store(v, Ordering::Relaxed);
}

/// The override in force, if any ([`set_three_phase_override`]).
pub(super) fn three_phase_override() -> Option<bool> {
    match THREE_PHASE_OVERRIDE.load(Ordering::Relaxed) {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    }
}
