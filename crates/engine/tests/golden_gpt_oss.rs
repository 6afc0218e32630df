//! The CPU backend against Hugging Face transformers on a random-weight gpt-oss
//! (tests/fixtures/golden/gpt_oss, made by tools/golden/make_gpt_oss_golden.py with transformers
//! 5.17 in fp32, eager attention and the eager expert loop), from both of its checkpoints: bf16
//! with fused experts (`gpt_oss/`) and MXFP4 expert blocks (`gpt_oss_mxfp4/`, the same weights
//! exactly); MXFP4 dequantisation against transformers' on random blocks; and gpt-oss
//! checkpoints that disagree with their config, each refused at open with one message naming the
//! file and the tensor or key.
//!
//! The model: 4 layers sliding (window 8) / full / sliding / full, heads of 64 with sinks, q/k/v/o
//! biases, YaRN (factor 32, original 4096, truncate false), 8 experts of width 32, top-4 with a
//! router bias, the clamped SwiGLU reaching its limit. Prompts of 20 and 27 tokens (longer than
//! the window) and their 64-token greedy continuations.

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::formats::mxfp4::dequantize_into;
use draftlens_engine::generate::greedy_batch;
use draftlens_engine::model::gpt_oss::{rope_freqs, AttentionKind};
use draftlens_engine::model::{Arch, Capture, TargetFiles, TargetModel};
use golden_util::*;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

/// ‖ours − ref‖/‖ref‖ per captured layer: the weights are bf16 values f32 holds exactly and the
/// reference is fp32, so the differences are f32 summation order (GEMMs, softmax sums, the
/// expert sum in transformers' order) and the reference's f16 storage (≤ 4.9e-4 per element,
/// ~3e-4 in norm). The bounds of the other goldens; the bugs they guard against (a missing
/// sink, a window off by one, gate and up swapped, the clamp missing, the router bias dropped,
/// YaRN's scale missing) give errors ≥ 1e-2.
const REL_TOL: f64 = 1e-3;
/// The same after rounding ours to f16 as the reference was stored.
const REL_TOL_F16: f64 = 1.5e-4;
/// Last-position top-8 log-probs (stored f32).
const LOGPROB_TOL: f32 = 5e-4;
const NEW_TOKENS: usize = 64;
/// Packed with the other prompt against alone: the CPU GEMM may block an expert's rows
/// differently when it gets more rows (docs/moe-models.md, "Row independence").
const PACKED_REL_TOL: f64 = 1e-5;

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/golden").join(name)
}

fn manifest() -> serde_json::Value {
    json(&fixture("gpt_oss").join("manifest.json"))
}

/// Open a folder whose model.safetensors must be the one the goldens were made from.
fn open(name: &str, sha_key: &str) -> (TargetFiles, TargetModel<CpuBackend>) {
    let dir = fixture(name);
    let wsha = draftlens_engine::util::sha256_file(&dir.join("model.safetensors")).unwrap();
    assert_eq!(
        manifest()[sha_key].as_str().unwrap(),
        wsha,
        "{name}: model.safetensors is not the file the golden was made from"
    );
    let files = TargetFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let model = TargetModel::load(&CpuBackend::new(), &files.spec, files.weights.as_ref())
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    (files, model)
}

fn golden() -> Golden {
    Golden::open(fixture("gpt_oss").join("golden.safetensors"))
}

