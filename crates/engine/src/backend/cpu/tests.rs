//! Tests of the CPU reference backend against naive definitions.

use super::*;
use crate::backend::SeqStarts;

/// Deterministic pseudo-random values in [-1, 1).
pub(super) fn t(rows: usize, cols: usize, seed: u32) -> CpuTensor {
    let data = crate::util::host_random(rows * cols, seed as u64);
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
    naive_attention_sinks(q, k, v, shape, vis, None)
}

/// [`naive_attention`] with a sink logit per head in every softmax's denominator (gpt-oss:
/// `softmax(cat(scores, sink))` with the sink's column dropped).
fn naive_attention_sinks(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    shape: AttnShape,
    vis: impl Fn(usize, usize) -> bool,
    sinks: Option<&[f32]>,
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
            let sink = sinks.map(|z| z[h] as f64);
            let m = s
                .iter()
                .map(|x| x.1)
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x.1 - m).exp()).sum::<f64>()
                + sink.map_or(0.0, |z| (z - m).exp());
            for d in 0..hd {
                out[r * q.cols + h * hd + d] = s
                    .iter()
                    .map(|&(j, sc)| (sc - m).exp() / z * v.data[j * v.cols + kvh * hd + d] as f64)
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
fn attention_with_sinks_and_windows_matches_naive() {
    let be = CpuBackend;
    let shape = AttnShape {
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
    };
    // 70 cached keys + 90 new queries (chunks of 64 rows); sinks from below to above the scores.
    let (q_start, nq) = (70, 90);
    let q = t(nq, 32, 13);
    let k = t(q_start + nq, 16, 14);
    let v = t(q_start + nq, 16, 15);
    let sinks = [-3.0f32, 0.0, 0.7, 4.0];
    for window in [None, Some(1), Some(5), Some(128), Some(1000)] {
        for sinks in [None, Some(&sinks[..])] {
            let extras = AttnExtras { window, sinks };
            let mask = AttnMask::Causal { q_start };
            let got = be.attention_ext(&q, &k, &v, shape, &mask, extras).unwrap();
            let want = naive_attention_sinks(
                &q,
                &k,
                &v,
                shape,
                |r, j| j <= q_start + r && window.is_none_or(|w| j + w > q_start + r),
                sinks,
            );
            assert!(
                max_diff(&got, &want) < 1e-5,
                "window {window:?} sinks {}: {}",
                sinks.is_some(),
                max_diff(&got, &want)
            );
            if extras.is_none() {
                assert_eq!(got, be.attention(&q, &k, &v, shape, &mask).unwrap());
            }
        }
    }
    // Packed sequences and decode rows take the same extras (the window counted per sequence).
    let extras = AttnExtras {
        window: Some(3),
        sinks: Some(&sinks),
    };
    let starts = crate::backend::SeqStarts::new(vec![0, 7, 7, 20]).unwrap();
    let (qp, kp, vp) = (t(20, 32, 16), t(20, 16, 17), t(20, 16, 18));
    let got = be
        .attention_varlen_ext(&qp, &kp, &vp, shape, &starts, extras)
        .unwrap();
    let seq = |r: usize| usize::from(r >= 7);
    let want = naive_attention_sinks(
        &qp,
        &kp,
        &vp,
        shape,
        |r, j| seq(r) == seq(j) && j <= r && j + 3 > r,
        Some(&sinks),
    );
    assert!(max_diff(&got, &want) < 1e-5);
    // A sink far above every score takes (nearly) all the probability: the output vanishes.
    let big = [80.0f32; 4];
    let o = be
        .attention_ext(
            &t(1, 32, 19),
            &t(4, 16, 20),
            &t(4, 16, 21),
            shape,
            &AttnMask::Causal { q_start: 3 },
            AttnExtras {
                window: None,
                sinks: Some(&big),
            },
        )
        .unwrap();
    assert!(o.data.iter().all(|x| x.abs() < 1e-20));
}

#[test]
fn rope_from_frequencies_equals_rope_and_scales() {
    let be = CpuBackend;
    let x = t(4, 32, 22);
    let pos = [0u32, 1, 9, 500];
    let rope = Rope {
        theta: 10000.0,
        head_dim: 16,
        rotary_dim: 16,
        style: RopeStyle::RotateHalf,
    };
    let (mut a, mut b) = (x.clone(), x.clone());
    be.rope_inplace(&mut a, &pos, &rope).unwrap();
    be.rope_freqs_inplace(&mut b, &pos, &RopeFreqs::of_rope(&rope))
        .unwrap();
    assert_eq!(a, b, "bit-identical to rope_inplace");
    let mut scaled = RopeFreqs::of_rope(&rope);
    scaled.attention_scaling = 1.25;
    let mut c = x.clone();
    be.rope_freqs_inplace(&mut c, &pos, &scaled).unwrap();
    assert!(c
        .data
        .iter()
        .zip(&a.data)
        .all(|(c, a)| (c - 1.25 * a).abs() <= 1e-6 * a.abs().max(1.0)));
    let mut bad = scaled.clone();
    bad.inv_freq.pop();
    assert!(be.rope_freqs_inplace(&mut c, &pos, &bad).is_err());
}

#[test]
fn clamped_swiglu_matches_its_definition() {
    let be = CpuBackend;
    // Values around and beyond the limit of 7, gate | up halves of 40 columns.
    let mut x = t(130, 80, 23);
    x.data.iter_mut().for_each(|v| *v *= 10.0);
    let y = be.clamped_swiglu_packed(&x, 1.702, 7.0).unwrap();
    assert_eq!((y.rows, y.cols), (130, 40));
    for r in 0..130 {
        for j in 0..40 {
            let (g, u) = (x.data[r * 80 + j] as f64, x.data[r * 80 + 40 + j] as f64);
            let (g, u) = (g.min(7.0), u.clamp(-7.0, 7.0));
            let want = (u + 1.0) * g / (1.0 + (-g * 1.702).exp());
            let got = y.data[r * 40 + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }
    assert!(be.clamped_swiglu_packed(&t(2, 3, 1), 1.702, 7.0).is_err());
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
                    window.is_none_or(|w| kpos + w > qpos)
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
        let want = be
            .attention_varlen(&q, &k, &v, shape, &SeqStarts::new(starts.to_vec()).unwrap())
            .unwrap();
        let norm = with_norm.then_some(crate::backend::QkNorm {
            q: &qn,
            k: &kn,
            eps: 1e-6,
        });
        let got = be
            .attention_varlen_qkv(
                qkv.clone(),
                shape,
                norm,
                &pos,
                &rope,
                &SeqStarts::new(starts.to_vec()).unwrap(),
            )
            .unwrap();
        assert_eq!(got, want, "with_norm = {with_norm}");
    }
}

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
        let row: Vec<f32> = super::t(1, 49_157, 7)
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
        super::t(1, n, seed).data
    }
}

#[test]
fn host_rows_split_gives_each_part_its_rows_and_refuses_bad_parts() {
    let be = CpuBackend::new();
    let x = t(7, 3, 5);
    let whole = be.to_host_rows(&x).unwrap();
    // Empty parts, a part of one row, the whole in one part.
    for starts in [
        vec![0, 2, 2, 3, 7],
        vec![0, 7],
        vec![0, 0, 7],
        vec![0, 6, 7],
    ] {
        let parts = be.to_host_rows_split(&x, &starts).unwrap();
        assert_eq!(parts.len(), starts.len() - 1);
        for (p, w) in parts.iter().zip(starts.windows(2)) {
            assert_eq!(
                p.view().to_f32(),
                whole.view().slice(w[0] * 3..w[1] * 3).to_f32()
            );
        }
    }
    for bad in [vec![0, 8], vec![1, 7], vec![0, 4, 2, 7], vec![0], vec![]] {
        let e = be.to_host_rows_split(&x, &bad).unwrap_err().to_string();
        assert!(e.contains("do not cover rows 0..7"), "{bad:?}: {e}");
    }
}
