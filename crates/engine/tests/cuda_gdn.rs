//! CUDA kernels of the hybrid layers (kernels/gdn.cu, crates/engine/src/backend/cuda/gdn.rs) against the
//! CPU reference ([`draftlens_engine::backend::gdn`] through [`CpuBackend`]): conv1d + SiLU with carried
//! states, the norms and the gate, the gated delta rule in both numeric profiles over packed
//! sequences (chunk boundaries, T = 1, T < 64, T = 64, T not a multiple of 64), decode steps
//! against prefill, and the gap between the two profiles on a long sequence.
//!
//! The chunked delta rule's defaults are checked against the CPU and against their split
//! references; the kernel lab's variants (`--features kernel-lab`) against those too, and the
//! round-2 kernels against the ones they replaced bit for bit.
//!
//! Without CUDA every test prints "SKIP: CUDA unavailable: <reason>" and returns (CI has no GPU).
//! On the GPU machine: the test binary built with
//! `cargo test -p draftlens-engine [--features kernel-lab] --test cuda_gdn --no-run`, run with
//! `--test-threads=1` (docs/gdn-cuda.md, "Tests and benchmark").
//!
//! Inputs are random and rounded to bf16 on the host, so the CPU (f32) and the GPU (bf16
//! storage) start from identical values; every comparison is ‖gpu − cpu‖ / ‖cpu‖ over the whole
//! output (METHOD.md's measure), and NaN never passes.
#![cfg(feature = "cuda")]

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::cuda::gdn::{ChunkKernel, ConvKernel, CudaF32};
use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::backend::gdn::{bf16_round, GdnProfile, GdnShape, HostF32};
use draftlens_engine::backend::{Backend, GdnParams, SeqStarts};

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => {
            for l in b.gdn_kernel_report().expect("gdn kernels compile") {
                println!("  {l}");
            }
            Some(b)
        }
        Err(e) => {
            println!("SKIP: {e}");
            None
        }
    }
}

/// Uniform values in [lo, hi), rounded to bf16 (xorshift, fresh per seed).
fn rand(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = draftlens_engine::util::DetRng::new(seed);
    (0..n)
        .map(|_| bf16_round(lo + (hi - lo) * r.unit()))
        .collect()
}

/// ‖a − b‖ / ‖b‖; infinite when anything is NaN.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    if a.iter().chain(b).any(|v| v.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Small grouped shape with the kernels' head dims: 2 key heads, 6 value heads (r = 3, as the
/// 27B), dk = dv = 128.
const SHAPE: GdnShape = GdnShape {
    k_heads: 2,
    v_heads: 6,
    k_dim: 128,
    v_dim: 128,
};

/// One packed batch of delta-rule inputs (host values, bf16-exact).
struct Batch {
    seq_starts: SeqStarts,
    qkv: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
}

fn batch(lens: &[usize], seed: u64) -> Batch {
    let seq_starts = SeqStarts::from_lengths(lens.iter().copied());
    let t = seq_starts.rows();
    let hv = SHAPE.v_heads;
    Batch {
        seq_starts,
        // Conv + SiLU outputs are mostly in (−0.3, 1.5); the L2 norm removes the scale of q, k.
        qkv: rand(t * SHAPE.conv_dim(), seed, -0.5, 1.0),
        a: rand(t * hv, seed + 1, -2.0, 2.0),
        // β = sigmoid(b) from 0.05 to 0.95.
        b: rand(t * hv, seed + 2, -3.0, 3.0),
        // exp(A_log) from 0.02 to 1: decays α = e^g from near 0 to near 1, so the state carries
        // information over tens of tokens for some heads and forgets at once for others.
        a_log: rand(hv, seed + 3, -4.0, 0.0),
        dt_bias: rand(hv, seed + 4, -1.0, 1.0),
    }
}

/// Non-zero incoming states (continuing sequences) or zeros (fresh ones).
fn states(n: usize, seed: u64, fresh: bool) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            if fresh {
                vec![0.0; SHAPE.state_len()]
            } else {
                rand(SHAPE.state_len(), seed + i as u64, -0.5, 0.5)
            }
        })
        .collect()
}

/// The CPU reference: output and final states.
fn run_cpu(x: &Batch, init: &[Vec<f32>], profile: GdnProfile) -> (Vec<f32>, Vec<Vec<f32>>) {
    let be = CpuBackend::new();
    let t = *x.seq_starts.last().unwrap();
    let hv = SHAPE.v_heads;
    let qkv = be.from_host(&x.qkv, t, SHAPE.conv_dim()).unwrap();
    let (a, b) = (
        be.from_host(&x.a, t, hv).unwrap(),
        be.from_host(&x.b, t, hv).unwrap(),
    );
    let (a_log, dt_bias) = (
        be.f32_from_host(&x.a_log).unwrap(),
        be.f32_from_host(&x.dt_bias).unwrap(),
    );
    let params = GdnParams::<CpuBackend> {
        a_log: &a_log,
        dt_bias: &dt_bias,
        shape: SHAPE,
        profile,
    };
    let mut st: Vec<HostF32> = init.iter().map(|s| HostF32(s.clone())).collect();
    let mut refs: Vec<&mut HostF32> = st.iter_mut().collect();
    let out = be
        .gated_delta_rule(&qkv, &a, &b, &params, &x.seq_starts, &mut refs)
        .unwrap();
    (
        be.to_host(&out).unwrap(),
        st.into_iter().map(|s| s.0).collect(),
    )
}

