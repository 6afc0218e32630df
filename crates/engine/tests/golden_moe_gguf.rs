//! The mixture-of-experts goldens read from GGUF files written by llama.cpp's own converter
//! (tests/fixtures/golden/moe_gguf/, tools/golden/make_moe_gguf.py: `convert_hf_to_gguf.py` of
//! llama-cpp-python 0.3.36 on the committed qwen3_moe and qwen3_5_moe checkpoints). Each file must
//! give the safetensors checkpoint's spec, tensor names and shapes, its values within the stored
//! type's rounding, and the transformers golden (every hidden state, top-8 log-probs, 64 greedy
//! tokens) within the bounds golden_moe.rs holds the checkpoint to; Q8_0 within bounds stated
//! below. Then bad input: the BF16 files with one expert tensor, key or router changed.

mod golden_util;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::Backend;
use draftlens_engine::formats::gguf::{GgufFile, GgufValue};
use draftlens_engine::model::{Arch, Capture, TargetFiles, TargetModel};
use golden_util::gguf_write::{put_str, put_value, type_id};
use golden_util::*;
use std::path::{Path, PathBuf};

/// golden_moe.rs's bounds (argued there). BF16 files hold the checkpoint's values exactly (and
/// the norms, routers and A_log as F32: exact, A_log ≤ 2 ulps); F16 moves 0 to a few weights below
/// f16's normal range by ≤ 3e-8: far below the f32 summation noise the bounds allow.
const TOL: Tolerances = Tolerances {
    rel: 1e-3,
    rel_f16: 1.5e-4,
    logprob: 5e-4,
};
/// Largest |GGUF − safetensors| per element for BF16 / F16 tensors (see [`TOL`]); a wrong expert
/// slice, a transposed stack or a missed `1 + w` moves values by ≥ 1e-2.
const TENSOR_TOL: f32 = 1e-6;
/// Q8_0 stores each block of 32 as int8 × an f16 scale amax/127: |Δ| ≤ amax/254 (rounding) +
/// amax·2⁻¹¹ (the scale's rounding) < amax/200 per block, amax ≤ the tensor's max |x|.
const Q8_REL_TO_MAX: f32 = 1.0 / 200.0;

fn golden_dir(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/golden").join(name)
}

fn gguf_path(file: &str) -> PathBuf {
    golden_dir("moe_gguf").join(file)
}

