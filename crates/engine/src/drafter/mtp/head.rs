//! Where a target keeps its MTP head, and the checks that refuse a missing or partial one before
//! anything is computed (docs/mtp.md §1).
//!
//! Hugging Face layout (vLLM `qwen3_next_mtp.py` / `qwen3_5_mtp.py`, SGLang `qwen3_next_mtp.py`),
//! stored next to the target's tensors, top-level `mtp.*`:
//!
//! | tensor | shape | role |
//! |---|---|---|
//! | `mtp.pre_fc_norm_embedding.weight` | [D] | zero-centred RMSNorm of the token embedding |
//! | `mtp.pre_fc_norm_hidden.weight` | [D] | zero-centred RMSNorm of the incoming hidden state |
//! | `mtp.fc.weight` | [D, 2·D] | reads `[embedding │ hidden]` |
//! | `mtp.layers.0.*` | | one full-attention decoder layer of the target's kind (gated attention, q/k norms, partial RoPE; the target's MLP rule at layer index 0: experts on MoE targets) |
//! | `mtp.norm.weight` | [D] | zero-centred RMSNorm of the layer's output |
//!
//! The embedding and the LM head are the target's. GGUF (llama.cpp's `conversion/qwen.py`,
//! `_QwenMtpMixin`): the layer is block `L` (`blk.{L}.*`) after the L decoder layers and the
//! rest `blk.{L}.nextn.{eh_proj, enorm, hnorm, shared_head_norm}`, with
//! `{arch}.nextn_predict_layers`; [`super::gguf::GgufHead`] presents them under the names above
//! (docs/mtp.md §1.3).

use crate::formats::gguf::GgufFile;
use crate::formats::safetensors::SafetensorsWeights;
use crate::formats::{HostTensor, TensorInfo, WeightSource};
use crate::model::config::ModelSpec;
use crate::model::hybrid::{text_config, LayerType};
use crate::model::moe::{check_checkpoint, ffn_tensors, is_ffn_tensor};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Stored names of the head's own tensors (the layer's are `mtp.layers.{i}.*`).
pub const FC: &str = "mtp.fc.weight";
pub const PRE_FC_NORM_EMBEDDING: &str = "mtp.pre_fc_norm_embedding.weight";
pub const PRE_FC_NORM_HIDDEN: &str = "mtp.pre_fc_norm_hidden.weight";
pub const NORM: &str = "mtp.norm.weight";

/// The head a target declares, read from its config (no weight byte).
#[derive(Clone, Debug)]
pub struct MtpHeadConfig {
    /// The target file or folder.
    pub origin: PathBuf,
    /// Where the count was read (`config.json`'s key or the GGUF metadata key), for messages.
    pub source: String,
    /// MTP layers (`mtp_num_hidden_layers`): 1 in every published checkpoint, the only count
    /// draftlens evaluates.
    pub num_layers: usize,
    /// The layer's spec: the target's sizes, one full-attention layer, its MLP sparse where the
    /// target's rule makes layer index 0 sparse (vLLM builds the layer with the target's decoder
    /// class and `extract_layer_index("mtp.layers.0") = 0`).
    pub layer_spec: ModelSpec,
    /// The target's own spec (a GGUF head is read through the target's GGUF name map).
    pub target_spec: ModelSpec,
    /// A GGUF target: the block L (= the target's decoder layers) the head is stored in.
    pub gguf_block: Option<usize>,
}

