//! `random:DIR` targets (crates/engine/src/model/random_target.rs, docs/loading.md §7): weights
//! generated at load, through the loader, the memory estimate and the forward of a real folder.
//!
//! - Same code path: a random target of the dense, the hybrid MoE and the gpt-oss MXFP4 golden
//!   configs decodes and captures, through the session API, bit-identically to the same weights
//!   written as a safetensors folder (BF16, the MXFP4 experts as U8 blocks and scales) and
//!   loaded from disk.
//! - Identity: known at open, the same on every open, the documented hash, different with the
//!   seed, the init and the config, never a file hash.
//! - Bad input: a missing folder, a folder without config.json, an unknown architecture, a
//!   quantisation the generator cannot honour, a bad random.json: one error naming the file and
//!   the key.
//! - Memory: Qwen3.5-122B-A10B's published config as a random target is refused by the session
//!   before any weight is generated, with the numbers; the estimate of the published
//!   Qwen3.5-35B-A3B, Qwen3.5-122B-A10B and gpt-oss-120b configs as random targets on an 80 GB
//!   H100 and a 141 GB H200 (the figures the GPU run, tools/bench/moe_memory_device.sh, checks).
//!
//! Host memory while generating: tests/random_target_memory.rs (its own process).

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::memory::{does_not_fit, MemoryModel};
use draftlens_engine::drafter::mtp::MtpHeadConfig;
use draftlens_engine::formats::WeightSource;
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::model::random_target::{target_exists, RandomTarget};
use draftlens_engine::model::{Capture, ModelSpec, TargetFiles};
use draftlens_engine::session::{Session, SessionOptions};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

const GIB: u64 = 1 << 30;

fn golden(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden")
        .join(rel)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A folder holding `config` as config.json (and `random` as random.json), nothing else.
fn random_dir(parent: &Path, name: &str, config: &Value, random: Option<&Value>) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    if let Some(r) = random {
        std::fs::write(dir.join("random.json"), r.to_string()).unwrap();
    }
    dir
}

/// A word-level tokenizer (ids w0..w39, end of text w39) in `dir`, as a real folder has one.
fn write_tokenizer(dir: &Path) {
    let vocab: serde_json::Map<String, Value> =
        (0..40).map(|i| (format!("w{i}"), i.into())).collect();
    let tok = json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "w39"}"#).unwrap();
}

fn target(dir: &Path) -> PathBuf {
    PathBuf::from(format!("random:{}", dir.display()))
}

