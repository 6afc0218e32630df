//! The committed gpt-oss fixture (tests/fixtures/golden/gpt_oss, gpt_oss_mxfp4;
//! tools/golden/make_gpt_oss_golden.py) written as a `gpt-oss` GGUF the way llama.cpp's converter
//! writes it (`conversion/gpt_oss.py` `GptOssModel`, `conversion/base.py`
//! `TextModel.set_gguf_parameters`): the experts as MXFP4 (ggml type 39, repacked from the
//! gpt_oss_mxfp4 folder's blocks and scales exactly as `GptOssModel.repack_mxfp4` does) or as
//! BF16 (de-interleaved and transposed from the bf16 folder's fused tensors as
//! `GptOssModel.modify_tensors` does), everything else F32. Shared by golden_gpt_oss_gguf.rs
//! (CPU) and cuda_mxfp4_gguf.rs (GPU); each includes `golden_util` too.
#![allow(dead_code)]

use crate::golden_util::gguf_write::{write_gguf, TensorOut};
use crate::golden_util::repo_root;
use draftlens_engine::formats::gguf::GgufValue;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

pub const GGML_F32: u32 = 0;
pub const GGML_BF16: u32 = 30;
pub const GGML_MXFP4: u32 = 39;

pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/golden").join(name)
}

/// A safetensors file's tensors: name → (dtype, shape, bytes).
pub type Stored = HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

pub fn stored(folder: &str) -> Stored {
    let bytes = std::fs::read(fixture(folder).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

/// A BF16 / F32 tensor's values.
pub fn values(s: &Stored, name: &str) -> (Vec<usize>, Vec<f32>) {
    let (dtype, shape, bytes) = s.get(name).unwrap_or_else(|| panic!("no tensor {name}"));
    let v = match dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        other => panic!("{name}: dtype {other:?}"),
    };
    (shape.clone(), v)
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `ne` of a tensor of PyTorch shape `shape` (reversed).
pub fn ne_of(shape: &[usize]) -> Vec<u64> {
    shape.iter().rev().map(|&d| d as u64).collect()
}

/// Rows `first, first + 2, …` of each of the `outer` matrices of `rows × cols` in `v`: the
/// converter's `[:, ::2]` (first 0, gate) and `[:, 1::2]` (first 1, up).
pub fn every_other_row(
    v: &[f32],
    outer: usize,
    rows: usize,
    cols: usize,
    first: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len() / 2);
    for m in v.chunks_exact(rows * cols).take(outer) {
        for r in m.chunks_exact(cols).skip(first).step_by(2) {
            out.extend_from_slice(r);
        }
    }
    out
}

/// `[outer, rows, cols]` → `[outer, cols, rows]` (the converter's `transpose(-1, -2)`).
pub fn transpose_last(v: &[f32], outer: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for r in 0..rows {
            for c in 0..cols {
                out[o * rows * cols + c * rows + r] = v[o * rows * cols + r * cols + c];
            }
        }
    }
    out
}

/// One 16-byte group of a gpt-oss checkpoint's MXFP4 blocks (value 2j in the low nibble of byte
/// j, 2j + 1 in the high one) in ggml's `block_mxfp4.qs` order (value j low, j + 16 high): what
/// `GptOssModel.transform_nibble_layout` computes.
pub fn ggml_nibbles(hf: &[u8]) -> [u8; 16] {
    let code = |k: usize| (hf[k / 2] >> (4 * (k % 2))) & 0x0F;
    std::array::from_fn(|j| code(j) | (code(j + 16) << 4))
}

/// `GptOssModel.repack_mxfp4` of the rows `first, first + step, …` of blocks `[E, R, G, 16]` and
/// scales `[E, R, G]`: ggml `block_mxfp4`s (scale byte, then 16 code bytes) of `[E, R/step, 32G]`.
pub fn repack(
    blocks: &[u8],
    scales: &[u8],
    e: usize,
    r: usize,
    g: usize,
    first: usize,
    step: usize,
) -> Vec<u8> {
    let mut out = Vec::new();
    for x in 0..e {
        for row in (first..r).step_by(step) {
            for grp in 0..g {
                let at = (x * r + row) * g + grp;
                out.push(scales[at]);
                out.extend(ggml_nibbles(&blocks[at * 16..(at + 1) * 16]));
            }
        }
    }
    out
}

