//! CUDA benchmarks (docs/benchmarks-cuda.md): measured ceilings, attention kernels A/B, GEMM paths
//! per shape, and the product's own code at Qwen3-8B shapes with random weights: hidden-state
//! extraction through `TargetModel::forward_packed` (what `extract` and `run` execute; the previous
//! GEMM/attention configuration and the current one in the same call), a packed mix of prompt
//! lengths, and `DFlashDrafter` scoring from a random z-lab checkpoint. Prints a table and writes
//! every figure as JSON.
//!
//! cargo build --release -p draftlens-engine --features kernel-lab --example cuda_bench
//! cuda_bench [--out results.json] [--mix lengths.txt] [--forwards N] [--quick]
//!            [--only ceilings,attention,attention256,gemm,extract,mix,drafter,decode,target,lm-head]
//!            [--only attention-wgmma]  (the opt-in wgmma flash attention against flash_attention2_hd128)
//! (every section but `decode`, `target`, `attention256`, `attention-wgmma` and `lm-head` by default; `--only decode` runs
//! crates/engine/src/backend/cuda/bench_decode.rs; `attention256` is the A/B at the hybrids' head dim 256;
//! `lm-head` the fused LM-head top-K against the unfused one, bench_lm_head.rs)
//! Environment: `TARGET_DEFAULTS_ONLY=1` runs `--only target` with the default kernels only (no
//! A/B rows); `DECODE_SECTIONS`, `DECODE_ALONE` and `DECODE_ATTN_BLOCKS` shape `--only decode`
//! (bench_decode.rs).

use anyhow::{bail, Context, Result};
use draftlens_engine::backend::cuda::bench::{
    copy_bandwidth, gemm_tflops, time_median, with_clock_samples,
};
use draftlens_engine::backend::cuda::{CudaBackend, GemmMode};
use draftlens_engine::backend::{AttnShape, Backend, QkNorm, SeqStarts};
use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
use draftlens_engine::drafter::{DFlashDrafter, DraftOptions};
use draftlens_engine::model::random::{qwen3_8b_spec, RandomWeights};
use draftlens_engine::model::transformer::{Attention, Mixer};
use draftlens_engine::model::{Capture, ModelSpec, TargetModel};
use serde_json::json;
use std::time::Instant;

const SECTIONS: [&str; 12] = [
    "target",
    "attention-wgmma",
    "gemm-sustained",
    "ceilings",
    "attention",
    "attention256",
    "gemm",
    "extract",
    "mix",
    "drafter",
    "decode",
    "lm-head",
];

struct Args {
    out: Option<String>,
    /// `--target DIR`: the `target` section's model folder (a Hugging Face folder or GGUF file).
    target: Option<String>,
    /// `--target-seqs N×S`: sequences packed per forward in the `target` section (default 4×4096).
    target_seqs: (usize, usize),
    mix: Option<String>,
    reps: usize,
    quick: bool,
    only: Vec<String>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        out: None,
        target: None,
        target_seqs: (4, 4096),
        mix: None,
        reps: 5,
        quick: false,
        // `decode` (≈ 3 min: a 36-layer model load and 64 × 128 tokens one at a time),
        // `target` (needs --target), `attention256` and `gemm-sustained` only on request.
        only: SECTIONS
            .iter()
            .filter(|s| {
                !matches!(
                    **s,
                    "decode"
                        | "target"
                        | "attention256"
                        | "attention-wgmma"
                        | "gemm-sustained"
                        | "lm-head"
                )
            })
            .map(|s| s.to_string())
            .collect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--out" => a.out = Some(it.next().context("--out needs a path")?),
            "--target" => a.target = Some(it.next().context("--target needs a path")?),
            "--target-seqs" => {
                let v = it.next().context("--target-seqs needs N×S, e.g. 4x4096")?;
                let (n, l) = v
                    .split_once(['x', '×'])
                    .context("--target-seqs: expected N×S, e.g. 4x4096")?;
                a.target_seqs = (n.parse()?, l.parse()?);
            }
            "--mix" => a.mix = Some(it.next().context("--mix needs a path")?),
            "--forwards" => a.reps = it.next().context("--forwards needs a number")?.parse()?,
            "--quick" => a.quick = true,
            "--only" => {
                let v = it.next().context("--only needs a comma-separated list")?;
                a.only = v.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = a.only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    bail!(
                        "--only: unknown section {bad} (known: {})",
                        SECTIONS.join(",")
                    );
                }
            }
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// Random token ids (never zeros, never one repeated id).
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    draftlens_engine::util::host_random(n, seed)
        .into_iter()
        .map(|x| (((x + 1.0) * 0.5) * (vocab - 1) as f32) as u32)
        .collect()
}

/// The configuration measured before this change (issue 6, first benchmarks): 64-row attention
/// kernel, `cublasGemmEx`.
fn old_config(be: &CudaBackend) -> Result<()> {
    be.set_attention_v1(true);
    be.set_gemm_mode(GemmMode::GemmEx)
}

/// The current default: flash_attention2, cuBLASLt with per-shape tuning.
fn new_config(be: &CudaBackend) -> Result<()> {
    be.set_attention_v1(false);
    be.set_gemm_mode(GemmMode::LtTuned)
}