impl MtpHeadConfig {
    /// The head of the target at `path` (its `config.json` or GGUF metadata). Errors: a target
    /// that is not a Qwen3.5 / Qwen3.6 / Qwen3-Next hybrid, one that declares no head
    /// (`mtp_num_hidden_layers` 0), more than one MTP layer, or dedicated MTP embeddings.
    pub fn read(path: &Path, spec: &ModelSpec) -> Result<MtpHeadConfig> {
        let p = path.display();
        if spec.hybrid.is_none() {
            bail!("{p}: a {} target has no native MTP head (target:mtp reads the mtp.* tensors of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints)", spec.arch.as_str());
        }
        if crate::model::random_target::random_dir(path).is_some() {
            bail!("{p}: a random: target has no native MTP head (only the text model's weights are generated; docs/loading.md §7)");
        }
        let (source, declared, dedicated) = if path.is_dir() {
            let file = path.join("config.json");
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("{}: cannot read", file.display()))?;
            let raw: Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not valid JSON", file.display()))?;
            let c = text_config(&raw, &file)?;
            let (key, n) = ["mtp_num_hidden_layers", "num_nextn_predict_layers"]
                .iter()
                .find_map(|k| c.get(*k).map(|v| (*k, v.as_u64())))
                .unwrap_or(("mtp_num_hidden_layers", None));
            let dedicated = c
                .get("mtp_use_dedicated_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            (format!("{} {key}", file.display()), n, dedicated)
        } else {
            // llama.cpp writes the head as block L and `blk.{L}.nextn.*` (module doc) and counts
            // it in `{arch}.nextn_predict_layers`; no dedicated-embedding key exists there (a
            // dedicated `nextn.embed_tokens` tensor is refused by `GgufHead::open`).
            let file = GgufFile::open(path)?;
            let arch = file.architecture().unwrap_or_default().to_owned();
            let key = format!("{arch}.nextn_predict_layers");
            let n = file.metadata().get(&key).and_then(|v| v.as_u64());
            if matches!(n, None | Some(0)) {
                bail!("{p}: metadata {key} is absent or 0: this GGUF target carries no MTP head (llama.cpp's converter writes it as block {} for Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints that have mtp.* tensors, unless run with --no-mtp)", spec.num_layers);
            }
            (format!("{p}: metadata {key}"), n, false)
        };
        let num_layers = match declared {
            Some(0) => bail!("{source} = 0: this target declares no MTP head"),
            Some(n) => n as usize,
            // vLLM's default when the key is absent (getattr(config, "mtp_num_hidden_layers", 1));
            // the tensors decide (MtpWeights::open).
            None => 1,
        };
        if num_layers != 1 {
            bail!("{source} = {num_layers}: draftlens evaluates MTP heads of one layer (every published Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoint); a head of several is not supported yet");
        }
        if dedicated {
            bail!("{p}: mtp_use_dedicated_embeddings is true: an MTP head with its own embedding is not supported (published heads share the target's; vLLM and SGLang read no dedicated embedding)");
        }
        Ok(MtpHeadConfig {
            origin: path.to_path_buf(),
            source,
            num_layers,
            layer_spec: layer_spec(spec),
            target_spec: spec.clone(),
            gguf_block: (!path.is_dir()).then_some(spec.num_layers),
        })
    }

    /// Every tensor the head reads, under its stored (HF) name, with its shape: the head's own
    /// four, then the layer's (attention and norms as a target full-attention layer's, the MLP
    /// dense or sparse as [`MtpHeadConfig::layer_spec`] says).
    pub fn tensor_plan(&self) -> Vec<(String, Vec<usize>)> {
        let s = &self.layer_spec;
        let d = s.hidden_size;
        let hy = s.hybrid.as_ref().expect("an MTP layer spec is a hybrid's");
        let mut plan: Vec<(String, Vec<usize>)> = vec![
            (PRE_FC_NORM_EMBEDDING.into(), vec![d]),
            (PRE_FC_NORM_HIDDEN.into(), vec![d]),
            (FC.into(), vec![d, 2 * d]),
            (NORM.into(), vec![d]),
        ];
        let layer = hy
            .layer_tensors(s, 0)
            .into_iter()
            .filter(|(n, _)| !is_ffn_tensor(n))
            .chain(ffn_tensors(s, 0));
        plan.extend(layer.map(|(n, shape)| (to_stored(&n), shape)));
        plan
    }
}

/// The target's spec as the MTP layer's: one full-attention layer, MoE where layer index 0 of
/// the target is sparse.
fn layer_spec(spec: &ModelSpec) -> ModelSpec {
    let mut s = spec.clone();
    s.num_layers = 1;
    if let Some(hy) = s.hybrid.as_mut() {
        hy.layer_types = vec![LayerType::FullAttention];
    }
    if let Some(m) = s.moe.as_mut() {
        let sparse = m.is_sparse(0);
        m.sparse_layers = vec![sparse];
    }
    if s.moe.as_ref().is_some_and(|m| !m.is_sparse(0)) {
        s.moe = None;
    }
    s
}

/// `model.layers.{i}.X` (the name the target's layer loaders ask for) → `mtp.layers.{i}.X`.
fn to_stored(name: &str) -> String {
    match name.strip_prefix("model.layers.") {
        Some(rest) => format!("mtp.layers.{rest}"),
        None => name.to_owned(),
    }
}

