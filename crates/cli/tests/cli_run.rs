//! `draftlens run` end to end, through the built binary, on the default target (CPU):
//!
//! - the oracle and anti-oracle drafters give exactly the τ their definitions imply for the
//!   continuation lengths `generate` reports;
//! - a run interrupted part-way — the hidden `--fail-after 1`, a real SIGTERM and a real SIGKILL
//!   of the child once the first prompt is stored (polling the database) — is never marked
//!   complete, leaves the database consistent and the cache valid, and running the same command
//!   again completes with metrics bit-for-bit identical to an uninterrupted run;
//! - a drafter that does not fit the target (hidden size 64, a tap layer out of range) is refused
//!   before any compute with the reason and a non-zero exit code.
//!
//! Every test uses its own temporary cache folder and database.

mod cli_util;

use cli_util::*;
use draftlens_engine::drafter::random::{write_random_checkpoint, RandomDrafter};
use draftlens_engine::model::TargetFiles;
use draftlens_results::store::{MetricScope, RunStatus, Store};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Known-answer drafters
// ---------------------------------------------------------------------------------------------

/// τ of a drafter that accepts every drafted token, for a continuation of `n` tokens and block
/// size `b`: the first token comes from the prefill, the other n−1 from verify rounds of b tokens
/// (b−1 accepted + the bonus), the last round taking what is left.
fn oracle_tau(n: u64, b: u64) -> (u64, u64) {
    let produced = n - 1;
    (produced.div_ceil(b), produced)
}

fn run_metric(outcome: &serde_json::Value, name: &str) -> f64 {
    let m = &outcome["metrics"]["native"][name];
    assert!(
        m["unit"].is_string() && m["description"].is_string(),
        "native metric {name} without unit and convention in {outcome}"
    );
    m["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("no native metric {name} in {outcome}"))
}

#[test]
fn oracle_and_anti_oracle_runs_report_the_exact_tau() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("two.jsonl"),
    );
    write_two_prompts(&prompts);
    let max_new = "24";
    // Continuation lengths from `generate` (same cache: `run` then reuses the continuations).
    let g = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "generate",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                max_new,
            ],
        ),
        "generate",
    );
    let n: Vec<u64> = g
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["new_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(n.len(), 2);
    assert!(
        n.iter().all(|&x| x >= 2),
        "each continuation needs a verify round: {n:?}"
    );

    let b = 8u64;
    let out = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "run",
                "--drafter",
                "builtin:oracle",
                "--block-size",
                "8",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                max_new,
                "--db",
                s(&db),
            ],
        ),
        "run builtin:oracle",
    );
    let o = &out.as_array().unwrap()[0];
    let per: Vec<(u64, u64)> = n.iter().map(|&x| oracle_tau(x, b)).collect();
    let taus: Vec<f64> = per.iter().map(|&(r, t)| t as f64 / r as f64).collect();
    let want_macro = taus.iter().sum::<f64>() / 2.0;
    let want_pooled =
        per.iter().map(|p| p.1).sum::<u64>() as f64 / per.iter().map(|p| p.0).sum::<u64>() as f64;
    eprintln!("continuations {n:?}: oracle τ per prompt {taus:?}, macro {want_macro}, pooled {want_pooled}");
    assert!(
        (run_metric(o, "tau_replayed_macro") - want_macro).abs() < 1e-12,
        "{o}"
    );
    assert!(
        (run_metric(o, "tau_replayed_pooled") - want_pooled).abs() < 1e-12,
        "{o}"
    );
    assert_eq!(run_metric(o, "acc_top1"), 1.0);
    assert_eq!(o["prompts"], 2);

    // The store holds the same per-prompt values, the run is complete, and per category too.
    let run = &runs(&db)[0];
    assert_eq!(
        (
            run.status,
            run.num_prompts,
            run.block_size,
            run.drafter_path.as_str()
        ),
        (RunStatus::Complete, 2, 8, "builtin:oracle")
    );
    let store = Store::open(&db).unwrap();
    let m = store.metrics(run.id).unwrap();
    for (i, tau) in taus.iter().enumerate() {
        let got = m
            .iter()
            .find(|r| r.name == "tau_replayed" && r.scope == MetricScope::Prompt(i as u32))
            .unwrap();
        assert_eq!((got.value, got.count), (*tau, per[i].0), "prompt {i}");
    }
    let cat = m
        .iter()
        .find(|r| r.name == "tau_replayed_macro" && r.scope == MetricScope::Category("code".into()))
        .unwrap();
    assert_eq!(cat.value, taus[0]);

    // The anti-oracle never has a draft accepted: τ = 1 exactly.
    let out = json_out(
        &dl(
            &cache,
            &[
                "--json",
                "run",
                "--drafter",
                "builtin:anti-oracle",
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                max_new,
                "--db",
                s(&db),
            ],
        ),
        "run builtin:anti-oracle",
    );
    let o = &out.as_array().unwrap()[0];
    assert_eq!(run_metric(o, "tau_replayed_macro"), 1.0);
    assert_eq!(run_metric(o, "tau_replayed_pooled"), 1.0);
    assert_eq!(run_metric(o, "tau_uniform"), 1.0);
    assert_eq!(runs(&db).len(), 2);
}

