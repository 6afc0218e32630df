//! The LM head fused with its top-K (docs/cuda.md, "The LM head's top-K"; kernels/lm_head_topk.cu):
//! for more than 64 rows with `LmHeadPath::Fused`, per row the k best ids and log-probs without the
//! logits in memory. Checked against the CPU backend at 65, 300 and 4 097 rows (the last compared on
//! a sample of its rows: both row-block edges, the partial last block and every 61st row), a
//! vocabulary of 1 003 ids (no multiple of any tile) and Qwen3's 151 936 (38 slices), hidden sizes
//! 64 and 2 048, k = 1, 8, 16 and 64:
//! - random bf16 data: ids equal wherever the reference's neighbouring log-probs differ by more
//!   than 1e-4, log-probs within 1e-3 (the `lm_head_topk` row of docs/cuda.md's tolerance table);
//! - integer data (exact logits in any order of summation, many exact ties): ids exactly the CPU's,
//!   ties to the lower id, log-probs within 1e-5 relative;
//! - planted ties: a few dominant rows of W copied to ids on both sides of the kernel's tile
//!   (256), warp-column (64), round (16) and slice (4 096) boundaries and to the last id, plus
//!   near-copies one step apart: ids exactly the CPU's.
//!
//! And: the fused path agrees with the unfused one (cuBLAS logits + top-K) under the same rule;
//! up to 64 rows the switch changes nothing (bit for bit, the decode path); operands the kernel
//! does not take (hidden size not a multiple of 8) fall back to the unfused path. Every test
//! checks through `lm_head_fused_calls` that the fused kernel did (or did not) run. Without a GPU
//! every test prints "SKIP: CUDA unavailable: <reason>" and passes.
#![cfg(feature = "cuda")]

mod cuda_util;
use cuda_util::gpu;

use draftlens_engine::backend::cpu::{CpuBackend, CpuMatrix};
use draftlens_engine::backend::cuda::{CudaBackend, CudaMatrix, CudaTensor, LmHeadPath};
use draftlens_engine::backend::{Backend, TopK};
use draftlens_engine::util::{round_bf16, DetRng};

const ROW_COUNTS: [usize; 3] = [65, 300, 4097];
const VOCABS: [usize; 2] = [1003, 151_936];
const HIDDEN: [usize; 2] = [64, 2048];
const KS: [usize; 4] = [1, 8, 16, 64];

/// The rows of `rows` compared with the CPU: all up to 300; else the first 64, every 61st, and
/// the last 65 (the partial last row block of 128 included).
fn sampled(rows: usize) -> Vec<usize> {
    if rows <= 300 {
        return (0..rows).collect();
    }
    let mut s: Vec<usize> = (0..64).chain((64..rows).step_by(61)).collect();
    s.extend(rows - 65..rows);
    s.sort_unstable();
    s.dedup();
    s
}

/// `rows` rows of `x` (`[_, cols]`) gathered.
fn gather(x: &[f32], cols: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| x[r * cols..(r + 1) * cols].iter().copied())
        .collect()
}

/// An LM head `[vocab, hidden]` on both backends.
struct Head {
    hidden: usize,
    cpu: CpuMatrix,
    gpu: CudaMatrix,
}

impl Head {
    fn new(be: &CudaBackend, w: Vec<f32>, vocab: usize, hidden: usize) -> Head {
        let cpu = CpuBackend::new().matrix(&w, vocab, hidden).unwrap();
        let gpu = be.matrix(&w, vocab, hidden).unwrap();
        Head { hidden, cpu, gpu }
    }

    /// The CPU backend's top-`k` of the given rows of `x`.
    fn cpu_topk(&self, x: &[f32], rows: &[usize], k: usize) -> TopK {
        let cpu = CpuBackend::new();
        let cx = cpu
            .from_host(&gather(x, self.hidden, rows), rows.len(), self.hidden)
            .unwrap();
        cpu.lm_head_topk(&cx, &self.cpu, k).unwrap()
    }
}

/// The fused path's top-`k` of every row of `x` on the GPU, checking that the fused kernel ran.
fn fused_topk(be: &CudaBackend, x: &[f32], rows: usize, head: &Head, k: usize) -> TopK {
    let gx = be.from_host(x, rows, head.hidden).unwrap();
    fused_topk_on(be, &gx, &head.gpu, k)
}

fn fused_topk_on(be: &CudaBackend, gx: &CudaTensor, gw: &CudaMatrix, k: usize) -> TopK {
    be.set_lm_head_path(LmHeadPath::Fused);
    let before = be.lm_head_fused_calls();
    let t = be.lm_head_topk(gx, gw, k).unwrap();
    assert_eq!(
        be.lm_head_fused_calls(),
        before + 1,
        "the fused kernel did not run"
    );
    t
}

