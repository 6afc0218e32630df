//! gpt-oss read from GGUF files written the way llama.cpp's converter writes them
//! (`conversion/gpt_oss.py` `GptOssModel`, `conversion/base.py` `TextModel.set_gguf_parameters`,
//! llama-cpp-python 0.3.36's vendored llama.cpp): the committed gpt-oss fixture
//! (tests/fixtures/golden/gpt_oss, tools/golden/make_gpt_oss_golden.py) re-written here as a
//! `gpt-oss` GGUF by golden_util's GGUF writer, with the experts as MXFP4 (ggml type 39, repacked
//! from the gpt_oss_mxfp4 folder's blocks and scales exactly as `GptOssModel.repack_mxfp4` does)
//! or as BF16 (de-interleaved and transposed from the bf16 folder's fused tensors as
//! `GptOssModel.modify_tensors` does). Each file must give the folder's spec, the same tensors
//! under the same names, bit-identical hidden states to the safetensors model, and so the
//! transformers golden within golden_gpt_oss.rs's bounds. Then bad input, each one error naming
//! the file and the tensor or key.
//!
//! The fixture has no real vocabulary (256 ids): the files carry a byte-level "gpt2" vocabulary of
//! 256 tokens; the converter writes gpt-oss's o200k vocabulary with `tokenizer.ggml.pre`
//! "gpt-4o", which this test does not exercise.

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::formats::gguf::GgufValue;
use draftlens_engine::formats::gguf_gpt_oss::YARN_TRUNCATE;
use draftlens_engine::model::gpt_oss::{rope_freqs, yarn_inv_freq, AttentionKind};
use draftlens_engine::model::{Arch, Capture, ModelSpec, TargetFiles, TargetModel};
use golden_util::gguf_write::{write_gguf, TensorOut};
use golden_util::*;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// golden_gpt_oss.rs's bounds (argued there): every weight here is the checkpoint's value
/// exactly (bf16 and MXFP4 values are f32s, written as F32, BF16 or MXFP4 without rounding), and
/// the hidden states are asserted bit-identical to the safetensors model's, so the same bounds
/// hold.
const TOL: Tolerances = Tolerances {
    rel: 1e-3,
    rel_f16: 1.5e-4,
    logprob: 5e-4,
};
const NEW_TOKENS: usize = 64;

const GGML_F32: u32 = 0;
const GGML_BF16: u32 = 30;
const GGML_MXFP4: u32 = 39;

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/golden").join(name)
}

/// A safetensors file's tensors: name → (dtype, shape, bytes).
type Stored = HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

