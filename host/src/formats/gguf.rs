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

use super::dequant::{self, GgmlType};
use super::{HostTensor, TensorInfo, WeightSource};
use crate::model::config::{Arch, ModelSpec};
use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `"GGUF"` read as a little-endian u32.
const GGUF_MAGIC: u32 = 0x4655_4747;
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal in the format; deeper nesting than this is treated as corruption.
const MAX_ARRAY_DEPTH: usize = 4;

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
    /// qwen3; the hybrids qwen35 / qwen3next in [`super::gguf_hybrid`]).
    pub fn model_spec(&self) -> Result<ModelSpec> {
        let p = self.path.display();
        let arch_name = self
            .architecture()
            .with_context(|| format!("{p}: metadata has no general.architecture"))?;
        if super::gguf_hybrid::hybrid_arch(arch_name).is_some() {
            return super::gguf_hybrid::model_spec(self);
        }
        // The GGUF architecture names are llama.cpp's (no underscores); the HF spellings of the
        // hybrids are not GGUF names.
        let arch = Arch::parse(arch_name).filter(|a| !a.is_hybrid()).with_context(|| {
            format!("{p}: unsupported architecture {arch_name:?} in general.architecture (supported: llama, qwen2, qwen3, qwen35, qwen3next)")
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
        let spec = ModelSpec {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: req("feed_forward_length")?,
            num_layers: req("block_count")?,
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
}

// ------------------------------------------------------------------------------------------
// Parsing

struct Parsed {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian reader over the mapped file. Errors carry the file path, the
/// byte offset and what was being read.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Invalid UTF-8 in string values seen so far (replaced, reported once).
    lossy_strings: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            bail!(
                "{}: truncated: {} needs {n} bytes at offset {} but only {} remain (file is {} bytes)",
                self.path.display(),
                what(),
                self.pos,
                self.remaining(),
                self.buf.len()
            );
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count that must fit in what remains given `min_each` bytes per item.
    fn count(&mut self, min_each: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let need = n.checked_mul(min_each as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => bail!(
                "{}: {} at offset {at} claims {n} items of at least {min_each} bytes, but only {} bytes remain (corrupt or truncated file)",
                self.path.display(),
                what(),
                self.remaining()
            ),
        }
    }

    /// GGUF string: u64 length + bytes. Names and keys must be UTF-8.
    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.count(1, &|| format!("length of {}", what()))?;
        self.take(n, what)
    }

    fn name(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let b = self.string_bytes(what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => bail!(
                "{}: {} at offset {at} is not valid UTF-8",
                self.path.display(),
                what()
            ),
        }
    }

    fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<GgufValue> {
        let what = || format!("value of metadata key {key:?}");
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(&what)?[0]),
            1 => GgufValue::I8(self.array::<1>(&what)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => GgufValue::Bool(self.array::<1>(&what)?[0] != 0),
            8 => {
                let b = self.string_bytes(&what)?;
                // Token strings of some converted vocabularies are not valid UTF-8; keep them
                // readable rather than refusing the whole model.
                match std::str::from_utf8(b) {
                    Ok(s) => GgufValue::String(s.to_string()),
                    Err(_) => {
                        self.lossy_strings += 1;
                        GgufValue::String(String::from_utf8_lossy(b).into_owned())
                    }
                }
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    bail!(
                        "{}: metadata key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}",
                        self.path.display()
                    );
                }
                let at = self.pos;
                let elem = self.u32(&|| format!("array element type of metadata key {key:?}"))?;
                let min = min_value_size(elem).with_context(|| {
                    format!("{}: metadata key {key:?}: unknown array element type {elem} at offset {at}", self.path.display())
                })?;
                let n = self.count(min, &|| format!("array length of metadata key {key:?}"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1, key)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            other => bail!(
                "{}: metadata key {key:?} has unknown value type {other}",
                self.path.display()
            ),
        })
    }
}

/// Smallest encoding of a value of GGUF type `ty` (used to bound counts before allocating).
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,  // u64 length
        9 => 12, // u32 element type + u64 count
        _ => return None,
    })
}

fn parse(path: &Path, buf: &[u8]) -> Result<Parsed> {
    let p = path.display();
    let mut r = Reader {
        buf,
        pos: 0,
        path,
        lossy_strings: 0,
    };
    let magic = r.u32(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        bail!(
            "{p}: not a GGUF file (magic bytes {:02x?}, expected \"GGUF\" = 47 47 55 46)",
            &magic.to_le_bytes()
        );
    }
    let version = r.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        1 => bail!("{p}: GGUF version 1 is not supported (only v2 and v3; v1 used 32-bit lengths): re-convert the model with a current llama.cpp"),
        v if v.swap_bytes() <= 3 => bail!("{p}: big-endian GGUF files are not supported (version field reads {v:#x})"),
        v => bail!("{p}: unsupported GGUF version {v} (supported: 2, 3)"),
    }
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
    // a key/value pair at least 8 (key length) + 4 (type) + 1.
    let n_tensors = r.count(24, &|| "tensor count".into())?;
    let n_kv = r.count(13, &|| "metadata key/value count".into())?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.name(&|| format!("metadata key #{i}"))?;
        let ty = r.u32(&|| format!("value type of metadata key {key:?}"))?;
        let value = r.value(ty, 0, &key)?;
        if metadata.insert(key.clone(), value).is_some() {
            bail!("{p}: duplicate metadata key {key:?}");
        }
    }
    if r.lossy_strings > 0 {
        tracing::warn!(
            "{p}: {} metadata strings were not valid UTF-8 and were read lossily",
            r.lossy_strings
        );
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => bail!("{p}: general.alignment must be a power of two, found {v:?}"),
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut rel_offsets = Vec::with_capacity(n_tensors);
    let mut seen = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.name(&|| format!("name of tensor #{i}"))?;
        let what = |s: &str| format!("{s} of tensor {name}");
        let n_dims = r.u32(&|| what("n_dims"))?;
        if n_dims > MAX_DIMS {
            bail!("{p}: tensor {name} has {n_dims} dimensions (ggml allows at most {MAX_DIMS})");
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(r.u64(&|| what("dimensions"))?);
        }
        let type_id = r.u32(&|| what("type"))?;
        let rel = r.u64(&|| what("data offset"))?;
        let ty = GgmlType::from_id(type_id)
            .with_context(|| format!("{p}: tensor {name} has unknown ggml type id {type_id}"))?;
        let n_elems = ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .with_context(|| {
                format!("{p}: tensor {name}: element count of shape {ne:?} overflows")
            })?;
        let row = ne.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            bail!(
                "{p}: tensor {name}: row length {row} is not a multiple of the {ty} block size {}",
                ty.block_size()
            );
        }
        let n_bytes = ty
            .bytes_for(n_elems)
            .with_context(|| format!("{p}: tensor {name}: byte size of shape {ne:?} overflows"))?;
        if seen.insert(name.clone(), i).is_some() {
            bail!("{p}: duplicate tensor name {name}");
        }
        rel_offsets.push(rel);
        tensors.push(GgufTensor {
            name,
            ty,
            ne,
            offset: 0,
            n_bytes,
        });
    }

    let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for (t, rel) in tensors.iter_mut().zip(rel_offsets) {
        let end = data_offset
            .checked_add(rel)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => t.offset = data_offset + rel,
            _ => bail!(
                "{p}: tensor {} data (offset {rel} + {} bytes after the data section at byte {data_offset}) runs past the end of the file ({file_len} bytes); the file is truncated or corrupt",
                t.name,
                t.n_bytes
            ),
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
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
