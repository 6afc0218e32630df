//! `inspect --json`, `extract` (twice: the second from the cache) and `cache ls | verify | rm`
//! through the built binary.
//!
//! `extract` runs on the SmolLM2 golden's "france" prompt, so the hidden states it writes with
//! `--out` can be checked against transformers' (tests/fixtures/golden/smollm2), not only
//! against themselves.

mod cli_util;

use cli_util::*;
use safetensors::SafeTensors;
use std::path::Path;

#[test]
fn inspect_json_describes_the_gguf_and_a_hugging_face_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let v = json_out(
        &dl(&cache, &["--json", "inspect", s(&model())]),
        "inspect gguf",
    );
    assert_eq!(v["format"], "gguf");
    // Headers only: the identity is not computed by a plain inspect…
    assert!(v["weights_sha256"].is_null(), "{}", v["weights_sha256"]);
    // …but by --hash, and remembered: the next inspect shows it without hashing.
    let sha = draftlens_engine::util::sha256_file(&model()).unwrap();
    for args in [
        &["--json", "inspect", "--hash", s(&model())][..],
        &["--json", "inspect", s(&model())][..],
    ] {
        let v = json_out(&dl(&cache, args), "inspect --hash");
        assert_eq!(v["weights_sha256"].as_str(), Some(sha.as_str()), "{args:?}");
    }
    let spec = &v["spec"];
    assert_eq!(spec["arch"], "llama");
    // SmolLM2-135M: 30 layers, 576 hidden, 1536 FFN, 9 heads / 3 KV heads of 64, 49152 vocab, tied.
    for (k, want) in [
        ("num_layers", 30),
        ("hidden_size", 576),
        ("intermediate_size", 1536),
        ("num_heads", 9),
        ("num_kv_heads", 3),
        ("head_dim", 64),
        ("vocab_size", 49152),
    ] {
        assert_eq!(spec[k], want, "{k}");
    }
    assert_eq!(spec["tie_word_embeddings"], true);
    assert!(
        v["dtypes"].as_object().unwrap().contains_key("Q4_1"),
        "{}",
        v["dtypes"]
    );
    // ~135 M parameters.
    let params = v["parameters"].as_u64().unwrap();
    assert!((130_000_000..140_000_000).contains(&params), "{params}");
    assert_eq!(v["tokenizer"]["vocab"], 49152);
    assert!(
        v["tokenizer"]["eos"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(2)),
        "<|im_end|> ends generation"
    );
    assert!(v["tokenizer"]["chat_template_chars"].as_u64().unwrap() > 0);
    assert!(v["tensors"].is_null(), "tensors only with --tensors");

    let dir = root().join("tests/fixtures/golden/qwen3");
    let v = json_out(
        &dl(&cache, &["--json", "inspect", "--tensors", s(&dir)]),
        "inspect HF folder",
    );
    assert_eq!(v["format"], "safetensors");
    assert_eq!(
        (v["spec"]["arch"].as_str(), v["spec"]["head_dim"].as_u64()),
        (Some("qwen3"), Some(64))
    );
    assert!(v["tokenizer"].is_null());
    let tensors = v["tensors"].as_array().unwrap();
    assert!(tensors
        .iter()
        .any(|t| t["name"] == "model.layers.0.self_attn.q_norm.weight" && t["dtype"] == "BF16"));
}

