//! The `decode` section of `examples/cuda_bench.rs` (docs/benchmarks-cuda.md): the batch-invariant
//! decode GEMM's weight bandwidth per Qwen3-8B shape (pipelined kernel, with the register kernel
//! as an A/B column) against cuBLAS and the device copy rate, a
//! whole decode step of `TargetModel` (random Qwen3-8B weights through the normal loader) at
//! batch 1, 8, 32 and 64, and greedy generation of 64 prompts × 128 tokens batched against one
//! prompt at a time.

use super::bench::{copy_bandwidth, time_median};
use super::{CudaBackend, CudaMatrix, CudaTensor, MAX_DECODE_ROWS};
use crate::backend::{AttnShape, Backend, KvSlot};
use crate::generate::{greedy, greedy_batch};
use crate::model::random::{qwen3_8b_spec, RandomWeights};
use crate::model::{Capture, KvCache, ModelSpec, TargetModel};
use anyhow::Result;
use serde_json::{json, Value};
use std::time::Instant;

/// Batch sizes of the decode measurements.
pub const BATCHES: [usize; 4] = [1, 8, 32, 64];

/// Copies of each weight cycled through while timing, so that the weights (≥ 8 × 33 MB) never
/// sit in the 60 MB L2 between launches.
const COPIES: usize = 8;

/// Weight GB/s of the decode GEMM and of cuBLAS for Qwen3-8B's projection shapes and LM head.
pub fn gemm_bandwidth(be: &CudaBackend, copy_rate: f64) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (name, n, k) in [
        ("qkv fused", 6144, 4096),
        ("o_proj", 4096, 4096),
        ("gate|up fused", 24576, 4096),
        ("down", 4096, 12288),
        ("lm_head (+top-k)", 151_936, 4096),
    ] {
        let ws: Vec<CudaMatrix> = (0..COPIES)
            .map(|c| be.random_matrix(n, k, 0.02, 300 + c as u64))
            .collect::<Result<_>>()?;
        let bytes = (COPIES * n * k * 2) as f64;
        let mut line = format!(
            "  decode GEMM [{n} x {k}] {name} (split-K {}): GB/s (% of copy)",
            super::k_splits(n, k)
        );
        let mut row = serde_json::Map::new();
        for rows in BATCHES {
            let x = be.random_tensor(rows, k, 1.0, 0.0, 7)?;
            // Both own kernels (same bits, docs/cuda.md "Batch-invariant decode"), and what the
            // product runs (`DecodeGemmKernel::Auto`: the shape's proven cuBLASLt algorithm when
            // it timed faster than the own kernel, decode_lt.rs).
            let timed = |kernel| {
                be.set_decode_gemm_kernel(kernel);
                let t = time_median(be, 2, 10, || {
                    for w in &ws {
                        if n > 100_000 {
                            be.lm_head_topk(&x, w, 1)?;
                        } else {
                            be.matmul(&x, w)?;
                        }
                    }
                    Ok(())
                });
                be.set_decode_gemm_kernel(super::DecodeGemmKernel::default());
                t
            };
            let regs = timed(super::DecodeGemmKernel::Registers)?;
            let pipe = timed(super::DecodeGemmKernel::Pipelined)?;
            let ours = timed(super::DecodeGemmKernel::Auto)?;
            let cublas = if n > 100_000 {
                None
            } else {
                Some(time_median(be, 2, 10, || {
                    for w in &ws {
                        be.matmul_cublas(&x, w)?;
                    }
                    Ok(())
                })?)
            };
            let gbs = bytes / ours / 1e9;
            line += &format!(
                " | {rows}: {gbs:.0} ({:.0}%)",
                100.0 * gbs * 1e9 / copy_rate
            );
            line += &format!(
                " [own: regs {:.0} pipe {:.0}]",
                bytes / regs / 1e9,
                bytes / pipe / 1e9
            );
            if let Some(c) = cublas {
                line += &format!(" cuBLAS {:.0}", bytes / c / 1e9);
            }
            row.insert(
                rows.to_string(),
                json!({"gb_s": gbs, "registers_gb_s": bytes / regs / 1e9, "pipelined_gb_s": bytes / pipe / 1e9,
                       "cublas_gb_s": cublas.map(|c| bytes / c / 1e9),
                       "us_per_gemm": ours / COPIES as f64 * 1e6}),
            );
        }
        println!("{line}");
        out.insert(name.into(), Value::Object(row));
    }
    Ok(Value::Object(out))
}

