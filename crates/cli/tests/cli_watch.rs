//! `draftlens watch` end to end, through the built binary, on the default target (CPU), with
//! the committed reference drafter's checkpoints appearing in a folder over time:
//!
//! - a complete checkpoint, one written slowly (a lower step than one written quickly after
//!   it) and a broken one: the broken one is reported and skipped, the others are evaluated
//!   once each, in step order, with metrics bit-for-bit equal to `draftlens run` on the same
//!   checkpoint; a restarted watcher evaluates nothing again;
//! - SIGTERM while a checkpoint is being evaluated: the watcher exits 0, the partial run is
//!   deleted (no rows of it stay), and the next start evaluates that checkpoint.

mod cli_util;

use cli_util::*;
use draftlens_results::store::{RunStatus, Store};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MAX_NEW: &str = "16";

fn checkpoint(step: &str) -> PathBuf {
    root().join("drafters/smollm2-reference").join(step)
}

fn copy_checkpoint(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

fn watch_args<'a>(dir: &'a Path, prompts: &'a Path, db: &'a Path) -> Vec<&'a str> {
    vec![
        "--json",
        "watch",
        s(dir),
        "--drafter-series",
        "trainrun",
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        MAX_NEW,
        "--db",
        s(db),
        "--settle",
        "1",
        "--poll",
        "0.2",
    ]
}

/// Spawns the watcher; its JSON event lines arrive on the returned channel.
fn spawn_watch(cache: &Path, args: &[&str]) -> (Child, mpsc::Receiver<serde_json::Value>) {
    let mut child = cmd(cache)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                let _ = tx.send(v);
            }
        }
    });
    (child, rx)
}

