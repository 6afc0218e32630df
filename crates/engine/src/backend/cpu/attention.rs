//! The CPU reference attention: per (job, head), a scores GEMM, an f32 masked softmax, and a
//! values GEMM, parallel over jobs and heads with rayon.
//!
//! Which keys a query row sees comes from [`AttnMask::key_intervals`] (`backend/mask.rs`), the
//! masks' one interpretation (with gpt-oss's sliding window, [`mask::causal_window`]); this file
//! only decides how to batch the work. gpt-oss's per-head sink logit joins the softmax's
//! denominator in [`masked_softmax`] ([`AttnExtras::sinks`]).

use super::{gemm_f32, CpuTensor, Rows, Strided, Threads};
use crate::backend::{mask, AttnExtras, AttnMask, AttnShape, KeyIntervals};
use anyhow::Result;
use rayon::prelude::*;
use std::ops::Range;

/// Query rows computed together and the key rows their GEMMs read: from key 0 to the furthest
/// end of the rows' first intervals, then (when any row has one) the hull of their second
/// intervals. Keys inside the spans that a row does not see get probability exactly 0. The first
/// span starts at key 0 whatever a window hides, so the GEMM shapes (and with them the order of
/// summation) depend only on the anchors.
struct Job {
    q_rows: Range<usize>,
    spans: Vec<Range<usize>>,
}

impl Job {
    fn keys(&self) -> usize {
        self.spans.iter().map(|s| s.len()).sum()
    }
}

/// Causal rows go in chunks of 64, drafter blocks one block per job.
fn jobs(mask: &AttnMask, iv: &[KeyIntervals]) -> Vec<Job> {
    let rows_per_job = match mask {
        AttnMask::Causal { .. } => 64,
        AttnMask::Blocks { block, .. } => *block,
    };
    (0..iv.len())
        .step_by(rows_per_job.max(1))
        .map(|r0| {
            let q_rows = r0..(r0 + rows_per_job).min(iv.len());
            let rows = &iv[q_rows.clone()];
            let first_end = rows.iter().map(|r| r.first.end).max().unwrap_or(0);
            let mut spans = Vec::with_capacity(2);
            spans.push(0..first_end);
            let seconds = || rows.iter().map(|r| &r.second).filter(|s| !s.is_empty());
            if let (Some(lo), Some(hi)) = (
                seconds().map(|s| s.start).min(),
                seconds().map(|s| s.end).max(),
            ) {
                spans.push(lo..hi);
            }
            Job { q_rows, spans }
        })
        .collect()
}

/// What every (job, head) reads.
struct Inputs<'a> {
    q: &'a CpuTensor,
    k: &'a CpuTensor,
    v: &'a CpuTensor,
    iv: &'a [KeyIntervals],
    /// Query heads per KV head.
    group: usize,
    hd: usize,
    scale: f32,
    /// Per query head, the sink logit (gpt-oss), if any.
    sinks: Option<&'a [f32]>,
}

/// [`crate::backend::Backend::attention`] on the CPU (shapes already checked).
pub(super) fn attention(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    shape: AttnShape,
    mask: &AttnMask,
) -> Result<CpuTensor> {
    attention_ext(q, k, v, shape, mask, AttnExtras::NONE)
}

/// [`crate::backend::Backend::attention_ext`] on the CPU (shapes and extras already checked):
/// the window narrows each row's keys, the sink joins each row's softmax.
pub(super) fn attention_ext(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    shape: AttnShape,
    mask: &AttnMask,
    extras: AttnExtras<'_>,
) -> Result<CpuTensor> {
    let mut iv = mask.key_intervals(q.rows, k.rows)?;
    if let Some(w) = extras.window {
        mask::causal_window(mask, &mut iv, w)?;
    }
    let jobs = jobs(mask, &iv);
    let hd = shape.head_dim;
    let x = Inputs {
        q,
        k,
        v,
        iv: &iv,
        group: shape.heads / shape.kv_heads,
        hd,
        scale: 1.0 / (hd as f32).sqrt(),
        sinks: extras.sinks,
    };
    // Each (job, head) writes a disjoint [rows, hd] patch; compute them in parallel and scatter.
    let tasks: Vec<(usize, usize)> = (0..jobs.len())
        .flat_map(|ji| (0..shape.heads).map(move |h| (ji, h)))
        .collect();
    let patches: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(ji, h)| (ji, h, head_attention(&jobs[ji], h, &x)))
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

/// Attention of query head `h` over one job's rows: `[rows, hd]`.
fn head_attention(job: &Job, h: usize, x: &Inputs<'_>) -> Vec<f32> {
    let (hd, kvh) = (x.hd, h / x.group);
    let nq = job.q_rows.len();
    let nk = job.keys();
    // This head's query rows, contiguous.
    let mut qh = vec![0f32; nq * hd];
    for (i, r) in job.q_rows.clone().enumerate() {
        let row = r * x.q.cols + h * hd;
        qh[i * hd..(i + 1) * hd].copy_from_slice(&x.q.data[row..row + hd]);
    }
    let mut scores = scores(job, &qh, x.k, kvh * hd, hd, nk);
    let sink = x.sinks.map(|s| s[h]);
    for (i, qr) in job.q_rows.clone().enumerate() {
        masked_softmax(
            &mut scores[i * nk..(i + 1) * nk],
            job,
            &x.iv[qr],
            x.scale,
            sink,
        );
    }
    weighted_values(job, &scores, x.v, kvh * hd, hd, nk)
}

