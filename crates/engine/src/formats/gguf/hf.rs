//! A GGUF file under Hugging Face names (docs/models.md §3.6): the tensor-name map, llama.cpp's
//! Q/K row permutation reversed, and [`GgufWeights`], the [`WeightSource`] the loaders use.

use super::GgufFile;
use crate::formats::{HostTensor, TensorInfo, WeightSource};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The GGUF row that holds Hugging Face row `hf_row` of a llama q/k projection with `n_rows`
/// rows and `n_head` heads (docs/models.md §3.6). Within a head of size hd, HF row i comes from
/// GGUF row 2i and HF row i + hd/2 from GGUF row 2i + 1 (the inverse of llama.cpp's
/// `LlamaModel.permute`).
pub fn llama_unpermute_src_row(hf_row: usize, n_rows: usize, n_head: usize) -> usize {
    let hd = n_rows / n_head;
    let half = hd / 2;
    let (head, within) = (hf_row / hd, hf_row % hd);
    let (h, i) = (within / half, within % half);
    head * hd + 2 * i + h
}

/// Hugging Face name of a GGUF tensor (llama/qwen2/qwen3 naming), or `None` if it has none.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let top = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf_part = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_part}.{suffix}"))
}

/// A GGUF file's tensors under Hugging Face names (see the module docs).
pub struct GgufWeights {
    file: Arc<GgufFile>,
    /// HF name (or the GGUF name for tensors with no HF counterpart) → entry.
    entries: BTreeMap<String, Entry>,
}

struct Entry {
    index: usize,
    /// `Some(n_head)`: reverse llama.cpp's Q/K row permutation with this many heads.
    unpermute: Option<usize>,
}

impl GgufWeights {
    pub fn new(file: Arc<GgufFile>) -> Result<GgufWeights> {
        let p = file.path.display();
        // llama.cpp permutes q/k rows only for the llama architecture (qwen2/qwen3 use NeoX RoPE).
        let heads = if file.architecture() == Some("llama") {
            let h = file
                .get_u64("llama.attention.head_count")
                .with_context(|| {
                    format!("{p}: llama.attention.head_count is missing (needed to un-permute q/k)")
                })? as usize;
            let hkv = file
                .get_u64("llama.attention.head_count_kv")
                .map(|v| v as usize)
                .unwrap_or(h);
            Some((h, hkv))
        } else {
            None
        };
        let mut entries = BTreeMap::new();
        for (index, t) in file.tensors.iter().enumerate() {
            let name = hf_name(&t.name).unwrap_or_else(|| t.name.clone());
            let unpermute = match (heads, t.name.rsplit('.').nth(1)) {
                (Some((h, _)), Some("attn_q")) => Some(h),
                (Some((_, hkv)), Some("attn_k")) => Some(hkv),
                _ => None,
            };
            if let Some(nh) = unpermute {
                let rows = if t.ne.len() == 1 {
                    t.ne[0]
                } else {
                    t.ne.last().copied().unwrap_or(1)
                } as usize;
                if nh == 0 || !rows.is_multiple_of(2 * nh) {
                    bail!("{p}: tensor {} has {rows} rows, not a whole number of {nh} heads of even size; cannot undo the q/k permutation", t.name);
                }
            }
            if entries
                .insert(name.clone(), Entry { index, unpermute })
                .is_some()
            {
                bail!("{p}: two tensors map to the same name {name}");
            }
        }
        Ok(GgufWeights { file, entries })
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }
}

impl WeightSource for GgufWeights {
    fn path(&self) -> &Path {
        &self.file.path
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.entries
            .iter()
            .map(|(name, e)| {
                let t = &self.file.tensors[e.index];
                TensorInfo {
                    name: name.clone(),
                    file_name: t.name.clone(),
                    dtype: t.ty.name().to_string(),
                    shape: t.shape(),
                    bytes: t.n_bytes,
                }
            })
            .collect()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let e = self.entries.get(name).with_context(|| {
            format!("{}: no tensor {name} in the file", self.file.path.display())
        })?;
        self.file
            .dequantize_rows(&self.file.tensors[e.index], e.unpermute)
    }

    fn release(&self, name: &str) {
        if let Some(e) = self.entries.get(name) {
            let t = &self.file.tensors[e.index];
            self.file.release(t, 0, t.n_bytes as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names() {
        assert_eq!(
            hf_name("token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(
            hf_name("blk.12.attn_k.bias").as_deref(),
            Some("model.layers.12.self_attn.k_proj.bias")
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_name("blk.3.attn_q_norm.weight").as_deref(),
            Some("model.layers.3.self_attn.q_norm.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn unpermute_matches_spec_and_is_a_bijection() {
        // hd = 8, 2 heads: HF row i of a head = GGUF row 2i, HF row i + 4 = GGUF row 2i + 1.
        let src: Vec<usize> = (0..16).map(|r| llama_unpermute_src_row(r, 16, 2)).collect();
        assert_eq!(src, [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]);
    }
}
