//! The `lm-head` section of `examples/cuda_bench.rs` (docs/benchmarks-cuda.md): `lm_head_topk` at
//! the drafter evaluation's shapes (thousands of rows = anchors × block positions, Qwen3's
//! 151 936-id vocabulary, k = 8), the fused path (`kernels/lm_head_topk.cu`: no logits in memory)
//! against the unfused one (cuBLAS fp32 logits, then the top-K kernel), each against the FLOP
//! floor `2 · rows · vocab · hidden / 989 TFLOP/s` (the H100/H200 SXM dense bf16 peak; the
//! fraction of it a path reaches is `floor / time`). Both paths run in the same process through
//! [`CudaBackend::set_lm_head_path`], so one device call gives the A/B.

use super::bench::time_median;
use super::{CudaBackend, LmHeadPath};
use crate::backend::{Backend, TopK};
use anyhow::Result;
use serde_json::{json, Value};

/// Dense bf16 tensor-core peak of an H100 SXM (and H200), FLOP/s: the floor's divisor.
pub const PEAK_BF16_FLOPS: f64 = 989e12;

/// (rows, hidden) measured: 4 096 and 16 384 rows (a few hundred to a thousand anchors of a
/// 16-position block), hidden 2 048 and 4 096.
const SHAPES: [(usize, usize); 4] = [(4096, 2048), (4096, 4096), (16384, 2048), (16384, 4096)];
const VOCAB: usize = 151_936;
const K: usize = 8;
/// Rows per anchor in the drafter's scoring (a 16-token DFlash block: 15 drafted positions), for
/// the anchors/s column.
const ROWS_PER_ANCHOR: usize = 15;

/// Times both paths at every shape and compares their results (top-1 ids, log-probs).
pub fn run(be: &CudaBackend) -> Result<Value> {
    let restore = be.lm_head_path()?;
    let mut rows_out = Vec::new();
    for (rows, hidden) in SHAPES {
        let head = be.random_matrix(VOCAB, hidden, 0.02, 40 + hidden as u64)?;
        let x = be.random_tensor(rows, hidden, 1.0, 0.0, 41 + rows as u64)?;
        let flops = 2.0 * (rows * VOCAB * hidden) as f64;
        let floor_s = flops / PEAK_BF16_FLOPS;
        let timed = |path| -> Result<(f64, TopK, bool)> {
            be.set_lm_head_path(path);
            let before = be.lm_head_fused_calls();
            let out = be.lm_head_topk(&x, &head, K)?;
            let secs = time_median(be, 1, 5, || be.lm_head_topk(&x, &head, K).map(|_| ()))?;
            Ok((secs, out, be.lm_head_fused_calls() > before))
        };
        let (t_unfused, unfused, _) = timed(LmHeadPath::Unfused)?;
        let (t_fused, fused, ran_fused) = timed(LmHeadPath::Fused)?;
        let top1_agree = (0..rows)
            .filter(|&r| fused.row_ids(r)[0] == unfused.row_ids(r)[0])
            .count();
        let lp_max_diff = fused
            .logprobs
            .iter()
            .zip(&unfused.logprobs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let line = |name: &str, t: f64| {
            format!(
                "{name} {:.2} ms ({:.0} TFLOP/s, {:.0}% of the floor, {:.0} anchors/s)",
                t * 1e3,
                flops / t / 1e12,
                100.0 * floor_s / t,
                rows as f64 / ROWS_PER_ANCHOR as f64 / t
            )
        };
        println!(
            "  lm_head_topk [{rows} x {hidden}] x [{VOCAB} x {hidden}]^T, k {K}: floor {:.2} ms | {} | {}{} | fused/unfused {:.2}x; top-1 equal on {top1_agree}/{rows} rows, log-probs within {lp_max_diff:.1e}",
            floor_s * 1e3,
            line("unfused", t_unfused),
            line("fused", t_fused),
            if ran_fused { "" } else { " (FELL BACK TO UNFUSED)" },
            t_unfused / t_fused,
        );
        rows_out.push(json!({
            "rows": rows, "hidden": hidden, "vocab": VOCAB, "k": K,
            "floor_ms": floor_s * 1e3,
            "unfused_ms": t_unfused * 1e3, "fused_ms": t_fused * 1e3,
            "unfused_floor_ratio": floor_s / t_unfused, "fused_floor_ratio": floor_s / t_fused,
            "fused_ran": ran_fused,
            "top1_agree": top1_agree, "logprob_max_abs_diff": lp_max_diff,
        }));
    }
    be.set_lm_head_path(restore);
    Ok(
        json!({"peak_bf16_tflops": PEAK_BF16_FLOPS / 1e12, "rows_per_anchor": ROWS_PER_ANCHOR, "shapes": rows_out}),
    )
}
