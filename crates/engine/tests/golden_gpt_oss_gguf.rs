//! gpt-oss read from GGUF files written the way llama.cpp's converter writes them
//! (`conversion/gpt_oss.py` `GptOssModel`, `conversion/base.py` `TextModel.set_gguf_parameters`,
//! llama-cpp-python 0.3.36's vendored llama.cpp): the committed gpt-oss fixture
//! (tests/fixtures/golden/gpt_oss, tools/golden/make_gpt_oss_golden.py) re-written as a
//! `gpt-oss` GGUF by gpt_oss_gguf_util (its module doc says how), with the experts as MXFP4 or
//! BF16. Each file must give the folder's spec, the same tensors under the same names,
//! bit-identical hidden states to the safetensors model, and so the transformers golden within
//! golden_gpt_oss.rs's bounds. The MXFP4 experts reach the backend as MXFP4 bytes
//! (`Backend::matrix_mxfp4`, recorded here) that dequantise to the values ggml's reading gives,
//! and the CUDA memory estimate counts them packed, as a folder's. Then bad input, each one error
//! naming the file and the tensor or key.
//!
//! The fixture has no real vocabulary (256 ids): the files carry a byte-level "gpt2" vocabulary of
//! 256 tokens; the converter writes gpt-oss's o200k vocabulary with `tokenizer.ggml.pre`
//! "gpt-4o", which this test does not exercise.

mod golden_util;
mod gpt_oss_gguf_util;

use anyhow::Result;
use draftlens_engine::backend::cpu::{CpuBackend, CpuMatrix, CpuTensor};
use draftlens_engine::backend::memory::MemoryModel;
use draftlens_engine::backend::{AttnMask, AttnShape, Backend, Rope, TopK};
use draftlens_engine::formats::gguf::GgufValue;
use draftlens_engine::formats::gguf_gpt_oss::YARN_TRUNCATE;
use draftlens_engine::model::gpt_oss::{rope_freqs, yarn_inv_freq, AttentionKind};
use draftlens_engine::model::{Arch, Capture, ModelSpec, TargetFiles, TargetModel};
use golden_util::gguf_write::TensorOut;
use golden_util::*;
use gpt_oss_gguf_util::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

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

/// The CPU reference that records the bytes of every `matrix_mxfp4` call (what a backend keeping
/// MXFP4 packed receives: the CUDA backend); every op is the CPU's. Only loads are run here.
struct RecordsMxfp4 {
    cpu: CpuBackend,
    calls: Mutex<Vec<Mxfp4Call>>,
}

/// One `matrix_mxfp4` call: blocks, scales, out, inp.
type Mxfp4Call = (Vec<u8>, Vec<u8>, usize, usize);

impl Backend for RecordsMxfp4 {
    type Tensor = CpuTensor;
    type Matrix = CpuMatrix;
    type F32Buf = draftlens_engine::backend::HostF32;