/// Weight GB/s of the o_proj and down shapes at batch 1 and 64 for every K split (the choice
/// [`super::k_splits`] makes is fixed per shape; this measures the alternatives).
pub fn split_sweep(be: &CudaBackend) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (name, n, k) in [
        ("o_proj", 4096, 4096),
        ("down", 4096, 12288),
        ("qkv", 6144, 4096),
    ] {
        let ws: Vec<CudaMatrix> = (0..COPIES)
            .map(|c| be.random_matrix(n, k, 0.02, 400 + c as u64))
            .collect::<Result<_>>()?;
        let bytes = (COPIES * n * k * 2) as f64;
        let mut line = format!("  split sweep [{n} x {k}] {name}: GB/s at rows 1 / 64 per split");
        // The own kernel's splits (the pinned cuBLASLt route has its own).
        be.set_decode_gemm_kernel(super::DecodeGemmKernel::Own);
        for s in [1, 2, 4, 8, 16] {
            be.set_decode_splits_override(Some(s));
            let mut r = Vec::new();
            for rows in [1usize, 64] {
                let x = be.random_tensor(rows, k, 1.0, 0.0, 9)?;
                let t = time_median(be, 2, 10, || {
                    for w in &ws {
                        be.matmul(&x, w)?;
                    }
                    Ok(())
                })?;
                r.push(bytes / t / 1e9);
            }
            line += &format!(" | S={s}: {:.0} / {:.0}", r[0], r[1]);
            out.insert(format!("{name}_s{s}"), json!(r));
        }
        be.set_decode_splits_override(None);
        be.set_decode_gemm_kernel(super::DecodeGemmKernel::default());
        println!("{line}");
    }
    Ok(Value::Object(out))
}

/// Random prompt ids of HumanEval-like lengths (40..=250 tokens).
fn prompts(n: usize, vocab: usize) -> Vec<Vec<u32>> {
    let mut r = crate::util::DetRng::new(0x2545_f491_4f6c_dd1d);
    (0..n)
        .map(|_| {
            let len = 40 + r.below(211) as usize;
            (0..len).map(|_| r.below(vocab as u64) as u32).collect()
        })
        .collect()
}