/// The weights `random:dir` generates, written as a Hugging Face folder `out` (config.json
/// copied, one model.safetensors): each tensor as listed, BF16 values or U8 MXFP4 bytes, made
/// through the generator's own API, not through the loader's.
fn write_as_safetensors(dir: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    let spec = ModelSpec::from_hf_config(&dir.join("config.json")).unwrap();
    let w = RandomTarget::open(dir)
        .unwrap()
        .weights(&spec, Path::new("random:written"));
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in w.tensors() {
        let (dtype, bytes) = match t.dtype.as_str() {
            "U8" => (
                Dtype::U8,
                (0..t.shape[0])
                    .flat_map(|e| w.generated_u8_slice(&t.name, e).unwrap())
                    .collect(),
            ),
            "BF16" => (
                Dtype::BF16,
                w.tensor(&t.name)
                    .unwrap()
                    .data
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
            other => panic!("{}: listed as {other}", t.name),
        };
        tensors.push((t.name, dtype, t.shape, bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
}

fn session(target: &Path, cache: &Path, free: Option<u64>) -> anyhow::Result<Session<CpuBackend>> {
    let opts = SessionOptions {
        free_memory_override: free,
        ..Default::default()
    };
    Session::load(
        CpuBackend::new(),
        target,
        HiddenCache::open(cache).unwrap(),
        opts,
    )
}

/// Greedy continuations (6 tokens) of three prompts, then the target passes over prompt +
/// continuation capturing every layer's output: (continuation ids, captured states as f32).
fn work(s: &Session<CpuBackend>) -> (Vec<Vec<u32>>, Vec<Vec<Vec<f32>>>) {
    let prompts: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5], vec![7, 100, 3], (10..30).collect()];
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let conts = s.continuations(&refs, 6).unwrap();
    let seqs: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&conts)
        .map(|(p, c)| p.iter().chain(&c.ids).copied().collect())
        .collect();
    let srefs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let layers = s.files.spec.num_layers;
    let capture = Capture::for_layer_ids(&(0..layers).collect::<Vec<_>>(), layers).unwrap();
    let passes = s.target_passes(&srefs, &capture, 8).unwrap();
    let states = passes
        .iter()
        .map(|p| {
            p.hidden
                .iter()
                .map(|(_, h)| h.to_f32().into_owned())
                .collect()
        })
        .collect();
    (conts.into_iter().map(|c| c.ids).collect(), states)
}

#[test]
fn a_random_target_computes_bit_identically_to_its_weights_written_as_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, rel, seed) in [
        ("qwen3", "qwen3", 3),
        ("qwen3_5_moe", "qwen3_5_moe", 5),
        ("gpt_oss_mxfp4", "gpt_oss_mxfp4", 7),
    ] {
        let config = read_json(&golden(rel).join("config.json"));
        // Larger values than the default init, so that every layer moves the hidden state.
        let settings = json!({"seed": seed, "init": {"matrix_std": 0.08, "norm_spread": 0.3}});
        let dir = random_dir(tmp.path(), name, &config, Some(&settings));
        let written = tmp.path().join(format!("{name}-written"));
        write_as_safetensors(&dir, &written);
        write_tokenizer(&dir);
        write_tokenizer(&written);

        let random = session(&target(&dir), &tmp.path().join(format!("c-{name}")), None).unwrap();
        assert_eq!(random.files.identity.format, "random");
        let listed: Vec<String> = random
            .files
            .weights
            .tensors()
            .into_iter()
            .map(|t| t.dtype)
            .collect();
        assert!(
            listed.iter().all(|d| d == "BF16" || d == "U8"),
            "{name}: {listed:?}"
        );
        if name == "gpt_oss_mxfp4" {
            assert!(
                listed.iter().any(|d| d == "U8"),
                "gpt-oss experts as MXFP4 blocks"
            );
        }
        let disk = session(&written, &tmp.path().join(format!("d-{name}")), None).unwrap();
        assert_eq!(disk.files.identity.format, "safetensors");
        let (a, b) = (work(&random), work(&disk));
        assert_eq!(a.0, b.0, "{name}: greedy continuations");
        assert_eq!(a.1, b.1, "{name}: captured hidden states, bit for bit");
        // Not a degenerate network: the states differ between layers and from the embedding.
        let first = &a.1[2];
        assert_ne!(first[0], first[first.len() - 1], "{name}");
        assert!(first.iter().flatten().all(|v| v.is_finite()), "{name}");
    }
}

#[test]
fn the_identity_is_the_documented_hash_of_config_and_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let config = read_json(&golden("qwen3/config.json"));
    let sha = |dir: &Path| {
        let f = TargetFiles::open(&target(dir)).unwrap();
        // Known at open: nothing to hash, nothing hashing in the background.
        assert_eq!(
            f.identity.remembered_sha256(),
            Some(f.identity.weights_sha256().unwrap())
        );
        assert!(f.identity.weight_files.is_empty());
        f.identity.weights_sha256().unwrap()
    };
    let plain = random_dir(tmp.path(), "plain", &config, None);
    let a = sha(&plain);
    assert_eq!(a, sha(&plain), "stable across opens");
    // docs/loading.md §7: sha256("draftlens random weights v1\n" + config.json + "\n" +
    // "seed N matrix_half_width H norm_spread S"), H and S as f32 bit patterns.
    let mut bytes = b"draftlens random weights v1\n".to_vec();
    bytes.extend(std::fs::read(plain.join("config.json")).unwrap());
    bytes.extend(
        format!(
            "\nseed 0 matrix_half_width {:08x} norm_spread {:08x}",
            0.0346f32.to_bits(),
            0.1f32.to_bits()
        )
        .as_bytes(),
    );
    assert_eq!(a, draftlens_results::sha256_hex(&bytes));
    let explicit = random_dir(tmp.path(), "seed0", &config, Some(&json!({"seed": 0})));
    assert_eq!(sha(&explicit), a, "random.json with the defaults");

    let mut others = vec![
        sha(&random_dir(
            tmp.path(),
            "seed1",
            &config,
            Some(&json!({"seed": 1})),
        )),
        sha(&random_dir(
            tmp.path(),
            "init",
            &config,
            Some(&json!({"init": {"matrix_std": 0.02, "norm_spread": 0.1}})),
        )),
    ];
    let mut changed = config.clone();
    changed["rms_norm_eps"] = json!(1e-5);
    others.push(sha(&random_dir(tmp.path(), "config", &changed, None)));
    // The same weights read from files hash their file, never this.
    let written = tmp.path().join("written");
    write_as_safetensors(&plain, &written);
    others.push(
        TargetFiles::open(&written)
            .unwrap()
            .identity
            .weights_sha256()
            .unwrap(),
    );
    for (i, o) in others.iter().enumerate() {
        assert_ne!(*o, a, "variant {i}");
    }
    let to_json = TargetFiles::open(&target(&plain))
        .unwrap()
        .identity
        .to_json()
        .unwrap();
    assert_eq!(to_json["format"], "random");
    assert_eq!(to_json["path"], json!(target(&plain)));
}

