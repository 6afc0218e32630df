//! Reference maths of the Qwen3.5 / Qwen3-Next hybrid layers, in f32 on host slices.
//!
//! These free functions define what the hybrid ops of [`super::Backend`] compute (the trait's
//! default implementations download their inputs, call these, and upload the results), so a
//! backend kernel is correct when it agrees with them. Every function documents its shapes;
//! everything is row-major, one row per token. Definitions follow
//! `transformers/models/qwen3_5/modeling_qwen3_5.py` (the torch fallback) and docs/hybrid-models.md.
//!
//! Two numeric profiles ([`GdnProfile`]) of the delta-rule core: `Reference` keeps every
//! intermediate and the state in f32 (transformers' torch fallback), `Engine` rounds the
//! intermediates that fla's Triton kernels store in bf16 (what vLLM / SGLang run).

use anyhow::{ensure, Result};
use rayon::prelude::*;

/// Chunk length of the chunked delta rule (transformers and fla both use 64).
pub const CHUNK: usize = 64;
/// The eps inside the square root of the q/k L2 norm (`l2norm(x, eps=1e-6)` in transformers).
pub const L2_EPS: f32 = 1e-6;

/// Numeric profile of the Gated DeltaNet core (see docs/hybrid-models.md, "Two numeric profiles").
/// `--gdn-profile` takes its values, each with a one-line help.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum GdnProfile {
    /// f32 state and f32 intermediates: transformers' torch fallback
    /// (`torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`).
    #[default]
    #[cfg_attr(
        feature = "cli",
        value(help = "f32 state and intermediates, as transformers' PyTorch fallback")
    )]
    Reference,
    /// fla-style (`fla/ops/gated_delta_rule/chunk.py`) bf16 roundings of the chunked path: the
    /// inputs q, k, v, β and the L2-normed q̂/k̂ are bf16; the inverse M = (I + L)⁻¹, W, U and
    /// V′ are stored bf16; the state is cast to bf16 (once per chunk) for the W·S and Q·S
    /// products while its running sum stays f32; the output is bf16. The recurrent (one-token)
    /// path only rounds its inputs and output (fla's `fused_recurrent` keeps f32 inside).
    #[cfg_attr(
        feature = "cli",
        value(help = "bf16 intermediates where the fla Triton kernels (vLLM, SGLang) keep them")
    )]
    Engine,
}

/// Sizes of one Gated DeltaNet core: `k_heads` query/key heads of `k_dim`, `v_heads` value heads
/// of `v_dim`; value head `h` reads query/key head `h / (v_heads / k_heads)` (grouped value
/// heads, transformers' `repeat_interleave`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl GdnShape {
    /// Columns of q (and of k): `k_heads · k_dim`.
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.k_dim
    }
    /// Columns of v (and of the core's output): `v_heads · v_dim`.
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_dim
    }
    /// Columns of the conv input / output q | k | v: `2 · key_dim + value_dim`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// f32 values of one sequence's recurrent state: `v_heads · k_dim · v_dim`.
    pub fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }
    /// Value heads per query/key head.
    pub fn group(&self) -> usize {
        self.v_heads / self.k_heads
    }
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.k_heads > 0 && self.v_heads > 0 && self.k_dim > 0 && self.v_dim > 0,
            "gated delta rule: zero heads or head dims in {self:?}"
        );
        ensure!(
            self.v_heads.is_multiple_of(self.k_heads),
            "gated delta rule: {} value heads are not a multiple of {} key heads",
            self.v_heads,
            self.k_heads
        );
        Ok(())
    }
}

/// An f32 buffer in host memory: the [`super::Backend::F32Buf`] of backends that keep
/// recurrent states on the host (the CPU; the CUDA backend until it has its own kernels).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostF32(pub Vec<f32>);

/// Round to the nearest bf16 (ties to even) and back to f32.
pub fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

