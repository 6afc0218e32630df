//! Backend parity: how far one backend's numbers are from another's, per operation and per
//! captured hidden-state layer, with stated tolerances.
//!
//! - [`diff`]: relative L2 error, max abs error and cosine of two equally long vectors.
//! - [`op_parity`]: every [`Backend`] operation on the same random inputs (values exactly
//!   representable in bf16, so only each backend's arithmetic differs), checked against
//!   [`OpTolerance`]s that follow from bf16 storage (one bf16 rounding has a relative error of at
//!   most 2⁻⁹ ≈ 2e-3, about 1.1e-3 RMS).
//! - [`forward_parity`]: the product's own [`TargetModel`] with the same random weights
//!   ([`RandomWeights`], bf16-exact) on both backends, compared at every hidden-state index (HF
//!   convention, docs/models.md §1.5, docs/hidden-states.md) plus greedy-token agreement.
//! - [`target_parity`] / [`compare_layers`] / [`compare_metrics`]: the pieces `draftlens parity`
//!   (`crate::parity_report`, with its `run_pass` / `compare_passes`) assembles for real checkpoints: per-layer diffs of captured hidden
//!   states and the change of every drafter metric when the drafter is fed each backend's hidden
//!   states.

use crate::backend::{AttnMask, AttnShape, Backend, Rope, RopeStyle};
use crate::model::random::RandomWeights;
use crate::model::{Capture, ModelSpec, TargetModel};
use crate::util::{host_random, host_random_bf16};
use anyhow::{ensure, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Distance of `other` from `reference`.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Diff {
    pub n: usize,
    /// ‖other − reference‖₂ / ‖reference‖₂ (0 when both are zero).
    pub rel_l2: f64,
    pub max_abs: f64,
    pub cosine: f64,
    /// RMS of the reference (scale of max_abs).
    pub ref_rms: f64,
    /// Values that are NaN or infinite in `other` but not in `reference`.
    pub non_finite: usize,
}

/// Compares two vectors of equal length (f64 accumulation).
pub fn diff(reference: &[f32], other: &[f32]) -> Diff {
    assert_eq!(
        reference.len(),
        other.len(),
        "diff of vectors of different lengths"
    );
    let (mut ee, mut rr, mut oo, mut ro, mut max_abs) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let mut non_finite = 0;
    for (&r, &o) in reference.iter().zip(other) {
        if !o.is_finite() && r.is_finite() {
            non_finite += 1;
            continue;
        }
        let (r, o) = (r as f64, o as f64);
        let e = o - r;
        ee += e * e;
        rr += r * r;
        oo += o * o;
        ro += r * o;
        max_abs = max_abs.max(e.abs());
    }
    let n = reference.len();
    Diff {
        n,
        rel_l2: if rr > 0.0 {
            (ee / rr).sqrt()
        } else if ee > 0.0 {
            f64::INFINITY
        } else {
            0.0
        },
        max_abs,
        cosine: if rr > 0.0 && oo > 0.0 {
            ro / (rr.sqrt() * oo.sqrt())
        } else if rr == 0.0 && oo == 0.0 {
            1.0
        } else {
            0.0
        },
        ref_rms: if n > 0 { (rr / n as f64).sqrt() } else { 0.0 },
        non_finite,
    }
}

/// Accepted distance for one check.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct OpTolerance {
    pub max_rel_l2: f64,
    pub min_cosine: f64,
}

impl OpTolerance {
    pub const EXACT: OpTolerance = OpTolerance {
        max_rel_l2: 0.0,
        min_cosine: 1.0 - 1e-12,
    };
    pub fn accepts(&self, d: &Diff) -> bool {
        d.non_finite == 0 && d.rel_l2 <= self.max_rel_l2 && d.cosine >= self.min_cosine
    }
}

/// One checked comparison.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub diff: Diff,
    pub tol: OpTolerance,
    pub pass: bool,
}

impl Check {
    fn new(name: impl Into<String>, diff: Diff, tol: OpTolerance) -> Check {
        let pass = tol.accepts(&diff);
        Check {
            name: name.into(),
            diff,
            tol,
            pass,
        }
    }
}

