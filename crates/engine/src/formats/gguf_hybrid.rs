//! GGUF files of the Qwen3.5 / Qwen3.6 / Qwen3-Next hybrids, as llama.cpp's converter writes them
//! (`general.architecture` `qwen35` / `qwen35moe` / `qwen3next`; experts in `gguf_moe.rs`), read back into the Hugging Face names, shapes
//! and values the model code uses (docs/hybrid-models.md, "GGUF files").
//!
//! - [`model_spec`]: the [`ModelSpec`] and [`HybridSpec`] from the `{arch}.*` metadata: the GDN
//!   sizes from the `ssm.*` keys, the layer schedule from `full_attention_interval`, the rotary
//!   dimensions from `rope.dimension_count`, MTP blocks (`nextn_predict_layers`) left out.
//! - [`HybridGgufWeights`]: the tensors under HF names, undoing what the converter changed:
//!   zero-centred norm weights stored as `1 + w`, `A_log` stored as `ssm_a = −exp(A_log)`, the
//!   squeezed conv kernel, and for `qwen35` the value heads reordered from grouped to tiled
//!   order. Qwen3-Next's fused `ssm_ba` keeps its grouped layout under the HF name
//!   `in_proj_ba`, which [`crate::model::hybrid::HybridWeights`] (stacked on top) un-groups.

use super::gguf::{hf_name, GgufFile, GgufValue};
use super::{HostTensor, TensorInfo, WeightSource};
use crate::backend::GdnShape;
use crate::model::config::{Arch, HybridSpec, LayerType, ModelSpec};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// `general.architecture` values of the hybrids, with the [`Arch`] each is read as.
pub fn hybrid_arch(name: &str) -> Option<Arch> {
    match name {
        "qwen35" => Some(Arch::Qwen3_5),
        "qwen35moe" => Some(Arch::Qwen3_5Moe),
        "qwen3next" => Some(Arch::Qwen3Next),
        _ => None,
    }
}

/// A metadata reader that names the file and the full key in every error.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn opt(&self, k: &str) -> Result<Option<usize>> {
        let full = self.key(k);
        match self.file.metadata().get(&full) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => bail!(
                    "{}: metadata {full} should be an unsigned integer, found {v:?}",
                    self.file.path().display()
                ),
            },
        }
    }
    fn req(&self, k: &str) -> Result<usize> {
        self.opt(k)?.with_context(|| {
            format!(
                "{}: metadata key {} is missing (needed for a {} model)",
                self.file.path().display(),
                self.key(k),
                self.arch
            )
        })
    }
    fn f32(&self, k: &str) -> Option<f32> {
        self.file.get_f32(&self.key(k))
    }
}

