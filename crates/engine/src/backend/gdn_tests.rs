//! Tests of the hybrid reference maths (`super`): both delta-rule forms against an f64
//! evaluation of the definition, state carrying, the engine profile, and the trait ops' errors.
use super::*;
use crate::backend::SeqStarts;

fn rand(seed: u32, n: usize) -> Vec<f32> {
    crate::util::host_random(n, seed as u64)
}

const SHAPE: GdnShape = GdnShape {
    k_heads: 2,
    v_heads: 4,
    k_dim: 8,
    v_dim: 6,
};

/// (qkv, a, b, A_log, dt_bias) of a sequence of `t` tokens.
type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn inputs(t: usize, seed: u32) -> Inputs {
    let hv = SHAPE.v_heads;
    (
        rand(seed, t * SHAPE.conv_dim()),
        rand(seed + 1, t * hv),
        rand(seed + 2, t * hv),
        rand(seed + 3, hv).iter().map(|v| v * 2.0).collect(),
        rand(seed + 4, hv),
    )
}

/// The delta rule straight from its definition `S_t = α_t (I − β_t k̂ k̂ᵀ) S_{t−1} + β_t k̂ vᵀ`,
/// `o_t = S_tᵀ q̂_t`, in f64 with explicit matrices: an independent check of both forms.
fn naive_f64(qkv: &[f32], a: &[f32], b: &[f32], a_log: &[f32], dt: &[f32], t: usize) -> Vec<f64> {
    let GdnShape {
        v_heads: hv,
        k_dim: dk,
        v_dim: dv,
        ..
    } = SHAPE;
    let cd = SHAPE.conv_dim();
    let mut out = vec![0f64; t * hv * dv];
    for h in 0..hv {
        let kh = h / SHAPE.group();
        let mut s = vec![0f64; dk * dv];
        for i in 0..t {
            let head = |c0: usize| -> Vec<f64> {
                let x: Vec<f64> = qkv[i * cd + c0 + kh * dk..i * cd + c0 + (kh + 1) * dk]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let n = (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
                x.iter().map(|v| v / n).collect()
            };
            let q: Vec<f64> = head(0).iter().map(|v| v / (dk as f64).sqrt()).collect();
            let k = head(SHAPE.key_dim());
            let v0 = 2 * SHAPE.key_dim() + h * dv;
            let v: Vec<f64> = (0..dv).map(|j| qkv[i * cd + v0 + j] as f64).collect();
            let av = a[i * hv + h] as f64 + dt[h] as f64;
            let sp = if av > 20.0 { av } else { av.exp().ln_1p() };
            let alpha = (-(a_log[h] as f64).exp() * sp).exp();
            let beta = 1.0 / (1.0 + (-(b[i * hv + h] as f64)).exp());
            // S ← α (S − β k (kᵀ S)) + β k vᵀ
            let kts: Vec<f64> = (0..dv)
                .map(|j| (0..dk).map(|p| k[p] * s[p * dv + j]).sum())
                .collect();
            for p in 0..dk {
                for j in 0..dv {
                    s[p * dv + j] =
                        alpha * (s[p * dv + j] - beta * k[p] * kts[j]) + beta * k[p] * v[j];
                }
            }
            for j in 0..dv {
                out[i * hv * dv + h * dv + j] = (0..dk).map(|p| q[p] * s[p * dv + j]).sum();
            }
        }
    }
    out
}

fn max_rel(a: &[f32], b: &[f64]) -> f64 {
    let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - y).abs())
        .fold(0.0, f64::max)
        / scale
}