fn run_gpu(
    be: &CudaBackend,
    x: &Batch,
    init: &[Vec<f32>],
    kernel: ChunkKernel,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let t = *x.seq_starts.last().unwrap();
    let hv = SHAPE.v_heads;
    let qkv = be.from_host(&x.qkv, t, SHAPE.conv_dim()).unwrap();
    let (a, b) = (
        be.from_host(&x.a, t, hv).unwrap(),
        be.from_host(&x.b, t, hv).unwrap(),
    );
    let (a_log, dt_bias) = (
        be.f32_from_host(&x.a_log).unwrap(),
        be.f32_from_host(&x.dt_bias).unwrap(),
    );
    let profile = if kernel.engine() {
        GdnProfile::Engine
    } else {
        GdnProfile::Reference
    };
    let params = GdnParams::<CudaBackend> {
        a_log: &a_log,
        dt_bias: &dt_bias,
        shape: SHAPE,
        profile,
    };
    let mut st: Vec<CudaF32> = init.iter().map(|s| be.f32_from_host(s).unwrap()).collect();
    let mut refs: Vec<&mut CudaF32> = st.iter_mut().collect();
    let out = be
        .gated_delta_rule_with((&qkv, &a, &b), &params, &x.seq_starts, &mut refs, kernel)
        .unwrap();
    let out = be.to_host(&out).unwrap();
    let st = st.iter().map(|s| be.f32_to_host(s).unwrap()).collect();
    (out, st)
}

/// The states' bit patterns, for exact comparisons.
fn st_bits(s: &[Vec<f32>]) -> Vec<u32> {
    s.iter().flatten().map(|v| v.to_bits()).collect()
}

fn state_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    rel(&a.concat(), &b.concat())
}

/// The reference profile's three-phase kernels checked against the CPU and `SplitReference`: the
/// default; with the kernel lab also the ones it replaced.
const REFERENCE_THREE_PHASE: &[ChunkKernel] = &[
    #[cfg(feature = "kernel-lab")]
    ChunkKernel::ThreePhaseReference,
    #[cfg(feature = "kernel-lab")]
    ChunkKernel::ThreePhaseReferenceV16,
    ChunkKernel::ThreePhaseReferenceRt,
];

/// The engine profile's three-phase kernels checked against the CPU emulation and
/// `SplitEngineFma`: the default; with the kernel lab also the ones it replaced.
const ENGINE_THREE_PHASE: &[ChunkKernel] = &[
    #[cfg(feature = "kernel-lab")]
    ChunkKernel::ThreePhaseEngine,
    #[cfg(feature = "kernel-lab")]
    ChunkKernel::ThreePhaseEngineV16,
    #[cfg(feature = "kernel-lab")]
    ChunkKernel::ThreePhaseEngineLdm,
    ChunkKernel::ThreePhaseEngineTc,
];

/// Packed lengths crossing every chunk case: T = 1 (recurrent kernel), T < 64, T = 64, a
/// multiple of 64, T not a multiple of 64, an empty sequence.
const LENS: [usize; 8] = [1, 17, 64, 128, 200, 0, 65, 1];

#[test]
fn cuda_gdn_reference_profile_matches_cpu() {
    let Some(be) = gpu() else { return };
    for (fresh, seed) in [(true, 10), (false, 20)] {
        let x = batch(&LENS, seed);
        let init = states(LENS.len(), seed + 100, fresh);
        let (want, want_st) = run_cpu(&x, &init, GdnProfile::Reference);
        for kernel in [
            #[cfg(feature = "kernel-lab")]
            ChunkKernel::ReferenceFma,
            #[cfg(feature = "kernel-lab")]
            ChunkKernel::ReferenceFmaV64,
            ChunkKernel::SplitReference,
            #[cfg(feature = "kernel-lab")]
            ChunkKernel::ThreePhaseReference,
            #[cfg(feature = "kernel-lab")]
            ChunkKernel::ThreePhaseReferenceV16,
            ChunkKernel::ThreePhaseReferenceRt,
        ] {
            let (got, got_st) = run_gpu(&be, &x, &init, kernel);
            let (e, es) = (rel(&got, &want), state_rel(&got_st, &want_st));
            println!("{kernel:?}, fresh={fresh}: output rel {e:.2e}, states rel {es:.2e}");
            // Output: both sides compute in f32 from identical inputs; the GPU stores its output in
            // bf16 (relative rounding error ≤ 2⁻⁹ per value, ≈ 2⁻⁹/√3 ≈ 1.1e-3 in the norm for
            // uniform rounding errors), and f32 summation order adds ~1e-6. 2e-3 leaves room for the
            // rounding and nothing else: a wrong decay, a missed reset or an unwritten row costs more
            // than 1e-2.
            assert!(e < 2e-3, "{kernel:?}: output rel {e}");
            // States stay f32 on both sides and never see the rounded output: only summation order
            // differs (~1e-7 per operation, a few hundred dependent steps).
            assert!(es < 1e-4, "{kernel:?}: states rel {es}");
        }
    }
}

/// The engine profile's split reference and three-phase kernels against the CPU emulation, and
/// the three-phase kernels against the split reference.
#[test]
fn cuda_gdn_engine_profile_matches_cpu_emulation() {
    let Some(be) = gpu() else { return };
    let x = batch(&LENS, 30);
    let init = states(LENS.len(), 130, false);
    let (want, want_st) = run_cpu(&x, &init, GdnProfile::Engine);
    // The CPU emulation rounds at fla's main points (q̂, k̂, β, M, U, W, V′, S for the products)
    // but not at all of the kernel's (fla also rounds v·β, k·β·e^γ, the decayed scores and the
    // decayed V′ of the state update before its products; docs/gdn-cuda.md): bf16-level noise,
    // a few 2⁻⁹ roundings in series, ≤ 1e-2.
    let (split, split_st) = run_gpu(&be, &x, &init, ChunkKernel::SplitEngineFma);
    let (e_cpu, es_cpu) = (rel(&split, &want), state_rel(&split_st, &want_st));
    println!("engine: SplitEngineFma vs CPU emulation {e_cpu:.2e} (states {es_cpu:.2e})");
    assert!(
        e_cpu < 1e-2 && es_cpu < 1e-2,
        "SplitEngineFma vs CPU emulation: {e_cpu} / {es_cpu}"
    );
    // The three-phase kernels: the same roundings; their walk sums in SplitEngineFma's order
    // (`…Tc`: on the tensor cores), their output phase on the tensor cores.
    for &kernel in ENGINE_THREE_PHASE {
        let (o, st) = run_gpu(&be, &x, &init, kernel);
        let (e, es) = (rel(&o, &split), state_rel(&st, &split_st));
        let (ec, esc) = (rel(&o, &want), state_rel(&st, &want_st));
        println!("engine: {kernel:?} vs SplitEngineFma {e:.2e} (states {es:.2e}); vs CPU emulation {ec:.2e} (states {esc:.2e})");
        assert!(
            e < 2e-3 && es < 2e-3,
            "{kernel:?} vs SplitEngineFma: {e} / {es}"
        );
        assert!(
            ec < 1e-2 && esc < 1e-2,
            "{kernel:?} vs CPU emulation: {ec} / {esc}"
        );
    }
}