fn main() -> Result<()> {
    let a = args()?;
    let has = |s: &str| a.only.iter().any(|x| x == s);
    let be = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            println!("{e}");
            std::process::exit(2);
        }
    };
    let info = be.info().clone();
    println!(
        "device: {} sm_{}{} {} SMs {:.1} GiB driver {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.total_mem_bytes as f64 / (1u64 << 30) as f64,
        info.driver_version
    );
    for l in be.kernel_report()? {
        println!("  {l}");
    }
    println!("kernel compile + load: {:.2} s", be.kernel_compile_secs());
    let mut results = serde_json::Map::new();
    results.insert("device".into(), json!(info));

    // ---- ceilings: cuBLAS bf16 GEMM (both paths; the higher is the peak), copy bandwidth
    let mut peak = 790.0;
    if has("ceilings") {
        be.set_gemm_mode(GemmMode::GemmEx)?;
        let peak_ex = gemm_tflops(&be, 8192, 8192, 8192)?;
        be.set_gemm_mode(GemmMode::LtTuned)?;
        let peak_lt = gemm_tflops(&be, 8192, 8192, 8192)?;
        peak = peak_ex.max(peak_lt);
        let peak_16k = gemm_tflops(&be, 16384, 4096, 4096)?;
        let bw = copy_bandwidth(&be, 4 << 30)?;
        println!("cuBLAS bf16 GEMM 8192^3: GemmEx {peak_ex:.0}, cuBLASLt tuned {peak_lt:.0} TFLOP/s (peak {peak:.0}); [16384,4096]x[4096,4096] (Lt): {peak_16k:.0} TFLOP/s; D2D copy {:.2} TB/s", bw / 1e12);
        results.insert("ceilings".into(), json!({"gemm_8192_tflops": peak, "gemm_8192_gemmex_tflops": peak_ex, "gemm_8192_lt_tuned_tflops": peak_lt,
            "gemm_16384x4096x4096_tflops": peak_16k, "copy_tb_s": bw / 1e12}));
    } else {
        println!("(ceilings not measured: peak taken as {peak} TFLOP/s)");
    }

    // ---- target: the product's forward on a real model folder (any architecture draftlens loads,
    // hybrids under both Gated DeltaNet profiles), against the compute floor of its FLOP count.
    if has("target") {
        let dir = a
            .target
            .as_deref()
            .context("the target section needs --target DIR")?;
        let r = bench_target(&be, std::path::Path::new(dir), a.target_seqs, a.reps, peak)?;
        results.insert("target".into(), r);
    }

    // ---- attention-wgmma: the opt-in wgmma flash attention against flash_attention2_hd128, one
    // layer's packed causal attention per length (docs/cuda.md, "wgmma flash attention (opt-in)").
    if has("attention-wgmma") {
        results.insert("attention_wgmma".into(), attention_wgmma_ab(&be, a.reps)?);
    }

    // ---- gemm-sustained: does the tuner's burst ranking of cuBLASLt candidates hold under the
    // sustained load of a forward (the card runs at its power limit there)?
    if has("gemm-sustained") {
        results.insert("gemm_sustained".into(), gemm_sustained(&be)?);
    }

    let spec = ModelSpec {
        num_layers: if a.quick { 4 } else { 36 },
        ..qwen3_8b_spec()
    };
    let layers = spec.num_layers;
    let attn_shape = AttnShape {
        heads: spec.num_heads,
        kv_heads: spec.num_kv_heads,
        head_dim: spec.head_dim,
    };
    let (seq, nseq) = (4096usize, 4usize);
    let starts = SeqStarts::from_lengths(std::iter::repeat(seq).take(nseq));
    let n = seq * nseq;
    let flops = spec.prefill_flops_per_token(seq) * n as f64;
    let gemm_flops = 2.0 * (spec.layer_linear_params() * layers * n) as f64;
    let attn_flops = flops - gemm_flops;

    // ---- attention kernels A/B at the extraction shape (one launch per layer = one forward's attention)
    if has("attention") {
        results.insert("attention".into(), attention_ab(&be, &spec, nseq, seq)?);
    }
    // ---- the same at the hybrids' gated-attention shape: Qwen3.6-27B's 16 full-attention layers
    // (24 query / 4 KV heads of head dim 256), flash_attention_hd256 against flash_attention2_hd256.
    if has("attention256") {
        let gated = ModelSpec {
            num_layers: if a.quick { 4 } else { 16 },
            num_heads: 24,
            num_kv_heads: 4,
            head_dim: 256,
            ..qwen3_8b_spec()
        };
        results.insert("attention256".into(), attention_ab(&be, &gated, nseq, seq)?);
    }

    // ---- GEMM rate per projection shape at 16 384 rows, each path
    if has("gemm") {
        let mut shapes = serde_json::Map::new();
        for (name, nout, kin) in [
            ("q/o", 4096, 4096),
            ("k/v", 1024, 4096),
            ("qkv fused", 6144, 4096),
            ("gate/up", 12288, 4096),
            ("gate|up fused", 24576, 4096),
            ("down", 4096, 12288),
        ] {
            let mut row = serde_json::Map::new();
            let mut line = format!("  GEMM [{n} x {kin}] x [{nout} x {kin}]^T ({name}):");
            for mode in [GemmMode::GemmEx, GemmMode::LtHeuristic, GemmMode::LtTuned] {
                be.set_gemm_mode(mode)?;
                let r = gemm_tflops(&be, n, nout, kin)?;
                line += &format!(" {mode:?} {r:.0}");
                row.insert(format!("{mode:?}"), json!(r));
            }
            println!("{line} TFLOP/s");
            shapes.insert(name.into(), serde_json::Value::Object(row));
        }
        results.insert(
            "gemm_shapes_tflops".into(),
            serde_json::Value::Object(shapes),
        );
    }

    // ---- decode: the batch-invariant decode GEMM and greedy generation (bench_decode.rs)
    if has("decode") {
        let d = draftlens_engine::backend::cuda::bench_decode::run(&be, a.quick)?;
        results.insert("decode".into(), d);
    }

    // ---- lm-head: the fused LM-head top-K against the unfused one (bench_lm_head.rs)
    if has("lm-head") {
        let r = draftlens_engine::backend::cuda::bench_lm_head::run(&be)?;
        results.insert("lm_head".into(), r);
    }

    let need_model = has("extract") || has("mix") || has("drafter");
    if !need_model {
        return finish(&be, &a, results);
    }
    // The product's target, loaded through the normal `WeightSource` route (random Qwen3-8B-shaped
    // weights: speed does not depend on the values).
    new_config(&be)?;
    let t0 = Instant::now();
    let model = TargetModel::load(&be, &spec, &RandomWeights::new(&spec, 42))?;
    be.synchronize()?;
    let load_s = t0.elapsed().as_secs_f64();
    println!("TargetModel::load of random Qwen3-8B-shaped weights ({layers} layers, generated on the host): {load_s:.1} s");
    let taps_hf: Vec<usize> = [2usize, 10, 18, 26, 34].map(|t| t.min(layers)).to_vec();
    let capture = Capture::hf_indices(taps_hf.clone(), layers)?;
    let toks = ids(n, spec.vocab_size, 7);
    let tok_s = |t: f64| n as f64 / t;
    let rate = |t: f64| flops / t / 1e12;
    let floor_s = flops / (peak * 1e12);
    let last_tap = |be: &CudaBackend| -> Result<Vec<f32>> {
        let o = model.forward_packed(be, &toks, &starts, &capture)?;
        be.to_host(
            o.captured
                .get(*taps_hf.last().expect("taps"))
                .expect("captured"),
        )
    };

    // ---- extraction, Qwen3-8B, 4 × 4096 tokens per forward, 5 DFlash taps
    if has("extract") {
        // Previous configuration, then the current one, same weights and tokens, same call.
        old_config(&be)?;
        let t_old = time_median(&be, 1, a.reps, || {
            model
                .forward_packed(&be, &toks, &starts, &capture)
                .map(|_| ())
        })?;
        let ref_last = last_tap(&be)?;
        new_config(&be)?;
        let t_new = time_median(&be, 1, a.reps, || {
            model
                .forward_packed(&be, &toks, &starts, &capture)
                .map(|_| ())
        })?;
        let d_new = draftlens_engine::parity::diff(&ref_last, &last_tap(&be)?);
        let line = |name: &str, t: f64| {
            println!(
                "extract {name}: {t:.3} s/forward, {:.0} tok/s, {:.1} s per 1M tokens, {:.0} TFLOP/s = {:.1}% of the compute floor ({floor_s:.3} s at {peak:.0})",
                tok_s(t),
                1e6 * t / n as f64,
                rate(t),
                100.0 * floor_s / t
            )
        };
        line(
            "TargetModel::forward_packed, previous config (attention v1, cublasGemmEx)",
            t_old,
        );
        line(
            "TargetModel::forward_packed, current (attention v2, cuBLASLt tuned)",
            t_new,
        );
        println!(
            "  current vs previous config, last tap: rel {:.2e}, max {:.2e}; speed-up {:.3}x",
            d_new.rel_l2,
            d_new.max_abs,
            t_old / t_new
        );
        // Where the forward's time goes: each part alone, once per layer, at the same shapes,
        // every layer's own weights.
        let breakdown = {
            let d = spec.hidden_size;
            let qkvw = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim;
            let x = be.random_tensor(n, d, 1.0, 0.0, 21)?;
            let a_in = be.random_tensor(n, spec.num_heads * spec.head_dim, 1.0, 0.0, 22)?;
            let m_in = be.random_tensor(n, spec.intermediate_size, 1.0, 0.0, 23)?;
            let mut hacc = be.random_tensor(n, d, 1.0, 0.0, 24)?;
            let mut qkv_t = be.random_tensor(n, qkvw, 1.0, 0.0, 25)?;
            let gu_t = be.random_tensor(n, 2 * spec.intermediate_size, 1.0, 0.0, 26)?;
            let positions = draftlens_engine::util::packed_positions(&starts);
            // Every layer of this dense target is softmax attention.
            let attns: Vec<&Attention<CudaBackend>> = model
                .layers
                .iter()
                .map(|l| match &l.mixer {
                    Mixer::Attention(a) => Ok(a),
                    Mixer::Gdn(_) => bail!("a dense Qwen3 has no Gated DeltaNet layer"),
                })
                .collect::<Result<_>>()?;
            let rope = spec.rope();
            let (qn, kn) = (
                attns[0].q_norm.as_ref().context("Qwen3 has q_norm")?,
                attns[0].k_norm.as_ref().context("Qwen3 has k_norm")?,
            );
            let mut parts: Vec<(&str, f64, f64)> = vec![]; // (name, s, flops or bytes per forward)
            let t = time_median(&be, 1, 3, || {
                for att in &attns {
                    be.matmul(&x, &att.qkv_proj)?;
                }
                Ok(())
            })?;
            parts.push(("GEMM qkv (fused)", t, 2.0 * (n * qkvw * d * layers) as f64));
            let t = time_median(&be, 1, 3, || {
                for att in &attns {
                    be.matmul_acc(&a_in, &att.o_proj, &mut hacc)?;
                }
                Ok(())
            })?;
            parts.push(("GEMM o (+= residual)", t, 2.0 * (n * d * d * layers) as f64));
            let t = time_median(&be, 1, 3, || {
                for l in &model.layers {
                    be.matmul(&x, &l.mlp.dense().context("a dense model")?.gate_up_proj)?;
                }
                Ok(())
            })?;
            parts.push((
                "GEMM gate|up (fused)",
                t,
                2.0 * (n * 2 * spec.intermediate_size * d * layers) as f64,
            ));
            let t = time_median(&be, 1, 3, || {
                for l in &model.layers {
                    be.matmul_acc(
                        &m_in,
                        &l.mlp.dense().context("a dense model")?.down_proj,
                        &mut hacc,
                    )?;
                }
                Ok(())
            })?;
            parts.push((
                "GEMM down (+= residual)",
                t,
                2.0 * (n * spec.intermediate_size * d * layers) as f64,
            ));
            let t = time_median(&be, 1, 3, || {
                for _ in 0..layers {
                    let norm = QkNorm {
                        q: &qn.weight,
                        k: &kn.weight,
                        eps: spec.rms_norm_eps,
                    };
                    be.qk_norm_rope_packed(&mut qkv_t, attn_shape, norm, &positions, &rope)?;
                }
                Ok(())
            })?;
            let qk_bytes =
                2.0 * 2.0 * (n * (spec.num_heads + spec.num_kv_heads) * spec.head_dim) as f64;
            parts.push(("q/k norm + RoPE (packed)", t, qk_bytes * layers as f64));
            let t = time_median(&be, 1, 3, || {
                for _ in 0..layers {
                    be.attention_varlen_packed(&qkv_t, attn_shape, &starts)?;
                }
                Ok(())
            })?;
            parts.push(("attention v2 (packed qkv)", t, attn_flops));
            let t = time_median(&be, 1, 3, || {
                for l in &model.layers {
                    be.rms_norm(&x, &l.input_layernorm.weight, spec.rms_norm_eps, d)?;
                    be.rms_norm(&x, &l.post_attention_layernorm.weight, spec.rms_norm_eps, d)?;
                }
                Ok(())
            })?;
            parts.push(("RMSNorm x2", t, 2.0 * 2.0 * 2.0 * (n * d * layers) as f64));
            let t = time_median(&be, 1, 3, || {
                for _ in 0..layers {
                    be.swiglu_packed(&gu_t)?;
                }
                Ok(())
            })?;
            parts.push((
                "SwiGLU (packed)",
                t,
                2.0 * 3.0 * (n * spec.intermediate_size * layers) as f64,
            ));
            let t = time_median(&be, 1, 3, || {
                for _ in 0..taps_hf.len() {
                    be.clone_tensor(&x)?;
                }
                Ok(())
            })?;
            parts.push((
                "tap copies x5",
                t,
                2.0 * 2.0 * (n * d * taps_hf.len()) as f64,
            ));
            let sum: f64 = parts.iter().map(|p| p.1).sum();
            println!("  TargetModel::forward_packed part by part, each alone:");
            for (name, t, work) in &parts {
                if name.starts_with("GEMM") || name.starts_with("attention") {
                    println!("    {name:<28} {t:.4} s  {:.0} TFLOP/s", work / t / 1e12);
                } else {
                    println!("    {name:<28} {t:.4} s  {:.2} TB/s", work / t / 1e12);
                }
            }
            println!(
                "    sum {sum:.4} s vs the whole forward {t_new:.4} s (difference: launch gaps, embedding, final norm, allocations)"
            );
            json!(parts
                .iter()
                .map(|(name, t, _)| json!({"part": name, "s": t}))
                .collect::<Vec<_>>())
        };
        // Taps copied to page-locked host memory after each forward (not overlapped).
        let per_tap = n * spec.hidden_size;
        let mut pinned = be.alloc_pinned_bf16(per_tap * taps_hf.len())?;
        let t_d2h = time_median(&be, 1, a.reps.min(3), || {
            let out = model.forward_packed(&be, &toks, &starts, &capture)?;
            for (i, &hf) in taps_hf.iter().enumerate() {
                be.copy_to_pinned(
                    out.captured.get(hf).context("tap")?,
                    &mut pinned,
                    i * per_tap,
                )?;
            }
            Ok(())
        })?;
        println!(
            "extract incl. D2H of 5 taps ({:.2} GB) to pinned memory: {t_d2h:.3} s/forward, {:.0} tok/s",
            (per_tap * taps_hf.len() * 2) as f64 / 1e9,
            tok_s(t_d2h)
        );
        drop(pinned);
        let rec = |t: f64| json!({"s_per_forward": t, "tokens_per_s": tok_s(t), "s_per_1m_tokens": 1e6 * t / n as f64, "tflops": rate(t), "frac_of_floor": floor_s / t});
        results.insert(
            "extract_qwen3_8b".into(),
            json!({"path": "TargetModel::forward_packed", "layers": layers, "tokens_per_forward": n, "seq_len": seq, "taps_hf": taps_hf,
                   "floor_s": floor_s, "peak_tflops": peak, "load_s": load_s,
                   "previous_config": rec(t_old), "current": rec(t_new), "current_vs_previous_last_tap": d_new,
                   "current_with_d2h_s": t_d2h, "breakdown": breakdown}),
        );
    }
    let tuned = be.gemm_tune_records();
    if !tuned.is_empty() {
        println!("cuBLASLt tuning (first heuristic answer vs chosen, ms per GEMM):");
        for r in &tuned {
            println!(
                "  [{} x {}] x [{} x {}]^T{}: {} candidates; cublasGemmEx {:.3}, first heuristic answer {:.3}, chosen {:.3} ({})",
                r.rows,
                r.inp,
                r.out,
                r.inp,
                if r.accumulate { " (+=)" } else { "" },
                r.candidates,
                r.gemm_ex_ms,
                r.first_ms,
                r.best_ms,
                r.best_index
                    .map(|i| format!("answer #{i}"))
                    .unwrap_or_else(|| "cublasGemmEx".into())
            );
        }
        results.insert("gemm_tuning".into(), json!(tuned));
    }

    // ---- packed mix of prompt lengths (one length per line in --mix)
    if let (true, Some(path)) = (has("mix"), &a.mix) {
        new_config(&be)?;
        let text = std::fs::read_to_string(path).with_context(|| format!("{path}: cannot read"))?;
        let lens: Vec<usize> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.trim()
                    .parse::<usize>()
                    .with_context(|| format!("{path}: bad length {l:?}"))
            })
            .collect::<Result<_>>()?;
        // The product's packer (`Session::target_passes`): input order, 16k tokens per forward.
        let mut packer =
            draftlens_engine::session::Packer::new(draftlens_engine::session::DEFAULT_PACK_TOKENS);
        let mut batches: Vec<Vec<usize>> = lens.iter().filter_map(|&l| packer.push(l, l)).collect();
        batches.push(packer.finish());
        batches.retain(|b| !b.is_empty());
        let total: usize = lens.iter().sum();
        let mix_flops: f64 = lens
            .iter()
            .map(|&l| spec.prefill_flops_per_token(l) * l as f64)
            .sum();
        let prepared: Vec<(Vec<u32>, Vec<usize>)> = batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut st = vec![0usize];
                for l in b {
                    st.push(st.last().unwrap() + l);
                }
                (
                    ids(*st.last().unwrap(), spec.vocab_size, 100 + i as u64),
                    st,
                )
            })
            .collect();
        let t_mix = time_median(&be, 1, 3, || {
            for (tk, st) in &prepared {
                model.forward_packed(&be, tk, st, &capture)?;
            }
            Ok(())
        })?;
        let mix_floor = mix_flops / (peak * 1e12);
        println!("mix (TargetModel::forward_packed): {} sequences, {total} tokens in {} packed forwards: {:.3} s, {:.0} tok/s, {:.0} TFLOP/s = {:.1}% of the compute floor", lens.len(), batches.len(), t_mix, total as f64 / t_mix, mix_flops / t_mix / 1e12, 100.0 * mix_floor / t_mix);
        results.insert(
            "mix".into(),
            json!({"sequences": lens.len(), "tokens": total, "forwards": batches.len(), "s": t_mix, "tokens_per_s": total as f64 / t_mix,
                   "tflops": mix_flops / t_mix / 1e12, "frac_of_floor": mix_floor / t_mix}),
        );
    }

    // ---- DFlash drafter scoring: the product's `DFlashDrafter` (5 layers, B = 16, top-8) over
    // 4096 context positions, every position an anchor
    if has("drafter") {
        new_config(&be)?;
        let dir = tempfile::tempdir()?;
        write_random_checkpoint(
            dir.path(),
            &spec,
            &RandomDrafter {
                layers: if a.quick { 2 } else { 5 },
                block_size: 16,
                target_layer_ids: vec![1, 9, 17, 25, 33]
                    .into_iter()
                    .map(|t: usize| t.min(layers - 1))
                    .collect(),
                intermediate_size: spec.intermediate_size,
                mask_token_id: 151_669,
                sliding_layers: 0,
                sliding_window: 0,
                seed: 77,
            },
        )?;
        let drafter = DFlashDrafter::load(&be, dir.path(), spec.hidden_size)?;
        let ctx_len = 4096usize;
        let taps: Vec<Vec<f32>> = (0..5)
            .map(|j| draftlens_engine::util::host_random(ctx_len * spec.hidden_size, 8 + j))
            .collect();
        let tap_refs: Vec<&[f32]> = taps.iter().map(Vec::as_slice).collect();
        let anchors_per_call = 512usize;
        let all_anchors: Vec<usize> = (0..ctx_len).collect();
        let anchor_tok = ids(ctx_len, spec.vocab_size, 9);
        let t_ctx = time_median(&be, 1, 3, || {
            drafter
                .context(&be, &tap_refs, spec.hidden_size)
                .map(|_| ())
        })?;
        let ctx = drafter.context(&be, &tap_refs, spec.hidden_size)?;
        let t_draft = time_median(&be, 1, 3, || {
            for (ch, tk) in all_anchors
                .chunks(anchors_per_call)
                .zip(anchor_tok.chunks(anchors_per_call))
            {
                drafter.draft(
                    &be,
                    &model,
                    &ctx,
                    ch,
                    tk,
                    DraftOptions {
                        ctx_inclusive: false,
                        top_k: 8,
                    },
                )?;
            }
            Ok(())
        })?;
        let n_anchor = all_anchors.len();
        let cfg = &drafter.cfg;
        let draft_flops: f64 = all_anchors
            .iter()
            .map(|&a| cfg.flops_per_anchor(a, spec.vocab_size))
            .sum::<f64>()
            + cfg.flops_per_context_token(spec.hidden_size) * ctx_len as f64;
        let total_s = t_draft + t_ctx;
        let floor = draft_flops / (peak * 1e12);
        println!(
            "DFlashDrafter: {n_anchor} anchors ({anchors_per_call}/call, B=16, top-8, ctx {ctx_len}): context {:.3} s (incl. upload of the host taps) + drafting {:.3} s = {:.0} anchors/s; {:.0} TFLOP/s, {:.1}% of peak (floor {:.0} anchors/s)",
            t_ctx,
            t_draft,
            n_anchor as f64 / total_s,
            draft_flops / total_s / 1e12,
            100.0 * floor / total_s,
            n_anchor as f64 / floor
        );
        results.insert(
            "drafter".into(),
            json!({"path": "DFlashDrafter", "layers": cfg.num_layers, "block": 16, "top_k": 8, "ctx_len": ctx_len, "anchors": n_anchor, "anchors_per_call": anchors_per_call,
                   "context_s": t_ctx, "draft_s": t_draft, "anchors_per_s": n_anchor as f64 / total_s, "tflops": draft_flops / total_s / 1e12,
                   "floor_anchors_per_s": n_anchor as f64 / floor, "frac_of_floor": floor / total_s}),
        );
    }
    finish(&be, &a, results)
}

