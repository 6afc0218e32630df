//! The CPU reference backend: f32 weights, f32 activations, f32 accumulation.
//!
//! GEMMs go through the `gemm` crate (multi-threaded, SIMD); attention is computed per
//! (head, query chunk) with two GEMMs and an f32 softmax in between, parallel over heads and
//! chunks with rayon. Everything else is a straight loop over rows.

use super::{AttnMask, AttnShape, Backend, Rope, RopeStyle, TopK};
use anyhow::{bail, ensure, Result};
use gemm::Parallelism;
use rayon::prelude::*;

/// A row-major `[rows, cols]` f32 matrix in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// A weight `[out, in]`, row-major f32.
#[derive(Clone, Debug)]
pub struct CpuMatrix {
    pub out: usize,
    pub inp: usize,
    pub data: Vec<f32>,
}

#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// `dst[m, n] = lhs[m, k] · rhs` where `rhs` element (kk, j) is at `rhs[kk * rhs_rs + j * rhs_cs]`.
/// Single-threaded when `par` is false (callers that already run in parallel).
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: &[f32],
    lhs_rs: usize,
    rhs: &[f32],
    rhs_rs: usize,
    rhs_cs: usize,
    par: bool,
) {
    debug_assert!(dst.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    if m == 1 {
        // For one row the gemm crate takes a GEMV path whose summation order differs from its
        // blocked kernels, which for m ≥ 2 give every row the same bits whatever m is (their
        // k-blocking depends on k and the caches, not on m; shapes with n ≤ 64 take other
        // paths). Running a single row as two identical rows keeps row results independent of
        // how many rows share the call, which batched greedy decoding relies on
        // ([`Backend::max_independent_rows`]). The weight read dominates either way.
        let mut lhs2 = Vec::with_capacity(2 * k);
        lhs2.extend_from_slice(&lhs[..k]);
        lhs2.extend_from_slice(&lhs[..k]);
        let mut dst2 = vec![0f32; 2 * n];
        gemm_f32(2, n, k, &mut dst2, &lhs2, k, rhs, rhs_rs, rhs_cs, par);
        dst[..n].copy_from_slice(&dst2[..n]);
        return;
    }
    let parallelism = if par && m * n * k >= 1 << 18 {
        Parallelism::Rayon(threads())
    } else {
        Parallelism::None
    };
    // SAFETY: the slices cover every index the strides address: lhs is m×k with row stride
    // lhs_rs ≥ k, rhs is addressed at kk*rhs_rs + j*rhs_cs < rhs.len() (checked by callers'
    // shape checks), dst is m×n contiguous.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Rotary table for a set of positions: cos/sin `[positions.len(), rotary_dim/2]`, computed as
/// Hugging Face does (f32 inverse frequencies, f32 angle, then cos/sin).
fn rope_table(positions: &[u32], rope: &Rope) -> (Vec<f32>, Vec<f32>) {
    let half = rope.rotary_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / rope.theta.powf((2 * i) as f32 / rope.rotary_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for &f in &inv_freq {
            let angle = p as f32 * f;
            cos.push((angle as f64).cos() as f32);
            sin.push((angle as f64).sin() as f32);
        }
    }
    (cos, sin)
}

/// One attention problem for a contiguous group of query rows of one head: the query rows,
/// the key/value rows they may see (as index ranges into K/V), and a per-(query, key) visibility
/// predicate on absolute positions.
struct KeySpan {
    start: usize,
    end: usize,
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Matrix = CpuMatrix;
    type F32Buf = super::HostF32;

    fn name(&self) -> &'static str {
        "cpu"
    }
    fn dtype(&self) -> &'static str {
        "f32"
    }

    fn from_host(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        ensure!(
            data.len() == rows * cols,
            "tensor data has {} values, shape [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        );
        Ok(CpuTensor {
            rows,
            cols,
            data: data.to_vec(),
        })
    }
    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }
    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }
    fn matrix(&self, data: &[f32], out: usize, inp: usize) -> Result<CpuMatrix> {
        ensure!(
            data.len() == out * inp,
            "weight data has {} values, shape [{out}, {inp}] needs {}",
            data.len(),
            out * inp
        );
        Ok(CpuMatrix {
            out,
            inp,
            data: data.to_vec(),
        })
    }
    fn matrix_dims(&self, m: &CpuMatrix) -> (usize, usize) {
        (m.out, m.inp)
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuMatrix) -> Result<CpuTensor> {
        ensure!(
            x.cols == w.inp,
            "matmul: input has {} columns, weight expects {}",
            x.cols,
            w.inp
        );
        let mut out = vec![0f32; x.rows * w.out];
        // Wᵀ element (kk, j) = W[j, kk] = data[j * inp + kk]: row stride 1, column stride inp.
        gemm_f32(
            x.rows, w.out, w.inp, &mut out, &x.data, x.cols, &w.data, 1, w.inp, true,
        );
        Ok(CpuTensor {
            rows: x.rows,
            cols: w.out,
            data: out,
        })
    }

    fn add_row_bias(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<()> {
        ensure!(
            bias.data.len() == x.cols,
            "bias has {} values, rows have {}",
            bias.data.len(),
            x.cols
        );
        x.data.par_chunks_mut(x.cols).for_each(|row| {
            for (v, b) in row.iter_mut().zip(&bias.data) {
                *v += b;
            }
        });
        Ok(())
    }

    fn add_inplace(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        ensure!(
            (x.rows, x.cols) == (y.rows, y.cols),
            "add: shapes [{}, {}] and [{}, {}] differ",
            x.rows,
            x.cols,
            y.rows,
            y.cols
        );
        x.data
            .par_iter_mut()
            .zip(&y.data)
            .for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        eps: f32,
        group: usize,
    ) -> Result<CpuTensor> {
        ensure!(
            group > 0 && x.cols % group == 0,
            "rms_norm: {} columns are not a multiple of group {group}",
            x.cols
        );
        ensure!(
            weight.data.len() == group,
            "rms_norm: weight has {} values, group is {group}",
            weight.data.len()
        );
        let mut out = x.data.clone();
        out.par_chunks_mut(group).for_each(|g| {
            let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
            let r = 1.0 / (ms + eps).sqrt();
            for (v, w) in g.iter_mut().zip(&weight.data) {
                *v = *v * r * w;
            }
        });
        Ok(CpuTensor {
            rows: x.rows,
            cols: x.cols,
            data: out,
        })
    }

    fn rope_inplace(&self, x: &mut CpuTensor, positions: &[u32], rope: &Rope) -> Result<()> {
        ensure!(
            positions.len() == x.rows,
            "rope: {} positions for {} rows",
            positions.len(),
            x.rows
        );
        ensure!(
            x.cols % rope.head_dim == 0,
            "rope: {} columns are not whole heads of {}",
            x.cols,
            rope.head_dim
        );
        ensure!(
            rope.rotary_dim <= rope.head_dim && rope.rotary_dim % 2 == 0,
            "rope: bad rotary_dim {}",
            rope.rotary_dim
        );
        let half = rope.rotary_dim / 2;
        let (cos, sin) = rope_table(positions, rope);
        let cols = x.cols;
        x.data
            .par_chunks_mut(cols)
            .enumerate()
            .for_each(|(r, row)| {
                let c = &cos[r * half..(r + 1) * half];
                let s = &sin[r * half..(r + 1) * half];
                for head in row.chunks_mut(rope.head_dim) {
                    for i in 0..half {
                        let (a, b) = match rope.style {
                            RopeStyle::RotateHalf => (i, i + half),
                            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * c[i] - x1 * s[i];
                        head[b] = x1 * c[i] + x0 * s[i];
                    }
                }
            });
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<CpuTensor> {
        shape.check((q.rows, q.cols), (k.rows, k.cols), (v.rows, v.cols))?;
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        let tk = k.rows;

        // Split the query rows into independent jobs, each with the key spans it may read and the
        // absolute positions needed to apply the mask inside those spans.
        struct Job {
            q_rows: std::ops::Range<usize>,
            spans: Vec<KeySpan>,
        }
        let mut jobs: Vec<Job> = Vec::new();
        // Visibility of key row `kr` for query row `qr` (both tensor row indices).
        let visible: Box<dyn Fn(usize, usize) -> bool + Sync> = match mask {
            AttnMask::Causal { q_start } => {
                let q_start = *q_start;
                ensure!(
                    q_start + q.rows <= tk,
                    "attention: causal queries end at {} but only {tk} keys exist",
                    q_start + q.rows
                );
                const CHUNK: usize = 64;
                let mut r = 0;
                while r < q.rows {
                    let end = (r + CHUNK).min(q.rows);
                    jobs.push(Job {
                        q_rows: r..end,
                        spans: vec![KeySpan {
                            start: 0,
                            end: q_start + end,
                        }],
                    });
                    r = end;
                }
                Box::new(move |qr, kr| kr <= q_start + qr)
            }
            AttnMask::Blocks {
                ctx_len,
                block,
                anchors,
                ctx_inclusive,
                causal_in_block,
                window,
            } => {
                let (ctx_len, block, inclusive, causal, window) =
                    (*ctx_len, *block, *ctx_inclusive, *causal_in_block, *window);
                let n = anchors.len();
                ensure!(block > 0, "attention: block size 0");
                ensure!(
                    q.rows == n * block,
                    "attention: {} query rows for {n} blocks of {block}",
                    q.rows
                );
                ensure!(
                    tk == ctx_len + n * block,
                    "attention: {tk} keys, expected {ctx_len} context + {} block rows",
                    n * block
                );
                for (b, &a) in anchors.iter().enumerate() {
                    let lim = if inclusive {
                        (a + 1).min(ctx_len)
                    } else {
                        a.min(ctx_len)
                    };
                    jobs.push(Job {
                        q_rows: b * block..(b + 1) * block,
                        spans: vec![
                            KeySpan { start: 0, end: lim },
                            KeySpan {
                                start: ctx_len + b * block,
                                end: ctx_len + (b + 1) * block,
                            },
                        ],
                    });
                }
                let anchors = anchors.clone();
                Box::new(move |qr, kr| {
                    let b = qr / block;
                    let qoff = qr % block;
                    let qpos = anchors[b] + qoff;
                    let kpos = if kr < ctx_len {
                        kr
                    } else {
                        let kb = (kr - ctx_len) / block;
                        let koff = (kr - ctx_len) % block;
                        if kb != b || (causal && koff > qoff) {
                            return false;
                        }
                        anchors[b] + koff
                    };
                    match window {
                        Some(w) => kpos + w > qpos,
                        None => true,
                    }
                })
            }
        };

        let causal_start = match mask {
            AttnMask::Causal { q_start } => Some(*q_start),
            AttnMask::Blocks { .. } => None,
        };
        let group = heads / kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let qd = &q.data;
        let (kd, vd) = (&k.data, &v.data);
        let kcols = k.cols;
        // Each (job, head) writes a disjoint [rows, hd] patch; compute them in parallel and scatter.
        let patches: Vec<(usize, usize, Vec<f32>)> = jobs
            .par_iter()
            .enumerate()
            .flat_map_iter(|(ji, _)| (0..heads).map(move |h| (ji, h)))
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|(ji, h)| {
                let job = &jobs[ji];
                let kvh = h / group;
                let nq = job.q_rows.len();
                let nk: usize = job.spans.iter().map(|s| s.end - s.start).sum();
                // Gather this head's query rows contiguously.
                let mut qh = vec![0f32; nq * hd];
                for (i, r) in job.q_rows.clone().enumerate() {
                    qh[i * hd..(i + 1) * hd]
                        .copy_from_slice(&qd[r * q.cols + h * hd..r * q.cols + (h + 1) * hd]);
                }
                // scores[i, j] = q_i · k_j over the spans (keys read in place with stride kcols).
                let mut scores = vec![0f32; nq * nk.max(1)];
                let mut col = 0;
                let mut tmp = Vec::new();
                let single = job.spans.len() == 1;
                if single {
                    // One span (causal): the GEMM writes the scores in place, no staging copy.
                    let s = &job.spans[0];
                    let kbase = &kd[s.start * kcols + kvh * hd..];
                    gemm_f32(nq, nk, hd, &mut scores, &qh, hd, kbase, 1, kcols, false);
                }
                for s in job.spans.iter().filter(|_| !single) {
                    let len = s.end - s.start;
                    if len == 0 {
                        continue;
                    }
                    tmp.resize(nq * len, 0.0);
                    let kbase = &kd[s.start * kcols + kvh * hd..];
                    gemm_f32(nq, len, hd, &mut tmp, &qh, hd, kbase, 1, kcols, false);
                    for i in 0..nq {
                        scores[i * nk + col..i * nk + col + len]
                            .copy_from_slice(&tmp[i * len..(i + 1) * len]);
                    }
                    col += len;
                }
                // Mask, softmax in f32. A row that sees nothing gets zeros (cannot happen for
                // valid masks: every query sees at least itself).
                for (i, qr) in job.q_rows.clone().enumerate() {
                    let row = &mut scores[i * nk..(i + 1) * nk];
                    if let Some(q_start) = causal_start {
                        // Causal fast path (one span from key 0): the visible keys are a prefix,
                        // so neither the per-key mask call nor exp() runs on the masked tail.
                        // Same operations in the same order as the general path below, whose
                        // masked entries contribute exact zeros: the result is bit-identical.
                        let (live, dead) = row.split_at_mut((q_start + qr + 1).min(nk));
                        dead.fill(0.0);
                        let mut maxv = f32::NEG_INFINITY;
                        for x in live.iter_mut() {
                            *x *= scale;
                            maxv = maxv.max(*x);
                        }
                        let mut sum = 0f32;
                        for x in live.iter_mut() {
                            *x = (*x - maxv).exp();
                            sum += *x;
                        }
                        let inv = 1.0 / sum;
                        live.iter_mut().for_each(|x| *x *= inv);
                        continue;
                    }
                    let mut j = 0;
                    let mut maxv = f32::NEG_INFINITY;
                    for s in &job.spans {
                        for kr in s.start..s.end {
                            if visible(qr, kr) {
                                row[j] *= scale;
                                maxv = maxv.max(row[j]);
                            } else {
                                row[j] = f32::NEG_INFINITY;
                            }
                            j += 1;
                        }
                    }
                    if maxv == f32::NEG_INFINITY {
                        row.fill(0.0);
                        continue;
                    }
                    let mut sum = 0f32;
                    for x in row.iter_mut() {
                        *x = (*x - maxv).exp();
                        sum += *x;
                    }
                    let inv = 1.0 / sum;
                    row.iter_mut().for_each(|x| *x *= inv);
                }
                // out = P · V over the same spans.
                let mut out = vec![0f32; nq * hd];
                if single {
                    let s = &job.spans[0];
                    let vbase = &vd[s.start * kcols + kvh * hd..];
                    gemm_f32(nq, hd, nk, &mut out, &scores, nk, vbase, kcols, 1, false);
                    return (ji, h, out);
                }
                let mut col = 0;
                let mut part = vec![0f32; nq * hd];
                let mut pchunk = Vec::new();
                for s in &job.spans {
                    let len = s.end - s.start;
                    if len == 0 {
                        continue;
                    }
                    pchunk.resize(nq * len, 0.0);
                    for i in 0..nq {
                        pchunk[i * len..(i + 1) * len]
                            .copy_from_slice(&scores[i * nk + col..i * nk + col + len]);
                    }
                    let vbase = &vd[s.start * kcols + kvh * hd..];
                    gemm_f32(nq, hd, len, &mut part, &pchunk, len, vbase, kcols, 1, false);
                    out.iter_mut().zip(&part).for_each(|(o, p)| *o += p);
                    col += len;
                }
                (ji, h, out)
            })
            .collect();
        let mut out = vec![0f32; q.rows * q.cols];
        for (ji, h, patch) in patches {
            for (i, r) in jobs[ji].q_rows.clone().enumerate() {
                out[r * q.cols + h * hd..r * q.cols + (h + 1) * hd]
                    .copy_from_slice(&patch[i * hd..(i + 1) * hd]);
            }
        }
        Ok(CpuTensor {
            rows: q.rows,
            cols: q.cols,
            data: out,
        })
    }

    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        ensure!(
            (gate.rows, gate.cols) == (up.rows, up.cols),
            "swiglu: gate and up shapes differ"
        );
        let data = gate
            .data
            .par_iter()
            .zip(&up.data)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        Ok(CpuTensor {
            rows: gate.rows,
            cols: gate.cols,
            data,
        })
    }

    fn embed(&self, table: &CpuMatrix, ids: &[u32]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(ids.len() * table.inp);
        for &id in ids {
            let id = id as usize;
            if id >= table.out {
                bail!(
                    "token id {id} is outside the embedding table ({} rows)",
                    table.out
                );
            }
            data.extend_from_slice(&table.data[id * table.inp..(id + 1) * table.inp]);
        }
        Ok(CpuTensor {
            rows: ids.len(),
            cols: table.inp,
            data,
        })
    }

    /// In place and amortised O(rows of `y`): the KV cache grows by one row per decode step.
    fn append_rows(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        ensure!(
            x.cols == y.cols,
            "append_rows: {} columns after {}",
            y.cols,
            x.cols
        );
        x.data.extend_from_slice(&y.data);
        x.rows += y.rows;
        Ok(())
    }

    /// Every op works row by row, and `matmul` / `lm_head_topk` give a row the same bits in a
    /// call of any size (see `gemm_f32`; `batch_invariance` tests it at the model's shapes).
    fn max_independent_rows(&self) -> usize {
        usize::MAX
    }

    fn concat_rows(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let cols = parts.first().map(|p| p.cols).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| p.cols == cols),
            "concat_rows: column counts differ"
        );
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            data.extend_from_slice(&p.data);
        }
        Ok(CpuTensor {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            data,
        })
    }

    fn concat_cols(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let rows = parts.first().map(|p| p.rows).unwrap_or(0);
        ensure!(
            parts.iter().all(|p| p.rows == rows),
            "concat_cols: row counts differ"
        );
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for p in parts {
                data.extend_from_slice(&p.data[r * p.cols..(r + 1) * p.cols]);
            }
        }
        Ok(CpuTensor { rows, cols, data })
    }

    fn split_cols(&self, x: &CpuTensor, widths: &[usize]) -> Result<Vec<CpuTensor>> {
        ensure!(
            widths.iter().sum::<usize>() == x.cols,
            "split_cols: widths {widths:?} do not add up to {} columns",
            x.cols
        );
        let mut c0 = 0;
        Ok(widths
            .iter()
            .map(|&w| {
                let mut data = Vec::with_capacity(x.rows * w);
                for row in x.data.chunks_exact(x.cols.max(1)).take(x.rows) {
                    data.extend_from_slice(&row[c0..c0 + w]);
                }
                c0 += w;
                CpuTensor {
                    rows: x.rows,
                    cols: w,
                    data,
                }
            })
            .collect())
    }

    fn slice_rows(&self, x: &CpuTensor, start: usize, end: usize) -> Result<CpuTensor> {
        ensure!(
            start <= end && end <= x.rows,
            "slice_rows {start}..{end} out of {} rows",
            x.rows
        );
        Ok(CpuTensor {
            rows: end - start,
            cols: x.cols,
            data: x.data[start * x.cols..end * x.cols].to_vec(),
        })
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[u32]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            let r = r as usize;
            ensure!(r < x.rows, "gather_rows: row {r} out of {}", x.rows);
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        Ok(CpuTensor {
            rows: rows.len(),
            cols: x.cols,
            data,
        })
    }

    fn lm_head_topk(&self, x: &CpuTensor, head: &CpuMatrix, k: usize) -> Result<TopK> {
        ensure!(
            x.cols == head.inp,
            "lm_head: hidden has {} columns, head expects {}",
            x.cols,
            head.inp
        );
        let k = k.clamp(1, head.out);
        let vocab = head.out;
        // Rows in chunks so at most CHUNK × vocab logits exist at once (25 MB for SmolLM2's 49k
        // vocabulary, 78 MB for Qwen3's 152k). Each chunk reads the whole head (113 MB for
        // SmolLM2), so small chunks make drafter scoring memory-bound: 32 → 128 rows took it
        // from 77 to 110 anchors/s on 2 cores (256: 114, at twice the memory).
        const CHUNK: usize = 128;
        let mut ids = vec![0u32; x.rows * k];
        let mut logprobs = vec![0f32; x.rows * k];
        let mut logits = vec![0f32; CHUNK.min(x.rows.max(1)) * vocab];
        for start in (0..x.rows).step_by(CHUNK) {
            let n = CHUNK.min(x.rows - start);
            gemm_f32(
                n,
                vocab,
                head.inp,
                &mut logits[..n * vocab],
                &x.data[start * x.cols..],
                x.cols,
                &head.data,
                1,
                head.inp,
                true,
            );
            let out_ids = &mut ids[start * k..(start + n) * k];
            let out_lp = &mut logprobs[start * k..(start + n) * k];
            logits[..n * vocab]
                .par_chunks(vocab)
                .zip(out_ids.par_chunks_mut(k).zip(out_lp.par_chunks_mut(k)))
                .for_each(|(row, (ri, rl))| top_k_logsoftmax(row, k, ri, rl));
        }
        Ok(TopK {
            rows: x.rows,
            k,
            ids,
            logprobs,
        })
    }
}

