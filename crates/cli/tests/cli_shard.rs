//! `run --shard I/N` and `draftlens merge` end to end, through the built binary, on the default
//! target (CPU) and the reference drafter (docs/scale-out.md):
//!
//! - 1, 2 and 3 shards (the 3-shard split has a shard with no prompt), each evaluated with its
//!   own fresh cache, merge into a run whose prompts, records, every metric row (native and the
//!   built-in plugins', every scope) equal the unsharded run's bit for bit;
//! - merging the same shards again writes nothing and returns the same run;
//! - every bad merge (different evaluations, overlapping shards, missing shards, a failed or
//!   unfinished shard) is one clean error naming the runs, and nothing is written; a failed shard
//!   rerun to completion is merged with its complete run.

mod cli_util;

use cli_util::*;
use draftlens_engine::prompts::Prompt;
use draftlens_results::shard::Shard;
use draftlens_results::store::{NewRun, RunEval, RunPrompt, RunStatus, Store};
use std::path::{Path, PathBuf};

const MAX_NEW: &str = "12";
const PLUGINS: [&str; 2] = ["replayed-tau", "accept-length"];

/// Three chat prompts whose content hashes put them in shards {sum, tea} / {rev} of 2 and
/// {rev} / {sum, tea} / {} of 3 (checked by `assignment_of_the_test_prompts`).
const PROMPTS: [(&str, Option<&str>, &str); 3] = THREE_PROMPTS;

fn chat(text: &str) -> Prompt {
    Prompt {
        id: String::new(),
        text: None,
        messages: Some(vec![draftlens_engine::chat::ChatMessage {
            role: "user".into(),
            content: text.into(),
        }]),
        category: None,
        language: None,
        completion: None,
        enable_thinking: None,
    }
}

fn ids_of(shard: Shard) -> Vec<&'static str> {
    PROMPTS
        .iter()
        .filter(|p| shard.owns_hash(&chat(p.2).hash()))
        .map(|p| p.0)
        .collect()
}

#[test]
fn assignment_of_the_test_prompts() {
    let sh = |i, n| Shard::new(i, n).unwrap();
    assert_eq!(ids_of(sh(0, 2)), ["sum", "tea"]);
    assert_eq!(ids_of(sh(1, 2)), ["rev"]);
    assert_eq!(ids_of(sh(0, 3)), ["rev"]);
    assert_eq!(ids_of(sh(1, 3)), ["sum", "tea"]);
    assert!(
        ids_of(sh(2, 3)).is_empty(),
        "the 3-shard split needs an empty shard"
    );
}

fn run_args<'a>(prompts: &'a Path, db: &'a Path, drafter: &'a Path) -> Vec<&'a str> {
    let mut v = vec![
        "--json",
        "run",
        "--backend",
        "cpu",
        "--drafter",
        s(drafter),
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        MAX_NEW,
        "--db",
        s(db),
    ];
    for p in PLUGINS {
        v.extend(["--plugin", p]);
    }
    v
}

fn merge(cache: &Path, dest: &Path, sources: &[&Path]) -> std::process::Output {
    let mut args = vec!["--json", "merge", "--db", s(dest)];
    args.extend(sources.iter().map(|p| s(p)));
    dl(cache, &args)
}

