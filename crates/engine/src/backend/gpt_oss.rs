//! What gpt-oss adds to the backend seam (docs/moe-models.md, "gpt-oss"): attention sinks and a
//! sliding window on the target's causal attention ([`AttnExtras`]), rotary tables from given
//! inverse frequencies and a scale (YaRN: [`RopeFreqs`]), and the clamped SwiGLU of its experts
//! ([`clamped_swiglu`]). This file holds the values those [`super::Backend`] ops take, their host
//! references and the defaults written with the trait's other ops; the CPU reference implements
//! them in `cpu/` (the sink in the softmax of `cpu/attention.rs`).
//!
//! Reference: transformers 5.17 `models/gpt_oss/modeling_gpt_oss.py` (`eager_attention_forward`,
//! `GptOssExperts._apply_gate`, `GptOssRotaryEmbedding`).

use super::{AttnMask, AttnShape, Backend, KvSlot, Rope, RopeStyle};
use anyhow::{bail, ensure, Result};

/// What gpt-oss adds to a target's causal attention. [`AttnExtras::NONE`] is plain attention.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnExtras<'a> {
    /// A `sliding_attention` layer's window: a query at position p sees the keys at positions
    /// `p − window + 1 ..= p` (transformers' `sliding_window_overlay`: `kv_idx > q_idx −
    /// sliding_window`). Only for causal masks ([`AttnMask::Causal`], packed prefill, decode).
    pub window: Option<usize>,
    /// One learned logit per query head that joins the softmax's denominator and has no value
    /// (gpt-oss `self_attn.sinks`): with scaled scores `s_j` of the visible keys and the head's
    /// sink `z`, `m = max(max_j s_j, z)` and `p_j = exp(s_j − m) / (Σ_k exp(s_k − m) + exp(z −
    /// m))`; the sink is not scaled. Length: the query heads.
    pub sinks: Option<&'a [f32]>,
}

impl AttnExtras<'_> {
    /// Plain attention: no window, no sinks.
    pub const NONE: AttnExtras<'static> = AttnExtras {
        window: None,
        sinks: None,
    };

    pub fn is_none(&self) -> bool {
        self.window.is_none() && self.sinks.is_none()
    }

    /// The checks of every attention op that takes extras (one message each).
    pub(crate) fn check(&self, shape: AttnShape, mask: Option<&AttnMask>) -> Result<()> {
        if let Some(s) = self.sinks {
            ensure!(
                s.len() == shape.heads,
                "attention: {} sink logits for {} query heads",
                s.len(),
                shape.heads
            );
        }
        if let Some(w) = self.window {
            ensure!(w > 0, "attention: sliding window of 0 keys");
            ensure!(
                !matches!(mask, Some(AttnMask::Blocks { .. })),
                "attention: a sliding window on drafter blocks goes in AttnMask::Blocks, not in the extras"
            );
        }
        Ok(())
    }
}

/// Rotary embedding from explicit inverse frequencies with a scale on cos and sin: transformers'
/// `GptOssRotaryEmbedding` (`cos = cos(p·inv_freq) · attention_scaling`, likewise sin, in f32)
/// for any `rope_type` whose init function gives `(inv_freq, attention_scaling)` (YaRN:
/// `crate::model::gpt_oss::yarn_inv_freq`). Applied like [`Rope`]: rotate-half pairs over the
/// first `rotary_dim` columns of each head.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeFreqs {
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub style: RopeStyle,
    /// `rotary_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's `mscale`; 1 for plain RoPE).
    pub attention_scaling: f32,
}

impl RopeFreqs {
    /// The plain RoPE of `rope`: `inv_freq[i] = 1 / θ^(2i / rotary_dim)` in f32 (transformers'
    /// default init), scale 1.
    pub fn of_rope(rope: &Rope) -> RopeFreqs {
        RopeFreqs {
            head_dim: rope.head_dim,
            rotary_dim: rope.rotary_dim,
            style: rope.style,
            inv_freq: (0..rope.rotary_dim / 2)
                .map(|i| 1.0 / rope.theta.powf((2 * i) as f32 / rope.rotary_dim as f32))
                .collect(),
            attention_scaling: 1.0,
        }
    }

