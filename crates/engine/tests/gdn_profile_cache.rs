//! `--gdn-profile` (docs/hybrid-models.md, "Choosing one") and what it must change: for a hybrid
//! target the profile is part of every cache key (the other profile's entries are never served)
//! and is recorded in every run's settings; a dense target has no Gated DeltaNet, so the flag
//! changes neither its keys nor its runs (`gdn_profile` is null).
//!
//! Hybrid: the random Qwen3.5 golden as GGUF (tests/fixtures/golden/qwen3_5/model.gguf, which
//! carries a tokenizer). Dense: SmolLM2 (`scripts/setup-fixtures.sh`).

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::GdnProfile;
use draftlens_engine::drafter::run::{run_eval, DrafterSpec, RunOptions};
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::session::{Session, SessionOptions};
use draftlens_results::store::{RunMode, Store};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn session(model: &Path, cache: &Path, profile: GdnProfile) -> Session<CpuBackend> {
    let opts = SessionOptions {
        gdn_profile: profile,
        ..Default::default()
    };
    Session::load(
        CpuBackend::new(),
        model,
        HiddenCache::open(cache).unwrap(),
        opts,
    )
    .unwrap()
}

fn entries(cache: &Path) -> usize {
    HiddenCache::open(cache).unwrap().list().unwrap().len()
}

/// A run with the oracle drafter (target-only) over two text prompts; returns the recorded
/// `gdn_profile` setting.
fn recorded_profile(s: &Session<CpuBackend>, dir: &Path) -> serde_json::Value {
    let prompts = dir.join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"abc def\"}\n{\"id\": \"b\", \"prompt\": \"hello\"}\n",
    )
    .unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let store = Store::open(&dir.join("runs.sqlite")).unwrap();
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: 6,
        fail_after: None,
    };
    let out = run_eval(
        s,
        &DrafterSpec::Oracle { block_size: 4 },
        &set,
        &opts,
        &store,
    )
    .unwrap();
    let run = store.run(out.run_id).unwrap().unwrap().run;
    run.config["gdn_profile"].clone()
}

#[test]
fn hybrid_profiles_have_their_own_cache_entries_and_are_recorded() {
    let model = root().join("tests/fixtures/golden/qwen3_5/model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let prompt: Vec<u32> = (1..40).map(|i| (i * 37) % 512).collect();

    let s = session(&model, &cache, GdnProfile::Reference);
    let reference = s.continuation(&prompt, 16).unwrap();
    assert!(s.model_loaded());
    // Entries are written by the session's background writer: on disk once flushed.
    s.flush_cache().unwrap();
    let n = entries(&cache);
    assert!(n >= 1);

    // The same profile again: served from the cache, the target is never loaded.
    let s = session(&model, &cache, GdnProfile::Reference);
    assert_eq!(s.continuation(&prompt, 16).unwrap().ids, reference.ids);
    assert!(
        !s.model_loaded(),
        "reference → reference must be a cache hit"
    );
    assert_eq!(entries(&cache), n);

    // The engine profile: not served the reference's entry; computes and stores its own.
    let s = session(&model, &cache, GdnProfile::Engine);
    s.continuation(&prompt, 16).unwrap();
    assert!(
        s.model_loaded(),
        "engine must not reuse the reference profile's entry"
    );
    s.flush_cache().unwrap();
    assert_eq!(entries(&cache), 2 * n);
    // ... which a second engine session then hits.
    let s2 = session(&model, &cache, GdnProfile::Engine);
    s2.continuation(&prompt, 16).unwrap();
    assert!(!s2.model_loaded());

    // Recorded with the run.
    let runs = tmp.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    assert_eq!(recorded_profile(&s, &runs), "engine");
    let r = session(&model, &cache, GdnProfile::Reference);
    assert_eq!(recorded_profile(&r, &runs), "reference");
}

#[test]
fn dense_targets_ignore_the_profile() {
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!(
            "skipping: {} not installed (scripts/setup-fixtures.sh)",
            model.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let s = session(&model, &cache, GdnProfile::Reference);
    let prompt = s
        .files
        .tokenizer()
        .unwrap()
        .encode("The capital of France is", true)
        .unwrap();
    let a = s.continuation(&prompt, 4).unwrap();
    s.flush_cache().unwrap();
    let n = entries(&cache);

    // Engine on a dense target: the same key, so a hit, and nothing new stored.
    let s = session(&model, &cache, GdnProfile::Engine);
    assert_eq!(s.continuation(&prompt, 4).unwrap().ids, a.ids);
    assert!(
        !s.model_loaded(),
        "a dense target's key must not depend on --gdn-profile"
    );
    assert_eq!(entries(&cache), n);
    assert_eq!(s.gdn_profile_name(), None);
    let runs = tmp.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    assert_eq!(recorded_profile(&s, &runs), serde_json::Value::Null);
}
