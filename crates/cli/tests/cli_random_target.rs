//! `--target random:DIR` through the binary (docs/loading.md §7): a folder holding the Qwen3
//! golden's config.json, a tokenizer and random.json, whose weights are generated at load.
//! `extract` writes bit-identical hidden states, `generate` the same text and `run` (a DFlash
//! drafter) the same stored metrics as the same weights written as a safetensors folder and read
//! from disk; `inspect` says how the weights are generated; a bad folder is one clean error.

mod cli_util;

use cli_util::*;
use draftlens_engine::formats::WeightSource;
use draftlens_engine::model::random_target::RandomTarget;
use draftlens_engine::model::ModelSpec;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

/// A word-level tokenizer (ids w0..w39, end of text w39).
fn write_tokenizer(dir: &Path) {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..40).map(|i| (format!("w{i}"), i.into())).collect();
    let tok = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "w39"}"#).unwrap();
}

/// The random folder: the Qwen3 golden's config, the tokenizer, seed 3 and a larger init.
fn random_folder(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/golden/qwen3/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    std::fs::write(
        dir.join("random.json"),
        r#"{"seed": 3, "init": {"matrix_std": 0.08, "norm_spread": 0.3}}"#,
    )
    .unwrap();
    write_tokenizer(dir);
    dir.to_path_buf()
}

/// The weights `dir` generates written as a safetensors folder (BF16 as listed), with its
/// config and tokenizer: read from disk by the loader.
fn written(dir: &Path, out: &Path) -> PathBuf {
    std::fs::create_dir_all(out).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), out.join(f)).unwrap();
    }
    let spec = ModelSpec::from_hf_config(&dir.join("config.json")).unwrap();
    let w = RandomTarget::open(dir)
        .unwrap()
        .weights(&spec, Path::new("random:x"));
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = w
        .tensors()
        .into_iter()
        .map(|t| {
            assert_eq!(t.dtype, "BF16");
            let bytes = w
                .tensor(&t.name)
                .unwrap()
                .data
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect();
            (t.name, t.shape, bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::BF16, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
    out.to_path_buf()
}

fn random(dir: &Path) -> String {
    format!("random:{}", dir.display())
}

#[test]
fn a_random_target_runs_every_command_like_its_weights_read_from_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = random_folder(&tmp.path().join("rnd"));
    let disk = written(&dir, &tmp.path().join("disk"));
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"w1 w2 w3 w4 w5 w6\"}\n{\"id\": \"b\", \"prompt\": \"w7 w8 w30\"}\n",
    )
    .unwrap();
    let targets = [random(&dir), s(&disk).to_string()];

    // extract: the captured states, bit for bit (safetensors files of f32 tensors).
    let states: Vec<Vec<(String, Vec<u8>)>> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let out = tmp.path().join(format!("states-{i}.safetensors"));
            let o = dl(
                &tmp.path().join(format!("cache-x{i}")),
                &[
                    "--json",
                    "extract",
                    "--backend",
                    "cpu",
                    "--target",
                    t,
                    "--prompts",
                    s(&prompts),
                    "--layers",
                    "0,2,3",
                    "--max-new-tokens",
                    "8",
                    "--out",
                    s(&out),
                ],
            );
            json_out(&o, "extract");
            let bytes = std::fs::read(&out).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let mut v: Vec<(String, Vec<u8>)> = st
                .tensors()
                .into_iter()
                .map(|(n, t)| (n, t.data().to_vec()))
                .collect();
            v.sort();
            v
        })
        .collect();
    assert_eq!(states[0].len(), 6, "2 prompts × 3 layers");
    assert_eq!(states[0], states[1], "extract: hidden states");

    // generate: the same text.
    let texts: Vec<Vec<String>> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let o = dl(
                &tmp.path().join(format!("cache-g{i}")),
                &[
                    "--json",
                    "generate",
                    "--backend",
                    "cpu",
                    "--target",
                    t,
                    "--prompts",
                    s(&prompts),
                    "--max-new-tokens",
                    "8",
                ],
            );
            json_out(&o, "generate")
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["text"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(texts[0], texts[1], "generate: text");

    // run with a DFlash drafter: the same stored records and metrics.
    let db = tmp.path().join("runs.sqlite");
    let drafter = root().join("tests/fixtures/golden/gguf_drafters/dflash");
    let ids: Vec<i64> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let o = dl(
                &tmp.path().join(format!("cache-r{i}")),
                &[
                    "--json",
                    "run",
                    "--backend",
                    "cpu",
                    "--target",
                    t,
                    "--drafter",
                    s(&drafter),
                    "--prompts",
                    s(&prompts),
                    "--max-new-tokens",
                    "16",
                    "--db",
                    s(&db),
                ],
            );
            json_out(&o, "run").as_array().unwrap()[0]["run_id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    let (a, b) = (stored(&db, ids[0]), stored(&db, ids[1]));
    assert!(!a.1.anchor.is_empty());
    assert_eq!(a.1.anchor, b.1.anchor);
    assert_eq!(a.1.draft_ids, b.1.draft_ids);
    assert_eq!(a.2, b.2, "run: metrics, bit for bit");

    // inspect: the generator's settings and the identity, known without hashing.
    let info = json_out(
        &dl(
            &tmp.path().join("cache-i"),
            &["--json", "inspect", &targets[0]],
        ),
        "inspect",
    );
    assert_eq!(info["format"], "random");
    assert_eq!(info["path"], targets[0].as_str());
    assert_eq!(info["random"]["seed"], 3);
    assert_eq!(info["random"]["identity"], "draftlens random weights v1");
    assert_eq!(info["weights_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(
        info["dtypes"]["BF16"][0], 47,
        "{info}: the golden checkpoint's 47 tensors"
    );
    let disk_info = json_out(
        &dl(
            &tmp.path().join("cache-i"),
            &["--json", "inspect", s(&disk)],
        ),
        "inspect",
    );
    assert!(disk_info.get("random").is_none(), "{disk_info}");
    assert_eq!(info["parameters"], disk_info["parameters"]);
    let text = stdout(&dl(&tmp.path().join("cache-i"), &["inspect", &targets[0]]));
    assert!(
        text.contains("format        random (sha256 ")
            && text.contains("weights       generated at load, nothing read from disk: seed 3"),
        "{text}"
    );

    // A folder without config.json: one clean error naming it.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = dl(
        &tmp.path().join("cache-e"),
        &[
            "extract",
            "--backend",
            "cpu",
            "--target",
            &random(&empty),
            "--prompts",
            s(&prompts),
        ],
    );
    clean_error(
        &o,
        "extract, no config.json",
        &["empty/config.json: missing"],
    );
}
