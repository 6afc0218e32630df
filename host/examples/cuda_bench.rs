//! CUDA benchmarks of issue 6 (docs/benchmarks-cuda.md): measured ceilings, hidden-state
//! extraction on Qwen3-8B shapes with random weights, a packed mix of prompt lengths, and DFlash
//! drafter scoring. Prints a table and writes every figure as JSON.
//!
//! cargo build --release -p draftlens --example cuda_bench
//! cuda_bench [--out results.json] [--mix lengths.txt] [--forwards N] [--quick]

use anyhow::{bail, Context, Result};
use draftlens::backend::cuda::bench::{
    copy_bandwidth, gemm_tflops, positions_for, time_median, Decoder, DecoderShape, Drafter,
};
use draftlens::backend::cuda::CudaBackend;
use draftlens::backend::Backend;
use serde_json::json;
use std::time::Instant;

struct Args {
    out: Option<String>,
    mix: Option<String>,
    reps: usize,
    quick: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        out: None,
        mix: None,
        reps: 5,
        quick: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--out" => a.out = Some(it.next().context("--out needs a path")?),
            "--mix" => a.mix = Some(it.next().context("--mix needs a path")?),
            "--forwards" => a.reps = it.next().context("--forwards needs a number")?.parse()?,
            "--quick" => a.quick = true,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// Random token ids (never zeros, never one repeated id).
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    draftlens::backend::cuda::bench::host_random(n, seed)
        .into_iter()
        .map(|x| (((x + 1.0) * 0.5) * (vocab - 1) as f32) as u32)
        .collect()
}