/// `inspect` shows which decoder layers are full attention and which Gated DeltaNet: all of
/// them attention on a dense target, the config's `layer_types` on a hybrid; `experts` is the
/// (null) place for mixture-of-experts facts.
#[test]
fn inspect_shows_the_layer_mix() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let v = json_out(
        &dl(&cache, &["--json", "inspect", s(&model())]),
        "inspect gguf",
    );
    let all: Vec<usize> = (0..30).collect();
    assert_eq!(v["layer_mix"]["full_attention"], serde_json::json!(all));
    assert_eq!(v["layer_mix"]["linear_attention"], serde_json::json!([]));
    assert!(v["experts"].is_null(), "{}", v["experts"]);
    let o = dl(&cache, &["inspect", s(&model())]);
    ok(&o, "inspect gguf");
    assert!(
        stdout(&o).contains("\n  layer mix     30 full attention [0-29]\n"),
        "{}",
        stdout(&o)
    );

    // tests/fixtures/golden/qwen3_5: layer_types linear, linear, full, linear, linear, full.
    let dir = root().join("tests/fixtures/golden/qwen3_5");
    let v = json_out(
        &dl(&cache, &["--json", "inspect", s(&dir)]),
        "inspect hybrid",
    );
    assert_eq!(v["layer_mix"]["full_attention"], serde_json::json!([2, 5]));
    assert_eq!(
        v["layer_mix"]["linear_attention"],
        serde_json::json!([0, 1, 3, 4])
    );
    let o = dl(&cache, &["inspect", s(&dir)]);
    ok(&o, "inspect hybrid");
    assert!(
        stdout(&o).contains(
            "\n  layer mix     2 full attention [2,5]   4 Gated DeltaNet (linear attention) [0-1,3-4]\n"
        ),
        "{}",
        stdout(&o)
    );
}

/// gpt-oss (tests/fixtures/golden/gpt_oss*): sliding-window and full attention layers, its
/// experts with their storage and routing rule.
#[test]
fn inspect_shows_gpt_oss_layers_and_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    for (folder, storage) in [("gpt_oss", "fused"), ("gpt_oss_mxfp4", "mxfp4")] {
        let dir = root().join("tests/fixtures/golden").join(folder);
        let v = json_out(&dl(&cache, &["--json", "inspect", s(&dir)]), folder);
        assert_eq!(v["spec"]["arch"], "gpt_oss");
        assert_eq!(v["layer_mix"]["full_attention"], serde_json::json!([1, 3]));
        assert_eq!(
            v["layer_mix"]["sliding_attention"],
            serde_json::json!([0, 2])
        );
        assert_eq!(v["layer_mix"]["sliding_window"], 8);
        let e = &v["experts"];
        assert_eq!(e["layers"], serde_json::json!([0, 1, 2, 3]));
        assert_eq!(
            (e["experts"].as_u64(), e["active_per_token"].as_u64()),
            (Some(8), Some(4))
        );
        assert_eq!(e["storage"], storage);
        // The same model either way: MXFP4 blocks count two parameters a byte, scales none.
        assert_eq!(v["parameters"], 169_416, "{folder}");
        let o = dl(&cache, &["inspect", s(&dir)]);
        ok(&o, folder);
        let text = stdout(&o);
        assert!(
            text.contains("\n  layer mix     2 full attention [1,3]   2 sliding-window attention (8 positions) [0,2]\n"),
            "{text}"
        );
        assert!(
            text.contains("  experts       8 per layer on layers [0-3], 4 active per token, "),
            "{text}"
        );
        assert!(
            text.contains("routing: top-k of the biased router logits, then softmax over the k"),
            "{text}"
        );
    }
    // Other targets' JSON has no gpt-oss keys.
    let v = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "inspect",
                s(&root().join("tests/fixtures/golden/qwen3_moe")),
            ],
        ),
        "qwen3_moe",
    );
    assert!(v["layer_mix"].get("sliding_attention").is_none());
    assert!(v["experts"].get("storage").is_none() && v["experts"].get("routing").is_none());
}

/// f32 values of a tensor (F32 or F16) of a safetensors file.
fn read_f32(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let v = match t.dtype() {
        safetensors::Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        safetensors::Dtype::F16 => t
            .data()
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        d => panic!("{name}: {d:?}"),
    };
    (t.shape().to_vec(), v)
}

