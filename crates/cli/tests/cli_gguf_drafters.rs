//! `draftlens run --drafter FILE.gguf` and `draftlens lint --against HF_DIR` (docs/gguf-drafters.md)
//! on llama.cpp's own conversion of a random DFlash checkpoint (tests/fixtures/golden/gguf_drafters)
//! and the random Qwen3 golden target: the GGUF run's stored records equal the checkpoint run's,
//! `lint --against` passes the file and names a wrong mask id made in a copy, and a file the
//! loader refuses fails `run` with one error naming it.

mod cli_util;

use cli_util::*;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    root().join("tests/fixtures/golden/gguf_drafters")
}

/// The Qwen3 golden target with a word-level tokenizer (ids w0..w39).
fn target(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            root().join("tests/fixtures/golden/qwen3").join(f),
            dir.join(f),
        )
        .unwrap();
    }
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..40).map(|i| (format!("w{i}"), i.into())).collect();
    let tok = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "w39"}"#).unwrap();
    dir.to_path_buf()
}

/// A copy of `src` with the u32 value of metadata key `key` set to `value` (the key's bytes are
/// followed by its type, 4 = u32, and the value).
fn patch_u32(src: &Path, dst: &Path, key: &str, value: u32) {
    let mut b = std::fs::read(src).unwrap();
    let k = key.as_bytes();
    let at = b.windows(k.len()).position(|w| w == k).unwrap() + k.len();
    assert_eq!(b[at..at + 4], 4u32.to_le_bytes());
    b[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(dst, b).unwrap();
}

#[test]
fn gguf_drafter_runs_like_its_checkpoint_and_lints_against_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let t = target(&tmp.path().join("target"));
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"w1 w2 w3 w4 w5 w6\"}\n{\"id\": \"b\", \"prompt\": \"w7 w8 w30\"}\n",
    )
    .unwrap();
    let db = tmp.path().join("runs.sqlite");
    let gguf = fixtures().join("dflash-bf16.gguf");
    let hf = fixtures().join("dflash");
    let run = |drafter: &Path| {
        let out = json_out(
            &dl(
                &cache,
                &[
                    "--json",
                    "run",
                    "--backend",
                    "cpu",
                    "--target",
                    s(&t),
                    "--drafter",
                    s(drafter),
                    "--prompts",
                    s(&prompts),
                    "--max-new-tokens",
                    "16",
                    "--db",
                    s(&db),
                ],
            ),
            "run",
        );
        out.as_array().unwrap()[0]["run_id"].as_i64().unwrap()
    };
    let (a, b) = (run(&hf), run(&gguf));
    let (x, y) = (stored(&db, a), stored(&db, b));
    assert!(!x.1.anchor.is_empty());
    assert_eq!(x.1.anchor, y.1.anchor);
    assert_eq!(x.1.draft_ids, y.1.draft_ids);
    assert_eq!(x.1.draft_logprobs, y.1.draft_logprobs);

    // lint --against: the correct conversion passes, with what it compared.
    let lint = |drafter: &Path| {
        dl(
            &cache,
            &[
                "--json",
                "lint",
                "--target",
                s(&t),
                "--drafter",
                s(drafter),
                "--against",
                s(&hf),
            ],
        )
    };
    let findings = json_out(&lint(&gguf), "lint --against");
    let codes: Vec<&str> = findings
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(
        codes.contains(&"gguf") && codes.contains(&"layer-ids") && codes.contains(&"values"),
        "{findings}"
    );
    assert!(
        findings
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["severity"] != "error"),
        "{findings}"
    );
    // A wrong mask id: lint names it and fails.
    let bad = tmp.path().join("mask.gguf");
    patch_u32(&gguf, &bad, "tokenizer.ggml.mask_token_id", 7);
    let o = lint(&bad);
    clean_error(
        &o,
        "lint --against, wrong mask id",
        &["mask.gguf", "incompatibilities"],
    );
    assert!(stdout(&o).contains("mask-id"), "{}", stdout(&o));
    // A file the loader refuses (layer ids stored unshifted, [0, 2]): run fails naming the file
    // and the key; lint --against reports the refusal and names the mistake.
    let unshifted = tmp.path().join("unshifted.gguf");
    let mut bytes = std::fs::read(&gguf).unwrap();
    let k = b"dflash.target_layers";
    let at = bytes.windows(k.len()).position(|w| w == k).unwrap() + k.len();
    // type 9 (array), element type u32 or i32, count 2, then the two ids.
    let ids = at + 4 + 4 + 8;
    bytes[ids..ids + 4].copy_from_slice(&0u32.to_le_bytes());
    bytes[ids + 4..ids + 8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&unshifted, bytes).unwrap();
    let o = dl(
        &cache,
        &[
            "run",
            "--backend",
            "cpu",
            "--target",
            s(&t),
            "--drafter",
            s(&unshifted),
            "--prompts",
            s(&prompts),
            "--db",
            s(&db),
        ],
    );
    clean_error(
        &o,
        "run, unshifted ids",
        &["unshifted.gguf", "dflash.target_layers[0] is 0"],
    );
    let o = dl(
        &cache,
        &[
            "lint",
            "--target",
            s(&t),
            "--drafter",
            s(&unshifted),
            "--against",
            s(&hf),
        ],
    );
    clean_error(&o, "lint --against, unshifted ids", &["unshifted.gguf"]);
    assert!(
        stdout(&o).contains("layer-ids-off-by-one"),
        "{}",
        stdout(&o)
    );
    assert_eq!(runs(&db).len(), 2);
}