fn open(path: &Path) -> TargetFiles {
    TargetFiles::open(path).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Same spec, same HF tensor names and shapes, values within the stored type's rounding.
fn check_tensors(model: &str, gguf: &TargetFiles, hf: &TargetFiles) {
    assert_eq!(gguf.identity.format, "gguf");
    assert_eq!(
        gguf.spec, hf.spec,
        "{model}: GGUF metadata gives the config.json spec"
    );
    let listing = |f: &TargetFiles| {
        let mut v: Vec<(String, Vec<usize>, String)> = f
            .weights
            .tensors()
            .into_iter()
            .map(|t| (t.name, t.shape, t.dtype))
            .collect();
        v.sort();
        v
    };
    let (g, h) = (listing(gguf), listing(hf));
    let names = |v: &[(String, Vec<usize>, String)]| {
        v.iter()
            .map(|t| (t.0.clone(), t.1.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&g), names(&h), "{model}: tensor names and shapes");
    for (name, _, dtype) in &g {
        let a = gguf.weights.tensor(name).unwrap();
        let b = hf.weights.tensor(name).unwrap();
        assert_eq!(a.shape, b.shape, "{model} {name}");
        let worst = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let bound = match dtype.as_str() {
            "Q8_0" => b.data.iter().fold(0f32, |m, x| m.max(x.abs())) * Q8_REL_TO_MAX,
            _ => TENSOR_TOL,
        };
        assert!(
            worst <= bound,
            "{model} {name} ({dtype}): max |GGUF − safetensors| {worst:.2e} > {bound:.2e}"
        );
    }
}

/// The GGUF file at `path` against checkpoint `model` ([`check_tensors`]) and its transformers
/// golden with golden_moe.rs's bounds (every prompt: hidden states, top-8, 64 greedy tokens).
fn check_path(model: &str, path: &Path) -> TargetFiles {
    let label = path.file_name().unwrap().to_string_lossy().into_owned();
    let gguf = open(path);
    check_tensors(model, &gguf, &open(&golden_dir(model)));
    let be = CpuBackend::new();
    let m = TargetModel::load(&be, &gguf.spec, gguf.weights.as_ref()).unwrap();
    let nl = gguf.spec.num_layers;
    let capture = Capture {
        prenorm: true,
        ..Capture::hf_indices((0..=nl).collect(), nl).unwrap()
    };
    let g = Golden::open(golden_dir(model).join("golden.safetensors"));
    let n = json(&golden_dir(model).join("manifest.json"))["prompts"]
        .as_array()
        .unwrap()
        .len();
    assert!(n > 0);
    for p in 0..n {
        let (w, w16, lp) = check_golden_prompt(&label, p, &g, &m, &capture, 64, &TOL);
        eprintln!("{label} prompt {p}: worst rel {w:.2e} (f16 {w16:.2e}), log-prob {lp:.2e}");
    }
    gguf
}

fn check_golden(model: &str, file: &str) -> TargetFiles {
    check_path(model, &gguf_path(file))
}

fn tensor_type(file: &str, tensor: &str) -> String {
    let f = GgufFile::open(&gguf_path(file)).unwrap();
    f.tensor_info(tensor).unwrap().ty.name().to_string()
}

#[test]
fn qwen3_moe_bf16_gguf_matches_the_golden() {
    let f = check_golden("qwen3_moe", "qwen3_moe-bf16.gguf");
    assert_eq!(f.spec.arch, Arch::Qwen3Moe);
    let moe = f.spec.moe.as_ref().unwrap();
    // The dense layer (mlp_only_layers [1]) is read from its tensors: no router there.
    assert_eq!(moe.sparse_layers, [true, false, true]);
    assert_eq!((moe.num_experts, moe.num_experts_per_tok), (16, 8));
    assert_eq!(
        tensor_type("qwen3_moe-bf16.gguf", "blk.0.ffn_gate_exps.weight"),
        "BF16"
    );
}

#[test]
fn qwen3_5_moe_bf16_gguf_matches_the_golden() {
    let f = check_golden("qwen3_5_moe", "qwen3_5_moe-bf16.gguf");
    assert_eq!(f.spec.arch, Arch::Qwen3_5Moe);
    let moe = f.spec.moe.as_ref().unwrap();
    assert_eq!(moe.shared_expert_intermediate_size, Some(16));
    // The schedule comes from attention.recurrent_layers; full_attention_interval (4, the
    // transformers default the converter wrote) would make layer 2 a GDN layer.
    let file = GgufFile::open(&gguf_path("qwen3_5_moe-bf16.gguf")).unwrap();
    assert_eq!(file.get_u64("qwen35moe.full_attention_interval"), Some(4));
}

#[test]
fn qwen3_5_moe_f16_gguf_matches_the_golden() {
    check_golden("qwen3_5_moe", "qwen3_5_moe-f16.gguf");
    assert_eq!(
        tensor_type("qwen3_5_moe-f16.gguf", "blk.1.ffn_up_exps.weight"),
        "F16"
    );
}

/// Q8_0 (the converter keeps the routed experts' down projections, rows of 8 < one block of 32,
/// in F16, and routers and norms in F32). Every hidden state within 3e-2 relative of
/// transformers' (measured: 1.56e-2 and 1.53e-2 at worst on the two prompts) and the 64 greedy
/// tokens the golden's (measured: all 64 on both; the goldens' prompts have no top-2 gap under
/// 0.01, which the quantisation noise does not close).
#[test]
fn qwen3_moe_q8_0_gguf_is_close_to_the_golden() {
    let file = "qwen3_moe-q8_0.gguf";
    assert_eq!(tensor_type(file, "blk.0.ffn_gate_exps.weight"), "Q8_0");
    assert_eq!(tensor_type(file, "blk.0.ffn_down_exps.weight"), "F16");
    let gguf = open(&gguf_path(file));
    let hf = open(&golden_dir("qwen3_moe"));
    check_tensors("qwen3_moe", &gguf, &hf);
    let be = CpuBackend::new();
    let m = TargetModel::load(&be, &gguf.spec, gguf.weights.as_ref()).unwrap();
    let nl = gguf.spec.num_layers;
    let capture = Capture::hf_indices((0..=nl).collect(), nl).unwrap();
    let g = Golden::open(golden_dir("qwen3_moe").join("golden.safetensors"));
    for p in 0..2 {
        let prompt = g.ids(&format!("p{p}.input_ids"));
        let want = g.ids(&format!("p{p}.greedy_ids"));
        let out = m
            .forward(&be, &prompt, &mut m.new_cache(), &capture)
            .unwrap();
        let mut worst = 0f64;
        for k in 0..=nl {
            let ours = be.to_host(out.captured.get(k).unwrap()).unwrap();
            let (_, reference) = g.f32(&format!("p{p}.hs{k}"));
            let d = diff(&ours, &reference[..ours.len()]);
            worst = worst.max(d.rel);
        }
        let c = draftlens_engine::generate::greedy(&be, &m, &prompt, 64, &[]).unwrap();
        let agree = c.ids.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!("{file} prompt {p}: worst rel {worst:.2e}, greedy agrees for {agree} of 64");
        assert!(worst < 3e-2, "{file} prompt {p}: rel {worst:.2e}");
        assert_eq!(
            agree, 64,
            "{file} prompt {p}: greedy agrees for {agree} tokens"
        );
    }
}

/// `inspect`'s numbers come from the spec and the tensor listing: the GGUF file gives the
/// checkpoint's parameter counts, experts included, each expert projection listed once.
#[test]
fn gguf_listing_counts_every_expert_once() {
    let gguf = open(&gguf_path("qwen3_5_moe-bf16.gguf"));
    let hf = open(&golden_dir("qwen3_5_moe"));
    let params = |f: &TargetFiles| -> usize {
        f.weights
            .tensors()
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .sum()
    };
    assert_eq!(params(&gguf), params(&hf));
    let t = gguf.weights.tensors();
    let e15 = t
        .iter()
        .find(|t| t.name == "model.layers.2.mlp.experts.15.down_proj.weight")
        .unwrap();
    assert_eq!(e15.file_name, "blk.2.ffn_down_exps.weight");
    assert_eq!(
        e15.bytes,
        64 * 8 * 2,
        "one expert's share of the stacked BF16 tensor"
    );
    assert!(
        !t.iter().any(|t| t.name.contains("_exps")),
        "stacked names not listed"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input: a converted file rewritten with one change.

/// One change to a GGUF file.
enum Edit<'a> {
    None,
    DropTensor(&'a str),
    Set(&'a str, GgufValue),
    /// Keep the tensor's first outer slices only: new `ne` (same inner dims, fewer outer).
    Truncate(&'a str, Vec<u64>),
    /// The tensor stored as another ggml type id (zero bytes of that type's size; an id this
    /// reader does not know keeps the bytes).
    Retype(&'a str, u32),
    /// A tensor added: F32 zeros of this `ne`.
    AddF32(&'a str, Vec<u64>),
    /// Every layer's `ffn_gate_exps` and `ffn_up_exps` [D, I, E] replaced by one
    /// `ffn_gate_up_exps` [D, 2I, E] holding per expert its gate rows then its up rows, as
    /// `convert_hf_to_gguf.py --fuse-gate-up-exps` writes it (checked against the converter's own
    /// output of qwen3_5_moe by make_moe_gguf.py's uncommitted fused file, byte for byte).
    FuseGateUp,
}

/// `src` re-serialised (GGUF v3, same alignment) with `edit` applied (as golden_hybrid_gguf.rs's).
fn rewrite(src: &Path, dst: &Path, edit: Edit) {
    let f = GgufFile::open(src).unwrap();
    let mut meta = f.metadata().clone();
    let (mut drop, mut truncate, mut fuse, mut retype) = (None, None, false, None);
    // (name, ne, type id, bytes)
    let mut tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = Vec::new();
    match edit {
        Edit::None => {}
        Edit::DropTensor(t) => drop = Some(t),
        Edit::Set(k, v) => {
            meta.insert(k.to_string(), v);
        }
        Edit::Truncate(t, ne) => truncate = Some((t, ne)),
        Edit::FuseGateUp => fuse = true,
        Edit::Retype(t, id) => retype = Some((t, id)),
        Edit::AddF32(t, ne) => {
            let n: u64 = ne.iter().product();
            tensors.push((t.to_string(), ne, 0, vec![0; 4 * n as usize]));
        }
    }
    for t in f.tensors().iter().filter(|t| Some(t.name.as_str()) != drop) {
        let data = f.tensor_data(t);
        if let Some((name, id)) = retype.filter(|(name, _)| *name == t.name) {
            let bytes = match draftlens_engine::formats::dequant::GgmlType::from_id(id) {
                Some(ty) => vec![0; (t.n_elements() as usize / ty.block_size()) * ty.type_size()],
                None => data.to_vec(),
            };
            tensors.push((name.to_string(), t.ne.clone(), id, bytes));
            continue;
        }
        match &truncate {
            Some((name, ne)) if *name == t.name => {
                let n: u64 = ne.iter().product();
                let bytes = (t.n_bytes * n / t.n_elements()) as usize;
                tensors.push((
                    t.name.clone(),
                    ne.clone(),
                    t.ty.id(),
                    data[..bytes].to_vec(),
                ));
                continue;
            }
            _ => {}
        }
        if fuse && t.name.ends_with(".ffn_up_exps.weight") {
            continue; // written with its gate
        }
        if let (true, Some(layer)) = (fuse, t.name.strip_suffix(".ffn_gate_exps.weight")) {
            let up = f
                .tensor_info(&format!("{layer}.ffn_up_exps.weight"))
                .unwrap();
            let (g, u) = (f.tensor_data(t), f.tensor_data(up));
            let e = t.ne[2] as usize;
            let block = g.len() / e;
            let fused: Vec<u8> = (0..e)
                .flat_map(|x| {
                    [
                        &g[x * block..(x + 1) * block],
                        &u[x * block..(x + 1) * block],
                    ]
                })
                .flatten()
                .copied()
                .collect();
            let ne = vec![t.ne[0], 2 * t.ne[1], t.ne[2]];
            tensors.push((
                format!("{layer}.ffn_gate_up_exps.weight"),
                ne,
                t.ty.id(),
                fused,
            ));
            continue;
        }
        tensors.push((t.name.clone(), t.ne.clone(), t.ty.id(), data.to_vec()));
    }
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
    for (name, ne, ty, data) in &tensors {
        put_str(&mut out, name);
        out.extend((ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ty.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset += data.len().div_ceil(align) * align;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for (_, _, _, data) in &tensors {
        out.extend(data);
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

/// Each edit of `src` fails to open with one message holding every `want` and the file's path.
fn refused(src: &str, cases: Vec<(Edit, Vec<&str>)>) {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (edit, want)) in cases.into_iter().enumerate() {
        let p = tmp.path().join(format!("bad{i}.gguf"));
        rewrite(&gguf_path(src), &p, edit);
        let e = open_err(&p);
        assert!(e.contains(p.to_str().unwrap()), "{e}");
        for w in want {
            assert!(e.contains(w), "{src} case {i}: {e:?} lacks {w:?}");
        }
    }
}

#[test]
fn fused_gate_up_experts_match_the_golden() {
    // llama.cpp's --fuse-gate-up-exps layout (qwen35moe and qwen3next have it; its qwen3moe
    // tensor list does not).
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("fused.gguf");
    rewrite(&gguf_path("qwen3_5_moe-bf16.gguf"), &p, Edit::FuseGateUp);
    let f = GgufFile::open(&p).unwrap();
    assert!(f.tensor_info("blk.2.ffn_gate_up_exps.weight").is_some());
    assert!(f.tensor_info("blk.2.ffn_up_exps.weight").is_none());
    check_path("qwen3_5_moe", &p);
}

/// Files not committed (make_moe_gguf.py writes the F32 conversions and the converter's own
/// `--fuse-gate-up-exps` file to /tmp/moe_gguf_f32): with `DRAFTLENS_MOE_GGUF_EXTRA` set to that
/// folder, each `<model>-*.gguf` in it is checked against its golden like the committed ones.
/// Without the variable this test checks nothing.
#[test]
fn uncommitted_conversions_match_the_golden_when_given() {
    let Ok(dir) = std::env::var("DRAFTLENS_MOE_GGUF_EXTRA") else {
        return;
    };
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let Some(model) = ["qwen3_5_moe", "qwen3_moe"]
            .into_iter()
            .find(|m| name.starts_with(&format!("{m}-")))
        else {
            continue;
        };
        check_path(model, &path);
        n += 1;
    }
    assert!(n > 0, "{dir}: no <model>-*.gguf files");
}

#[test]
fn rewritten_file_is_still_good() {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["qwen3_moe-bf16.gguf", "qwen3_5_moe-bf16.gguf"] {
        let p = tmp.path().join(file);
        rewrite(&gguf_path(file), &p, Edit::None);
        assert_eq!(open(&p).spec, open(&gguf_path(file)).spec);
    }
}

#[test]
fn wrong_expert_count_or_shape_is_named() {
    refused(
        "qwen3_moe-bf16.gguf",
        vec![
            // 15 experts stored, 16 declared.
            (
                Edit::Truncate("blk.2.ffn_up_exps.weight", vec![64, 8, 15]),
                vec![
                    "blk.2.ffn_up_exps.weight",
                    "15 experts",
                    "qwen3moe.expert_count = 16",
                ],
            ),
            // The key disagrees with every stacked tensor: the first one checked is named.
            (
                Edit::Set("qwen3moe.expert_count", GgufValue::U32(8)),
                vec!["blk.0.ffn_gate_inp.weight", "qwen3moe.expert_count = 8"],
            ),
            // Expert width 4 declared, 8 stored.
            (
                Edit::Set("qwen3moe.expert_feed_forward_length", GgufValue::U32(4)),
                vec![
                    "blk.0.ffn_gate_exps.weight",
                    "qwen3moe.expert_feed_forward_length = 4",
                ],
            ),
            // A router of the wrong size (15 experts' rows).
            (
                Edit::Truncate("blk.0.ffn_gate_inp.weight", vec![64, 15]),
                vec![
                    "blk.0.ffn_gate_inp.weight",
                    "[64, 15]",
                    "qwen3moe.expert_count = 16",
                ],
            ),
        ],
    );
    refused(
        "qwen3_5_moe-bf16.gguf",
        vec![(
            Edit::Set(
                "qwen35moe.expert_shared_feed_forward_length",
                GgufValue::U32(32),
            ),
            vec![
                "blk.0.ffn_gate_shexp.weight",
                "qwen35moe.expert_shared_feed_forward_length = 32",
            ],
        )],
    );
}

#[test]
fn missing_router_or_experts_is_named() {
    refused(
        "qwen3_moe-bf16.gguf",
        vec![
            (
                Edit::DropTensor("blk.2.ffn_gate_inp.weight"),
                vec![
                    "tensor blk.2.ffn_gate_inp.weight (the router) is missing",
                    "blk.2.ffn_",
                ],
            ),
            (
                Edit::DropTensor("blk.0.ffn_down_exps.weight"),
                vec!["tensor blk.0.ffn_down_exps.weight is missing"],
            ),
            // A dense layer's MLP dropped: neither router nor dense MLP.
            (
                Edit::DropTensor("blk.1.ffn_up.weight"),
                vec![
                    "blk.1.ffn_gate_inp.weight (the router) is missing",
                    "neither experts nor a dense MLP",
                ],
            ),
        ],
    );
    refused(
        "qwen3_5_moe-bf16.gguf",
        vec![
            (
                Edit::DropTensor("blk.1.ffn_gate_inp_shexp.weight"),
                vec![
                    "tensor blk.1.ffn_gate_inp_shexp.weight is missing",
                    "shared expert",
                ],
            ),
            (
                Edit::DropTensor("blk.0.ffn_gate_inp.weight"),
                vec!["tensor blk.0.ffn_gate_inp.weight (the router) is missing"],
            ),
        ],
    );
}

#[test]
fn bad_expert_keys_are_named() {
    refused(
        "qwen3_moe-bf16.gguf",
        vec![
            (
                Edit::Set("qwen3moe.expert_used_count", GgufValue::U32(17)),
                vec![
                    "qwen3moe.expert_used_count = 17",
                    "qwen3moe.expert_count = 16",
                ],
            ),
            (
                Edit::Set("qwen3moe.expert_used_count", GgufValue::U32(0)),
                vec!["qwen3moe.expert_used_count = 0"],
            ),
            (
                Edit::Set("qwen3moe.expert_count", GgufValue::U32(0)),
                vec!["qwen3moe.expert_count is missing or 0"],
            ),
            (
                Edit::Set("qwen3moe.expert_used_count", GgufValue::String("8".into())),
                vec!["qwen3moe.expert_used_count should be an unsigned integer"],
            ),
            (
                Edit::Set("qwen3moe.expert_weights_norm", GgufValue::U32(1)),
                vec!["qwen3moe.expert_weights_norm should be a bool"],
            ),
        ],
    );
    refused(
        "qwen3_5_moe-bf16.gguf",
        vec![(
            Edit::Set("qwen35moe.expert_weights_norm", GgufValue::Bool(false)),
            vec![
                "qwen35moe.expert_weights_norm is false",
                "always renormalises",
            ],
        )],
    );
}

#[test]
fn expert_weights_norm_false_turns_renormalisation_off() {
    // llama.cpp renormalises these architectures' top-k always; the key, when a file has it, is
    // honoured (transformers' Qwen3-MoE default is norm_topk_prob false).
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("nonorm.gguf");
    rewrite(
        &gguf_path("qwen3_moe-bf16.gguf"),
        &p,
        Edit::Set("qwen3moe.expert_weights_norm", GgufValue::Bool(false)),
    );
    assert!(!open(&p).spec.moe.unwrap().norm_topk_prob);
    assert!(
        open(&gguf_path("qwen3_moe-bf16.gguf"))
            .spec
            .moe
            .unwrap()
            .norm_topk_prob
    );
}

#[test]
fn bad_recurrent_layers_are_named() {
    let flags = |v: &[bool]| GgufValue::Array(v.iter().map(|&b| GgufValue::Bool(b)).collect());
    refused(
        "qwen3_5_moe-bf16.gguf",
        vec![
            (
                Edit::Set(
                    "qwen35moe.attention.recurrent_layers",
                    flags(&[true, false]),
                ),
                vec![
                    "qwen35moe.attention.recurrent_layers has 2 entries",
                    "qwen35moe.block_count = 3",
                ],
            ),
            (
                Edit::Set("qwen35moe.attention.recurrent_layers", GgufValue::U32(3)),
                vec!["qwen35moe.attention.recurrent_layers should be an array of bools"],
            ),
        ],
    );
}

/// A router bias, which none of these architectures has (llama.cpp's qwen3moe / qwen35moe graphs
/// route on `ffn_gate_inp.weight` alone; gpt-oss's router has `ffn_gate_inp.bias`, DeepSeek's
/// `exp_probs_b`): refused at open, naming the file and the tensor.
#[test]
fn a_router_bias_is_named() {
    for (file, arch) in [
        ("qwen3_moe-bf16.gguf", "qwen3moe"),
        ("qwen3_5_moe-bf16.gguf", "qwen35moe"),
    ] {
        let why = format!("is a router bias, but {arch}'s router has none");
        refused(
            file,
            vec![
                (
                    Edit::AddF32("blk.0.ffn_gate_inp.bias", vec![16]),
                    vec!["tensor blk.0.ffn_gate_inp.bias", why.as_str()],
                ),
                (
                    Edit::AddF32("blk.2.exp_probs_b.bias", vec![16]),
                    vec!["tensor blk.2.exp_probs_b.bias", why.as_str()],
                ),
            ],
        );
    }
}

/// A quantisation type the reader does not know (an id outside ggml's table) or cannot
/// dequantise (IQ4_NL, ggml id 20; MXFP4, id 39, is read since gpt-oss GGUFs are): in an expert
/// tensor refused at open; in any other tensor the file still opens (`inspect` lists it) and a
/// command that runs the target refuses it when it opens it, before any weight is read.
#[test]
fn an_unknown_or_unsupported_quantisation_type_is_named() {
    refused(
        "qwen3_moe-bf16.gguf",
        vec![
            (
                Edit::Retype("blk.0.ffn_up_exps.weight", 99),
                vec!["tensor blk.0.ffn_up_exps.weight has unknown ggml type id 99"],
            ),
            (
                // (ffn_gate_exps: rows of 64, whole IQ4_NL blocks of 32; the down projection's
                // rows of 8 are not. MXFP4, gpt-oss's type, is read since the gpt-oss GGUF work.)
                Edit::Retype("blk.2.ffn_gate_exps.weight", 20),
                vec!["unsupported tensor type IQ4_NL in tensor blk.2.ffn_gate_exps.weight"],
            ),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("iq4_nl_attention.gguf");
    rewrite(
        &gguf_path("qwen3_moe-bf16.gguf"),
        &p,
        Edit::Retype("blk.1.attn_q.weight", 20),
    );
    let listed = open(&p).weights.tensors();
    let q = listed
        .iter()
        .find(|t| t.file_name == "blk.1.attn_q.weight")
        .unwrap();
    assert_eq!(q.dtype, "IQ4_NL");
    let cache =
        draftlens_engine::hidden_cache::HiddenCache::open(&tmp.path().join("cache")).unwrap();
    let e = match draftlens_engine::session::Session::load(
        CpuBackend::new(),
        &p,
        cache,
        Default::default(),
    ) {
        Ok(_) => panic!("an IQ4_NL attention tensor was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with(p.to_str().unwrap())
            && e.contains("tensor model.layers.1.self_attn.q_proj.weight (blk.1.attn_q.weight) is stored as IQ4_NL, which draftlens cannot read"),
        "{e}"
    );
}
