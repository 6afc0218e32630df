//! Gated DeltaNet on CUDA at Qwen3.6-27B shapes (Hk 16, Hv 48, dk = dv = 128, D 5120): the
//! chunked delta rule per kernel variant against its FLOP and byte floors, the batched decode
//! step against its byte floor, and one whole hybrid decoder layer (norm, projections, conv,
//! core, gated norm, out_proj, MLP). Random bf16 inputs generated on the device. Results in
//! docs/benchmarks-cuda.md.
//!
//! cargo build --release -p draftlens-engine --features kernel-lab --example gdn_bench
//! gdn_bench [--tokens N] [--seqs N] [--reps N] [--only NAME,NAME,...] [--breakdown] [--report]
//!
//! `--breakdown` prints only the two tables the tuning starts from (docs/gdn-cuda.md, "Where the
//! time goes"), in a few seconds: the delta rule per phase (every launch of the default and the
//! candidate kernels timed apart, the device synchronised after each) and the hybrid GDN layer per
//! op (each op timed alone, as a share of the whole layer). `--report` prints the kernels'
//! registers and spills.
//!
//! `--only` times just the chunked kernels whose names contain one of the given strings
//! (`--only Split,ThreePhase`: the split kernels against the three-phase ones).

use anyhow::{bail, Context, Result};
use draftlens_engine::backend::cuda::bench::time_median;
use draftlens_engine::backend::cuda::gdn::{
    set_phase_timing, take_phase_times, ChunkKernel, ConvKernel, CudaF32,
};
use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::backend::cuda::CudaTensor;
use draftlens_engine::backend::gdn::{GdnProfile, GdnShape};
use draftlens_engine::backend::{Backend, GdnParams, SeqStarts};

/// Qwen3.5 / 3.6-27B linear-attention sizes (config.json `linear_*` keys).
const SHAPE: GdnShape = GdnShape {
    k_heads: 16,
    v_heads: 48,
    k_dim: 128,
    v_dim: 128,
};
const HIDDEN: usize = 5120;
const INTER: usize = 17408;
const CONV_K: usize = 4;
/// Measured on this workplace's H200 (KINDS.md): dense bf16 GEMM and device copy.
const PEAK_FLOPS: f64 = 790e12;
const PEAK_BYTES: f64 = 4.3e12;

/// FLOPs of the chunked delta rule per token (docs/gdn-cuda.md): Hv · (2C(3dk + 2dv) + C² + 6·dk·dv).
fn core_flops_per_token() -> f64 {
    let (c, dk, dv) = (64.0, 128.0, 128.0);
    SHAPE.v_heads as f64 * (2.0 * c * (3.0 * dk + 2.0 * dv) + c * c + 6.0 * dk * dv)
}

