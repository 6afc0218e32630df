//! GGUF drafters as llama.cpp writes them (docs/gguf-drafters.md), each checked against an
//! independent expectation. The fixtures are llama.cpp's own `convert_hf_to_gguf.py` output
//! (tools/golden/make_gguf_drafters.py) for a random DFlash checkpoint and the EAGLE-3 golden:
//!
//! (a) `run` with the bf16 GGUF gives exactly the records of the checkpoint it came from (same
//!     anchors, draft ids, log-probs bit for bit, targets) on the CPU backend, computed afresh
//!     (not read from the checkpoint's records cache); the Q8_0 file's records agree within its
//!     quantisation (stated below);
//! (b) the EAGLE-3 GGUF (q/k rows permuted, d2t absolute, no t2d) drafts exactly the golden
//!     checkpoint's chains;
//! (c) `lint --against`: the correct conversions raise no error; each converter mistake, made on
//!     purpose in a copy of the file, is caught under its own name (layer ids off by one, a
//!     missing tensor, a wrong or missing mask id, a tensor-count mismatch, values of another
//!     tensor, EAGLE-3 taps from the converter's default);
//! (d) bad input: one error naming the file and the key or tensor, from the loader and from
//!     `run` before any run exists.

#[path = "../golden_util/mod.rs"]
mod golden_util;
mod rewrite;

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::drafter::eagle3::Eagle3Drafter;
use draftlens_engine::drafter::gguf::against::against;
use draftlens_engine::drafter::lint::{lint, Finding, Severity};
use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
use draftlens_engine::drafter::DFlashDrafter;
use draftlens_engine::formats::gguf::GgufValue;
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::model::TargetFiles;
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::session::{Session, SessionOptions};
use draftlens_results::store::{RunFilter, RunMode, Store};
use golden_util::*;
use rewrite::Copy;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/golden/gguf_drafters")
}
fn hf_dflash() -> PathBuf {
    fixtures().join("dflash")
}
fn qwen3_dir() -> PathBuf {
    repo_root().join("tests/fixtures/golden/qwen3")
}

/// The random Qwen3 golden target with a word-level tokenizer (ids w0..w39), so prompts can be
/// given as text.
fn target(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(qwen3_dir().join(f), dir.join(f)).unwrap();
    }
    let mut vocab = serde_json::Map::new();
    for i in 0..40 {
        vocab.insert(format!("w{i}"), i.into());
    }
    let tok = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"eos_token": "w39"}).to_string(),
    )
    .unwrap();
    dir.to_path_buf()
}

/// Every tensor of a safetensors file, as entries `write_safetensors` takes back.
fn read_entries(path: &Path) -> Vec<draftlens_engine::util::SafetensorsEntry> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect()
}

fn errors(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect()
}

fn has(findings: &[Finding], code: &str, text: &str) -> bool {
    findings
        .iter()
        .any(|f| f.severity == Severity::Error && f.code == code && f.message.contains(text))
}

// ---------------------------------------------------------------------------------------------
// (a) run: GGUF records == checkpoint records
// ---------------------------------------------------------------------------------------------

