//! GGUF v2/v3 reader (docs/models.md §3.2–§3.6).
//!
//! [`GgufFile::open`] memory-maps the file and parses the header, the metadata and the tensor
//! infos; tensor data is only touched when a tensor is asked for. Every count and length read
//! from the file is checked against the bytes that remain **before** anything is allocated, and
//! every tensor's data range is checked against the file size, so a corrupt or truncated file
//! gives one error naming the file (and the key or tensor), never a panic or a huge allocation.
//!
//! [`GgufWeights`] presents the tensors under Hugging Face names with PyTorch shapes, dequantised
//! to f32, and for the `llama` architecture reverses llama.cpp's Q/K row permutation so the model
//! code can use rotate-half RoPE on every architecture.
//!
//! This module holds the parsed file ([`GgufFile`]: metadata access, the model spec,
//! dequantisation); `parse.rs` the bounds-checked header parser, `hf.rs` the Hugging Face view
//! ([`GgufWeights`], the tensor-name map and the Q/K un-permutation).

mod hf;
mod parse;

pub use hf::{hf_name, llama_unpermute_src_row, GgufWeights};
use parse::parse;

use super::dequant::{self, GgmlType};
use super::HostTensor;
use crate::model::config::{Arch, ModelSpec};
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type as u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as i64 (u64 above i64::MAX gives `None`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(v) => Some(v as i64),
            GgufValue::U16(v) => Some(v as i64),
            GgufValue::U32(v) => Some(v as i64),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I8(v) => Some(v as i64),
            GgufValue::I16(v) => Some(v as i64),
            GgufValue::I32(v) => Some(v as i64),
            GgufValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The GGUF type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        }
    }
}