    fn name(&self) -> &'static str {
        "cpu-records-mxfp4"
    }
    fn dtype(&self) -> &'static str {
        self.cpu.dtype()
    }
    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        self.cpu.to_host(t)
    }
    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        self.cpu.dims(t)
    }
    fn matrix_dims(&self, m: &CpuMatrix) -> (usize, usize) {
        self.cpu.matrix_dims(m)
    }
    fn from_host_impl(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        self.cpu.from_host_impl(data, rows, cols)
    }
    fn matrix_impl(&self, data: &[f32], out: usize, inp: usize) -> Result<CpuMatrix> {
        self.cpu.matrix_impl(data, out, inp)
    }
    fn matrix_mxfp4_impl(
        &self,
        blocks: &[u8],
        scales: &[u8],
        out: usize,
        inp: usize,
    ) -> Result<CpuMatrix> {
        let call = (blocks.to_vec(), scales.to_vec(), out, inp);
        self.calls.lock().unwrap().push(call);
        self.cpu.matrix_mxfp4_impl(blocks, scales, out, inp)
    }
    fn matmul_impl(&self, x: &CpuTensor, w: &CpuMatrix) -> Result<CpuTensor> {
        self.cpu.matmul_impl(x, w)
    }
    fn add_row_bias_impl(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<()> {
        self.cpu.add_row_bias_impl(x, bias)
    }
    fn add_inplace_impl(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        self.cpu.add_inplace_impl(x, y)
    }
    fn rms_norm_impl(&self, x: &CpuTensor, w: &CpuTensor, eps: f32, g: usize) -> Result<CpuTensor> {
        self.cpu.rms_norm_impl(x, w, eps, g)
    }
    fn rope_inplace_impl(&self, x: &mut CpuTensor, positions: &[u32], rope: &Rope) -> Result<()> {
        self.cpu.rope_inplace_impl(x, positions, rope)
    }
    fn attention_impl(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: AttnShape,
        mask: &AttnMask,
    ) -> Result<CpuTensor> {
        self.cpu.attention_impl(q, k, v, shape, mask)
    }
    fn swiglu_impl(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        self.cpu.swiglu_impl(gate, up)
    }
    fn embed_impl(&self, table: &CpuMatrix, ids: &[u32]) -> Result<CpuTensor> {
        self.cpu.embed_impl(table, ids)
    }
    fn concat_rows_impl(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        self.cpu.concat_rows_impl(parts)
    }
    fn concat_cols_impl(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        self.cpu.concat_cols_impl(parts)
    }
    fn split_cols_impl(&self, x: &CpuTensor, widths: &[usize]) -> Result<Vec<CpuTensor>> {
        self.cpu.split_cols_impl(x, widths)
    }
    fn slice_rows_impl(&self, x: &CpuTensor, start: usize, end: usize) -> Result<CpuTensor> {
        self.cpu.slice_rows_impl(x, start, end)
    }
    fn gather_rows_impl(&self, x: &CpuTensor, rows: &[u32]) -> Result<CpuTensor> {
        self.cpu.gather_rows_impl(x, rows)
    }
    fn lm_head_topk_impl(&self, x: &CpuTensor, head: &CpuMatrix, k: usize) -> Result<TopK> {
        self.cpu.lm_head_topk_impl(x, head, k)
    }
    fn supports_attention_sinks(&self) -> bool {
        self.cpu.supports_attention_sinks()
    }
}

/// Load `files` through [`RecordsMxfp4`]: its `matrix_mxfp4` calls in load order.
fn mxfp4_calls(files: &TargetFiles) -> Vec<Mxfp4Call> {
    let be = RecordsMxfp4 {
        cpu: CpuBackend::new(),
        calls: Mutex::default(),
    };
    TargetModel::load(&be, &files.spec, files.weights.as_ref()).unwrap();
    be.calls.into_inner().unwrap()
}

/// The GGUF's MXFP4 experts reach the backend as MXFP4 bytes (`Backend::matrix_mxfp4`), each
/// expert's gate | up and down, whose values are those the GGUF source dequantises (ggml's
/// reading: what the loader uploaded as f32 before), and whose bytes are the MXFP4 folder's
/// (its gate_up rows de-interleaved): the converter's repacking undone exactly. BF16 experts
/// and an expert with an exponent of 255 (2^127 to ggml, NaN to the packed path) go as values.
#[test]
fn gguf_mxfp4_experts_reach_the_backend_as_the_folders_mxfp4_bytes() {
    let (e, i, d) = (8usize, 32usize, 32usize);
    let (_dir, path) = write(Experts::Mxfp4, |_, _| {});
    let gguf = TargetFiles::open(&path).unwrap();
    let calls = mxfp4_calls(&gguf);
    // Per layer, per expert: gate | up [2I, D], then down [D, I].
    assert_eq!(calls.len(), 4 * e * 2);
    let mut next = calls.iter();
    for l in 0..4 {
        for x in 0..e {
            let w = |proj: &str| {
                let name = format!("model.layers.{l}.mlp.experts.{x}.{proj}.weight");
                gguf.weights.tensor(&name).unwrap().data
            };
            let gate_up = [w("gate_proj"), w("up_proj")].concat();
            for (want, shape) in [(gate_up, (2 * i, d)), (w("down_proj"), (d, i))] {
                let (blocks, scales, out, inp) = next.next().unwrap();
                assert_eq!((*out, *inp), shape, "layer {l} expert {x}");
                let got = draftlens_engine::backend::mxfp4::dequantize(blocks, scales).unwrap();
                // f32 equality: ggml reads code 8 as +0, the MXFP4 table as -0 (equal values).
                assert!(got == want, "layer {l} expert {x} {shape:?}: values differ");
            }
        }
    }
    let folder = mxfp4_calls(&open_folder("gpt_oss_mxfp4"));
    assert!(calls == folder, "the folder's bytes");

    let (_dir, path) = write(Experts::Bf16, |_, _| {});
    assert!(mxfp4_calls(&TargetFiles::open(&path).unwrap()).is_empty());

    let (_dir, path) = write(Experts::Mxfp4, |_, t| {
        // Layer 0's gate stack, expert 0, row 0: its first block's exponent.
        tensor_mut(t, "blk.0.ffn_gate_exps.weight").data[0] = 255;
    });
    let f = TargetFiles::open(&path).unwrap();
    let calls = mxfp4_calls(&f);
    assert_eq!(calls.len(), 4 * e * 2 - 1);
    assert_eq!(
        (calls[0].2, calls[1].2),
        (d, 2 * i),
        "expert 0's down, expert 1's gate | up"
    );
    let gate = f
        .weights
        .tensor("model.layers.0.mlp.experts.0.gate_proj.weight")
        .unwrap();
    assert!(
        gate.data[..32].iter().any(|v| v.abs() >= 2f32.powi(126)),
        "2^127 scales"
    );
}