/// The kernel lab's fused engine kernels: against the CPU emulation, tensor cores against FMA,
/// 64 value columns per block against 32, and the split kernels against the fused one.
#[cfg(feature = "kernel-lab")]
#[test]
fn cuda_gdn_engine_fused_kernels_match_cpu_emulation_and_tensor_cores_match_fma() {
    let Some(be) = gpu() else { return };
    let x = batch(&LENS, 30);
    let init = states(LENS.len(), 130, false);
    let (want, want_st) = run_cpu(&x, &init, GdnProfile::Engine);
    let (fma, fma_st) = run_gpu(&be, &x, &init, ChunkKernel::EngineFma);
    let (mma, mma_st) = run_gpu(&be, &x, &init, ChunkKernel::EngineMma);
    let (m64, m64_st) = run_gpu(&be, &x, &init, ChunkKernel::EngineMmaV64);
    let (e_cpu, es_cpu) = (rel(&mma, &want), state_rel(&mma_st, &want_st));
    let (e_fma, es_fma) = (rel(&mma, &fma), state_rel(&mma_st, &fma_st));
    println!("engine: mma vs CPU emulation {e_cpu:.2e} (states {es_cpu:.2e}); mma vs fma {e_fma:.2e} (states {es_fma:.2e})");
    // The CPU emulation's bound: cuda_gdn_engine_profile_matches_cpu_emulation.
    assert!(e_cpu < 1e-2, "engine vs CPU emulation: output rel {e_cpu}");
    assert!(
        es_cpu < 1e-2,
        "engine vs CPU emulation: states rel {es_cpu}"
    );
    // Tensor cores vs FMA on the same bf16 operands: only the f32 summation order differs, which
    // can flip a bf16 rounding of an intermediate now and then (2⁻⁸ on that value).
    assert!(e_fma < 2e-3, "mma vs fma: output rel {e_fma}");
    assert!(es_fma < 2e-3, "mma vs fma: states rel {es_fma}");
    // 64 value columns per block: the same arithmetic per column.
    let (e64, es64) = (rel(&m64, &mma), state_rel(&m64_st, &mma_st));
    println!("engine: v64 vs v32 {e64:.2e} (states {es64:.2e})");
    assert!(e64 < 2e-3 && es64 < 2e-3, "v64 vs v32: {e64} / {es64}");
    // The split kernels: the same roundings, in two launches.
    for kernel in [ChunkKernel::SplitEngineFma, ChunkKernel::SplitEngineMma] {
        let (o, st) = run_gpu(&be, &x, &init, kernel);
        let (e, es) = (rel(&o, &mma), state_rel(&st, &mma_st));
        println!("engine: {kernel:?} vs fused mma {e:.2e} (states {es:.2e})");
        assert!(e < 2e-3 && es < 2e-3, "{kernel:?} vs fused mma: {e} / {es}");
    }
}

/// The three-phase kernels on a long packed batch (a 2048-token sequence among short ones, carried
/// states): Reference against the CPU and against `SplitReference` (same products in the same
/// order: equal up to FMA contraction), Engine against `SplitEngineFma` (summation order of the
/// tensor-core output phase only).
#[test]
fn cuda_gdn_three_phase_matches_split_on_a_long_packed_batch() {
    let Some(be) = gpu() else { return };
    let lens = [2048, 65, 0, 1, 200, 64];
    let x = batch(&lens, 60);
    let init = states(lens.len(), 160, false);
    let (cpu, cpu_st) = run_cpu(&x, &init, GdnProfile::Reference);
    let (split, split_st) = run_gpu(&be, &x, &init, ChunkKernel::SplitReference);
    for &kernel in REFERENCE_THREE_PHASE {
        let (three, three_st) = run_gpu(&be, &x, &init, kernel);
        let (e, es) = (rel(&three, &cpu), state_rel(&three_st, &cpu_st));
        let (d, ds) = (rel(&three, &split), state_rel(&three_st, &split_st));
        let same = three == split && three_st == split_st;
        println!("2048 packed: {kernel:?} vs CPU {e:.2e} (states {es:.2e}); vs SplitReference {d:.2e} (states {ds:.2e}), bit-identical: {same}");
        assert!(e < 2e-3 && es < 1e-4, "{kernel:?} vs CPU: {e} / {es}");
        assert!(
            d < 1e-4 && ds < 1e-5,
            "{kernel:?} vs SplitReference: {d} / {ds}"
        );
    }
    let (split, split_st) = run_gpu(&be, &x, &init, ChunkKernel::SplitEngineFma);
    for &kernel in ENGINE_THREE_PHASE {
        let (three, three_st) = run_gpu(&be, &x, &init, kernel);
        let (d, ds) = (rel(&three, &split), state_rel(&three_st, &split_st));
        println!("2048 packed: {kernel:?} vs SplitEngineFma {d:.2e} (states {ds:.2e})");
        // The states never see the output phase: the walk is SplitEngineFma's, in its order, so
        // they should agree to f32 rounding; a differently contracted epilogue can flip a bf16
        // rounding of S for the products now and then, hence the bf16-level bound of the other
        // engine comparisons. The print says which it is.
        let same = st_bits(&three_st) == st_bits(&split_st);
        println!("  {kernel:?}: states bit-identical to SplitEngineFma: {same}");
        assert!(
            d < 2e-3 && ds < 2e-3,
            "{kernel:?} vs SplitEngineFma: {d} / {ds}"
        );
    }
}

