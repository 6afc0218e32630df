//! The Gated DeltaNet token mixer of the Qwen3.5 / Qwen3-Next hybrids (`linear_attn.*`), read
//! side by side with `Qwen3_5GatedDeltaNet` in transformers' `modeling_qwen3_5.py`.
//!
//! Forward of T tokens `x` `[T, D]` (already through the layer's zero-centred input norm):
//! 1. `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (one stacked GEMM here):
//!    `mixed` `[T, conv_dim]` (q | k | v), `z` `[T, Hv·dv]`, `b`, `a` `[T, Hv]`.
//! 2. causal depthwise conv1d (kernel K) + SiLU over `mixed`, carrying the last K−1 inputs.
//! 3. the gated delta rule (L2-normed q/k, decay `g = −exp(A_log)·softplus(a + dt_bias)`,
//!    `β = sigmoid(b)`, state S `[Hv, dk, dv]` per sequence) → `o` `[T, Hv·dv]`.
//! 4. gated RMSNorm per value head with `norm.weight` and gate `z`; `out_proj` → `[T, D]`.
//!
//! The maths of steps 2–4 are [`Backend`] ops ([`Backend::causal_conv1d_silu`],
//! [`Backend::gated_delta_rule`], [`Backend::gated_rms_norm`]) whose reference definitions
//! are in `crate::backend::gdn`; docs/hybrid-models.md explains them.

use super::hybrid::HybridSpec;
use super::transformer::load_stacked_matrix;
use crate::backend::{Backend, GdnParams, GdnProfile, GdnShape, SeqStarts};
use crate::formats::WeightSource;
use anyhow::{bail, Result};

/// The recurrent state of one Gated DeltaNet layer for one sequence.
pub struct GdnState<B: Backend> {
    /// The last K−1 inputs of the conv, `[K−1, conv_dim]`, oldest first.
    pub conv: B::Tensor,
    /// S per value head, f32 `[Hv, dk, dv]`.
    pub recurrent: B::F32Buf,
}

impl<B: Backend> GdnState<B> {
    /// The state of a fresh sequence: zeros (the conv's causal padding and S₀ = 0).
    pub fn zeros(be: &B, shape: GdnShape, kernel: usize) -> Result<Self> {
        let c = shape.conv_dim();
        Ok(GdnState {
            conv: be.from_host(&vec![0.0; (kernel - 1) * c], kernel - 1, c)?,
            recurrent: be.f32_from_host(&vec![0.0; shape.state_len()])?,
        })
    }

    /// An independent copy (the snapshot a speculative-decoding crop restores).
    pub fn copy(&self, be: &B) -> Result<Self> {
        let rows = be.dims(&self.conv).0;
        Ok(GdnState {
            conv: be.slice_rows(&self.conv, 0, rows)?,
            recurrent: be.f32_copy(&self.recurrent)?,
        })
    }
}