fn round_all(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = bf16_round(*v));
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's `F.softplus` (beta 1, threshold 20): `x` above 20, else `ln(1 + eˣ)`.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Zero-centred RMSNorm (`Qwen3_5RMSNorm`): over consecutive groups of `group` columns,
/// `y = (x · rsqrt(mean(x²) + eps)) · (1 + w)` with `1 + w` formed in f32, as transformers does
/// (`output * (1.0 + self.weight.float())`). `x` `[rows, cols]`, `w` `[group]`.
pub fn rms_norm_zero_centred(x: &[f32], w: &[f32], eps: f32, group: usize) -> Vec<f32> {
    let scale: Vec<f32> = w.iter().map(|v| 1.0 + v).collect();
    let mut out = x.to_vec();
    out.par_chunks_mut(group).for_each(|g| {
        let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for (v, s) in g.iter_mut().zip(&scale) {
            *v = *v * r * s;
        }
    });
    out
}

/// Gated RMSNorm (`Qwen3_5RMSNormGated`): per group of `group` columns (one value head),
/// `y = (w ⊙ x · rsqrt(mean(x²) + eps)) ⊙ silu(z)`; `w` is used as stored (not zero-centred).
/// `x`, `z` `[rows, cols]`, `w` `[group]`.
pub fn gated_rms_norm(x: &[f32], z: &[f32], w: &[f32], eps: f32, group: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    out.par_chunks_mut(group)
        .zip(z.par_chunks(group))
        .for_each(|(g, zg)| {
            let ms = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
            let r = 1.0 / (ms + eps).sqrt();
            for ((v, wv), zv) in g.iter_mut().zip(w).zip(zg) {
                *v = (wv * (*v * r)) * silu(*zv);
            }
        });
    out
}

/// `x ⊙= sigmoid(gate)` elementwise (the gated attention's output gate).
pub fn sigmoid_gate(x: &mut [f32], gate: &[f32]) {
    x.par_iter_mut()
        .zip(gate)
        .for_each(|(v, g)| *v *= sigmoid(*g));
}

/// Causal depthwise conv1d + SiLU over one sequence, carrying the conv state.
///
/// `x` `[t, c]` (this sequence's new rows), `w` `[c, k]` (`conv1d.weight` `[c, 1, k]` squeezed;
/// `w[ch, k−1]` weights the current token), `state` `[k−1, c]`: the `k−1` inputs before `x`,
/// oldest first (zeros for a fresh sequence). Returns `[t, c]` with
/// `y[i, ch] = silu(Σ_j w[ch, j] · input[i − (k−1) + j, ch])`, where `input` is `state ++ x`;
/// `state` becomes the last `k−1` rows of `state ++ x`.
pub fn causal_conv1d_silu(x: &[f32], c: usize, w: &[f32], k: usize, state: &mut [f32]) -> Vec<f32> {
    let t = x.len() / c;
    let hist = k - 1;
    let mut input = Vec::with_capacity((hist + t) * c);
    input.extend_from_slice(state);
    input.extend_from_slice(x);
    let mut out = vec![0f32; t * c];
    out.par_chunks_mut(c).enumerate().for_each(|(i, row)| {
        for (ch, y) in row.iter_mut().enumerate() {
            let mut acc = 0f32;
            for j in 0..k {
                acc += w[ch * k + j] * input[(i + j) * c + ch];
            }
            *y = silu(acc);
        }
    });
    state.copy_from_slice(&input[t * c..]);
    out
}

/// Decay and write strength per (token, value head): `g = −exp(A_log) · softplus(a + dt_bias)`
/// (≤ 0, the log of the decay α) and `β = sigmoid(b)`. `a`, `b` `[t, v_heads]`; `a_log`,
/// `dt_bias` `[v_heads]`. Returns `(g, β)`, both `[t, v_heads]`.
pub fn gdn_gates(a: &[f32], b: &[f32], a_log: &[f32], dt_bias: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let hv = a_log.len();
    let neg_a: Vec<f32> = a_log.iter().map(|v| -v.exp()).collect();
    let g = a
        .iter()
        .enumerate()
        .map(|(i, &av)| neg_a[i % hv] * softplus(av + dt_bias[i % hv]))
        .collect();
    let beta = b.iter().map(|&bv| sigmoid(bv)).collect();
    (g, beta)
}