/// `got`'s rows `rows[i]` against the reference's rows `i` (computed with more columns than
/// `got.k` where the vocabulary allows, so the last rank's separation is known): log-probs within
/// 1e-3 absolute, ids equal wherever the reference's neighbouring log-probs differ by more than
/// 1e-4. Returns the largest log-prob difference.
fn assert_close(got: &TopK, rows: &[usize], want: &TopK, what: &str) -> f32 {
    let k = got.k;
    assert!(want.k >= k, "{what}: reference of {} columns", want.k);
    let mut worst = 0f32;
    for (i, &r) in rows.iter().enumerate() {
        let (gi, gl) = (got.row_ids(r), got.row_logprobs(r));
        let (wi, wl) = (want.row_ids(i), want.row_logprobs(i));
        for j in 0..k {
            let d = (gl[j] - wl[j]).abs();
            worst = worst.max(d);
            assert!(
                d <= 1e-3,
                "{what}: row {r} rank {j}: log-prob {} vs {}",
                gl[j],
                wl[j]
            );
            let separated = (j == 0 || wl[j - 1] - wl[j] > 1e-4)
                && (j + 1 == want.k || wl[j] - wl[j + 1] > 1e-4);
            assert!(
                !separated || gi[j] == wi[j],
                "{what}: row {r} rank {j}: id {} vs {} (log-probs {:?} vs {:?})",
                gi[j],
                wi[j],
                &gl[..k],
                &wl[..k.min(want.k)]
            );
        }
    }
    worst
}

/// `got`'s rows `rows[i]` equal the reference's first `got.k` ids of row `i` exactly, with
/// log-probs within 1e-5 relative.
fn assert_exact(got: &TopK, rows: &[usize], want: &TopK, what: &str) {
    let k = got.k;
    for (i, &r) in rows.iter().enumerate() {
        assert_eq!(
            got.row_ids(r),
            &want.row_ids(i)[..k],
            "{what}: row {r}: ids"
        );
        for (a, b) in got.row_logprobs(r).iter().zip(want.row_logprobs(i)) {
            assert!(
                (a - b).abs() / (1.0 + b.abs()) < 1e-5,
                "{what}: row {r}: log-prob {a} vs {b}"
            );
        }
    }
}

/// Uniform values in [-scale, scale), rounded to bf16 (both backends then start from the same
/// numbers).
fn random_bf16(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut r = DetRng::new(seed);
    let mut v: Vec<f32> = (0..n).map(|_| r.signed_unit() * scale).collect();
    round_bf16(&mut v);
    v
}

/// Integers in `lo..=hi` times `unit` (a power of two: exact in bf16 and in every fp32 sum here).
fn integers(n: usize, lo: i64, hi: i64, unit: f32, seed: u64) -> Vec<f32> {
    let mut r = DetRng::new(seed);
    (0..n)
        .map(|_| (lo + r.below((hi - lo + 1) as u64) as i64) as f32 * unit)
        .collect()
}

#[test]
fn fused_matches_the_cpu_backend_on_random_data() {
    let Some(be) = gpu() else { return };
    for vocab in VOCABS {
        for hidden in HIDDEN {
            let w = random_bf16(vocab * hidden, 0.05, (vocab + hidden) as u64);
            let head = Head::new(&be, w, vocab, hidden);
            for rows in ROW_COUNTS {
                let x = random_bf16(rows * hidden, 1.0, rows as u64);
                let gx = be.from_host(&x, rows, hidden).unwrap();
                let sample = sampled(rows);
                // One reference per case: 65 columns, so every k's last rank has a neighbour.
                let want = head.cpu_topk(&x, &sample, 65);
                for k in KS {
                    let got = fused_topk_on(&be, &gx, &head.gpu, k);
                    assert_eq!((got.rows, got.k), (rows, k));
                    let what = format!("vocab {vocab}, hidden {hidden}, {rows} rows, k {k}");
                    let worst = assert_close(&got, &sample, &want, &what);
                    println!("{what}: log-probs within {worst:.1e}");
                }
            }
        }
    }
}

#[test]
fn fused_picks_exactly_the_cpu_ids_ties_included_on_integer_data() {
    let Some(be) = gpu() else { return };
    for vocab in VOCABS {
        for hidden in HIDDEN {
            // Logits are integers (|logit| ≤ 2·hidden): exact in fp32 in any order, many ties.
            let w = integers(vocab * hidden, -2, 2, 1.0, (3 * vocab + hidden) as u64);
            let head = Head::new(&be, w, vocab, hidden);
            for rows in ROW_COUNTS {
                let x = integers(rows * hidden, -1, 1, 1.0, 7 + rows as u64);
                let gx = be.from_host(&x, rows, hidden).unwrap();
                let sample = sampled(rows);
                let want = head.cpu_topk(&x, &sample, 64);
                for k in KS {
                    let got = fused_topk_on(&be, &gx, &head.gpu, k);
                    assert_exact(
                        &got,
                        &sample,
                        &want,
                        &format!("integers: vocab {vocab}, hidden {hidden}, {rows} rows, k {k}"),
                    );
                }
            }
        }
    }
}