/// The round-2 kernels change how products are fed, not what they sum: `ThreePhaseEngineLdm`
/// (`gdn_prep2_engine_ldm`, `gdn_hout_engine_ldm`) feeds the tensor cores the same bf16 operands
/// in the same per-tile mma chains as `ThreePhaseEngine`'s `mm_mma`; `ThreePhaseReferenceRt`
/// (`gdn_prep2_reference_rt`) runs `gdn_prep2_reference`'s fmaf chains from 16-byte loads
/// (docs/gdn-cuda.md, "Round 2"). Outputs and states must be the same bits, on the packed lengths
/// of every chunk case (fresh and carried states) and on a 2048-token sequence among short ones.
#[cfg(feature = "kernel-lab")]
#[test]
fn cuda_gdn_round2_kernels_equal_their_originals_bit_for_bit() {
    let Some(be) = gpu() else { return };
    let cases: [(&[usize], u64, bool); 3] = [
        (&LENS, 70, true),
        (&LENS, 80, false),
        (&[2048, 65, 0, 1, 200, 64], 90, false),
    ];
    for (lens, seed, fresh) in cases {
        let x = batch(lens, seed);
        let init = states(lens.len(), seed + 100, fresh);
        for (old, new) in [
            (
                ChunkKernel::ThreePhaseEngine,
                ChunkKernel::ThreePhaseEngineLdm,
            ),
            (
                ChunkKernel::ThreePhaseReference,
                ChunkKernel::ThreePhaseReferenceRt,
            ),
        ] {
            let (want, want_st) = run_gpu(&be, &x, &init, old);
            let (got, got_st) = run_gpu(&be, &x, &init, new);
            let (e, es) = (rel(&got, &want), state_rel(&got_st, &want_st));
            let diff = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            println!(
                "{new:?} vs {old:?}, lengths {lens:?}, fresh={fresh}: {diff} of {} outputs differ (rel {e:.2e}), states rel {es:.2e}",
                want.len()
            );
            assert_eq!(diff, 0, "{new:?} output differs from {old:?} (rel {e})");
            assert!(
                st_bits(&got_st) == st_bits(&want_st),
                "{new:?} states differ from {old:?} (rel {es})"
            );
        }
    }
}

/// `gdn_bench --breakdown`'s per-phase timing: with it on, a three-phase call records its launches
/// in order (gates, setup, prep, setup, walk, output) with positive times, and computes the same
/// bits as with it off. (The switch is process-wide: other tests' calls may add marks meanwhile,
/// hence a subsequence check.)
#[cfg(feature = "kernel-lab")]
#[test]
fn cuda_gdn_phase_timing_marks_every_launch() {
    use draftlens_engine::backend::cuda::gdn::{set_phase_timing, take_phase_times};
    let Some(be) = gpu() else { return };
    let lens = [200, 65];
    let x = batch(&lens, 95);
    let init = states(lens.len(), 195, false);
    let (plain, plain_st) = run_gpu(&be, &x, &init, ChunkKernel::ThreePhaseReference);
    set_phase_timing(true);
    let (timed, timed_st) = run_gpu(&be, &x, &init, ChunkKernel::ThreePhaseReference);
    let marks = take_phase_times();
    set_phase_timing(false);
    println!("phase marks: {marks:?}");
    assert!(timed == plain && st_bits(&timed_st) == st_bits(&plain_st));
    let want = ["gates", "setup", "prep", "setup", "walk", "output"];
    let mut it = marks.iter();
    for w in want {
        let found = it.by_ref().find(|(p, _)| *p == w);
        assert!(
            matches!(found, Some((_, secs)) if *secs > 0.0),
            "phase {w} missing or not timed in {marks:?}"
        );
    }
}

/// Launch geometry of the three-phase kernels, checked without a GPU: the chunk plan of a packed
/// batch, the scratch sizes, and the shared memory that lets two blocks share an SM.
#[test]
fn three_phase_plan_and_shared_memory() {
    #[cfg(feature = "kernel-lab")]
    use draftlens_engine::backend::cuda::gdn::PREP2_SMEM_BYTES;
    use draftlens_engine::backend::cuda::gdn::{
        hwalk_smem_bytes, ChunkPlan, HOUT_COLUMNS, HOUT_LDM_SMEM_BYTES, HOUT_SMEM_BYTES,
        HWALK_TC_SMEM_BYTES, PREP_LDM_SMEM_BYTES, PREP_RT_SMEM_BYTES,
    };
    // Lengths 1, 17, 64, 128, 200, 0, 65 from row 0; the multi-row sequences are 1..=4 and 6.
    let starts = [0, 1, 18, 82, 210, 410, 410, 475];
    let plan = ChunkPlan::new(&starts, &[1, 2, 3, 4, 6]);
    let want: Vec<i64> = vec![
        1, 18, // 17 rows
        18, 82, // 64
        82, 146, 146, 210, // 128
        210, 274, 274, 338, 338, 402, 402, 410, // 200 = 3·64 + 8
        410, 474, 474, 475, // 65
    ];
    assert_eq!(plan.rows, want);
    assert_eq!(plan.seq_chunk0, vec![0, 1, 2, 4, 8]);
    assert_eq!(plan.len(), 10);
    assert_eq!(
        plan.three_phase_scratch(475, 6, false),
        (475 * 6 * 128, 10 * 6 * 128 * 128)
    );
    // The engine kernels store h in bf16: half the words.
    assert_eq!(
        plan.three_phase_scratch(475, 6, true),
        (475 * 6 * 128, 10 * 6 * 128 * 64)
    );
    assert!(ChunkPlan::new(&starts, &[]).is_empty());
    // The output slices tile a 128-column head.
    assert_eq!(128 % HOUT_COLUMNS, 0);
    // Two blocks per SM on sm_90 (228 KB of shared memory, 1 KB reserved per block), as the
    // kernels' __launch_bounds__(256, 2) assume.
    let walks = [hwalk_smem_bytes(16), hwalk_smem_bytes(32)];
    let others = [
        HOUT_SMEM_BYTES,
        #[cfg(feature = "kernel-lab")]
        PREP2_SMEM_BYTES,
        HOUT_LDM_SMEM_BYTES,
        PREP_LDM_SMEM_BYTES,
        PREP_RT_SMEM_BYTES,
        HWALK_TC_SMEM_BYTES,
    ];
    for bytes in walks.into_iter().chain(others) {
        assert!(2 * (bytes + 1024) <= 228 * 1024, "{bytes} B");
    }
    // The layouts' sums as kernels/gdn.cu documents them.
    assert_eq!(walks, [84_224, 100_608]);
    assert_eq!(HOUT_SMEM_BYTES, 84_480);
    #[cfg(feature = "kernel-lab")]
    assert_eq!(PREP2_SMEM_BYTES, 99_840);
    assert_eq!(HOUT_LDM_SMEM_BYTES, 50_688);
    assert_eq!(PREP_LDM_SMEM_BYTES, 95_232);
    assert_eq!(PREP_RT_SMEM_BYTES, 102_912);
    assert_eq!(HWALK_TC_SMEM_BYTES, 92_416);
}