#[test]
fn merged_shards_equal_the_unsharded_run_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("three.jsonl");
    write_prompts(&prompts, &PROMPTS);
    let d = reference_drafter();
    let full_db = tmp.path().join("full.sqlite");
    json_out(
        &dl(
            &tmp.path().join("cache-full"),
            &run_args(&prompts, &full_db, &d),
        ),
        "unsharded run",
    );
    let full = runs(&full_db);
    assert_eq!((full.len(), full[0].num_prompts), (1, 3));
    let want = stored(&full_db, full[0].id);
    assert!(want
        .2
        .iter()
        .any(|m| m.0 == "native/tau_replayed_macro/run"));
    assert!(want.2.iter().any(|m| m.0.starts_with("replayed-tau/")));
    assert_eq!(want.3.len(), 2, "both plugins scored the unsharded run");
    let identity = Store::open(&full_db)
        .unwrap()
        .run_eval(full[0].id)
        .unwrap()
        .unwrap()
        .identity;

    for n in 1..=3u32 {
        // Each split computes everything anew (its own cache): equal records then also show
        // that a prompt's evaluation does not depend on which prompts share its process.
        let cache = tmp.path().join(format!("cache-{n}"));
        // 3 shards share one database (merge from one file); 1 and 2 use one file per shard.
        let dbs: Vec<PathBuf> = (0..n)
            .map(|i| {
                let f = if n == 3 {
                    "three".into()
                } else {
                    format!("{n}-{i}")
                };
                tmp.path().join(format!("shard-{f}.sqlite"))
            })
            .collect();
        for i in 0..n {
            let shard = format!("{i}/{n}");
            let mut args = run_args(&prompts, &dbs[i as usize], &d);
            args.extend(["--shard", &shard]);
            let out = json_out(&dl(&cache, &args), &format!("run --shard {shard}"));
            let expected = ids_of(Shard::new(i, n).unwrap()).len();
            assert_eq!(out[0]["prompts"], expected, "{shard}: {out}");
        }
        let mut sources: Vec<&Path> = dbs.iter().map(|p| p.as_path()).collect();
        sources.dedup();
        // Every shard run carries the unsharded run's identity and its shard.
        for db in &sources {
            let store = Store::open(db).unwrap();
            for (r, e) in store.shard_runs().unwrap() {
                assert_eq!(e.identity, identity, "{}", r.name);
                assert_eq!(e.set_prompts, 3);
                assert_eq!(r.status, RunStatus::Complete);
                assert!(
                    r.name.ends_with(&format!("shard {}", e.shard.unwrap())),
                    "{}",
                    r.name
                );
            }
        }
        let dest = tmp.path().join(format!("merged-{n}.sqlite"));
        let out = json_out(
            &merge(&cache, &dest, &sources),
            &format!("merge {n} shards"),
        );
        assert_eq!(
            (out["created"].as_bool(), out["shards"].as_u64()),
            (Some(true), Some(n as u64))
        );
        let merged = runs(&dest);
        assert_eq!(merged.len(), 1);
        let m = &merged[0];
        assert_eq!(
            (m.status, m.num_prompts, m.num_blocks),
            (RunStatus::Complete, 3, full[0].num_blocks)
        );
        assert_eq!(
            m.name, full[0].name,
            "the merged run is named like the unsharded one"
        );
        let got = stored(&dest, m.id);
        assert_same_stored(&got, &want, &format!("{n} shards: "));
        let e = Store::open(&dest).unwrap().run_eval(m.id).unwrap().unwrap();
        assert_eq!(
            (
                e.identity.as_str(),
                e.shard,
                e.merged_from.as_ref().map(|v| v.len())
            ),
            (identity.as_str(), None, Some(n as usize))
        );

        if n == 2 {
            // Idempotent: the same shards merged again give the same run, nothing new.
            let again = json_out(&merge(&cache, &dest, &sources), "merge again");
            assert_eq!(again["created"].as_bool(), Some(false));
            assert_eq!(again["run_id"], out["run_id"]);
            assert_eq!(again["uid"], out["uid"]);
            assert_eq!(runs(&dest).len(), 1);
            assert_eq!(stored(&dest, m.id), got);
        }
        if n == 3 {
            // Merged into the shards' own database: the merged run is not a shard, so merging
            // again finds the same three shards and the run of the first merge.
            let one = sources[0];
            let a = json_out(&merge(&cache, one, &[one]), "merge within one database");
            let b = json_out(
                &merge(&cache, one, &[]),
                "merge again (sources default to --db)",
            );
            assert_eq!(
                (a["created"].as_bool(), b["created"].as_bool()),
                (Some(true), Some(false))
            );
            assert_eq!(a["run_id"], b["run_id"]);
            assert_eq!(runs(one).len(), 4);
            assert_eq!(stored(one, a["run_id"].as_i64().unwrap()), got);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals, on shard runs written directly into stores (no model needed)
// ---------------------------------------------------------------------------------------------

/// Prompts "p0".."p{n-1}" (raw text) and their content hashes.
fn synth_prompts(n: u32) -> Vec<Prompt> {
    (0..n)
        .map(|i| Prompt {
            id: format!("p{i}"),
            text: Some(format!("synthetic prompt {i}")),
            messages: None,
            category: None,
            language: None,
            completion: None,
            enable_thinking: None,
        })
        .collect()
}

/// A shard run of a 6-prompt evaluation `identity`, with one record block per prompt, finished
/// with `status` (`Running` leaves it unfinished).
fn synth_shard(db: &Path, identity: &str, shard: Shard, status: RunStatus) -> i64 {
    let store = Store::open(db).unwrap();
    let set = synth_prompts(6);
    let mine = draftlens_engine::shard::prompts_of_shard(&shard, &set);
    let id = store
        .create_eval_run(
            &NewRun {
                name: format!("synthetic · shard {shard}"),
                block_size: 4,
                top_k: 2,
                ..Default::default()
            },
            &RunEval {
                identity: identity.into(),
                identity_json: serde_json::json!({ "name": identity }),
                shard: Some(shard),
                set_prompts: 6,
                run_prompts: mine.len() as u32,
                merged_from: None,
            },
        )
        .unwrap();
    for &i in &mine {
        let mut b = draftlens_records::RecordBatch::new(4, 2);
        let pos = draftlens_records::PositionSpec {
            target: Some(7),
            loss_mask: true,
            draft: vec![(7, -0.1), (8 + i as u32, -2.0)],
            target_top: None,
        };
        b.push_block(
            i as u32,
            5,
            draftlens_records::Region::Completion,
            &[pos.clone(), pos.clone(), pos],
        );
        store
            .add_prompt_records(
                id,
                &RunPrompt {
                    index: i as u32,
                    id: set[i].id.clone(),
                    sha256: set[i].hash(),
                    category: None,
                    prompt_len: 5,
                    token_ids: (0..10).collect(),
                    text: String::new(),
                },
                &b,
            )
            .unwrap();
    }
    match status {
        RunStatus::Running => {}
        RunStatus::Failed => store
            .finish_run(
                id,
                status,
                Some("CUDA out of memory"),
                &serde_json::json!({}),
            )
            .unwrap(),
        RunStatus::Complete => store
            .finish_run(id, status, None, &serde_json::json!({}))
            .unwrap(),
    }
    id
}

fn sh(i: u32, n: u32) -> Shard {
    Shard::new(i, n).unwrap()
}

/// `merge` of `sources` into a fresh database is one clean error containing `needles`, and the
/// destination was never created.
fn refused(tmp: &Path, sources: &[&Path], needles: &[&str]) -> String {
    let dest = tmp.join("merged-refused.sqlite");
    let o = merge(&tmp.join("cache"), &dest, sources);
    let line = clean_error(&o, "bad merge", needles);
    assert!(!dest.exists(), "a refused merge created {}", dest.display());
    line
}

#[test]
fn shards_of_different_evaluations_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.sqlite"), tmp.path().join("b.sqlite"));
    synth_shard(&a, "aaaa1111", sh(0, 2), RunStatus::Complete);
    synth_shard(&b, "bbbb2222", sh(1, 2), RunStatus::Complete);
    let line = refused(
        tmp.path(),
        &[&a, &b],
        &[
            "different evaluations",
            "aaaa1111",
            "bbbb2222",
            "name",
            "--identity",
        ],
    );
    assert!(line.contains(s(&a)) && line.contains(s(&b)), "{line}");
    // --identity picks one of them: then its other shard is missing.
    let dest = tmp.path().join("m.sqlite");
    let o = dl(
        &tmp.path().join("cache"),
        &[
            "merge",
            "--db",
            s(&dest),
            "--identity",
            "aaaa",
            s(&a),
            s(&b),
        ],
    );
    clean_error(&o, "merge --identity", &["missing shards 1/2"]);
}

#[test]
fn overlapping_shards_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.sqlite");
    // Split into 2 and into 3: overlapping.
    synth_shard(&a, "same", sh(0, 2), RunStatus::Complete);
    synth_shard(&a, "same", sh(1, 2), RunStatus::Complete);
    synth_shard(&a, "same", sh(0, 3), RunStatus::Complete);
    refused(tmp.path(), &[&a], &["overlapping", "2 and 3", "shard 0/3"]);
    // The same shard complete twice (another database): overlapping too.
    let (b, c) = (tmp.path().join("b.sqlite"), tmp.path().join("c.sqlite"));
    synth_shard(&b, "same", sh(0, 2), RunStatus::Complete);
    synth_shard(&b, "same", sh(1, 2), RunStatus::Complete);
    synth_shard(&c, "same", sh(1, 2), RunStatus::Complete);
    refused(
        tmp.path(),
        &[&b, &c],
        &["overlapping", "shard 1/2 has 2 complete runs", s(&c)],
    );
}