#[test]
fn run_with_the_gguf_gives_the_checkpoints_records() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = target(&tmp.path().join("target"));
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"w1 w2 w3 w4 w5 w6\"}\n{\"id\": \"b\", \"prompt\": \"w7 w8 w30\"}\n{\"id\": \"c\", \"prompt\": \"w11 w2 w19 w5\"}\n",
    )
    .unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 24,
        fail_after: None,
    };
    let s = Session::load(
        CpuBackend::new(),
        &dir,
        HiddenCache::open(&tmp.path().join("cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let spec = |dir: PathBuf| DrafterSpec::Checkpoint {
        dir,
        step: None,
        series: "gguf".into(),
    };
    let hf = run_eval(&s, &spec(hf_dflash()), &set, &opts, &store).unwrap();
    let gguf = run_eval(
        &s,
        &spec(fixtures().join("dflash-bf16.gguf")),
        &set,
        &opts,
        &store,
    )
    .unwrap();
    // Computed from the GGUF weights, not read back from the checkpoint's records cache.
    assert_eq!(gguf.timings["records_cached"], 0);
    let (a, b) = (
        store.records(hf.run_id).unwrap(),
        store.records(gguf.run_id).unwrap(),
    );
    assert!(a.num_blocks() > 40, "{} blocks", a.num_blocks());
    assert_eq!(a.block_size, 8);
    assert_eq!(a.anchor, b.anchor);
    assert_eq!(a.prompt_index, b.prompt_index);
    assert_eq!(a.target, b.target);
    assert_eq!(a.draft_ids, b.draft_ids);
    // bf16 values are exact in f32: the same arithmetic, bit for bit.
    assert_eq!(a.draft_logprobs, b.draft_logprobs);
    assert_eq!(hf.metrics, gguf.metrics);
    let run = store.run(gguf.run_id).unwrap().unwrap().run;
    assert!(
        run.drafter_path.ends_with("dflash-bf16.gguf"),
        "{}",
        run.drafter_path
    );
    let eval = store.run_eval(gguf.run_id).unwrap().unwrap();
    assert_eq!(eval.identity_json["drafter_kind"], "checkpoint");

    // Q8_0: the same drafter up to 8-bit rounding of its matrices.
    let q8 = run_eval(
        &s,
        &spec(fixtures().join("dflash-q8_0.gguf")),
        &set,
        &opts,
        &store,
    )
    .unwrap();
    let c = store.records(q8.run_id).unwrap();
    assert_eq!(a.anchor, c.anchor);
    let k = a.top_k as usize;
    let (mut same_top1, mut rows, mut worst) = (0usize, 0usize, 0f32);
    for (r, (x, y)) in a.draft_ids.chunks(k).zip(c.draft_ids.chunks(k)).enumerate() {
        rows += 1;
        same_top1 += (x[0] == y[0]) as usize;
        if x[0] == y[0] {
            worst = worst.max((a.draft_logprobs[r * k] - c.draft_logprobs[r * k]).abs());
        }
    }
    let agree = same_top1 as f64 / rows as f64;
    println!("q8_0 vs checkpoint: top-1 agrees on {same_top1}/{rows} drafted positions, max |Δ log-prob| of agreeing top-1 {worst:.2e}");
    assert!(agree >= 0.95, "top-1 agreement {agree}");
    assert!(worst < 0.05, "{worst}");
}

#[test]
fn run_with_the_dflash2_gguf_gives_the_checkpoints_records() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = target(&tmp.path().join("target"));
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"w1 w2 w3 w4 w5 w6\"}\n{\"id\": \"b\", \"prompt\": \"w7 w8 w30\"}\n",
    )
    .unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 24,
        fail_after: None,
    };
    let s = Session::load(
        CpuBackend::new(),
        &dir,
        HiddenCache::open(&tmp.path().join("cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let spec = |dir: PathBuf| DrafterSpec::Checkpoint {
        dir,
        step: None,
        series: "gguf".into(),
    };
    let hf = run_eval(&s, &spec(fixtures().join("dflash2")), &set, &opts, &store).unwrap();
    let gguf = run_eval(
        &s,
        &spec(fixtures().join("dflash2-bf16.gguf")),
        &set,
        &opts,
        &store,
    )
    .unwrap();
    assert_eq!(gguf.timings["records_cached"], 0);
    let (a, b) = (
        store.records(hf.run_id).unwrap(),
        store.records(gguf.run_id).unwrap(),
    );
    assert!(a.num_blocks() > 20, "{} blocks", a.num_blocks());
    assert_eq!(a.anchor, b.anchor);
    assert_eq!(a.draft_ids, b.draft_ids);
    assert_eq!(a.draft_logprobs, b.draft_logprobs);
    assert_eq!(a.target, b.target);
    let eval = store.run_eval(gguf.run_id).unwrap().unwrap();
    assert_eq!(eval.identity_json["drafter_kind"], "dflash2");
    println!(
        "dflash2 gguf: {} blocks equal the checkpoint's",
        a.num_blocks()
    );
}

// ---------------------------------------------------------------------------------------------
// (b) EAGLE-3
// ---------------------------------------------------------------------------------------------

#[test]
fn eagle3_gguf_drafts_the_golden_checkpoints_chains() {
    let be = CpuBackend::new();
    let spec = TargetFiles::open(&qwen3_dir()).unwrap().spec;
    let golden = repo_root().join("tests/fixtures/golden/eagle3");
    let hf = Eagle3Drafter::load(&be, &golden, &spec).unwrap();
    let mut gg = Eagle3Drafter::load(&be, &fixtures().join("eagle3-bf16.gguf"), &spec).unwrap();
    assert_eq!(gg.cfg.tap_layer_ids, hf.cfg.tap_layer_ids);
    // GGUF stores no num_speculative_tokens: the default chain length, set back to compare.
    assert!(!gg.cfg.steps_from_config);
    gg.cfg.steps = hf.cfg.steps;
    let g = Golden::open(qwen3_dir().join("golden.safetensors"));
    for p in 0..2 {
        let mut ids = g.ids(&format!("p{p}.input_ids"));
        ids.extend(g.ids(&format!("p{p}.greedy_ids")));
        let taps: Vec<Vec<f32>> = (1..=3).map(|k| g.f32(&format!("p{p}.hs{k}")).1).collect();
        let slices: Vec<&[f32]> = taps.iter().map(|t| &t[..ids.len() * 128]).collect();
        let anchors: Vec<usize> = (1..ids.len() - 1).collect();
        let draft = |d: &Eagle3Drafter<CpuBackend>| {
            let ctx = d.context(&be, None, &slices, 128, &ids).unwrap().unwrap();
            d.draft(&be, None, &ctx, &anchors, 8).unwrap()
        };
        let (x, y) = (draft(&hf), draft(&gg));
        assert_eq!(x.ids, y.ids, "p{p}: draft ids");
        assert_eq!(x.logprobs, y.logprobs, "p{p}: log-probs");
    }
}

// ---------------------------------------------------------------------------------------------
// (c) lint --against
// ---------------------------------------------------------------------------------------------

#[test]
fn against_passes_the_correct_conversions() {
    for f in ["dflash-bf16.gguf", "dflash-q8_0.gguf"] {
        let findings = against(&fixtures().join(f), &hf_dflash(), 4).unwrap();
        assert!(errors(&findings).is_empty(), "{f}: {findings:#?}");
        let ids = findings.iter().find(|x| x.code == "layer-ids").unwrap();
        assert!(
            ids.message.contains("[1, 3]") && ids.message.contains("[0, 2] + 1"),
            "{}",
            ids.message
        );
        let values = findings.iter().find(|x| x.code == "values").unwrap();
        assert!(
            values.message.contains("25 tensors compared"),
            "{}",
            values.message
        );
        println!("{f}: {}", values.message);
    }
    let findings = against(
        &fixtures().join("dflash2-bf16.gguf"),
        &fixtures().join("dflash2"),
        4,
    )
    .unwrap();
    assert!(errors(&findings).is_empty(), "dflash2: {findings:#?}");
    assert!(
        findings
            .iter()
            .any(|f| f.code == "values" && f.message.contains("36 tensors compared")),
        "{findings:#?}"
    );
    let golden = repo_root().join("tests/fixtures/golden/eagle3");
    let findings = against(&fixtures().join("eagle3-bf16.gguf"), &golden, 4).unwrap();
    assert!(errors(&findings).is_empty(), "{findings:#?}");
    assert!(findings.iter().any(|f| f.code == "steps"), "{findings:#?}");
}

#[test]
fn against_names_each_converter_mistake() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = || Copy::open(&fixtures().join("dflash-bf16.gguf"));
    let check = |name: &str, file: PathBuf, hf: &Path, code: &str, text: &str| {
        let findings = against(&file, hf, 4).unwrap();
        assert!(has(&findings, code, text), "{name}: {findings:#?}");
    };
    // Layer ids written unshifted (the HF ids as they are): llama.cpp reads one layer early.
    let f = bf16()
        .set(
            "dflash.target_layers",
            GgufValue::Array(vec![GgufValue::U32(0), GgufValue::U32(2)]),
        )
        .write(tmp.path(), "unshifted.gguf");
    check(
        "unshifted",
        f.clone(),
        &hf_dflash(),
        "layer-ids-off-by-one",
        "unshifted",
    );
    // Shifted twice.
    let f2 = bf16()
        .set(
            "dflash.target_layers",
            GgufValue::Array(vec![GgufValue::U32(2), GgufValue::U32(4)]),
        )
        .write(tmp.path(), "twice.gguf");
    check(
        "shifted twice",
        f2,
        &hf_dflash(),
        "layer-ids-off-by-one",
        "+ 2",
    );
    // A tensor left out.
    let f = bf16()
        .drop_tensor("blk.1.attn_k_norm.weight")
        .write(tmp.path(), "missing.gguf");
    check(
        "missing tensor",
        f.clone(),
        &hf_dflash(),
        "missing-tensor",
        "layers.1.self_attn.k_norm.weight",
    );
    check(
        "missing tensor",
        f,
        &hf_dflash(),
        "tensor-count",
        "expected 25, got 24",
    );
    // The mask id of another token, and none at all.
    let f = bf16()
        .set("tokenizer.ggml.mask_token_id", GgufValue::U32(0))
        .write(tmp.path(), "mask.gguf");
    check(
        "wrong mask id",
        f,
        &hf_dflash(),
        "mask-id",
        "tokenizer.ggml.mask_token_id is 0, the checkpoint's mask_token_id is 500",
    );
    let f = bf16()
        .remove("tokenizer.ggml.mask_token_id")
        .write(tmp.path(), "nomask.gguf");
    check("no mask id", f, &hf_dflash(), "mask-id", "missing");
    // Values of another tensor of the same shape (q_norm and k_norm swapped).
    let f = bf16()
        .swap_data("blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight")
        .write(tmp.path(), "swapped.gguf");
    check(
        "swapped",
        f,
        &hf_dflash(),
        "values",
        "blk.0.attn_k_norm.weight",
    );
    // Tensor count: the file converted from a two-layer checkpoint, compared with a three-layer
    // one (the "expected 81, got 58" of a DFlash2 file read as DFlash has this shape).
    let deeper = tmp.path().join("deeper");
    std::fs::create_dir_all(&deeper).unwrap();
    let mut config = json(&hf_dflash().join("config.json"));
    config["num_hidden_layers"] = 3.into();
    config["layer_types"] =
        serde_json::json!(["full_attention", "full_attention", "full_attention"]);
    std::fs::write(deeper.join("config.json"), config.to_string()).unwrap();
    let mut tensors = read_entries(&hf_dflash().join("model.safetensors"));
    let layer1: Vec<_> = tensors
        .iter()
        .filter(|e| e.0.starts_with("layers.1."))
        .cloned()
        .collect();
    tensors.extend(layer1.into_iter().map(|mut e| {
        e.0 = e.0.replace("layers.1.", "layers.2.");
        e
    }));
    draftlens_engine::util::write_safetensors(&deeper.join("model.safetensors"), &tensors).unwrap();
    let findings = against(&fixtures().join("dflash-bf16.gguf"), &deeper, 4).unwrap();
    assert!(
        has(&findings, "tensor-count", "expected 36, got 25"),
        "{findings:#?}"
    );
    assert!(
        has(&findings, "missing-tensor", "11 checkpoint tensor(s)"),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "config",
            "dflash.block_count / num_hidden_layers: the file says 2, the checkpoint 3"
        ),
        "{findings:#?}"
    );
    // A DFlash2 checkpoint converted as plain DFlash (no DFlash2 keys, no convolutions, no
    // selector): a valid DFlash file on its own, so the loader takes it; --against tells.
    let mut plain = Copy::open(&fixtures().join("dflash2-bf16.gguf"));
    for k in [
        "conv_kernel_size",
        "conv_group_size",
        "selector_rank",
        "selector_top_k",
        "logit_scale",
        "final_logit_softcapping",
        "embedding_scale",
    ] {
        plain = plain.remove(&format!("dflash.{k}"));
    }
    for t in [
        "selector_predecessor.weight",
        "selector_successor.weight",
        "selector_hidden.weight",
    ] {
        plain = plain.drop_tensor(t);
    }
    for l in 0..2 {
        for t in [
            "attn_conv_base",
            "attn_conv_proj.weight",
            "ffn_conv_base",
            "ffn_conv_proj.weight",
        ] {
            plain = plain.drop_tensor(&format!("blk.{l}.{t}"));
        }
    }
    let f = plain.write(tmp.path(), "dflash2-as-dflash.gguf");
    let spec = TargetFiles::open(&qwen3_dir()).unwrap();
    assert!(errors(&lint(&spec, &f).unwrap()).is_empty());
    let findings = against(&f, &fixtures().join("dflash2"), 4).unwrap();
    assert!(
        has(&findings, "tensor-count", "expected 36, got 25"),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "dflash2-dropped",
            "without its convolutions and candidate selector"
        ),
        "{findings:#?}"
    );
    assert!(
        has(&findings, "missing-tensor", "11 checkpoint tensor(s)"),
        "{findings:#?}"
    );
    // EAGLE-3: the converter's default taps, written when SpecForge nests them in eagle_config.
    let golden = repo_root().join("tests/fixtures/golden/eagle3");
    let f = Copy::open(&fixtures().join("eagle3-bf16.gguf"))
        .set(
            "eagle3.target_layers",
            GgufValue::Array(vec![
                GgufValue::U32(2),
                GgufValue::U32(2),
                GgufValue::U32(1),
            ]),
        )
        .write(tmp.path(), "eagle-default.gguf");
    check(
        "eagle3 default taps",
        f,
        &golden,
        "layer-ids",
        "the converter's default [2, L/2, L − 3]",
    );
    // EAGLE-3 q rows left in HF order (a converter that skipped the permutation).
    let f = Copy::open(&fixtures().join("eagle3-bf16.gguf"))
        .swap_rows_pairwise("blk.0.attn_q.weight")
        .write(tmp.path(), "eagle-q.gguf");
    check(
        "eagle3 q permutation",
        f,
        &golden,
        "values",
        "blk.0.attn_q.weight",
    );
}

