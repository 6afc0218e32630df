//! `draftlens trace import` end to end with the fixture model's tokenizer (SmolLM2: id 2 is
//! `<|im_end|>`, an end-of-generation token, as in the trace fixtures): the stored run, its τ in
//! `runs ls`, the store and `compare` (the web's statistics path), idempotence, and bad input
//! that stores nothing. The fixtures and their hand-computed τ: crates/results/tests/fixtures/
//! traces/ and crates/results/src/trace/tests.rs.

mod cli_util;

use cli_util::*;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    root()
        .join("crates/results/tests/fixtures/traces")
        .join(name)
}

/// The prompt set the fixtures refer to: ids p0, p1, p2.
fn write_set(dir: &Path) -> PathBuf {
    let set = dir.join("tiny.jsonl");
    write_prompts(
        &set,
        &[
            (
                "p0",
                Some("code"),
                "Write a function that adds two numbers.",
            ),
            ("p1", Some("code"), "Reverse a string in Python."),
            ("p2", Some("chat"), "Say hello."),
        ],
    );
    set
}

fn import(cache: &Path, db: &Path, set: &Path, trace: &Path, format: &str) -> std::process::Output {
    let model = model();
    dl(
        cache,
        &[
            "--json",
            "trace",
            "import",
            s(trace),
            "--format",
            format,
            "--prompts",
            s(set),
            "--target",
            s(&model),
            "--db",
            s(db),
        ],
    )
}

#[test]
fn vllm_trace_is_stored_with_its_normalised_tau_and_shown_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db) = (tmp.path().join("cache"), tmp.path().join("runs.sqlite"));
    let set = write_set(tmp.path());

    let out = json_out(
        &import(&cache, &db, &set, &fixture("vllm.jsonl"), "vllm"),
        "trace import vllm",
    );
    // Hand-computed: rounds [4,1,3,2], [4,2], [2,1,1] → τ 2.5, 3, 4/3.
    let macro_tau = (2.5 + 3.0 + 4.0 / 3.0) / 3.0;
    assert!(
        (out["report"]["tau_macro"].as_f64().unwrap() - macro_tau).abs() < 1e-12,
        "{out}"
    );
    assert_eq!(out["report"]["tau_pooled"].as_f64(), Some(20.0 / 9.0));
    assert_eq!(out["new"], true);
    let names: Vec<&str> = out["report"]["corrections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["bonus-token", "eos-in-accepted-block", "undrafted-steps"]
    );
    let id = out["run"].as_i64().unwrap();

    // The store: a complete run whose origin is the engine, with the native τ rows.
    let run = &runs(&db)[0];
    assert_eq!(
        run.origin,
        "trace:vllm:vllm.jsonl (bonus-token, eos-in-accepted-block, undrafted-steps)"
    );
    assert_eq!(
        (run.backend.as_str(), run.block_size, run.num_prompts),
        ("vllm", 4, 3)
    );
    let tau = metric_map(&db, id)
        .into_iter()
        .find(|(k, _)| k == "native/tau_replayed_macro/run")
        .map(|(_, m)| m.value)
        .unwrap();
    assert!((tau - macro_tau).abs() < 1e-12);

    // runs ls lists it; the text report names the corrections.
    let ls = dl(&cache, &["runs", "ls", "--db", s(&db)]);
    ok(&ls, "runs ls");
    assert!(
        stdout(&ls).contains("vllm trace vllm.jsonl"),
        "{}",
        stdout(&ls)
    );

    // A second trace, and compare folds both runs' statistics (the web's path).
    let neutral = json_out(
        &import(&cache, &db, &set, &fixture("neutral.jsonl"), "jsonl"),
        "trace import jsonl",
    );
    let id2 = neutral["run"].as_i64().unwrap();
    let cmp = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "compare",
                &id.to_string(),
                &id2.to_string(),
                "--db",
                s(&db),
            ],
        ),
        "compare",
    );
    let row = cmp["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"]["source"] == "native" && m["key"]["name"] == "tau_replayed_macro")
        .unwrap_or_else(|| panic!("compare lacks tau_replayed_macro: {cmp}"));
    assert!(
        (row["values"][0].as_f64().unwrap() - macro_tau).abs() < 1e-12,
        "{row}"
    );
    // neutral.jsonl: [3,1,2] and [4]: τ 2 and 4.
    assert_eq!(row["values"][1].as_f64(), Some(3.0), "{row}");

    // The same import again stores nothing new.
    let again = json_out(
        &import(&cache, &db, &set, &fixture("vllm.jsonl"), "vllm"),
        "import again",
    );
    assert_eq!(
        (again["run"].as_i64(), again["new"].as_bool()),
        (Some(id), Some(false))
    );
    assert_eq!(runs(&db).len(), 2);

    // Text output.
    let text = dl(
        &cache,
        &[
            "trace",
            "import",
            s(&fixture("sglang.jsonl")),
            "--format",
            "sglang",
            "--prompts",
            s(&set),
            "--target",
            s(&model()),
            "--db",
            s(&db),
        ],
    );
    ok(&text, "trace import sglang");
    let t = stdout(&text);
    assert!(t.contains("τ 2.1250 macro, 2.3333 pooled"), "{t}");
    assert!(
        t.contains("prefill-token") && t.contains("tokens-after-eos"),
        "{t}"
    );
}