#[test]
fn cuda_gdn_decode_steps_equal_prefill() {
    let Some(be) = gpu() else { return };
    // Three sequences of 100 tokens: prefill 70 (chunked: one full chunk and 6 rows), then 30
    // batched decode steps (one token per sequence per call, recurrent kernel).
    let (n, t, pre) = (3usize, 100usize, 70usize);
    // The reference profile's chunked kernel, as the model runs it.
    let kernel = ChunkKernel::for_profile(GdnProfile::Reference);
    let whole = batch(&[t; 3], 40);
    let init = states(n, 140, true);
    let (want, want_st) = run_gpu(&be, &whole, &init, kernel);
    let cd = SHAPE.conv_dim();
    let hv = SHAPE.v_heads;
    let vd = SHAPE.value_dim();
    let rows = |s: usize, r: std::ops::Range<usize>, w: usize, v: &[f32]| -> Vec<f32> {
        v[(s * t + r.start) * w..(s * t + r.end) * w].to_vec()
    };
    // Prefill of the first 70 rows of each sequence.
    let pre_batch = Batch {
        seq_starts: SeqStarts::from_lengths(std::iter::repeat(pre).take(n)),
        qkv: (0..n)
            .flat_map(|s| rows(s, 0..pre, cd, &whole.qkv))
            .collect(),
        a: (0..n).flat_map(|s| rows(s, 0..pre, hv, &whole.a)).collect(),
        b: (0..n).flat_map(|s| rows(s, 0..pre, hv, &whole.b)).collect(),
        a_log: whole.a_log.clone(),
        dt_bias: whole.dt_bias.clone(),
    };
    let (pre_out, mut st) = run_gpu(&be, &pre_batch, &init, kernel);
    let mut got = vec![0f32; n * t * vd];
    for s in 0..n {
        got[s * t * vd..(s * t + pre) * vd]
            .copy_from_slice(&pre_out[s * pre * vd..(s + 1) * pre * vd]);
    }
    for i in pre..t {
        let step = Batch {
            seq_starts: SeqStarts::each_row(n),
            qkv: (0..n)
                .flat_map(|s| rows(s, i..i + 1, cd, &whole.qkv))
                .collect(),
            a: (0..n)
                .flat_map(|s| rows(s, i..i + 1, hv, &whole.a))
                .collect(),
            b: (0..n)
                .flat_map(|s| rows(s, i..i + 1, hv, &whole.b))
                .collect(),
            a_log: whole.a_log.clone(),
            dt_bias: whole.dt_bias.clone(),
        };
        let (o, st2) = run_gpu(&be, &step, &st, kernel);
        st = st2;
        for s in 0..n {
            got[(s * t + i) * vd..(s * t + i + 1) * vd].copy_from_slice(&o[s * vd..(s + 1) * vd]);
        }
    }
    let (e, es) = (rel(&got, &want), state_rel(&st, &want_st));
    println!("decode after prefill vs one prefill: output rel {e:.2e}, states rel {es:.2e}");
    // Both sides are f32 inside; each output is rounded to bf16 once, so two roundings of
    // nearly equal values differ by at most one bf16 step (≤ 2⁻⁸ relative, ~1e-3 in the norm).
    assert!(e < 2e-3, "output rel {e}");
    assert!(es < 1e-4, "states rel {es}");
    // The decode steps themselves against the CPU's recurrent form.
    let last = Batch {
        seq_starts: SeqStarts::each_row(n),
        qkv: (0..n)
            .flat_map(|s| rows(s, t - 1..t, cd, &whole.qkv))
            .collect(),
        a: (0..n)
            .flat_map(|s| rows(s, t - 1..t, hv, &whole.a))
            .collect(),
        b: (0..n)
            .flat_map(|s| rows(s, t - 1..t, hv, &whole.b))
            .collect(),
        a_log: whole.a_log.clone(),
        dt_bias: whole.dt_bias.clone(),
    };
    let init2 = states(n, 240, false);
    let (cpu_o, cpu_st) = run_cpu(&last, &init2, GdnProfile::Reference);
    let (gpu_o, gpu_st) = run_gpu(&be, &last, &init2, kernel);
    let (e, es) = (rel(&gpu_o, &cpu_o), state_rel(&gpu_st, &cpu_st));
    println!("one batched decode step vs CPU: output rel {e:.2e}, states rel {es:.2e}");
    assert!(e < 2e-3 && es < 1e-5, "decode step vs CPU: {e} / {es}");
}

