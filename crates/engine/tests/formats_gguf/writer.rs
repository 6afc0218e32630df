//! A test-only GGUF writer: metadata of every value type, tensors with given bytes, and knobs
//! (version, alignment, tensor offsets) for writing corrupt files.

use draftlens_engine::formats::dequant::GgmlType;
use std::path::{Path, PathBuf};

#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
    /// Overrides the computed data offset (to write corrupt files).
    pub offset: Option<u64>,
}

#[derive(Clone)]
pub struct Writer {
    pub version: u32,
    pub alignment: u64,
    pub kv: Vec<(String, u32, Vec<u8>)>,
    pub tensors: Vec<Tensor>,
}

pub fn gstr(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            version: 3,
            alignment: 32,
            kv: vec![],
            tensors: vec![],
        }
    }
    pub fn raw(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
        self.kv.push((key.into(), ty, value));
        self
    }
    pub fn str(self, key: &str, v: &str) -> Self {
        self.raw(key, 8, gstr(v))
    }
    pub fn u32(self, key: &str, v: u32) -> Self {
        self.raw(key, 4, v.to_le_bytes().to_vec())
    }
    pub fn u64(self, key: &str, v: u64) -> Self {
        self.raw(key, 10, v.to_le_bytes().to_vec())
    }
    pub fn i32(self, key: &str, v: i32) -> Self {
        self.raw(key, 5, v.to_le_bytes().to_vec())
    }
    pub fn f32(self, key: &str, v: f32) -> Self {
        self.raw(key, 6, v.to_le_bytes().to_vec())
    }
    pub fn bool(self, key: &str, v: bool) -> Self {
        self.raw(key, 7, vec![v as u8])
    }
    pub fn str_array(self, key: &str, v: &[&str]) -> Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for s in v {
            b.extend(gstr(s));
        }
        self.raw(key, 9, b)
    }
    pub fn i32_array(self, key: &str, v: &[i32]) -> Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for x in v {
            b.extend(x.to_le_bytes());
        }
        self.raw(key, 9, b)
    }
    pub fn tensor(mut self, name: &str, ne: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.into(),
            ne: ne.to_vec(),
            ty: ty.id(),
            data,
            offset: None,
        });
        self
    }
    /// An F32 tensor whose element k (row-major, PyTorch order) is `f(k)`.
    pub fn f32_tensor(self, name: &str, ne: &[u64], f: impl Fn(usize) -> f32) -> Self {
        let n: u64 = ne.iter().product();
        let data = (0..n as usize).flat_map(|k| f(k).to_le_bytes()).collect();
        self.tensor(name, ne, GgmlType::F32, data)
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            b.extend(gstr(k));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        let align = |x: u64| x.div_ceil(self.alignment) * self.alignment;
        let mut off = 0u64;
        let mut offsets = vec![];
        for t in &self.tensors {
            b.extend(gstr(&t.name));
            b.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.ty.to_le_bytes());
            b.extend(t.offset.unwrap_or(off).to_le_bytes());
            offsets.push(off);
            off = align(off + t.data.len() as u64);
        }
        let data_start = align(b.len() as u64);
        b.resize(data_start as usize, 0);
        for (t, o) in self.tensors.iter().zip(offsets) {
            b.resize((data_start + o) as usize, 0);
            b.extend(&t.data);
        }
        b
    }

    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.bytes()).unwrap();
        p
    }
}

/// A tiny LLaMA-shaped model: D = 8, H = 2, Hkv = 1, hd = 4, I = 16, V = 10, one layer. Every
/// F32 element encodes its own (row, column) as `row * 100 + col` so reordering is visible.
pub fn tiny_llama() -> Writer {
    let rc = |cols: usize| move |k: usize| ((k / cols) * 100 + k % cols) as f32;
    let tokens: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    Writer::new()
        .str("general.architecture", "llama")
        .str("general.name", "tiny")
        .u32("llama.block_count", 1)
        .u64("llama.context_length", 256) // u64 on purpose: readers must accept either width
        .u32("llama.embedding_length", 8)
        .u32("llama.feed_forward_length", 16)
        .u32("llama.attention.head_count", 2)
        .u32("llama.attention.head_count_kv", 1)
        .f32("llama.rope.freq_base", 100000.0)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .u32("llama.rope.dimension_count", 4)
        .str("tokenizer.ggml.model", "gpt2")
        .str_array("tokenizer.ggml.tokens", &tokens)
        .i32_array("tokenizer.ggml.token_type", &[3, 1, 1, 1, 1, 1, 1, 1, 1, 1])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .bool("tokenizer.ggml.add_bos_token", false)
        .f32_tensor("token_embd.weight", &[8, 10], rc(8))
        .f32_tensor("output_norm.weight", &[8], |k| 1.0 + k as f32)
        .f32_tensor("blk.0.attn_norm.weight", &[8], |k| k as f32)
        .f32_tensor("blk.0.attn_q.weight", &[8, 8], rc(8))
        .f32_tensor("blk.0.attn_k.weight", &[8, 4], rc(8))
        .f32_tensor("blk.0.attn_v.weight", &[8, 4], rc(8))
        .f32_tensor("blk.0.attn_output.weight", &[8, 8], rc(8))
        .f32_tensor("blk.0.ffn_norm.weight", &[8], |k| k as f32)
        .f32_tensor("blk.0.ffn_gate.weight", &[8, 16], rc(8))
        .f32_tensor("blk.0.ffn_up.weight", &[8, 16], rc(8))
        .tensor(
            "blk.0.ffn_down.weight",
            &[32, 8],
            GgmlType::Q8_0,
            q8_0_rows(8),
        )
}

/// `rows` Q8_0 rows of 32 elements: row r has d = 0.5 and q[j] = j - 16 + r.
pub fn q8_0_rows(rows: usize) -> Vec<u8> {
    let mut b = vec![];
    for r in 0..rows {
        b.extend(half::f16::from_f32(0.5).to_le_bytes());
        b.extend((0..32).map(|j| (j - 16 + r as i32) as i8 as u8));
    }
    b
}
