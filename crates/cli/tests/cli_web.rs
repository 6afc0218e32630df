//! The web-facing commands through the built binary: `serve` stops cleanly on SIGTERM and on
//! SIGINT (the global interrupt handler of `run` must not swallow them) and leaves no WAL
//! behind; every command hint the web commands print works as written.

mod cli_util;

use cli_util::*;
use draftlens_results::store::Store;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn spawn_serve(db: &std::path::Path, addr: SocketAddr, team: bool) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_draftlens"));
    c.args(["serve", "--db", s(db), "--addr", &addr.to_string()])
        .env_remove("DRAFTLENS_DB")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if team {
        c.arg("--team");
    }
    c.spawn().expect("spawn draftlens serve")
}

fn wait_up(addr: SocketAddr) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if http_get(addr, "/healthz").is_some_and(|r| r.ends_with("ok")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("serve did not come up on {addr}");
}

/// `serve`'s stderr up to and including the line that says it is serving (the warnings come
/// before it); panics if the process ends first.
fn stderr_through_serving(err: &mut impl BufRead) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("serve ended before it said it was serving:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains("serving") {
            return seen;
        }
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t.elapsed() > within {
            let _ = child.kill();
            panic!("serve did not stop within {within:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_stops_cleanly_on_sigterm_and_sigint() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("runs.sqlite");
        // Something in the WAL: a write through the store, then the server opens the file.
        Store::open(&db).unwrap().create_share("/?q=x").unwrap();
        let addr = free_addr();
        let mut child = spawn_serve(&db, addr, false);
        wait_up(addr);
        assert!(http_get(addr, "/").unwrap().starts_with("HTTP/1.1 200"));
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        let st = wait_exit(&mut child, Duration::from_secs(10));
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(st.success(), "{name}: exit {st:?}\n{err}");
        assert!(err.contains("stopped"), "{name}: no clean stop:\n{err}");
        assert!(
            !err.contains("interrupt: stopping after the current prompt"),
            "{name}: the run command's handler caught the signal:\n{err}"
        );
        let wal = tmp.path().join("runs.sqlite-wal");
        let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        assert_eq!(wal_len, 0, "{name}: the WAL was not checkpointed");
    }
}

/// The handlers are installed before the listener: a signal sent the moment the server says it
/// is serving (before any request) still ends in the clean stop, never the default action's
/// kill. Repeated because the window it guards against is short.
#[test]
fn a_signal_as_soon_as_the_server_is_up_still_stops_cleanly() {
    for round in 0..8 {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("runs.sqlite");
        Store::open(&db).unwrap();
        let mut child = spawn_serve(&db, free_addr(), false);
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut seen = stderr_through_serving(&mut err);
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let st = wait_exit(&mut child, Duration::from_secs(10));
        err.read_to_string(&mut seen).unwrap();
        assert!(st.success(), "round {round}: exit {st:?}\n{seen}");
        assert!(
            seen.contains("stopped"),
            "round {round}: no clean stop:\n{seen}"
        );
    }
}

/// Runs a printed `draftlens …` hint as written (words split on spaces; NAME and other
/// placeholders filled in by the caller).
fn run_hint(hint: &str, cwd: &std::path::Path) -> std::process::Output {
    let words: Vec<&str> = hint.split_whitespace().collect();
    assert_eq!(words[0], "draftlens", "{hint}");
    Command::new(env!("CARGO_BIN_EXE_draftlens"))
        .args(&words[1..])
        .current_dir(cwd)
        .env_remove("DRAFTLENS_DB")
        .output()
        .unwrap()
}

#[test]
fn printed_hints_work_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("team db.sqlite");
    Store::open(&db).unwrap();
    // `serve --team` without tokens prints how to create one.
    let addr = free_addr();
    let mut child = spawn_serve(&db, addr, true);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let hint = stderr_through_serving(&mut err).lines().find_map(|line| {
        let (_, h) = line.split_once("create one with `")?;
        Some(h.trim_end().trim_end_matches('`').to_string())
    });
    // The warning comes before the listener is up: stop the server once it answers.
    wait_up(addr);
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(wait_exit(&mut child, Duration::from_secs(10)).success());
    let hint = hint.expect("serve --team printed no token hint");
    // The database path has a space: the hint quotes it, so run it through a shell.
    let cmd = hint
        .replacen("draftlens", env!("CARGO_BIN_EXE_draftlens"), 1)
        .replace("NAME", "alice");
    let o = Command::new("sh").arg("-c").arg(&cmd).output().unwrap();
    ok(&o, &hint);
    let toks = Store::open(&db).unwrap().tokens().unwrap();
    assert!(
        toks.iter()
            .any(|t| t.name == "alice" && t.scope.as_str() == "write"),
        "{hint}"
    );

    // The token page's hint (default database in the working folder).
    let o = run_hint("draftlens tokens create bob --scope read", tmp.path());
    ok(&o, "token page hint");
    let toks = Store::open(&tmp.path().join("runs.sqlite"))
        .unwrap()
        .tokens()
        .unwrap();
    assert!(toks.iter().any(|t| t.name == "bob"));
    // `--db` before the subcommand works too.
    let o = run_hint(
        &format!(
            "draftlens tokens --db {} list",
            s(&tmp.path().join("runs.sqlite"))
        ),
        tmp.path(),
    );
    ok(&o, "tokens --db X list");
    assert!(stdout(&o).contains("bob"));

    // The import page's hint, with a report written by `draftlens report`.
    let o = run_hint("draftlens import report.html --db runs.sqlite", tmp.path());
    // No report.html yet: one clear error naming the file.
    clean_error(&o, "import of a missing file", &["report.html"]);

    // The empty run list's hint names real flags of `run`.
    let o = run_hint("draftlens run --help", tmp.path());
    ok(&o, "run --help");
    for flag in ["--target", "--drafter", "--prompts"] {
        assert!(stdout(&o).contains(flag), "`run` has no {flag}");
    }
}