/// Every golden prompt: hidden states, top-8, 64 greedy tokens (golden_util); packed prefill of
/// both prompts against each alone, and batched greedy decoding.
fn check_goldens(label: &str, model: &TargetModel<CpuBackend>) {
    let m = manifest();
    let nl = model.spec.num_layers;
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices((0..=nl).collect(), nl).unwrap()
    };
    let g = golden();
    let n = m["prompts"].as_array().unwrap().len();
    assert_eq!(n, 2);
    let tol = Tolerances {
        rel: REL_TOL,
        rel_f16: REL_TOL_F16,
        logprob: LOGPROB_TOL,
    };
    let (mut worst, mut worst16, mut worst_lp) = (0f64, 0f64, 0f32);
    for p in 0..n {
        let (w, w16, wlp) = check_golden_prompt(label, p, &g, model, &capture, NEW_TOKENS, &tol);
        worst = worst.max(w);
        worst16 = worst16.max(w16);
        worst_lp = worst_lp.max(wlp);
    }
    eprintln!("{label}: worst rel {worst:.2e} (f16-rounded {worst16:.2e}), top-8 log-prob max |Δ| {worst_lp:.2e}");

    let be = CpuBackend::new();
    let prompts: Vec<Vec<u32>> = (0..n).map(|p| g.ids(&format!("p{p}.input_ids"))).collect();
    let window = model.spec.gpt_oss.as_ref().unwrap().sliding_window.unwrap();
    assert!(
        prompts.iter().all(|p| p.len() > window),
        "prompts exceed the window"
    );
    for (i, rel) in packed_vs_alone(model, &prompts).into_iter().enumerate() {
        assert!(
            rel < PACKED_REL_TOL,
            "{label}: prompt {i} packed with the other differs from alone: rel {rel:.2e}"
        );
    }
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let batch = greedy_batch(&be, model, &refs, 16, &[]).unwrap();
    for (i, c) in batch.iter().enumerate() {
        assert_eq!(
            c.ids,
            g.ids(&format!("p{i}.greedy_ids"))[..16],
            "{label}: prompt {i} decoded in a batch"
        );
    }
}

#[test]
fn gpt_oss_bf16_fused_experts_match_transformers() {
    let (files, model) = open("gpt_oss", "weights_sha256");
    let s = &files.spec;
    assert_eq!(s.arch, Arch::GptOss);
    assert_eq!((s.head_dim, s.num_heads, s.num_kv_heads), (64, 2, 1));
    let g = s.gpt_oss.as_ref().unwrap();
    use AttentionKind::*;
    assert_eq!(
        g.layer_types,
        [
            SlidingAttention,
            FullAttention,
            SlidingAttention,
            FullAttention
        ]
    );
    assert_eq!(g.sliding_window, Some(8));
    assert!(g.quant_method.is_none(), "bf16 checkpoint");
    let m = s.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size
        ),
        (8, 4, 32)
    );
    // transformers' YaRN frequencies and scale (GptOssRotaryEmbedding).
    let freqs = rope_freqs(s, g);
    let (shape, want) = golden().f32("rope.inv_freq");
    assert_eq!(shape, [32]);
    for (i, (a, b)) in freqs.inv_freq.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 2.0 * f32::EPSILON * b.abs(),
            "inv_freq[{i}]: {a} vs transformers' {b}"
        );
    }
    let scaling = manifest()["rope"]["attention_scaling"].as_f64().unwrap();
    assert_eq!(freqs.attention_scaling, scaling as f32);
    check_goldens("gpt_oss (bf16, fused experts)", &model);
}

#[test]
fn gpt_oss_mxfp4_checkpoint_is_the_same_model() {
    let (files, model) = open("gpt_oss_mxfp4", "mxfp4_weights_sha256");
    let g = files.spec.gpt_oss.as_ref().unwrap();
    assert_eq!(g.quant_method.as_deref(), Some("mxfp4"));
    assert!(files
        .weights
        .contains("model.layers.3.mlp.experts.down_proj_blocks"));
    // The published spelling (rope_scaling + rope_theta) reads as the bf16 folder's
    // rope_parameters.
    let (bf16_files, bf16_model) = open("gpt_oss", "weights_sha256");
    assert_eq!(
        files.spec.gpt_oss.as_ref().unwrap().yarn,
        bf16_files.spec.gpt_oss.as_ref().unwrap().yarn
    );
    assert_eq!(files.spec.rope_theta, bf16_files.spec.rope_theta);
    // Exact dequantisation: the same f32 weights, so the same bits out of every layer.
    let be = CpuBackend::new();
    let ids = golden().ids("p1.input_ids");
    let cap = Capture::hf_indices(vec![1, 2, 3, 4], 4).unwrap();
    let a = model
        .forward(&be, &ids, &mut model.new_cache(), &cap)
        .unwrap();
    let b = bf16_model
        .forward(&be, &ids, &mut bf16_model.new_cache(), &cap)
        .unwrap();
    for k in 1..=4 {
        assert_eq!(
            be.to_host(a.captured.get(k).unwrap()).unwrap(),
            be.to_host(b.captured.get(k).unwrap()).unwrap(),
            "hidden state {k}"
        );
    }
    check_goldens("gpt_oss (MXFP4 experts)", &model);
}

