//! `draftlens parity` on a hybrid target, CPU against CPU (CI has no GPU; the report is generic
//! over backends, and the lead runs it CPU against CUDA): the random Qwen3.5 golden as GGUF with a
//! random DFlash drafter. The reference profile against itself must be exact everywhere with
//! identical drafter metrics; the engine profile must differ from the first Gated DeltaNet layer
//! on (and not at the embedding), be reported but not fail the run, and give the drafter its own
//! metrics.

use draftlens_engine::backend::cpu::CpuBackend;
use draftlens_engine::backend::GdnProfile;
use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
use draftlens_engine::drafter::run::DrafterSpec;
use draftlens_engine::hidden_cache::HiddenCache;
use draftlens_engine::parity_report::{format_report, parity_report, ParityOptions};
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::session::Session;
use draftlens_results::store::Store;
use std::path::Path;

#[test]
fn hybrid_parity_cpu_against_cpu_reports_both_profiles_and_the_drafter() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/qwen3_5/model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let open = || {
        Session::load(
            CpuBackend::new(),
            &model,
            HiddenCache::open(&cache).unwrap(),
            Default::default(),
        )
        .unwrap()
    };
    let (mut a, mut b) = (open(), open());

    let drafter = tmp.path().join("drafter");
    let r = RandomDrafter {
        layers: 1,
        block_size: 4,
        target_layer_ids: vec![1, 3, 4],
        intermediate_size: 64,
        mask_token_id: 511,
        sliding_layers: 0,
        sliding_window: 0,
        seed: 3,
    };
    write_random_checkpoint(&drafter, &a.files.spec, &r).unwrap();
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"the quick brown fox jumps over the lazy dog\"}\n\
         {\"id\": \"b\", \"prompt\": \"abc abc abc def\"}\n",
    )
    .unwrap();
    let set = PromptSet::load_path(&prompts).unwrap();
    let store = Store::open(&tmp.path().join("runs.sqlite")).unwrap();
    let opts = ParityOptions {
        profiles: vec![GdnProfile::Reference, GdnProfile::Engine],
        drafter: Some(DrafterSpec::Checkpoint {
            dir: drafter,
            step: None,
            series: "parity".into(),
        }),
        max_new_tokens: 24,
    };
    let rep = parity_report(&mut a, &mut b, &set, &opts, &store).unwrap();

    assert_eq!(rep.reference, "cpu/reference");
    assert_eq!(
        rep.layer_kinds,
        [
            "embedding",
            "gdn",
            "gdn",
            "attention",
            "gdn",
            "gdn",
            "attention"
        ]
    );
    assert_eq!(rep.comparisons.len(), 2);
    assert!(
        rep.pass,
        "the engine profile is reported, not held to the tolerances"
    );

    let same = &rep.comparisons[0];
    assert_eq!(
        (same.label.as_str(), same.gdn_profile, same.gated),
        ("cpu/reference", Some("reference"), true)
    );
    assert_eq!(same.target.layers.len(), 7);
    for l in &same.target.layers {
        assert!(
            l.pass && l.diff.rel_l2 == 0.0 && l.diff.max_abs == 0.0,
            "{l:?}"
        );
    }
    assert_eq!(same.target.greedy_agree, same.target.greedy_total);
    assert!(same.target.tokens > 0);
    let dref = rep.reference_drafter.as_ref().unwrap();
    assert!(
        dref.scalars.keys().any(|k| k.starts_with("tau")),
        "{:?}",
        dref.scalars
    );
    assert_eq!(dref.per_position.len(), 3, "block 4: positions 1..3");
    assert!(!same.drafter_delta.is_empty());
    for (name, x, y, d) in &same.drafter_delta {
        assert!(*d == 0.0 || (x.is_nan() && y.is_nan()), "{name}: {x} → {y}");
    }
    assert_eq!(
        same.drafter.as_ref().unwrap().per_position,
        dref.per_position
    );

    let engine = &rep.comparisons[1];
    assert_eq!(
        (engine.label.as_str(), engine.gdn_profile, engine.gated),
        ("cpu/engine", Some("engine"), false)
    );
    let rel: Vec<f64> = engine.target.layers.iter().map(|l| l.diff.rel_l2).collect();
    assert_eq!(rel[0], 0.0, "the embedding does not depend on the profile");
    // bf16 roundings inside the first GDN layer's core: ~1e-3 relative, growing with depth.
    assert!(rel[1] > 1e-4, "{rel:?}");
    assert!(rel[6] > rel[1], "{rel:?}");
    assert!(engine.drafter.is_some());
    assert_eq!(engine.drafter_delta.len(), same.drafter_delta.len());

    let text = format_report(&rep);
    assert!(text.contains("cpu/engine vs cpu/reference"), "{text}");
    assert!(
        text.contains("hidden_states[1]      gdn") || text.contains(" gdn "),
        "{text}"
    );
    assert!(text.contains("drafter acceptance by position"), "{text}");
    let json = serde_json::to_value(&rep).unwrap();
    assert_eq!(json["comparisons"][1]["gdn_profile"], "engine");
    assert_eq!(json["layer_kinds"][3], "attention");
}