fn upload<B: Backend>(be: &B, v: &[f32], rows: usize, cols: usize) -> Result<B::Tensor> {
    be.from_host(v, rows, cols)
}

/// Runs every backend operation on both backends with identical inputs and compares the test
/// backend's outputs with the reference's. Shapes are Qwen3-like (head_dim 128 and 64, GQA 4:1
/// and 3:1; attention also at head_dim 256, GQA 6:1, as in the hybrids) but small enough for a
/// CPU reference.
pub fn op_parity<A: Backend, B: Backend>(reference: &A, test: &B, seed: u64) -> Result<Vec<Check>> {
    // Tolerances (rel L2, min cosine); see docs/cuda.md for the derivation.
    let one_rounding = OpTolerance {
        max_rel_l2: 4e-3,
        min_cosine: 0.99999,
    };
    let two_roundings = OpTolerance {
        max_rel_l2: 6e-3,
        min_cosine: 0.99998,
    };
    let rope_tol = OpTolerance {
        max_rel_l2: 8e-3,
        min_cosine: 0.99996,
    };
    let attn_tol = OpTolerance {
        max_rel_l2: 1e-2,
        min_cosine: 0.99995,
    };
    let mut out = Vec::new();
    let cmp = |name: &str,
               a: &A::Tensor,
               b: &B::Tensor,
               tol: OpTolerance,
               out: &mut Vec<Check>|
     -> Result<()> {
        ensure!(
            reference.dims(a) == test.dims(b),
            "{name}: shapes differ: {:?} vs {:?}",
            reference.dims(a),
            test.dims(b)
        );
        out.push(Check::new(
            name,
            diff(&reference.to_host(a)?, &test.to_host(b)?),
            tol,
        ));
        Ok(())
    };

    // matmul: [300, 512] × [384, 512]ᵀ (row count not a multiple of any tile size).
    let (t, d, o) = (300, 512, 384);
    let x = host_random_bf16(t * d, seed, 1.0);
    let w = host_random_bf16(o * d, seed + 1, 0.05);
    let (xa, xb) = (upload(reference, &x, t, d)?, upload(test, &x, t, d)?);
    let (wa, wb) = (reference.matrix(&w, o, d)?, test.matrix(&w, o, d)?);
    cmp(
        "matmul [300,512]x[384,512]^T",
        &reference.matmul(&xa, &wa)?,
        &test.matmul(&xb, &wb)?,
        one_rounding,
        &mut out,
    )?;

    // add_row_bias, add_inplace.
    let bias = host_random_bf16(d, seed + 2, 1.0);
    let (ba, bb) = (upload(reference, &bias, 1, d)?, upload(test, &bias, 1, d)?);
    let (mut ya, mut yb) = (upload(reference, &x, t, d)?, upload(test, &x, t, d)?);
    reference.add_row_bias(&mut ya, &ba)?;
    test.add_row_bias(&mut yb, &bb)?;
    cmp("add_row_bias", &ya, &yb, one_rounding, &mut out)?;
    let y2 = host_random_bf16(t * d, seed + 3, 1.0);
    let (y2a, y2b) = (upload(reference, &y2, t, d)?, upload(test, &y2, t, d)?);
    reference.add_inplace(&mut ya, &y2a)?;
    test.add_inplace(&mut yb, &y2b)?;
    cmp("add_inplace", &ya, &yb, two_roundings, &mut out)?;

    // rms_norm over full rows (D = 512) and per head (group 128), eps 1e-6; plus a group that is
    // not a multiple of 8 (scalar path).
    for (group, cols) in [(512usize, 512usize), (128, 512), (100, 300)] {
        let xs = host_random_bf16(t * cols, seed + 4 + group as u64, 2.0);
        let wn = host_random_bf16(group, seed + 5, 1.0)
            .into_iter()
            .map(|v| half::bf16::from_f32(1.0 + 0.3 * v).to_f32())
            .collect::<Vec<_>>();
        let (xa, xb) = (
            upload(reference, &xs, t, cols)?,
            upload(test, &xs, t, cols)?,
        );
        let (wa, wb) = (
            upload(reference, &wn, 1, group)?,
            upload(test, &wn, 1, group)?,
        );
        cmp(
            &format!("rms_norm group {group} of {cols}"),
            &reference.rms_norm(&xa, &wa, 1e-6, group)?,
            &test.rms_norm(&xb, &wb, 1e-6, group)?,
            two_roundings,
            &mut out,
        )?;
    }

    // RoPE, both styles, head_dim 128 and 64 (and a partial rotary dim), positions up to 40k.
    let positions: Vec<u32> = (0..t as u32)
        .map(|i| if i % 3 == 0 { i * 131 } else { i })
        .collect();
    for (hd, rd, style, theta) in [
        (128usize, 128usize, RopeStyle::RotateHalf, 1e6f32),
        (64, 64, RopeStyle::Interleaved, 1e4),
        (128, 32, RopeStyle::RotateHalf, 1e7),
    ] {
        let cols = 4 * hd;
        let xs = host_random_bf16(t * cols, seed + 6 + hd as u64, 1.0);
        let rope = Rope {
            theta,
            head_dim: hd,
            rotary_dim: rd,
            style,
        };
        let (mut xa, mut xb) = (
            upload(reference, &xs, t, cols)?,
            upload(test, &xs, t, cols)?,
        );
        reference.rope_inplace(&mut xa, &positions, &rope)?;
        test.rope_inplace(&mut xb, &positions, &rope)?;
        cmp(
            &format!("rope {style:?} hd {hd} rotary {rd} theta {theta}"),
            &xa,
            &xb,
            rope_tol,
            &mut out,
        )?;
    }

    // swiglu.
    let g = host_random_bf16(t * d, seed + 7, 4.0);
    let (ga, gb) = (upload(reference, &g, t, d)?, upload(test, &g, t, d)?);
    cmp(
        "swiglu",
        &reference.swiglu(&ga, &y2a)?,
        &test.swiglu(&gb, &y2b)?,
        two_roundings,
        &mut out,
    )?;

    // Data movement: exact.
    let table = host_random_bf16(50 * 96, seed + 8, 1.0);
    let (ta, tb) = (
        reference.matrix(&table, 50, 96)?,
        test.matrix(&table, 50, 96)?,
    );
    let ids = [3u32, 0, 49, 7, 7, 12];
    cmp(
        "embed",
        &reference.embed(&ta, &ids)?,
        &test.embed(&tb, &ids)?,
        OpTolerance::EXACT,
        &mut out,
    )?;
    let p1 = host_random_bf16(7 * 24, seed + 9, 1.0);
    let p2 = host_random_bf16(7 * 40, seed + 10, 1.0);
    let p3 = host_random_bf16(5 * 24, seed + 11, 1.0);
    let (p1a, p1b) = (upload(reference, &p1, 7, 24)?, upload(test, &p1, 7, 24)?);
    let (p2a, p2b) = (upload(reference, &p2, 7, 40)?, upload(test, &p2, 7, 40)?);
    let (p3a, p3b) = (upload(reference, &p3, 5, 24)?, upload(test, &p3, 5, 24)?);
    cmp(
        "concat_cols",
        &reference.concat_cols(&[&p1a, &p2a])?,
        &test.concat_cols(&[&p1b, &p2b])?,
        OpTolerance::EXACT,
        &mut out,
    )?;
    cmp(
        "concat_rows",
        &reference.concat_rows(&[&p1a, &p3a])?,
        &test.concat_rows(&[&p1b, &p3b])?,
        OpTolerance::EXACT,
        &mut out,
    )?;
    cmp(
        "slice_rows",
        &reference.slice_rows(&p2a, 2, 6)?,
        &test.slice_rows(&p2b, 2, 6)?,
        OpTolerance::EXACT,
        &mut out,
    )?;
    cmp(
        "gather_rows",
        &reference.gather_rows(&p2a, &[6, 0, 3, 3])?,
        &test.gather_rows(&p2b, &[6, 0, 3, 3])?,
        OpTolerance::EXACT,
        &mut out,
    )?;

    // Attention: causal prefill (with a KV-cache offset), decode (1 query), packed varlen, and
    // the drafter's block mask in every option, for head_dim 128 (GQA 4:1), 64 (GQA 3:1) and 256
    // with GQA 6:1 (the hybrids' gated attention: 24 query / 4 KV heads).
    for (hd, heads, kvh) in [(128usize, 8usize, 2usize), (64, 9, 3), (256, 24, 4)] {
        let shape = AttnShape {
            heads,
            kv_heads: kvh,
            head_dim: hd,
        };
        let mut attn_case = |name: String,
                             tq: usize,
                             tk: usize,
                             mask: Option<&AttnMask>,
                             varlen: Option<&crate::backend::SeqStarts>,
                             sd: u64|
         -> Result<()> {
            let q = host_random_bf16(tq * heads * hd, sd, 1.5);
            let k = host_random_bf16(tk * kvh * hd, sd + 1, 1.5);
            let v = host_random_bf16(tk * kvh * hd, sd + 2, 1.0);
            let (qa, qb) = (
                upload(reference, &q, tq, heads * hd)?,
                upload(test, &q, tq, heads * hd)?,
            );
            let (ka, kb) = (
                upload(reference, &k, tk, kvh * hd)?,
                upload(test, &k, tk, kvh * hd)?,
            );
            let (va, vb) = (
                upload(reference, &v, tk, kvh * hd)?,
                upload(test, &v, tk, kvh * hd)?,
            );
            let (ra, rb) = match (mask, varlen) {
                (Some(m), _) => (
                    reference.attention(&qa, &ka, &va, shape, m)?,
                    test.attention(&qb, &kb, &vb, shape, m)?,
                ),
                (None, Some(starts)) => (
                    reference.attention_varlen(&qa, &ka, &va, shape, starts)?,
                    test.attention_varlen(&qb, &kb, &vb, shape, starts)?,
                ),
                (None, None) => unreachable!("every case has a mask or sequence starts"),
            };
            cmp(&name, &ra, &rb, attn_tol, &mut out)
        };
        attn_case(
            format!("attention causal prefill 333 rows hd {hd} {heads}/{kvh}"),
            333,
            333,
            Some(&AttnMask::Causal { q_start: 0 }),
            None,
            seed + 20,
        )?;
        attn_case(
            format!("attention causal with cache 70+90 hd {hd}"),
            90,
            160,
            Some(&AttnMask::Causal { q_start: 70 }),
            None,
            seed + 21,
        )?;
        attn_case(
            format!("attention decode 1 query over 517 keys hd {hd}"),
            1,
            517,
            Some(&AttnMask::Causal { q_start: 516 }),
            None,
            seed + 22,
        )?;
        attn_case(
            format!("attention varlen [0,100,101,250,400] hd {hd}"),
            400,
            400,
            None,
            Some(&crate::backend::SeqStarts::new(vec![
                0, 100, 101, 250, 400,
            ])?),
            seed + 23,
        )?;
        let anchors = vec![0usize, 5, 130, 199, 64, 77, 200];
        let (ctx_len, block) = (200usize, 16usize);
        for (incl, causal, window) in [
            (false, false, None),
            (true, false, None),
            (false, true, None),
            (false, true, Some(40usize)),
            (true, false, Some(7)),
        ] {
            let mask = AttnMask::Blocks {
                ctx_len,
                block,
                anchors: anchors.clone(),
                ctx_inclusive: incl,
                causal_in_block: causal,
                window,
            };
            let tq = anchors.len() * block;
            attn_case(
                format!(
                    "attention blocks hd {hd} inclusive={incl} causal={causal} window={window:?}"
                ),
                tq,
                ctx_len + tq,
                Some(&mask),
                None,
                seed + 24,
            )?;
        }
    }

    // LM head + top-k: ids must agree where the reference's consecutive log-probs are separated
    // by more than 1e-4 (logits are fp32 from exact bf16 products on both sides); log-probs within
    // 1e-3 absolute.
    for k in [1usize, 8, 40] {
        let (rows, vocab, dim) = (37usize, 3001usize, 256usize);
        let xs = host_random_bf16(rows * dim, seed + 30, 1.0);
        let hs = host_random_bf16(vocab * dim, seed + 31, 0.2);
        let (xa, xb) = (
            upload(reference, &xs, rows, dim)?,
            upload(test, &xs, rows, dim)?,
        );
        let (ha, hb) = (
            reference.matrix(&hs, vocab, dim)?,
            test.matrix(&hs, vocab, dim)?,
        );
        let (ta, tb) = (
            reference.lm_head_topk(&xa, &ha, k)?,
            test.lm_head_topk(&xb, &hb, k)?,
        );
        ensure!(
            ta.ids.len() == tb.ids.len(),
            "lm_head_topk k={k}: {} vs {} outputs",
            ta.ids.len(),
            tb.ids.len()
        );
        let mut mismatched = 0usize;
        for r in 0..rows {
            let (ia, ib, la) = (ta.row_ids(r), tb.row_ids(r), ta.row_logprobs(r));
            for j in 0..ta.k {
                let separated = (j == 0 || la[j - 1] - la[j] > 1e-4)
                    && (j + 1 == ta.k || la[j] - la[j + 1] > 1e-4);
                if separated && ia[j] != ib[j] {
                    mismatched += 1;
                }
            }
        }
        let d = diff(&ta.logprobs, &tb.logprobs);
        let pass = mismatched == 0 && d.max_abs <= 1e-3 && d.non_finite == 0;
        out.push(Check {
            name: format!("lm_head_topk k={k} ({mismatched} separated ids differ)"),
            diff: d,
            tol: OpTolerance {
                max_rel_l2: 1e-3,
                min_cosine: 0.99999,
            },
            pass,
        });
    }
    Ok(out)
}

