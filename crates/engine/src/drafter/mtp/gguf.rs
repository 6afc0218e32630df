//! The MTP head of a llama.cpp GGUF target (`qwen35`, `qwen35moe`, `qwen3next`), read back into
//! the Hugging Face names the head's code uses (docs/mtp.md §1.3).
//!
//! llama.cpp's converter (`conversion/qwen.py`, `_QwenMtpMixin`, shared by `Qwen3NextModel`,
//! `Qwen3_5TextModel` and `Qwen3_5MoeTextModel`) appends the head as block L after the L decoder
//! layers, raises `{arch}.block_count` to L + 1 and writes `{arch}.nextn_predict_layers` = 1:
//!
//! | Hugging Face | GGUF | stored |
//! |---|---|---|
//! | `mtp.layers.0.X` | `blk.{L}.X` under the usual layer names (`attn_norm`, `attn_q` … `ffn_*`, the stacked experts) | as a decoder layer of the target (norms `1 + w`) |
//! | `mtp.fc.weight` | `blk.{L}.nextn.eh_proj.weight` | as is |
//! | `mtp.pre_fc_norm_embedding.weight` | `blk.{L}.nextn.enorm.weight` | `1 + w` |
//! | `mtp.pre_fc_norm_hidden.weight` | `blk.{L}.nextn.hnorm.weight` | `1 + w` |
//! | `mtp.norm.weight` | `blk.{L}.nextn.shared_head_norm.weight` | `1 + w` |
//!
//! (the `1 + w`: `Qwen3NextModel.modify_tensors` adds 1 to every tensor whose name ends in
//! `norm.weight` after the rename, but the GDN's `linear_attn.norm`). The embedding and the LM
//! head are the target's `token_embd` / `output`, as in the checkpoint. llama.cpp would also read
//! a dedicated `nextn.embed_tokens` / `nextn.shared_head_head`, which no Hugging Face head has:
//! both are refused, as `mtp_use_dedicated_embeddings` is.
//!
//! The layer is read by the target's own GGUF name map ([`HybridGgufWeights`], [`MoeGgufWeights`])
//! over L + 1 layers, block L a full-attention layer, so it is undone exactly as the target's
//! layers are; [`GgufHead`] renames block L to `mtp.layers.0` and the four `nextn` tensors to
//! the head's names, so [`super::head::MtpWeights`] checks and serves it as a safetensors head.

use super::head::{FC, NORM, PRE_FC_NORM_EMBEDDING, PRE_FC_NORM_HIDDEN};
use crate::formats::gguf::GgufFile;
use crate::formats::gguf_hybrid::HybridGgufWeights;
use crate::formats::gguf_moe::{moe_spec, MoeGgufWeights};
use crate::formats::{HostTensor, TensorInfo, WeightSource};
use crate::model::config::{LayerType, ModelSpec};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;

/// The head's own tensors: (Hugging Face name, GGUF name after `blk.{L}.`, stored as `1 + w`).
const NEXTN: [(&str, &str, bool); 4] = [
    (FC, "nextn.eh_proj.weight", false),
    (PRE_FC_NORM_EMBEDDING, "nextn.enorm.weight", true),
    (PRE_FC_NORM_HIDDEN, "nextn.hnorm.weight", true),
    (NORM, "nextn.shared_head_norm.weight", true),
];

/// Tensors llama.cpp reads in an MTP block when present that a Hugging Face head never has, and
/// what they are.
const DEDICATED: [(&str, &str); 2] = [
    ("nextn.embed_tokens.weight", "a dedicated MTP embedding"),
    ("nextn.shared_head_head.weight", "a dedicated MTP LM head"),
];

/// Where a head tensor (Hugging Face name) is stored in a GGUF file whose head is block
/// `block`, for messages: the GGUF name of the head's own four, the block for the layer's.
pub fn stored_label(name: &str, block: usize) -> String {
    match NEXTN.iter().find(|(hf, ..)| *hf == name) {
        Some((_, gguf, _)) => format!("{name} (GGUF blk.{block}.{gguf})"),
        None => format!("{name} (GGUF block blk.{block}.*)"),
    }
}

/// The head of the GGUF target `path` (described by `spec`, its L = `spec.num_layers` decoder
/// layers): block L under `mtp.*` names. Errors name the file and the GGUF tensor: no tensor in
/// block L, a dedicated embedding or LM head, and whatever the target's own GGUF readers refuse
/// in the block (its expert tensors against the keys, a missing router).
pub struct GgufHead {
    inner: Box<dyn WeightSource>,
    block: usize,
}