// ---------------------------------------------------------------------------------------------
// Interruption and resumption
// ---------------------------------------------------------------------------------------------

const MAX_NEW: &str = "16";

fn three_prompts(dir: &Path) -> PathBuf {
    let p = dir.join("three.jsonl");
    write_prompts(&p, &THREE_PROMPTS);
    p
}

fn run_args<'a>(prompts: &'a Path, db: &'a Path, drafter: &'a Path) -> Vec<&'a str> {
    vec![
        "--json",
        "run",
        "--drafter",
        s(drafter),
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        MAX_NEW,
        "--db",
        s(db),
    ]
}

/// The uninterrupted run of the reference drafter on the three prompts (own cache and DB),
/// computed once per test binary; its metrics are what every resumed run must reproduce.
fn baseline() -> &'static Vec<(String, draftlens_results::store::MetricRow)> {
    static B: OnceLock<Vec<(String, draftlens_results::store::MetricRow)>> = OnceLock::new();
    B.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let (cache, db, prompts) = (
            tmp.path().join("cache"),
            tmp.path().join("runs.sqlite"),
            three_prompts(tmp.path()),
        );
        let d = reference_drafter();
        json_out(
            &dl(&cache, &run_args(&prompts, &db, &d)),
            "uninterrupted run",
        );
        let r = runs(&db);
        assert_eq!(
            (r.len(), r[0].status, r[0].num_prompts),
            (1, RunStatus::Complete, 3)
        );
        let m = metric_map(&db, r[0].id);
        assert!(
            m.iter().any(|(k, _)| k == "native/tau_replayed_macro/run"),
            "{:?}",
            m.iter().map(|x| &x.0).collect::<Vec<_>>()
        );
        m
    })
}

/// Everything stored for an unfinished run is consistent: SQLite's own integrity check, stored
/// prompts are 0..n without gaps, every stored prompt has its records and no record belongs to
/// a prompt that was not stored, the block counter matches, and no metrics were written.
fn assert_consistent_unfinished(db: &Path, run_id: i64) -> u64 {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let fk: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(fk, 0, "foreign key violations");
    let store = Store::open(db).unwrap();
    let info = store.run(run_id).unwrap().unwrap().run;
    assert_ne!(
        info.status,
        RunStatus::Complete,
        "an interrupted run must never be marked complete"
    );
    let prompts = store.prompts(run_id).unwrap();
    let idx: Vec<u32> = prompts.iter().map(|p| p.index).collect();
    assert_eq!(
        idx,
        (0..idx.len() as u32).collect::<Vec<_>>(),
        "stored prompts have gaps"
    );
    assert_eq!(info.num_prompts, idx.len() as u64);
    let rec = store.records(run_id).unwrap();
    rec.check().unwrap();
    assert_eq!(info.num_blocks, rec.num_blocks() as u64);
    let with_records: BTreeSet<u32> = rec.prompt_index.iter().copied().collect();
    assert_eq!(
        with_records,
        idx.iter().copied().collect::<BTreeSet<_>>(),
        "prompts and records disagree"
    );
    assert!(
        store.metrics(run_id).unwrap().is_empty(),
        "an unfinished run has metrics"
    );
    info.num_prompts
}