#[test]
fn mxfp4_dequantisation_equals_transformers() {
    let bytes = std::fs::read(fixture("gpt_oss").join("mxfp4_layout.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (blocks, scales, want) = (
        st.tensor("blocks").unwrap(),
        st.tensor("scales").unwrap(),
        st.tensor("dequantized").unwrap(),
    );
    assert_eq!(blocks.shape(), [2, 4, 3, 16]);
    assert_eq!(want.shape(), [2, 96, 4], "transformers' [E, C, R]");
    let want: Vec<f32> = want
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let (r, c) = (4, 96);
    for e in 0..2 {
        let mut ours = vec![0f32; r * c];
        dequantize_into(
            &blocks.data()[e * r * c / 2..(e + 1) * r * c / 2],
            &scales.data()[e * r * c / 32..(e + 1) * r * c / 32],
            &mut ours,
        )
        .unwrap();
        for row in 0..r {
            for col in 0..c {
                let theirs = want[e * c * r + col * r + row];
                assert_eq!(
                    ours[row * c + col].to_bits(),
                    theirs.to_bits(),
                    "expert {e} row {row} col {col}"
                );
            }
        }
    }
}

// ---- Checkpoints that disagree with their config ----

/// The MXFP4 fixture's tensors, as (name, dtype, shape, bytes).
type Stored = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn stored(name: &str) -> Stored {
    let bytes = std::fs::read(fixture(name).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Stored = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A copy of fixture folder `name` with its tensors after `edit` and its config after `config`.
fn edited(
    name: &str,
    edit: impl FnOnce(&mut Stored),
    config: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut t = stored(name);
    edit(&mut t);
    let views: Vec<(String, TensorView<'_>)> = t
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    let mut c = json(&fixture(name).join("config.json"));
    config(&mut c);
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    dir
}

fn open_err(dir: &Path) -> String {
    match TargetFiles::open(dir) {
        Ok(_) => panic!("{}: accepted", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

fn no_edit(_: &mut serde_json::Value) {}

#[test]
fn bad_gpt_oss_checkpoints_are_one_clear_error_naming_the_tensor_or_key() {
    let gu = "model.layers.0.mlp.experts.gate_up_proj";
    type Case = (
        &'static str,
        Box<dyn FnOnce(&mut Stored)>,
        Box<dyn FnOnce(&mut serde_json::Value)>,
        Vec<String>,
    );
    let cases: Vec<Case> = vec![
        (
            "gpt_oss_mxfp4",
            Box::new(move |t| {
                // Scales of one group too many: [8, 64, 2] for blocks [8, 64, 1, 16].
                let s = t.iter_mut().find(|x| x.0 == format!("{gu}_scales")).unwrap();
                s.2[2] = 2;
                s.3.extend(vec![127u8; 8 * 64]);
            }),
            Box::new(no_edit),
            vec![
                format!("tensors {gu}_blocks [8, 64, 1, 16] and {gu}_scales [8, 64, 2] do not fit each other"),
            ],
        ),
        (
            "gpt_oss_mxfp4",
            Box::new(|_| {}),
            Box::new(|c| c["quantization_config"]["quant_method"] = "fp8".into()),
            vec!["config.json: quantization_config.quant_method \"fp8\" is not supported for gpt_oss".into()],
        ),
        (
            "gpt_oss",
            Box::new(|t| t.retain(|x| x.0 != "model.layers.2.mlp.router.bias")),
            Box::new(no_edit),
            vec!["tensor model.layers.2.mlp.router.bias is missing: gpt-oss's router (GptOssTopKRouter) is a linear layer with a bias".into()],
        ),
        (
            "gpt_oss",
            Box::new(|_| {}),
            Box::new(|c| c["num_local_experts"] = 16.into()),
            vec!["tensor model.layers.0.mlp.experts.down_proj (model.layers.0.mlp.experts.down_proj) has shape [8, 32, 32]: 8 experts, but config.json says num_local_experts = 16".into()],
        ),
        (
            "gpt_oss",
            Box::new(|_| {}),
            Box::new(|c| c["num_experts"] = 4.into()),
            vec!["num_local_experts 8 and num_experts 4 disagree".into()],
        ),
        (
            "gpt_oss_mxfp4",
            Box::new(move |t| {
                // One layer's down_proj blocks hold 4 experts instead of 8.
                let b = t
                    .iter_mut()
                    .find(|x| x.0 == "model.layers.1.mlp.experts.down_proj_blocks")
                    .unwrap();
                b.2[0] = 4;
                b.3.truncate(b.3.len() / 2);
            }),
            Box::new(no_edit),
            vec!["tensor model.layers.1.mlp.experts.down_proj_blocks".into(), "4 experts, but config.json says num_local_experts = 8".into()],
        ),
        (
            "gpt_oss",
            Box::new(|_| {}),
            Box::new(|c| c["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"})),
            vec!["tensor model.layers.0.mlp.experts.down_proj (model.layers.0.mlp.experts.down_proj) is stored unquantised, but config.json says quantization_config.quant_method \"mxfp4\"".into()],
        ),
        (
            "gpt_oss_mxfp4",
            Box::new(|_| {}),
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("quantization_config");
            }),
            vec!["holds MXFP4 blocks, but config.json has no quantization_config".into()],
        ),
        (
            "gpt_oss",
            Box::new(|t| t.retain(|x| x.0 != "model.layers.1.mlp.router.weight")),
            Box::new(no_edit),
            vec!["tensor model.layers.1.mlp.router.weight is missing".into()],
        ),
        (
            "gpt_oss_mxfp4",
            Box::new(move |t| t.retain(|x| x.0 != format!("{gu}_blocks"))),
            Box::new(no_edit),
            vec![format!("tensor {gu}_blocks is missing")],
        ),
        (
            "gpt_oss",
            Box::new(|_| {}),
            Box::new(|c| c["num_experts_per_tok"] = 9.into()),
            vec!["config.json: num_experts_per_tok 9 must be between 1 and num_experts (8)".into()],
        ),
        (
            "gpt_oss",
            Box::new(|t| {
                let x = t.iter().find(|x| x.0.ends_with("layers.0.mlp.router.weight")).unwrap().clone();
                t.push(("model.layers.0.mlp.experts.0.gate_proj.weight".into(), x.1, vec![8, 32], x.3));
            }),
            Box::new(no_edit),
            vec!["tensor model.layers.0.mlp.experts.0.gate_proj.weight".into(), "is a per-expert tensor".into()],
        ),
    ];
    let cases = cases.into_iter().chain([(
        "gpt_oss_mxfp4",
        Box::new(|t: &mut Stored| {
            let b = t
                .iter_mut()
                .find(|x| x.0 == "model.layers.0.mlp.experts.down_proj_blocks")
                .unwrap();
            b.1 = Dtype::I8;
        }) as Box<dyn FnOnce(&mut Stored)>,
        Box::new(no_edit) as Box<dyn FnOnce(&mut serde_json::Value)>,
        vec!["tensor model.layers.0.mlp.experts.down_proj_blocks (model.layers.0.mlp.experts.down_proj_blocks) has dtype I8; MXFP4 blocks and scales are U8".to_string()],
    )]);
    for (base, edit, config, want) in cases {
        let dir = edited(base, edit, config);
        let err = open_err(dir.path());
        assert!(
            err.starts_with(&dir.path().display().to_string()),
            "names the folder: {err}"
        );
        for w in &want {
            assert!(err.contains(w.as_str()), "{base}: expected {w:?} in {err}");
        }
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }

    // A scale of 255 (NaN in e8m0) passes the header checks and is refused at load, naming it.
    let dir = edited(
        "gpt_oss_mxfp4",
        |t| {
            let s = t
                .iter_mut()
                .find(|x| x.0 == "model.layers.3.mlp.experts.down_proj_scales")
                .unwrap();
            s.3[5] = 255;
        },
        no_edit,
    );
    let files = TargetFiles::open(dir.path()).unwrap();
    let err = match TargetModel::load(&CpuBackend::new(), &files.spec, files.weights.as_ref()) {
        Ok(_) => panic!("a NaN scale was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("model.layers.3.mlp.experts.down_proj_scales holds 255 (not a number in e8m0) at expert 0, row 5, group 0"),
        "{err}"
    );
}

// ---- Tokenizer ----

/// A tokenizer folder: a word-level vocabulary of `words` then the special tokens `specials`,
/// with tokenizer_config.json's eos token and generation_config.json's `eos_token_id` list.
fn tokenizer_folder(specials: &[&str], eos: &str, gen_eos: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let words = ["hello", "world", "[UNK]"];
    let mut vocab = serde_json::Map::new();
    for (i, w) in words.iter().enumerate() {
        vocab.insert(w.to_string(), i.into());
    }
    let id = |t: &str| words.len() + specials.iter().position(|s| *s == t).unwrap();
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|t| {
            serde_json::json!({"id": id(t), "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tok = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}});
    let write = |name: &str, v: serde_json::Value| {
        std::fs::write(dir.path().join(name), v.to_string()).unwrap()
    };
    write("tokenizer.json", tok);
    write(
        "tokenizer_config.json",
        serde_json::json!({"eos_token": eos}),
    );
    let gen: Vec<usize> = gen_eos.iter().map(|t| id(t)).collect();
    write(
        "generation_config.json",
        serde_json::json!({ "eos_token_id": gen }),
    );
    dir
}

/// gpt-oss's o200k_harmony: generation ends at `<|return|>` or `<|call|>` (generation_config),
/// not at `<|end|>`, which closes the analysis message before the final one (llama.cpp's
/// workaround); a vocabulary without them keeps `<|end|>` as an end of generation (Phi-3).
#[test]
fn harmony_messages_end_with_end_but_generation_with_return_or_call() {
    use draftlens_engine::tokenizer::TextTokenizer;
    let harmony = [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ];
    // Ids: 3 words, then the specials in order: <|endoftext|> 4, <|return|> 5, <|end|> 9,
    // <|call|> 11.
    let dir = tokenizer_folder(
        &harmony,
        "<|return|>",
        &["<|return|>", "<|endoftext|>", "<|call|>"],
    );
    let t = TextTokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(
        t.eos_ids(),
        [4, 5, 11],
        "<|endoftext|>, <|return|>, <|call|>"
    );
    let ids = t.encode(
        "<|start|>assistant<|channel|>final<|message|>hello<|end|>",
        false,
    );
    let ids = ids.unwrap();
    assert!(
        ids.contains(&9) && ids.contains(&8),
        "special tokens are single ids: {ids:?}"
    );
    // Phi-3 style: <|end|> without <|return|> / <|call|> still ends generation.
    let dir = tokenizer_folder(&["<|endoftext|>", "<|end|>"], "<|endoftext|>", &[]);
    let t = TextTokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(t.eos_ids(), [3, 4]);
}