/// The model description of a `qwen35` / `qwen3next` GGUF. Errors name the file and the key.
pub fn model_spec(file: &GgufFile) -> Result<ModelSpec> {
    let p = file.path().display();
    let arch_name = file.architecture().unwrap_or_default();
    let arch = hybrid_arch(arch_name).with_context(|| {
        format!("{p}: general.architecture {arch_name:?} is not a hybrid architecture")
    })?;
    let m = Meta {
        file,
        arch: arch_name,
    };
    let hidden_size = m.req("embedding_length")?;
    let num_heads = m.req("attention.head_count")?;
    let num_kv_heads = m.opt("attention.head_count_kv")?.unwrap_or(num_heads);
    let head_dim = match m.opt("attention.key_length")? {
        Some(k) => k,
        None if num_heads > 0 && hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => bail!(
            "{p}: metadata key {} is missing",
            m.key("attention.key_length")
        ),
    };
    // MTP ("nextn") blocks are appended after the decoder layers; they are not part of the model.
    let blocks = m.req("block_count")?;
    let nextn = m.opt("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        bail!(
            "{p}: {} = {nextn} leaves no decoder layers of {} = {blocks}",
            m.key("nextn_predict_layers"),
            m.key("block_count")
        );
    }
    let num_layers = blocks - nextn;

    // GDN sizes (llama.cpp's names for them): group_count = Hk, time_step_rank = Hv,
    // state_size = dk, inner_size = Hv·dv, conv_kernel = K.
    let k_heads = m.req("ssm.group_count")?;
    let v_heads = m.req("ssm.time_step_rank")?;
    let k_dim = m.req("ssm.state_size")?;
    let inner = m.req("ssm.inner_size")?;
    let conv = m.req("ssm.conv_kernel")?;
    for (k, v) in [
        ("ssm.group_count", k_heads),
        ("ssm.time_step_rank", v_heads),
        ("ssm.state_size", k_dim),
        ("ssm.inner_size", inner),
        ("ssm.conv_kernel", conv),
    ] {
        if v == 0 {
            bail!("{p}: {} is 0", m.key(k));
        }
    }
    if inner % v_heads != 0 {
        bail!(
            "{p}: {} = {inner} is not a whole number of {} = {v_heads} value heads",
            m.key("ssm.inner_size"),
            m.key("ssm.time_step_rank")
        );
    }
    if v_heads % k_heads != 0 {
        bail!(
            "{p}: {} = {v_heads} value heads is not a multiple of {} = {k_heads} key heads",
            m.key("ssm.time_step_rank"),
            m.key("ssm.group_count")
        );
    }
    let layer_types = layer_schedule(&m, blocks, num_layers)?;
    let rotary_dim = match m.opt("rope.dimension_count")? {
        Some(r) => r,
        None => head_dim / 4, // transformers' default partial_rotary_factor 0.25
    };
    let hybrid = HybridSpec {
        layer_types,
        linear_num_key_heads: k_heads,
        linear_num_value_heads: v_heads,
        linear_key_head_dim: k_dim,
        linear_value_head_dim: inner / v_heads,
        linear_conv_kernel_dim: conv,
        rotary_dim,
    };

    let vocab_size = match m.opt("vocab_size")? {
        Some(v) => v,
        None => match file.tensor_info("token_embd.weight") {
            Some(t) if t.ne.len() == 2 => t.ne[1] as usize,
            _ => bail!(
                "{p}: cannot tell the vocabulary size (no {}, no token_embd.weight)",
                m.key("vocab_size")
            ),
        },
    };
    let rms_norm_eps = m.f32("attention.layer_norm_rms_epsilon").with_context(|| {
        format!(
            "{p}: metadata key {} is missing or not a float",
            m.key("attention.layer_norm_rms_epsilon")
        )
    })?;
    let tok_id = |k: &str| file.get_u64(k).and_then(|v| u32::try_from(v).ok());
    let mut eos_token_ids: Vec<u32> = Vec::new();
    for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = tok_id(k).filter(|id| !eos_token_ids.contains(id)) {
            eos_token_ids.push(id);
        }
    }
    // Experts (qwen35moe, qwen3next with expert_count > 0): keys and stacked tensors checked.
    let moe = super::gguf_moe::moe_spec(file, arch_name, arch, num_layers)?;
    let intermediate_size = match &moe {
        // Every MLP sparse (Qwen3.5-MoE): no dense width (the converter writes none).
        Some(mo) if mo.sparse_layers.iter().all(|&s| s) => {
            m.opt("feed_forward_length")?.unwrap_or(0)
        }
        _ => m.req("feed_forward_length")?,
    };
    let spec = ModelSpec {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: m.f32("rope.freq_base").unwrap_or(10000.0),
        rms_norm_eps,
        tie_word_embeddings: file.tensor_info("output.weight").is_none(),
        max_position_embeddings: m.opt("context_length")?.unwrap_or(4096),
        attention_bias: false,
        qk_norm: true,
        bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
        eos_token_ids,
        hybrid: Some(hybrid),
        moe,
        gpt_oss: None,
    };
    spec.validate(file.path())?;
    Ok(spec)
}