#[test]
fn extract_twice_then_cache_ls_verify_rm() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let prompts = tmp.path().join("france.jsonl");
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/golden/smollm2/manifest.json"))
            .unwrap(),
    )
    .unwrap();
    let msg = manifest["prompts"][0]["messages"][0]["content"]
        .as_str()
        .unwrap();
    assert_eq!(manifest["prompts"][0]["name"], "france");
    write_prompts(&prompts, &[("france", None, msg)]);
    let (out1, out2) = (
        tmp.path().join("h1.safetensors"),
        tmp.path().join("h2.safetensors"),
    );
    let args = |out: &Path| -> Vec<String> {
        [
            "--json",
            "extract",
            "--prompts",
            s(&prompts),
            "--max-new-tokens",
            "64",
            "--layers",
            "1,8,15,22,27",
            "--out",
            s(out),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    };

    let first = json_out(
        &cmd(&cache).args(args(&out1)).output().unwrap(),
        "extract 1",
    );
    let second = json_out(
        &cmd(&cache).args(args(&out2)).output().unwrap(),
        "extract 2",
    );
    // 37 prompt tokens + "The capital of France is Paris.<|im_end|>" (8 tokens, stops at EOS).
    assert_eq!(
        (first[0]["tokens"].as_u64(), first[0]["cached"].as_bool()),
        (Some(45), Some(false))
    );
    assert_eq!(
        (second[0]["tokens"].as_u64(), second[0]["cached"].as_bool()),
        (Some(45), Some(true))
    );
    // The cached states are the computed ones, bit for bit.
    assert_eq!(std::fs::read(&out1).unwrap(), std::fs::read(&out2).unwrap());

    // …and they are transformers' hidden states, named by the --layers id (layer id i =
    // hidden_states[i+1]); tolerance as in crates/engine/tests/golden_smollm2.rs: f16 storage of
    // the reference bounds the error at ~3e-4.
    let bytes = std::fs::read(&out1).unwrap();
    let ours = SafeTensors::deserialize(&bytes).unwrap();
    let gbytes =
        std::fs::read(root().join("tests/fixtures/golden/smollm2/golden.safetensors")).unwrap();
    let golden = SafeTensors::deserialize(&gbytes).unwrap();
    let mut names: Vec<String> = ours.names().into_iter().map(String::from).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "france.layer1",
            "france.layer15",
            "france.layer22",
            "france.layer27",
            "france.layer8"
        ]
    );
    for layer in [1, 8, 15, 22, 27] {
        let k = layer + 1;
        let (shape, o) = read_f32(&ours, &format!("france.layer{layer}"));
        let (gshape, g) = read_f32(&golden, &format!("p0.hs{k}"));
        assert_eq!(shape, gshape);
        let num: f64 = o
            .iter()
            .zip(&g)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let den: f64 = g.iter().map(|b| (*b as f64).powi(2)).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 1e-3, "hs{k}: relative error {rel:e} vs transformers");
    }

    // cache ls: one greedy continuation and one taps entry.
    let ls = json_out(&dl(&cache, &["--json", "cache", "ls"]), "cache ls");
    let ls = ls.as_array().unwrap();
    let mut kinds: Vec<&str> = ls
        .iter()
        .map(|e| e["key"]["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["greedy", "taps"]);
    let taps = ls.iter().find(|e| e["key"]["kind"] == "taps").unwrap();
    assert_eq!(taps["key"]["layers"], serde_json::json!([2, 9, 16, 23, 28]));
    assert_eq!(taps["key"]["backend"], "cpu");
    assert_eq!(cache_verifies(&cache), 2);

    // Corrupt the taps entry (one byte in its tensor data): verify fails naming it, rm
    // --corrupt removes exactly it, and verify passes again.
    let taps_path = std::path::PathBuf::from(taps["path"].as_str().unwrap());
    let mut b = std::fs::read(&taps_path).unwrap();
    let i = b.len() - 100;
    b[i] ^= 0x55;
    std::fs::write(&taps_path, b).unwrap();
    let o = dl(&cache, &["--json", "cache", "verify"]);
    clean_error(&o, "cache verify with a corrupt entry", &["1 corrupt"]);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let bad: Vec<&serde_json::Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ok"] == false)
        .collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(
        bad[0]["path"].as_str().unwrap(),
        taps_path.to_str().unwrap()
    );
    let rm = json_out(
        &dl(&cache, &["--json", "cache", "rm", "--corrupt"]),
        "cache rm --corrupt",
    );
    assert_eq!(rm["entries"], 1);
    assert!(!taps_path.exists());
    assert_eq!(cache_verifies(&cache), 1);

    // The taps are recomputed (not cached), identical to the first extraction.
    let third = json_out(
        &cmd(&cache).args(args(&out2)).output().unwrap(),
        "extract 3",
    );
    assert_eq!(third[0]["cached"], false);
    assert_eq!(std::fs::read(&out1).unwrap(), std::fs::read(&out2).unwrap());

    // rm by kind, then everything.
    let rm = json_out(
        &dl(&cache, &["--json", "cache", "rm", "--kind", "greedy"]),
        "cache rm --kind greedy",
    );
    assert_eq!(rm["entries"], 1);
    let ls = json_out(&dl(&cache, &["--json", "cache", "ls"]), "cache ls");
    assert_eq!(ls.as_array().unwrap().len(), 1);
    assert_eq!(ls[0]["key"]["kind"], "taps");
    let rm = json_out(
        &dl(&cache, &["--json", "cache", "rm", "--all"]),
        "cache rm --all",
    );
    assert_eq!(rm["entries"], 1);
    assert_eq!(
        json_out(&dl(&cache, &["--json", "cache", "ls"]), "cache ls")
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

/// `inspect --hash` remembers a folder's identity; bytes then changed in place behind the same
/// size, mtime and inode are invisible to the next open (by design: no re-hash) but `cache
/// verify` re-hashes, reports the stale identity (exit 1) and repairs it; the next verify passes
/// and inspect shows the new identity.
#[test]
fn cache_verify_reports_and_repairs_a_stale_identity() {
    use std::io::{Seek, SeekFrom, Write};
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let model = tmp.path().join("qwen3");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            root().join("tests/fixtures/golden/qwen3").join(f),
            model.join(f),
        )
        .unwrap();
    }
    let weights = model.join("model.safetensors");
    let identity = |w: &Path| {
        draftlens_engine::util::sha256_bytes(
            draftlens_engine::util::sha256_file(w).unwrap().as_bytes(),
        )
    };
    let before = identity(&weights);
    let v = json_out(
        &dl(&cache, &["--json", "inspect", "--hash", s(&model)]),
        "inspect --hash",
    );
    assert_eq!(v["weights_sha256"].as_str(), Some(before.as_str()));

    let mtime = std::fs::metadata(&weights).unwrap().modified().unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len - 2)).unwrap();
    f.write_all(&[0x12, 0x34]).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let after = identity(&weights);
    assert_ne!(after, before);
    // Same stamp: inspect still shows the remembered identity (it read no weight byte).
    let v = json_out(&dl(&cache, &["--json", "inspect", s(&model)]), "inspect");
    assert_eq!(v["weights_sha256"].as_str(), Some(before.as_str()));

    let o = dl(&cache, &["cache", "verify"]);
    let err = clean_error(
        &o,
        "cache verify with a stale identity",
        &["stale identities"],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("STALE") && out.contains("model.safetensors"),
        "{out}\n{err}"
    );
    assert!(
        out.contains("1 weight-file identities checked, 1 corrupt"),
        "{out}"
    );
    assert_eq!(cache_verifies(&cache), 0);
    let v = json_out(&dl(&cache, &["--json", "inspect", s(&model)]), "inspect");
    assert_eq!(v["weights_sha256"].as_str(), Some(after.as_str()));
}

/// `bench-load` on the CPU: the read floor covers exactly the weight file, and the load is
/// timed (the numbers themselves are measured on the GPU machine, docs/loading.md).
#[test]
fn bench_load_reports_the_read_floor_and_the_load() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = root().join("tests/fixtures/golden/qwen3");
    let v = json_out(
        &dl(
            &tmp.path().join("cache"),
            &["--json", "bench-load", s(&dir)],
        ),
        "bench-load",
    );
    // Every *.safetensors file of the folder, as the identity covers (here the weights and the
    // golden outputs stored beside them).
    let size: u64 = ["model.safetensors", "golden.safetensors"]
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
        .sum();
    assert_eq!(v["bytes"].as_u64(), Some(size));
    assert_eq!(v["files"], 2);
    assert_eq!(v["backend"], "cpu");
    for k in ["read_s", "open_s", "upload_s", "ratio"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
}