/// How the experts are stored.
#[derive(Clone, Copy, PartialEq)]
pub enum Experts {
    Mxfp4,
    Bf16,
}

pub fn put(tensors: &mut Vec<TensorOut>, name: &str, shape: &[usize], ty: u32, data: Vec<u8>) {
    tensors.push(TensorOut {
        name: name.to_string(),
        ne: ne_of(shape),
        ty,
        data,
    });
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`): a vocabulary of the 256 bytes.
pub fn byte_tokens() -> Vec<GgufValue> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut n = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                n += 1;
                255 + n
            };
            GgufValue::String(char::from_u32(c).unwrap().to_string())
        })
        .collect()
}

/// The metadata `TextModel.set_gguf_parameters` + `GptOssModel.set_gguf_parameters` write for the
/// fixture's config.json.
pub fn metadata() -> BTreeMap<String, GgufValue> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: GgufValue| {
        m.insert(k.to_string(), v);
    };
    use GgufValue::*;
    put("general.architecture", String("gpt-oss".into()));
    put("general.alignment", U32(32));
    put("gpt-oss.block_count", U32(4));
    put("gpt-oss.context_length", U32(131072));
    put("gpt-oss.embedding_length", U32(32));
    put("gpt-oss.feed_forward_length", U32(32));
    put("gpt-oss.attention.head_count", U32(2));
    put("gpt-oss.attention.head_count_kv", U32(1));
    put("gpt-oss.rope.scaling.type", String("yarn".into()));
    put("gpt-oss.rope.scaling.factor", F32(32.0));
    put("gpt-oss.rope.scaling.original_context_length", U32(4096));
    put("gpt-oss.rope.scaling.yarn_beta_fast", F32(32.0));
    put("gpt-oss.rope.scaling.yarn_beta_slow", F32(1.0));
    put("gpt-oss.rope.freq_base", F32(150000.0));
    put("gpt-oss.attention.layer_norm_rms_epsilon", F32(1e-5));
    put("gpt-oss.expert_count", U32(8));
    put("gpt-oss.expert_used_count", U32(4));
    put("gpt-oss.attention.key_length", U32(64));
    put("gpt-oss.attention.value_length", U32(64));
    put("gpt-oss.attention.sliding_window", U32(8));
    put("gpt-oss.expert_feed_forward_length", U32(32));
    put("tokenizer.ggml.model", String("gpt2".into()));
    put("tokenizer.ggml.pre", String("gpt2".into()));
    put("tokenizer.ggml.tokens", Array(byte_tokens()));
    put("tokenizer.ggml.merges", Array(vec![]));
    m
}

/// The fixture's tensors under llama.cpp's names and shapes, experts stored as `experts`.
pub fn tensors(experts: Experts) -> Vec<TensorOut> {
    let st = stored("gpt_oss");
    let mx = stored("gpt_oss_mxfp4");
    let (e, i, d) = (8usize, 32usize, 32usize);
    let mut out = Vec::new();
    // Everything but the experts as F32 (bf16 values, exact).
    let plain = |gguf: &str, hf: &str, out: &mut Vec<TensorOut>| {
        let (shape, v) = values(&st, hf);
        put(out, gguf, &shape, GGML_F32, f32_bytes(&v));
    };
    plain("token_embd.weight", "model.embed_tokens.weight", &mut out);
    plain("output_norm.weight", "model.norm.weight", &mut out);
    plain("output.weight", "lm_head.weight", &mut out);
    for l in 0..4 {
        let hf = |r: &str| format!("model.layers.{l}.{r}");
        let g = |r: &str| format!("blk.{l}.{r}");
        for (gguf, name) in [
            ("attn_norm.weight", "input_layernorm.weight"),
            (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
            ),
            ("attn_q.weight", "self_attn.q_proj.weight"),
            ("attn_q.bias", "self_attn.q_proj.bias"),
            ("attn_k.weight", "self_attn.k_proj.weight"),
            ("attn_k.bias", "self_attn.k_proj.bias"),
            ("attn_v.weight", "self_attn.v_proj.weight"),
            ("attn_v.bias", "self_attn.v_proj.bias"),
            ("attn_output.weight", "self_attn.o_proj.weight"),
            ("attn_output.bias", "self_attn.o_proj.bias"),
            ("attn_sinks.weight", "self_attn.sinks"),
            ("ffn_gate_inp.weight", "mlp.router.weight"),
            ("ffn_gate_inp.bias", "mlp.router.bias"),
        ] {
            plain(&g(gguf), &hf(name), &mut out);
        }
        // Biases: gate_up's columns ::2 (gate) and 1::2 (up).
        let (_, gub) = values(&st, &hf("mlp.experts.gate_up_proj_bias"));
        for (name, first) in [("ffn_gate_exps.bias", 0), ("ffn_up_exps.bias", 1)] {
            let v = every_other_row(&gub, 1, e * 2 * i, 1, first);
            put(&mut out, &g(name), &[e, i], GGML_F32, f32_bytes(&v));
        }
        plain(
            &g("ffn_down_exps.bias"),
            &hf("mlp.experts.down_proj_bias"),
            &mut out,
        );
        match experts {
            Experts::Mxfp4 => {
                let u8s = |n: &str| mx[&hf(&format!("mlp.experts.{n}"))].2.clone();
                let (b, s) = (u8s("gate_up_proj_blocks"), u8s("gate_up_proj_scales"));
                for (name, first) in [("ffn_gate_exps.weight", 0), ("ffn_up_exps.weight", 1)] {
                    let data = repack(&b, &s, e, 2 * i, d / 32, first, 2);
                    put(&mut out, &g(name), &[e, i, d], GGML_MXFP4, data);
                }
                let (b, s) = (u8s("down_proj_blocks"), u8s("down_proj_scales"));
                let data = repack(&b, &s, e, d, i / 32, 0, 1);
                put(
                    &mut out,
                    &g("ffn_down_exps.weight"),
                    &[e, d, i],
                    GGML_MXFP4,
                    data,
                );
            }
            Experts::Bf16 => {
                let bf16 = |v: &[f32]| -> Vec<u8> {
                    v.iter()
                        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                        .collect()
                };
                // [E, D, 2I] → [E, 2I, D], then rows ::2 / 1::2.
                let (_, gu) = values(&st, &hf("mlp.experts.gate_up_proj"));
                let gu = transpose_last(&gu, e, d, 2 * i);
                for (name, first) in [("ffn_gate_exps.weight", 0), ("ffn_up_exps.weight", 1)] {
                    let v = every_other_row(&gu, e, 2 * i, d, first);
                    put(&mut out, &g(name), &[e, i, d], GGML_BF16, bf16(&v));
                }
                let (_, dn) = values(&st, &hf("mlp.experts.down_proj"));
                let dn = transpose_last(&dn, e, i, d);
                put(
                    &mut out,
                    &g("ffn_down_exps.weight"),
                    &[e, d, i],
                    GGML_BF16,
                    bf16(&dn),
                );
            }
        }
    }
    out
}

/// A gpt-oss GGUF in a temporary folder, its metadata and tensors after `edit`.
pub fn write(
    experts: Experts,
    edit: impl FnOnce(&mut BTreeMap<String, GgufValue>, &mut Vec<TensorOut>),
) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt-oss.gguf");
    let (mut meta, mut t) = (metadata(), tensors(experts));
    edit(&mut meta, &mut t);
    write_gguf(&path, &meta, &t, 32);
    (dir, path)
}
