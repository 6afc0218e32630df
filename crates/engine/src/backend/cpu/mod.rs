//! The CPU reference backend: f32 weights, f32 activations, f32 accumulation.
//!
//! GEMMs go through the `gemm` crate (multi-threaded, SIMD); attention is computed per
//! (head, query chunk) with two GEMMs and an f32 softmax in between, parallel over heads and
//! chunks with rayon. Everything else is a straight loop over rows.

mod attention;

use super::{AttnExtras, AttnMask, AttnShape, Backend, Rope, RopeFreqs, RopeStyle, TopK};
use anyhow::Result;
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

fn rayon_threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// A row-major left operand read in place: row r starts at `data[r * stride]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    stride: usize,
}

/// A right operand read in place through strides: element (kk, j) is at
/// `data[kk * rs + j * cs]` (so `Wᵀ` of a row-major `[out, in]` weight is `rs = 1, cs = in`).
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

/// Where a GEMM runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Threads {
    /// Spread over rayon's threads (large products).
    Rayon,
    /// On the calling thread (callers that already run in parallel).
    Caller,
}

/// `dst[m, n] = lhs[m, k] · rhs[k, n]`, `dst` contiguous.
fn gemm_f32(
    dst: &mut [f32],
    (m, n, k): (usize, usize, usize),
    lhs: Rows<'_>,
    rhs: Strided<'_>,
    threads: Threads,
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
        lhs2.extend_from_slice(&lhs.data[..k]);
        lhs2.extend_from_slice(&lhs.data[..k]);
        let mut dst2 = vec![0f32; 2 * n];
        let lhs2 = Rows {
            data: &lhs2,
            stride: k,
        };
        gemm_f32(&mut dst2, (2, n, k), lhs2, rhs, threads);
        dst[..n].copy_from_slice(&dst2[..n]);
        return;
    }
    let parallelism = if threads == Threads::Rayon && m * n * k >= 1 << 18 {
        Parallelism::Rayon(rayon_threads())
    } else {
        Parallelism::None
    };
    // SAFETY: the slices cover every index the strides address: lhs is m×k with row stride
    // ≥ k, rhs is addressed at kk*rs + j*cs < rhs.data.len() (checked by callers' shape
    // checks), dst is m×n contiguous.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.data.as_ptr(),
            1,
            lhs.stride as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
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
/// Hugging Face does (f32 inverse frequencies, f32 angle, then cos/sin, each times the
/// frequencies' `attention_scaling` in f32: 1 for plain RoPE, which leaves them unchanged).
fn rope_table(positions: &[u32], freqs: &RopeFreqs) -> (Vec<f32>, Vec<f32>) {
    let half = freqs.rotary_dim / 2;
    let scale = freqs.attention_scaling;
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for &f in &freqs.inv_freq {
            let angle = p as f32 * f;
            cos.push((angle as f64).cos() as f32 * scale);
            sin.push((angle as f64).sin() as f32 * scale);
        }
    }
    (cos, sin)
}