/// Packed prefill of `nseq` sequences of `seq` random tokens through the folder's model
/// (`TargetModel::forward_packed`, DFlash-like taps at three depths, weights loaded the way every
/// command loads them), timed as a median of `reps` forwards after a warm-up.
/// Attention kernels A/B: `spec.num_layers` causal varlen launches over `nseq` packed sequences
/// of `seq` tokens at the spec's head shape (one forward's attention), with the first kernel
/// (v1), flash_attention2 (v2) and v2 reading q/k/v from a fused QKV output; plus how far the
/// outputs differ. Useful FLOPs: the attention part of [`ModelSpec::prefill_flops_per_token`].
fn attention_ab(
    be: &CudaBackend,
    spec: &ModelSpec,
    nseq: usize,
    seq: usize,
) -> Result<serde_json::Value> {
    let layers = spec.num_layers;
    let attn_shape = AttnShape {
        heads: spec.num_heads,
        kv_heads: spec.num_kv_heads,
        head_dim: spec.head_dim,
    };
    let starts = SeqStarts::from_lengths(std::iter::repeat(seq).take(nseq));
    let n = seq * nseq;
    let per = spec.prefill_flops_per_token(seq) * n as f64
        - 2.0 * (spec.layer_linear_params() * layers * n) as f64;
    let (qd, kvd) = (
        spec.num_heads * spec.head_dim,
        spec.num_kv_heads * spec.head_dim,
    );
    let q = be.random_tensor(n, qd, 1.0, 0.0, 5)?;
    let k = be.random_tensor(n, kvd, 1.0, 0.0, 6)?;
    let v = be.random_tensor(n, kvd, 1.0, 0.0, 16)?;
    let qkv = be.concat_cols(&[&q, &k, &v])?;
    let time_attn = |v1: bool, packed: bool| -> Result<f64> {
        be.set_attention_v1(v1);
        let (t, clock) = with_clock_samples(be.info().ordinal, || {
            time_median(be, 1, 5, || {
                for _ in 0..layers {
                    if packed {
                        be.attention_varlen_packed(&qkv, attn_shape, &starts)?;
                    } else {
                        be.attention_varlen(&q, &k, &v, attn_shape, &starts)?;
                    }
                }
                Ok(())
            })
        });
        println!("  attention (v1 {v1}, packed {packed}): {clock}");
        t
    };
    let t_v1 = time_attn(true, false)?;
    let t_v2 = time_attn(false, false)?;
    let t_pk = time_attn(false, true)?;
    be.set_attention_v1(true);
    let o1 = be.to_host(&be.attention_varlen(&q, &k, &v, attn_shape, &starts)?)?;
    be.set_attention_v1(false);
    let o2 = be.to_host(&be.attention_varlen(&q, &k, &v, attn_shape, &starts)?)?;
    let op = be.to_host(&be.attention_varlen_packed(&qkv, attn_shape, &starts)?)?;
    let d12 = draftlens_engine::parity::diff(&o1, &o2);
    let d2p = draftlens_engine::parity::diff(&o2, &op);
    println!(
        "attention ({layers} varlen causal launches, {nseq}x{seq}, hd {}, {}/{} heads): v1 {:.4} s ({:.0} TFLOP/s), v2 {:.4} s ({:.0}), v2 on packed qkv {:.4} s ({:.0}); v2 vs v1 rel {:.2e} max {:.2e}; packed vs v2 rel {:.2e}",
        spec.head_dim, spec.num_heads, spec.num_kv_heads,
        t_v1, per / t_v1 / 1e12, t_v2, per / t_v2 / 1e12, t_pk, per / t_pk / 1e12,
        d12.rel_l2, d12.max_abs, d2p.rel_l2
    );
    Ok(json!({"v1_s": t_v1, "v2_s": t_v2, "v2_packed_s": t_pk,
        "v1_tflops": per / t_v1 / 1e12, "v2_tflops": per / t_v2 / 1e12, "v2_packed_tflops": per / t_pk / 1e12,
        "v2_vs_v1": d12, "packed_vs_v2": d2p, "head_dim": spec.head_dim, "heads": spec.num_heads,
        "kv_heads": spec.num_kv_heads, "layers": layers}))
}