#[test]
fn cuda_gdn_profiles_differ_measurably_on_a_long_sequence() {
    let Some(be) = gpu() else { return };
    let x = batch(&[2048], 50);
    let init = states(1, 150, true);
    let (cpu, cpu_st) = run_cpu(&x, &init, GdnProfile::Reference);
    let (r, r_st) = run_gpu(
        &be,
        &x,
        &init,
        ChunkKernel::for_profile(GdnProfile::Reference),
    );
    let (e, e_st) = run_gpu(&be, &x, &init, ChunkKernel::for_profile(GdnProfile::Engine));
    let (rc, ec) = (rel(&r, &cpu), rel(&e, &r));
    let (rcs, ecs) = (state_rel(&r_st, &cpu_st), state_rel(&e_st, &r_st));
    println!("2048 tokens: reference–CPU {rc:.2e} (states {rcs:.2e}), engine–reference {ec:.2e} (states {ecs:.2e})");
    assert!(
        ec > rc,
        "engine–reference gap {ec} does not exceed reference–CPU gap {rc}"
    );
    assert!(
        ecs > 10.0 * rcs,
        "state gaps: engine {ecs}, reference {rcs}"
    );
    assert!(ec < 3e-2, "engine profile drifted from the reference: {ec}");
}

#[test]
fn cuda_conv1d_silu_matches_cpu_with_resets_and_states() {
    let Some(be) = gpu() else { return };
    let cpu = CpuBackend::new();
    let (c, k) = (SHAPE.conv_dim(), 4usize);
    let lens = [1usize, 5, 70, 0, 3, 2];
    let t: usize = lens.iter().sum();
    let seq_starts = SeqStarts::from_lengths(lens);
    let x = rand(t * c, 60, -2.0, 2.0);
    let w = rand(c * k, 61, -0.6, 0.6);
    let init: Vec<Vec<f32>> = (0..lens.len())
        .map(|i| rand((k - 1) * c, 70 + i as u64, -2.0, 2.0))
        .collect();
    let on_cpu = |x: &[f32], init: &[Vec<f32>]| {
        let (xt, wt) = (
            cpu.from_host(x, t, c).unwrap(),
            cpu.from_host(&w, c, k).unwrap(),
        );
        let mut st: Vec<_> = init
            .iter()
            .map(|s| cpu.from_host(s, k - 1, c).unwrap())
            .collect();
        let mut refs: Vec<_> = st.iter_mut().collect();
        let y = cpu
            .causal_conv1d_silu(&xt, &wt, &seq_starts, &mut refs)
            .unwrap();
        (
            cpu.to_host(&y).unwrap(),
            st.iter()
                .map(|s| cpu.to_host(s).unwrap())
                .collect::<Vec<_>>(),
        )
    };
    // `kernel`: the conv output kernel (the trait's default is `ConvKernel::Rows`).
    let on_gpu = |x: &[f32], init: &[Vec<f32>], kernel: Option<ConvKernel>| {
        let (xt, wt) = (
            be.from_host(x, t, c).unwrap(),
            be.from_host(&w, c, k).unwrap(),
        );
        let mut st: Vec<_> = init
            .iter()
            .map(|s| be.from_host(s, k - 1, c).unwrap())
            .collect();
        let mut refs: Vec<_> = st.iter_mut().collect();
        let y = match kernel {
            Some(kernel) => be.causal_conv1d_silu_with(&xt, &wt, &seq_starts, &mut refs, kernel),
            None => be.causal_conv1d_silu(&xt, &wt, &seq_starts, &mut refs),
        }
        .unwrap();
        (
            be.to_host(&y).unwrap(),
            st.iter()
                .map(|s| be.to_host(s).unwrap())
                .collect::<Vec<_>>(),
        )
    };
    let (want, want_st) = on_cpu(&x, &init);
    let (got, got_st) = on_gpu(&x, &init, None);
    // Same f32 sum of the same bf16 inputs (4 terms, order identical), then one bf16 rounding
    // of the SiLU: each value within one bf16 step (2⁻⁸ relative) of the CPU's.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= w.abs() * 2f32.powi(-8) + 1e-6,
            "conv output {i} (row {}, channel {}): gpu {g}, cpu {w}",
            i / c,
            i % c
        );
    }
    // States are copies of inputs: exact.
    assert_eq!(got_st, want_st, "conv states");
    // Every output kernel runs the same fmaf chains and rounding: the same bits as the
    // one-channel kernel, and the same states. `lens` puts sequence starts inside the rows kernel's
    // 16-row runs (rows 1, 6, 76, 79) and one sequence across several runs.
    let (one, _) = on_gpu(&x, &init, Some(ConvKernel::OneChannel));
    for kernel in [ConvKernel::V8, ConvKernel::Rows] {
        let (y, st) = on_gpu(&x, &init, Some(kernel));
        let diff = y
            .iter()
            .zip(&one)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            diff, 0,
            "{kernel:?} differs from OneChannel in {diff} values"
        );
        assert_eq!(st, want_st, "conv states after {kernel:?}");
    }
}

#[test]
fn cuda_gated_norms_and_sigmoid_gate_match_cpu() {
    let Some(be) = gpu() else { return };
    let cpu = CpuBackend::new();
    let (t, cols, hd) = (37usize, SHAPE.value_dim(), 128usize);
    let x = rand(t * cols, 80, -3.0, 3.0);
    let z = rand(t * cols, 81, -4.0, 4.0);
    let w = rand(hd, 82, 0.5, 1.5);
    let within = |what: &str, got: &[f32], want: &[f32]| {
        // f32 arithmetic on both sides, one bf16 rounding on the GPU.
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= w.abs() * 2f32.powi(-8) + 1e-5,
                "{what} value {i}: gpu {g}, cpu {w}"
            );
        }
    };
    let want = cpu
        .gated_rms_norm(
            &cpu.from_host(&x, t, cols).unwrap(),
            &cpu.from_host(&z, t, cols).unwrap(),
            &cpu.from_host(&w, 1, hd).unwrap(),
            1e-6,
            hd,
        )
        .and_then(|y| cpu.to_host(&y))
        .unwrap();
    let got = be
        .gated_rms_norm(
            &be.from_host(&x, t, cols).unwrap(),
            &be.from_host(&z, t, cols).unwrap(),
            &be.from_host(&w, 1, hd).unwrap(),
            1e-6,
            hd,
        )
        .and_then(|y| be.to_host(&y))
        .unwrap();
    within("gated_rms_norm", &got, &want);

    // Zero-centred RMSNorm over whole rows (layer norm) and per head (q/k norms).
    for group in [cols, hd] {
        let wz = rand(group, 83, -0.5, 0.5);
        let want = cpu
            .rms_norm_zero_centred(
                &cpu.from_host(&x, t, cols).unwrap(),
                &cpu.from_host(&wz, 1, group).unwrap(),
                1e-6,
                group,
            )
            .and_then(|y| cpu.to_host(&y))
            .unwrap();
        let got = be
            .rms_norm_zero_centred(
                &be.from_host(&x, t, cols).unwrap(),
                &be.from_host(&wz, 1, group).unwrap(),
                1e-6,
                group,
            )
            .and_then(|y| be.to_host(&y))
            .unwrap();
        within("rms_norm_zero_centred", &got, &want);
    }

    let mut xc = cpu.from_host(&x, t, cols).unwrap();
    cpu.sigmoid_gate_inplace(&mut xc, &cpu.from_host(&z, t, cols).unwrap())
        .unwrap();
    let mut xg = be.from_host(&x, t, cols).unwrap();
    be.sigmoid_gate_inplace(&mut xg, &be.from_host(&z, t, cols).unwrap())
        .unwrap();
    within(
        "sigmoid_gate",
        &be.to_host(&xg).unwrap(),
        &cpu.to_host(&xc).unwrap(),
    );
}