/// Which decoder layers are Gated DeltaNet layers, as llama.cpp reads it: the per-block
/// `attention.recurrent_layers` array when present (the converter writes it from `layer_types`,
/// MTP blocks after the decoder layers), else every `full_attention_interval`-th layer (default 4)
/// is full attention.
fn layer_schedule(m: &Meta, blocks: usize, num_layers: usize) -> Result<Vec<LayerType>> {
    let p = m.file.path().display();
    let key = m.key("attention.recurrent_layers");
    let kind = |recurrent: bool| {
        if recurrent {
            LayerType::LinearAttention
        } else {
            LayerType::FullAttention
        }
    };
    if let Some(v) = m.file.metadata().get(&key) {
        let flags: Option<Vec<bool>> = match v {
            GgufValue::Array(a) => a
                .iter()
                .map(|x| match x {
                    GgufValue::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect(),
            _ => None,
        };
        let flags =
            flags.with_context(|| format!("{p}: metadata {key} should be an array of bools"))?;
        if flags.len() != blocks {
            bail!(
                "{p}: {key} has {} entries, {} = {blocks}",
                flags.len(),
                m.key("block_count")
            );
        }
        return Ok(flags[..num_layers].iter().map(|&r| kind(r)).collect());
    }
    let every = m.opt("full_attention_interval")?.unwrap_or(4);
    if every == 0 {
        bail!("{p}: {} is 0", m.key("full_attention_interval"));
    }
    Ok((0..num_layers)
        .map(|i| kind((i + 1) % every != 0))
        .collect())
}

/// The Gated DeltaNet tensors of a `qwen35` layer (GGUF names after `blk.N.`).
const SSM_TENSORS_QWEN35: [&str; 9] = [
    "attn_qkv.weight",
    "attn_gate.weight",
    "ssm_beta.weight",
    "ssm_alpha.weight",
    "ssm_conv1d.weight",
    "ssm_a",
    "ssm_dt.bias",
    "ssm_norm.weight",
    "ssm_out.weight",
];
/// The same for `qwen3next`: `ssm_ba` holds β and α inputs, grouped per key head.
const SSM_TENSORS_QWEN3NEXT: [&str; 8] = [
    "attn_qkv.weight",
    "attn_gate.weight",
    "ssm_ba.weight",
    "ssm_conv1d.weight",
    "ssm_a",
    "ssm_dt.bias",
    "ssm_norm.weight",
    "ssm_out.weight",
];

/// The interval of a schedule built from one (for messages).
fn full_attention_interval(types: &[LayerType]) -> usize {
    types
        .iter()
        .position(|t| *t == LayerType::FullAttention)
        .map_or(types.len(), |i| i + 1)
}

/// What the converter did to a stored value, undone at load.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stored {
    /// As the HF tensor.
    Plain,
    /// A zero-centred RMSNorm weight stored as `1 + w`.
    OnePlus,
    /// `A_log` stored as `ssm_a = −exp(A_log)`.
    NegExp,
}

/// Where a `qwen35` tensor holds value heads in tiled order (head `j·Hk + g` for HF head
/// `g·r + j`), to put back in HF's grouped order.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tiled {
    No,
    /// Rows `skip..` are value heads of `width` rows each (1-D tensors: elements).
    Rows {
        skip: usize,
        width: usize,
    },
    /// Columns are value heads of `width` columns each (`ssm_out`).
    Cols {
        width: usize,
    },
}

struct Entry {
    index: usize,
    stored: Stored,
    tiled: Tiled,
    /// The conv kernel is stored squeezed, [C, K]; HF has [C, 1, K].
    conv: bool,
}

/// The tensors of a hybrid GGUF under HF text-model names (see the module doc). Blocks past the
/// decoder layers (MTP) and unknown tensors keep their GGUF names.
pub struct HybridGgufWeights {
    file: Arc<GgufFile>,
    entries: BTreeMap<String, Entry>,
    shape: GdnShape,
}

/// HF name and stored form of a hybrid GGUF tensor name of a decoder layer below `num_layers`.
fn hybrid_hf_name(
    gguf_name: &str,
    num_layers: usize,
    s: GdnShape,
    tiled: bool,
) -> Option<(String, Entry)> {
    let entry = |stored, tiled_at: Tiled, conv| Entry {
        index: 0,
        stored,
        tiled: if tiled { tiled_at } else { Tiled::No },
        conv,
    };
    if gguf_name == "output_norm.weight" {
        return Some((
            "model.norm.weight".into(),
            entry(Stored::OnePlus, Tiled::No, false),
        ));
    }
    let Some(rest) = gguf_name.strip_prefix("blk.") else {
        return hf_name(gguf_name).map(|n| (n, entry(Stored::Plain, Tiled::No, false)));
    };
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= num_layers {
        return None;
    }
    let qk = 2 * s.key_dim();
    let (hf, e) = match part {
        "attn_norm.weight" => (
            "input_layernorm.weight",
            entry(Stored::OnePlus, Tiled::No, false),
        ),
        "post_attention_norm.weight" => (
            "post_attention_layernorm.weight",
            entry(Stored::OnePlus, Tiled::No, false),
        ),
        "attn_q_norm.weight" => (
            "self_attn.q_norm.weight",
            entry(Stored::OnePlus, Tiled::No, false),
        ),
        "attn_k_norm.weight" => (
            "self_attn.k_norm.weight",
            entry(Stored::OnePlus, Tiled::No, false),
        ),
        "attn_qkv.weight" => (
            "linear_attn.in_proj_qkv.weight",
            entry(
                Stored::Plain,
                Tiled::Rows {
                    skip: qk,
                    width: s.v_dim,
                },
                false,
            ),
        ),
        "attn_gate.weight" => (
            "linear_attn.in_proj_z.weight",
            entry(
                Stored::Plain,
                Tiled::Rows {
                    skip: 0,
                    width: s.v_dim,
                },
                false,
            ),
        ),
        "ssm_beta.weight" => (
            "linear_attn.in_proj_b.weight",
            entry(Stored::Plain, Tiled::Rows { skip: 0, width: 1 }, false),
        ),
        "ssm_alpha.weight" => (
            "linear_attn.in_proj_a.weight",
            entry(Stored::Plain, Tiled::Rows { skip: 0, width: 1 }, false),
        ),
        "ssm_ba.weight" => (
            "linear_attn.in_proj_ba.weight",
            entry(Stored::Plain, Tiled::No, false),
        ),
        "ssm_conv1d.weight" => (
            "linear_attn.conv1d.weight",
            entry(
                Stored::Plain,
                Tiled::Rows {
                    skip: qk,
                    width: s.v_dim,
                },
                true,
            ),
        ),
        "ssm_a" => (
            "linear_attn.A_log",
            entry(Stored::NegExp, Tiled::Rows { skip: 0, width: 1 }, false),
        ),
        "ssm_dt.bias" => (
            "linear_attn.dt_bias",
            entry(Stored::Plain, Tiled::Rows { skip: 0, width: 1 }, false),
        ),
        "ssm_norm.weight" => (
            "linear_attn.norm.weight",
            entry(Stored::Plain, Tiled::No, false),
        ),
        "ssm_out.weight" => (
            "linear_attn.out_proj.weight",
            entry(Stored::Plain, Tiled::Cols { width: s.v_dim }, false),
        ),
        _ => return hf_name(gguf_name).map(|n| (n, entry(Stored::Plain, Tiled::No, false))),
    };
    Some((format!("model.layers.{layer}.{hf}"), e))
}