/// One layer's packed causal attention at Qwen3-8B's head shape (32 query / 8 KV heads of 128,
/// q/k/v read from a fused QKV output) for sequences of 1k … 32k tokens, 16k tokens per call (one
/// sequence at 32k): `flash_attention2_hd128` against the wgmma kernel, in TFLOP/s of useful causal
/// FLOPs, 4 · hd · heads · Σ len² / 2, and how far their outputs differ.
fn attention_wgmma_ab(be: &CudaBackend, reps: usize) -> Result<serde_json::Value> {
    let shape = AttnShape {
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
    };
    if !be.set_attention_wgmma(true) {
        println!("attention-wgmma: needs compute capability 9.0, skipped");
        return Ok(json!(null));
    }
    be.set_attention_wgmma(false);
    let cols = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
    let mut rows = Vec::new();
    for seq in [1024usize, 2048, 4096, 8192, 16384, 32768] {
        let nseq = (16384 / seq).max(1);
        let n = seq * nseq;
        let starts = SeqStarts::from_lengths(std::iter::repeat(seq).take(nseq));
        let flops = 4.0 * (shape.head_dim * shape.heads) as f64 * (nseq * seq * seq) as f64 / 2.0;
        let qkv = be.random_tensor(n, cols, 1.0, 0.0, 21)?;
        let run = |wgmma: bool| -> Result<(f64, Vec<f32>)> {
            be.set_attention_wgmma(wgmma);
            let t = time_median(be, 2, reps, || {
                be.attention_varlen_packed(&qkv, shape, &starts).map(|_| ())
            });
            let o = be.attention_varlen_packed(&qkv, shape, &starts);
            be.set_attention_wgmma(false);
            Ok((t?, be.to_host(&o?)?))
        };
        let (t_old, o_old) = run(false)?;
        let (t_new, o_new) = run(true)?;
        let d = draftlens_engine::parity::diff(&o_old, &o_new);
        let (tf_old, tf_new) = (flops / t_old / 1e12, flops / t_new / 1e12);
        println!(
            "attention hd 128 32/8 heads, {nseq}x{seq}: flash_attention2 {:.3} ms ({tf_old:.0} TFLOP/s), wgmma {:.3} ms ({tf_new:.0} TFLOP/s), new/old {:.2}x; max |d| {:.2e} rel {:.2e}",
            t_old * 1e3, t_new * 1e3, t_old / t_new, d.max_abs, d.rel_l2
        );
        rows.push(
            json!({"seq": seq, "nseq": nseq, "fa2_s": t_old, "wgmma_s": t_new,
            "fa2_tflops": tf_old, "wgmma_tflops": tf_new, "speedup": t_old / t_new, "diff": d}),
        );
    }
    Ok(json!(rows))
}

