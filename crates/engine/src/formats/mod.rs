//! Model file formats: GGUF v3 (single file with tokenizer and chat template in its metadata)
//! and the Hugging Face layout (config.json + safetensors, single or sharded).
//!
//! Both present their tensors through [`WeightSource`] under **Hugging Face names**
//! (`model.layers.3.self_attn.q_proj.weight`) with PyTorch shapes (`[out, in]`), dequantised to
//! f32. The GGUF source maps names, reverses llama.cpp's Q/K row permutation for the `llama`
//! architecture, and dequantises F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K/MXFP4.

pub mod dequant;
pub mod gguf;
pub mod gguf_experts;
pub mod gguf_gpt_oss;
pub mod gguf_hybrid;
pub mod gguf_moe;
pub mod mxfp4;
pub mod safetensors;

use crate::backend::raw::RawPart;
use anyhow::Result;
use std::path::Path;

/// A tensor on the host, dequantised to f32, row-major, PyTorch shape order.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// What `inspect` shows about one stored tensor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TensorInfo {
    /// Hugging Face name (the name model code asks for).
    pub name: String,
    /// Name inside the file (GGUF names differ).
    pub file_name: String,
    /// Storage dtype in the file: "F32", "F16", "BF16", "Q4_1", ...
    pub dtype: String,
    /// PyTorch order (`[out, in]`).
    pub shape: Vec<usize>,
    pub bytes: u64,
}

/// Tensors of one model, by Hugging Face name.
pub trait WeightSource: Send + Sync {
    /// The file (GGUF) or folder (Hugging Face layout) the weights come from.
    fn path(&self) -> &Path;
    fn contains(&self, name: &str) -> bool;
    /// Every tensor, for `inspect`.
    fn tensors(&self) -> Vec<TensorInfo>;
    /// Load one tensor, dequantised to f32. Errors name the file and the tensor.
    fn tensor(&self, name: &str) -> Result<HostTensor>;
    /// A 2-D tensor's stored bytes, borrowed from the memory map without any copy, when it is
    /// stored in a dtype backends take as is (F32/F16/BF16 safetensors). `Ok(None)`: use
    /// [`WeightSource::tensor`] (quantised GGUF tensors, GGUF's permuted Q/K rows, 1-D tensors).
    fn raw(&self, name: &str) -> Result<Option<RawPart<'_>>> {
        let _ = name;
        Ok(None)
    }
    /// The loader is done with tensor `name` (uploaded): a memory-mapped source may drop its
    /// pages from this process (they stay in the page cache), so host RSS never holds the model.
    fn release(&self, name: &str) {
        let _ = name;
    }
}