/// Per-index comparison of a whole forward pass.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ForwardParity {
    pub spec: ModelSpec,
    pub tokens: usize,
    /// One check per HF hidden-state index 0..=L.
    pub layers: Vec<Check>,
    /// Rows whose reference top-1 beats the top-2 by more than `margin` nats.
    pub greedy_rows: usize,
    pub greedy_agree: usize,
    pub greedy_margin: f32,
    /// Agreement over all rows, near-ties included.
    pub greedy_agree_all: f64,
}

/// Tolerance for hidden state `index` (HF convention) of a bf16 backend against an f32
/// reference. Measured on the H200 (docs/cuda.md): Hugging Face's own bf16 forward differs from
/// its fp32 forward by rel L2 8.2e-3 after layer 1 rising to 1.9e-2 after layer 6, and draftlens
/// CUDA tracks that curve within 1%. The bound allows 1.5× HF's error growth: 1.2e-2 + 3e-3 per
/// layer, capped at 8e-2 for deep models.
pub fn layer_tolerance(index: usize) -> OpTolerance {
    let rel = (1.2e-2 + 3e-3 * index as f64).min(8e-2);
    OpTolerance {
        max_rel_l2: rel,
        min_cosine: 1.0 - rel * rel,
    }
}

/// Tolerance for hidden state `index` of a mixture-of-experts target (bf16 against f32). Measured
/// on an H100 (docs/moe-models.md, "On the GPU"): transformers' own bf16 forward of a
/// Qwen3-30B-A3B-shaped random target differs from its f32 forward by rel L2 2.1e-2 after layer 1
/// (9.0e-3 for a dense model of the same width and depth), falling to 1.4e-2 by layer 5; draftlens
/// CUDA is within 15 % of that curve. The bound allows 1.5× it at layer 1 and is never tighter
/// than the dense bound ([`layer_tolerance`]).
pub fn moe_layer_tolerance(index: usize) -> OpTolerance {
    let rel = layer_tolerance(index).max_rel_l2.max(3.2e-2);
    OpTolerance {
        max_rel_l2: rel,
        min_cosine: 1.0 - rel * rel,
    }
}