/// `Σ exp(v − maxv)` over a row of logits (`maxv` its maximum).
///
/// Why not `f64::exp` per element: over a 49k vocabulary that was about as slow as the LM-head
/// GEMM itself in drafter scoring. [`exp_nonpos`] is plain f32 arithmetic that the compiler
/// vectorises; terms are summed in f32 within blocks of 256 (8 lanes of 32 terms, relative error
/// ≲ 32 ulp) and the blocks in f64, so the log-sum-exp stays within ~1e-6 of the f64 sum.
fn sum_exp_shifted(row: &[f32], maxv: f32) -> f64 {
    let mut total = 0f64;
    for block in row.chunks(256) {
        let mut lanes = [0f32; 8];
        let mut eights = block.chunks_exact(8);
        for c in &mut eights {
            for (lane, &v) in lanes.iter_mut().zip(c) {
                *lane += exp_nonpos(v - maxv);
            }
        }
        let tail: f32 = eights
            .remainder()
            .iter()
            .map(|&v| exp_nonpos(v - maxv))
            .sum();
        total += (lanes.iter().sum::<f32>() + tail) as f64;
    }
    total
}

/// `e^x` for `x ≤ 0` within 2 ulp (tested against f64); inputs below −87 count as −87
/// (e^−87 ≈ 1.6e-38, negligible in a sum that holds a 1), NaN stays NaN: `x = n·ln2 + r` with
/// `|r| ≤ ln2/2`, `e^r` by its degree-7 Taylor polynomial (truncation < 1e-8 relative), `2^n`
/// written into the exponent bits. Branch-free f32/u32 arithmetic, so loops over it vectorise.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split so that n·LN2_HI is exact for |n| ≤ 2^8
    const LN2_LO: f32 = 1.428_606_8e-6;
    // t = 1.5·2^23 + n rounds x·log2(e) to the nearest integer n, and t's low bits hold n.
    const ROUND: f32 = 12_582_912.0;
    let x = if x < -87.0 { -87.0 } else { x };
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // (t's bits + 127) << 23 keeps only the low 9 bits of 0x400000 + n + 127: the biased
    // exponent n + 127 ∈ [1, 127].
    p * f32::from_bits(t.to_bits().wrapping_add(127) << 23)
}