    pub(crate) fn check(&self, cols: usize, rows: usize, positions: usize) -> Result<()> {
        ensure!(
            positions == rows,
            "rope: {positions} positions for {rows} rows"
        );
        ensure!(
            self.head_dim > 0 && cols.is_multiple_of(self.head_dim),
            "rope: {cols} columns are not whole heads of {}",
            self.head_dim
        );
        ensure!(
            self.rotary_dim <= self.head_dim
                && self.rotary_dim.is_multiple_of(2)
                && self.inv_freq.len() * 2 == self.rotary_dim,
            "rope: rotary_dim {} with {} inverse frequencies",
            self.rotary_dim,
            self.inv_freq.len()
        );
        Ok(())
    }
}

/// gpt-oss's expert activation on a fused `[T, 2·I]` projection output whose first I columns are
/// the gate and last I the up projection (draftlens de-interleaves transformers' `gate_up[...,
/// ::2]` / `[..., 1::2]` columns at load): `g = min(gate, limit)`, `u = clamp(up, −limit, limit)`,
/// `out = (u + 1) · (g · sigmoid(g · alpha))`, in f32 in that order (`GptOssExperts._apply_gate`;
/// `alpha` 1.702, `limit` 7.0 there). A NaN stays NaN, as in `torch.clamp`.
pub fn clamped_swiglu(gu: &[f32], cols: usize, alpha: f32, limit: f32) -> Vec<f32> {
    let half = cols / 2;
    let mut out = Vec::with_capacity(gu.len() / 2);
    for row in gu.chunks_exact(cols.max(1)) {
        let (gate, up) = row.split_at(half);
        for (&g, &u) in gate.iter().zip(up) {
            let g = if g > limit { limit } else { g };
            let u = if u > limit {
                limit
            } else if u < -limit {
                -limit
            } else {
                u
            };
            let glu = g * (1.0 / (1.0 + (-(g * alpha)).exp()));
            out.push((u + 1.0) * glu);
        }
    }
    out
}

/// The shape check of [`Backend::clamped_swiglu_packed`].
pub(crate) fn check_clamped_swiglu(cols: usize) -> Result<()> {
    ensure!(
        cols.is_multiple_of(2),
        "clamped_swiglu: {cols} columns cannot be gate | up halves"
    );
    Ok(())
}

/// What a backend without sinks says when asked for them (and at load: `model::gpt_oss`).
pub fn sinks_unsupported(backend: &str) -> String {
    format!(
        "gpt-oss attention sinks are not implemented on the {} backend yet; use --backend cpu",
        backend.to_uppercase()
    )
}

/// [`Backend::attention_ext_impl`]'s default: only plain attention.
pub(crate) fn attention_ext_unsupported<B: Backend + ?Sized>(be: &B) -> Result<B::Tensor> {
    bail!(
        "{} (attention with sinks or a sliding window on the {} backend)",
        sinks_unsupported(be.name()),
        be.name()
    )
}

/// Append `k`/`v` (the new tokens at positions `start..`) to one sequence's cache and attend `q`
/// over every cached position with `extras`: the cached forward of a gpt-oss attention layer.
#[allow(clippy::too_many_arguments)]
pub fn append_and_attend_ext<B: Backend + ?Sized>(
    be: &B,
    slot: KvSlot<'_, B::Tensor>,
    q: &B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    shape: AttnShape,
    start: usize,
    extras: AttnExtras<'_>,
) -> Result<B::Tensor> {
    let KvSlot {
        k: k_cache,
        v: v_cache,
    } = slot;
    for (cache, new) in [(&mut *k_cache, k), (&mut *v_cache, v)] {
        match cache {
            Some(old) => be.append_rows(old, &new)?,
            None => *cache = Some(new),
        }
    }
    let (Some(k_all), Some(v_all)) = (k_cache.as_ref(), v_cache.as_ref()) else {
        bail!("attention: the cache lost its keys");
    };
    be.attention_ext(
        q,
        k_all,
        v_all,
        shape,
        &AttnMask::Causal { q_start: start },
        extras,
    )
}