fn main() -> Result<()> {
    let (mut tokens, mut seqs, mut reps) = (16384usize, 4usize, 10usize);
    let mut only: Vec<String> = Vec::new();
    let (mut breakdown, mut report) = (false, false);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = || -> Result<usize> { Ok(it.next().context("missing number")?.parse()?) };
        match a.as_str() {
            "--tokens" => tokens = num()?,
            "--seqs" => seqs = num()?,
            "--reps" => reps = num()?,
            "--breakdown" => breakdown = true,
            "--report" => report = true,
            "--only" => {
                only = it
                    .next()
                    .context("--only needs a comma-separated list of kernel names")?
                    .split(',')
                    .map(String::from)
                    .collect()
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let be = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            println!("{e}");
            std::process::exit(2);
        }
    };
    if !breakdown {
        println!("device: {}", be.info().name);
    }
    if report {
        for l in be.gdn_kernel_report()? {
            println!("  {l}");
        }
    }
    let hv = SHAPE.v_heads;
    let per = tokens / seqs;
    let seq_starts = SeqStarts::from_lengths(std::iter::repeat(per).take(seqs));
    let t = per * seqs;
    let qkv = be.random_tensor(t, SHAPE.conv_dim(), 0.5, 0.2, 1)?;
    let a = be.random_tensor(t, hv, 1.0, 0.0, 2)?;
    let b = be.random_tensor(t, hv, 1.5, 0.0, 3)?;
    let a_log = be.f32_from_host(
        &(0..hv)
            .map(|i| -4.0 + 4.0 * i as f32 / hv as f32)
            .collect::<Vec<_>>(),
    )?;
    let dt_bias = be.f32_from_host(&vec![0.5; hv])?;
    let mut states: Vec<CudaF32> = (0..seqs)
        .map(|_| be.f32_from_host(&vec![0.0; SHAPE.state_len()]))
        .collect::<Result<_>>()?;

    if breakdown {
        let inputs = DeltaInputs {
            qkv: &qkv,
            a: &a,
            b: &b,
            a_log: &a_log,
            dt_bias: &dt_bias,
            seq_starts: &seq_starts,
        };
        phase_table(&be, &inputs, &mut states, reps, &only)?;
        layer_breakdown(&be, &inputs, &mut states, reps)?;
        return Ok(());
    }

    // ---- chunked core per kernel variant
    let flops = core_flops_per_token() * t as f64;
    // Bytes: qkv read, output written (bf16), a and b read, states read + written (f32).
    let bytes = (t * (SHAPE.conv_dim() + SHAPE.value_dim() + 2 * hv) * 2
        + 2 * seqs * SHAPE.state_len() * 4) as f64;
    let floor = (flops / PEAK_FLOPS).max(bytes / PEAK_BYTES);
    println!(
        "\nchunked delta rule, {seqs} x {per} tokens, Hk {} Hv {hv}: {:.1} GFLOP, {:.0} MB, floor {:.3} ms",
        SHAPE.k_heads,
        flops / 1e9,
        bytes / 1e6,
        floor * 1e3
    );
    let mut best_engine = (f64::INFINITY, ChunkKernel::for_profile(GdnProfile::Engine));
    println!("| kernel | ms | TFLOP/s | x floor |");
    println!("|---|---|---|---|");
    for kernel in [
        ChunkKernel::ReferenceFma,
        ChunkKernel::ReferenceFmaV64,
        ChunkKernel::EngineFma,
        ChunkKernel::EngineMma,
        ChunkKernel::EngineMmaV64,
        ChunkKernel::SplitReference,
        ChunkKernel::SplitEngineFma,
        ChunkKernel::SplitEngineMma,
        ChunkKernel::ThreePhaseReference,
        ChunkKernel::ThreePhaseEngine,
        ChunkKernel::ThreePhaseReferenceV16,
        ChunkKernel::ThreePhaseEngineV16,
        ChunkKernel::ThreePhaseEngineLdm,
        ChunkKernel::ThreePhaseReferenceRt,
        ChunkKernel::ThreePhaseEngineTc,
    ] {
        let name = format!("{kernel:?}");
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let params = GdnParams::<CudaBackend> {
            a_log: &a_log,
            dt_bias: &dt_bias,
            shape: SHAPE,
            profile: GdnProfile::Engine,
        };
        let secs = time_median(&be, 2, reps, || {
            let mut refs: Vec<&mut CudaF32> = states.iter_mut().collect();
            be.gated_delta_rule_with((&qkv, &a, &b), &params, &seq_starts, &mut refs, kernel)
                .map(|_| ())
        })?;
        if kernel.engine() && secs < best_engine.0 {
            best_engine = (secs, kernel);
        }
        println!(
            "| {kernel:?} | {:.3} | {:.1} | {:.1} |",
            secs * 1e3,
            flops / secs / 1e12,
            secs / floor
        );
    }

    // ---- batched decode step (recurrent kernel): bytes floor = states read + written
    for batch in [1usize, 16, 64] {
        let q1 = be.random_tensor(batch, SHAPE.conv_dim(), 0.5, 0.2, 4)?;
        let a1 = be.random_tensor(batch, hv, 1.0, 0.0, 5)?;
        let b1 = be.random_tensor(batch, hv, 1.5, 0.0, 6)?;
        let mut st: Vec<CudaF32> = (0..batch)
            .map(|_| be.f32_from_host(&vec![0.01; SHAPE.state_len()]))
            .collect::<Result<_>>()?;
        let starts = SeqStarts::each_row(batch);
        let params = GdnParams::<CudaBackend> {
            a_log: &a_log,
            dt_bias: &dt_bias,
            shape: SHAPE,
            profile: GdnProfile::Reference,
        };
        let secs = time_median(&be, 3, reps * 5, || {
            let mut refs: Vec<&mut CudaF32> = st.iter_mut().collect();
            be.gated_delta_rule(&q1, &a1, &b1, &params, &starts, &mut refs)
                .map(|_| ())
        })?;
        let bytes = (2 * batch * SHAPE.state_len() * 4) as f64;
        println!(
            "decode step, {batch} sequences: {:.1} us, state traffic {:.1} MB, {:.2} TB/s ({:.1}x the byte floor)",
            secs * 1e6,
            bytes / 1e6,
            bytes / secs / 1e12,
            secs / (bytes / PEAK_BYTES)
        );
    }

    // ---- one whole hybrid decoder layer (Engine profile), residual stream h [t, D]
    let w = |o: usize, i: usize, seed: u64| be.random_matrix(o, i, 0.02, seed);
    let (w_qkv, w_z, w_b, w_a, w_out) = (
        w(SHAPE.conv_dim(), HIDDEN, 10)?,
        w(SHAPE.value_dim(), HIDDEN, 11)?,
        w(hv, HIDDEN, 12)?,
        w(hv, HIDDEN, 13)?,
        w(HIDDEN, SHAPE.value_dim(), 14)?,
    );
    let (w_gu, w_down) = (w(2 * INTER, HIDDEN, 15)?, w(HIDDEN, INTER, 16)?);
    let conv_w = be.random_tensor(SHAPE.conv_dim(), CONV_K, 0.3, 0.0, 17)?;
    let (n_in, n_post) = (
        be.random_tensor(1, HIDDEN, 0.1, 0.0, 18)?,
        be.random_tensor(1, HIDDEN, 0.1, 0.0, 19)?,
    );
    let n_gate = be.random_tensor(1, SHAPE.v_dim, 0.1, 1.0, 20)?;
    let mut h = be.random_tensor(t, HIDDEN, 1.0, 0.0, 21)?;
    let mut conv_states: Vec<_> = (0..seqs)
        .map(|_| be.random_tensor(CONV_K - 1, SHAPE.conv_dim(), 0.5, 0.0, 22))
        .collect::<Result<_>>()?;
    let params = GdnParams::<CudaBackend> {
        a_log: &a_log,
        dt_bias: &dt_bias,
        shape: SHAPE,
        profile: GdnProfile::Engine,
    };
    let mut mixer_secs = 0.0;
    let layer_secs = time_median(&be, 1, reps, || {
        let t0 = std::time::Instant::now();
        let x = be.rms_norm_zero_centred(&h, &n_in, 1e-6, HIDDEN)?;
        let mixed = be.matmul(&x, &w_qkv)?;
        let z = be.matmul(&x, &w_z)?;
        let (bb, aa) = (be.matmul(&x, &w_b)?, be.matmul(&x, &w_a)?);
        let mut cs: Vec<_> = conv_states.iter_mut().collect();
        let y = be.causal_conv1d_silu(&mixed, &conv_w, &seq_starts, &mut cs)?;
        let mut refs: Vec<&mut CudaF32> = states.iter_mut().collect();
        let o = be.gated_delta_rule_with(
            (&y, &aa, &bb),
            &params,
            &seq_starts,
            &mut refs,
            best_engine.1,
        )?;
        let o = be.gated_rms_norm(&o, &z, &n_gate, 1e-6, SHAPE.v_dim)?;
        be.matmul_acc(&o, &w_out, &mut h)?;
        be.synchronize()?;
        mixer_secs = t0.elapsed().as_secs_f64();
        let x = be.rms_norm_zero_centred(&h, &n_post, 1e-6, HIDDEN)?;
        let gu = be.matmul(&x, &w_gu)?;
        let act = be.swiglu_packed(&gu)?;
        be.matmul_acc(&act, &w_down, &mut h)
    })?;
    let lin = 2.0
        * t as f64
        * (HIDDEN * (SHAPE.conv_dim() + SHAPE.value_dim() + 2 * hv)
            + SHAPE.value_dim() * HIDDEN
            + 3 * HIDDEN * INTER) as f64;
    let layer_flops = lin + flops;
    println!(
        "\nhybrid GDN decoder layer ({:?}), {t} tokens: {:.2} ms ({:.0} TFLOP/s over {:.2} TFLOP, floor {:.2} ms); \
         mixer part (last rep, synchronised) {:.2} ms",
        best_engine.1,
        layer_secs * 1e3,
        layer_flops / layer_secs / 1e12,
        layer_flops / 1e12,
        layer_flops / PEAK_FLOPS * 1e3,
        mixer_secs * 1e3
    );
    Ok(())
}