impl GgufHead {
    pub fn open(path: &Path, spec: &ModelSpec) -> Result<GgufHead> {
        let p = path.display();
        let file = Arc::new(GgufFile::open(path)?);
        let block = spec.num_layers;
        let prefix = format!("blk.{block}.");
        let arch_name = file.architecture().unwrap_or_default().to_owned();
        if !file.tensors().iter().any(|t| t.name.starts_with(&prefix)) {
            bail!("{p}: no tensor of block blk.{block}.* is stored, but {arch_name}.nextn_predict_layers declares an MTP block after the {block} decoder layers: the MTP head is missing");
        }
        for (part, what) in DEDICATED {
            if file.tensor_info(&format!("{prefix}{part}")).is_some() {
                bail!("{p}: tensor {prefix}{part} is {what}: an MTP head with its own embedding or LM head is not supported (published Qwen3.5 / Qwen3.6 / Qwen3-Next heads share the target's; vLLM and SGLang read none)");
            }
        }
        // The target's layers and block L as one more full-attention layer.
        let mut view = spec.clone();
        view.num_layers = block + 1;
        view.hybrid
            .as_mut()
            .context("an MTP head belongs to a hybrid target")?
            .layer_types
            .push(LayerType::FullAttention);
        let moe = moe_spec(&file, &arch_name, spec.arch, block + 1)
            .with_context(|| format!("reading the MTP block blk.{block}.* of {p}"))?;
        let names: Box<dyn WeightSource> = Box::new(HybridGgufWeights::new(file.clone(), &view)?);
        let inner: Box<dyn WeightSource> = match &moe {
            Some(m) => Box::new(MoeGgufWeights::new(names, file, m)?),
            None => names,
        };
        Ok(GgufHead { inner, block })
    }

    /// The block the head is stored in (L).
    pub fn block(&self) -> usize {
        self.block
    }

    /// A head tensor's name in `inner`, and whether it is stored as `1 + w`.
    fn inner_name(&self, name: &str) -> Option<(String, bool)> {
        if let Some((_, gguf, one_plus)) = NEXTN.iter().find(|(hf, ..)| *hf == name) {
            return Some((format!("blk.{}.{gguf}", self.block), *one_plus));
        }
        let rest = name.strip_prefix("mtp.layers.0.")?;
        Some((format!("model.layers.{}.{rest}", self.block), false))
    }

    /// An `inner` name's head name (None: not the head's).
    fn head_name(&self, inner: &str) -> Option<String> {
        let b = self.block;
        if let Some(rest) = inner.strip_prefix(&format!("model.layers.{b}.")) {
            return Some(format!("mtp.layers.0.{rest}"));
        }
        let part = inner.strip_prefix(&format!("blk.{b}."))?;
        NEXTN
            .iter()
            .find(|(_, gguf, _)| *gguf == part)
            .map(|(hf, ..)| hf.to_string())
    }
}

impl WeightSource for GgufHead {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn contains(&self, name: &str) -> bool {
        self.inner_name(name)
            .is_some_and(|(n, _)| self.inner.contains(&n))
    }

    /// The head's tensors only, under their Hugging Face names (`file_name` the GGUF tensor).
    fn tensors(&self) -> Vec<TensorInfo> {
        self.inner
            .tensors()
            .into_iter()
            .filter_map(|t| self.head_name(&t.name).map(|name| TensorInfo { name, ..t }))
            .collect()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let (inner, one_plus) = self.inner_name(name).with_context(|| {
            format!(
                "{}: {name} is not a tensor of the MTP head",
                self.path().display()
            )
        })?;
        let mut t = self.inner.tensor(&inner)?;
        if one_plus {
            t.data.iter_mut().for_each(|x| *x -= 1.0);
        }
        Ok(t)
    }

    fn release(&self, name: &str) {
        if let Some((n, _)) = self.inner_name(name) {
            self.inner.release(&n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_the_gguf_tensor_or_block() {
        assert_eq!(
            stored_label(FC, 6),
            "mtp.fc.weight (GGUF blk.6.nextn.eh_proj.weight)"
        );
        assert_eq!(
            stored_label(NORM, 40),
            "mtp.norm.weight (GGUF blk.40.nextn.shared_head_norm.weight)"
        );
        assert_eq!(
            stored_label("mtp.layers.0.self_attn.q_proj.weight", 6),
            "mtp.layers.0.self_attn.q_proj.weight (GGUF block blk.6.*)"
        );
    }
}
