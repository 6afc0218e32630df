//! `runs ls` / `runs show` (and the other commands that only read runs) as a hostile tester
//! found them in issue 39: a mistyped `--db` created an empty database, stored text with escape
//! sequences and bidi controls reached the terminal as it was, and `runs show` printed the step
//! as `Some(903)`. No model is needed: the runs are written with the store directly.

mod cli_util;

use cli_util::*;
use draftlens_results::store::{MetricRow, MetricScope, NewRun, RunStatus, Store};
use std::path::Path;

/// A run whose every printed field holds an escape sequence and bidi controls, with one metric,
/// a plugin failure, and step 903.
fn hostile_db(db: &Path) -> i64 {
    let evil = "name\u{1b}[2J\u{1b}]0;title\u{7}\u{202e}exe.txt\u{2066}";
    let s = Store::open(db).unwrap();
    let id = s
        .create_run(&NewRun {
            name: evil.into(),
            target_path: evil.into(),
            target_arch: evil.into(),
            drafter_path: evil.into(),
            drafter_step: Some(903),
            prompt_set_name: evil.into(),
            backend: evil.into(),
            dtype: evil.into(),
            block_size: 4,
            top_k: 2,
            ..Default::default()
        })
        .unwrap();
    let mut m = MetricRow::scalar(evil, evil, MetricScope::Run, 2.5, 3, true);
    m.description = evil.into();
    s.add_metrics(id, &[m]).unwrap();
    s.add_plugin_failure(id, evil, evil, evil).unwrap();
    s.finish_run(id, RunStatus::Failed, Some(evil), &serde_json::json!({}))
        .unwrap();
    id
}

fn assert_printable(out: &str, what: &str) {
    let bad: Vec<char> = out
        .chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect();
    assert!(bad.is_empty(), "{what} printed {bad:?}:\n{out}");
}

#[test]
fn runs_ls_and_show_print_no_escape_sequences_or_bidi_controls() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    let id = hostile_db(&db);
    let cache = tmp.path().join("cache");

    let o = dl(&cache, &["runs", "ls", "--db", s(&db)]);
    ok(&o, "runs ls");
    assert_printable(&stdout(&o), "runs ls");
    assert!(
        stdout(&o).contains("name [2J ]0;title \u{fffd}exe.txt\u{fffd}"),
        "{}",
        stdout(&o)
    );

    let o = dl(&cache, &["runs", "show", &id.to_string(), "--db", s(&db)]);
    ok(&o, "runs show");
    let out = stdout(&o);
    assert_printable(&out, "runs show");
    assert!(out.contains(" step 903\n"), "{out}");
    assert!(!out.contains("Some("), "{out}");
    // --json keeps the stored text (JSON escapes the control characters itself).
    let v = json_out(
        &dl(
            &cache,
            &["--json", "runs", "show", &id.to_string(), "--db", s(&db)],
        ),
        "runs show --json",
    );
    assert_eq!(v["run"]["run"]["drafter_step"], 903);
}

#[test]
fn a_run_without_a_step_shows_none() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    let s_ = Store::open(&db).unwrap();
    let id = s_
        .create_run(&NewRun {
            name: "no step".into(),
            drafter_path: "/ckpt/final".into(),
            block_size: 4,
            top_k: 2,
            ..Default::default()
        })
        .unwrap();
    drop(s_);
    let o = dl(
        &tmp.path().join("cache"),
        &["runs", "show", &id.to_string(), "--db", s(&db)],
    );
    ok(&o, "runs show");
    assert!(
        stdout(&o).contains("  drafter /ckpt/final\n"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn commands_that_read_runs_never_create_a_database() {
    let tmp = tempfile::tempdir().unwrap();
    let typo = tmp.path().join("rnus.sqlite");
    let cache = tmp.path().join("cache");
    let report = tmp.path().join("r.html");
    for args in [
        vec!["runs", "ls", "--db", s(&typo)],
        vec!["runs", "show", "1", "--db", s(&typo)],
        vec!["compare", "1", "2", "--db", s(&typo)],
        vec!["report", "1", "-o", s(&report), "--db", s(&typo)],
    ] {
        let o = dl(&cache, &args);
        clean_error(&o, &args.join(" "), &[s(&typo), "no such run database"]);
        assert!(
            !typo.exists(),
            "{} created {}",
            args.join(" "),
            typo.display()
        );
    }
}