/// Run the same command again: it completes, and its metrics equal the uninterrupted run's
/// bit for bit (values, counts and series).
fn resume_and_compare(cache: &Path, prompts: &Path, db: &Path) {
    let before = runs(db).len();
    json_out(
        &dl(cache, &run_args(prompts, db, &reference_drafter())),
        "re-run after the interruption",
    );
    let all = runs(db);
    assert_eq!(all.len(), before + 1);
    let last = all.last().unwrap();
    assert_eq!((last.status, last.num_prompts), (RunStatus::Complete, 3));
    let got = metric_map(db, last.id);
    let want = baseline();
    assert_eq!(
        got.iter().map(|x| &x.0).collect::<Vec<_>>(),
        want.iter().map(|x| &x.0).collect::<Vec<_>>(),
        "metric sets differ"
    );
    for ((k, g), (_, w)) in got.iter().zip(want) {
        assert_eq!(
            g.value.to_bits(),
            w.value.to_bits(),
            "{k}: {} after resuming vs {} uninterrupted",
            g.value,
            w.value
        );
        assert_eq!((g.count, &g.series), (w.count, &w.series), "{k}");
    }
    assert!(
        cache_verifies(cache) >= 6,
        "greedy + taps entries of three prompts"
    );
}

/// How many prompts of a `run --json` outcome took their records from the cache.
fn records_cached(out: &serde_json::Value) -> u64 {
    out.as_array().unwrap()[0]["timings"]["records_cached"]
        .as_u64()
        .unwrap_or_else(|| panic!("no timings.records_cached in {out}"))
}

#[test]
fn rerun_takes_the_drafters_records_from_the_cache_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        three_prompts(tmp.path()),
    );
    let d = reference_drafter();
    let first = json_out(&dl(&cache, &run_args(&prompts, &db, &d)), "first run");
    assert_eq!(records_cached(&first), 0);
    let again = json_out(&dl(&cache, &run_args(&prompts, &db, &d)), "second run");
    assert_eq!(records_cached(&again), 3, "every prompt's records cached");
    // ...so the drafter's weights were never loaded.
    assert_eq!(first[0]["timings"]["drafter_loaded"], true);
    assert_eq!(again[0]["timings"]["drafter_loaded"], false);
    let r = runs(&db);
    let store = Store::open(&db).unwrap();
    let (a, b) = (
        store.records(r[0].id).unwrap(),
        store.records(r[1].id).unwrap(),
    );
    assert!(a.num_blocks() > 0);
    assert_eq!(a, b, "cached records differ from the computed ones");
    let (ma, mb) = (metric_map(&db, r[0].id), metric_map(&db, r[1].id));
    assert_eq!(ma.len(), mb.len());
    for ((k, x), (_, y)) in ma.iter().zip(&mb) {
        assert_eq!(x.value.to_bits(), y.value.to_bits(), "{k}");
    }
    // Anything that changes the records misses: an evaluation option...
    let mut args = run_args(&prompts, &db, &d);
    args.extend(["--top-k", "4"]);
    let other = json_out(&dl(&cache, &args), "run with --top-k 4");
    assert_eq!(records_cached(&other), 0);
    // ...and the drafter's config (same weights, another file).
    let copy = tmp.path().join("drafter-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(&d).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let cfg = copy.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{text}\n")).unwrap();
    let edited = json_out(
        &dl(&cache, &run_args(&prompts, &db, &copy)),
        "edited config",
    );
    assert_eq!(records_cached(&edited), 0);
}