fn stored(folder: &str) -> Stored {
    let bytes = std::fs::read(fixture(folder).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

/// A BF16 / F32 tensor's values.
fn values(s: &Stored, name: &str) -> (Vec<usize>, Vec<f32>) {
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

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `ne` of a tensor of PyTorch shape `shape` (reversed).
fn ne_of(shape: &[usize]) -> Vec<u64> {
    shape.iter().rev().map(|&d| d as u64).collect()
}

/// Rows `first, first + 2, …` of each of the `outer` matrices of `rows × cols` in `v`: the
/// converter's `[:, ::2]` (first 0, gate) and `[:, 1::2]` (first 1, up).
fn every_other_row(v: &[f32], outer: usize, rows: usize, cols: usize, first: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len() / 2);
    for m in v.chunks_exact(rows * cols).take(outer) {
        for r in m.chunks_exact(cols).skip(first).step_by(2) {
            out.extend_from_slice(r);
        }
    }
    out
}

/// `[outer, rows, cols]` → `[outer, cols, rows]` (the converter's `transpose(-1, -2)`).
fn transpose_last(v: &[f32], outer: usize, rows: usize, cols: usize) -> Vec<f32> {
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
fn ggml_nibbles(hf: &[u8]) -> [u8; 16] {
    let code = |k: usize| (hf[k / 2] >> (4 * (k % 2))) & 0x0F;
    std::array::from_fn(|j| code(j) | (code(j + 16) << 4))
}

/// `GptOssModel.repack_mxfp4` of the rows `first, first + step, …` of blocks `[E, R, G, 16]` and
/// scales `[E, R, G]`: ggml `block_mxfp4`s (scale byte, then 16 code bytes) of `[E, R/step, 32G]`.
fn repack(
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
enum Experts {
    Mxfp4,
    Bf16,
}

fn put(tensors: &mut Vec<TensorOut>, name: &str, shape: &[usize], ty: u32, data: Vec<u8>) {
    tensors.push(TensorOut {
        name: name.to_string(),
        ne: ne_of(shape),
        ty,
        data,
    });
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`): a vocabulary of the 256 bytes.
fn byte_tokens() -> Vec<GgufValue> {
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
fn metadata() -> BTreeMap<String, GgufValue> {
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
fn tensors(experts: Experts) -> Vec<TensorOut> {
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
fn write(
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

fn open_folder(name: &str) -> TargetFiles {
    TargetFiles::open(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

/// The folder's spec as the GGUF must give it: experts one per expert, no quantization_config.
fn want_spec(folder: &TargetFiles) -> ModelSpec {
    let mut s = folder.spec.clone();
    let g = s.gpt_oss.as_mut().unwrap();
    g.per_expert = true;
    g.quant_method = None;
    s
}

/// Every HF tensor of the GGUF equals the folder's (experts: the de-interleaved halves of the
/// fused gate_up, transposed as the model holds them), bit for bit.
fn check_tensors(gguf: &TargetFiles, bf16: &TargetFiles) {
    let (e, i, d) = (8usize, 32usize, 32usize);
    let mut n = 0;
    for t in gguf.weights.tensors() {
        let ours = gguf.weights.tensor(&t.name).unwrap();
        let name = t.name.as_str();
        let want: Vec<f32> = if let Some(rest) = name.split_once(".mlp.experts.").map(|x| x.1) {
            let layer = &name[..name.find(".mlp.").unwrap()];
            let (_, gu) = bf16
                .weights
                .tensor(&format!("{layer}.mlp.experts.gate_up_proj"))
                .map(|t| (t.shape, t.data))
                .unwrap();
            let (_, gub) = bf16
                .weights
                .tensor(&format!("{layer}.mlp.experts.gate_up_proj_bias"))
                .map(|t| (t.shape, t.data))
                .unwrap();
            let gu = transpose_last(&gu, e, d, 2 * i); // [E, 2I, D]
            let dn = transpose_last(
                &bf16
                    .weights
                    .tensor(&format!("{layer}.mlp.experts.down_proj"))
                    .unwrap()
                    .data,
                e,
                i,
                d,
            );
            match rest {
                "gate_proj_bias" => every_other_row(&gub, 1, e * 2 * i, 1, 0),
                "up_proj_bias" => every_other_row(&gub, 1, e * 2 * i, 1, 1),
                "down_proj_bias" => {
                    bf16.weights
                        .tensor(&format!("{layer}.mlp.experts.down_proj_bias"))
                        .unwrap()
                        .data
                }
                _ => {
                    let (x, proj) = rest.split_once('.').unwrap();
                    let x: usize = x.parse().unwrap();
                    match proj {
                        "gate_proj.weight" => every_other_row(&gu, e, 2 * i, d, 0)
                            [x * i * d..(x + 1) * i * d]
                            .to_vec(),
                        "up_proj.weight" => every_other_row(&gu, e, 2 * i, d, 1)
                            [x * i * d..(x + 1) * i * d]
                            .to_vec(),
                        "down_proj.weight" => dn[x * d * i..(x + 1) * d * i].to_vec(),
                        other => panic!("unexpected {name} ({other})"),
                    }
                }
            }
        } else {
            let w = bf16
                .weights
                .tensor(name)
                .unwrap_or_else(|e| panic!("{e:#}"));
            assert_eq!(ours.shape, w.shape, "{name}");
            w.data
        };
        assert_eq!(ours.data, want, "{name} ({})", t.file_name);
        n += 1;
    }
    // 3 top-level + per layer 13 + 3 bias stacks + 8 experts × 3.
    assert_eq!(n, 3 + 4 * (13 + 3 + 8 * 3));
}

fn check_file(label: &str, experts: Experts) {
    let (_dir, path) = write(experts, |_, _| {});
    let gguf = TargetFiles::open(&path).unwrap_or_else(|e| panic!("{label}: {e:#}"));
    let bf16 = open_folder("gpt_oss");
    assert_eq!(gguf.identity.format, "gguf");
    assert_eq!(gguf.spec, want_spec(&bf16), "{label}: the folder's spec");
    check_tensors(&gguf, &bf16);

    // The same f32 weights through the same code: the same bits as the safetensors model.
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &gguf.spec, gguf.weights.as_ref()).unwrap();
    let folder = TargetModel::load(&be, &bf16.spec, bf16.weights.as_ref()).unwrap();
    let g = Golden::open(fixture("gpt_oss").join("golden.safetensors"));
    let ids = g.ids("p1.input_ids");
    let cap = Capture::hf_indices(vec![1, 2, 3, 4], 4).unwrap();
    let a = model
        .forward(&be, &ids, &mut model.new_cache(), &cap)
        .unwrap();
    let b = folder
        .forward(&be, &ids, &mut folder.new_cache(), &cap)
        .unwrap();
    for k in 1..=4 {
        assert_eq!(
            be.to_host(a.captured.get(k).unwrap()).unwrap(),
            be.to_host(b.captured.get(k).unwrap()).unwrap(),
            "{label}: hidden state {k}"
        );
    }
    // And the transformers golden: every hidden state, top-8, 64 greedy tokens per prompt.
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices((0..=4).collect(), 4).unwrap()
    };
    let n = json(&fixture("gpt_oss").join("manifest.json"))["prompts"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(n, 2);
    for p in 0..n {
        let (w, w16, lp) = check_golden_prompt(label, p, &g, &model, &capture, NEW_TOKENS, &TOL);
        eprintln!("{label} prompt {p}: worst rel {w:.2e} (f16 {w16:.2e}), log-prob {lp:.2e}");
    }
}

#[test]
fn gpt_oss_gguf_with_mxfp4_experts_matches_transformers() {
    check_file("gpt-oss GGUF (MXFP4 experts)", Experts::Mxfp4);
}

#[test]
fn gpt_oss_gguf_with_bf16_experts_matches_transformers() {
    check_file("gpt-oss GGUF (BF16 experts)", Experts::Bf16);
}

/// What the metadata cannot carry: YaRN's truncate is assumed false (the checkpoint's, which
/// transformers computes), beta_fast / beta_slow default to 32 / 1 without their keys, the
/// attention factor to 0.1·ln(factor) + 1, and the sliding layers follow llama.cpp's pattern.
#[test]
fn gguf_assumptions_give_the_checkpoints_rope_and_layer_kinds() {
    assert!(!YARN_TRUNCATE);
    // Without the beta keys (llama.cpp does not read them either): the same YaRN.
    let (_dir, path) = write(Experts::Mxfp4, |m, _| {
        m.remove("gpt-oss.rope.scaling.yarn_beta_fast");
        m.remove("gpt-oss.rope.scaling.yarn_beta_slow");
    });
    let gguf = TargetFiles::open(&path).unwrap();
    let bf16 = open_folder("gpt_oss");
    assert_eq!(gguf.spec, want_spec(&bf16));
    let (s, g) = (&gguf.spec, gguf.spec.gpt_oss.as_ref().unwrap());
    let freqs = rope_freqs(s, g);
    let golden = Golden::open(fixture("gpt_oss").join("golden.safetensors"));
    let (_, want) = golden.f32("rope.inv_freq");
    let close = |ours: &[f32]| {
        ours.iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() <= 2.0 * f32::EPSILON * b.abs())
    };
    assert!(close(&freqs.inv_freq), "transformers' inv_freq");
    let scaling = json(&fixture("gpt_oss").join("manifest.json"))["rope"]["attention_scaling"]
        .as_f64()
        .unwrap();
    assert_eq!(freqs.attention_scaling, scaling as f32);
    // The assumption matters here: llama.cpp's outward rounding (truncate true) moves some of
    // this model's frequencies away from transformers'.
    let mut truncated = g.yarn.clone().unwrap();
    truncated.truncate = true;
    assert!(!close(&yarn_inv_freq(
        s.rope_theta as f64,
        s.head_dim,
        &truncated
    )));

    // llama.cpp's pattern keys: a period (3: sliding, sliding, full, …) or a per-layer array.
    use AttentionKind::*;
    for (value, want) in [
        (
            GgufValue::U32(3),
            [
                SlidingAttention,
                SlidingAttention,
                FullAttention,
                SlidingAttention,
            ],
        ),
        (
            GgufValue::Array([false, true, true, false].map(GgufValue::Bool).to_vec()),
            [
                FullAttention,
                SlidingAttention,
                SlidingAttention,
                FullAttention,
            ],
        ),
    ] {
        let (_dir, path) = write(Experts::Mxfp4, |m, _| {
            m.insert("gpt-oss.attention.sliding_window_pattern".into(), value);
        });
        let f = TargetFiles::open(&path).unwrap();
        assert_eq!(f.spec.arch, Arch::GptOss);
        assert_eq!(f.spec.gpt_oss.unwrap().layer_types, want);
    }
}

fn open_err(path: &Path) -> String {
    match TargetFiles::open(path) {
        Ok(_) => panic!("{}: accepted", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

type Edit = Box<dyn FnOnce(&mut BTreeMap<String, GgufValue>, &mut Vec<TensorOut>)>;

fn tensor_mut<'a>(t: &'a mut [TensorOut], name: &str) -> &'a mut TensorOut {
    t.iter_mut().find(|x| x.name == name).unwrap()
}

#[test]
fn bad_gpt_oss_ggufs_are_one_clear_error_naming_the_tensor_or_key() {
    let drop = |name: &'static str| -> Edit { Box::new(move |_, t| t.retain(|x| x.name != name)) };
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            drop("blk.2.ffn_up_exps.weight"),
            vec!["tensor blk.2.ffn_up_exps.weight is missing (llama.cpp's gpt-oss loader requires it)"],
        ),
        (
            drop("blk.1.attn_sinks.weight"),
            vec!["tensor blk.1.attn_sinks.weight is missing"],
        ),
        (
            drop("blk.3.ffn_gate_exps.bias"),
            vec!["tensor blk.3.ffn_gate_exps.bias is missing"],
        ),
        (
            Box::new(|m, _| {
                m.insert("gpt-oss.expert_count".into(), GgufValue::U32(16));
            }),
            vec!["tensor blk.0.ffn_gate_inp.weight holds 8 experts (ne [32, 8], innermost first), gpt-oss.expert_count = 16"],
        ),
        (
            Box::new(|_, t| {
                // One layer's down stack holds 4 experts.
                let x = tensor_mut(t, "blk.1.ffn_down_exps.weight");
                x.ne[2] = 4;
                x.data.truncate(x.data.len() / 2);
            }),
            vec!["tensor blk.1.ffn_down_exps.weight holds 4 experts (ne [32, 32, 4], innermost first), gpt-oss.expert_count = 8"],
        ),
        (
            Box::new(|m, _| {
                m.insert("gpt-oss.expert_used_count".into(), GgufValue::U32(9));
            }),
            vec!["gpt-oss.expert_used_count = 9 must be between 1 and gpt-oss.expert_count = 8"],
        ),
        (
            Box::new(|m, _| {
                m.insert("gpt-oss.expert_feed_forward_length".into(), GgufValue::U32(64));
            }),
            vec!["tensor blk.0.ffn_gate_exps.weight has ne [32, 32, 8] (innermost first), gpt-oss.embedding_length = 32, gpt-oss.expert_feed_forward_length = 64 and gpt-oss.expert_count = 8 imply [32, 64, 8]"],
        ),
        (
            Box::new(|_, t| {
                // An expert stack in a type ggml knows but draftlens does not read (IQ4_NL:
                // 18 bytes per 32 values).
                let x = tensor_mut(t, "blk.0.ffn_gate_exps.weight");
                x.ty = 20;
                x.data = vec![0u8; 32 * 32 * 8 / 32 * 18];
            }),
            vec!["unsupported tensor type IQ4_NL in tensor blk.0.ffn_gate_exps.weight (supported: "],
        ),
        (
            Box::new(|_, t| tensor_mut(t, "blk.2.ffn_down_exps.weight").ty = 99),
            vec!["tensor blk.2.ffn_down_exps.weight has unknown ggml type id 99"],
        ),
        (
            Box::new(|m, _| {
                m.remove("gpt-oss.attention.sliding_window");
            }),
            vec!["metadata key gpt-oss.attention.sliding_window is missing"],
        ),
        (
            Box::new(|m, _| {
                m.insert("gpt-oss.rope.scaling.type".into(), GgufValue::String("linear".into()));
            }),
            vec!["gpt-oss.rope.scaling.type \"linear\" is not supported for gpt-oss"],
        ),
        (
            Box::new(|m, _| {
                m.insert(
                    "gpt-oss.attention.sliding_window_pattern".into(),
                    GgufValue::Array(vec![GgufValue::Bool(true); 3]),
                );
            }),
            vec!["gpt-oss.attention.sliding_window_pattern has 3 entries, gpt-oss.block_count is 4"],
        ),
        (
            Box::new(|_, t| {
                let x = tensor_mut(t, "blk.0.ffn_up_exps.weight");
                x.name = "blk.0.ffn_gate_up_exps.weight".into();
            }),
            vec!["tensor blk.0.ffn_gate_up_exps.weight holds gate and up fused"],
        ),
    ];
    for (edit, want) in cases {
        let (_dir, path) = write(Experts::Mxfp4, edit);
        let err = open_err(&path);
        assert!(
            err.starts_with(&path.display().to_string()),
            "names the file: {err}"
        );
        for w in &want {
            assert!(err.contains(w), "expected {w:?} in {err}");
        }
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}