/// One tensor info from the GGUF header.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    /// Name in the file (`blk.0.attn_q.weight`).
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions innermost-first, as stored (`ne[0]` is the contiguous row length).
    pub ne: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl GgufTensor {
    /// PyTorch order: `ne` reversed (`[out, in]` for a linear weight).
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Contiguous row length (`ne[0]`; 1 for a 0-dimensional tensor).
    pub fn row_len(&self) -> u64 {
        self.ne.first().copied().unwrap_or(1)
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let p = path.display();
        let file =
            std::fs::File::open(path).with_context(|| format!("{p}: cannot open GGUF file"))?;
        let len = file
            .metadata()
            .with_context(|| format!("{p}: cannot stat"))?
            .len();
        if len == 0 {
            bail!("{p}: empty file, not a GGUF model");
        }
        // SAFETY: the map is read-only. Like every mmap-based model loader we rely on the file
        // not being truncated by another process while it is open.
        let mmap =
            unsafe { Mmap::map(&file) }.with_context(|| format!("{p}: cannot memory-map"))?;
        let parsed = parse(path, &mmap)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: parsed.version,
            by_name: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// `general.alignment` or the default 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// Tensor info by GGUF name.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw stored bytes of a tensor (range validated at open).
    pub fn tensor_data(&self, t: &GgufTensor) -> &[u8] {
        &self.mmap[t.offset as usize..(t.offset + t.n_bytes) as usize]
    }

    /// Drop this process's pages of bytes `start..end` of tensor `t`'s data once the loader has
    /// uploaded them (`WeightSource::release`): the page cache keeps them, so a loaded GGUF
    /// target's file does not stay resident in the process. The range is widened to whole 64 KiB
    /// blocks (at least a page on every host) so that the pages a tensor shares with its
    /// neighbours go too: dropping a page never changes what a later read sees, it only faults
    /// the page back in.
    pub fn release(&self, t: &GgufTensor, start: usize, end: usize) {
        const BLOCK: usize = 64 << 10;
        let (base, len) = (t.offset as usize, t.n_bytes as usize);
        let lo = (base + start.min(len)) / BLOCK * BLOCK;
        let hi = ((base + end.min(len)).div_ceil(BLOCK) * BLOCK).min(self.mmap.len());
        if lo < hi {
            // SAFETY: the range lies in this file's read-only mapping, which nothing writes to;
            // a later read faults its pages back in with the same content.
            unsafe { crate::backend::raw::release_mapped_pages(&self.mmap[lo..hi]) }
        }
    }

    /// Dequantise a tensor by GGUF name, in file order (no renaming, no un-permute). Shape in
    /// PyTorch order.
    pub fn dequantize(&self, name: &str) -> Result<HostTensor> {
        let t = self
            .tensor_info(name)
            .with_context(|| format!("{}: no tensor {name:?} in the file", self.path.display()))?;
        self.dequantize_rows(t, None)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key)? {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type (u8 … i64); negative values give `None`.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata.get(key)?.as_u64()
    }

    /// f32 or f64.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match *self.metadata.get(key)? {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match *self.metadata.get(key)? {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// An array whose elements are all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        match self.metadata.get(key)? {
            GgufValue::Array(a) => a
                .iter()
                .map(|v| match v {
                    GgufValue::String(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// An array whose elements are all integers (any width).
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        match self.metadata.get(key)? {
            GgufValue::Array(a) => a.iter().map(GgufValue::as_i64).collect(),
            _ => None,
        }
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// The model description from `<arch>.*` and `tokenizer.ggml.*` metadata (llama, qwen2,
    /// qwen3, qwen3moe; the hybrids qwen35 / qwen35moe / qwen3next in [`super::gguf_hybrid`];
    /// experts in [`super::gguf_moe`]; gpt-oss in [`super::gguf_gpt_oss`]).
    pub fn model_spec(&self) -> Result<ModelSpec> {
        let p = self.path.display();
        let arch_name = self
            .architecture()
            .with_context(|| format!("{p}: metadata has no general.architecture"))?;
        if super::gguf_hybrid::hybrid_arch(arch_name).is_some() {
            return super::gguf_hybrid::model_spec(self);
        }
        if arch_name == super::gguf_gpt_oss::ARCH {
            return super::gguf_gpt_oss::model_spec(self);
        }
        // The GGUF architecture names are llama.cpp's (no underscores); the HF spellings of the
        // hybrids are not GGUF names.
        let arch = match arch_name {
            "qwen3moe" => Some(Arch::Qwen3Moe),
            _ => Arch::parse(arch_name).filter(|a| !a.is_hybrid() && *a != Arch::Qwen3Moe),
        };
        let arch = arch.with_context(|| {
            format!("{p}: unsupported architecture {arch_name:?} in general.architecture (supported: llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, qwen3next, gpt-oss)")
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            let full = key(k);
            match self.metadata.get(&full) {
                None => bail!("{p}: metadata key {full} is missing"),
                Some(v) => match v.as_u64() {
                    Some(n) => usize::try_from(n)
                        .with_context(|| format!("{p}: metadata {full} = {n} is too large")),
                    None => bail!(
                        "{p}: metadata {full} should be an unsigned integer, found {}",
                        v.type_name()
                    ),
                },
            }
        };
        let opt = |k: &str| self.get_u64(&key(k)).map(|v| v as usize);

        let hidden_size = req("embedding_length")?;
        let num_heads = req("attention.head_count")?;
        let num_kv_heads = opt("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = match opt("attention.key_length") {
            Some(k) => k,
            None => {
                if num_heads == 0 || hidden_size % num_heads != 0 {
                    bail!("{p}: embedding_length {hidden_size} is not divisible by head_count {num_heads} and attention.key_length is absent");
                }
                hidden_size / num_heads
            }
        };
        // The model code applies RoPE to the whole head; partial rotary would silently be wrong.
        if let Some(rd) = opt("rope.dimension_count") {
            if rd != head_dim {
                bail!("{p}: {} = {rd} differs from head_dim {head_dim}; partial rotary embeddings are not supported", key("rope.dimension_count"));
            }
        }
        if let Some(kind) = self.get_str(&key("rope.scaling.type")) {
            if kind != "none" {
                tracing::warn!("{p}: rope scaling {kind:?} in the metadata is ignored (plain RoPE is used, as Hugging Face does without rope_scaling)");
            }
        }
        let rms_norm_eps = self
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .with_context(|| {
                format!(
                    "{p}: metadata key {} is missing or not a float",
                    key("attention.layer_norm_rms_epsilon")
                )
            })?;
        let vocab_size = match opt("vocab_size") {
            Some(v) => v,
            None => match self.metadata.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Array(a)) => a.len(),
                _ => match self.tensor_info("token_embd.weight") {
                    Some(t) if t.ne.len() == 2 => t.ne[1] as usize,
                    _ => bail!("{p}: cannot tell the vocabulary size (no {}, no tokenizer.ggml.tokens, no token_embd.weight)", key("vocab_size")),
                },
            },
        };
        let tok_id = |k: &str| self.get_u64(k).and_then(|v| u32::try_from(v).ok());
        let mut eos_token_ids: Vec<u32> = Vec::new();
        // eot (end of turn) also ends generation in llama.cpp; keep both, eos first.
        for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = tok_id(k) {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }
        let num_layers = req("block_count")?;
        // Experts (qwen3moe): the keys and stacked tensors, checked (super::gguf_moe).
        let moe = super::gguf_moe::moe_spec(self, arch_name, arch, num_layers)?;
        let intermediate_size = match &moe {
            // A file whose every MLP is sparse needs no dense width.
            Some(m) if m.sparse_layers.iter().all(|&s| s) => {
                opt("feed_forward_length").unwrap_or(0)
            }
            _ => req("feed_forward_length")?,
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
            rope_theta: self.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
            rms_norm_eps,
            tie_word_embeddings: self.tensor_info("output.weight").is_none(),
            max_position_embeddings: opt("context_length").unwrap_or(4096),
            attention_bias: arch == Arch::Qwen2 || self.tensor_info("blk.0.attn_q.bias").is_some(),
            qk_norm: arch == Arch::Qwen3 || self.tensor_info("blk.0.attn_q_norm.weight").is_some(),
            bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids,
            hybrid: None,
            moe,
            gpt_oss: None,
        };
        spec.validate(&self.path)?;
        Ok(spec)
    }

    /// Dequantise a tensor row by row. With `unpermute = Some(n_head)`, output row r (outermost
    /// dimension) is taken from the GGUF row given by [`llama_unpermute_src_row`]. Large tensors
    /// are split over the rayon pool.
    fn dequantize_rows(&self, t: &GgufTensor, unpermute: Option<usize>) -> Result<HostTensor> {
        let p = self.path.display();
        if !t.ty.is_supported() {
            bail!(
                "{p}: unsupported tensor type {} in tensor {} (supported: {})",
                t.ty,
                t.name,
                dequant::SUPPORTED
            );
        }
        let shape = t.shape();
        let n = t.n_elements() as usize;
        let mut data = vec![0f32; n];
        if n == 0 {
            return Ok(HostTensor { shape, data });
        }
        let src = self.tensor_data(t);
        let fail = |e: anyhow::Error| anyhow::anyhow!("{p}: tensor {}: {e:#}", t.name);

        // A 1-D tensor under a row permutation (a llama q/k bias) permutes single elements.
        let row_len = if unpermute.is_some() && t.ne.len() == 1 {
            1
        } else {
            t.row_len() as usize
        };
        let n_rows = n / row_len;
        if row_len == 1 && t.ty.block_size() != 1 {
            // Only reachable for a quantised 1-D permuted tensor: dequantise whole, then reorder.
            let mut flat = vec![0f32; n];
            dequant::dequantize(t.ty, src, &mut flat).map_err(fail)?;
            let nh = unpermute.expect("row_len 1 with a block type only when permuting");
            for (r, y) in data.iter_mut().enumerate() {
                *y = flat[llama_unpermute_src_row(r, n_rows, nh)];
            }
            return Ok(HostTensor { shape, data });
        }
        let row_bytes = src.len() / n_rows;
        let src_row = |r: usize| match unpermute {
            Some(nh) => llama_unpermute_src_row(r, n_rows, nh),
            None => r,
        };
        // Rows per rayon task: ~64k elements keeps tasks big enough to amortise scheduling.
        const PAR_MIN_ELEMS: usize = 1 << 16;
        let rows_per_task = (PAR_MIN_ELEMS / row_len).max(1);
        let run = |(task, out): (usize, &mut [f32])| -> Result<()> {
            for (k, y) in out.chunks_exact_mut(row_len).enumerate() {
                let s = src_row(task * rows_per_task + k);
                dequant::dequantize(t.ty, &src[s * row_bytes..(s + 1) * row_bytes], y)
                    .map_err(fail)?;
            }
            Ok(())
        };
        if n >= 2 * PAR_MIN_ELEMS {
            data.par_chunks_mut(rows_per_task * row_len)
                .enumerate()
                .try_for_each(run)?;
        } else {
            data.chunks_mut(rows_per_task * row_len)
                .enumerate()
                .try_for_each(run)?;
        }
        Ok(HostTensor { shape, data })
    }
}