#[test]
fn planted_ties_across_tiles_rounds_and_slices_go_to_the_lower_id() {
    let Some(be) = gpu() else { return };
    for vocab in VOCABS {
        let hidden = 64;
        // x mostly positive (eighths in [-2/8, 1]), W small (sixteenths in [-4/16, 4/16]): every
        // sum is a multiple of 1/128 below 2^10, exact in fp32.
        let x = integers(300 * hidden, -2, 8, 0.125, 11);
        let mut w = integers(vocab * hidden, -4, 4, 0.0625, 12);
        // Dominant rows: ones, the first `h` entries zero (rows h and h+1 differ by one x value:
        // a near-tie or, where that value is 0, an exact tie), each copied to ids on both sides of
        // the kernel's boundaries.
        let sites: Vec<usize> = [
            3, 15, 16, 63, 64, 255, 256, 511, 512, 767, 768, 1000, 4095, 4096, 8191, 8192, 150_000,
        ]
        .into_iter()
        .filter(|&i| i < vocab - 1)
        .chain([vocab - 1])
        .collect();
        for (s, &id) in sites.iter().enumerate() {
            let h = s % 3;
            for (e, v) in w[id * hidden..(id + 1) * hidden].iter_mut().enumerate() {
                *v = if e < h { 0.0 } else { 1.0 };
            }
        }
        let head = Head::new(&be, w, vocab, hidden);
        let sample = sampled(300);
        let want = head.cpu_topk(&x, &sample, 64);
        // Ties do occur among the returned ids (the test would prove nothing otherwise).
        let tied = (0..300)
            .filter(|&r| {
                let l = want.row_logprobs(r);
                (1..sites.len().min(64)).any(|j| l[j] == l[j - 1])
            })
            .count();
        assert!(
            tied > 100,
            "vocab {vocab}: only {tied} rows with exact ties"
        );
        for k in KS {
            let got = fused_topk(&be, &x, 300, &head, k);
            assert_exact(
                &got,
                &sample,
                &want,
                &format!("planted ties: vocab {vocab}, k {k}"),
            );
        }
    }
}

#[test]
fn fused_agrees_with_the_unfused_path() {
    let Some(be) = gpu() else { return };
    let (vocab, hidden) = (151_936, 2048);
    let gw = be
        .matrix(&random_bf16(vocab * hidden, 0.05, 21), vocab, hidden)
        .unwrap();
    for rows in [300, 4097] {
        let gx = be
            .from_host(&random_bf16(rows * hidden, 1.0, 22), rows, hidden)
            .unwrap();
        be.set_lm_head_path(LmHeadPath::Unfused);
        let before = be.lm_head_fused_calls();
        let unfused = be.lm_head_topk(&gx, &gw, 17).unwrap();
        assert_eq!(
            be.lm_head_fused_calls(),
            before,
            "the unfused path ran fused"
        );
        let fused = fused_topk_on(&be, &gx, &gw, 16);
        let all: Vec<usize> = (0..rows).collect();
        let worst = assert_close(
            &fused,
            &all,
            &unfused,
            &format!("{rows} rows, fused vs unfused"),
        );
        println!("{rows} rows: fused vs unfused log-probs within {worst:.1e}");
    }
}

#[test]
fn at_most_64_rows_ignore_the_switch_bit_for_bit() {
    let Some(be) = gpu() else { return };
    let (vocab, hidden) = (151_936, 2048);
    let w = be.random_matrix(vocab, hidden, 0.02, 31).unwrap();
    for rows in [1, 9, 64] {
        let x = be.random_tensor(rows, hidden, 1.0, 0.0, 32).unwrap();
        be.set_lm_head_path(LmHeadPath::Unfused);
        let a = be.lm_head_topk(&x, &w, 8).unwrap();
        be.set_lm_head_path(LmHeadPath::Fused);
        let before = be.lm_head_fused_calls();
        let b = be.lm_head_topk(&x, &w, 8).unwrap();
        assert_eq!(be.lm_head_fused_calls(), before, "{rows} rows ran fused");
        assert_eq!(a.ids, b.ids, "{rows} rows: ids");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&a.logprobs),
            bits(&b.logprobs),
            "{rows} rows: log-probs"
        );
    }
    be.set_lm_head_path(LmHeadPath::DEFAULT);
}

#[test]
fn a_hidden_size_the_kernel_does_not_take_falls_back_to_the_unfused_path() {
    let Some(be) = gpu() else { return };
    let (vocab, hidden, rows) = (1003, 36, 130);
    let head = Head::new(&be, integers(vocab * hidden, -2, 2, 1.0, 41), vocab, hidden);
    let x = integers(rows * hidden, -1, 1, 1.0, 42);
    let gx = be.from_host(&x, rows, hidden).unwrap();
    be.set_lm_head_path(LmHeadPath::Fused);
    let before = be.lm_head_fused_calls();
    let got = be.lm_head_topk(&gx, &head.gpu, 8).unwrap();
    assert_eq!(be.lm_head_fused_calls(), before, "hidden 36 ran fused");
    let all: Vec<usize> = (0..rows).collect();
    let want = head.cpu_topk(&x, &all, 8);
    assert_exact(&got, &all, &want, "hidden 36");
    be.set_lm_head_path(LmHeadPath::DEFAULT);
}