#[test]
fn fail_after_one_prompt_marks_the_run_failed_and_rerunning_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        three_prompts(tmp.path()),
    );
    let d = reference_drafter();
    let mut args = run_args(&prompts, &db, &d);
    args.extend(["--fail-after", "1"]);
    let o = dl(&cache, &args);
    clean_error(&o, "run --fail-after 1", &["--fail-after", "marked failed"]);
    let r = runs(&db);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, RunStatus::Failed);
    assert!(
        r[0].error.as_deref().unwrap_or("").contains("--fail-after"),
        "{:?}",
        r[0].error
    );
    assert_eq!(assert_consistent_unfinished(&db, r[0].id), 1);
    // The three continuations (decoded together, one --gen-batch chunk), the first prompt's
    // taps and its drafter records were cached and are valid.
    assert_eq!(cache_verifies(&cache), 5);
    resume_and_compare(&cache, &prompts, &db);
}

/// Spawn the run, wait until the first prompt's records are in the database, then `signal` it.
fn interrupt_after_first_prompt(
    cache: &Path,
    prompts: &Path,
    db: &Path,
    signal: &str,
) -> std::process::Output {
    // Create (and migrate) the database first so that polling never races its creation.
    drop(Store::open(db).unwrap());
    let mut child = cmd(cache)
        .args(run_args(prompts, db, &reference_drafter()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let o = child.wait_with_output().unwrap();
            panic!("the run ended ({st}) before the first prompt was seen in the database; stderr:\n{}", stderr(&o));
        }
        // num_blocks counts stored records: the first prompt is fully stored (prompt + records).
        if runs(db).first().is_some_and(|r| r.num_blocks > 0) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "no prompt stored after 300 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id().to_string();
    let st = std::process::Command::new("kill")
        .args([signal, pid.as_str()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {signal} {pid}");
    child.wait_with_output().unwrap()
}

#[test]
fn sigterm_part_way_marks_the_run_failed_and_rerunning_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        three_prompts(tmp.path()),
    );
    let o = interrupt_after_first_prompt(&cache, &prompts, &db, "-TERM");
    // The handler lets the current prompt finish, then the run fails cleanly.
    clean_error(&o, "run + SIGTERM", &["interrupted", "marked failed"]);
    let r = runs(&db);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, RunStatus::Failed);
    let stored = assert_consistent_unfinished(&db, r[0].id);
    assert!((1..3).contains(&stored), "{stored} prompts stored");
    assert!(cache_verifies(&cache) >= 2);
    resume_and_compare(&cache, &prompts, &db);
}

#[test]
fn sigkill_part_way_never_leaves_a_complete_run_and_rerunning_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        three_prompts(tmp.path()),
    );
    let o = interrupt_after_first_prompt(&cache, &prompts, &db, "-KILL");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(9)
    );
    let r = runs(&db);
    assert_eq!(r.len(), 1);
    // The killed process could not mark it: never `complete`; the next open, finding no process
    // with the database open, marks it failed as interrupted (docs/ui.md §5.5).
    assert_eq!(r[0].status, RunStatus::Failed);
    assert!(
        r[0].error
            .as_deref()
            .unwrap_or_default()
            .starts_with("interrupted"),
        "{:?}",
        r[0].error
    );
    assert!(assert_consistent_unfinished(&db, r[0].id) >= 1);
    // Whatever the kill interrupted, no cache entry is half-written (writes are temp + rename).
    assert!(cache_verifies(&cache) >= 2);
    resume_and_compare(&cache, &prompts, &db);
    // `runs ls` shows both: the killed run failed (interrupted), the new one complete.
    let ls = json_out(
        &dl(&cache, &["--json", "runs", "ls", "--db", s(&db)]),
        "runs ls",
    );
    let statuses: BTreeSet<String> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        statuses,
        ["complete".to_string(), "failed".to_string()]
            .into_iter()
            .collect()
    );
}

// ---------------------------------------------------------------------------------------------
// Drafter / target mismatch
// ---------------------------------------------------------------------------------------------