/// The CUDA memory estimate counts a GGUF's MXFP4 experts as it counts the MXFP4 folder's: packed
/// (17 bytes per 32 values) by default, dequantised with `DRAFTLENS_MXFP4=bf16`; BF16 experts,
/// or a file whose expert stacks mix types, count as dequantised.
#[test]
fn the_cuda_estimate_counts_gguf_mxfp4_experts_as_the_folders() {
    let (_dir, path) = write(Experts::Mxfp4, |_, _| {});
    let gguf = TargetFiles::open(&path).unwrap();
    let folder = open_folder("gpt_oss_mxfp4");
    assert!(gguf.mxfp4_experts() && folder.mxfp4_experts());
    for packed in [true, false] {
        let ours = MemoryModel::with_mxfp4_experts(&gguf.spec, "bf16", packed, true);
        let theirs = MemoryModel::with_mxfp4(&folder.spec, "bf16", packed);
        assert_eq!(
            (ours.weights, &ours.weights_as),
            (theirs.weights, &theirs.weights_as),
            "packed {packed}"
        );
    }
    let packed = MemoryModel::with_mxfp4_experts(&gguf.spec, "bf16", true, true);
    assert_eq!(packed.weights_as, "bf16; its MXFP4 experts kept packed");
    assert!(packed.weights < MemoryModel::new(&gguf.spec, "bf16").weights);

    let (_dir, path) = write(Experts::Bf16, |_, _| {});
    let bf16 = TargetFiles::open(&path).unwrap();
    let (_dir, path) = write(Experts::Mxfp4, |_, t| {
        let x = tensor_mut(t, "blk.2.ffn_down_exps.weight");
        x.ty = GGML_F32;
        x.data = vec![0u8; 32 * 32 * 8 * 4];
    });
    let mixed = TargetFiles::open(&path).unwrap();
    for f in [&bf16, &mixed] {
        assert!(!f.mxfp4_experts());
        let m = MemoryModel::with_mxfp4_experts(&f.spec, "bf16", true, f.mxfp4_experts());
        assert_eq!(m.weights, MemoryModel::new(&f.spec, "bf16").weights);
        assert_eq!(m.weights_as, "bf16");
    }
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
        (
            // An MXFP4 stack whose rows are not whole blocks of 32 values.
            Box::new(|_, t| tensor_mut(t, "blk.1.ffn_down_exps.weight").ne[0] = 48),
            vec!["tensor blk.1.ffn_down_exps.weight: row length 48 is not a multiple of the MXFP4 block size 32"],
        ),
        (
            Box::new(|_, t| {
                // An MXFP4 stack with fewer bytes than rows × (cols / 32) × 17 (last in the
                // file, so that the file ends before its data does).
                let at = t
                    .iter()
                    .position(|x| x.name == "blk.3.ffn_down_exps.weight")
                    .unwrap();
                let mut x = t.remove(at);
                x.data.truncate(x.data.len() - 3 * 17);
                t.push(x);
            }),
            vec![
                "tensor blk.3.ffn_down_exps.weight data (offset ",
                " + 4352 bytes after the data section",
                "runs past the end of the file",
            ],
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
