//! Synthetic Qwen3-shaped target and DFlash-shaped drafter over the [`Backend`] seam, for the CUDA
//! benchmarks (random weights generated on the GPU: no checkpoint needed for speed) and for the
//! model-level parity checks of `crate::parity` (the same host weights on two backends).
//!
//! The target forward follows models.md §1.3 op by op; the drafter follows dflash.md §1.1
//! (context features = fc(concat(taps)) → hidden_norm, projected by every draft layer's own
//! k/v projections; block rows `[anchor token, MASK × (B−1)]` attend to the context prefix and to
//! their own block).

use super::{CudaBackend, CudaMatrix, CudaTensor};
use crate::backend::{AttnMask, AttnShape, Backend, Rope, RopeStyle, TopK};
use anyhow::{ensure, Result};
use std::time::Instant;

/// Shapes of a Qwen3 dense decoder (also the DFlash drafter: same layer structure).
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecoderShape {
    pub vocab: usize,
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub theta: f32,
}

impl DecoderShape {
    /// Qwen3-8B (models.md §1.1).
    pub fn qwen3_8b() -> Self {
        DecoderShape {
            vocab: 151936,
            hidden: 4096,
            inter: 12288,
            layers: 36,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            eps: 1e-6,
            theta: 1e6,
        }
    }
    /// The Qwen3-8B DFlash drafter (dflash.md §1.3: 5 layers, target hidden size).
    pub fn qwen3_8b_drafter() -> Self {
        DecoderShape {
            layers: 5,
            ..Self::qwen3_8b()
        }
    }
    pub fn rope(&self) -> Rope {
        Rope {
            theta: self.theta,
            head_dim: self.head_dim,
            rotary_dim: self.head_dim,
            style: RopeStyle::RotateHalf,
        }
    }
    pub fn attn(&self) -> AttnShape {
        AttnShape {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
    /// Parameters of one layer's linear projections.
    pub fn layer_linear_params(&self) -> usize {
        let (d, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        d * q + 2 * d * kv + q * d + 3 * d * self.inter
    }
    /// Prefill FLOPs per token of a causal sequence of `seq_len` tokens without the LM head
    /// (models.md §6.1): `2·N_lin + 4·H·hd·(S+1)/2` per layer.
    pub fn prefill_flops_per_token(&self, seq_len: usize) -> f64 {
        let lin = 2.0 * (self.layer_linear_params() * self.layers) as f64;
        let attn = 4.0 * (self.heads * self.head_dim) as f64 * (seq_len as f64 + 1.0) / 2.0
            * self.layers as f64;
        lin + attn
    }
}

/// Weights of one decoder layer.
pub struct Layer<B: Backend> {
    pub in_norm: B::Tensor,
    pub q: B::Matrix,
    pub k: B::Matrix,
    pub v: B::Matrix,
    pub o: B::Matrix,
    pub q_norm: B::Tensor,
    pub k_norm: B::Tensor,
    pub post_norm: B::Tensor,
    pub gate: B::Matrix,
    pub up: B::Matrix,
    pub down: B::Matrix,
}

/// Host copies of a decoder's weights (f32 values that are exactly representable in bf16, so
/// every backend starts from identical weights).
pub struct HostWeights {
    pub embed: Vec<f32>,
    pub layers: Vec<Vec<Vec<f32>>>,
    pub norm: Vec<f32>,
}

/// Deterministic pseudo-random f32 values in [-1, 1) (xorshift64*).
pub fn host_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let v = s.wrapping_mul(0x2545f4914f6cdd1d);
            ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Rounds every value to the nearest bf16.
pub fn round_bf16(v: &mut [f32]) {
    for x in v {
        *x = half::bf16::from_f32(*x).to_f32();
    }
}

fn scaled(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
    let mut v: Vec<f32> = host_random(n, seed)
        .into_iter()
        .map(|x| offset + x * scale)
        .collect();
    round_bf16(&mut v);
    v
}

/// Order of the per-layer tensors in [`HostWeights::layers`].
const LAYER_TENSORS: [&str; 11] = [
    "in_norm",
    "q",
    "k",
    "v",
    "o",
    "q_norm",
    "k_norm",
    "post_norm",
    "gate",
    "up",
    "down",
];

impl HostWeights {
    /// Random weights with uniform values of standard deviation ≈ `std_dev` (linears,
    /// embedding) and norm weights in 1 ± 0.3, so that tests exercise real dynamics (models.md §4).
    pub fn random(s: &DecoderShape, seed: u64, std_dev: f32) -> HostWeights {
        let a = std_dev * 3f32.sqrt();
        let (d, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let layers = (0..s.layers)
            .map(|l| {
                let sd = seed.wrapping_add(1000 * (l as u64 + 1));
                vec![
                    scaled(d, sd, 0.3, 1.0),
                    scaled(q * d, sd + 1, a, 0.0),
                    scaled(kv * d, sd + 2, a, 0.0),
                    scaled(kv * d, sd + 3, a, 0.0),
                    scaled(d * q, sd + 4, a, 0.0),
                    scaled(s.head_dim, sd + 5, 0.3, 1.0),
                    scaled(s.head_dim, sd + 6, 0.3, 1.0),
                    scaled(d, sd + 7, 0.3, 1.0),
                    scaled(s.inter * d, sd + 8, a, 0.0),
                    scaled(s.inter * d, sd + 9, a, 0.0),
                    scaled(d * s.inter, sd + 10, a, 0.0),
                ]
            })
            .collect();
        HostWeights {
            embed: scaled(s.vocab * d, seed, 1.0, 0.0),
            layers,
            norm: scaled(d, seed + 7, 0.3, 1.0),
        }
    }
}

/// A Qwen3 dense decoder (target) on one backend.
pub struct Decoder<B: Backend> {
    pub shape: DecoderShape,
    pub embed: B::Matrix,
    pub layers: Vec<Layer<B>>,
    pub norm: B::Tensor,
}

/// Output of a target forward: the requested hidden states (HF `hidden_states` indices, in the
/// order asked) and the final normed hidden state of every row.
pub struct ForwardOut<B: Backend> {
    pub taps: Vec<B::Tensor>,
    pub last: B::Tensor,
}

/// Positions restarting at 0 at every sequence start.
pub fn positions_for(seq_starts: &[usize]) -> Vec<u32> {
    let mut p = Vec::with_capacity(seq_starts.last().copied().unwrap_or(0));
    for w in seq_starts.windows(2) {
        p.extend((0..w[1] - w[0]).map(|i| i as u32));
    }
    p
}

fn load_layer<B: Backend>(be: &B, s: &DecoderShape, w: &[Vec<f32>]) -> Result<Layer<B>> {
    ensure!(
        w.len() == LAYER_TENSORS.len(),
        "layer has {} tensors, expected {}",
        w.len(),
        LAYER_TENSORS.len()
    );
    let (d, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    Ok(Layer {
        in_norm: be.from_host(&w[0], 1, d)?,
        q: be.matrix(&w[1], q, d)?,
        k: be.matrix(&w[2], kv, d)?,
        v: be.matrix(&w[3], kv, d)?,
        o: be.matrix(&w[4], d, q)?,
        q_norm: be.from_host(&w[5], 1, s.head_dim)?,
        k_norm: be.from_host(&w[6], 1, s.head_dim)?,
        post_norm: be.from_host(&w[7], 1, d)?,
        gate: be.matrix(&w[8], s.inter, d)?,
        up: be.matrix(&w[9], s.inter, d)?,
        down: be.matrix(&w[10], d, s.inter)?,
    })
}

impl<B: Backend> Layer<B> {
    /// Attention half of a layer: normed input → q (normed, roped), k (normed, roped), v.
    fn qkv(
        &self,
        be: &B,
        s: &DecoderShape,
        x: &B::Tensor,
        positions: &[u32],
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let mut q = be.rms_norm(&be.matmul(x, &self.q)?, &self.q_norm, s.eps, s.head_dim)?;
        let mut k = be.rms_norm(&be.matmul(x, &self.k)?, &self.k_norm, s.eps, s.head_dim)?;
        let v = be.matmul(x, &self.v)?;
        be.rope_inplace(&mut q, positions, &s.rope())?;
        be.rope_inplace(&mut k, positions, &s.rope())?;
        Ok((q, k, v))
    }

    /// `h += down(silu(gate(x)) ⊙ up(x))` with `x = post_norm(h)`.
    fn mlp(&self, be: &B, s: &DecoderShape, h: &mut B::Tensor) -> Result<()> {
        let x = be.rms_norm(h, &self.post_norm, s.eps, s.hidden)?;
        let m = be.swiglu(&be.matmul(&x, &self.gate)?, &be.matmul(&x, &self.up)?)?;
        let d = be.matmul(&m, &self.down)?;
        be.add_inplace(h, &d)
    }
}

impl<B: Backend> Decoder<B> {
    /// Uploads host weights (see [`HostWeights::random`]).
    pub fn from_host(be: &B, shape: &DecoderShape, w: &HostWeights) -> Result<Self> {
        ensure!(
            w.layers.len() == shape.layers,
            "weights have {} layers, shape {}",
            w.layers.len(),
            shape.layers
        );
        Ok(Decoder {
            shape: shape.clone(),
            embed: be.matrix(&w.embed, shape.vocab, shape.hidden)?,
            layers: w
                .layers
                .iter()
                .map(|l| load_layer(be, shape, l))
                .collect::<Result<_>>()?,
            norm: be.from_host(&w.norm, 1, shape.hidden)?,
        })
    }

    /// Prefill of packed sequences (`seq_starts` from 0 to `ids.len()`), returning hidden states
    /// `taps` in the HF convention (models.md §1.5: 0 = embeddings, i = output of layer i−1,
    /// L = final-normed output) and the final normed states.
    pub fn forward(
        &self,
        be: &B,
        ids: &[u32],
        seq_starts: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut<B>> {
        let s = &self.shape;
        ensure!(
            taps.iter().all(|&t| t <= s.layers),
            "tap index above {}",
            s.layers
        );
        let positions = positions_for(seq_starts);
        ensure!(
            positions.len() == ids.len(),
            "sequence starts cover {} rows, {} ids given",
            positions.len(),
            ids.len()
        );
        let mut out: Vec<Option<B::Tensor>> = taps.iter().map(|_| None).collect();
        let mut h = be.embed(&self.embed, ids)?;
        let n = ids.len();
        let take = |idx: usize, h: &B::Tensor, out: &mut Vec<Option<B::Tensor>>| -> Result<()> {
            for (slot, &t) in taps.iter().enumerate() {
                if t == idx {
                    out[slot] = Some(be.slice_rows(h, 0, n)?);
                }
            }
            Ok(())
        };
        take(0, &h, &mut out)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let x = be.rms_norm(&h, &layer.in_norm, s.eps, s.hidden)?;
            let (q, k, v) = layer.qkv(be, s, &x, &positions)?;
            let a = be.attention_varlen(&q, &k, &v, s.attn(), seq_starts)?;
            let o = be.matmul(&a, &layer.o)?;
            be.add_inplace(&mut h, &o)?;
            layer.mlp(be, s, &mut h)?;
            if l + 1 < s.layers {
                take(l + 1, &h, &mut out)?;
            }
        }
        let last = be.rms_norm(&h, &self.norm, s.eps, s.hidden)?;
        take(s.layers, &last, &mut out)?;
        Ok(ForwardOut {
            taps: out
                .into_iter()
                .map(|t| t.expect("every tap index is <= layers"))
                .collect(),
            last,
        })
    }
}

impl Decoder<CudaBackend> {
    /// Random weights generated on the GPU (uniform, std 0.02 for linears and embeddings, norm
    /// weights 1 ± 0.1): benchmark speed does not depend on the values, but never time on zeros.
    pub fn random_on_device(be: &CudaBackend, shape: &DecoderShape, seed: u64) -> Result<Self> {
        let s = shape;
        let (d, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let m = |o: usize, i: usize, k: u64| -> Result<CudaMatrix> {
            be.random_matrix(o, i, 0.02, seed.wrapping_mul(131).wrapping_add(k))
        };
        let nrm = |n: usize, k: u64| -> Result<CudaTensor> {
            be.random_tensor(
                1,
                n,
                0.1 / 3f32.sqrt(),
                1.0,
                seed.wrapping_mul(131).wrapping_add(k),
            )
        };
        let mut layers = Vec::with_capacity(s.layers);
        for l in 0..s.layers as u64 {
            let b = 100 * (l + 1);
            layers.push(Layer {
                in_norm: nrm(d, b)?,
                q: m(q, d, b + 1)?,
                k: m(kv, d, b + 2)?,
                v: m(kv, d, b + 3)?,
                o: m(d, q, b + 4)?,
                q_norm: nrm(s.head_dim, b + 5)?,
                k_norm: nrm(s.head_dim, b + 6)?,
                post_norm: nrm(d, b + 7)?,
                gate: m(s.inter, d, b + 8)?,
                up: m(s.inter, d, b + 9)?,
                down: m(d, s.inter, b + 10)?,
            });
        }
        Ok(Decoder {
            shape: s.clone(),
            embed: be.random_matrix(s.vocab, d, 1.0, seed)?,
            layers,
            norm: nrm(d, 7)?,
        })
    }
}

/// Fused projections of one layer for the CUDA fast path: `[q; k; v]` stacked, and `[gate; up]`
/// stacked when that GEMM is fused too (else the layer's own gate and up weights are used).
pub struct FusedLayer {
    pub qkv: CudaMatrix,
    pub gate_up: Option<CudaMatrix>,
}

impl Decoder<CudaBackend> {
    /// Stacks every layer's q/k/v and gate/up weights (one GEMM each instead of three and two).
    pub fn fuse(&self, be: &CudaBackend) -> Result<Vec<FusedLayer>> {
        self.fuse_with(be, true)
    }

    /// Stacks every layer's q/k/v weights, and gate/up too when `gate_up` (a fused gate|up GEMM is
    /// not always faster than two: see docs/benchmarks-cuda.md).
    pub fn fuse_with(&self, be: &CudaBackend, gate_up: bool) -> Result<Vec<FusedLayer>> {
        self.layers
            .iter()
            .map(|l| {
                Ok(FusedLayer {
                    qkv: be.concat_matrices(&[&l.q, &l.k, &l.v])?,
                    gate_up: if gate_up {
                        Some(be.concat_matrices(&[&l.gate, &l.up])?)
                    } else {
                        None
                    },
                })
            })
            .collect()
    }

    /// [`Decoder::forward`] with a fused QKV GEMM (and a fused gate|up GEMM when `fused` has it),
    /// both residual adds done by the o_proj / down_proj GEMMs (beta = 1: `h + fp32 product`
    /// rounded once to bf16, where HF rounds the product first and the sum again — within one bf16
    /// ulp of the unfused path), and, for head dims 64/128, q/k norm + RoPE in one in-place pass
    /// over the QKV output with attention reading q/k/v from it directly (bit-identical to the
    /// split path). Row RMSNorms and SwiGLU use the `kernels/fused.cu` kernels (bit-identical to
    /// the seam's).
    pub fn forward_fused(
        &self,
        be: &CudaBackend,
        fused: &[FusedLayer],
        ids: &[u32],
        seq_starts: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut<CudaBackend>> {
        let s = &self.shape;
        ensure!(
            fused.len() == self.layers.len(),
            "{} fused layers for {} layers",
            fused.len(),
            self.layers.len()
        );
        ensure!(
            taps.iter().all(|&t| t <= s.layers),
            "tap index above {}",
            s.layers
        );
        let positions = positions_for(seq_starts);
        ensure!(
            positions.len() == ids.len(),
            "sequence starts cover {} rows, {} ids given",
            positions.len(),
            ids.len()
        );
        let (qw, kvw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let mut out: Vec<Option<CudaTensor>> = taps.iter().map(|_| None).collect();
        let take = |idx: usize, h: &CudaTensor, out: &mut Vec<Option<CudaTensor>>| -> Result<()> {
            for (slot, &t) in taps.iter().enumerate() {
                if t == idx {
                    out[slot] = Some(be.clone_tensor(h)?);
                }
            }
            Ok(())
        };
        let mut h = be.embed(&self.embed, ids)?;
        take(0, &h, &mut out)?;
        let packed = matches!(s.head_dim, 64 | 128);
        for (l, (layer, f)) in self.layers.iter().zip(fused).enumerate() {
            let x = be.rms_norm_rows(&h, &layer.in_norm, s.eps)?;
            let mut qkv = be.matmul(&x, &f.qkv)?;
            let a = if packed {
                be.qk_norm_rope_packed(
                    &mut qkv,
                    s.attn(),
                    &layer.q_norm,
                    &layer.k_norm,
                    s.eps,
                    &positions,
                    &s.rope(),
                )?;
                be.attention_varlen_packed(&qkv, s.attn(), seq_starts)?
            } else {
                let mut parts = be.split_cols(&qkv, &[qw, kvw, kvw])?.into_iter();
                let (q, k, v) = (
                    parts.next().expect("3 parts"),
                    parts.next().expect("3 parts"),
                    parts.next().expect("3 parts"),
                );
                let mut q = be.rms_norm(&q, &layer.q_norm, s.eps, s.head_dim)?;
                let mut k = be.rms_norm(&k, &layer.k_norm, s.eps, s.head_dim)?;
                be.rope_inplace(&mut q, &positions, &s.rope())?;
                be.rope_inplace(&mut k, &positions, &s.rope())?;
                be.attention_varlen(&q, &k, &v, s.attn(), seq_starts)?
            };
            drop(qkv);
            be.matmul_acc(&a, &layer.o, &mut h)?;
            let x = be.rms_norm_rows(&h, &layer.post_norm, s.eps)?;
            let m = match &f.gate_up {
                Some(gu) => be.swiglu_packed(&be.matmul(&x, gu)?)?,
                None => be.swiglu(&be.matmul(&x, &layer.gate)?, &be.matmul(&x, &layer.up)?)?,
            };
            be.matmul_acc(&m, &layer.down, &mut h)?;
            if l + 1 < s.layers {
                take(l + 1, &h, &mut out)?;
            }
        }
        let last = be.rms_norm_rows(&h, &self.norm, s.eps)?;
        take(s.layers, &last, &mut out)?;
        Ok(ForwardOut {
            taps: out
                .into_iter()
                .map(|t| t.expect("every tap index is <= layers"))
                .collect(),
            last,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// DFlash drafter

/// A DFlash drafter (dflash.md §1.1) on one backend. `embed` and `lm_head` are the target's.
pub struct Drafter<B: Backend> {
    pub shape: DecoderShape,
    pub block: usize,
    pub n_taps: usize,
    pub fc: B::Matrix,
    pub hidden_norm: B::Tensor,
    pub layers: Vec<Layer<B>>,
    pub norm: B::Tensor,
}

/// Per-layer context keys/values of one sequence (k normed and roped at positions 0..T).
pub struct ContextKv<B: Backend> {
    pub len: usize,
    pub kv: Vec<(B::Tensor, B::Tensor)>,
}

impl<B: Backend> Drafter<B> {
    /// Context K/V for every draft layer from the concatenated taps `[T, n_taps·D]`.
    pub fn context(&self, be: &B, taps: &B::Tensor) -> Result<ContextKv<B>> {
        let s = &self.shape;
        let (t, _) = be.dims(taps);
        let c = be.rms_norm(
            &be.matmul(taps, &self.fc)?,
            &self.hidden_norm,
            s.eps,
            s.hidden,
        )?;
        let positions: Vec<u32> = (0..t as u32).collect();
        let mut kv = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let mut k = be.rms_norm(&be.matmul(&c, &layer.k)?, &layer.k_norm, s.eps, s.head_dim)?;
            be.rope_inplace(&mut k, &positions, &s.rope())?;
            kv.push((k, be.matmul(&c, &layer.v)?));
        }
        Ok(ContextKv { len: t, kv })
    }

    /// Drafts one block per anchor, all anchors in one batched pass (the `Blocks` mask with
    /// exclusive context: exactly one-anchor-at-a-time semantics). Returns the top-`k` of rows
    /// 1..B−1 of every block (`anchors.len() · (B−1)` rows).
    #[allow(clippy::too_many_arguments)]
    pub fn draft(
        &self,
        be: &B,
        ctx: &ContextKv<B>,
        embed: &B::Matrix,
        lm_head: &B::Matrix,
        anchors: &[usize],
        anchor_tokens: &[u32],
        mask_id: u32,
        k: usize,
    ) -> Result<TopK> {
        let s = &self.shape;
        let bsz = self.block;
        ensure!(
            anchors.len() == anchor_tokens.len(),
            "{} anchors, {} anchor tokens",
            anchors.len(),
            anchor_tokens.len()
        );
        let mut ids = Vec::with_capacity(anchors.len() * bsz);
        let mut positions = Vec::with_capacity(anchors.len() * bsz);
        for (&a, &tok) in anchors.iter().zip(anchor_tokens) {
            ids.push(tok);
            ids.extend(std::iter::repeat_n(mask_id, bsz - 1));
            positions.extend((a..a + bsz).map(|p| p as u32));
        }
        let mask = AttnMask::Blocks {
            ctx_len: ctx.len,
            block: bsz,
            anchors: anchors.to_vec(),
            ctx_inclusive: false,
            causal_in_block: false,
            window: None,
        };
        let mut h = be.embed(embed, &ids)?;
        for (layer, (kc, vc)) in self.layers.iter().zip(&ctx.kv) {
            let x = be.rms_norm(&h, &layer.in_norm, s.eps, s.hidden)?;
            let (q, kb, vb) = layer.qkv(be, s, &x, &positions)?;
            let kk = be.concat_rows(&[kc, &kb])?;
            let vv = be.concat_rows(&[vc, &vb])?;
            let a = be.attention(&q, &kk, &vv, s.attn(), &mask)?;
            let o = be.matmul(&a, &layer.o)?;
            be.add_inplace(&mut h, &o)?;
            layer.mlp(be, s, &mut h)?;
        }
        let rows: Vec<u32> = (0..anchors.len())
            .flat_map(|n| (1..bsz).map(move |j| (n * bsz + j) as u32))
            .collect();
        let hb = be.gather_rows(&h, &rows)?;
        let hn = be.rms_norm(&hb, &self.norm, s.eps, s.hidden)?;
        be.lm_head_topk(&hn, lm_head, k)
    }

    /// FLOPs of drafting one anchor with `ctx` visible context rows (block rows through every
    /// layer, attention over context + block, LM head over B−1 rows).
    pub fn flops_per_anchor(&self, ctx: usize) -> f64 {
        let s = &self.shape;
        let b = self.block as f64;
        let lin = 2.0 * b * (s.layer_linear_params() * s.layers) as f64;
        let attn = 4.0 * b * (s.heads * s.head_dim) as f64 * (ctx as f64 + b) * s.layers as f64;
        let head = 2.0 * (b - 1.0) * (s.vocab * s.hidden) as f64;
        lin + attn + head
    }

    /// FLOPs per context token (fc over the taps, then every layer's k/v projections).
    pub fn flops_per_context_token(&self) -> f64 {
        let s = &self.shape;
        2.0 * (self.n_taps * s.hidden * s.hidden) as f64
            + 2.0 * (2 * s.hidden * s.kv_heads * s.head_dim * s.layers) as f64
    }
}

impl Drafter<CudaBackend> {
    pub fn random_on_device(
        be: &CudaBackend,
        shape: &DecoderShape,
        block: usize,
        n_taps: usize,
        seed: u64,
    ) -> Result<Self> {
        let d = Decoder::random_on_device(
            be,
            &DecoderShape {
                vocab: 1,
                ..shape.clone()
            },
            seed,
        )?;
        Ok(Drafter {
            shape: shape.clone(),
            block,
            n_taps,
            fc: be.random_matrix(shape.hidden, n_taps * shape.hidden, 0.01, seed ^ 0xfc)?,
            hidden_norm: be.random_tensor(1, shape.hidden, 0.05, 1.0, seed ^ 0x4e)?,
            layers: d.layers,
            norm: d.norm,
        })
    }
}

impl<B: Backend> Drafter<B> {
    /// A drafter from host weights: `layers` as in [`HostWeights`], plus fc and the two norms.
    pub fn from_host(
        be: &B,
        shape: &DecoderShape,
        block: usize,
        n_taps: usize,
        w: &HostWeights,
        fc: &[f32],
        hidden_norm: &[f32],
    ) -> Result<Self> {
        Ok(Drafter {
            shape: shape.clone(),
            block,
            n_taps,
            fc: be.matrix(fc, shape.hidden, n_taps * shape.hidden)?,
            hidden_norm: be.from_host(hidden_norm, 1, shape.hidden)?,
            layers: w
                .layers
                .iter()
                .map(|l| load_layer(be, shape, l))
                .collect::<Result<_>>()?,
            norm: be.from_host(&w.norm, 1, shape.hidden)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Timing helpers

/// Median of `reps` timed runs of `f` (after `warmup` untimed runs), in seconds, with the device
/// synchronised around every run.
pub fn time_median(
    be: &CudaBackend,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    be.synchronize()?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        be.synchronize()?;
        ts.push(t0.elapsed().as_secs_f64());
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(ts[ts.len() / 2])
}

/// Measured bf16 GEMM rate (TFLOP/s) of cuBLAS for `[m, k] × [n, k]ᵀ` on random data.
pub fn gemm_tflops(be: &CudaBackend, m: usize, n: usize, k: usize) -> Result<f64> {
    let x = be.random_tensor(m, k, 1.0, 0.0, 11)?;
    let w = be.random_matrix(n, k, 1.0, 12)?;
    let t = time_median(be, 3, 10, || be.matmul(&x, &w).map(|_| ()))?;
    Ok(2.0 * (m * n * k) as f64 / t / 1e12)
}

/// Device-to-device copy bandwidth (bytes read + written per second).
pub fn copy_bandwidth(be: &CudaBackend, bytes: usize) -> Result<f64> {
    let t = be.random_tensor(bytes / 2 / 4096, 4096, 1.0, 0.0, 13)?;
    let secs = time_median(be, 2, 10, || be.clone_tensor(&t).map(|_| ()))?;
    Ok(2.0 * (t.rows() * t.cols() * 2) as f64 / secs)
}
