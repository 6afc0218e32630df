//! `draftlens parity` through the built binary, CPU against CPU (the CUDA run is the same code with
//! another second backend): a hybrid target gets one comparison per GDN profile, in `--json` and
//! in the text table; a dense target gets a single comparison without a profile; a wrong
//! `--backends` is one clean error.

mod cli_util;

use cli_util::*;

#[test]
fn parity_cpu_against_cpu_on_a_hybrid_and_a_dense_target() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let prompts = tmp.path().join("p.jsonl");
    // Raw prompts: the random hybrid's synthetic vocabulary has no chat template.
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"prompt\": \"the quick brown fox\"}\n{\"id\": \"b\", \"prompt\": \"abc abc def\"}\n",
    )
    .unwrap();
    let hybrid = root().join("tests/fixtures/golden/qwen3_5/model.gguf");
    let dense = model();
    let base = ["parity", "--backends", "cpu,cpu", "--prompts", s(&prompts)];

    let args = [&["--json"][..], &base, &["--target", s(&hybrid)]].concat();
    let v = json_out(&dl(&cache, &args), "parity on the hybrid");
    assert_eq!(v["reference"], "cpu/reference");
    assert_eq!(
        v["layer_kinds"],
        serde_json::json!([
            "embedding",
            "gdn",
            "gdn",
            "attention",
            "gdn",
            "gdn",
            "attention"
        ])
    );
    let c = v["comparisons"].as_array().unwrap();
    assert_eq!(c.len(), 2, "default --gdn-profiles reference,engine");
    assert_eq!(
        (&c[0]["gdn_profile"], &c[0]["gated"]),
        (&"reference".into(), &true.into())
    );
    assert_eq!(
        (&c[1]["gdn_profile"], &c[1]["gated"]),
        (&"engine".into(), &false.into())
    );
    let rel = |i: usize, k: usize| {
        c[i]["target"]["layers"][k]["diff"]["rel_l2"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(rel(0, 6), 0.0);
    assert_eq!(rel(1, 0), 0.0);
    assert!(
        rel(1, 1) > 1e-4 && rel(1, 6) > 1e-4,
        "{}",
        c[1]["target"]["layers"]
    );
    assert_eq!(v["pass"], true);

    let args = [
        &base[..],
        &["--target", s(&hybrid), "--gdn-profiles", "engine"],
    ]
    .concat();
    let o = dl(&cache, &args);
    ok(&o, "parity text");
    let t = stdout(&o);
    assert!(t.contains("cpu/engine vs cpu/reference"), "{t}");
    assert!(
        !t.contains("cpu/reference vs"),
        "only the engine profile was asked for:\n{t}"
    );
    assert!(t.contains("gdn") && t.contains("attention"), "{t}");

    let args = [
        &["--json"][..],
        &base,
        &["--target", s(&dense), "--limit", "1"],
    ]
    .concat();
    let v = json_out(&dl(&cache, &args), "parity on a dense target");
    assert_eq!(v["reference"], "cpu");
    assert_eq!(v["comparisons"].as_array().unwrap().len(), 1);
    assert!(v["comparisons"][0]["gdn_profile"].is_null());
    assert_eq!(v["layer_kinds"].as_array().unwrap().len(), 31);

    clean_error(
        &dl(
            &cache,
            &["parity", "--backends", "cpu", "--target", s(&hybrid)],
        ),
        "one backend",
        &["--backends takes exactly two"],
    );
}