#[test]
fn chunked_and_recurrent_forms_match_the_definition() {
    // 150 tokens = two full chunks and a short one.
    let t = 150;
    let (qkv, a, b, a_log, dt) = inputs(t, 7);
    let want = naive_f64(&qkv, &a, &b, &a_log, &dt, t);
    let mut s = vec![0f32; SHAPE.state_len()];
    let chunked = gated_delta_rule_seq(
        (&qkv, &a, &b),
        GdnLayerHost {
            a_log: &a_log,
            dt_bias: &dt,
            shape: SHAPE,
            profile: GdnProfile::Reference,
        },
        &mut s,
    );
    assert!(
        max_rel(&chunked, &want) < 1e-5,
        "{}",
        max_rel(&chunked, &want)
    );
    // Token by token (each call one row → recurrent form), carrying the state.
    let mut s2 = vec![0f32; SHAPE.state_len()];
    let cd = SHAPE.conv_dim();
    let hv = SHAPE.v_heads;
    let mut rec = Vec::new();
    for i in 0..t {
        rec.extend(gated_delta_rule_seq(
            (
                &qkv[i * cd..(i + 1) * cd],
                &a[i * hv..(i + 1) * hv],
                &b[i * hv..(i + 1) * hv],
            ),
            GdnLayerHost {
                a_log: &a_log,
                dt_bias: &dt,
                shape: SHAPE,
                profile: GdnProfile::Reference,
            },
            &mut s2,
        ));
    }
    assert!(max_rel(&rec, &want) < 1e-5, "{}", max_rel(&rec, &want));
    let sdiff = s
        .iter()
        .zip(&s2)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(sdiff < 1e-4, "final states differ by {sdiff}");
}

#[test]
fn a_chunked_prefill_split_anywhere_carries_the_state() {
    let t = 100;
    let (qkv, a, b, a_log, dt) = inputs(t, 11);
    let mut s = vec![0f32; SHAPE.state_len()];
    let whole = gated_delta_rule_seq(
        (&qkv, &a, &b),
        GdnLayerHost {
            a_log: &a_log,
            dt_bias: &dt,
            shape: SHAPE,
            profile: GdnProfile::Reference,
        },
        &mut s,
    );
    let (cd, hv, cut) = (SHAPE.conv_dim(), SHAPE.v_heads, 37);
    let mut s2 = vec![0f32; SHAPE.state_len()];
    let mut parts = gated_delta_rule_seq(
        (&qkv[..cut * cd], &a[..cut * hv], &b[..cut * hv]),
        GdnLayerHost {
            a_log: &a_log,
            dt_bias: &dt,
            shape: SHAPE,
            profile: GdnProfile::Reference,
        },
        &mut s2,
    );
    parts.extend(gated_delta_rule_seq(
        (&qkv[cut * cd..], &a[cut * hv..], &b[cut * hv..]),
        GdnLayerHost {
            a_log: &a_log,
            dt_bias: &dt,
            shape: SHAPE,
            profile: GdnProfile::Reference,
        },
        &mut s2,
    ));
    let d = whole
        .iter()
        .zip(&parts)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(d < 1e-5, "{d}");
}

#[test]
fn engine_profile_is_close_to_reference_but_not_equal() {
    let t = 130;
    let (qkv, a, b, a_log, dt) = inputs(t, 3);
    let want = naive_f64(&qkv, &a, &b, &a_log, &dt, t);
    let mut s = vec![0f32; SHAPE.state_len()];
    let eng = gated_delta_rule_seq(
        (&qkv, &a, &b),
        GdnLayerHost {
            a_log: &a_log,
            dt_bias: &dt,
            shape: SHAPE,
            profile: GdnProfile::Engine,
        },
        &mut s,
    );
    let err = max_rel(&eng, &want);
    // bf16 has 8 significant bits (2⁻⁹ ≈ 2e-3 relative per rounding); a few roundings in
    // series stay within a few percent of the largest output, and must show up at all.
    assert!(err < 3e-2 && err > 1e-4, "engine vs f64 definition: {err}");
    assert!(
        eng.iter().all(|v| bf16_round(*v) == *v),
        "engine output is bf16"
    );
}

