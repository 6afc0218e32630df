//! The unfused compositions that are [`Backend`] defaults and the fallbacks of backends whose
//! fused paths do not cover a shape: written once in terms of the trait's other ops.

use super::{AttnExtras, AttnMask, AttnShape, Backend, KvSlot, QkNorm, Rope, RopeFreqs, SeqStarts};
use anyhow::{ensure, Result};

/// [`Backend::attention_varlen_qkv`] as separate ops: [`split_norm_rope`], then
/// [`Backend::attention_varlen`]. The trait's default, and the fallback of backends whose fused
/// path does not cover a shape.
pub fn attention_varlen_qkv_unfused<B: Backend + ?Sized>(
    be: &B,
    qkv: B::Tensor,
    shape: AttnShape,
    qk_norm: Option<QkNorm<'_, B::Tensor>>,
    positions: &[u32],
    rope: &Rope,
    seq_starts: &SeqStarts,
) -> Result<B::Tensor> {
    let (q, k, v) = split_norm_rope(be, qkv, shape, qk_norm, positions, rope)?;
    be.attention_varlen(&q, &k, &v, shape, seq_starts)
}

/// [`Backend::attention_decode_qkv`] as separate ops: [`split_norm_rope`], then
/// [`Backend::attention_decode`]. The trait's default, and the fallback of backends whose fused
/// path does not cover a shape.
pub fn attention_decode_qkv_unfused<B: Backend + ?Sized>(
    be: &B,
    qkv: B::Tensor,
    shape: AttnShape,
    qk_norm: Option<QkNorm<'_, B::Tensor>>,
    positions: &[u32],
    rope: &Rope,
    caches: &mut [KvSlot<'_, B::Tensor>],
) -> Result<B::Tensor> {
    let (q, k, v) = split_norm_rope(be, qkv, shape, qk_norm, positions, rope)?;
    be.attention_decode(&q, &k, &v, shape, caches)
}

/// [`Backend::attention_decode_qkv_ext`] as separate ops: [`split_rope_freqs`], then
/// [`Backend::attention_decode_ext`]. The trait's default, and the fallback of backends whose
/// fused path does not cover a shape.
#[allow(clippy::too_many_arguments)] // the trait method's arguments
pub fn attention_decode_qkv_ext_unfused<B: Backend + ?Sized>(
    be: &B,
    qkv: B::Tensor,
    shape: AttnShape,
    positions: &[u32],
    freqs: &RopeFreqs,
    caches: &mut [KvSlot<'_, B::Tensor>],
    extras: AttnExtras<'_>,
) -> Result<B::Tensor> {
    let (q, k, v) = split_rope_freqs(be, &qkv, shape, positions, freqs)?;
    drop(qkv);
    be.attention_decode_ext(&q, &k, &v, shape, caches, extras)
}

/// The q, k and v of a fused QKV output `[T, (H + 2·Hkv)·hd]` (gpt-oss: no q/k norms), q and k
/// rotated at `positions` from explicit frequencies ([`Backend::rope_freqs_inplace`]).
pub fn split_rope_freqs<B: Backend + ?Sized>(
    be: &B,
    qkv: &B::Tensor,
    shape: AttnShape,
    positions: &[u32],
    freqs: &RopeFreqs,
) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
    let (mut q, mut k, v) = split_qkv(be, qkv, shape)?;
    be.rope_freqs_inplace(&mut q, positions, freqs)?;
    be.rope_freqs_inplace(&mut k, positions, freqs)?;
    Ok((q, k, v))
}

/// The q, k and v of a fused QKV output `[T, (H + 2·Hkv)·hd]`: split into columns, per-head
/// norms of q and k (group = head_dim) if the model has them, RoPE of q and k at `positions`.
fn split_norm_rope<B: Backend + ?Sized>(
    be: &B,
    qkv: B::Tensor,
    shape: AttnShape,
    qk_norm: Option<QkNorm<'_, B::Tensor>>,
    positions: &[u32],
    rope: &Rope,
) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
    let (mut q, mut k, v) = split_qkv(be, &qkv, shape)?;
    drop(qkv);
    if let Some(n) = qk_norm {
        q = be.rms_norm(&q, n.q, n.eps, shape.head_dim)?;
        k = be.rms_norm(&k, n.k, n.eps, shape.head_dim)?;
    }
    be.rope_inplace(&mut q, positions, rope)?;
    be.rope_inplace(&mut k, positions, rope)?;
    Ok((q, k, v))
}

/// A fused QKV output `[T, (H + 2·Hkv)·hd]` split into its q, k and v columns.
pub fn split_qkv<B: Backend + ?Sized>(
    be: &B,
    qkv: &B::Tensor,
    shape: AttnShape,
) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
    let (qd, kvd) = (
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    let mut parts = be.split_cols(qkv, &[qd, kvd, kvd])?.into_iter();
    let (Some(q), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
        anyhow::bail!("attention: split_cols did not return q, k and v");
    };
    Ok((q, k, v))
}