/// In place per head of `dim` columns: `x ← x · rsqrt(Σx² + eps)` (transformers' `l2norm`,
/// eps inside the root).
pub fn l2norm_heads(x: &mut [f32], dim: usize, eps: f32) {
    x.par_chunks_mut(dim).for_each(|h| {
        let r = 1.0 / (h.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
        h.iter_mut().for_each(|v| *v *= r);
    });
}

/// Inputs of one value head over one sequence, ready for the delta rule.
struct HeadInputs {
    /// `[t, dk]`, L2-normed and scaled by `dk^−½`.
    q: Vec<f32>,
    /// `[t, dk]`, L2-normed.
    k: Vec<f32>,
    /// `[t, dv]`.
    v: Vec<f32>,
    /// `[t]`.
    g: Vec<f32>,
    /// `[t]`.
    beta: Vec<f32>,
}

/// The per-layer constants of [`gated_delta_rule_seq`], on the host: `a_log`, `dt_bias`
/// `[v_heads]`, the head layout and the numerics profile.
#[derive(Clone, Copy, Debug)]
pub struct GdnLayerHost<'a> {
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
    pub shape: GdnShape,
    pub profile: GdnProfile,
}

/// The gated delta rule over one sequence.
///
/// `qkv` `[t, conv_dim]` (the conv output: q | k | v columns), `a`, `b` `[t, v_heads]` (the raw
/// `in_proj_a` / `in_proj_b` outputs), `layer` the layer's constants, `state`
/// `[v_heads, k_dim, v_dim]` (S per value head, row = key dim; zeros for a fresh sequence),
/// updated in place. Returns the core output `[t, v_heads · v_dim]` (before the gated norm).
///
/// q and k are L2-normed per head, q is scaled by `k_dim^−½`, then every value head runs the
/// recurrence of docs/hybrid-models.md: one row → the recurrent form, more rows → the chunked
/// form (chunks of [`CHUNK`]), as transformers does for cached decode vs prefill.
pub fn gated_delta_rule_seq(
    (qkv, a, b): (&[f32], &[f32], &[f32]),
    layer: GdnLayerHost<'_>,
    state: &mut [f32],
) -> Vec<f32> {
    let GdnLayerHost {
        a_log,
        dt_bias,
        shape,
        profile,
    } = layer;
    let (hk, hv, dk, dv) = (shape.k_heads, shape.v_heads, shape.k_dim, shape.v_dim);
    let cd = shape.conv_dim();
    let t = qkv.len() / cd;
    let engine = profile == GdnProfile::Engine;
    let r16 = |v: f32| if engine { bf16_round(v) } else { v };
    let (g, beta) = gdn_gates(a, b, a_log, dt_bias);
    // q̂ and k̂ per key head, [hk][t, dk].
    let norm_heads = |col0: usize| -> Vec<Vec<f32>> {
        (0..hk)
            .map(|h| {
                let mut x: Vec<f32> = (0..t)
                    .flat_map(|i| &qkv[i * cd + col0 + h * dk..i * cd + col0 + (h + 1) * dk])
                    .map(|&v| r16(v))
                    .collect();
                l2norm_heads(&mut x, dk, L2_EPS);
                if engine {
                    round_all(&mut x);
                }
                x
            })
            .collect()
    };
    let scale = (dk as f32).powf(-0.5);
    let qs: Vec<Vec<f32>> = norm_heads(0)
        .into_iter()
        .map(|x| x.into_iter().map(|v| v * scale).collect())
        .collect();
    let ks = norm_heads(shape.key_dim());
    let v0 = 2 * shape.key_dim();
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(h, s)| {
            let kh = h / shape.group();
            let inp = HeadInputs {
                q: qs[kh].clone(),
                k: ks[kh].clone(),
                v: (0..t)
                    .flat_map(|i| &qkv[i * cd + v0 + h * dv..i * cd + v0 + (h + 1) * dv])
                    .map(|&v| r16(v))
                    .collect(),
                g: (0..t).map(|i| g[i * hv + h]).collect(),
                beta: (0..t).map(|i| r16(beta[i * hv + h])).collect(),
            };
            let mut o = if t == 1 {
                head_recurrent(&inp, dk, dv, s)
            } else {
                head_chunked(&inp, dk, dv, s, profile)
            };
            if engine {
                round_all(&mut o);
            }
            o
        })
        .collect();
    let mut out = vec![0f32; t * hv * dv];
    for (h, o) in per_head.iter().enumerate() {
        for i in 0..t {
            out[i * hv * dv + h * dv..i * hv * dv + (h + 1) * dv]
                .copy_from_slice(&o[i * dv..(i + 1) * dv]);
        }
    }
    out
}