/// The delta rule's inputs at the benchmark's shapes.
struct DeltaInputs<'a> {
    qkv: &'a CudaTensor,
    a: &'a CudaTensor,
    b: &'a CudaTensor,
    a_log: &'a CudaF32,
    dt_bias: &'a CudaF32,
    seq_starts: &'a SeqStarts,
}

/// Phases in the order the delta rule launches them (`set_phase_timing`'s names).
const PHASES: [&str; 6] = ["gates", "setup", "prep", "walk", "output", "chunk"];

/// The chunked delta rule per launch: median over `reps` calls of each phase's time (device
/// synchronised after every launch, so the sum is a little above the unsynchronised total).
fn phase_table(
    be: &CudaBackend,
    d: &DeltaInputs<'_>,
    states: &mut [CudaF32],
    reps: usize,
    only: &[String],
) -> Result<()> {
    let t = *d.seq_starts.last().unwrap_or(&0);
    println!(
        "delta rule per phase on {}, {} x {} tokens (ms, median of {reps}; device synchronised after each launch)",
        be.info().name,
        d.seq_starts.len() - 1,
        t / (d.seq_starts.len() - 1).max(1)
    );
    println!("| kernel | gates | setup | prep | walk | output | sum | unsynchronised total |");
    println!("|---|---|---|---|---|---|---|---|");
    for kernel in PHASE_KERNELS {
        let name = format!("{kernel:?}");
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let params = GdnParams::<CudaBackend> {
            a_log: d.a_log,
            dt_bias: d.dt_bias,
            shape: SHAPE,
            profile: if kernel.engine() {
                GdnProfile::Engine
            } else {
                GdnProfile::Reference
            },
        };
        let mut run = || -> Result<()> {
            let mut refs: Vec<&mut CudaF32> = states.iter_mut().collect();
            be.gated_delta_rule_with((d.qkv, d.a, d.b), &params, d.seq_starts, &mut refs, *kernel)
                .map(|_| ())
        };
        let total = time_median(be, 1, reps, &mut run)?;
        set_phase_timing(true);
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
        for _ in 0..reps {
            run()?;
            let mut sums = [0.0; PHASES.len()];
            for (phase, secs) in take_phase_times() {
                if let Some(i) = PHASES.iter().position(|p| *p == phase) {
                    sums[i] += secs;
                }
            }
            for (v, s) in per.iter_mut().zip(sums) {
                v.push(s);
            }
        }
        set_phase_timing(false);
        let med: Vec<f64> = per.iter_mut().map(|v| median(v)).collect();
        // The fused kernels' single launch counts as their walk.
        let walk = med[3] + med[5];
        println!(
            "| {kernel:?} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            med[0] * 1e3,
            med[1] * 1e3,
            med[2] * 1e3,
            walk * 1e3,
            med[4] * 1e3,
            med.iter().sum::<f64>() * 1e3,
            total * 1e3
        );
    }
    Ok(())
}