#[test]
fn missing_shards_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.sqlite");
    synth_shard(&a, "same", sh(0, 4), RunStatus::Complete);
    synth_shard(&a, "same", sh(2, 4), RunStatus::Complete);
    refused(tmp.path(), &[&a], &["missing shards 1/4, 3/4"]);
}

#[test]
fn failed_or_unfinished_shards_are_refused_and_a_rerun_supersedes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.sqlite");
    synth_shard(&a, "same", sh(0, 3), RunStatus::Complete);
    let failed = synth_shard(&a, "same", sh(1, 3), RunStatus::Failed);
    synth_shard(&a, "same", sh(2, 3), RunStatus::Running);
    // Nothing has a.sqlite open when merge opens it: the shard left running is marked
    // interrupted (docs/ui.md §5.5).
    refused(
        tmp.path(),
        &[&a],
        &[
            "incomplete shards",
            &format!("run {failed} (shard 1/3, failed) is failed: CUDA out of memory"),
            "(shard 2/3, failed) is failed: interrupted",
        ],
    );
    // The failed and the unfinished shard rerun to completion: merged, the old runs left out.
    synth_shard(&a, "same", sh(1, 3), RunStatus::Complete);
    synth_shard(&a, "same", sh(2, 3), RunStatus::Complete);
    let dest = tmp.path().join("merged.sqlite");
    let out = json_out(
        &merge(&tmp.path().join("cache"), &dest, &[&a]),
        "merge after the reruns",
    );
    assert_eq!(out["prompts"], 6);
    assert_eq!(out["superseded"].as_array().unwrap().len(), 2, "{out}");
    let m = &runs(&dest)[0];
    assert_eq!(
        (m.status, m.num_prompts, m.num_blocks),
        (RunStatus::Complete, 6, 6)
    );
    let idx: Vec<u32> = Store::open(&dest)
        .unwrap()
        .prompts(m.id)
        .unwrap()
        .iter()
        .map(|p| p.index)
        .collect();
    assert_eq!(idx, [0, 1, 2, 3, 4, 5]);
}