fn sigterm(child: &Child) {
    let st = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(600), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rows(db: &Path, table: &str) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

#[test]
fn watch_evaluates_complete_checkpoints_in_step_order_skips_a_broken_one_and_remembers() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts, dir) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("two.jsonl"),
        tmp.path().join("train"),
    );
    write_two_prompts(&prompts);
    std::fs::create_dir_all(&dir).unwrap();
    drop(Store::open(&db).unwrap());
    copy_checkpoint(&checkpoint("step-258"), &dir.join("step-258"));
    // Broken: a config and a "checkpoint" that is not safetensors.
    std::fs::create_dir_all(dir.join("step-600")).unwrap();
    std::fs::copy(
        checkpoint("step-258").join("config.json"),
        dir.join("step-600/config.json"),
    )
    .unwrap();
    std::fs::write(
        dir.join("step-600/model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{garbage",
    )
    .unwrap();

    let (mut child, events) = spawn_watch(&cache, &watch_args(&dir, &prompts, &db));

    // step-903 written slowly (pauses shorter than the settle time), and while it is being
    // written step-2581 appears complete at once: it must wait for step-903.
    let slow = dir.join("step-903");
    std::fs::create_dir_all(&slow).unwrap();
    std::fs::copy(
        checkpoint("step-903").join("config.json"),
        slow.join("config.json"),
    )
    .unwrap();
    let weights = std::fs::read(checkpoint("step-903").join("model.safetensors")).unwrap();
    let mut f = std::fs::File::create(slow.join("model.safetensors")).unwrap();
    for (i, piece) in weights.chunks(weights.len() / 8 + 1).enumerate() {
        f.write_all(piece).unwrap();
        f.flush().unwrap();
        if i == 1 {
            copy_checkpoint(&checkpoint("step-2581"), &dir.join("step-2581"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(f);

    let mut seen = Vec::new();
    wait_until("three runs evaluated", || {
        seen.extend(events.try_iter());
        seen.iter().filter(|e| e["event"] == "evaluated").count() == 3
    });
    sigterm(&child);
    let st = child.wait().unwrap();
    assert!(st.success(), "watch exited {st} after SIGTERM");
    seen.extend(events.try_iter());

    let kinds: Vec<(String, String)> = seen
        .iter()
        .map(|e| {
            let dir = e["dir"].as_str().unwrap_or("");
            let name = Path::new(dir)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            (
                e["event"].as_str().unwrap().to_string(),
                name.unwrap_or_default(),
            )
        })
        .collect();
    let broken: Vec<_> = seen.iter().filter(|e| e["event"] == "broken").collect();
    assert_eq!(broken.len(), 1, "{seen:?}");
    assert!(broken[0]["dir"].as_str().unwrap().ends_with("step-600"));
    assert!(
        broken[0]["problem"]
            .as_str()
            .unwrap()
            .contains("model.safetensors"),
        "{seen:?}"
    );
    let evaluated: Vec<&str> = kinds
        .iter()
        .filter(|k| k.0 == "evaluated")
        .map(|k| k.1.as_str())
        .collect();
    assert_eq!(
        evaluated,
        ["step-258", "step-903", "step-2581"],
        "{kinds:?}"
    );

    let r = runs(&db);
    assert_eq!(r.len(), 3);
    assert!(r
        .iter()
        .all(|r| r.status == RunStatus::Complete && r.drafter_series == "trainrun"));
    assert_eq!(
        r.iter().map(|r| r.drafter_step).collect::<Vec<_>>(),
        [Some(258), Some(903), Some(2581)]
    );

    // The same numbers as `draftlens run` on that checkpoint (same cache: continuations and
    // hidden states are reused, not recomputed differently).
    let db2 = tmp.path().join("run.sqlite");
    ok(
        &dl(
            &cache,
            &[
                "--json",
                "run",
                "--drafter",
                s(&dir.join("step-903")),
                "--prompts",
                s(&prompts),
                "--max-new-tokens",
                MAX_NEW,
                "--db",
                s(&db2),
            ],
        ),
        "run",
    );
    let plain = runs(&db2)[0].id;
    let strip = |v: Vec<(String, draftlens_results::store::MetricRow)>| {
        v.into_iter()
            .map(|(k, m)| (k, m.value.to_bits(), m.count))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(metric_map(&db, r[1].id)),
        strip(metric_map(&db2, plain))
    );

    // Restarted: nothing is evaluated again.
    let o = cmd(&cache)
        .args(watch_args(&dir, &prompts, &db))
        .arg("--once")
        .output()
        .unwrap();
    ok(&o, "watch --once after a restart");
    assert!(!stdout(&o).contains("\"evaluating\""), "{}", stdout(&o));
    assert_eq!(runs(&db).len(), 3);
}

#[test]
fn sigterm_during_an_evaluation_abandons_it_cleanly_and_the_next_start_evaluates_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, db, prompts, dir) = (
        tmp.path().join("cache"),
        tmp.path().join("runs.sqlite"),
        tmp.path().join("three.jsonl"),
        tmp.path().join("train"),
    );
    write_prompts(
        &prompts,
        &[
            (
                "rev",
                None,
                "Write a Python function that reverses a string.",
            ),
            (
                "sum",
                None,
                "What is the sum of the first ten positive integers?",
            ),
            ("tea", None, "Give three tips for brewing good tea."),
            ("sky", None, "Why is the sky blue? Explain it to a child."),
        ],
    );
    drop(Store::open(&db).unwrap());
    copy_checkpoint(&checkpoint("step-258"), &dir.join("step-258"));
    let mut args = watch_args(&dir, &prompts, &db);
    args.extend(["--gen-batch", "1"]);
    let (mut child, events) = spawn_watch(&cache, &args);
    wait_until("the first prompt stored", || {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("watch ended ({st}) before the first prompt was stored");
        }
        runs(&db).first().is_some_and(|r| r.num_blocks > 0)
    });
    sigterm(&child);
    let st = child.wait().unwrap();
    assert!(st.success(), "watch exited {st} after SIGTERM");
    let seen: Vec<_> = events.try_iter().collect();
    assert!(seen.iter().any(|e| e["event"] == "abandoned"), "{seen:?}");
    // No half-written run: no run, prompt, record or metric rows, nothing remembered.
    for t in [
        "run",
        "run_prompt",
        "record_chunk",
        "metric",
        "watch_checkpoint",
    ] {
        assert_eq!(rows(&db, t), 0, "rows left in {t}");
    }

    let o = cmd(&cache).args(&args).arg("--once").output().unwrap();
    ok(&o, "watch --once after SIGTERM");
    let r = runs(&db);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, RunStatus::Complete);
    assert_eq!(r[0].num_prompts, 4);
}

/// Slurm job options without `--slurm` are one clean error (they would be ignored otherwise),
/// and `--slurm` with a target that does not exist fails before anything is submitted.
#[test]
fn slurm_options_are_checked_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, dir, db) = (
        tmp.path().join("cache"),
        tmp.path().join("train"),
        tmp.path().join("runs.sqlite"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let base = [
        "watch",
        s(&dir),
        "--drafter-series",
        "t",
        "--db",
        s(&db),
        "--once",
    ];
    let mut args = base.to_vec();
    args.extend(["--partition", "gpu"]);
    clean_error(
        &dl(&cache, &args),
        "--partition without --slurm",
        &["add --slurm"],
    );
    let missing = tmp.path().join("no-such-model.gguf");
    let mut args = base.to_vec();
    args.extend(["--slurm", "--target", s(&missing)]);
    clean_error(
        &dl(&cache, &args),
        "--slurm with a missing target",
        &["no-such-model.gguf"],
    );
    assert!(
        !tmp.path().join("runs.sqlite.slurm").exists(),
        "nothing is written before the options are checked"
    );
}