/// The kernels of the per-phase table: the defaults of the two profiles and the candidates.
const PHASE_KERNELS: &[ChunkKernel] = &[
    ChunkKernel::ThreePhaseReference,
    ChunkKernel::ThreePhaseReferenceRt,
    ChunkKernel::ThreePhaseEngine,
    ChunkKernel::ThreePhaseEngineLdm,
    ChunkKernel::ThreePhaseEngineTc,
    ChunkKernel::SplitReference,
    ChunkKernel::SplitEngineFma,
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One hybrid GDN decoder layer as `crates/engine/src/model/gdn.rs` runs it (one fused in_proj
/// GEMM, then split_cols), each op timed alone (median of `reps`, device synchronised), as a
/// share of the whole layer timed the same way.
fn layer_breakdown(
    be: &CudaBackend,
    d: &DeltaInputs<'_>,
    states: &mut [CudaF32],
    reps: usize,
) -> Result<()> {
    let t = *d.seq_starts.last().unwrap_or(&0);
    let hv = SHAPE.v_heads;
    let seqs = d.seq_starts.len() - 1;
    let in_cols = SHAPE.conv_dim() + SHAPE.value_dim() + 2 * hv;
    let w_in = be.random_matrix(in_cols, HIDDEN, 0.02, 10)?;
    let w_out = be.random_matrix(HIDDEN, SHAPE.value_dim(), 0.02, 14)?;
    let w_gu = be.random_matrix(2 * INTER, HIDDEN, 0.02, 15)?;
    let w_down = be.random_matrix(HIDDEN, INTER, 0.02, 16)?;
    let conv_w = be.random_tensor(SHAPE.conv_dim(), CONV_K, 0.3, 0.0, 17)?;
    let n_in = be.random_tensor(1, HIDDEN, 0.1, 0.0, 18)?;
    let n_post = be.random_tensor(1, HIDDEN, 0.1, 0.0, 19)?;
    let n_gate = be.random_tensor(1, SHAPE.v_dim, 0.1, 1.0, 20)?;
    let mut h = be.random_tensor(t, HIDDEN, 1.0, 0.0, 21)?;
    let mut conv_states: Vec<_> = (0..seqs)
        .map(|_| be.random_tensor(CONV_K - 1, SHAPE.conv_dim(), 0.5, 0.0, 22))
        .collect::<Result<_>>()?;
    // The model's default profile (model/gdn.rs) and the engine one, each with its default kernel.
    let params = |profile| GdnParams::<CudaBackend> {
        a_log: d.a_log,
        dt_bias: d.dt_bias,
        shape: SHAPE,
        profile,
    };
    let (p_ref, p_eng) = (params(GdnProfile::Reference), params(GdnProfile::Engine));

    // Intermediates, computed once, for the ops timed alone.
    let x = be.rms_norm_zero_centred(&h, &n_in, 1e-6, HIDDEN)?;
    let proj = be.matmul(&x, &w_in)?;
    let parts = be.split_cols(&proj, &[SHAPE.conv_dim(), SHAPE.value_dim(), hv, hv])?;
    let (mixed, z, bb, aa) = (&parts[0], &parts[1], &parts[2], &parts[3]);
    let y = {
        let mut cs: Vec<_> = conv_states.iter_mut().collect();
        be.causal_conv1d_silu(mixed, &conv_w, d.seq_starts, &mut cs)?
    };
    let o = {
        let mut refs: Vec<&mut CudaF32> = states.iter_mut().collect();
        be.gated_delta_rule(&y, aa, bb, &p_ref, d.seq_starts, &mut refs)?
    };
    let on = be.gated_rms_norm(&o, z, &n_gate, 1e-6, SHAPE.v_dim)?;
    let x2 = be.rms_norm_zero_centred(&h, &n_post, 1e-6, HIDDEN)?;
    let gu = be.matmul(&x2, &w_gu)?;
    let act = be.swiglu_packed(&gu)?;

    let time = |f: &mut dyn FnMut() -> Result<()>| time_median(be, 1, reps, f);
    let mut rows: Vec<(&str, f64)> = Vec::new();
    rows.push((
        "input norm (zero-centred RMSNorm)",
        time(&mut || {
            be.rms_norm_zero_centred(&h, &n_in, 1e-6, HIDDEN)
                .map(|_| ())
        })?,
    ));
    rows.push((
        "in_proj GEMM (qkv, z, b, a)",
        time(&mut || be.matmul(&x, &w_in).map(|_| ()))?,
    ));
    rows.push((
        "split_cols (copies)",
        time(&mut || {
            be.split_cols(&proj, &[SHAPE.conv_dim(), SHAPE.value_dim(), hv, hv])
                .map(|_| ())
        })?,
    ));
    // The three conv kernels (the same bits) timed in turn twice, the second round counting: in
    // session 9 whichever was timed first ran 4-10 % slower, which decided nothing.
    let mut conv = |kernel: ConvKernel| {
        time(&mut || {
            let mut cs: Vec<_> = conv_states.iter_mut().collect();
            be.causal_conv1d_silu_with(mixed, &conv_w, d.seq_starts, &mut cs, kernel)
                .map(|_| ())
        })
    };
    let kernels = [ConvKernel::Rows, ConvKernel::OneChannel, ConvKernel::V8];
    for k in kernels {
        conv(k)?;
    }
    let conv_times = kernels
        .iter()
        .map(|&k| conv(k).map(|t| (k, t)))
        .collect::<Result<Vec<_>>>()?;
    rows.push((
        "conv1d + SiLU (+ conv states; default kernel Rows)",
        conv_times[0].1,
    ));
    let mut rule = |p| {
        time(&mut || {
            let mut refs: Vec<&mut CudaF32> = states.iter_mut().collect();
            be.gated_delta_rule(&y, aa, bb, p, d.seq_starts, &mut refs)
                .map(|_| ())
        })
    };
    rows.push((
        "delta rule (Reference, default kernel; gates + l2norm inside)",
        rule(&p_ref)?,
    ));
    let engine_rule = rule(&p_eng)?;
    rows.push((
        "gated RMSNorm (z)",
        time(&mut || {
            be.gated_rms_norm(&o, z, &n_gate, 1e-6, SHAPE.v_dim)
                .map(|_| ())
        })?,
    ));
    rows.push((
        "out_proj GEMM (+= h)",
        time(&mut || be.matmul_acc(&on, &w_out, &mut h))?,
    ));
    let mixer_rows = rows.len();
    rows.push((
        "post norm (zero-centred RMSNorm)",
        time(&mut || {
            be.rms_norm_zero_centred(&h, &n_post, 1e-6, HIDDEN)
                .map(|_| ())
        })?,
    ));
    rows.push((
        "gate_up GEMM",
        time(&mut || be.matmul(&x2, &w_gu).map(|_| ()))?,
    ));
    rows.push(("SwiGLU", time(&mut || be.swiglu_packed(&gu).map(|_| ()))?));
    rows.push((
        "down GEMM (+= h)",
        time(&mut || be.matmul_acc(&act, &w_down, &mut h))?,
    ));
    drop((x, proj, parts, y, o, on, x2, gu, act));

    let layer = time(&mut || {
        let x = be.rms_norm_zero_centred(&h, &n_in, 1e-6, HIDDEN)?;
        let proj = be.matmul(&x, &w_in)?;
        let parts = be.split_cols(&proj, &[SHAPE.conv_dim(), SHAPE.value_dim(), hv, hv])?;
        drop(proj);
        let mut cs: Vec<_> = conv_states.iter_mut().collect();
        let y = be.causal_conv1d_silu(&parts[0], &conv_w, d.seq_starts, &mut cs)?;
        let mut refs: Vec<&mut CudaF32> = states.iter_mut().collect();
        let o = be.gated_delta_rule(&y, &parts[3], &parts[2], &p_ref, d.seq_starts, &mut refs)?;
        let o = be.gated_rms_norm(&o, &parts[1], &n_gate, 1e-6, SHAPE.v_dim)?;
        be.matmul_acc(&o, &w_out, &mut h)?;
        let x = be.rms_norm_zero_centred(&h, &n_post, 1e-6, HIDDEN)?;
        let gu = be.matmul(&x, &w_gu)?;
        let act = be.swiglu_packed(&gu)?;
        be.matmul_acc(&act, &w_down, &mut h)
    })?;
    let lin = 2.0
        * t as f64
        * (HIDDEN * in_cols + SHAPE.value_dim() * HIDDEN + 3 * HIDDEN * INTER) as f64;
    let floor = (lin + core_flops_per_token() * t as f64) / PEAK_FLOPS;
    println!(
        "\nhybrid GDN layer per op, {t} tokens ({seqs} sequences), Reference profile: whole layer {:.2} ms, floor {:.2} ms",
        layer * 1e3,
        floor * 1e3
    );
    println!("| op | ms | % of layer |");
    println!("|---|---|---|");
    let pct = |s: f64| 100.0 * s / layer;
    for (i, (name, s)) in rows.iter().enumerate() {
        println!("| {name} | {:.3} | {:.1} |", s * 1e3, pct(*s));
        if i + 1 == mixer_rows {
            let m: f64 = rows[..mixer_rows].iter().map(|r| r.1).sum();
            let gemm = rows[1].1 + rows[mixer_rows - 1].1;
            let rule = rows[4].1;
            println!(
                "| **mixer (sum of the rows above)** | {:.3} | {:.1} |",
                m * 1e3,
                pct(m)
            );
            println!(
                "| **mixer, neither GEMM nor delta rule** | {:.3} | {:.1} |",
                (m - gemm - rule) * 1e3,
                pct(m - gemm - rule)
            );
        }
    }
    let all: f64 = rows.iter().map(|r| r.1).sum();
    println!(
        "| **sum of the ops** | {:.3} | {:.1} |",
        all * 1e3,
        pct(all)
    );
    println!(
        "| (delta rule, Engine profile instead, default kernel) | {:.3} | {:.1} |",
        engine_rule * 1e3,
        pct(engine_rule)
    );
    for (k, t) in &conv_times[1..] {
        println!(
            "| (conv1d + SiLU, kernel {k:?} instead) | {:.3} | {:.1} |",
            t * 1e3,
            pct(*t)
        );
    }
    Ok(())
}