fn err(target: &Path) -> String {
    match TargetFiles::open(target) {
        Ok(_) => panic!("{} opened", target.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_random_targets_are_one_error_naming_the_file_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = read_json(&golden("qwen3/config.json"));
    let missing = tmp.path().join("nowhere");
    assert!(!target_exists(&target(&missing)));
    assert!(target_exists(&target(tmp.path())) && target_exists(tmp.path()));
    let e = err(&target(&missing));
    assert!(
        e.starts_with(&format!("{}: no such folder", missing.display())),
        "{e}"
    );

    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = err(&target(&empty));
    assert!(
        e.starts_with(&format!("{}: missing", empty.join("config.json").display()))
            && e.contains("--no-weights"),
        "{e}"
    );

    let mut unknown = config.clone();
    unknown["model_type"] = json!("mamba");
    let dir = random_dir(tmp.path(), "unknown", &unknown, None);
    let e = err(&target(&dir));
    assert!(
        e.contains(&format!("{}", dir.join("config.json").display()))
            && e.contains("unsupported architecture model_type \"mamba\""),
        "{e}"
    );

    let mut fp8 = config.clone();
    fp8["quantization_config"] = json!({"quant_method": "fp8"});
    let dir = random_dir(tmp.path(), "fp8", &fp8, None);
    let e = err(&target(&dir));
    assert_eq!(
        e,
        format!(
            "{}: quantization_config (quant_method \"fp8\") cannot be generated: a random: target's weights are bf16 (gpt_oss's experts MXFP4 blocks); remove the key to generate the unquantised qwen3 model",
            dir.join("config.json").display()
        )
    );

    for (name, settings, want) in [
        ("badjson", "{\"seed\": ", "expected {\"seed\": N"),
        ("unknown-key", "{\"sed\": 1}", "unknown field `sed`"),
        ("negative-seed", "{\"seed\": -1}", "invalid value"),
        (
            "zero-std",
            "{\"init\": {\"matrix_std\": 0, \"norm_spread\": 0.1}}",
            "init.matrix_std must be a positive number, found 0",
        ),
        (
            "half-init",
            "{\"init\": {\"matrix_std\": 0.02}}",
            "missing field `norm_spread`",
        ),
    ] {
        let dir = random_dir(tmp.path(), name, &config, None);
        std::fs::write(dir.join("random.json"), settings).unwrap();
        let e = err(&target(&dir));
        assert!(
            e.starts_with(&format!("{}: ", dir.join("random.json").display())) && e.contains(want),
            "{name}: {e}"
        );
    }

    // A hybrid's native MTP head is not generated: target:mtp names that.
    let hybrid = random_dir(
        tmp.path(),
        "hybrid",
        &read_json(&golden("qwen3_5_moe/config.json")),
        None,
    );
    let f = TargetFiles::open(&target(&hybrid)).unwrap();
    let e = format!(
        "{:#}",
        MtpHeadConfig::read(&f.identity.path, &f.spec).unwrap_err()
    );
    assert_eq!(
        e,
        format!(
            "random:{}: a random: target has no native MTP head (only the text model's weights are generated; docs/loading.md §7)",
            hybrid.display()
        )
    );

    // gpt-oss MXFP4 experts need dims that are multiples of 32: the loader's own check.
    let mut odd = read_json(&golden("gpt_oss_mxfp4/config.json"));
    odd["intermediate_size"] = json!(40);
    let dir = random_dir(tmp.path(), "odd", &odd, None);
    let e = err(&target(&dir));
    assert!(
        e.contains("intermediate_size 40 must be multiples of 32"),
        "{e}"
    );
}

// ---- Memory: the published configs (crates/engine/tests/memory_estimate.rs has their sources) ----

/// Qwen3.5 MoE as published (the composite config, the text model under `text_config`).
fn qwen3_5_moe(hidden: u64, layers: u64, heads: u64, v_heads: u64, width: u64) -> Value {
    json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 2,
            "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": v_heads, "moe_intermediate_size": width,
            "shared_expert_intermediate_size": width, "num_experts": 256,
            "num_experts_per_tok": 8, "full_attention_interval": 4,
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25}
        }
    })
}

