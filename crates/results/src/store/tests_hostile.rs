//! What a hostile tester found in the store (issue 39): a killed run stayed `running` for ever
//! and could be pinned as a baseline, a leftover WAL went unreported, and reading a mistyped
//! `--db` created a database. (Imported text: the tests in exchange.rs.)

use super::*;
use serde_json::json;
use std::io::BufRead;
use std::process::{Command, Stdio};

fn new_run(name: &str) -> NewRun {
    NewRun {
        name: name.into(),
        config: json!({}),
        block_size: 4,
        top_k: 2,
        ..Default::default()
    }
}

/// The child half of [`a_killed_run_is_interrupted_at_the_next_open_never_before`]: with
/// `DL_TEST_CHILD_DB` set, opens that database, creates a run, writes a transaction it never
/// commits, says "created" and waits to be killed.
#[test]
#[ignore = "run by another test, in a child process"]
fn child_creates_a_run_and_waits_to_be_killed() {
    let Some(db) = std::env::var_os("DL_TEST_CHILD_DB") else {
        return;
    };
    let s = Store::open(Path::new(&db)).unwrap();
    let id = s.create_run(&new_run("killed \u{1b}[2J")).unwrap();
    s.write(|c| {
        c.execute_batch("BEGIN; UPDATE run SET name = 'never committed';")?;
        Ok(())
    })
    .unwrap();
    println!("created {id}");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_killed_run_is_interrupted_at_the_next_open_never_before() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("runs.sqlite");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "store::tests_hostile::child_creates_a_run_and_waits_to_be_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DL_TEST_CHILD_DB", &db)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let id: i64 = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended before creating its run"
        );
        // libtest may have written "test NAME ... " on the same line.
        if let Some((_, id)) = line.trim().split_once("created ") {
            break id.parse().unwrap();
        }
    };

    // The child is alive and has the database open: its run is running, and stays so.
    let s = Store::open(&db).unwrap();
    assert_eq!(s.recovered(), &Recovered::default());
    assert_eq!(s.run(id).unwrap().unwrap().run.status, RunStatus::Running);
    let e = s.pin_baseline("*", id).unwrap_err().to_string();
    assert!(
        e.contains("is running; only a complete run can be a baseline"),
        "{e}"
    );
    drop(s);

    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        liveness::wal_bytes(&db) > 0,
        "a killed writer leaves its log"
    );

    // Nobody has it open now: the run is marked, the left log is reported, once.
    let s = Store::open(&db).unwrap();
    let r = s.run(id).unwrap().unwrap().run;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.error.as_deref(), Some(INTERRUPTED));
    assert_eq!(
        r.name, "killed \u{1b}[2J",
        "the uncommitted rename was discarded"
    );
    assert_eq!(s.recovered().interrupted, vec![(id, r.name.clone())]);
    assert!(s.recovered().leftover_wal_bytes > 0);
    let e = s.pin_baseline("*", id).unwrap_err().to_string();
    assert!(
        e.contains("is failed; only a complete run can be a baseline"),
        "{e}"
    );
    // A second store of this process is not alone (the first may be running a run).
    let b = s.create_run(&new_run("mine")).unwrap();
    let t = Store::open(&db).unwrap();
    assert_eq!(t.recovered(), &Recovered::default());
    assert_eq!(t.run(b).unwrap().unwrap().run.status, RunStatus::Running);
    drop((s, t));
    let s = Store::open(&db).unwrap();
    assert_eq!(s.recovered().interrupted.len(), 1);
    assert_eq!(
        s.recovered().leftover_wal_bytes,
        0,
        "closed cleanly: no log left"
    );
}

#[test]
fn an_imported_running_run_is_left_as_its_source_says() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let src = Store::open(&a.path().join("a.sqlite")).unwrap();
    let id = src.create_run(&new_run("exported while running")).unwrap();
    let ex = src.export_run(id, false).unwrap().unwrap();
    let db = b.path().join("b.sqlite");
    Store::open(&db)
        .unwrap()
        .import_runs("x.json", "00", &[ex])
        .unwrap();
    let s = Store::open(&db).unwrap();
    assert!(s.recovered().interrupted.is_empty());
    let (runs, _) = s.runs(&RunFilter::default()).unwrap();
    assert_eq!(runs[0].run.status, RunStatus::Running);
}

#[test]
fn only_a_complete_run_is_a_baseline() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(&d.path().join("runs.sqlite")).unwrap();
    let done = s.create_run(&new_run("done")).unwrap();
    s.finish_run(done, RunStatus::Complete, None, &json!({}))
        .unwrap();
    let failed = s.create_run(&new_run("failed")).unwrap();
    s.finish_run(failed, RunStatus::Failed, Some("oom"), &json!({}))
        .unwrap();
    s.pin_baseline("a", done).unwrap();
    assert!(s.pin_baseline("b", failed).is_err());
    assert!(s
        .pin_baseline("c", 999)
        .unwrap_err()
        .to_string()
        .contains("does not exist"));
    // A pin an older draftlens made on a run that is not complete is not a baseline.
    s.write(|c| {
        c.execute(
            "INSERT INTO baseline (scope, run_id, pinned_at) VALUES ('old', ?1, 'x')",
            [failed],
        )?;
        Ok(())
    })
    .unwrap();
    assert_eq!(s.baselines().unwrap(), vec![("a".to_string(), done)]);
}

#[test]
fn reading_a_missing_database_creates_nothing() {
    let d = tempfile::tempdir().unwrap();
    let typo = d.path().join("rnus.sqlite");
    let e = format!("{:#}", Store::open_existing(&typo).err().unwrap());
    assert!(e.contains("rnus.sqlite: no such run database"), "{e}");
    assert!(!typo.exists());
    let e = format!("{:#}", Store::open_existing(d.path()).err().unwrap());
    assert!(e.contains("not a run database"), "{e}");
    let db = d.path().join("runs.sqlite");
    Store::open(&db).unwrap();
    assert!(Store::open_existing(&db).is_ok());
}
