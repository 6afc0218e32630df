//! The hybrid goldens read from GGUF: tests/fixtures/golden/{qwen3_5,qwen3_next}/model.gguf were
//! written from the committed safetensors by tools/golden/make_hybrid_gguf.py with gguf-py (the
//! package llama.cpp's converter writes with), applying the converter's transformations
//! (docs/hybrid-models.md, "GGUF files"): qwen3_5 in BF16 with value heads tiled, qwen3_next in
//! F16 with the fused qkvz split. Each must load to the safetensors model's spec and tensors and
//! reproduce the transformers golden (hidden states, top-8, 64 greedy tokens). Then bad input:
//! the same files with a recurrent-state tensor dropped or a size key changed.

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::formats::gguf::{GgufFile, GgufValue};
use draftlens_engine::model::{Capture, TargetFiles, TargetModel};
use golden_util::gguf_write::{put_str, put_value, type_id};
use golden_util::*;
use std::path::{Path, PathBuf};

/// Same tolerances as golden_hybrid.rs (argued there): the GGUF weights are the safetensors
/// values except A_log (ln(−ssm_a) of the stored −exp(A_log): ≤ 2 f32 ulps) and, in the F16
/// qwen3_next file, 12 weights below f16's normal range (≤ 3e-8 absolute): both far below the
/// f32 summation-order noise these bounds already allow.
const TOL: Tolerances = Tolerances {
    rel: 1e-3,
    rel_f16: 1.5e-4,
    logprob: 5e-4,
};
/// Largest |GGUF tensor − safetensors tensor| allowed per element: A_log's exp/ln round trip
/// (values ~1, 2 ulps ≈ 2.4e-7), norms stored as 1 + w (≤ 6e-8), f16 flushes (≤ 3e-8). A wrong
/// mapping (heads in the wrong order, a missed +1, q/k/v/z mixed up) moves values by ≥ 1e-2.
const TENSOR_TOL: f32 = 1e-6;

fn golden_dir(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/golden").join(name)
}

fn check(name: &str) {
    let dir = golden_dir(name);
    let gguf = TargetFiles::open(&dir.join("model.gguf")).unwrap_or_else(|e| panic!("{e:#}"));
    let hf = TargetFiles::open(&dir).unwrap();
    assert_eq!(gguf.identity.format, "gguf");
    assert_eq!(
        gguf.spec, hf.spec,
        "{name}: GGUF metadata gives the config.json spec"
    );

    // Same HF tensor names and shapes, same values.
    let names = |f: &TargetFiles| {
        let mut v: Vec<(String, Vec<usize>)> = f
            .weights
            .tensors()
            .into_iter()
            .map(|t| (t.name, t.shape))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&gguf), names(&hf), "{name}: tensor names and shapes");
    for (t, _) in names(&hf) {
        let a = gguf.weights.tensor(&t).unwrap();
        let b = hf.weights.tensor(&t).unwrap();
        assert_eq!(a.shape, b.shape, "{name} {t}");
        let worst = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= TENSOR_TOL,
            "{name} {t}: max |GGUF − safetensors| {worst:.2e}"
        );
    }

    // The transformers golden, exactly as golden_hybrid.rs checks the safetensors model.
    let be = CpuBackend::new();
    let model = TargetModel::load(&be, &gguf.spec, gguf.weights.as_ref()).unwrap();
    let nl = gguf.spec.num_layers;
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices((0..=nl).collect(), nl).unwrap()
    };
    let g = Golden::open(dir.join("golden.safetensors"));
    let manifest = json(&dir.join("manifest.json"));
    let n_prompts = manifest["prompts"].as_array().unwrap().len();
    assert!(n_prompts > 0);
    for p in 0..n_prompts {
        let (w, w16, lp) = check_golden_prompt(name, p, &g, &model, &capture, 64, &TOL);
        eprintln!("{name}.gguf prompt {p}: worst rel {w:.2e} (f16 {w16:.2e}), log-prob {lp:.2e}");
    }
}

#[test]
fn qwen3_5_gguf_matches_the_golden() {
    check("qwen3_5");
    // BF16 as the converter writes a bf16 checkpoint by default; the file is what the script made.
    let f = GgufFile::open(&golden_dir("qwen3_5").join("model.gguf")).unwrap();
    assert_eq!(f.architecture(), Some("qwen35"));
    assert_eq!(
        f.tensor_info("blk.0.attn_qkv.weight").unwrap().ty.name(),
        "BF16"
    );
}