/// The recurrent form, token by token (transformers' `torch_recurrent_gated_delta_rule`):
/// `S ← e^g S; m = Sᵀk; δ = β (v − m); S ← S + k δᵀ; o = Sᵀq`. `s` `[dk, dv]`; returns `[t, dv]`.
fn head_recurrent(x: &HeadInputs, dk: usize, dv: usize, s: &mut [f32]) -> Vec<f32> {
    let t = x.g.len();
    let mut out = vec![0f32; t * dv];
    let mut m = vec![0f32; dv];
    for i in 0..t {
        let (q, k, v) = (
            &x.q[i * dk..(i + 1) * dk],
            &x.k[i * dk..(i + 1) * dk],
            &x.v[i * dv..(i + 1) * dv],
        );
        let decay = x.g[i].exp();
        s.iter_mut().for_each(|e| *e *= decay);
        m.iter_mut().for_each(|e| *e = 0.0);
        for (a, srow) in s.chunks(dv).enumerate() {
            for (mj, sij) in m.iter_mut().zip(srow) {
                *mj += sij * k[a];
            }
        }
        for (a, srow) in s.chunks_mut(dv).enumerate() {
            for j in 0..dv {
                srow[j] += k[a] * ((v[j] - m[j]) * x.beta[i]);
            }
        }
        let o = &mut out[i * dv..(i + 1) * dv];
        for (a, srow) in s.chunks(dv).enumerate() {
            for (oj, sij) in o.iter_mut().zip(srow) {
                *oj += sij * q[a];
            }
        }
    }
    out
}

/// `(I + L)⁻¹ · rhs` for a strictly lower-triangular `l` `[n, n]` (forward substitution, the
/// unit diagonal implied), `rhs` `[n, w]`.
fn solve_unit_lower(l: &[f32], n: usize, rhs: &[f32], w: usize) -> Vec<f32> {
    let mut x = rhs.to_vec();
    for i in 0..n {
        for j in 0..i {
            let lij = l[i * n + j];
            if lij != 0.0 {
                for c in 0..w {
                    x[i * w + c] -= lij * x[j * w + c];
                }
            }
        }
    }
    x
}

/// `a [n, m] · b [m, w] → [n, w]`.
fn mm(a: &[f32], b: &[f32], n: usize, m: usize, w: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * w];
    for i in 0..n {
        for p in 0..m {
            let aip = a[i * m + p];
            for c in 0..w {
                out[i * w + c] += aip * b[p * w + c];
            }
        }
    }
    out
}

