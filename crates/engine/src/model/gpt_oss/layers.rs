//! gpt-oss's attention (sinks, sliding windows, YaRN, o_proj bias) and its mixture of experts
//! (biased router, top-k then softmax, fused or MXFP4 experts with biases and the clamped
//! SwiGLU), over the [`Backend`] seam. The forward semantics are transformers 5.17
//! `modeling_gpt_oss.py`: `GptOssAttention` with `eager_attention_forward`, `GptOssMLP` with
//! `GptOssTopKRouter` and `GptOssExperts`.

use super::{rope_freqs, GptOssSpec, SWIGLU_ALPHA, SWIGLU_LIMIT};
use crate::backend::moe::{ExpertActivation, MoeExperts, MoeRouting, RoutingRule};
use crate::backend::raw::RawPart;
use crate::backend::{AttnExtras, Backend, KvSlot, RopeFreqs, SeqStarts};
use crate::formats::mxfp4::{self, Mxfp4Tensor};
use crate::formats::{HostTensor, WeightSource};
use crate::model::config::ModelSpec;
use crate::model::kv_cache::LayerCache;
use crate::model::moe::{route_topk_softmax, RoutingPlan};
use crate::model::transformer::{load_matrix, load_vector, Attention, CachedRows};
use anyhow::{bail, Context, Result};

/// What a gpt-oss attention layer adds to [`Attention`] (whose q/k/v projections, their biases
/// and o_proj it uses): the o_proj bias, the sinks, the window and the rotary frequencies.
pub struct GptOssAttention<B: Backend> {
    /// `o_proj.bias` `[1, D]` (with `attention_bias`, true on the released models).
    pub o_bias: Option<B::Tensor>,
    /// `sinks` `[heads]`, one logit per query head (f32 on the host: the backend's softmax
    /// reads it per head).
    pub sinks: Vec<f32>,
    /// `Some(sliding_window)` on a `sliding_attention` layer.
    pub window: Option<usize>,
    /// YaRN (or plain) rotary frequencies.
    pub rope: RopeFreqs,
}

impl<B: Backend> GptOssAttention<B> {
    /// Layer `layer`'s extras, `None` unless the model is gpt-oss.
    pub fn load(
        be: &B,
        src: &dyn WeightSource,
        layer: usize,
        spec: &ModelSpec,
    ) -> Result<Option<Self>> {
        let Some(g) = &spec.gpt_oss else {
            return Ok(None);
        };
        let p = format!("model.layers.{layer}.self_attn");
        let sinks = src.tensor(&format!("{p}.sinks"))?;
        if sinks.shape != [spec.num_heads] {
            bail!(
                "{}: tensor {p}.sinks has shape {:?}, the config implies [{}]",
                src.path().display(),
                sinks.shape,
                spec.num_heads
            );
        }
        Ok(Some(GptOssAttention {
            o_bias: spec
                .attention_bias
                .then(|| load_vector(be, src, &format!("{p}.o_proj.bias"), spec.hidden_size))
                .transpose()?,
            sinks: sinks.data,
            window: g.window(layer),
            rope: rope_freqs(spec, g),
        }))
    }