#[test]
fn a_missing_source_database_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let nope = tmp.path().join("nope.sqlite");
    refused(
        tmp.path(),
        &[&nope],
        &["nope.sqlite", "no such run database"],
    );
    assert!(!nope.exists());
}

#[test]
fn shards_disagreeing_on_plugins_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.sqlite");
    synth_shard(&a, "same", sh(0, 2), RunStatus::Complete);
    let scored = synth_shard(&a, "same", sh(1, 2), RunStatus::Complete);
    let prov = draftlens_results::store::PluginProvenance {
        source: "my-metric".into(),
        sha256: "ab".repeat(32),
        version: "1".into(),
        file: "/plugins/my-metric.wasm".into(),
        builtin: false,
        params_json: "[]".into(),
        scored_at: String::new(),
        stale_since: None,
    };
    let row = draftlens_results::store::MetricRow::scalar(
        "my-metric",
        "x",
        draftlens_results::store::MetricScope::Run,
        1.0,
        1,
        true,
    );
    Store::open(&a)
        .unwrap()
        .replace_plugin_metrics(scored, &prov, &[row])
        .unwrap();
    refused(
        tmp.path(),
        &[&a],
        &["plugin values differ", "my-metric", "shard 0/2", "rescore"],
    );
}

/// `generate` and `extract` take the shard's prompts (none for an empty shard).
#[test]
fn generate_and_extract_take_the_shards_prompts() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("three.jsonl");
    write_prompts(&prompts, &PROMPTS);
    let cache = tmp.path().join("cache");
    let ids = |cmd: &str, shard: &str| -> Vec<String> {
        let o = dl(
            &cache,
            &[
                "--json",
                cmd,
                "--backend",
                "cpu",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                "2",
                "--shard",
                shard,
            ],
        );
        let v = json_out(&o, &format!("{cmd} --shard {shard}"));
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids("generate", "0/2"), ["sum", "tea"]);
    assert_eq!(ids("generate", "2/3"), Vec::<String>::new());
    assert_eq!(ids("extract", "1/2"), ["rev"]);
}

#[test]
fn bad_shard_arguments_are_clean_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["3/3", "1/0", "x"] {
        let o = dl(
            &tmp.path().join("cache"),
            &["run", "--drafter", "builtin:oracle", "--shard", bad],
        );
        let err = stderr(&o);
        assert!(
            !o.status.success() && err.contains("--shard"),
            "{bad}: {err}"
        );
    }
}