/// Top-k of log-softmax(row), best first, ties broken by the lower id.
pub fn top_k_logsoftmax(row: &[f32], k: usize, ids: &mut [u32], lps: &mut [f32]) {
    let maxv = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = maxv + sum_exp_shifted(row, maxv).ln() as f32;
    // Keep a small sorted buffer: vocabularies are large and k is small.
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        if best.len() == k && v <= best[k - 1].0 {
            continue;
        }
        let pos = best.partition_point(|&(bv, bi)| bv > v || (bv == v && bi < i as u32));
        best.insert(pos, (v, i as u32));
        best.truncate(k);
    }
    for (j, (v, i)) in best.into_iter().enumerate() {
        ids[j] = i;
        lps[j] = v - lse;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn t(rows: usize, cols: usize, seed: u32) -> CpuTensor {
        // Deterministic pseudo-random values in [-1, 1).
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        let data = (0..rows * cols)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect();
        CpuTensor { rows, cols, data }
    }

    /// Naive attention straight from the definition, for one query row at a time.
    fn naive_attention(
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: AttnShape,
        vis: impl Fn(usize, usize) -> bool,
    ) -> CpuTensor {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        let mut out = vec![0f32; q.rows * q.cols];
        for r in 0..q.rows {
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let mut s: Vec<(usize, f64)> = Vec::new();
                for j in 0..k.rows {
                    if vis(r, j) {
                        let dot: f64 = (0..hd)
                            .map(|d| {
                                q.data[r * q.cols + h * hd + d] as f64
                                    * k.data[j * k.cols + kvh * hd + d] as f64
                            })
                            .sum();
                        s.push((j, dot / (hd as f64).sqrt()));
                    }
                }
                let m = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x.1 - m).exp()).sum();
                for d in 0..hd {
                    out[r * q.cols + h * hd + d] = s
                        .iter()
                        .map(|&(j, sc)| {
                            (sc - m).exp() / z * v.data[j * v.cols + kvh * hd + d] as f64
                        })
                        .sum::<f64>() as f32;
                }
            }
        }
        CpuTensor {
            rows: q.rows,
            cols: q.cols,
            data: out,
        }
    }

    fn max_diff(a: &CpuTensor, b: &CpuTensor) -> f32 {
        a.data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn matmul_matches_naive() {
        let be = CpuBackend;
        let x = t(5, 7, 1);
        let w = t(3, 7, 2);
        let m = be.matrix(&w.data, 3, 7).unwrap();
        let y = be.matmul(&x, &m).unwrap();
        for r in 0..5 {
            for o in 0..3 {
                let want: f32 = (0..7).map(|i| x.data[r * 7 + i] * w.data[o * 7 + i]).sum();
                assert!((y.data[r * 3 + o] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn causal_attention_matches_naive_with_cache_offset() {
        let be = CpuBackend;
        let shape = AttnShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        // 70 cached keys + 90 new queries: exercises the 64-row chunking and the offset.
        let (q_start, nq) = (70, 90);
        let q = t(nq, 32, 3);
        let k = t(q_start + nq, 16, 4);
        let v = t(q_start + nq, 16, 5);
        let got = be
            .attention(&q, &k, &v, shape, &AttnMask::Causal { q_start })
            .unwrap();
        let want = naive_attention(&q, &k, &v, shape, |r, j| j <= q_start + r);
        assert!(
            max_diff(&got, &want) < 1e-5,
            "max diff {}",
            max_diff(&got, &want)
        );
    }

    #[test]
    fn block_attention_matches_naive_for_every_mask_option() {
        let be = CpuBackend;
        let shape = AttnShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let (ctx_len, block) = (20, 4);
        let anchors = vec![0usize, 5, 19, 12];
        let n = anchors.len();
        let q = t(n * block, 8, 6);
        let k = t(ctx_len + n * block, 4, 7);
        let v = t(ctx_len + n * block, 4, 8);
        for inclusive in [false, true] {
            for causal in [false, true] {
                for window in [None, Some(3)] {
                    let mask = AttnMask::Blocks {
                        ctx_len,
                        block,
                        anchors: anchors.clone(),
                        ctx_inclusive: inclusive,
                        causal_in_block: causal,
                        window,
                    };
                    let got = be.attention(&q, &k, &v, shape, &mask).unwrap();
                    let want = naive_attention(&q, &k, &v, shape, |r, j| {
                        let (b, qo) = (r / block, r % block);
                        let qpos = anchors[b] + qo;
                        let kpos = if j < ctx_len {
                            let ok = if inclusive {
                                j <= anchors[b]
                            } else {
                                j < anchors[b]
                            };
                            if !ok {
                                return false;
                            }
                            j
                        } else {
                            let (kb, ko) = ((j - ctx_len) / block, (j - ctx_len) % block);
                            if kb != b || (causal && ko > qo) {
                                return false;
                            }
                            anchors[b] + ko
                        };
                        window.map_or(true, |w| kpos + w > qpos)
                    });
                    assert!(
                        max_diff(&got, &want) < 1e-5,
                        "inclusive={inclusive} causal={causal} window={window:?}: {}",
                        max_diff(&got, &want)
                    );
                }
            }
        }
    }

    #[test]
    fn rope_styles_are_rotations_and_agree_up_to_permutation() {
        let be = CpuBackend;
        let hd = 8;
        let x = t(3, 2 * hd, 9);
        let pos = [0u32, 7, 1000];
        let rope = Rope {
            theta: 10000.0,
            head_dim: hd,
            rotary_dim: hd,
            style: RopeStyle::RotateHalf,
        };
        let mut a = x.clone();
        be.rope_inplace(&mut a, &pos, &rope).unwrap();
        // Position 0 is the identity.
        assert!(a.data[..2 * hd]
            .iter()
            .zip(&x.data[..2 * hd])
            .all(|(p, q)| (p - q).abs() < 1e-7));
        // Rotations keep the norm of each pair.
        for r in 0..3 {
            let n0: f32 = x.data[r * 16..r * 16 + 16].iter().map(|v| v * v).sum();
            let n1: f32 = a.data[r * 16..r * 16 + 16].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
        }
        // Interleaved on the permuted layout equals rotate-half on the original layout
        // (the GGUF Q/K permutation, docs/models.md §3.6: GGUF row 2i+h = HF row h*hd/2 + i).
        let perm = |src: &CpuTensor| {
            let mut o = src.clone();
            for r in 0..src.rows {
                for head in 0..2 {
                    for i in 0..hd / 2 {
                        for h in 0..2 {
                            o.data[r * 16 + head * hd + 2 * i + h] =
                                src.data[r * 16 + head * hd + h * hd / 2 + i];
                        }
                    }
                }
            }
            o
        };
        let mut b = perm(&x);
        be.rope_inplace(
            &mut b,
            &pos,
            &Rope {
                style: RopeStyle::Interleaved,
                ..rope.clone()
            },
        )
        .unwrap();
        assert!(max_diff(&b, &perm(&a)) < 1e-6);
    }

    #[test]
    fn lm_head_topk_matches_full_softmax() {
        let be = CpuBackend;
        // 300 rows: more than two of lm_head_topk's row chunks.
        let x = t(300, 6, 10);
        let w = t(50, 6, 11);
        let head = be.matrix(&w.data, 50, 6).unwrap();
        let top = be.lm_head_topk(&x, &head, 5).unwrap();
        for r in 0..300 {
            let logits: Vec<f64> = (0..50)
                .map(|o| {
                    (0..6)
                        .map(|i| x.data[r * 6 + i] as f64 * w.data[o * 6 + i] as f64)
                        .sum()
                })
                .collect();
            let lse = logits.iter().map(|v| v.exp()).sum::<f64>().ln();
            let mut order: Vec<usize> = (0..50).collect();
            order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
            for j in 0..5 {
                assert_eq!(top.row_ids(r)[j] as usize, order[j]);
                assert!((top.row_logprobs(r)[j] as f64 - (logits[order[j]] - lse)).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let be = CpuBackend;
        let x = t(2, 3, 1);
        let m = be.matrix(&t(4, 5, 2).data, 4, 5).unwrap();
        assert!(be.matmul(&x, &m).is_err());
        assert!(be.embed(&m, &[4]).is_err());
        assert!(be.slice_rows(&x, 1, 3).is_err());
        assert!(be.rms_norm(&x, &t(1, 2, 3), 1e-5, 2).is_err());
    }

    #[test]
    fn fused_trait_ops_equal_their_unfused_compositions() {
        let be = CpuBackend;
        // split_cols: exact column copies, inverse of concat_cols; widths must add up.
        let x = t(7, 3 + 5 + 2, 20);
        let parts = be.split_cols(&x, &[3, 5, 2]).unwrap();
        assert_eq!(parts.iter().map(|p| p.cols).collect::<Vec<_>>(), [3, 5, 2]);
        for r in 0..7 {
            assert_eq!(
                parts[1].data[r * 5..r * 5 + 5],
                x.data[r * 10 + 3..r * 10 + 8]
            );
        }
        let refs: Vec<&CpuTensor> = parts.iter().collect();
        assert_eq!(be.concat_cols(&refs).unwrap(), x);
        let err = be.split_cols(&x, &[3, 5]).unwrap_err().to_string();
        assert!(err.contains("do not add up to 10 columns"), "{err}");

        // matmul_acc: matmul then add_inplace, bit for bit.
        let (a, w) = (t(9, 6, 21), be.matrix(&t(4, 6, 22).data, 4, 6).unwrap());
        let h = t(9, 4, 23);
        let mut want = h.clone();
        be.add_inplace(&mut want, &be.matmul(&a, &w).unwrap())
            .unwrap();
        let mut got = h.clone();
        be.matmul_acc(&a, &w, &mut got).unwrap();
        assert_eq!(got, want);
        assert!(be.matmul_acc(&a, &w, &mut t(8, 4, 1)).is_err());

        // swiglu_packed on [gate | up] = swiglu(gate, up), bit for bit.
        let (g, u) = (t(5, 12, 24), t(5, 12, 25));
        let gu = be.concat_cols(&[&g, &u]).unwrap();
        assert_eq!(be.swiglu_packed(&gu).unwrap(), be.swiglu(&g, &u).unwrap());
        assert!(be.swiglu_packed(&t(2, 7, 1)).is_err());

        // A stacked projection gives the separate projections' columns (q | k | v).
        let xin = t(11, 16, 26);
        let (wq, wk, wv) = (t(8, 16, 27), t(4, 16, 28), t(4, 16, 29));
        let stacked: Vec<f32> = [&wq, &wk, &wv]
            .iter()
            .flat_map(|m| m.data.iter().copied())
            .collect();
        let qkv = be
            .matmul(&xin, &be.matrix(&stacked, 16, 16).unwrap())
            .unwrap();
        let split = be.split_cols(&qkv, &[8, 4, 4]).unwrap();
        for (part, wm) in split.iter().zip([&wq, &wk, &wv]) {
            let sep = be
                .matmul(&xin, &be.matrix(&wm.data, wm.rows, 16).unwrap())
                .unwrap();
            assert!(max_diff(part, &sep) < 1e-6);
        }

        // attention_varlen_qkv = split, per-head norms, RoPE, attention_varlen (bit for bit),
        // with and without q/k norms.
        let shape = AttnShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let starts = [0usize, 4, 11];
        let pos: Vec<u32> = (0..4).chain(0..7).collect();
        let rope = Rope {
            theta: 10000.0,
            head_dim: 4,
            rotary_dim: 4,
            style: RopeStyle::RotateHalf,
        };
        let (qn, kn) = (t(1, 4, 30), t(1, 4, 31));
        for with_norm in [false, true] {
            let [q, k, v] = [&split[0], &split[1], &split[2]].map(|p| p.clone());
            let (mut q, mut k) = if with_norm {
                (
                    be.rms_norm(&q, &qn, 1e-6, 4).unwrap(),
                    be.rms_norm(&k, &kn, 1e-6, 4).unwrap(),
                )
            } else {
                (q, k)
            };
            be.rope_inplace(&mut q, &pos, &rope).unwrap();
            be.rope_inplace(&mut k, &pos, &rope).unwrap();
            let want = be.attention_varlen(&q, &k, &v, shape, &starts).unwrap();
            let norm = with_norm.then_some(crate::backend::QkNorm {
                q: &qn,
                k: &kn,
                eps: 1e-6,
            });
            let got = be
                .attention_varlen_qkv(qkv.clone(), shape, norm, &pos, &rope, &starts)
                .unwrap();
            assert_eq!(got, want, "with_norm = {with_norm}");
        }
    }
}

#[cfg(test)]
mod softmax_exp {
    use super::*;

    /// Every f32 in [−87, 0] at a fine stride, plus the ends: within 2 ulp of the f64 `exp`.
    #[test]
    fn exp_nonpos_is_within_two_ulp_of_f64() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_nonpos(x) as f64;
            let ulp = f32::EPSILON as f64 * want;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.000_37;
        }
        assert!(worst <= 2.0, "worst error {worst:.2} ulp");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert!(exp_nonpos(-100.0) < 1.7e-38);
        assert!(exp_nonpos(f32::NEG_INFINITY) < 1.7e-38);
        assert!(exp_nonpos(f32::NAN).is_nan());
    }

    /// The log-sum-exp of a vocabulary-sized row agrees with the f64 one to 1e-6.
    #[test]
    fn sum_exp_shifted_matches_f64() {
        let row: Vec<f32> = super::tests::t(1, 49_157, 7)
            .data
            .iter()
            .map(|v| v * 20.0)
            .collect();
        let maxv = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: f64 = row.iter().map(|&v| ((v - maxv) as f64).exp()).sum();
        let got = sum_exp_shifted(&row, maxv);
        assert!(
            (got.ln() - want.ln()).abs() < 1e-6,
            "{} vs {}",
            got.ln(),
            want.ln()
        );
    }
}

#[cfg(test)]
mod batch_invariance {
    use super::*;

    /// Row r of `x · Wᵀ` and of the LM head's top-k must not depend on which other rows share the
    /// call: batched greedy decoding (`generate::greedy_batch`) promises each prompt the
    /// continuation it gets alone. Checked for every window of 1..=rows rows against the full
    /// batch, at SmolLM2's projection shapes (576 → 576 / 960 / 3072, 1536 → 576) and a head
    /// with a vocabulary that is no multiple of any tile.
    #[test]
    fn matmul_rows_are_bit_identical_alone_and_in_a_batch() {
        let be = CpuBackend;
        let shapes = [
            (16, 576, 960),
            (9, 1536, 576),
            (5, 576, 3072),
            (3, 576, 4099),
        ];
        for (rows, inp, out) in shapes {
            let x = rand((rows * inp) as u32, rows * inp);
            let w = be.matrix(&rand(out as u32, out * inp), out, inp).unwrap();
            let batch = be.from_host(&x, rows, inp).unwrap();
            let all = be.matmul(&batch, &w).unwrap();
            let top_all = be.lm_head_topk(&batch, &w, 3).unwrap();
            for r in 0..rows {
                for m in 1..=rows - r {
                    let sub = be.from_host(&x[r * inp..(r + m) * inp], m, inp).unwrap();
                    let y = be.matmul(&sub, &w).unwrap();
                    let want = &all.data[r * out..(r + 1) * out];
                    assert!(
                        y.data[..out]
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "[{rows}×{inp}]·[{out}×{inp}]ᵀ: row {r} differs in a call of {m} rows"
                    );
                    let top = be.lm_head_topk(&sub, &w, 3).unwrap();
                    assert_eq!(
                        top.row_ids(0),
                        top_all.row_ids(r),
                        "top-k ids, row {r}, {m} rows"
                    );
                    assert_eq!(
                        top.row_logprobs(0),
                        top_all.row_logprobs(r),
                        "top-k log-probs, row {r}, {m} rows"
                    );
                }
            }
        }
    }

    #[test]
    fn append_rows_equals_concat_rows() {
        let be = CpuBackend;
        let mut x = be.from_host(&rand(1, 6), 2, 3).unwrap();
        let y = be.from_host(&rand(2, 9), 3, 3).unwrap();
        let want = be.concat_rows(&[&x, &y]).unwrap();
        be.append_rows(&mut x, &y).unwrap();
        assert_eq!(
            (x.rows, x.cols, &x.data),
            (want.rows, want.cols, &want.data)
        );
        let bad = be.from_host(&rand(3, 4), 1, 4).unwrap();
        let err = be.append_rows(&mut x, &bad).unwrap_err().to_string();
        assert!(err.contains("4 columns after 3"), "{err}");
    }

    fn rand(seed: u32, n: usize) -> Vec<f32> {
        super::tests::t(1, n, seed).data
    }
}