#[test]
fn cuda_gdn_other_head_dims_fall_back_to_the_host_reference() {
    let Some(be) = gpu() else { return };
    // The tiny golden models' GDN shape (k_dim = v_dim = 16): not a shape of the kernels, so
    // the CUDA backend must compute it through the host reference, not fail.
    let shape = GdnShape {
        k_heads: 2,
        v_heads: 4,
        k_dim: 16,
        v_dim: 16,
    };
    let (t, hv) = (70usize, shape.v_heads);
    let qkv = rand(t * shape.conv_dim(), 91, -0.5, 1.0);
    let (a, b) = (rand(t * hv, 92, -2.0, 2.0), rand(t * hv, 93, -3.0, 3.0));
    let (a_log, dt) = (rand(hv, 94, -4.0, 0.0), rand(hv, 95, -1.0, 1.0));
    let cpu = CpuBackend::new();
    let want = {
        let p = GdnParams::<CpuBackend> {
            a_log: &HostF32(a_log.clone()),
            dt_bias: &HostF32(dt.clone()),
            shape,
            profile: GdnProfile::Reference,
        };
        let mut st = HostF32(vec![0.0; shape.state_len()]);
        let y = cpu
            .gated_delta_rule(
                &cpu.from_host(&qkv, t, shape.conv_dim()).unwrap(),
                &cpu.from_host(&a, t, hv).unwrap(),
                &cpu.from_host(&b, t, hv).unwrap(),
                &p,
                &SeqStarts::one(t),
                &mut [&mut st],
            )
            .unwrap();
        cpu.to_host(&y).unwrap()
    };
    let (la, ld) = (
        be.f32_from_host(&a_log).unwrap(),
        be.f32_from_host(&dt).unwrap(),
    );
    let p = GdnParams::<CudaBackend> {
        a_log: &la,
        dt_bias: &ld,
        shape,
        profile: GdnProfile::Reference,
    };
    let mut st = be.f32_from_host(&vec![0.0; shape.state_len()]).unwrap();
    let got = be
        .gated_delta_rule(
            &be.from_host(&qkv, t, shape.conv_dim()).unwrap(),
            &be.from_host(&a, t, hv).unwrap(),
            &be.from_host(&b, t, hv).unwrap(),
            &p,
            &SeqStarts::one(t),
            &mut [&mut st],
        )
        .and_then(|y| be.to_host(&y))
        .unwrap();
    let e = rel(&got, &want);
    println!("k_dim 16 through the host reference: rel {e:.2e}");
    // The same f32 host code on the same inputs; the GPU tensor rounds the output to bf16.
    assert!(e < 2e-3, "{e}");
    // Gated norm with 16-column heads: host path too.
    let (x, z, w) = (
        rand(t * 64, 96, -2.0, 2.0),
        rand(t * 64, 97, -2.0, 2.0),
        rand(16, 98, 0.5, 1.5),
    );
    let want = reference_gated_norm(&cpu, &x, &z, &w, t);
    let got = reference_gated_norm(&be, &x, &z, &w, t);
    assert!(rel(&got, &want) < 2e-3, "{}", rel(&got, &want));
}

fn reference_gated_norm<B: Backend>(be: &B, x: &[f32], z: &[f32], w: &[f32], t: usize) -> Vec<f32> {
    let y = be
        .gated_rms_norm(
            &be.from_host(x, t, 64).unwrap(),
            &be.from_host(z, t, 64).unwrap(),
            &be.from_host(w, 1, 16).unwrap(),
            1e-6,
            16,
        )
        .unwrap();
    be.to_host(&y).unwrap()
}

#[test]
fn cuda_gdn_bad_shapes_are_clean_errors() {
    let Some(be) = gpu() else { return };
    let x = batch(&[5], 90);
    let qkv = be.from_host(&x.qkv, 5, SHAPE.conv_dim()).unwrap();
    let ab = be.from_host(&x.a, 5, SHAPE.v_heads).unwrap();
    let (a_log, dt) = (
        be.f32_from_host(&x.a_log).unwrap(),
        be.f32_from_host(&x.dt_bias).unwrap(),
    );
    let params = GdnParams::<CudaBackend> {
        a_log: &a_log,
        dt_bias: &dt,
        shape: SHAPE,
        profile: GdnProfile::Reference,
    };
    // A state of the wrong size.
    let mut st = be.f32_from_host(&[0.0; 10]).unwrap();
    let e = be
        .gated_delta_rule(&qkv, &ab, &ab, &params, &SeqStarts::one(5), &mut [&mut st])
        .err()
        .expect("wrong state size is refused");
    assert!(e.to_string().contains("state has 10 values"), "{e}");
    // Sequence starts that do not end at the row count.
    let mut st = be.f32_from_host(&vec![0.0; SHAPE.state_len()]).unwrap();
    let e = be
        .gated_delta_rule(&qkv, &ab, &ab, &params, &SeqStarts::one(4), &mut [&mut st])
        .err()
        .expect("bad seq_starts are refused");
    assert!(e.to_string().contains("sequence starts"), "{e}");
    // a with the wrong width.
    let e = be
        .gated_delta_rule(&qkv, &qkv, &ab, &params, &SeqStarts::one(5), &mut [&mut st])
        .err()
        .expect("a of the wrong width is refused");
    assert!(e.to_string().contains("a is [5, 1280]"), "{e}");
}