#[test]
fn qwen3_next_gguf_matches_the_golden() {
    check("qwen3_next");
    let f = GgufFile::open(&golden_dir("qwen3_next").join("model.gguf")).unwrap();
    assert_eq!(f.architecture(), Some("qwen3next"));
    assert_eq!(
        f.tensor_info("blk.0.ssm_ba.weight").unwrap().ty.name(),
        "F16"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input: rewrite a golden GGUF with one change.

/// One change to a GGUF file.
enum Edit<'a> {
    None,
    DropTensor(&'a str),
    DropKey(&'a str),
    Set(&'a str, GgufValue),
}

/// `src` re-serialised (GGUF v3, same alignment) with `edit` applied.
fn rewrite(src: &Path, dst: &Path, edit: Edit) {
    let f = GgufFile::open(src).unwrap();
    let mut meta = f.metadata().clone();
    let mut drop = None;
    match edit {
        Edit::None => {}
        Edit::DropTensor(t) => drop = Some(t),
        Edit::DropKey(k) => assert!(meta.remove(k).is_some(), "{k}"),
        Edit::Set(k, v) => {
            meta.insert(k.to_string(), v);
        }
    }
    let tensors: Vec<_> = f
        .tensors()
        .iter()
        .filter(|t| Some(t.name.as_str()) != drop)
        .collect();
    let align = f.alignment() as usize;
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in &meta {
        put_str(&mut out, k);
        out.extend(type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0usize;
    for t in &tensors {
        put_str(&mut out, &t.name);
        out.extend((t.ne.len() as u32).to_le_bytes());
        t.ne.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(t.ty.id().to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset += (t.n_bytes as usize).div_ceil(align) * align;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for t in &tensors {
        out.extend(f.tensor_data(t));
        out.resize(out.len().div_ceil(align) * align, 0);
    }
    std::fs::write(dst, out).unwrap();
}

fn open_err(path: &Path) -> String {
    match TargetFiles::open(path) {
        Ok(_) => panic!("{}: opened, expected an error", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn rewritten_file_is_still_good() {
    // The rewriter itself changes nothing when asked for nothing (so the errors below are the
    // changes' doing).
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("same.gguf");
    rewrite(&golden_dir("qwen3_5").join("model.gguf"), &p, Edit::None);
    let f = TargetFiles::open(&p).unwrap();
    assert_eq!(
        f.spec,
        TargetFiles::open(&golden_dir("qwen3_5")).unwrap().spec
    );
}

#[test]
fn missing_ssm_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, tensor) in [
        ("qwen3_5", "blk.3.ssm_a"),
        ("qwen3_5", "blk.0.ssm_beta.weight"),
        ("qwen3_next", "blk.1.ssm_ba.weight"),
        ("qwen3_next", "blk.4.ssm_conv1d.weight"),
    ] {
        let p = tmp.path().join(format!("{model}-{tensor}.gguf"));
        rewrite(
            &golden_dir(model).join("model.gguf"),
            &p,
            Edit::DropTensor(tensor),
        );
        let e = open_err(&p);
        assert!(
            e.contains(&format!("tensor {tensor} is missing")) && e.contains(p.to_str().unwrap()),
            "{e}"
        );
    }
}

#[test]
fn inconsistent_sizes_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = golden_dir("qwen3_5").join("model.gguf");
    let cases: [(&str, GgufValue, &[&str]); 5] = [
        // dv = 96 / 4 = 24 instead of 16: the stored projections disagree; the error names the
        // tensor in both spellings.
        (
            "qwen35.ssm.inner_size",
            GgufValue::U32(96),
            &[
                "linear_attn.in_proj_qkv.weight",
                "blk.0.attn_qkv.weight",
                "[128, 64]",
                "[160, 64]",
            ],
        ),
        (
            "qwen35.ssm.inner_size",
            GgufValue::U32(66),
            &[
                "qwen35.ssm.inner_size = 66",
                "qwen35.ssm.time_step_rank = 4",
            ],
        ),
        (
            "qwen35.ssm.group_count",
            GgufValue::U32(3),
            &[
                "qwen35.ssm.time_step_rank = 4",
                "qwen35.ssm.group_count = 3",
            ],
        ),
        (
            "qwen35.ssm.conv_kernel",
            GgufValue::U32(3),
            &["linear_attn.conv1d.weight", "blk.0.ssm_conv1d.weight"],
        ),
        (
            "qwen35.expert_count",
            GgufValue::U32(8),
            &["qwen35.expert_count = 8", "mixture of experts"],
        ),
    ];
    for (i, (key, value, want)) in cases.into_iter().enumerate() {
        let p = tmp.path().join(format!("bad{i}.gguf"));
        rewrite(&src, &p, Edit::Set(key, value));
        let e = open_err(&p);
        for w in want {
            assert!(e.contains(w), "{key}: {e:?} lacks {w:?}");
        }
    }
    // A key the hybrid needs, removed: named.
    let p = tmp.path().join("nokey.gguf");
    rewrite(&src, &p, Edit::DropKey("qwen35.ssm.group_count"));
    let e = open_err(&p);
    assert!(e.contains("qwen35.ssm.group_count is missing"), "{e}");
}

#[test]
fn mtp_blocks_are_not_decoder_layers() {
    // The converter appends a checkpoint's MTP layers as extra blocks and records their number in
    // nextn_predict_layers: block_count 7 with 1 MTP block is the same 6-layer model.
    let tmp = tempfile::tempdir().unwrap();
    let src = golden_dir("qwen3_5").join("model.gguf");
    let seven = tmp.path().join("seven.gguf");
    rewrite(
        &src,
        &seven,
        Edit::Set("qwen35.block_count", GgufValue::U32(7)),
    );
    let mtp = tmp.path().join("mtp.gguf");
    rewrite(
        &seven,
        &mtp,
        Edit::Set("qwen35.nextn_predict_layers", GgufValue::U32(1)),
    );
    assert_eq!(
        TargetFiles::open(&mtp).unwrap().spec,
        TargetFiles::open(&golden_dir("qwen3_5")).unwrap().spec
    );
    // Without it, block 6 is a decoder layer (a GDN one) whose tensors are missing.
    let e = open_err(&seven);
    assert!(e.contains("tensor blk.6.attn_qkv.weight is missing"), "{e}");
    // All blocks MTP: named.
    let all = tmp.path().join("all.gguf");
    rewrite(
        &src,
        &all,
        Edit::Set("qwen35.nextn_predict_layers", GgufValue::U32(6)),
    );
    let e = open_err(&all);
    assert!(
        e.contains("qwen35.nextn_predict_layers = 6") && e.contains("qwen35.block_count = 6"),
        "{e}"
    );
}