impl HybridGgufWeights {
    pub fn new(file: Arc<GgufFile>, spec: &ModelSpec) -> Result<HybridGgufWeights> {
        let hy = spec
            .hybrid
            .as_ref()
            .context("HybridGgufWeights needs a hybrid spec")?;
        let shape = hy.gdn_shape();
        // llama.cpp reorders value heads for qwen35 only (its qwen3next converter keeps HF order);
        // with one value head per key head the two orders are the same.
        let tiled =
            matches!(spec.arch, Arch::Qwen3_5 | Arch::Qwen3_5Moe) && shape.v_heads != shape.k_heads;
        let mut entries = BTreeMap::new();
        for (index, t) in file.tensors().iter().enumerate() {
            let (name, entry) = match hybrid_hf_name(&t.name, spec.num_layers, shape, tiled) {
                Some((n, e)) => (n, Entry { index, ..e }),
                None => (
                    t.name.clone(),
                    Entry {
                        index,
                        stored: Stored::Plain,
                        tiled: Tiled::No,
                        conv: false,
                    },
                ),
            };
            if entries.insert(name.clone(), entry).is_some() {
                bail!(
                    "{}: two tensors map to the same name {name}",
                    file.path().display()
                );
            }
        }
        // A missing recurrent-state tensor is reported under its GGUF name, which is the one a
        // GGUF user knows (the shape check that follows names the HF tensor).
        let ssm: &[&str] = match spec.arch {
            Arch::Qwen3Next => &SSM_TENSORS_QWEN3NEXT,
            _ => &SSM_TENSORS_QWEN35,
        };
        for (l, kind) in hy.layer_types.iter().enumerate() {
            if *kind != LayerType::LinearAttention {
                continue;
            }
            if let Some(missing) = ssm
                .iter()
                .map(|t| format!("blk.{l}.{t}"))
                .find(|n| file.tensor_info(n).is_none())
            {
                bail!(
                    "{}: tensor {missing} is missing (layer {l} is a Gated DeltaNet layer, full_attention_interval {})",
                    file.path().display(),
                    full_attention_interval(&hy.layer_types)
                );
            }
        }
        Ok(HybridGgufWeights {
            file,
            entries,
            shape,
        })
    }

    /// PyTorch shape after the conv kernel's unsqueeze.
    fn hf_shape(&self, e: &Entry) -> Vec<usize> {
        let s = self.file.tensors()[e.index].shape();
        match (e.conv, s.as_slice()) {
            (true, [c, k]) => vec![*c, 1, *k],
            _ => s,
        }
    }
}