/// `mtp.layers.{i}.X` → `model.layers.{i}.X`; the head's own tensors keep their names.
fn from_stored(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("mtp.layers.") {
        return Some(format!("model.layers.{rest}"));
    }
    name.starts_with("mtp.").then(|| name.to_owned())
}

/// The head's tensors of a target checkpoint, presented to the target's layer loaders under their
/// names (`model.layers.0.*` is `mtp.layers.0.*`); `mtp.fc` and the three norms under their own.
pub struct MtpWeights {
    inner: Box<dyn WeightSource>,
    /// A GGUF target's head block (for messages).
    gguf_block: Option<usize>,
}

impl MtpWeights {
    /// The head of the target `cfg.origin` (a checkpoint folder, or a GGUF file through
    /// [`super::gguf::GgufHead`]), checked against `cfg`'s plan: a target without any `mtp.*`
    /// tensor, a missing tensor (a partial head) or a wrong shape is one error naming the file
    /// and the tensor (its GGUF name too), before anything is uploaded.
    pub fn open(cfg: &MtpHeadConfig) -> Result<MtpWeights> {
        let inner: Box<dyn WeightSource> = match cfg.gguf_block {
            Some(_) => Box::new(super::gguf::GgufHead::open(&cfg.origin, &cfg.target_spec)?),
            None => Box::new(SafetensorsWeights::open(&cfg.origin)?),
        };
        let w = MtpWeights {
            inner,
            gguf_block: cfg.gguf_block,
        };
        w.check(cfg)?;
        Ok(w)
    }

    /// A head tensor's name for messages: with its GGUF name (or block) in a GGUF target.
    fn label(&self, name: &str) -> String {
        match self.gguf_block {
            Some(b) => super::gguf::stored_label(name, b),
            None => name.to_owned(),
        }
    }

    fn check(&self, cfg: &MtpHeadConfig) -> Result<()> {
        let p = self.inner.path().display();
        let stored = self.inner.tensors();
        let head: Vec<&TensorInfo> = stored
            .iter()
            .filter(|t| t.name.starts_with("mtp."))
            .collect();
        if head.is_empty() {
            bail!("{p}: the target has no mtp.* tensors: it has no native MTP head to draft with");
        }
        // Expert layout, expert ids, a sparse tensor under a dense rule: the target's checks.
        let as_layer: Vec<TensorInfo> = head
            .iter()
            .filter_map(|t| {
                from_stored(&t.name).map(|name| TensorInfo {
                    name,
                    ..(*t).clone()
                })
            })
            .collect();
        check_checkpoint(&cfg.layer_spec, &as_layer, self.inner.path())
            .context("the MTP head's MLP")?;
        let by_name: HashMap<&str, &TensorInfo> =
            head.iter().map(|t| (t.name.as_str(), *t)).collect();
        for (name, shape) in cfg.tensor_plan() {
            match by_name.get(name.as_str()) {
                None => bail!(
                    "{p}: tensor {} is missing: the MTP head is partial ({} of its tensors are stored, {} are needed)",
                    self.label(&name),
                    head.len(),
                    cfg.tensor_plan().len()
                ),
                Some(t) if t.shape != shape => bail!(
                    "{p}: tensor {name} ({}) has shape {:?}, the target's config implies {shape:?}",
                    t.file_name,
                    t.shape
                ),
                _ => {}
            }
        }
        Ok(())
    }
}

impl WeightSource for MtpWeights {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(&to_stored(name))
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.inner
            .tensors()
            .into_iter()
            .filter_map(|t| from_stored(&t.name).map(|name| TensorInfo { name, ..t }))
            .collect()
    }
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        self.inner.tensor(&to_stored(name))
    }
    fn raw(&self, name: &str) -> Result<Option<crate::backend::raw::RawPart<'_>>> {
        self.inner.raw(&to_stored(name))
    }
    fn release(&self, name: &str) {
        self.inner.release(&to_stored(name))
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn layer_names_map_both_ways() {
        let n = "model.layers.0.self_attn.q_proj.weight";
        assert_eq!(to_stored(n), "mtp.layers.0.self_attn.q_proj.weight");
        assert_eq!(from_stored(&to_stored(n)).as_deref(), Some(n));
        assert_eq!(to_stored(FC), FC);
        assert_eq!(from_stored(FC).as_deref(), Some(FC));
        assert_eq!(from_stored("model.layers.0.mlp.gate_proj.weight"), None);
    }
}