    fn extras(&self) -> AttnExtras<'_> {
        AttnExtras {
            window: self.window,
            sinks: Some(&self.sinks),
        }
    }

    /// q, k (rotated at `positions`) and v of `x`, biases added.
    fn qkv(
        &self,
        a: &Attention<B>,
        be: &B,
        x: &B::Tensor,
        positions: &[u32],
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let qkv = a.project_qkv(be, x)?;
        crate::backend::compose::split_rope_freqs(be, &qkv, a.shape, positions, &self.rope)
    }

    /// `h += o_proj(o) + o_proj.bias` (transformers: `residual + self.o_proj(attn_output)`).
    fn output(&self, a: &Attention<B>, be: &B, o: &B::Tensor, h: &mut B::Tensor) -> Result<()> {
        let mut y = be.matmul(o, &a.o_proj)?;
        if let Some(b) = &self.o_bias {
            be.add_row_bias(&mut y, b)?;
        }
        be.add_inplace(h, &y)
    }

    /// [`Attention::forward`]: the new tokens at `start..` over one sequence's cache.
    #[allow(clippy::too_many_arguments)] // Attention::forward's arguments and the layer
    pub fn forward(
        &self,
        a: &Attention<B>,
        be: &B,
        x: &B::Tensor,
        start: usize,
        cache: &mut LayerCache<B>,
        h: &mut B::Tensor,
        rows: CachedRows,
    ) -> Result<()> {
        let t = be.dims(x).0;
        let positions: Vec<u32> = (start..start + t).map(|p| p as u32).collect();
        let (q, k, v) = self.qkv(a, be, x, &positions)?;
        let slot = KvSlot {
            k: &mut cache.k,
            v: &mut cache.v,
        };
        let o = match rows {
            CachedRows::Causal => crate::backend::gpt_oss::append_and_attend_ext(
                be,
                slot,
                &q,
                k,
                v,
                a.shape,
                start,
                self.extras(),
            )?,
            CachedRows::AsDecodeSteps => {
                be.attention_verify(&q, &k, &v, a.shape, slot, self.extras())?
            }
        };
        self.output(a, be, &o, h)
    }

    /// [`Attention::forward_decode`]: row r is the next token of the sequence cached in
    /// `caches[r]`, at position `starts[r]`.
    pub fn forward_decode(
        &self,
        a: &Attention<B>,
        be: &B,
        x: &B::Tensor,
        caches: &mut [&mut LayerCache<B>],
        starts: &[usize],
        h: &mut B::Tensor,
    ) -> Result<()> {
        let positions: Vec<u32> = starts.iter().map(|&s| s as u32).collect();
        let qkv = a.project_qkv(be, x)?;
        let mut slots: Vec<KvSlot<'_, B::Tensor>> = caches
            .iter_mut()
            .map(|c| KvSlot {
                k: &mut c.k,
                v: &mut c.v,
            })
            .collect();
        let o = be.attention_decode_qkv_ext(
            qkv,
            a.shape,
            &positions,
            &self.rope,
            &mut slots,
            self.extras(),
        )?;
        self.output(a, be, &o, h)
    }

    /// [`Attention::forward_packed`]: whole sequences packed row-wise, each from position 0.
    pub fn forward_packed(
        &self,
        a: &Attention<B>,
        be: &B,
        x: &B::Tensor,
        positions: &[u32],
        seq_starts: &SeqStarts,
        h: &mut B::Tensor,
    ) -> Result<()> {
        let (q, k, v) = self.qkv(a, be, x, positions)?;
        let o = be.attention_varlen_ext(&q, &k, &v, a.shape, seq_starts, self.extras())?;
        self.output(a, be, &o, h)
    }
}

/// One expert: `down(act(gate_up(x) + b_gu)) + b_down`.
pub struct GptOssExpert<B: Backend> {
    /// `[2·I, D]`: the gate rows, then the up rows (de-interleaved from the checkpoint's
    /// alternating columns), so that the GEMM output is gate | up.
    pub gate_up: B::Matrix,
    /// `[1, 2·I]`, de-interleaved likewise.
    pub gate_up_bias: B::Tensor,
    /// `[D, I]`.
    pub down: B::Matrix,
    /// `[1, D]`.
    pub down_bias: B::Tensor,
}

impl<B: Backend> GptOssExpert<B> {
    fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let mut gu = be.matmul(x, &self.gate_up)?;
        be.add_row_bias(&mut gu, &self.gate_up_bias)?;
        let act = be.clamped_swiglu_packed(&gu, SWIGLU_ALPHA, SWIGLU_LIMIT)?;
        let mut y = be.matmul(&act, &self.down)?;
        be.add_row_bias(&mut y, &self.down_bias)?;
        Ok(y)
    }
}

/// A gpt-oss MLP block (`GptOssMLP`).
pub struct GptOssMoe<B: Backend> {
    /// `router.weight` `[E, D]`.
    pub router: B::Matrix,
    /// `router.bias` `[1, E]`.
    pub router_bias: B::Tensor,
    pub experts: Vec<GptOssExpert<B>>,
    pub top_k: usize,
}

/// One expert projection of a layer as stored: fused unquantised `[E, in, out]` (as
/// `GptOssExperts` holds it: `x @ W`), MXFP4 blocks of `[E, out, in]`, or one tensor per expert
/// (a GGUF's stacks, [`super::GptOssSpec::per_expert`]).
enum StoredExperts<'a> {
    Fused {
        t: HostTensor,
        inp: usize,
        out: usize,
    },
    /// [`StoredExperts::Fused`] as its stored bytes (`[E · in, out]`, the file's memory map):
    /// each expert handed to the backend as stored ([`Backend::matrix_raw_transposed`]: the CUDA
    /// backend transposes it on the GPU), never converted to f32 on the host.
    FusedRaw(RawPart<'a>),
    Mxfp4(Mxfp4Tensor<'a>),
    /// `{base}.{e}.{proj}.weight` `[out / projs.len(), inp]` for each of `projs`, stacked by rows:
    /// gate then up for gate_up (already de-interleaved, as llama.cpp's converter writes them).
    PerExpert {
        src: &'a dyn WeightSource,
        base: String,
        projs: &'static [&'static str],
        inp: usize,
        out: usize,
    },
}