/// Runs the product's [`TargetModel`] with the same random weights on both backends over packed
/// sequences ([`TargetModel::forward_packed`], what `extract` and `run` execute) and compares every
/// hidden-state index and the greedy tokens. Weights: matrices of std 0.05 and norm weights in
/// 1 ± 0.3, rounded to bf16 so that both backends hold identical values and only their
/// arithmetic differs.
pub fn forward_parity<A: Backend, B: Backend>(
    reference: &A,
    test: &B,
    spec: &ModelSpec,
    seed: u64,
    seq_lens: &[usize],
) -> Result<ForwardParity> {
    let weights = RandomWeights::new(spec, seed)
        .with_init(0.05, 0.3)
        .bf16_exact();
    let ma = TargetModel::load(reference, spec, &weights)?;
    let mb = TargetModel::load(test, spec, &weights)?;
    let mut starts = vec![0usize];
    for l in seq_lens {
        starts.push(starts.last().copied().unwrap_or(0) + l);
    }
    let n = *starts.last().unwrap_or(&0);
    let vocab = spec.vocab_size;
    let ids: Vec<u32> = host_random(n, seed + 99)
        .into_iter()
        .map(|x| ((x + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32)
        .collect();
    let capture = Capture::hf_indices((0..=spec.num_layers).collect(), spec.num_layers)?;
    let oa = ma.forward_packed(reference, &ids, &starts, &capture)?;
    let ob = mb.forward_packed(test, &ids, &starts, &capture)?;
    let mut layers = Vec::new();
    for i in 0..=spec.num_layers {
        let (Some(ta), Some(tb)) = (oa.captured.get(i), ob.captured.get(i)) else {
            anyhow::bail!("hidden state {i} was not captured")
        };
        layers.push(Check::new(
            format!("hidden_states[{i}]"),
            diff(&reference.to_host(ta)?, &test.to_host(tb)?),
            layer_tolerance(i),
        ));
    }
    let ka = ma.logits_topk(reference, &oa.last_hidden, 2)?;
    let kb = mb.logits_topk(test, &ob.last_hidden, 1)?;
    let margin = 0.1f32;
    let (mut rows, mut agree, mut agree_all) = (0, 0, 0);
    for r in 0..n {
        let same = ka.row_ids(r)[0] == kb.row_ids(r)[0];
        agree_all += same as usize;
        if ka.row_logprobs(r)[0] - ka.row_logprobs(r)[1] > margin {
            rows += 1;
            agree += same as usize;
        }
    }
    Ok(ForwardParity {
        spec: spec.clone(),
        tokens: n,
        layers,
        greedy_rows: rows,
        greedy_agree: agree,
        greedy_margin: margin,
        greedy_agree_all: agree_all as f64 / n.max(1) as f64,
    })
}

/// Parity of a real target checkpoint on two backends.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TargetParity {
    pub backends: (String, String),
    pub prompts: usize,
    pub tokens: usize,
    /// One check per HF hidden-state index 0..=L, over the tokens of all prompts.
    pub layers: Vec<Check>,
    /// Greedy (top-1) next-token agreement over every position of every prompt.
    pub greedy_agree: usize,
    pub greedy_total: usize,
    /// The same over positions whose reference top-1 beats the top-2 by more than 0.1 nats.
    pub greedy_agree_decisive: usize,
    pub greedy_decisive: usize,
}

/// Loads the target from `src` on both backends, runs every prompt (one sequence each, full
/// prefill) and compares every hidden-state index and the greedy next tokens. The reference is
/// backend `a` (normally the CPU).
pub fn target_parity<A: Backend, B: Backend>(
    a: &A,
    b: &B,
    spec: &ModelSpec,
    src: &dyn crate::formats::WeightSource,
    prompts: &[Vec<u32>],
) -> Result<TargetParity> {
    let ma = TargetModel::load(a, spec, src)?;
    let mb = TargetModel::load(b, spec, src)?;
    let pa = crate::parity_report::run_pass(a.name(), a, &ma, prompts)?;
    let pb = crate::parity_report::run_pass(b.name(), b, &mb, prompts)?;
    crate::parity_report::compare_passes(&pa, &pb)
}

/// Per-layer diffs of captured hidden states from two backends (`names[i]` labels layer i;
/// `a[i]`, `b[i]` are the flattened states), each held to `tolerance(i)` ([`layer_tolerance`], or
/// [`moe_layer_tolerance`] for a mixture-of-experts target). For `draftlens parity` on real checkpoints.
pub fn compare_layers(
    names: &[String],
    a: &[Vec<f32>],
    b: &[Vec<f32>],
    tolerance: fn(usize) -> OpTolerance,
) -> Result<Vec<Check>> {
    ensure!(
        names.len() == a.len() && a.len() == b.len(),
        "compare_layers: {} names, {} and {} layers",
        names.len(),
        a.len(),
        b.len()
    );
    names
        .iter()
        .zip(a.iter().zip(b))
        .enumerate()
        .map(|(i, (name, (x, y)))| {
            ensure!(
                x.len() == y.len(),
                "{name}: {} vs {} values",
                x.len(),
                y.len()
            );
            Ok(Check::new(name.clone(), diff(x, y), tolerance(i)))
        })
        .collect()
}

/// Change of every drafter metric when the drafter is fed backend B's hidden states instead of
/// backend A's: (name, value with A, value with B, B − A).
pub fn compare_metrics(
    a: &BTreeMap<String, f64>,
    b: &BTreeMap<String, f64>,
) -> Vec<(String, f64, f64, f64)> {
    a.iter()
        .filter_map(|(k, &va)| b.get(k).map(|&vb| (k.clone(), va, vb, vb - va)))
        .collect()
}

/// Plain-text table of checks.
pub fn format_checks(title: &str, checks: &[Check]) -> String {
    let mut s = format!(
        "{title}\n{:<64} {:>10} {:>10} {:>10} {:>12} {:>10}  result\n",
        "check", "rel_l2", "max_abs", "ref_rms", "cosine", "tol_rel"
    );
    for c in checks {
        let _ = writeln!(
            s,
            "{:<64} {:>10.3e} {:>10.3e} {:>10.3e} {:>12.8} {:>10.1e}  {}",
            c.name,
            c.diff.rel_l2,
            c.diff.max_abs,
            c.diff.ref_rms,
            c.diff.cosine,
            c.tol.max_rel_l2,
            if c.pass { "ok" } else { "FAIL" }
        );
    }
    let failed = checks.iter().filter(|c| !c.pass).count();
    let _ = writeln!(s, "{} checks, {} failed", checks.len(), failed);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::model::random::qwen3_8b_spec;

    /// The parity machinery on the CPU alone (CI has no GPU): the same backend twice must give
    /// zero difference at every hidden-state index and full greedy agreement, and a model whose
    /// weights differ (another seed on one side) must fail the checks — so the comparison really
    /// looks at the captured states.
    #[test]
    fn forward_parity_of_a_backend_with_itself_is_exact_and_a_different_model_fails() {
        let spec = ModelSpec {
            vocab_size: 97,
            hidden_size: 32,
            intermediate_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            max_position_embeddings: 256,
            ..qwen3_8b_spec()
        };
        let cpu = CpuBackend::new();
        let p = forward_parity(&cpu, &cpu, &spec, 3, &[20, 1, 13]).unwrap();
        assert_eq!(p.tokens, 34);
        assert_eq!(p.layers.len(), spec.num_layers + 1);
        for c in &p.layers {
            assert!(
                c.pass && c.diff.rel_l2 == 0.0 && c.diff.n == 34 * 32,
                "{c:?}"
            );
        }
        assert_eq!(p.greedy_agree, p.greedy_rows);
        assert_eq!(p.greedy_agree_all, 1.0);

        let wa = RandomWeights::new(&spec, 3)
            .with_init(0.05, 0.3)
            .bf16_exact();
        let wb = RandomWeights::new(&spec, 4)
            .with_init(0.05, 0.3)
            .bf16_exact();
        let ma = TargetModel::load(&cpu, &spec, &wa).unwrap();
        let mb = TargetModel::load(&cpu, &spec, &wb).unwrap();
        let cap = Capture::hf_indices(vec![2], 2).unwrap();
        let ids: Vec<u32> = (0..16).collect();
        let ha = cpu
            .to_host(
                ma.forward_packed(&cpu, &ids, &[0, 16], &cap)
                    .unwrap()
                    .captured
                    .get(2)
                    .unwrap(),
            )
            .unwrap();
        let hb = cpu
            .to_host(
                mb.forward_packed(&cpu, &ids, &[0, 16], &cap)
                    .unwrap()
                    .captured
                    .get(2)
                    .unwrap(),
            )
            .unwrap();
        let c = Check::new("other weights", diff(&ha, &hb), layer_tolerance(2));
        assert!(!c.pass, "a different model passed parity: {c:?}");
    }
}