/// One Gated DeltaNet layer (`model.layers.{i}.linear_attn`).
pub struct GdnMixer<B: Backend> {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` stacked by output rows,
    /// `[conv_dim + Hv·dv + 2·Hv, D]`: one GEMM whose output columns are q | k | v | z | b | a.
    pub in_proj: B::Matrix,
    /// `conv1d.weight` `[conv_dim, 1, K]` stored as `[conv_dim, K]`.
    pub conv1d: B::Tensor,
    /// `A_log` `[Hv]`, kept in f32 (f32 in real checkpoints).
    pub a_log: B::F32Buf,
    /// `dt_bias` `[Hv]`, f32.
    pub dt_bias: B::F32Buf,
    /// `norm.weight` `[1, dv]`: the gated RMSNorm's scale, used as stored (not zero-centred).
    pub norm: B::Tensor,
    /// `out_proj` `[D, Hv·dv]`.
    pub out_proj: B::Matrix,
    pub shape: GdnShape,
    pub kernel: usize,
    pub eps: f32,
    /// Numerics of the delta-rule core ([`crate::model::TargetModel::set_gdn_profile`]).
    pub profile: GdnProfile,
}

/// Load a 1-D tensor of length `n` by HF name as host f32.
fn load_f32(src: &dyn WeightSource, name: &str, n: usize) -> Result<Vec<f32>> {
    let t = src.tensor(name)?;
    if t.shape != [n] {
        bail!(
            "{}: tensor {name} has shape {:?}, the config implies [{n}]",
            src.path().display(),
            t.shape
        );
    }
    Ok(t.data)
}

impl<B: Backend> GdnMixer<B> {
    pub fn load(
        be: &B,
        src: &dyn WeightSource,
        prefix: &str,
        hidden: usize,
        hy: &HybridSpec,
        eps: f32,
    ) -> Result<Self> {
        let shape = hy.gdn_shape();
        let k = hy.linear_conv_kernel_dim;
        let c = shape.conv_dim();
        let conv = src.tensor(&format!("{prefix}.conv1d.weight"))?;
        if conv.shape != [c, 1, k] {
            bail!(
                "{}: tensor {prefix}.conv1d.weight has shape {:?}, the config implies [{c}, 1, {k}]",
                src.path().display(),
                conv.shape
            );
        }
        Ok(GdnMixer {
            in_proj: load_stacked_matrix(
                be,
                src,
                &[
                    (format!("{prefix}.in_proj_qkv.weight"), c),
                    (format!("{prefix}.in_proj_z.weight"), shape.value_dim()),
                    (format!("{prefix}.in_proj_b.weight"), shape.v_heads),
                    (format!("{prefix}.in_proj_a.weight"), shape.v_heads),
                ],
                hidden,
            )?,
            conv1d: be.from_host(&conv.data, c, k)?,
            a_log: be.f32_from_host(&load_f32(src, &format!("{prefix}.A_log"), shape.v_heads)?)?,
            dt_bias: be.f32_from_host(&load_f32(
                src,
                &format!("{prefix}.dt_bias"),
                shape.v_heads,
            )?)?,
            norm: be.from_host(
                &load_f32(src, &format!("{prefix}.norm.weight"), shape.v_dim)?,
                1,
                shape.v_dim,
            )?,
            out_proj: super::transformer::load_matrix(
                be,
                src,
                &format!("{prefix}.out_proj.weight"),
                hidden,
                shape.value_dim(),
            )?,
            shape,
            kernel: k,
            eps,
            profile: GdnProfile::Reference,
        })
    }

    /// A fresh sequence's state for this layer.
    pub fn zero_state(&self, be: &B) -> Result<GdnState<B>> {
        GdnState::zeros(be, self.shape, self.kernel)
    }

    /// `h += out_proj(mixer(x))` for sequences packed row-wise (`seq_starts`, each sequence's
    /// rows contiguous), sequence i continuing from `states[i]` (updated in place).
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        seq_starts: &SeqStarts,
        states: &mut [&mut GdnState<B>],
        h: &mut B::Tensor,
    ) -> Result<()> {
        let Projected { mixed, z, b, a } = self.project(be, x)?;
        let o = self.core(be, mixed, &a, &b, seq_starts, states)?;
        let o = be.gated_rms_norm(&o, &z, &self.norm, self.eps, self.shape.v_dim)?;
        be.matmul_acc(&o, &self.out_proj, h)
    }

    /// [`GdnMixer::forward`] of one sequence's rows as that many decode steps
    /// ([`crate::model::TargetModel::forward_verify`]): the projections and the norm over all
    /// rows at once (at most `Backend::max_independent_rows` of them, where a row's bits do not
    /// depend on the others), the convolution and the delta rule stepped a row at a time on
    /// `state`, as a decode step runs them.
    pub fn forward_steps(
        &self,
        be: &B,
        x: &B::Tensor,
        state: &mut GdnState<B>,
        h: &mut B::Tensor,
    ) -> Result<()> {
        let p = self.project(be, x)?;
        let rows = be.dims(x).0;
        let mut steps = Vec::with_capacity(rows);
        for r in 0..rows {
            let row = |t: &B::Tensor| be.slice_rows(t, r, r + 1);
            let (mixed, a, b) = (row(&p.mixed)?, row(&p.a)?, row(&p.b)?);
            steps.push(self.core(be, mixed, &a, &b, &SeqStarts::one(1), &mut [&mut *state])?);
        }
        let o = be.concat_rows(&steps.iter().collect::<Vec<_>>())?;
        let o = be.gated_rms_norm(&o, &p.z, &self.norm, self.eps, self.shape.v_dim)?;
        be.matmul_acc(&o, &self.out_proj, h)
    }

    /// The input projection split into the convolution's input, the output gate z and the
    /// per-head b and a.
    fn project(&self, be: &B, x: &B::Tensor) -> Result<Projected<B>> {
        let s = self.shape;
        let proj = be.matmul(x, &self.in_proj)?;
        let mut parts = be
            .split_cols(&proj, &[s.conv_dim(), s.value_dim(), s.v_heads, s.v_heads])?
            .into_iter();
        let (Some(mixed), Some(z), Some(b), Some(a)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            bail!("gated deltanet: split_cols did not return qkv, z, b and a");
        };
        Ok(Projected { mixed, z, b, a })
    }

    /// The recurrent core: causal convolution + SiLU, then the gated delta rule, each sequence
    /// continuing from its state. Takes `mixed` to free it before the delta rule (a long
    /// prefill's largest activation).
    fn core(
        &self,
        be: &B,
        mixed: B::Tensor,
        a: &B::Tensor,
        b: &B::Tensor,
        seq_starts: &SeqStarts,
        states: &mut [&mut GdnState<B>],
    ) -> Result<B::Tensor> {
        let mut convs: Vec<&mut B::Tensor> = states.iter_mut().map(|st| &mut st.conv).collect();
        let qkv = be.causal_conv1d_silu(&mixed, &self.conv1d, seq_starts, &mut convs)?;
        drop(mixed);
        let params = GdnParams {
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            shape: self.shape,
            profile: self.profile,
        };
        let mut rec: Vec<&mut B::F32Buf> = states.iter_mut().map(|st| &mut st.recurrent).collect();
        be.gated_delta_rule(&qkv, a, b, &params, seq_starts, &mut rec)
    }
}

/// [`GdnMixer::project`]'s parts.
struct Projected<B: Backend> {
    mixed: B::Tensor,
    z: B::Tensor,
    b: B::Tensor,
    a: B::Tensor,
}