#[test]
fn bad_traces_are_one_error_naming_the_record_and_store_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db) = (tmp.path().join("cache"), tmp.path().join("runs.sqlite"));
    let set = write_set(tmp.path());
    let bad = tmp.path().join("bad.jsonl");
    let ok_line = r#"{"prompt_id":"p0","token_ids":[100,101,102],"rounds":[2],"block_size":4}"#;
    let cases: [(&str, &[&str]); 3] = [
        (
            r#"{"prompt_id":"HumanEval/0","token_ids":[100,101],"rounds":[1],"block_size":4}"#,
            &[
                "bad.jsonl:2",
                "prompt \"HumanEval/0\" is not in the prompt set",
            ],
        ),
        (
            // SmolLM2 has 49,152 ids.
            r#"{"prompt_id":"p1","token_ids":[100,60000,7],"rounds":[2],"block_size":4}"#,
            &[
                "bad.jsonl:2",
                "do not decode with the target's tokenizer",
                "60000",
            ],
        ),
        (
            r#"{"prompt_id":"p1","token_ids":[100,101,102,103,104,105,106],"rounds":[6],"block_size":4}"#,
            &[
                "bad.jsonl:2",
                "round 1 commits 6 tokens, more than a round of block size 4 can",
            ],
        ),
    ];
    for (line, needles) in cases {
        std::fs::write(&bad, format!("{ok_line}\n{line}\n")).unwrap();
        let o = import(&cache, &db, &set, &bad, "jsonl");
        clean_error(&o, line, needles);
        assert!(
            !db.exists() || runs(&db).is_empty(),
            "{line}: something was stored"
        );
    }
}

/// Draftlens's own live loop (CPU, the reference drafter: lossless, and its rounds equal the
/// reference's replayed rounds, crates/engine/tests/drafter_eval (c)) on each prompt of `set`:
/// (prompt id, generated ids, tokens per round).
fn live_decodes(dir: &Path, set: &Path) -> Vec<(String, Vec<u32>, Vec<u32>)> {
    use draftlens_engine::backend::cpu::CpuBackend;
    use draftlens_engine::drafter::live::live_decode;
    use draftlens_engine::drafter::DFlashDrafter;
    use draftlens_engine::hidden_cache::HiddenCache;
    use draftlens_engine::prompts::PromptSet;
    use draftlens_engine::session::{Session, SessionOptions};
    let sess = Session::load(
        CpuBackend::new(),
        &model(),
        HiddenCache::open(&dir.join("live-cache")).unwrap(),
        SessionOptions::default(),
    )
    .unwrap();
    let d =
        DFlashDrafter::load(&sess.be, &reference_drafter(), sess.files.spec.hidden_size).unwrap();
    let set = PromptSet::load(s(set)).unwrap();
    set.prompts
        .iter()
        .map(|p| {
            let ids = sess.prompt_ids(p).unwrap();
            let live = live_decode(
                &sess.be,
                sess.model().unwrap(),
                &d,
                &ids,
                32,
                &sess.eos_ids(),
            )
            .unwrap();
            (p.id.clone(), live.ids, live.round_tokens)
        })
        .collect()
}

