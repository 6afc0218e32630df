//! Shard runs pushed separately merge on the team server (docs/scale-out.md §9), end to end
//! through the built binary: `draftlens serve --team` over loopback, `draftlens push` from two
//! databases, the default target (CPU), the reference drafter and two built-in plugins.
//!
//! - shard 0/2 alone waits (no merged run); a shard 1/2 of a different evaluation (another
//!   top-K) is named in the answer and not merged with it;
//! - shard 1/2 completes the set: the server holds a merged run whose prompts, records, every
//!   metric row (native and plugin, every scope) and plugin provenance equal the unsharded
//!   run's bit for bit;
//! - pushing both shards again sends and stores nothing; a second server receiving them in the
//!   other order merges them into a run of the same uid.

mod cli_util;

use cli_util::*;
use draftlens_results::store::{RunStatus, Store, TokenScope};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const MAX_NEW: &str = "12";
const PLUGINS: [&str; 2] = ["replayed-tau", "accept-length"];

/// cli_shard.rs's prompts: shard 0/2 = {sum, tea}, shard 1/2 = {rev}.
const PROMPTS: [(&str, Option<&str>, &str); 3] = THREE_PROMPTS;

fn run(cache: &Path, prompts: &Path, db: &Path, extra: &[&str]) -> i64 {
    let d = reference_drafter();
    let mut args = vec![
        "--json",
        "run",
        "--backend",
        "cpu",
        "--drafter",
        s(&d),
        "--prompts",
        s(prompts),
        "--max-new-tokens",
        MAX_NEW,
        "--db",
        s(db),
    ];
    for p in PLUGINS {
        args.extend(["--plugin", p]);
    }
    args.extend(extra);
    let out = json_out(&dl(cache, &args), &format!("run {extra:?}"));
    out[0]["run_id"].as_i64().unwrap()
}

/// A team server (`draftlens serve --team`) on a free loopback port, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(cache: &Path, db: &Path) -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = cmd(cache)
        .args([
            "serve",
            "--team",
            "--db",
            s(db),
            "--addr",
            &addr.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the server never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

/// `draftlens --json push RUN --db DB --server URL`: one entry per run.
fn push(cache: &Path, server: &Server, token: &str, db: &Path, run: i64) -> serde_json::Value {
    let o = cmd(cache)
        .env("DRAFTLENS_TOKEN", token)
        .args([
            "--json",
            "push",
            &run.to_string(),
            "--db",
            s(db),
            "--server",
            &server.url,
        ])
        .output()
        .unwrap();
    json_out(&o, &format!("push run {run} of {}", db.display()))[0].clone()
}

fn server_lines(p: &serde_json::Value) -> String {
    p["server"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| l.as_str().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn merged_runs(db: &Path) -> Vec<draftlens_results::store::RunInfo> {
    runs(db)
        .into_iter()
        .filter(|r| r.origin == "merge")
        .collect()
}

#[test]
fn shards_pushed_separately_merge_on_the_server_exactly_and_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let prompts = tmp.path().join("three.jsonl");
    write_prompts(&prompts, &PROMPTS);
    let (full_db, a_db, b_db, c_db) = (
        tmp.path().join("full.sqlite"),
        tmp.path().join("a.sqlite"),
        tmp.path().join("b.sqlite"),
        tmp.path().join("c.sqlite"),
    );
    let full = run(&cache, &prompts, &full_db, &[]);
    let want = stored(&full_db, full);
    assert_eq!(want.3.len(), 2, "both plugins scored the unsharded run");
    // Two machines' databases: shard 0/2 in a, shard 1/2 in b; c holds shard 1/2 of another
    // evaluation (top-K 4).
    let s0 = run(&cache, &prompts, &a_db, &["--shard", "0/2"]);
    let s1 = run(&cache, &prompts, &b_db, &["--shard", "1/2"]);
    let other = run(&cache, &prompts, &c_db, &["--shard", "1/2", "--top-k", "4"]);

    let team = tmp.path().join("team.sqlite");
    let token = Store::open(&team)
        .unwrap()
        .create_token("ci", TokenScope::Write)
        .unwrap();
    let server = serve(&cache, &team);

    let p = push(&cache, &server, &token, &a_db, s0);
    assert_eq!(p["outcome"], "uploaded", "{p}");
    let l = server_lines(&p);
    assert!(
        l.contains("1 of 2 shards") && l.contains("waiting for 1/2"),
        "{l}"
    );
    assert!(merged_runs(&team).is_empty());

    let p = push(&cache, &server, &token, &c_db, other);
    let l = server_lines(&p);
    assert!(
        l.contains("1 of 2 shards") && l.contains("waiting for 0/2"),
        "the other evaluation waits for its own shard 0/2: {l}"
    );
    assert!(
        l.contains("different evaluation") && l.contains("differing in"),
        "the shard of the other evaluation is named: {l}"
    );
    assert!(
        merged_runs(&team).is_empty(),
        "different evaluations merged"
    );

    let p = push(&cache, &server, &token, &b_db, s1);
    let l = server_lines(&p);
    assert!(l.contains("merged 2 shards into run"), "{l}");
    let merged = merged_runs(&team);
    assert_eq!(merged.len(), 1);
    let m = &merged[0];
    let full_info = &runs(&full_db)[0];
    assert_eq!(
        (m.status, m.num_prompts, m.num_blocks, m.name.as_str()),
        (
            RunStatus::Complete,
            3,
            full_info.num_blocks,
            full_info.name.as_str()
        )
    );
    let got = stored(&team, m.id);
    assert_same_stored(&got, &want, "");
    let e = Store::open(&team).unwrap().run_eval(m.id).unwrap().unwrap();
    assert_eq!((e.shard, e.merged_from.map(|v| v.len())), (None, Some(2)));

    // Again: nothing sent, nothing stored, still one merged run.
    let count = runs(&team).len();
    assert_eq!(count, 4);
    for (db, id) in [(&a_db, s0), (&b_db, s1)] {
        let p = push(&cache, &server, &token, db, id);
        assert_eq!(
            (p["outcome"].as_str(), p["sent_bytes"].as_u64()),
            (Some("already-present"), Some(0))
        );
    }
    assert_eq!(runs(&team).len(), count);
    assert_eq!(merged_runs(&team).len(), 1);
    drop(server);

    // The other order, to another server: the same merged run (uid).
    let team2 = tmp.path().join("team2.sqlite");
    let token2 = Store::open(&team2)
        .unwrap()
        .create_token("ci", TokenScope::Write)
        .unwrap();
    let server2 = serve(&cache, &team2);
    push(&cache, &server2, &token2, &b_db, s1);
    let p = push(&cache, &server2, &token2, &a_db, s0);
    assert!(server_lines(&p).contains("merged 2 shards"), "{p}");
    let merged2 = merged_runs(&team2);
    assert_eq!(merged2.len(), 1);
    assert_eq!(merged2[0].uid, m.uid);
    assert_eq!(stored(&team2, merged2[0].id), got);
}