/// A small Qwen3.5-style hybrid with the real GDN head dims (3 Gated DeltaNet layers, 1 gated
/// attention layer; Hk 2, Hv 4, dk = dv = 128), random weights.
fn small_hybrid_spec() -> draftlens_engine::model::ModelSpec {
    use draftlens_engine::model::hybrid::{HybridSpec, LayerType};
    let base = draftlens_engine::model::random::qwen3_5_27b_spec();
    draftlens_engine::model::ModelSpec {
        vocab_size: 256,
        hidden_size: 256,
        intermediate_size: 512,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        max_position_embeddings: 1024,
        hybrid: Some(HybridSpec {
            layer_types: vec![
                LayerType::LinearAttention,
                LayerType::LinearAttention,
                LayerType::LinearAttention,
                LayerType::FullAttention,
            ],
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            rotary_dim: 16,
        }),
        ..base
    }
}

/// Last hidden states of a prefill of 147 tokens (two full chunks and 19 rows) and then three
/// one-token decode steps.
fn prefill_then_decode<B: Backend>(
    be: &B,
    model: &draftlens_engine::model::TargetModel<B>,
    ids: &[u32],
) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    [&ids[..147], &ids[147..148], &ids[148..149], &ids[149..]]
        .iter()
        .map(|part| {
            let o = model
                .forward(
                    be,
                    part,
                    &mut cache,
                    &draftlens_engine::model::Capture::default(),
                )
                .unwrap();
            be.to_host(&o.last_hidden).unwrap()
        })
        .collect()
}

#[test]
fn cuda_hybrid_model_prefill_and_decode_match_cpu() {
    use draftlens_engine::model::random::RandomWeights;
    use draftlens_engine::model::TargetModel;
    let spec = small_hybrid_spec();
    let src = RandomWeights::new(&spec, 17);
    let ids: Vec<u32> = (0..150u32).map(|i| (i * 37 + 11) % 256).collect();
    let cpu = CpuBackend::new();
    let want = prefill_then_decode(&cpu, &TargetModel::load(&cpu, &spec, &src).unwrap(), &ids);
    let Some(be) = gpu() else { return };
    let got = prefill_then_decode(&be, &TargetModel::load(&be, &spec, &src).unwrap(), &ids);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let e = rel(g, w);
        println!("hybrid model, call {i}: last hidden rel {e:.2e}");
        // bf16 weights and activations against f32 ones through 4 layers: docs/cuda.md bounds
        // dense forwards by 1.2e-2 + 3e-3·i (2.4e-2 after 4 layers); twice that leaves room for
        // the recurrence, whose state sees every rounded input. A wrong state carry, conv reset
        // or gate gives errors of order 1.
        assert!(e < 5e-2, "call {i}: rel {e}");
    }
}

/// The hybrids' elementwise and per-group kernels that have a faster form give their slower form's
/// bits: the zero-centred RMSNorm of groups of at most 256 columns one warp per group
/// (`gdn_rms_norm_zc_heads`, the gated attention's q/k heads) against one block per group, for
/// group sizes with and without whole warps, and the sigmoid output gate 8 values per thread
/// against one per thread (the same values in a tensor of one more column, which takes the
/// one-value kernel).
#[test]
fn cuda_hybrid_norm_and_gate_kernels_match_their_one_value_per_thread_forms_bit_for_bit() {
    let Some(be) = gpu() else { return };
    let bits = |t: &<CudaBackend as Backend>::Tensor| -> Vec<u32> {
        be.to_host(t).unwrap().iter().map(|v| v.to_bits()).collect()
    };
    for (group, heads, rows) in [(256, 24, 37), (128, 4, 5), (48, 3, 9), (16, 8, 200)] {
        let cols = group * heads;
        let x = be
            .from_host(&rand(rows * cols, 7, -3.0, 3.0), rows, cols)
            .unwrap();
        let w = be.from_host(&rand(group, 8, -0.5, 0.5), 1, group).unwrap();
        let warp = be
            .rms_norm_zero_centred_with(&x, &w, 1e-6, group, true)
            .unwrap();
        let block = be
            .rms_norm_zero_centred_with(&x, &w, 1e-6, group, false)
            .unwrap();
        assert!(
            bits(&warp) == bits(&block),
            "zero-centred norm, groups of {group}: the per-warp kernel differs from the per-block one"
        );
        // The trait method takes the per-warp kernel for these groups.
        let default = be.rms_norm_zero_centred(&x, &w, 1e-6, group).unwrap();
        assert!(
            bits(&default) == bits(&block),
            "groups of {group}: trait method"
        );
    }
    let n = 6144 * 5;
    let (xv, gv) = (rand(n + 1, 9, -4.0, 4.0), rand(n + 1, 10, -6.0, 6.0));
    let mut wide = be.from_host(&xv[..n], 5, 6144).unwrap();
    be.sigmoid_gate_inplace(&mut wide, &be.from_host(&gv[..n], 5, 6144).unwrap())
        .unwrap();
    let mut odd = be.from_host(&xv, 1, n + 1).unwrap();
    be.sigmoid_gate_inplace(&mut odd, &be.from_host(&gv, 1, n + 1).unwrap())
        .unwrap();
    assert!(
        bits(&wide)[..] == bits(&odd)[..n],
        "sigmoid gate: the 8-per-thread kernel differs from the one-per-thread kernel"
    );
}