// ---------------------------------------------------------------------------------------------
// (d) bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_gguf_drafters_are_refused_naming_the_file_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = target(&tmp.path().join("target"));
    let files = TargetFiles::open(&dir).unwrap();
    let be = CpuBackend::new();
    let bf16 = || Copy::open(&fixtures().join("dflash-bf16.gguf"));
    let u32s = |v: &[u32]| GgufValue::Array(v.iter().map(|&x| GgufValue::U32(x)).collect());
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        ("target given as drafter", bf16().set("general.architecture", GgufValue::String("llama".into())).write(tmp.path(), "arch.gguf"), "general.architecture is \"llama\", not a drafter"),
        ("no block size", bf16().remove("dflash.block_size").write(tmp.path(), "nobs.gguf"), "metadata key dflash.block_size is missing"),
        ("taps of the wrong type", bf16().set("dflash.target_layers", GgufValue::String("1,3".into())).write(tmp.path(), "taps-type.gguf"), "metadata key dflash.target_layers should be an array of integers"),
        ("unshifted tap 0", bf16().set("dflash.target_layers", u32s(&[0, 2])).write(tmp.path(), "tap0.gguf"), "dflash.target_layers[0] is 0"),
        ("no mask id", bf16().remove("tokenizer.ggml.mask_token_id").write(tmp.path(), "nomask.gguf"), "metadata key tokenizer.ggml.mask_token_id is missing"),
        ("a missing tensor", bf16().drop_tensor("enc.output_norm.weight").write(tmp.path(), "nohn.gguf"), "tensor enc.output_norm.weight (hidden_norm.weight in the checkpoint) is missing"),
        ("one DFlash2 key of four", bf16().set("dflash.conv_kernel_size", GgufValue::U32(4)).write(tmp.path(), "d2key.gguf"), "metadata key dflash.conv_group_size is missing"),
        ("a DFlash2 tensor without DFlash2 keys", bf16().rename("output_norm.weight", "blk.0.attn_conv_base").write(tmp.path(), "d2t.gguf"), "tensor blk.0.attn_conv_base is a DFlash2 tensor (convolution or candidate selector), but the file has no DFlash2 keys"),
        ("a DFlash2 file without its selector", Copy::open(&fixtures().join("dflash2-bf16.gguf")).drop_tensor("selector_predecessor.weight").drop_tensor("selector_successor.weight").drop_tensor("selector_hidden.weight").write(tmp.path(), "nosel.gguf"), "no candidate selector tensors"),
        ("an unknown tensor", bf16().rename("output_norm.weight", "blk.0.attn_sinks.weight").write(tmp.path(), "sinks.gguf"), "tensor blk.0.attn_sinks.weight has no place in the DFlash layout"),
        ("partial rotary", bf16().set("dflash.rope.dimension_count", GgufValue::U32(16)).write(tmp.path(), "rot.gguf"), "dflash.rope.dimension_count 16 differs from the head size 32"),
        ("a tap out of range", bf16().set("dflash.target_layers", u32s(&[1, 9])).write(tmp.path(), "range.gguf"), "target_layer_ids contains 8, but the target has only 4 decoder layers"),
        ("a wrong shape", bf16().set("dflash.feed_forward_length", GgufValue::U32(64)).write(tmp.path(), "shape.gguf"), "has shape [96, 128], expected [64, 128]"),
    ];
    let s = Session::load(
        CpuBackend::new(),
        &dir,
        HiddenCache::open(&tmp.path().join("cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let set = {
        let p = tmp.path().join("p.jsonl");
        std::fs::write(&p, "{\"id\": \"a\", \"prompt\": \"w1 w2 w3\"}\n").unwrap();
        PromptSet::load_path(&p).unwrap()
    };
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 4,
        fail_after: None,
    };
    for (what, file, message) in &cases {
        // lint: an error (or a refusal) naming the file and the key or tensor.
        let said = match lint(&files, file) {
            Err(e) => format!("{e:#}"),
            Ok(findings) => errors(&findings)
                .iter()
                .map(|f| f.message.clone())
                .collect::<Vec<_>>()
                .join(" | "),
        };
        assert!(said.contains(message), "{what}: {said}");
        // run: refused before a run exists, naming the file.
        let spec = DrafterSpec::Checkpoint {
            dir: file.clone(),
            step: None,
            series: "bad".into(),
        };
        let e = format!(
            "{:#}",
            run_eval(&s, &spec, &set, &opts, &store).unwrap_err()
        );
        assert!(
            e.contains(&*file.to_string_lossy()) && e.contains(message),
            "{what}: {e}"
        );
        // The loader too, where the problem is the file's alone.
        if ![
            "a tap out of range",
            "a wrong shape",
            "a DFlash2 file without its selector",
        ]
        .contains(what)
        {
            let e = format!("{:#}", DFlashDrafter::load(&be, file, 128).err().unwrap());
            assert!(e.contains(&*file.to_string_lossy()), "{what}: {e}");
        }
    }
    assert_eq!(store.runs(&RunFilter::default()).unwrap().1, 0);
    // A truncated file: the GGUF reader's own error, naming it.
    let bytes = std::fs::read(fixtures().join("dflash-bf16.gguf")).unwrap();
    let cut = tmp.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = format!("{:#}", lint(&files, &cut).unwrap_err());
    assert!(e.contains("cut.gguf"), "{e}");
    // lint says how a good file was read.
    let findings = lint(&files, &fixtures().join("dflash-bf16.gguf")).unwrap();
    assert!(errors(&findings).is_empty(), "{findings:#?}");
    let g = findings.iter().find(|f| f.code == "gguf").unwrap();
    assert!(
        g.message.contains(
            "dflash.target_layers [1, 3] are layer inputs, read as target_layer_ids [0,2]"
        ),
        "{}",
        g.message
    );
}