#[test]
fn the_trait_ops_refuse_bad_shapes_with_errors() {
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, GdnParams};
    let be = CpuBackend::new();
    let t = |rows: usize, cols: usize| be.from_host(&vec![0.5; rows * cols], rows, cols).unwrap();
    let (a_log, dt) = (
        be.f32_from_host(&[0.1; 4]).unwrap(),
        be.f32_from_host(&[1.0; 4]).unwrap(),
    );
    let params = |shape| GdnParams {
        a_log: &a_log,
        dt_bias: &dt,
        shape,
        profile: GdnProfile::Reference,
    };
    let cd = SHAPE.conv_dim();
    let mut s0 = be.f32_from_host(&vec![0.0; SHAPE.state_len()]).unwrap();
    let mut short = be.f32_from_host(&[0.0; 3]).unwrap();
    let err = |r: Result<_>| format!("{:#}", r.map(|_| ()).unwrap_err());
    // (qkv cols, a cols, b cols, shape, seq_starts, good state?) → the message it must contain.
    type Case = (
        usize,
        usize,
        usize,
        GdnShape,
        Vec<usize>,
        bool,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (cd + 1, 4, 4, SHAPE, vec![0, 3], true, "qkv has"),
        (cd, 5, 4, SHAPE, vec![0, 3], true, "a is"),
        (cd, 4, 4, SHAPE, vec![0, 2], true, "sequence starts"),
        (
            cd,
            4,
            4,
            SHAPE,
            vec![0, 1, 3],
            true,
            "1 states for 2 sequences",
        ),
        (cd, 4, 4, SHAPE, vec![0, 3], false, "state has 3 values"),
        (
            cd,
            4,
            4,
            GdnShape {
                k_heads: 3,
                ..SHAPE
            },
            vec![0, 3],
            true,
            "not a multiple",
        ),
    ];
    for (qc, ac, bc, shape, starts, good_state, want) in cases {
        let st: &mut HostF32 = if good_state { &mut s0 } else { &mut short };
        let r = be.gated_delta_rule(
            &t(3, qc),
            &t(3, ac),
            &t(3, bc),
            &params(shape),
            &SeqStarts::new(starts).unwrap(),
            &mut [st],
        );
        let e = err(r);
        assert!(e.contains(want), "{want}: {e}");
    }
    let w = t(cd, 4);
    let mut bad_state = t(2, cd);
    let e = err(be.causal_conv1d_silu(&t(3, cd), &w, &SeqStarts::one(3), &mut [&mut bad_state]));
    assert!(e.contains("state is"), "{e}");
    let e = err(be.causal_conv1d_silu(
        &t(3, cd),
        &t(cd, 0),
        &SeqStarts::one(3),
        &mut [&mut t(3, cd)],
    ));
    assert!(e.contains("weight is"), "{e}");
    let e = err(be.gated_rms_norm(&t(3, 8), &t(3, 6), &t(1, 4), 1e-6, 4));
    assert!(e.contains("z is"), "{e}");
    let e = err(be.rms_norm_zero_centred(&t(3, 8), &t(1, 3), 1e-6, 4));
    assert!(e.contains("weight of 3 values"), "{e}");
    let mut x = t(3, 8);
    let e = format!(
        "{:#}",
        be.sigmoid_gate_inplace(&mut x, &t(3, 4)).unwrap_err()
    );
    assert!(e.contains("gate is"), "{e}");
}

#[test]
fn conv_carries_its_state_across_calls() {
    let (c, k, t) = (5, 4, 9);
    let x = rand(1, t * c);
    let w = rand(2, c * k);
    let mut s = vec![0f32; (k - 1) * c];
    let whole = causal_conv1d_silu(&x, c, &w, k, &mut s);
    // Definition with zero left padding.
    for i in 0..t {
        for ch in 0..c {
            let mut acc = 0f64;
            for j in 0..k {
                let src = i as isize - (k as isize - 1) + j as isize;
                if src >= 0 {
                    acc += w[ch * k + j] as f64 * x[src as usize * c + ch] as f64;
                }
            }
            let want = acc / (1.0 + (-acc).exp());
            assert!((whole[i * c + ch] as f64 - want).abs() < 1e-6);
        }
    }
    let mut s2 = vec![0f32; (k - 1) * c];
    let mut parts = Vec::new();
    for (a, b) in [(0, 1), (1, 3), (3, 9)] {
        parts.extend(causal_conv1d_silu(&x[a * c..b * c], c, &w, k, &mut s2));
    }
    assert_eq!(whole, parts);
    assert_eq!(s, s2);
    assert_eq!(&s[..], &x[(t - 3) * c..]);
}