/// Two stored runs of 24 prompts whose sequences end mid-block, with the native metrics as
/// `draftlens run` stores them. Returns their ids.
fn agreement_db(db: &std::path::Path) -> Vec<i64> {
    use draftlens_records::{RecordBatch, Region};
    use draftlens_results::metrics::{summarize, PromptInfo};
    use draftlens_results::store::{NewRun, RunPrompt, RunStatus};
    let store = Store::open(db).unwrap();
    let prompts: Vec<(u32, u32)> = (0..24).map(|i| (3 + i % 4, 20 + 3 * i)).collect();
    let tok = |p: u32, pos: u32| 1000 * p + pos;
    let b = 5u32;
    let mut ids = Vec::new();
    for shift in [0u32, 2] {
        let mut r = RecordBatch::new(b, 2);
        for (p, &(plen, t)) in prompts.iter().enumerate() {
            let p = p as u32;
            for a in plen..t - 1 {
                r.prompt_index.push(p);
                r.anchor.push(a);
                r.region.push(Region::Completion as u8);
                let n = if p.is_multiple_of(2) {
                    b
                } else {
                    (a * 7 + p * 3 + shift) % b
                };
                for k in 1..b {
                    let valid = a + k < t;
                    r.target.push(if valid { tok(p, a + k) } else { 0 });
                    r.valid.push(valid as u8);
                    r.loss_mask.push(valid as u8);
                    r.draft_ids
                        .extend([if k <= n { tok(p, a + k) } else { 7 }, 8]);
                    r.draft_logprobs.extend([-0.1 - (a % 7) as f32 / 9.0, -3.0]);
                }
            }
        }
        let id = store
            .create_run(&NewRun {
                name: format!("agreement-{shift}"),
                block_size: b,
                top_k: 2,
                ..Default::default()
            })
            .unwrap();
        let rp: Vec<RunPrompt> = prompts
            .iter()
            .enumerate()
            .map(|(i, &(plen, t))| RunPrompt {
                index: i as u32,
                id: format!("p{i}"),
                sha256: format!("{i:064x}"),
                category: None,
                prompt_len: plen,
                token_ids: (0..t).map(|x| tok(i as u32, x)).collect(),
                text: format!("prompt {i}"),
            })
            .collect();
        store.add_prompts(id, &rp).unwrap();
        store.add_records(id, &r).unwrap();
        let infos: Vec<PromptInfo> = prompts
            .iter()
            .enumerate()
            .map(|(i, &(plen, t))| PromptInfo {
                index: i as u32,
                prompt_len: plen as usize,
                seq_len: t as usize,
                category: None,
            })
            .collect();
        store.add_metrics(id, &summarize(&r, &infos)).unwrap();
        store
            .finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))
            .unwrap();
        ids.push(id);
    }
    ids
}

#[test]
fn runs_show_compare_and_report_agree_to_the_last_digit() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.sqlite");
    let ids = agreement_db(&db);
    let bin = env!("CARGO_BIN_EXE_draftlens");
    let run_json = |args: &[&str]| -> serde_json::Value {
        let o = Command::new(bin)
            .args(args)
            .env_remove("DRAFTLENS_DB")
            .output()
            .unwrap();
        json_out(&o, &args.join(" "))
    };
    let (a, b) = (ids[0].to_string(), ids[1].to_string());
    let cmp = run_json(&["--json", "compare", &a, &b, "--db", s(&db)]);
    let report = tmp.path().join("r.html");
    let o = Command::new(bin)
        .args(["report", &a, &b, "-o", s(&report), "--db", s(&db)])
        .output()
        .unwrap();
    ok(&o, "report");
    let html = std::fs::read_to_string(&report).unwrap();
    for name in draftlens_web::analysis::DERIVED.iter().map(|d| d.name) {
        let m = cmp["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["key"]["source"] == "native" && m["key"]["name"] == name)
            .unwrap_or_else(|| panic!("compare --json lacks native/{name}"));
        for (r, id) in [&a, &b].iter().enumerate() {
            let show = run_json(&["--json", "runs", "show", id, "--db", s(&db)]);
            let stored = show["metrics"]["native"]
                .get(name)
                .unwrap_or_else(|| panic!("runs show lacks {name}: {}", show["metrics"]));
            let (sv, cv) = (
                stored["value"].as_f64().unwrap(),
                m["values"][r].as_f64().unwrap(),
            );
            assert_eq!(
                sv.to_bits(),
                cv.to_bits(),
                "{name}: runs show {sv} vs compare {cv}"
            );
            let shown = draftlens_web::compare::fmt_value(Some(sv));
            assert!(html.contains(&shown), "{name}: {shown} not in the report");
        }
    }
}