/// Put tiled value heads back in grouped order: HF head `g·r + j` is stored as head `j·Hk + g`.
fn untile(t: HostTensor, tiled: Tiled, s: GdnShape) -> Option<HostTensor> {
    let (hk, r) = (s.k_heads, s.group());
    let src_head = |hf: usize| (hf % r) * hk + hf / r;
    if tiled == Tiled::No {
        return Some(t);
    }
    let mut out = t.clone();
    match tiled {
        Tiled::No => {}
        Tiled::Rows { skip, width } => {
            let rows = t.shape.first().copied().unwrap_or(0);
            let row_len: usize = t.shape.iter().skip(1).product();
            if rows != skip + s.v_heads * width {
                return None;
            }
            for hf in 0..s.v_heads {
                let (dst, src) = (skip + hf * width, skip + src_head(hf) * width);
                out.data[dst * row_len..(dst + width) * row_len]
                    .copy_from_slice(&t.data[src * row_len..(src + width) * row_len]);
            }
        }
        Tiled::Cols { width } => {
            let cols = *t.shape.last()?;
            if t.shape.len() != 2 || cols != s.v_heads * width {
                return None;
            }
            for (o, i) in out
                .data
                .chunks_exact_mut(cols)
                .zip(t.data.chunks_exact(cols))
            {
                for hf in 0..s.v_heads {
                    let src = src_head(hf) * width;
                    o[hf * width..(hf + 1) * width].copy_from_slice(&i[src..src + width]);
                }
            }
        }
    }
    Some(out)
}

impl WeightSource for HybridGgufWeights {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.entries
            .iter()
            .map(|(name, e)| {
                let t = &self.file.tensors()[e.index];
                TensorInfo {
                    name: name.clone(),
                    file_name: t.name.clone(),
                    dtype: t.ty.name().to_string(),
                    shape: self.hf_shape(e),
                    bytes: t.n_bytes,
                }
            })
            .collect()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let p = self.file.path().display();
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{p}: no tensor {name} in the file"))?;
        let stored_name = &self.file.tensors()[e.index].name;
        let mut t = self.file.dequantize(stored_name)?;
        t.shape = self.hf_shape(e);
        match e.stored {
            Stored::Plain => {}
            Stored::OnePlus => t.data.iter_mut().for_each(|x| *x -= 1.0),
            Stored::NegExp => {
                if let Some((i, v)) = t
                    .data
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !(**v < 0.0 && v.is_finite()))
                {
                    bail!("{p}: tensor {stored_name} holds {v} at index {i}: llama.cpp stores ssm_a = -exp(A_log), which is negative and finite");
                }
                t.data.iter_mut().for_each(|x| *x = (-*x).ln());
            }
        }
        let shape = t.shape.clone();
        untile(t, e.tiled, self.shape).with_context(|| {
            format!(
                "{p}: tensor {stored_name} has shape {shape:?}, which does not hold the {} value heads the ssm.* metadata implies",
                self.shape.v_heads
            )
        })
    }

    fn release(&self, name: &str) {
        if let Some(e) = self.entries.get(name) {
            let t = &self.file.tensors()[e.index];
            self.file.release(t, 0, t.n_bytes as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untile_inverts_the_converters_grouped_to_tiled_order() {
        // Hk = 2, Hv = 6 (r = 3), one row per head: HF head g·3 + j sits at stored head j·2 + g.
        let s = GdnShape {
            k_heads: 2,
            v_heads: 6,
            k_dim: 1,
            v_dim: 1,
        };
        // Stored (tiled) order of HF heads: [G0v0, G1v0, G0v1, G1v1, G0v2, G1v2] = HF [0, 3, 1, 4, 2, 5].
        let stored = HostTensor {
            shape: vec![6],
            data: vec![0., 3., 1., 4., 2., 5.],
        };
        let t = untile(stored.clone(), Tiled::Rows { skip: 0, width: 1 }, s).unwrap();
        assert_eq!(t.data, [0., 1., 2., 3., 4., 5.]);
        // Columns, two rows.
        let stored = HostTensor {
            shape: vec![2, 6],
            data: vec![0., 3., 1., 4., 2., 5., 10., 13., 11., 14., 12., 15.],
        };
        let t = untile(stored.clone(), Tiled::Cols { width: 1 }, s).unwrap();
        assert_eq!(
            t.data,
            [0., 1., 2., 3., 4., 5., 10., 11., 12., 13., 14., 15.]
        );
        // A wrong row count is refused, not read out of bounds.
        let short = HostTensor {
            shape: vec![5],
            data: vec![0.; 5],
        };
        assert!(untile(short, Tiled::Rows { skip: 0, width: 1 }, s).is_none());
    }
}