/// `run` refuses the drafter before any compute: one clean error with `needles`, no run stored,
/// nothing computed into the cache. `live` refuses it the same way, `lint` reports the error.
fn assert_refused(ckpt: &Path, needles: &[&str], lint_code: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("one.jsonl"),
    );
    write_prompts(&prompts, &[("q", None, "Say hello.")]);
    let o = dl(
        &cache,
        &[
            "run",
            "--drafter",
            s(ckpt),
            "--prompts",
            s(&prompts),
            "--max-new-tokens",
            "8",
            "--db",
            s(&db),
        ],
    );
    let mut all = needles.to_vec();
    all.push(s(ckpt));
    clean_error(&o, "run with a mismatched drafter", &all);
    if db.exists() {
        assert!(runs(&db).is_empty(), "a refused run was stored");
    }
    let entries = json_out(&dl(&cache, &["--json", "cache", "ls"]), "cache ls");
    assert_eq!(
        entries.as_array().unwrap().len(),
        0,
        "the target ran before the drafter was refused: {entries}"
    );

    let o = dl(
        &cache,
        &[
            "live",
            "--drafter",
            s(ckpt),
            "--prompts",
            s(&prompts),
            "--max-new-tokens",
            "8",
        ],
    );
    clean_error(&o, "live with a mismatched drafter", needles);

    let o = dl(&cache, &["--json", "lint", "--drafter", s(ckpt)]);
    clean_error(&o, "lint", &["incompatibilit"]);
    let findings: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        findings
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["severity"] == "error" && f["code"] == lint_code),
        "{findings}"
    );
}

fn random_spec(tmp: &Path, name: &str, hidden: usize, taps: Vec<usize>) -> PathBuf {
    let mut spec = TargetFiles::open(&model()).unwrap().spec;
    if hidden != spec.hidden_size {
        spec.hidden_size = hidden;
        spec.num_heads = 4;
        spec.num_kv_heads = 2;
        spec.head_dim = 16;
    }
    let dir = tmp.join(name);
    let r = RandomDrafter {
        layers: 1,
        block_size: 8,
        target_layer_ids: taps,
        intermediate_size: 96,
        mask_token_id: 16,
        sliding_layers: 0,
        sliding_window: 0,
        seed: 3,
    };
    write_random_checkpoint(&dir, &spec, &r).unwrap();
    dir
}

#[test]
fn drafter_with_another_hidden_size_is_refused_before_compute() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = random_spec(tmp.path(), "hidden64", 64, vec![1, 8, 27]);
    assert_refused(&ck, &["hidden_size 64", "576"], "hidden-size");
}

#[test]
fn drafter_tapping_a_layer_the_target_lacks_is_refused_before_compute() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = random_spec(tmp.path(), "tap30", 576, vec![1, 8, 30]);
    assert_refused(
        &ck,
        &["target_layer_ids contains 30", "30 decoder layers"],
        "tap-range",
    );
}

#[test]
fn drafter_with_an_absurd_block_size_is_refused_before_compute() {
    // Issue 39: block_size 10⁹ aborted with an allocation failure and a backtrace, 100 000 was
    // OOM-killed, both left a run `running`, and `lint` called it "info".
    for block_size in [1_000_000_000u64, 100_000] {
        let tmp = tempfile::tempdir().unwrap();
        let ck = random_spec(tmp.path(), "huge-block", 576, vec![1, 8, 27]);
        let cfg = ck.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        if let Some(d) = v.get_mut("dflash_config").and_then(|d| d.as_object_mut()) {
            d.insert("block_size".into(), block_size.into());
        }
        v["block_size"] = block_size.into();
        std::fs::write(&cfg, v.to_string()).unwrap();
        assert_refused(
            &ck,
            &[&format!(
                "block_size {block_size} is over the limit of 1024"
            )],
            "block-size",
        );
    }
}

#[test]
fn drafter_missing_a_layer_tensor_is_refused_before_compute() {
    // The weights are loaded lazily (a cached rerun never reads them), so the header is checked
    // against every tensor the loader will read before the run starts.
    let tmp = tempfile::tempdir().unwrap();
    let ck = random_spec(tmp.path(), "no-down", 576, vec![1, 8, 27]);
    let file = ck.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "layers.0.mlp.down_proj.weight")
        .collect();
    assert_eq!(kept.len() + 1, st.tensors().len());
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(&file, out).unwrap();
    assert_refused(
        &ck,
        &["tensor layers.0.mlp.down_proj.weight is missing"],
        "weights",
    );
}
