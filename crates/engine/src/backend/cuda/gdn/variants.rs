//! Which kernel runs the chunked delta rule, and what it launches: [`ChunkKernel`] (the defaults
//! of the two numeric profiles and their split references; the kernel lab's variants are
//! described in `lab.rs`), each kernel's launches with the dynamic shared memory
//! kernels/gdn.cu lays out for them, and the engine profile's cache tag.

use super::{hwalk_smem_bytes, HOUT_LDM_SMEM_BYTES, HOUT_SMEM_BYTES, HWALK_TC_SMEM_BYTES};
use crate::backend::gdn::GdnProfile;

/// Which kernel runs the chunked delta rule (sequences of more than one row): the numeric
/// profile and how the work is laid out (docs/gdn-cuda.md, "Kernel variants").
///
/// - `ThreePhase…`, the defaults ([`ChunkKernel::for_profile`]): every chunk's state-independent
///   work (L, M, W, U, the decayed scores) in one launch; then a walk that only carries the
///   state (32 value columns per block, 4 blocks per head), storing every chunk's start state and
///   V′; then the output of every chunk at once.
/// - `Split…`, one reference per profile: the same first launch, then one walk per sequence that
///   also writes the output (64 value columns per block). Their products have the operands,
///   roundings and summation order of the three-phase kernels' (up to the engine output phase's
///   tensor-core order), so `cuda_gdn` checks the defaults against them as well as against the
///   CPU.
///
/// With the `kernel-lab` feature, the variants that tests compare and benchmarks time
/// (`gdn/lab.rs`): the fused one-launch kernels and the other split and three-phase kernels.
/// [`crate::backend::Backend::gated_delta_rule`] uses [`ChunkKernel::for_profile`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKernel {
    /// The reference profile's default: `gdn_prep2_reference_rt` (the prep's products
    /// register-tiled on 16-byte shared loads), `gdn_hwalk_reference`, `gdn_hout_reference`.
    ThreePhaseReferenceRt,
    /// The engine profile's default: `gdn_prep2_engine_ldm` and `gdn_hout_engine_ldm` (products on
    /// ldmatrix-fed tensor-core fragments) around `gdn_hwalk_engine_tc` (the state walk on the
    /// tensor cores too).
    ThreePhaseEngineTc,
    /// The reference profile's split kernels: `gdn_prep_reference`, `gdn_walk_reference`.
    SplitReference,
    /// The engine profile's split kernels: `gdn_prep_engine_mma`, `gdn_walk_engine_fma` (the walk's
    /// products as f32 FMA on the bf16 operands).
    SplitEngineFma,
    #[cfg(feature = "kernel-lab")]
    ReferenceFma,
    #[cfg(feature = "kernel-lab")]
    EngineFma,
    #[cfg(feature = "kernel-lab")]
    EngineMma,
    #[cfg(feature = "kernel-lab")]
    ReferenceFmaV64,
    #[cfg(feature = "kernel-lab")]
    EngineMmaV64,
    #[cfg(feature = "kernel-lab")]
    SplitEngineMma,
    #[cfg(feature = "kernel-lab")]
    ThreePhaseReference,
    #[cfg(feature = "kernel-lab")]
    ThreePhaseEngine,
    #[cfg(feature = "kernel-lab")]
    ThreePhaseReferenceV16,
    #[cfg(feature = "kernel-lab")]
    ThreePhaseEngineV16,
    #[cfg(feature = "kernel-lab")]
    ThreePhaseEngineLdm,
}

/// Whether [`ChunkKernel::for_profile`] picks the three-phase kernels rather than the split ones:
/// the same bits in the reference profile, the same states in the engine profile, and faster on
/// the H200 (docs/gdn-cuda.md, "Kernel variants"; docs/benchmarks-cuda.md, "Gated DeltaNet").
/// The CUDA engine profile's cache keys follow it ([`engine_cache_tag`]), since its tensor-core
/// output phase sums in another order than `SplitEngineFma`. The kernel lab can override it for
/// a whole process (`set_three_phase_override`, for A/B benchmarks of the whole forward).
const THREE_PHASE_DEFAULT: bool = true;

fn three_phase_default() -> bool {
    #[cfg(feature = "kernel-lab")]
    if let Some(on) = super::lab::three_phase_override() {
        return on;
    }
    THREE_PHASE_DEFAULT
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

/// (Kernel name in kernels/gdn.cu, dynamic shared memory in bytes) of one launch.
pub(super) type Launch = (&'static str, usize);

/// The launches of a [`ChunkKernel`], with the shared memory kernels/gdn.cu lays out for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChunkLaunches {
    /// One launch: each block walks its sequence's chunks over `columns` value columns and writes
    /// the output (`gdn_chunk_*`).
    #[cfg(feature = "kernel-lab")]
    Fused { kernel: Launch, columns: usize },
    /// `prep` (every chunk's state-independent work at once, grid chunks × value heads), then the
    /// walk.
    Prepped { prep: Launch, walk: Walk },
}

/// What follows the prep of a split or three-phase kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Walk {
    /// Split: a walk per sequence over [`SPLIT_COLUMNS`] value columns per block that also writes
    /// the output.
    WithOutput(Launch),
    /// Three-phase: a walk that only carries the state over `columns` value columns per block,
    /// storing every chunk's start state and V′, then `output` for every chunk at once.
    StateOnly {
        walk: Launch,
        columns: usize,
        output: Launch,
    },
}