fn bench_target(
    be: &CudaBackend,
    dir: &std::path::Path,
    (nseq, seq): (usize, usize),
    reps: usize,
    peak: f64,
) -> Result<serde_json::Value> {
    use draftlens_engine::backend::GdnProfile;
    use draftlens_engine::model::TargetFiles;
    let files = TargetFiles::open(dir)?;
    let spec = &files.spec;
    let t0 = Instant::now();
    let mut model = TargetModel::load(be, spec, files.weights.as_ref())?;
    be.synchronize()?;
    let load_s = t0.elapsed().as_secs_f64();
    let layers = spec.num_layers;
    let taps: Vec<usize> = vec![2, layers / 2, layers.saturating_sub(1).max(1)];
    let capture = Capture::hf_indices(taps, layers)?;
    let starts = SeqStarts::from_lengths(std::iter::repeat(seq).take(nseq));
    let n = nseq * seq;
    let toks = ids(n, spec.vocab_size.min(150_000), 11);
    let flops = spec.prefill_flops_per_token(seq) * n as f64;
    let floor_s = flops / (peak * 1e12);
    println!(
        "target {} ({}, {layers} layers, {:.2} B linear parameters): loaded in {load_s:.1} s; {nseq} × {seq} tokens per forward, {:.2} GF/token, floor {floor_s:.3} s at {peak:.0} TFLOP/s",
        dir.display(),
        spec.arch.as_str(),
        spec.linear_params() as f64 / 1e9,
        flops / n as f64 / 1e9
    );
    let profiles: &[Option<GdnProfile>] = if spec.hybrid.is_some() {
        &[Some(GdnProfile::Reference), Some(GdnProfile::Engine)]
    } else {
        &[None]
    };
    let mut rows = Vec::new();
    // Every profile with the default kernels; for a hybrid every profile again with the other
    // Gated DeltaNet chunk kernels (split / three-phase, docs/gdn-cuda.md); then the first
    // profile again with the first attention kernel (`set_attention_v1`): the A/Bs of the whole
    // forward.
    use draftlens_engine::backend::cuda::gdn::set_three_phase_override;
    let gdn_ab: &[Option<bool>] = if spec.hybrid.is_some() {
        &[None, Some(false), Some(true)]
    } else {
        &[None]
    };
    // A dense model also runs with the q norm in the separate pass instead of inside the
    // attention (`set_q_norm_in_attention`).
    // `TARGET_DEFAULTS_ONLY=1`: only the default kernels, each profile once (a kernel trace of
    // the product's forward alone).
    let defaults_only = std::env::var("TARGET_DEFAULTS_ONLY").is_ok_and(|v| v == "1");
    let runs: Vec<_> = gdn_ab
        .iter()
        .flat_map(|tp| profiles.iter().map(move |p| (*p, false, *tp, false)))
        .chain(std::iter::once((profiles[0], true, None, false)))
        .chain(spec.hybrid.is_none().then_some((None, false, None, true)))
        .filter(|&(_, v1, tp, q_sep)| !defaults_only || (!v1 && tp.is_none() && !q_sep))
        .collect();
    for (p, v1, tp, q_sep) in runs {
        if let Some(p) = p {
            model.set_gdn_profile(p);
        }
        be.set_attention_v1(v1);
        be.set_q_norm_in_attention(!q_sep);
        set_three_phase_override(tp);
        let (t, clock) = with_clock_samples(be.info().ordinal, || {
            time_median(be, 1, reps, || {
                model
                    .forward_packed(be, &toks, &starts, &capture)
                    .map(|_| ())
            })
        });
        be.set_attention_v1(false);
        be.set_q_norm_in_attention(true);
        set_three_phase_override(None);
        let t = t?;
        let label = p
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "dense".into())
            + if v1 { ", first attention kernel" } else { "" }
            + if q_sep {
                ", q norm in the separate pass"
            } else {
                ""
            }
            + match tp {
                None => "",
                Some(false) => ", split GDN kernels",
                Some(true) => ", three-phase GDN kernels",
            };
        println!(
            "target forward_packed [{label}]: {t:.3} s/forward, {:.0} tok/s, {:.1} s per 1M tokens, {:.0} TFLOP/s = {:.1}% of the compute floor",
            n as f64 / t,
            1e6 * t / n as f64,
            flops / t / 1e12,
            100.0 * floor_s / t
        );
        println!("  during the forwards: {clock}");
        rows.push(json!({"profile": label, "s_per_forward": t, "tok_per_s": n as f64 / t,
            "s_per_1m_tokens": 1e6 * t / n as f64, "tflops": flops / t / 1e12, "pct_of_floor": 100.0 * floor_s / t,
            "clock": clock}));
    }
    Ok(
        json!({"dir": dir.display().to_string(), "arch": spec.arch.as_str(), "layers": layers, "load_s": load_s,
        "tokens_per_forward": n, "seq": seq, "gflop_per_token": flops / n as f64 / 1e9, "floor_s": floor_s, "runs": rows}),
    )
}