impl StoredExperts<'_> {
    /// Expert `e`'s weight as `[out, in]`, row-major; gate_up's rows alternate gate and up
    /// unless [`StoredExperts::PerExpert`].
    fn expert(&self, e: usize) -> Result<Vec<f32>> {
        match self {
            StoredExperts::Fused { t, inp, out } => {
                let w = &t.data[e * inp * out..(e + 1) * inp * out];
                let mut m = vec![0f32; inp * out];
                for (i, row) in w.chunks_exact(*out).enumerate() {
                    for (o, &v) in row.iter().enumerate() {
                        m[o * inp + i] = v;
                    }
                }
                Ok(m)
            }
            StoredExperts::FusedRaw(_) => {
                bail!("a raw fused expert stack is uploaded as bytes, not read as values")
            }
            StoredExperts::Mxfp4(t) => t.dequantize(e),
            StoredExperts::PerExpert {
                src,
                base,
                projs,
                inp,
                out,
            } => {
                let mut m = Vec::with_capacity(inp * out);
                for proj in *projs {
                    let name = format!("{base}.{e}.{proj}.weight");
                    let t = src.tensor(&name)?;
                    let want = [out / projs.len(), *inp];
                    if t.shape != want {
                        bail!(
                            "{}: tensor {name} has shape {:?}, the config implies {want:?}",
                            src.path().display(),
                            t.shape
                        );
                    }
                    m.extend(t.data);
                }
                Ok(m)
            }
        }
    }

    /// Expert `e`'s weight `[out, inp]` on the backend, rows de-interleaved (gate then up) when
    /// `gate_up` and [`StoredExperts::interleaved`]. MXFP4 blocks (a folder's, or a GGUF's
    /// repacked: [`StoredExperts::per_expert_mxfp4`]) go to the backend as bytes
    /// ([`Backend::matrix_mxfp4`]: the CUDA backend keeps them packed, the CPU dequantises them),
    /// the other layouts as f32 values.
    fn upload<B: Backend>(
        &self,
        be: &B,
        e: usize,
        (out, inp): (usize, usize),
        gate_up: bool,
    ) -> Result<B::Matrix> {
        let rows_interleaved = gate_up && self.interleaved();
        if let StoredExperts::Mxfp4(t) = self {
            let (blocks, scales) = t.expert_bytes(e)?;
            return if rows_interleaved {
                let (blocks, scales) = (
                    deinterleave(&blocks, inp / 2),
                    deinterleave(&scales, inp / mxfp4::BLOCK),
                );
                be.matrix_mxfp4(&blocks, &scales, out, inp)
            } else {
                be.matrix_mxfp4(&blocks, &scales, out, inp)
            };
        }
        if let Some((blocks, scales)) = self.per_expert_mxfp4(e)? {
            return be.matrix_mxfp4(&blocks, &scales, out, inp);
        }
        if let StoredExperts::FusedRaw(part) = self {
            // Expert e's `[inp, out]` rows of the `[E · inp, out]` stack.
            return be.matrix_raw_transposed(part.row_range(e * inp, inp), rows_interleaved);
        }
        let w = self.expert(e)?;
        let w = if rows_interleaved {
            deinterleave(&w, inp)
        } else {
            w
        };
        be.matrix(&w, out, inp)
    }

    /// Expert `e`'s [`StoredExperts::PerExpert`] weights as MXFP4 bytes stacked by rows (gate
    /// then up: a packed row is whole groups, so stacking bytes stacks rows), when the source
    /// hands every one of them over so ([`WeightSource::mxfp4`]: a GGUF's ggml MXFP4 stacks,
    /// repacked). `None` (another layout, or another type for any of them): upload the values.
    fn per_expert_mxfp4(&self, e: usize) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let StoredExperts::PerExpert {
            src, base, projs, ..
        } = self
        else {
            return Ok(None);
        };
        let (mut blocks, mut scales) = (Vec::new(), Vec::new());
        for proj in *projs {
            let Some((b, s)) = src.mxfp4(&format!("{base}.{e}.{proj}.weight"))? else {
                return Ok(None);
            };
            blocks.extend(b);
            scales.extend(s);
        }
        Ok(Some((blocks, scales)))
    }

    /// Whether gate_up's rows (and its bias) alternate gate and up, as in a Hugging Face folder.
    fn interleaved(&self) -> bool {
        !matches!(self, StoredExperts::PerExpert { .. })
    }

    /// The loader is done with expert `e` (its tensors uploaded).
    fn release(&self, e: usize) {
        if let StoredExperts::PerExpert {
            src, base, projs, ..
        } = self
        {
            for proj in *projs {
                src.release(&format!("{base}.{e}.{proj}.weight"));
            }
        }
    }
}

