//! Sampling at T > 0 through the built binary (docs/metrics.md §7, docs/live.md §5): bad
//! settings are one error naming the flag before any model is loaded; `live --temperature` is
//! reproducible from its seed and reports no greedy comparison; `run --temperature` stores its
//! settings and the expected-acceptance rows. Losslessness in distribution and the agreement of
//! live τ with the expectation are tested in the engine (crates/engine/tests/speculative_sampling.rs).

mod cli_util;

use cli_util::*;

/// `args` fail cleanly with one error line containing `needles`, and fast: the target given does
/// not exist, so an error about it would mean the settings were not checked first.
fn refused(cache: &std::path::Path, args: &[&str], needles: &[&str]) {
    let mut all = args.to_vec();
    all.extend(["--target", "/nonexistent/model.gguf", "--backend", "cpu"]);
    let o = dl(cache, &all);
    let line = clean_error(&o, &args.join(" "), needles);
    assert!(!line.contains("nonexistent"), "{line}");
}

#[test]
fn bad_sampling_settings_are_one_error_naming_the_flag_before_any_model_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let drafter = reference_drafter();
    let live = |extra: &[&'static str]| {
        let mut a = vec!["live", "--drafter", s(&drafter)];
        a.extend(extra);
        a
    };
    for (extra, needles) in [
        (&["--temperature", "-1"][..], &["--temperature", "≥ 0"][..]),
        (&["--temperature", "nan"], &["--temperature"]),
        (
            &["--temperature", "1", "--top-p", "1.5"],
            &["--top-p", "(0, 1]"],
        ),
        (
            &["--temperature", "1", "--top-p", "0"],
            &["--top-p", "(0, 1]"],
        ),
        (&["--temperature", "1", "--top-k", "0"], &["--top-k"]),
        (&["--top-p", "0.9"], &["--top-p", "--temperature"]),
        (
            &["--top-k", "20", "--seed", "3"],
            &["--top-k, --seed", "--temperature"],
        ),
        (
            &["--temperature", "1", "--strict"],
            &["--strict", "--temperature 0"],
        ),
    ] {
        refused(&cache, &live(extra), needles);
    }
    let run = |extra: &[&'static str]| {
        let mut a = vec!["run", "--drafter", s(&drafter), "--db"];
        a.push("/nonexistent/runs.sqlite");
        a.extend(extra);
        a
    };
    for (extra, needles) in [
        (&["--temperature", "-0.5"][..], &["--temperature"][..]),
        (
            &["--temperature", "1"],
            &["--sampling-top-k missing", "--top-k 8"],
        ),
        (
            &["--temperature", "1", "--sampling-top-k", "20"],
            &["--sampling-top-k 20", "at most 8"],
        ),
        (
            &[
                "--temperature",
                "1",
                "--sampling-top-k",
                "8",
                "--stride",
                "2",
            ],
            &["--stride"],
        ),
        (
            &["--sampling-seed", "1"],
            &["--sampling-seed", "--temperature"],
        ),
    ] {
        refused(&cache, &run(extra), needles);
    }
}

#[test]
fn live_at_t1_is_reproducible_from_its_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, prompts) = (tmp.path().join("cache"), tmp.path().join("two.jsonl"));
    write_two_prompts(&prompts);
    let drafter = reference_drafter();
    let live = |seed: &str| {
        let args = [
            "--json",
            "live",
            "--backend",
            "cpu",
            "--drafter",
            s(&drafter),
            "--prompts",
            s(&prompts),
            "--max-new-tokens",
            "8",
            "--temperature",
            "1",
            "--top-k",
            "20",
            "--seed",
            seed,
        ];
        json_out(&dl(&cache, &args), "live --temperature 1")
    };
    let (a, b, c) = (live("3"), live("3"), live("4"));
    assert_eq!(a, b, "the same seed gives the same outputs");
    let rows = a.as_array().expect("a list of prompts");
    assert_eq!(rows.len(), 2);
    for r in rows {
        // A sample is compared with nothing: no losslessness verdict, no divergence.
        assert!(r["lossless"].is_null() && r["divergence"].is_null(), "{r}");
        assert_eq!(r["new_tokens"], 8, "{r}");
        assert!(r["tau"].as_f64().unwrap() >= 1.0, "{r}");
    }
    let texts = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["text"].to_string())
            .collect()
    };
    assert_ne!(texts(&a), texts(&c), "another seed draws other tokens");
}

#[test]
fn run_at_t1_stores_its_settings_and_the_expected_acceptance() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, prompts) = (tmp.path().join("cache"), tmp.path().join("two.jsonl"));
    let db = tmp.path().join("runs.sqlite");
    write_two_prompts(&prompts);
    let drafter = reference_drafter();
    let args = [
        "run",
        "--backend",
        "cpu",
        "--drafter",
        s(&drafter),
        "--prompts",
        s(&prompts),
        "--max-new-tokens",
        "12",
        "--db",
        s(&db),
        "--temperature",
        "1",
        "--top-p",
        "0.95",
        "--sampling-top-k",
        "8",
        "--sampling-seed",
        "5",
    ];
    ok(&dl(&cache, &args), "run --temperature 1");
    let run = &runs(&db)[0];
    let sampling = &run.config["eval"]["sampling"];
    assert_eq!(
        sampling,
        &serde_json::json!({"temperature": 1.0, "top_k": 8, "top_p": 0.95, "draft": "sampled", "seed": 5}),
        "{}",
        run.config
    );
    let metrics = metric_map(&db, run.id);
    let value = |name: &str| {
        metrics
            .iter()
            .map(|(_, r)| r)
            .find(|r| r.name == name && r.scope == draftlens_results::store::MetricScope::Run)
            .unwrap_or_else(|| panic!("no {name}"))
            .value
    };
    let (macro_tau, uniform, alpha) = (
        value("tau_sampled_replayed_macro"),
        value("tau_sampled_uniform"),
        value("alpha_sampled"),
    );
    assert!((1.0..=16.0).contains(&macro_tau), "{macro_tau}");
    assert!((1.0..=16.0).contains(&uniform), "{uniform}");
    assert!((0.0..=1.0).contains(&alpha), "{alpha}");
    // The greedy metrics are still there (over the sampled sequences).
    value("tau_replayed_macro");
}