/// The chunked form (transformers' `torch_chunk_gated_delta_rule`, chunks of [`CHUNK`]; a
/// short last chunk equals zero padding because padded rows have k = v = β = g = 0). Per
/// chunk of n rows with γ = cumsum(g), Γ_rs = e^{γ_r − γ_s} (r ≥ s):
/// `L_rs = β_r (k_r·k_s) Γ_rs` (r > s), `U = (I+L)⁻¹ diag(β) V`, `W = (I+L)⁻¹ diag(β e^γ) K`,
/// `V′ = U − W S`, `O = diag(e^γ) Q S + ((Q Kᵀ) ⊙ Γ) V′`,
/// `S ← e^{γ_n} S + (diag(e^{γ_n − γ}) K)ᵀ V′`. `s` `[dk, dv]`; returns `[t, dv]`.
fn head_chunked(
    x: &HeadInputs,
    dk: usize,
    dv: usize,
    s: &mut [f32],
    profile: GdnProfile,
) -> Vec<f32> {
    let engine = profile == GdnProfile::Engine;
    let t = x.g.len();
    let mut out = vec![0f32; t * dv];
    let mut c0 = 0;
    while c0 < t {
        let n = CHUNK.min(t - c0);
        let q = &x.q[c0 * dk..(c0 + n) * dk];
        let k = &x.k[c0 * dk..(c0 + n) * dk];
        let beta = &x.beta[c0..c0 + n];
        let mut gamma = vec![0f32; n];
        let mut acc = 0f32;
        for (r, gr) in gamma.iter_mut().enumerate() {
            acc += x.g[c0 + r];
            *gr = acc;
        }
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let mut l = vec![0f32; n * n];
        let mut intra = vec![0f32; n * n];
        for r in 0..n {
            for c in 0..=r {
                let decay = (gamma[r] - gamma[c]).exp();
                let (kr, kc, qr) = (
                    &k[r * dk..(r + 1) * dk],
                    &k[c * dk..(c + 1) * dk],
                    &q[r * dk..(r + 1) * dk],
                );
                if c < r {
                    l[r * n + c] = dot(kr, kc) * beta[r] * decay;
                }
                intra[r * n + c] = dot(qr, kc) * decay;
            }
        }
        let v_beta: Vec<f32> = (0..n * dv)
            .map(|e| x.v[c0 * dv + e] * beta[e / dv])
            .collect();
        let k_beta_decay: Vec<f32> = (0..n * dk)
            .map(|e| k[e] * beta[e / dk] * gamma[e / dk].exp())
            .collect();
        let (u, w) = if engine {
            // fla forms M = (I + L)⁻¹ explicitly and stores it, U and W in bf16.
            let mut eye = vec![0f32; n * n];
            (0..n).for_each(|i| eye[i * n + i] = 1.0);
            let mut m = solve_unit_lower(&l, n, &eye, n);
            round_all(&mut m);
            let mut u = mm(&m, &v_beta, n, n, dv);
            let mut w = mm(&m, &k_beta_decay, n, n, dk);
            round_all(&mut u);
            round_all(&mut w);
            (u, w)
        } else {
            (
                solve_unit_lower(&l, n, &v_beta, dv),
                solve_unit_lower(&l, n, &k_beta_decay, dk),
            )
        };
        // The state as the chunk's products read it: bf16 in the engine profile.
        let s_read: Vec<f32> = if engine {
            s.iter().map(|&v| bf16_round(v)).collect()
        } else {
            s.to_vec()
        };
        let ws = mm(&w, &s_read, n, dk, dv);
        let mut v_new: Vec<f32> = u.iter().zip(&ws).map(|(a, b)| a - b).collect();
        if engine {
            round_all(&mut v_new);
        }
        let q_decay: Vec<f32> = (0..n * dk).map(|e| q[e] * gamma[e / dk].exp()).collect();
        let inter = mm(&q_decay, &s_read, n, dk, dv);
        let local = mm(&intra, &v_new, n, n, dv);
        for e in 0..n * dv {
            out[c0 * dv + e] = inter[e] + local[e];
        }
        let last = gamma[n - 1];
        let chunk_decay = last.exp();
        let k_decay: Vec<f32> = (0..n * dk)
            .map(|e| k[e] * (last - gamma[e / dk]).exp())
            .collect();
        s.iter_mut().for_each(|e| *e *= chunk_decay);
        for r in 0..n {
            for a in 0..dk {
                let kra = k_decay[r * dk + a];
                let srow = &mut s[a * dv..(a + 1) * dv];
                for (sj, vj) in srow.iter_mut().zip(&v_new[r * dv..(r + 1) * dv]) {
                    *sj += kra * vj;
                }
            }
        }
        c0 += n;
    }
    out
}

#[cfg(test)]
#[path = "gdn_tests.rs"]
mod tests;