/// Rotate every head of the row-major `data` (`cols` columns, row r at `positions[r]`) in place:
/// the CPU's rotary embedding, and the host reference of [`Backend::rope_freqs_inplace`].
pub(crate) fn rotate_rows(data: &mut [f32], cols: usize, positions: &[u32], freqs: &RopeFreqs) {
    let half = freqs.rotary_dim / 2;
    let (cos, sin) = rope_table(positions, freqs);
    data.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let c = &cos[r * half..(r + 1) * half];
            let s = &sin[r * half..(r + 1) * half];
            for head in row.chunks_mut(freqs.head_dim) {
                for i in 0..half {
                    let (a, b) = match freqs.style {
                        RopeStyle::RotateHalf => (i, i + half),
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c[i] - x1 * s[i];
                    head[b] = x1 * c[i] + x0 * s[i];
                }
            }
        });
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

    fn from_host_impl(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
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
    fn matrix_impl(&self, data: &[f32], out: usize, inp: usize) -> Result<CpuMatrix> {
        Ok(CpuMatrix {
            out,
            inp,
            data: data.to_vec(),
        })
    }
    fn matrix_dims(&self, m: &CpuMatrix) -> (usize, usize) {
        (m.out, m.inp)
    }

    fn matmul_impl(&self, x: &CpuTensor, w: &CpuMatrix) -> Result<CpuTensor> {
        let mut out = vec![0f32; x.rows * w.out];
        // Wᵀ element (kk, j) = W[j, kk] = data[j * inp + kk]: row stride 1, column stride inp.
        gemm_f32(
            &mut out,
            (x.rows, w.out, w.inp),
            Rows {
                data: &x.data,
                stride: x.cols,
            },
            Strided {
                data: &w.data,
                rs: 1,
                cs: w.inp,
            },
            Threads::Rayon,
        );
        Ok(CpuTensor {
            rows: x.rows,
            cols: w.out,
            data: out,
        })
    }

    fn add_row_bias_impl(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<()> {
        x.data.par_chunks_mut(x.cols).for_each(|row| {
            for (v, b) in row.iter_mut().zip(&bias.data) {
                *v += b;
            }
        });
        Ok(())
    }

    fn add_inplace_impl(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        x.data
            .par_iter_mut()
            .zip(&y.data)
            .for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn rms_norm_impl(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        eps: f32,
        group: usize,
    ) -> Result<CpuTensor> {
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

    fn rope_inplace_impl(&self, x: &mut CpuTensor, positions: &[u32], rope: &Rope) -> Result<()> {
        rotate_rows(&mut x.data, x.cols, positions, &RopeFreqs::of_rope(rope));
        Ok(())
    }

    fn rope_freqs_impl(
        &self,
        x: &mut CpuTensor,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> Result<()> {
        rotate_rows(&mut x.data, x.cols, positions, freqs);
        Ok(())
    }

    fn attention_impl(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<CpuTensor> {
        attention::attention(q, k, v, shape, mask)
    }

    fn attention_ext_impl(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: AttnShape,
        mask: &AttnMask,
        extras: AttnExtras<'_>,
    ) -> Result<CpuTensor> {
        attention::attention_ext(q, k, v, shape, mask, extras)
    }

    fn supports_attention_sinks(&self) -> bool {
        true
    }

    fn clamped_swiglu_impl(&self, gu: &CpuTensor, alpha: f32, limit: f32) -> Result<CpuTensor> {
        let data: Vec<f32> = gu
            .data
            .par_chunks(gu.cols.max(1) * 64)
            .flat_map_iter(|rows| super::gpt_oss::clamped_swiglu(rows, gu.cols, alpha, limit))
            .collect();
        Ok(CpuTensor {
            rows: gu.rows,
            cols: gu.cols / 2,
            data,
        })
    }

    fn swiglu_impl(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
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

    fn embed_impl(&self, table: &CpuMatrix, ids: &[u32]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(ids.len() * table.inp);
        for &id in ids {
            let id = id as usize;
            data.extend_from_slice(&table.data[id * table.inp..(id + 1) * table.inp]);
        }
        Ok(CpuTensor {
            rows: ids.len(),
            cols: table.inp,
            data,
        })
    }

    /// In place and amortised O(rows of `y`): the KV cache grows by one row per decode step.
    fn append_rows_impl(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        x.data.extend_from_slice(&y.data);
        x.rows += y.rows;
        Ok(())
    }

    /// Every op works row by row, and `matmul` / `lm_head_topk` give a row the same bits in a
    /// call of any size (see `gemm_f32`; `batch_invariance` tests it at the model's shapes).
    fn max_independent_rows(&self) -> usize {
        usize::MAX
    }

    fn concat_rows_impl(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let cols = parts.first().map(|p| p.cols).unwrap_or(0);
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

    fn concat_cols_impl(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let rows = parts.first().map(|p| p.rows).unwrap_or(0);
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for p in parts {
                data.extend_from_slice(&p.data[r * p.cols..(r + 1) * p.cols]);
            }
        }
        Ok(CpuTensor { rows, cols, data })
    }

    fn split_cols_impl(&self, x: &CpuTensor, widths: &[usize]) -> Result<Vec<CpuTensor>> {
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

    fn slice_rows_impl(&self, x: &CpuTensor, start: usize, end: usize) -> Result<CpuTensor> {
        Ok(CpuTensor {
            rows: end - start,
            cols: x.cols,
            data: x.data[start * x.cols..end * x.cols].to_vec(),
        })
    }

    fn add_weighted_rows_impl(
        &self,
        acc: &mut CpuTensor,
        src: &CpuTensor,
        index: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        super::moe::add_weighted_rows(&mut acc.data, &src.data, acc.cols, index, weights);
        Ok(())
    }
    fn gather_rows_impl(&self, x: &CpuTensor, rows: &[u32]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            let r = r as usize;
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        Ok(CpuTensor {
            rows: rows.len(),
            cols: x.cols,
            data,
        })
    }

    fn lm_head_topk_impl(&self, x: &CpuTensor, head: &CpuMatrix, k: usize) -> Result<TopK> {
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
                &mut logits[..n * vocab],
                (n, vocab, head.inp),
                Rows {
                    data: &x.data[start * x.cols..],
                    stride: x.cols,
                },
                Strided {
                    data: &head.data,
                    rs: 1,
                    cs: head.inp,
                },
                Threads::Rayon,
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
mod tests;