/// The live decodes as a neutral JSONL trace.
fn write_trace(path: &Path, decodes: &[(String, Vec<u32>, Vec<u32>)]) {
    let lines: Vec<String> = decodes
        .iter()
        .map(|(id, ids, rounds)| {
            serde_json::json!({"prompt_id": id, "token_ids": ids, "rounds": rounds, "block_size": 16}).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn diff_finds_the_round_an_engine_lost_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db) = (tmp.path().join("cache"), tmp.path().join("runs.sqlite"));
    let set = write_set(tmp.path());
    let diff = |run: i64| {
        json_out(
            &dl(
                &cache,
                &[
                    "--json",
                    "trace",
                    "diff",
                    &run.to_string(),
                    "--drafter",
                    s(&reference_drafter()),
                    "--target",
                    s(&model()),
                    "--backend",
                    "cpu",
                    "--db",
                    s(&db),
                ],
            ),
            "trace diff",
        )
    };

    let mut decodes = live_decodes(tmp.path(), &set);
    let faithful = tmp.path().join("live.jsonl");
    write_trace(&faithful, &decodes);
    let run = json_out(
        &import(&cache, &db, &set, &faithful, "jsonl"),
        "import live",
    )["run"]
        .as_i64()
        .unwrap();
    let d = diff(run);
    let sum = &d["summary"];
    assert_eq!(
        (sum["rounds_fewer"].as_u64(), sum["rounds_more"].as_u64()),
        (Some(0), Some(0)),
        "{sum}"
    );
    assert_eq!(sum["departures"], 0, "{sum}");
    assert_eq!(
        sum["tokens_lost_per_round"]["value"].as_f64(),
        Some(0.0),
        "{sum}"
    );
    // Its own chain on the same tokens is the live decode's: the same τ.
    assert_eq!(
        sum["engine_tau_pooled"], sum["reference_tau_pooled"],
        "{sum}"
    );
    assert!(
        sum["verdict"]
            .as_str()
            .unwrap()
            .starts_with("no verdict: 3 prompts"),
        "{sum}"
    );

    // An integration that loses drafts: p0's first round of two tokens or more commits 1, and
    // the rest in a round of its own.
    let rounds = &mut decodes.iter_mut().find(|d| d.0 == "p0").unwrap().2;
    let round = rounds
        .iter()
        .position(|&c| c >= 2)
        .expect("a round of two tokens or more");
    let tokens = rounds[round];
    rounds.splice(round..=round, [1, tokens - 1]);
    let lossy = tmp.path().join("lossy.jsonl");
    write_trace(&lossy, &decodes);
    let run = json_out(&import(&cache, &db, &set, &lossy, "jsonl"), "import lossy")["run"]
        .as_i64()
        .unwrap();
    let d = diff(run);
    let p0 = d["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "p0")
        .unwrap();
    let first = &p0["first_rounds"][0];
    assert_eq!(
        (
            first["round"].as_u64(),
            first["engine"].as_u64(),
            first["reference"].as_u64()
        ),
        (Some(round as u64), Some(1), Some(tokens as u64)),
        "{p0}"
    );
    let lost = d["summary"]["tokens_lost_per_round"]["value"]
        .as_f64()
        .unwrap();
    assert!(lost > 0.0, "{}", d["summary"]);
    // The other prompts are untouched.
    for p in d["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["id"] != "p0")
    {
        assert_eq!(p["rounds_fewer"], 0, "{p}");
    }
}