/// The four projection GEMMs of a Qwen3-8B packed prefill (16 384 rows): the candidate the tuner
/// picks from bursts against every candidate's time under sustained load.
fn gemm_sustained(be: &CudaBackend) -> Result<serde_json::Value> {
    be.set_gemm_choices_file(None);
    be.forget_gemm_plans();
    let rows = 16384;
    let mut out = serde_json::Map::new();
    for (name, nout, kin, acc) in [
        ("qkv", 6144, 4096, false),
        ("o_proj (+=)", 4096, 4096, true),
        ("gate|up", 24576, 4096, false),
        ("down (+=)", 4096, 12288, true),
    ] {
        let x = be.random_tensor(rows, kin, 1.0, 0.0, 21)?;
        let w = be.random_matrix(nout, kin, 0.02, 22)?;
        let n_before = be.gemm_tune_records().len();
        if acc {
            let mut y = be.random_tensor(rows, nout, 1.0, 0.0, 23)?;
            be.matmul_acc(&x, &w, &mut y)?;
        } else {
            be.matmul(&x, &w)?;
        }
        let burst = be
            .gemm_tune_records()
            .get(n_before)
            .and_then(|r| r.best_index);
        let times = be.gemm_candidates_sustained(&x, &w, acc as u8 as f32, 1500.0, 3, 8)?;
        let flops = 2.0 * (rows * nout * kin) as f64;
        let best = (0..times.len())
            .filter(|&i| times[i].is_finite())
            .min_by(|&a, &b| times[a].total_cmp(&times[b]));
        let mut line =
            format!("  {name} [{rows} x {kin}] x [{nout} x {kin}]^T, sustained ms (TFLOP/s):");
        for (i, ms) in times.iter().enumerate() {
            let mark = match (Some(i) == burst, Some(i) == best) {
                (true, true) => " <burst, best>",
                (true, false) => " <burst>",
                (false, true) => " <best>",
                _ => "",
            };
            line += &format!(" #{i}: {ms:.3} ({:.0}){mark};", flops / ms / 1e9);
        }
        println!("{line}");
        let gain = match (burst, best) {
            (Some(b), Some(s)) => times[b] / times[s] - 1.0,
            _ => f64::NAN,
        };
        println!(
            "    burst choice {burst:?}, sustained best {best:?}: the best is {:.1} % faster",
            100.0 * gain
        );
        out.insert(
            name.into(),
            json!({"burst_index": burst, "best_index": best, "ms": times, "gain": gain}),
        );
    }
    Ok(serde_json::Value::Object(out))
}

fn finish(
    be: &CudaBackend,
    a: &Args,
    mut results: serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    println!("{}", be.gemm_status());
    results.insert("gemm_status".into(), json!(be.gemm_status()));
    let (free, total) = be.mem_info()?;
    println!(
        "device memory: {:.1} GiB free of {:.1}",
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    );
    let js = serde_json::Value::Object(results);
    println!("JSON {}", js);
    if let Some(p) = &a.out {
        std::fs::write(p, serde_json::to_string_pretty(&js)?)
            .with_context(|| format!("{p}: cannot write"))?;
    }
    Ok(())
}