/// Rows `[2j]` then rows `[2j + 1]` of a row-major `[2·n, cols]`: transformers' `gate_up[...,
/// ::2]` (gate) and `gate_up[..., 1::2]` (up) as one stacked gate | up. Values or MXFP4 bytes
/// alike: a packed row is whole groups (blocks and scales), so moving rows of bytes moves rows of
/// values.
pub(super) fn deinterleave<T: Copy>(rows: &[T], cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len());
    for first in [0, 1] {
        for r in rows.chunks_exact(cols).skip(first).step_by(2) {
            out.extend_from_slice(r);
        }
    }
    out
}

impl<B: Backend> GptOssMoe<B> {
    /// Layer `layer`'s block (`model.layers.{layer}.mlp`), experts uploaded one at a time: MXFP4
    /// blocks (a folder's, or a GGUF's ggml MXFP4 repacked) as bytes (kept packed by the CUDA
    /// backend unless `DRAFTLENS_MXFP4=bf16`, dequantised on the host otherwise), the other
    /// layouts dequantised to f32 on the host.
    pub fn load(
        be: &B,
        src: &dyn WeightSource,
        layer: usize,
        spec: &ModelSpec,
        g: &GptOssSpec,
    ) -> Result<Self> {
        let p = format!("model.layers.{layer}.mlp");
        let moe = spec
            .moe
            .as_ref()
            .context("a gpt_oss spec without experts")?;
        let (d, inter, ne) = (spec.hidden_size, moe.moe_intermediate_size, moe.num_experts);
        let open = |proj: &str, inp: usize, out: usize| -> Result<StoredExperts> {
            let base = format!("{p}.experts.{proj}");
            if g.per_expert {
                let projs: &'static [&'static str] = match proj {
                    "gate_up_proj" => &["gate_proj", "up_proj"],
                    _ => &["down_proj"],
                };
                return Ok(StoredExperts::PerExpert {
                    src,
                    base: format!("{p}.experts"),
                    projs,
                    inp,
                    out,
                });
            }
            if g.mxfp4() {
                let t = Mxfp4Tensor::of_source(src, &base)?;
                if t.shape != [ne, out, inp] {
                    bail!(
                        "{}: MXFP4 tensor {base} unpacks to {:?}, the config implies [{ne}, {out}, {inp}]",
                        src.path().display(),
                        t.shape
                    );
                }
                return Ok(StoredExperts::Mxfp4(t));
            }
            let wrong_shape = |shape: &[usize]| {
                anyhow::anyhow!(
                    "{}: tensor {base} has shape {shape:?}, the config implies [{ne}, {inp}, {out}]",
                    src.path().display()
                )
            };
            if let Some((shape, part)) = src.raw_flat(&base)? {
                if shape != [ne, inp, out] {
                    return Err(wrong_shape(&shape));
                }
                return Ok(StoredExperts::FusedRaw(part));
            }
            let t = src.tensor(&base)?;
            if t.shape != [ne, inp, out] {
                return Err(wrong_shape(&t.shape));
            }
            Ok(StoredExperts::Fused { t, inp, out })
        };
        let gate_up = open("gate_up_proj", d, 2 * inter)?;
        let down = open("down_proj", inter, d)?;
        let bias = |name: &str, cols: usize| -> Result<HostTensor> {
            let t = src.tensor(&format!("{p}.experts.{name}"))?;
            if t.shape != [ne, cols] {
                bail!(
                    "{}: tensor {p}.experts.{name} has shape {:?}, the config implies [{ne}, {cols}]",
                    src.path().display(),
                    t.shape
                );
            }
            Ok(t)
        };
        // Each expert's gate | up bias: the checkpoint's alternating columns de-interleaved, or
        // the GGUF's gate and up biases side by side.
        let gu_biases: Vec<Vec<f32>> = if gate_up.interleaved() {
            let b = bias("gate_up_proj_bias", 2 * inter)?;
            b.data
                .chunks_exact(2 * inter)
                .map(|row| deinterleave(row, 1))
                .collect()
        } else {
            let (gb, ub) = (bias("gate_proj_bias", inter)?, bias("up_proj_bias", inter)?);
            gb.data
                .chunks_exact(inter)
                .zip(ub.data.chunks_exact(inter))
                .map(|(g, u)| [g, u].concat())
                .collect()
        };
        let down_bias = bias("down_proj_bias", d)?;
        let mut experts = Vec::with_capacity(ne);
        for (e, gub) in gu_biases.iter().enumerate() {
            let ctx = || {
                format!(
                    "{}: uploading {p}.experts (expert {e})",
                    src.path().display()
                )
            };
            experts.push(GptOssExpert {
                gate_up: gate_up
                    .upload(be, e, (2 * inter, d), true)
                    .with_context(ctx)?,
                gate_up_bias: be.from_host(gub, 1, 2 * inter).with_context(ctx)?,
                down: down.upload(be, e, (d, inter), false).with_context(ctx)?,
                down_bias: be
                    .from_host(&down_bias.data[e * d..(e + 1) * d], 1, d)
                    .with_context(ctx)?,
            });
            gate_up.release(e);
            down.release(e);
        }
        for name in ["gate_up_proj", "down_proj"] {
            src.release(&format!("{p}.experts.{name}"));
        }
        Ok(GptOssMoe {
            router: load_matrix(be, src, &format!("{p}.router.weight"), ne, d)?,
            router_bias: load_vector(be, src, &format!("{p}.router.bias"), ne)?,
            experts,
            top_k: moe.num_experts_per_tok,
        })
    }

    /// `h += moe(x)`. Where the backend routes on the device ([`Backend::moe_routed_acc`]: the
    /// CUDA backend) it does all of it from the router logits (bias added). Otherwise the logits
    /// are the only download; each row is routed on the host ([`route_topk_softmax`]), every
    /// expert that has rows runs on its gathered rows, and one [`Backend::add_weighted_rows`]
    /// adds each row's weighted expert outputs in ascending expert order (transformers'
    /// `index_add_` expert by expert) to `h`.
    pub fn forward_acc(&self, be: &B, x: &B::Tensor, h: &mut B::Tensor) -> Result<()> {
        let rows = be.dims(x).0;
        if rows == 0 {
            return Ok(());
        }
        let ne = self.experts.len();
        let mut logits = be.matmul(x, &self.router)?;
        be.add_row_bias(&mut logits, &self.router_bias)?;
        let weights: Vec<(&B::Matrix, &B::Matrix)> =
            self.experts.iter().map(|e| (&e.gate_up, &e.down)).collect();
        let biases: Vec<(&B::Tensor, &B::Tensor)> = self
            .experts
            .iter()
            .map(|e| (&e.gate_up_bias, &e.down_bias))
            .collect();
        let experts = MoeExperts {
            weights: &weights,
            biases: Some(&biases),
            activation: ExpertActivation::ClampedSwiGlu {
                alpha: SWIGLU_ALPHA,
                limit: SWIGLU_LIMIT,
            },
        };
        let routing = MoeRouting {
            num_experts: ne,
            top_k: self.top_k,
            rule: RoutingRule::TopKSoftmax,
        };
        if be.moe_routed_acc(x, &logits, &experts, None, &routing, h)? {
            return Ok(());
        }
        let logits = be.to_host(&logits)?;
        let routes: Vec<Vec<(usize, f32)>> = logits
            .chunks(ne)
            .map(|l| route_topk_softmax(l, self.top_k))
            .collect();
        let plan = RoutingPlan::from_routes(&routes, ne, self.top_k, None);
        let mut outputs = Vec::new();
        for (expert, rows_e) in self.experts.iter().zip(&plan.rows_by_expert) {
            if !rows_e.is_empty() {
                outputs.push(expert.forward(be, &be.gather_rows(x, rows_e)?)?);
            }
        }
        let stacked = if outputs.len() == 1 {
            outputs.pop().expect("one output")
        } else {
            be.concat_rows(&outputs.iter().collect::<Vec<_>>())?
        };
        be.add_weighted_rows(h, &stacked, &plan.index, &plan.weights)
    }
}
