//! One pre-norm decoder layer and its token mixer: softmax attention (every model; gated on the
//! hybrids) or a Gated DeltaNet (hybrid models' `linear_attention` layers), with the cached,
//! batched-decode and packed forwards.

use super::config::ModelSpec;
use super::gdn::{GdnMixer, GdnState};
use super::gpt_oss::GptOssAttention;
use super::hybrid::LayerType;
use super::kv_cache::LayerCache;
use super::moe::FeedForward;
use super::transformer::{Attention, CachedRows, RmsNorm};
use crate::backend::{Backend, SeqStarts};
use crate::formats::WeightSource;
use anyhow::Result;

/// The token mixer of one decoder layer.
pub enum Mixer<B: Backend> {
    /// Softmax attention (`self_attn.*`), gated on the hybrids.
    Attention(Attention<B>),
    /// Gated DeltaNet (`linear_attn.*`), hybrids only.
    Gdn(GdnMixer<B>),
}

/// A Gated DeltaNet layer's state in `cache`, created (zeros) on the sequence's first token.
fn gdn_state<'c, B: Backend>(
    be: &B,
    gdn: &GdnMixer<B>,
    cache: &'c mut LayerCache<B>,
) -> Result<&'c mut GdnState<B>> {
    if cache.gdn.is_none() {
        cache.gdn = Some(gdn.zero_state(be)?);
    }
    Ok(cache.gdn.as_mut().expect("just set"))
}

/// One pre-norm decoder layer.
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub mixer: Mixer<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    /// Dense SwiGLU or a sparse mixture of experts (`model::moe`).
    pub mlp: FeedForward<B>,
}

impl<B: Backend> DecoderLayer<B> {
    pub fn load(be: &B, src: &dyn WeightSource, i: usize, spec: &ModelSpec) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let d = spec.hidden_size;
        let kind = spec
            .hybrid
            .as_ref()
            .map_or(LayerType::FullAttention, |h| h.layer_types[i]);
        let mixer = match (kind, &spec.hybrid) {
            (LayerType::LinearAttention, Some(hy)) => Mixer::Gdn(GdnMixer::load(
                be,
                src,
                &format!("{p}.linear_attn"),
                d,
                hy,
                spec.rms_norm_eps,
            )?),
            _ => {
                let mut a = Attention::load(be, src, &format!("{p}.self_attn"), spec)?;
                a.gpt_oss = GptOssAttention::load(be, src, i, spec)?;
                Mixer::Attention(a)
            }
        };
        Ok(DecoderLayer {
            input_layernorm: RmsNorm::load_for(
                be,
                src,
                &format!("{p}.input_layernorm.weight"),
                d,
                spec,
            )?,
            mixer,
            post_attention_layernorm: RmsNorm::load_for(
                be,
                src,
                &format!("{p}.post_attention_layernorm.weight"),
                d,
                spec,
            )?,
            mlp: FeedForward::load(be, src, i, spec)?,
        })
    }

    /// The layer over new tokens at `start..` of one cached sequence; `rows` says how (see
    /// [`CachedRows`]): as decode steps, a Gated DeltaNet layer steps its state one row at a
    /// time ([`GdnMixer::forward_steps`]), as [`DecoderLayer::forward_decode`] does.
    pub fn forward(
        &self,
        be: &B,
        h: &mut B::Tensor,
        start: usize,
        cache: &mut LayerCache<B>,
        rows: CachedRows,
    ) -> Result<()> {
        self.forward_with(be, h, |x, h| match &self.mixer {
            Mixer::Attention(a) => a.forward(be, x, start, cache, h, rows),
            Mixer::Gdn(g) => {
                let state = gdn_state(be, g, cache)?;
                match rows {
                    CachedRows::Causal => {
                        let n = be.dims(x).0;
                        g.forward(be, x, &SeqStarts::one(n), &mut [state], h)
                    }
                    CachedRows::AsDecodeSteps => g.forward_steps(be, x, state, h),
                }
            }
        })
    }

    /// One decode step of several sequences (see [`Attention::forward_decode`]); a Gated
    /// DeltaNet layer runs each row as its own one-token sequence on its own state.
    pub fn forward_decode(
        &self,
        be: &B,
        h: &mut B::Tensor,
        caches: &mut [&mut LayerCache<B>],
        starts: &[usize],
    ) -> Result<()> {
        self.forward_with(be, h, |x, h| match &self.mixer {
            Mixer::Attention(a) => a.forward_decode(be, x, caches, starts, h),
            Mixer::Gdn(g) => {
                let seq_starts = SeqStarts::each_row(caches.len());
                let mut states = caches
                    .iter_mut()
                    .map(|c| gdn_state(be, g, c))
                    .collect::<Result<Vec<_>>>()?;
                g.forward(be, x, &seq_starts, &mut states, h)
            }
        })
    }

    /// The layer over packed whole sequences (see [`Attention::forward_packed`]); a Gated
    /// DeltaNet layer starts every sequence from a zero state.
    pub fn forward_packed(
        &self,
        be: &B,
        h: &mut B::Tensor,
        positions: &[u32],
        seq_starts: &SeqStarts,
    ) -> Result<()> {
        self.forward_with(be, h, |x, h| match &self.mixer {
            Mixer::Attention(a) => a.forward_packed(be, x, positions, seq_starts, h),
            Mixer::Gdn(g) => {
                let mut fresh = (0..seq_starts.count())
                    .map(|_| g.zero_state(be))
                    .collect::<Result<Vec<_>>>()?;
                let mut states: Vec<&mut GdnState<B>> = fresh.iter_mut().collect();
                g.forward(be, x, seq_starts, &mut states, h)
            }
        })
    }

    /// Norm → `mix` (which adds its output to `h`) → norm → MLP added to `h`; only the mixer
    /// differs between the cached and the packed forward. Both residual adds go through
    /// [`Backend::matmul_acc`] of o_proj (out_proj) / down_proj.
    fn forward_with(
        &self,
        be: &B,
        h: &mut B::Tensor,
        mix: impl FnOnce(&B::Tensor, &mut B::Tensor) -> Result<()>,
    ) -> Result<()> {
        let x = self.input_layernorm.forward(be, h)?;
        mix(&x, h)?;
        let x = self.post_attention_layernorm.forward(be, h)?;
        self.mlp.forward_acc(be, &x, h)
    }
}