/// `scores[i, j] = q_i · k_j` over the job's spans (keys read in place with their row stride),
/// `[rows, nk]`; `k_col` is the first column of the KV head.
fn scores(job: &Job, qh: &[f32], k: &CpuTensor, k_col: usize, hd: usize, nk: usize) -> Vec<f32> {
    let nq = job.q_rows.len();
    let q_rows = Rows {
        data: qh,
        stride: hd,
    };
    // Kᵀ of the KV head from key row `start` on, read in place.
    let keys = |start: usize| Strided {
        data: &k.data[start * k.cols + k_col..],
        rs: 1,
        cs: k.cols,
    };
    let mut scores = vec![0f32; nq * nk.max(1)];
    if let [s] = job.spans.as_slice() {
        // One span (causal): the GEMM writes the scores in place, no staging copy.
        gemm_f32(
            &mut scores,
            (nq, nk, hd),
            q_rows,
            keys(s.start),
            Threads::Caller,
        );
        return scores;
    }
    let (mut col, mut tmp) = (0, Vec::new());
    for s in job.spans.iter().filter(|s| !s.is_empty()) {
        let len = s.len();
        tmp.resize(nq * len, 0.0);
        gemm_f32(
            &mut tmp,
            (nq, len, hd),
            q_rows,
            keys(s.start),
            Threads::Caller,
        );
        for i in 0..nq {
            scores[i * nk + col..i * nk + col + len].copy_from_slice(&tmp[i * len..(i + 1) * len]);
        }
        col += len;
    }
    scores
}

/// Scale, mask and softmax one row of scores in f32, in place. A row that sees nothing gets
/// zeros (cannot happen for valid masks: every query sees at least itself). With a `sink` logit
/// (gpt-oss, `eager_attention_forward`: the sink is concatenated to the scaled, masked scores,
/// the maximum subtracted over both, the softmax taken and the sink's column dropped), the
/// maximum includes the sink and `exp(sink − max)` joins the sum after the keys.
fn masked_softmax(row: &mut [f32], job: &Job, iv: &KeyIntervals, scale: f32, sink: Option<f32>) {
    let prefix = iv.first.start == 0 && iv.second.is_empty();
    if job.spans.len() == 1 && job.spans[0].start == 0 && prefix && sink.is_none() {
        // Fast path (one span from key 0, a prefix visible: causal rows): neither the per-key
        // mask test nor exp() runs on the masked tail. Same operations in the same order as the
        // general path below, whose masked entries contribute exact zeros: bit-identical.
        let visible = if iv.first.start == 0 { iv.first.end } else { 0 };
        let (live, dead) = row.split_at_mut(visible.min(row.len()));
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
        return;
    }
    let mut maxv = sink.unwrap_or(f32::NEG_INFINITY);
    let keys = job.spans.iter().flat_map(|s| s.clone());
    for (x, kr) in row.iter_mut().zip(keys) {
        if iv.contains(kr) {
            *x *= scale;
            maxv = maxv.max(*x);
        } else {
            *x = f32::NEG_INFINITY;
        }
    }
    if maxv == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0f32;
    for x in row.iter_mut() {
        *x = (*x - maxv).exp();
        sum += *x;
    }
    if let Some(z) = sink {
        sum += (z - maxv).exp();
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|x| *x *= inv);
}

/// `out = P · V` over the job's spans, `[rows, hd]`; `v_col` is the first column of the KV head.
fn weighted_values(
    job: &Job,
    probs: &[f32],
    v: &CpuTensor,
    v_col: usize,
    hd: usize,
    nk: usize,
) -> Vec<f32> {
    let nq = job.q_rows.len();
    // V of the KV head from key row `start` on, read in place.
    let values = |start: usize| Strided {
        data: &v.data[start * v.cols + v_col..],
        rs: v.cols,
        cs: 1,
    };
    let mut out = vec![0f32; nq * hd];
    if let [s] = job.spans.as_slice() {
        let p = Rows {
            data: probs,
            stride: nk,
        };
        gemm_f32(&mut out, (nq, hd, nk), p, values(s.start), Threads::Caller);
        return out;
    }
    let mut col = 0;
    let mut part = vec![0f32; nq * hd];
    let mut pchunk = Vec::new();
    for s in job.spans.iter().filter(|s| !s.is_empty()) {
        let len = s.len();
        pchunk.resize(nq * len, 0.0);
        for i in 0..nq {
            pchunk[i * len..(i + 1) * len]
                .copy_from_slice(&probs[i * nk + col..i * nk + col + len]);
        }
        let p = Rows {
            data: &pchunk,
            stride: len,
        };
        gemm_f32(
            &mut part,
            (nq, hd, len),
            p,
            values(s.start),
            Threads::Caller,
        );
        out.iter_mut().zip(&part).for_each(|(o, p)| *o += p);
        col += len;
    }
    out
}