/// [`Backend::attention_decode`] one sequence at a time: append row r of k/v to cache r
/// ([`Backend::append_rows`]), then [`Backend::attention`] of q row r over the whole cache,
/// causal from position `len_r`. The trait's default.
pub fn attention_decode_per_row<B: Backend + ?Sized>(
    be: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    shape: AttnShape,
    caches: &mut [KvSlot<'_, B::Tensor>],
) -> Result<B::Tensor> {
    attention_decode_per_row_ext(be, q, k, v, shape, caches, AttnExtras::NONE)
}

/// [`attention_decode_per_row`] with gpt-oss's [`AttnExtras`] (through
/// [`Backend::attention_ext`], which is [`Backend::attention`] when there are none): the default
/// of [`Backend::attention_decode_ext`].
pub fn attention_decode_per_row_ext<B: Backend + ?Sized>(
    be: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    shape: AttnShape,
    caches: &mut [KvSlot<'_, B::Tensor>],
    extras: AttnExtras<'_>,
) -> Result<B::Tensor> {
    let rows = be.dims(q).0;
    ensure!(
        rows == caches.len() && be.dims(k).0 == rows && be.dims(v).0 == rows,
        "attention_decode: {rows} query rows, {} k rows, {} v rows for {} caches",
        be.dims(k).0,
        be.dims(v).0,
        caches.len()
    );
    let mut outs = Vec::with_capacity(rows);
    for (r, slot) in caches.iter_mut().enumerate() {
        let start = slot.k.as_ref().map(|t| be.dims(t).0).unwrap_or(0);
        for (cache, new) in [(&mut *slot.k, k), (&mut *slot.v, v)] {
            let row = be.slice_rows(new, r, r + 1)?;
            match cache {
                Some(old) => be.append_rows(old, &row)?,
                None => *cache = Some(row),
            }
        }
        let (k_all, v_all) = match (slot.k.as_ref(), slot.v.as_ref()) {
            (Some(k), Some(v)) => (k, v),
            _ => anyhow::bail!("attention_decode: cache {r} lost its keys"),
        };
        let qr = be.slice_rows(q, r, r + 1)?;
        outs.push(be.attention_ext(
            &qr,
            k_all,
            v_all,
            shape,
            &AttnMask::Causal { q_start: start },
            extras,
        )?);
    }
    be.concat_rows(&outs.iter().collect::<Vec<_>>())
}

/// The default of [`Backend::attention_verify`]: the decode step's attention
/// ([`Backend::attention_decode_ext`]) of each row alone, in order, on the one cache.
pub fn attention_verify_per_row<B: Backend + ?Sized>(
    be: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    shape: AttnShape,
    slot: KvSlot<'_, B::Tensor>,
    extras: AttnExtras<'_>,
) -> Result<B::Tensor> {
    let rows = be.dims(q).0;
    ensure!(
        be.dims(k).0 == rows && be.dims(v).0 == rows,
        "attention_verify: {rows} query rows, {} k rows, {} v rows",
        be.dims(k).0,
        be.dims(v).0
    );
    let mut outs = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = |t: &B::Tensor| be.slice_rows(t, r, r + 1);
        let mut one = [KvSlot {
            k: &mut *slot.k,
            v: &mut *slot.v,
        }];
        outs.push(be.attention_decode_ext(
            &row(q)?,
            &row(k)?,
            &row(v)?,
            shape,
            &mut one,
            extras,
        )?);
    }
    be.concat_rows(&outs.iter().collect::<Vec<_>>())
}

/// The default of [`Backend::attention_varlen`] and [`Backend::attention_varlen_ext`]:
/// [`Backend::attention_ext`] once per sequence, causal from position 0 (with
/// [`AttnExtras::NONE`] that is plain [`Backend::attention`]).
pub fn attention_varlen_per_seq<B: Backend + ?Sized>(
    be: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    shape: AttnShape,
    seq_starts: &SeqStarts,
    extras: AttnExtras<'_>,
) -> Result<B::Tensor> {
    let mut parts = Vec::with_capacity(seq_starts.len());
    for w in seq_starts.windows(2) {
        let (qs, ks, vs) = (
            be.slice_rows(q, w[0], w[1])?,
            be.slice_rows(k, w[0], w[1])?,
            be.slice_rows(v, w[0], w[1])?,
        );
        let mask = AttnMask::Causal { q_start: 0 };
        parts.push(be.attention_ext(&qs, &ks, &vs, shape, &mask, extras)?);
    }
    be.concat_rows(&parts.iter().collect::<Vec<_>>())
}