fn main() -> Result<()> {
    let a = args()?;
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

    // ---- ceilings
    let peak = gemm_tflops(&be, 8192, 8192, 8192)?;
    let peak_16k = gemm_tflops(&be, 16384, 4096, 4096)?;
    let bw = copy_bandwidth(&be, 4 << 30)?;
    println!("cuBLAS bf16 GEMM 8192^3: {peak:.0} TFLOP/s; [16384,4096]x[4096,4096]: {peak_16k:.0} TFLOP/s; D2D copy {:.2} TB/s", bw / 1e12);
    results.insert("ceilings".into(), json!({"gemm_8192_tflops": peak, "gemm_16384x4096x4096_tflops": peak_16k, "copy_tb_s": bw / 1e12}));

    // ---- extraction, Qwen3-8B, 4 × 4096 tokens per forward, 5 DFlash taps
    let shape = if a.quick {
        DecoderShape {
            layers: 4,
            ..DecoderShape::qwen3_8b()
        }
    } else {
        DecoderShape::qwen3_8b()
    };
    let t0 = Instant::now();
    let model = Decoder::random_on_device(&be, &shape, 42)?;
    be.synchronize()?;
    println!(
        "random Qwen3-8B-shaped weights ({} layers) on the GPU in {:.1} s",
        shape.layers,
        t0.elapsed().as_secs_f64()
    );
    let taps = [2usize, 10, 18, 26, 34].map(|t| t.min(shape.layers));
    let (seq, nseq) = (4096usize, 4usize);
    let starts: Vec<usize> = (0..=nseq).map(|i| i * seq).collect();
    let toks = ids(seq * nseq, shape.vocab, 7);
    let n = toks.len();
    let t_fwd = time_median(&be, 1, a.reps, || {
        model.forward(&be, &toks, &starts, &taps).map(|_| ())
    })?;
    let flops = shape.prefill_flops_per_token(seq) * n as f64;
    let tps = n as f64 / t_fwd;
    let floor_s_per_m = shape.prefill_flops_per_token(seq) * 1e6 / (peak * 1e12);
    println!(
        "extract: {n} tokens/forward ({nseq}x{seq}), {:.3} s/forward, {:.0} tok/s, {:.1} s per 1M tokens, {:.0} TFLOP/s = {:.1}% of measured cuBLAS peak (floor {:.1} s per 1M)",
        t_fwd,
        tps,
        1e6 / tps,
        flops / t_fwd / 1e12,
        100.0 * flops / t_fwd / 1e12 / peak,
        floor_s_per_m
    );
    // The same with the 5 taps copied to page-locked host memory after each forward (not overlapped).
    let per_tap = n * shape.hidden;
    let mut pinned = be.alloc_pinned_bf16(per_tap * taps.len())?;
    let t_fwd_d2h = time_median(&be, 1, a.reps.min(3), || {
        let out = model.forward(&be, &toks, &starts, &taps)?;
        for (i, t) in out.taps.iter().enumerate() {
            be.copy_to_pinned(t, &mut pinned, i * per_tap)?;
        }
        Ok(())
    })?;
    println!(
        "extract incl. D2H of 5 taps ({:.2} GB) to pinned memory: {:.3} s/forward, {:.0} tok/s",
        (per_tap * taps.len() * 2) as f64 / 1e9,
        t_fwd_d2h,
        n as f64 / t_fwd_d2h
    );

    // Breakdown: the GEMMs alone and the attention alone at the same shapes.
    let x = be.random_tensor(n, shape.hidden, 1.0, 0.0, 3)?;
    let l0 = &model.layers[0];
    let xi = be.random_tensor(n, shape.inter, 1.0, 0.0, 4)?;
    let t_gemm = time_median(&be, 1, 3, || {
        for _ in 0..shape.layers {
            for w in [&l0.q, &l0.k, &l0.v, &l0.o, &l0.gate, &l0.up] {
                be.matmul(&x, w)?;
            }
            be.matmul(&xi, &l0.down)?;
        }
        Ok(())
    })?;
    let q = be.random_tensor(n, shape.heads * shape.head_dim, 1.0, 0.0, 5)?;
    let kv = be.random_tensor(n, shape.kv_heads * shape.head_dim, 1.0, 0.0, 6)?;
    let t_attn = time_median(&be, 1, 3, || {
        for _ in 0..shape.layers {
            be.attention_varlen(&q, &kv, &kv, shape.attn(), &starts)?;
        }
        Ok(())
    })?;
    let gemm_flops = 2.0 * (shape.layer_linear_params() * shape.layers * n) as f64;
    let attn_flops = flops - gemm_flops;
    println!(
        "  breakdown per forward: GEMMs {:.3} s ({:.0} TFLOP/s), attention {:.3} s ({:.0} TFLOP/s causal-useful), rest {:.3} s",
        t_gemm,
        gemm_flops / t_gemm / 1e12,
        t_attn,
        attn_flops / t_attn / 1e12,
        t_fwd - t_gemm - t_attn
    );
    // Fused QKV and gate|up GEMMs, residual adds in the GEMM epilogue (same weights).
    let fused = model.fuse(&be)?;
    let t_fused = time_median(&be, 1, a.reps, || {
        model
            .forward_fused(&be, &fused, &toks, &starts, &taps)
            .map(|_| ())
    })?;
    let fused_diff = {
        let (u, f) = (
            model.forward(&be, &toks[..4096], &[0, 4096], &taps)?,
            model.forward_fused(&be, &fused, &toks[..4096], &[0, 4096], &taps)?,
        );
        let last = taps.len() - 1;
        draftlens::parity::diff(&be.to_host(&u.taps[last])?, &be.to_host(&f.taps[last])?)
    };
    println!(
        "extract fused: {:.3} s/forward, {:.0} tok/s, {:.1} s per 1M tokens, {:.0} TFLOP/s = {:.1}% of peak; last tap vs unfused rel {:.2e}",
        t_fused,
        n as f64 / t_fused,
        1e6 * t_fused / n as f64,
        flops / t_fused / 1e12,
        100.0 * flops / t_fused / 1e12 / peak,
        fused_diff.rel_l2
    );
    // GEMM rate per projection shape at 16384 rows (separate vs fused).
    let mut shapes = serde_json::Map::new();
    for (name, nout, kin) in [
        ("q/o", 4096, 4096),
        ("k/v", 1024, 4096),
        ("qkv fused", 6144, 4096),
        ("gate/up", 12288, 4096),
        ("gate|up fused", 24576, 4096),
        ("down", 4096, 12288),
    ] {
        let r = gemm_tflops(&be, n, nout, kin)?;
        println!("  GEMM [{n} x {kin}] x [{nout} x {kin}]^T ({name}): {r:.0} TFLOP/s");
        shapes.insert(name.into(), json!(r));
    }
    results.insert(
        "gemm_shapes_tflops".into(),
        serde_json::Value::Object(shapes),
    );
    results.insert("extract_fused".into(), json!({"s_per_forward": t_fused, "tokens_per_s": n as f64 / t_fused, "s_per_1m_tokens": 1e6 * t_fused / n as f64, "tflops": flops / t_fused / 1e12, "frac_of_peak": flops / t_fused / 1e12 / peak, "last_tap_rel_diff_vs_unfused": fused_diff.rel_l2}));
    drop(fused);
    results.insert(
        "extract_qwen3_8b".into(),
        json!({"layers": shape.layers, "tokens_per_forward": n, "seq_len": seq, "taps_hf": taps, "s_per_forward": t_fwd, "tokens_per_s": tps,
               "s_per_1m_tokens": 1e6 / tps, "tflops": flops / t_fwd / 1e12, "frac_of_peak": flops / t_fwd / 1e12 / peak,
               "floor_s_per_1m_at_peak": floor_s_per_m, "s_per_forward_with_d2h": t_fwd_d2h, "tokens_per_s_with_d2h": n as f64 / t_fwd_d2h,
               "gemm_s": t_gemm, "gemm_tflops": gemm_flops / t_gemm / 1e12, "attn_s": t_attn, "attn_tflops": attn_flops / t_attn / 1e12}),
    );
    drop((x, xi, q, kv, pinned));

    // ---- packed mix of prompt lengths (one length per line in --mix)
    if let Some(path) = &a.mix {
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
        let budget = 16384usize;
        // First-fit in input order: each forward takes sequences until the next would overflow.
        let mut batches: Vec<Vec<usize>> = vec![];
        let mut cur: Vec<usize> = vec![];
        for &l in &lens {
            if !cur.is_empty() && cur.iter().sum::<usize>() + l > budget {
                batches.push(std::mem::take(&mut cur));
            }
            cur.push(l);
        }
        if !cur.is_empty() {
            batches.push(cur);
        }
        let total: usize = lens.iter().sum();
        let mix_flops: f64 = lens
            .iter()
            .map(|&l| shape.prefill_flops_per_token(l) * l as f64)
            .sum();
        let prepared: Vec<(Vec<u32>, Vec<usize>)> = batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut st = vec![0usize];
                for l in b {
                    st.push(st.last().unwrap() + l);
                }
                (ids(*st.last().unwrap(), shape.vocab, 100 + i as u64), st)
            })
            .collect();
        let _ = positions_for(&prepared[0].1);
        let t_mix = time_median(&be, 1, 3, || {
            for (tk, st) in &prepared {
                model.forward(&be, tk, st, &taps)?;
            }
            Ok(())
        })?;
        println!("mix: {} sequences, {total} tokens in {} packed forwards: {:.3} s, {:.0} tok/s, {:.0} TFLOP/s", lens.len(), batches.len(), t_mix, total as f64 / t_mix, mix_flops / t_mix / 1e12);
        let fused = model.fuse(&be)?;
        let t_mix_fused = time_median(&be, 1, 3, || {
            for (tk, st) in &prepared {
                model.forward_fused(&be, &fused, tk, st, &taps)?;
            }
            Ok(())
        })?;
        println!(
            "mix fused: {:.3} s, {:.0} tok/s, {:.0} TFLOP/s",
            t_mix_fused,
            total as f64 / t_mix_fused,
            mix_flops / t_mix_fused / 1e12
        );
        results.insert(
            "mix".into(),
            json!({"sequences": lens.len(), "tokens": total, "forwards": batches.len(), "s": t_mix, "tokens_per_s": total as f64 / t_mix, "tflops": mix_flops / t_mix / 1e12,
                   "fused_s": t_mix_fused, "fused_tokens_per_s": total as f64 / t_mix_fused}),
        );
    }

    // ---- DFlash drafter scoring: 5 layers, B = 16, top-8, 4096 context positions, all anchors
    let dshape = if a.quick {
        DecoderShape {
            layers: 2,
            ..DecoderShape::qwen3_8b_drafter()
        }
    } else {
        DecoderShape::qwen3_8b_drafter()
    };
    let drafter = Drafter::random_on_device(&be, &dshape, 16, 5, 77)?;
    let ctx_len = 4096usize;
    let taps_cat = be.random_tensor(ctx_len, 5 * dshape.hidden, 1.0, 0.0, 8)?;
    let anchors_per_call = 512usize;
    let all_anchors: Vec<usize> = (0..ctx_len).collect();
    let anchor_tok = ids(ctx_len, dshape.vocab, 9);
    let t_ctx = time_median(&be, 1, 3, || drafter.context(&be, &taps_cat).map(|_| ()))?;
    let ctx = drafter.context(&be, &taps_cat)?;
    let t_draft = time_median(&be, 1, 3, || {
        for (ch, tk) in all_anchors
            .chunks(anchors_per_call)
            .zip(anchor_tok.chunks(anchors_per_call))
        {
            drafter.draft(&be, &ctx, &model.embed, &model.embed, ch, tk, 151669, 8)?;
        }
        Ok(())
    })?;
    let n_anchor = all_anchors.len();
    let draft_flops: f64 = all_anchors
        .iter()
        .map(|&a| drafter.flops_per_anchor(a))
        .sum::<f64>()
        + drafter.flops_per_context_token() * ctx_len as f64;
    let total_s = t_draft + t_ctx;
    let floor = draft_flops / (peak * 1e12);
    println!(
        "drafter: {n_anchor} anchors ({anchors_per_call}/call, B=16, top-8, ctx {ctx_len}): context {:.3} s + drafting {:.3} s = {:.0} anchors/s; {:.0} TFLOP/s, {:.1}% of peak (floor {:.0} anchors/s)",
        t_ctx,
        t_draft,
        n_anchor as f64 / total_s,
        draft_flops / total_s / 1e12,
        100.0 * floor / total_s,
        n_anchor as f64 / floor
    );
    results.insert(
        "drafter".into(),
        json!({"layers": dshape.layers, "block": 16, "top_k": 8, "ctx_len": ctx_len, "anchors": n_anchor, "anchors_per_call": anchors_per_call,
               "context_s": t_ctx, "draft_s": t_draft, "anchors_per_s": n_anchor as f64 / total_s, "tflops": draft_flops / total_s / 1e12,
               "floor_anchors_per_s": n_anchor as f64 / floor, "frac_of_floor": floor / total_s}),
    );
    let (free, total) = be.mem_info()?;
    println!(
        "device memory: {:.1} GiB free of {:.1}",
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    );
    let js = serde_json::Value::Object(results);
    println!("JSON {}", js);
    if let Some(p) = a.out {
        std::fs::write(&p, serde_json::to_string_pretty(&js)?)
            .with_context(|| format!("{p}: cannot write"))?;
    }
    Ok(())
}