/// Whole decode steps and greedy generation on `TargetModel` with random Qwen3-8B weights.
/// `one_at_a_time`: how many of the 64 prompts to also decode alone (the rest is extrapolated).
pub fn model_decode(
    be: &CudaBackend,
    copy_rate: f64,
    layers: usize,
    one_at_a_time: usize,
) -> Result<Value> {
    let spec = ModelSpec {
        num_layers: layers,
        ..qwen3_8b_spec()
    };
    let t0 = Instant::now();
    let model = TargetModel::load(be, &spec, &RandomWeights::new(&spec, 42))?;
    be.synchronize()?;
    println!(
        "  model: {layers} layers loaded from RandomWeights in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // Bytes a decode step must read: every layer matrix and the LM head (not the embedding).
    let (d, i, qd, kvd) = (
        spec.hidden_size,
        spec.intermediate_size,
        spec.num_heads * spec.head_dim,
        spec.num_kv_heads * spec.head_dim,
    );
    let layer_params = d * (qd + 2 * kvd) + qd * d + 2 * i * d + i * d;
    let step_bytes = ((layer_params * layers + spec.vocab_size * d) * 2) as f64;
    let all = prompts(64, spec.vocab_size);
    let mut out = serde_json::Map::new();

    // One decode step (forward_decode + top-1 LM head) of `rows` sequences whose caches hold
    // their prompts.
    let mut steps = serde_json::Map::new();
    for rows in BATCHES {
        let mut caches: Vec<KvCache<CudaBackend>> = Vec::new();
        for p in &all[..rows] {
            let mut c = model.new_cache();
            model.forward(be, p, &mut c, &Capture::none())?;
            caches.push(c);
        }
        let ids: Vec<u32> = (0..rows as u32).map(|r| 1000 + r).collect();
        // Each step appends one position to every cache (6 steps: lengths barely change).
        let t = time_median(be, 1, 5, || {
            let mut refs: Vec<&mut KvCache<CudaBackend>> = caches.iter_mut().collect();
            let h = model.forward_decode(be, &ids, &mut refs)?;
            model.logits_topk(be, &h, 1)?;
            Ok(())
        })?;
        let gbs = step_bytes / t / 1e9;
        // Whether the host keeps up: how long `forward_decode` takes to return (the launches
        // queued, nothing waited for), and the step's time when 5 steps are queued back to back
        // (no top-K download between them, so the host runs ahead and the GPU never waits).
        let mut issue = Vec::new();
        for _ in 0..5 {
            let mut refs: Vec<&mut KvCache<CudaBackend>> = caches.iter_mut().collect();
            let t0 = Instant::now();
            let h = model.forward_decode(be, &ids, &mut refs)?;
            issue.push(t0.elapsed().as_secs_f64());
            model.logits_topk(be, &h, 1)?;
        }
        issue.sort_by(f64::total_cmp);
        let issue = issue[2];
        let queued = time_median(be, 1, 3, || {
            for _ in 0..5 {
                let mut refs: Vec<&mut KvCache<CudaBackend>> = caches.iter_mut().collect();
                model.forward_decode(be, &ids, &mut refs)?;
            }
            Ok(())
        })? / 5.0;
        println!(
            "  decode step, batch {rows}: {:.2} ms, weights {gbs:.0} GB/s ({:.0}% of copy), {:.0} tokens/s; layers issued by the host in {:.2} ms, queued back to back {:.2} ms per step",
            t * 1e3,
            100.0 * gbs * 1e9 / copy_rate,
            rows as f64 / t,
            issue * 1e3,
            queued * 1e3
        );
        steps.insert(
            rows.to_string(),
            json!({"ms": t * 1e3, "weights_gb_s": gbs, "tokens_s": rows as f64 / t,
                   "host_issue_ms": issue * 1e3, "queued_layers_ms": queued * 1e3}),
        );
    }
    out.insert("step".into(), Value::Object(steps));
    out.insert("small_ops_us".into(), small_ops(be, spec.hidden_size)?);

    // Greedy generation, 64 prompts × 128 tokens, no EOS (every prompt runs the full length).
    let refs: Vec<&[u32]> = all.iter().map(Vec::as_slice).collect();
    let max_new = 128;
    be.synchronize()?;
    let t0 = Instant::now();
    let batched = greedy_batch(be, &model, &refs, max_new, &[])?;
    be.synchronize()?;
    let t_batched = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut agree = 0;
    for (p, b) in refs.iter().zip(&batched).take(one_at_a_time) {
        let c = greedy(be, &model, p, max_new, &[])?;
        agree += (c == *b) as usize;
    }
    be.synchronize()?;
    let t_alone = t0.elapsed().as_secs_f64();
    let alone_64 = t_alone / one_at_a_time.max(1) as f64 * 64.0;
    let tokens = batched.iter().map(|c| c.ids.len()).sum::<usize>();
    println!(
        "  greedy 64 prompts x {max_new} tokens: batched (one batch of {}) {t_batched:.1} s = {:.0} tokens/s; one at a time {t_alone:.1} s for {one_at_a_time} prompts (→ {alone_64:.1} s for 64); {agree}/{one_at_a_time} continuations identical",
        MAX_DECODE_ROWS.min(64),
        tokens as f64 / t_batched
    );
    out.insert(
        "greedy_64x128".into(),
        json!({"batched_s": t_batched, "tokens": tokens, "alone_s": t_alone, "alone_prompts": one_at_a_time,
               "alone_64_s_extrapolated": alone_64, "identical": agree}),
    );
    Ok(Value::Object(out))
}

/// Microseconds per call of a decode step's row norm (`rms_norm_rows`, twice per layer) at 1 and
/// 64 rows of `d` values, 200 calls back to back: its launch and latency cost, which the
/// per-layer trace of the step showed as large as a small GEMM's (docs/benchmarks-cuda.md,
/// "Session 11").
fn small_ops(be: &CudaBackend, d: usize) -> Result<Value> {
    let mut out = serde_json::Map::new();
    let w = be.random_tensor(1, d, 0.3, 1.0, 7)?;
    for rows in [1usize, 64] {
        let x = be.random_tensor(rows, d, 1.0, 0.0, 8)?;
        let calls = 200;
        let t = time_median(be, 1, 5, || {
            for _ in 0..calls {
                be.rms_norm_rows(&x, &w, 1e-6)?;
            }
            Ok(())
        })? / calls as f64;
        println!("  rms_norm_rows [{rows}, {d}]: {:.2} us per call", t * 1e6);
        out.insert(format!("rms_norm_rows_{rows}"), json!(t * 1e6));
    }
    // The decode attention at Qwen3-8B's shape (32 query heads, 8 KV heads of 128) for 1 and 64
    // sequences whose caches hold `len` keys; every call appends one key, as a step does.
    let shape = AttnShape {
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
    };
    for (rows, len) in [
        (1usize, 64usize),
        (1, 256),
        (1, 1024),
        (1, 4096),
        (64, 256),
        (64, 1024),
    ] {
        let kvd = shape.kv_heads * shape.head_dim;
        let q = be.random_tensor(rows, shape.heads * shape.head_dim, 1.0, 0.0, 9)?;
        let k = be.random_tensor(rows, kvd, 1.0, 0.0, 10)?;
        let v = be.random_tensor(rows, kvd, 1.0, 0.0, 11)?;
        let mut caches: Vec<(Option<CudaTensor>, Option<CudaTensor>)> = (0..rows)
            .map(|r| {
                Ok((
                    Some(be.random_tensor(len, kvd, 1.0, 0.0, 100 + r as u64)?),
                    Some(be.random_tensor(len, kvd, 1.0, 0.0, 200 + r as u64)?),
                ))
            })
            .collect::<Result<_>>()?;
        let calls = 20;
        // As the backend sizes the launch (one wave), then with one block per key chunk (the
        // kernel's scheduling before session 17): the same bits, so only the time differs. The
        // setting in force before (`DECODE_ATTN_BLOCKS`) is restored for the sections after.
        let mut time = |blocks: Option<usize>| -> Result<f64> {
            let before = be.set_decode_attention_blocks(blocks);
            let t = time_median(be, 1, 5, || {
                for _ in 0..calls {
                    let mut slots: Vec<KvSlot<'_, CudaTensor>> =
                        caches.iter_mut().map(|(k, v)| KvSlot { k, v }).collect();
                    be.attention_decode(&q, &k, &v, shape, &mut slots)?;
                }
                Ok(())
            });
            be.set_decode_attention_blocks(before);
            Ok(t? / calls as f64)
        };
        let t = time(None)?;
        let per_chunk = time(Some(super::DECODE_ATTN_MAX_CHUNKS))?;
        println!(
            "  decode attention, {rows} sequence(s) of ~{len} keys, 32/8 heads of 128 ({} chunks): {:.1} us per call (one block per chunk: {:.1} us)",
            super::decode_attn_chunks(len),
            t * 1e6,
            per_chunk * 1e6
        );
        out.insert(format!("attention_{rows}x{len}"), json!(t * 1e6));
        out.insert(
            format!("attention_{rows}x{len}_block_per_chunk"),
            json!(per_chunk * 1e6),
        );
    }
    Ok(Value::Object(out))
}

/// The whole section: copy rate, GEMM bandwidth, model decode. `DECODE_ALONE=N` (default 64)
/// decodes only the first N of the 64 prompts one at a time and extrapolates (device time).
pub fn run(be: &CudaBackend, quick: bool) -> Result<Value> {
    // `DECODE_ATTN_BLOCKS=N`: every decode attention with N blocks per (sequence, KV head), for
    // an A/B of whole steps (128: one block per key chunk, the scheduling before session 17).
    if let Ok(v) = std::env::var("DECODE_ATTN_BLOCKS") {
        let n: usize = v
            .parse()
            .map_err(|e| anyhow::anyhow!("DECODE_ATTN_BLOCKS={v}: {e}"))?;
        be.set_decode_attention_blocks(Some(n));
    }
    let copy_rate = copy_bandwidth(be, 4 << 30)?;
    println!(
        "decode: device copy {:.2} TB/s (read + write)",
        copy_rate / 1e12
    );
    // `DECODE_SECTIONS=model` skips the per-shape GEMM bandwidth and split sweep (a kernel trace
    // of the model's steps alone).
    let model_only = std::env::var("DECODE_SECTIONS").is_ok_and(|v| v == "model");
    let (gemm, sweep) = if model_only {
        (Value::Null, Value::Null)
    } else {
        (gemm_bandwidth(be, copy_rate)?, split_sweep(be)?)
    };
    let (layers, alone) = if quick { (4, 4) } else { (36, 64) };
    let alone = std::env::var("DECODE_ALONE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(alone)
        .min(64);
    let model = model_decode(be, copy_rate, layers, alone)?;
    let routes = be.decode_gemm_records();
    for r in &routes {
        println!(
            "  decode route [{} x {}]{}: {}{} (µs at rows {:?}: own {:?}, best cuBLASLt {:?}; {} candidates, {} failed the row-invariance proof)",
            r.out,
            r.inp,
            if r.f32_out { " f32" } else { "" },
            r.chosen,
            if r.remembered { ", remembered" } else { "" },
            super::decode_lt::TIMED_ROWS,
            r.own_us,
            r.lt_us,
            r.candidates,
            r.proofs_failed
        );
    }
    Ok(
        json!({"copy_tb_s": copy_rate / 1e12, "gemm": gemm, "split_sweep": sweep, "model": model, "routes": routes}),
    )
}