fn gpt_oss_120b() -> Value {
    let kinds: Vec<&str> = (0..36)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    json!({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": true,
        "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880, "layer_types": kinds,
        "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
        "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 150000,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": false},
        "sliding_window": 128, "tie_word_embeddings": false, "vocab_size": 201088,
        "quantization_config": {"quant_method": "mxfp4"}
    })
}

#[test]
fn a_random_target_too_large_for_the_gpu_is_refused_before_any_weight_is_generated() {
    let tmp = tempfile::tempdir().unwrap();
    let q122 = random_dir(
        tmp.path(),
        "qwen3.5-122b-a10b",
        &qwen3_5_moe(3072, 48, 32, 64, 1024),
        None,
    );
    let t0 = Instant::now();
    let s = session(&target(&q122), &tmp.path().join("cache"), Some(139 * GIB)).unwrap();
    // Every entry point refuses the same way: the model itself, and a command's prompt check.
    let e = format!("{:#}", s.model().err().expect("refused"));
    let e2 = format!(
        "{:#}",
        s.check_memory(&[("p", 32_000)], 128, 0).unwrap_err()
    );
    let seconds = t0.elapsed().as_secs_f64();
    for e in [&e, &e2] {
        assert_eq!(e.lines().count(), 1, "{e}");
        for part in [
            "qwen3.5-122b-a10b (qwen3_5_moe) does not fit in the 139.00 GiB free on cpu",
            // The CPU reference holds f32: twice the bf16 checkpoint's 227.45 GiB.
            "weights 454.90 GiB (f32)",
            "Nothing was loaded or computed",
        ] {
            assert!(e.contains(part), "{part:?} missing from: {e}");
        }
    }
    assert!(!s.model_loaded());
    // 122 B parameters take minutes to generate on this machine's two cores: none were.
    assert!(seconds < 10.0, "{seconds:.1} s: weights were generated");
}

#[test]
fn the_full_size_random_targets_fit_or_are_refused_as_their_checkpoints_would() {
    let tmp = tempfile::tempdir().unwrap();
    let open = |name: &str, config: &Value| {
        TargetFiles::open(&target(&random_dir(tmp.path(), name, config, None))).unwrap()
    };
    let q35 = open("q35", &qwen3_5_moe(2048, 40, 16, 32, 512));
    let q122 = open("q122", &qwen3_5_moe(3072, 48, 32, 64, 1024));
    let oss = open("oss120", &gpt_oss_120b());
    // What the loader would read: the listing's bytes are the checkpoints' (bf16; gpt-oss's
    // experts MXFP4 at 17 bytes per 32 parameters) and the estimate's weights term equals them.
    let listed = |f: &TargetFiles| f.weights.tensors().iter().map(|t| t.bytes).sum::<u64>();
    for (f, gib) in [(&q35, 64.56), (&q122, 227.45), (&oss, 60.77)] {
        let mm = MemoryModel::with_mxfp4(&f.spec, "bf16", true);
        assert_eq!(mm.weights, listed(f), "{}", f.identity.path.display());
        assert_eq!(
            format!("{:.2}", mm.weights as f64 / GIB as f64),
            format!("{gib:.2}")
        );
    }
    // A 32k-token prompt decoded alone, capturing 5 taps: on an 80 GB H100 (79 GiB free) and a
    // 141 GB H200 (139 GiB free).
    for free in [79 * GIB, 139 * GIB] {
        for f in [&q35, &oss] {
            let est = MemoryModel::with_mxfp4(&f.spec, "bf16", true).estimate(1, 32_768, 128, 5);
            assert!(
                est.total_bytes <= free,
                "{}: {}",
                f.identity.path.display(),
                est.describe()
            );
        }
        let est = MemoryModel::with_mxfp4(&q122.spec, "bf16", true).estimate(1, 32_768, 128, 5);
        assert!(est.weights_exceed(free));
        let line = does_not_fit("q122 (qwen3_5_moe)", "cuda", &est, free);
        assert!(line.contains("weights 227.45 GiB (bf16)"), "{line}");
    }
}