impl ChunkKernel {
    pub fn for_profile(p: GdnProfile) -> Self {
        match (p, three_phase_default()) {
            // The split kernels: the defaults before the three-phase ones (docs/gdn-cuda.md,
            // "Kernel variants").
            (GdnProfile::Reference, false) => ChunkKernel::SplitReference,
            (GdnProfile::Engine, false) => ChunkKernel::SplitEngineFma,
            // docs/gdn-cuda.md, "Three-phase kernels", "Round 2" and "Round 3": the round-2 prep
            // and output give the same bits as the kernels they replace (cuda_gdn, H200); round 3
            // moves the engine walk to the tensor cores (another summation order, so the engine
            // cache tag "-3p-tc"). Timings: docs/benchmarks-cuda.md, "Session 9" and "Session 10".
            (GdnProfile::Reference, true) => ChunkKernel::ThreePhaseReferenceRt,
            (GdnProfile::Engine, true) => ChunkKernel::ThreePhaseEngineTc,
        }
    }

    /// The kernel's numeric profile and launches.
    pub(super) fn spec(self) -> (GdnProfile, ChunkLaunches) {
        match self {
            ChunkKernel::ThreePhaseReferenceRt => (
                GdnProfile::Reference,
                three_phase_launches(
                    ("gdn_prep2_reference_rt", PREP_RT_SMEM_BYTES),
                    ("gdn_hwalk_reference", hwalk_smem_bytes(32)),
                    32,
                    ("gdn_hout_reference", HOUT_SMEM_BYTES),
                ),
            ),
            ChunkKernel::ThreePhaseEngineTc => (
                GdnProfile::Engine,
                three_phase_launches(
                    ("gdn_prep2_engine_ldm", PREP_LDM_SMEM_BYTES),
                    ("gdn_hwalk_engine_tc", HWALK_TC_SMEM_BYTES),
                    32,
                    ("gdn_hout_engine_ldm", HOUT_LDM_SMEM_BYTES),
                ),
            ),
            ChunkKernel::SplitReference => (
                GdnProfile::Reference,
                split_launches("gdn_prep_reference", "gdn_walk_reference"),
            ),
            ChunkKernel::SplitEngineFma => (
                GdnProfile::Engine,
                split_launches("gdn_prep_engine_mma", "gdn_walk_engine_fma"),
            ),
            #[cfg(feature = "kernel-lab")]
            lab_kernel => super::lab::spec(lab_kernel),
        }
    }

    fn three_phase(self) -> bool {
        matches!(
            self.spec().1,
            ChunkLaunches::Prepped {
                walk: Walk::StateOnly { .. },
                ..
            }
        )
    }

    /// Whether the kernel computes the engine profile (else the reference profile).
    pub fn engine(self) -> bool {
        self.spec().0 == GdnProfile::Engine
    }
}

/// A split kernel's launches: `prep` (`gdn_prep_*`), then `walk` (`gdn_walk_*`).
pub(super) fn split_launches(prep: &'static str, walk: &'static str) -> ChunkLaunches {
    ChunkLaunches::Prepped {
        prep: (prep, PREP_SMEM_BYTES),
        walk: Walk::WithOutput((walk, SPLIT_WALK_SMEM_BYTES)),
    }
}

/// A three-phase kernel's launches: `prep`, `walk` over `columns` value columns, `output`.
pub(super) fn three_phase_launches(
    prep: Launch,
    walk: Launch,
    columns: usize,
    output: Launch,
) -> ChunkLaunches {
    ChunkLaunches::Prepped {
        prep,
        walk: Walk::StateOnly {
            walk,
            columns,
            output,
        },
    }
}

/// Dynamic shared memory of `gdn_prep_*`: K, Q, V, L, M, beta, gam.
const PREP_SMEM_BYTES: usize = (3 * 64 * 129 + 2 * 64 * 65 + 2 * 64) * 4;
/// Dynamic shared memory of `gdn_prep2_engine_ldm`: three bf16 tiles of 64 × 136 (Q then
/// K diag(βe^γ), K, V), L and M f32 (64 × 65), M bf16 (64 × 72), β, γ.
pub const PREP_LDM_SMEM_BYTES: usize =
    3 * 64 * 136 * 2 + 2 * 64 * 65 * 4 + 64 * 72 * 2 + 2 * 64 * 4;
/// Dynamic shared memory of `gdn_prep2_reference_rt`: K then diag(β) V and Q then K diag(βe^γ)
/// (64 × 132 f32 each), L and M (64 × 68 f32 each), β, γ.
pub const PREP_RT_SMEM_BYTES: usize = (2 * 64 * 132 + 2 * 64 * 68 + 2 * 64) * 4;
/// Value columns per block of the split walk (`gdn_walk_*`'s `DVS`).
pub(super) const SPLIT_COLUMNS: usize = 64;
/// Dynamic shared memory of `gdn_walk_*` (`gdn_walk_impl`): K, Q, W, the scores, U, V′, Q S, S,
/// gam, the value-column tiles with a row stride of [`SPLIT_COLUMNS`] + 1.
const SPLIT_WALK_SMEM_BYTES: usize = {
    let ldv = SPLIT_COLUMNS + 1;
    (3 * 64 * 129 + 64 * 65 + 3 * 64 * ldv + 128 * ldv + 64) * 4
};
