//! `push` over loopback to a real team server (docs/scale-out.md, "Push"):
//!
//! - through a proxy that cuts the connection in the middle of the first upload, the push
//!   retries, resumes at the server's offset (bytes already acknowledged are not sent again),
//!   and the server ends up with runs equal to the source's (records, prompts, metrics, vocab);
//! - pushing again sends nothing and stores nothing twice;
//! - a run over the server's size cap is refused with a message naming the limit, and nothing
//!   is stored; a missing or read-only token is refused with a message saying what to do.

use draftlens_results::store::{RunExport, Store, TokenScope};
use draftlens_web::demo::{fill_demo_db, DemoSpec};
use draftlens_web::push::{push_runs, run_bundle_bytes, PushOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A team server on a background runtime.
fn serve(db: &Path, max_upload: usize) -> SocketAddr {
    let store = Store::open(db).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let _ = axum::serve(listener, draftlens_web::app(store, true, max_upload)).await;
        });
    });
    rx.recv().unwrap()
}

/// A TCP proxy to `target` that, once, cuts the connection after `cut_at` bytes from the client
/// have gone through (counted over all connections). Returns its address and whether it cut.
fn cutting_proxy(target: SocketAddr, cut_at: u64) -> (SocketAddr, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let cut = Arc::new(AtomicBool::new(false));
    let cut2 = cut.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { continue };
            let server = TcpStream::connect(target).unwrap();
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            // server -> client
            std::thread::spawn(move || {
                let (mut from, mut to) = (s2, c2);
                let _ = std::io::copy(&mut from, &mut to);
                let _ = to.shutdown(Shutdown::Both);
            });
            // client -> server, counting, cutting once
            let (sent, cut) = (sent.clone(), cut2.clone());
            std::thread::spawn(move || {
                let (mut from, mut to) = (client, server);
                let mut buf = [0u8; 16 << 10];
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let before = sent.fetch_add(n as u64, Ordering::SeqCst);
                    if !cut.load(Ordering::SeqCst) && before + n as u64 >= cut_at {
                        cut.store(true, Ordering::SeqCst);
                        // Forward part of this read, then drop both sides mid-request.
                        let keep = (cut_at.saturating_sub(before) as usize).min(n);
                        let _ = to.write_all(&buf[..keep]);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                        return;
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
            });
        }
    });
    (addr, cut)
}

/// A run's export with what legitimately differs between databases cleared (id, origin and
/// derived caches).
fn normalized(store: &Store, uid: &str) -> RunExport {
    let id = store.run_id_by_uid(uid).unwrap().expect("run present");
    let mut e = store.export_run(id, true).unwrap().unwrap();
    e.run.id = 0;
    e.run.origin.clear();
    // Derived rows are caches recomputed from the records (schema v1, table `derived`): the
    // source computes its statistics lazily, so they may be present on one side only.
    e.derived.clear();
    e
}

fn opts(addr: SocketAddr, token: &str) -> PushOptions {
    let mut o = PushOptions::new(&format!("http://{addr}"), Some(token.to_string()));
    o.chunk_bytes = 32 << 10;
    o.retry_delay = Duration::from_millis(20);
    o
}

#[test]
fn push_resumes_after_a_dropped_connection_and_stores_each_run_once() {
    let tmp = tempfile::tempdir().unwrap();
    let src = Store::open(&tmp.path().join("local.sqlite")).unwrap();
    let runs = fill_demo_db(&src, &DemoSpec::small()).unwrap();
    let ids = &runs.checkpoints;
    let server_db = tmp.path().join("team.sqlite");
    let token = Store::open(&server_db)
        .unwrap()
        .create_token("ci", TokenScope::Write)
        .unwrap();
    let server = serve(&server_db, 64 << 20);

    // Cut in the middle of the first run's upload, after some chunks were acknowledged.
    let first = run_bundle_bytes(&src, ids[0]).unwrap().len() as u64;
    assert!(
        first > 4 * (32 << 10),
        "the bundle is too small to test resuming"
    );
    let (proxy, cut) = cutting_proxy(server, first / 2);
    let pushed = push_runs(&src, ids, &opts(proxy, &token)).unwrap();
    assert!(
        cut.load(Ordering::SeqCst),
        "the proxy never cut the connection"
    );

    assert_eq!(pushed.len(), ids.len());
    assert!(pushed.iter().all(|p| p.outcome == "uploaded"), "{pushed:?}");
    let p = &pushed[0];
    assert!(p.retries >= 1, "{p:?}");
    // Resumed where the server stood, not from zero, and sent each byte at most once more
    // than needed (the chunk in flight when the connection dropped).
    assert!(p.resumed_at.iter().any(|&o| o > 0 && o < first), "{p:?}");
    assert!(p.sent_bytes < first + (32 << 10), "{p:?}");
    assert!(pushed[1..]
        .iter()
        .all(|p| p.retries == 0 && p.sent_bytes == p.bundle_bytes));

    // The server's runs equal the source's.
    let dst = Store::open(&server_db).unwrap();
    for &id in ids {
        let uid = src.run(id).unwrap().unwrap().run.uid;
        let (a, b) = (normalized(&src, &uid), normalized(&dst, &uid));
        assert!(
            a.records.is_some() && a.records == b.records,
            "records of {uid}"
        );
        assert_eq!(a.run, b.run, "run {uid}");
        assert_eq!(a.prompts, b.prompts, "prompts of {uid}");
        assert_eq!(a.failures, b.failures, "failures of {uid}");
        assert_eq!(a.vocab, b.vocab, "vocabulary of {uid}");
        // Metric values travel as JSON numbers and come back to the last bit (serde_json's
        // `float_roundtrip`); records travel as base64 bytes.
        assert_eq!(a.metrics.len(), b.metrics.len(), "metric rows of {uid}");
        for (x, y) in a.metrics.iter().zip(&b.metrics) {
            assert!(
                x.value.to_bits() == y.value.to_bits() || (x.value.is_nan() && y.value.is_nan()),
                "{x:?} vs {y:?}"
            );
            let (mut x, mut y) = (x.clone(), y.clone());
            (x.value, y.value) = (0.0, 0.0);
            assert_eq!(x, y, "a metric of {uid}");
        }
    }
    let count = |s: &Store| s.runs(&Default::default()).unwrap().1;
    assert_eq!(count(&dst), ids.len());
    // No part files are left.
    let parts = tmp.path().join("team.sqlite.uploads");
    assert_eq!(std::fs::read_dir(&parts).unwrap().count(), 0);

    // Again, straight to the server: nothing is sent, nothing stored twice.
    let again = push_runs(&src, ids, &opts(server, &token)).unwrap();
    assert!(
        again
            .iter()
            .all(|p| p.outcome == "already-present" && p.sent_bytes == 0),
        "{again:?}"
    );
    assert_eq!(count(&dst), ids.len());
}

#[test]
fn push_refuses_runs_over_the_size_cap_and_bad_tokens_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let src = Store::open(&tmp.path().join("local.sqlite")).unwrap();
    let runs = fill_demo_db(&src, &DemoSpec::small()).unwrap();
    let server_db = tmp.path().join("team.sqlite");
    let (write, read) = {
        let s = Store::open(&server_db).unwrap();
        (
            s.create_token("w", TokenScope::Write).unwrap(),
            s.create_token("r", TokenScope::Read).unwrap(),
        )
    };
    let server = serve(&server_db, 16 << 10);
    let ids = &runs.checkpoints[..1];

    let e = format!(
        "{:#}",
        push_runs(&src, ids, &opts(server, &write)).unwrap_err()
    );
    assert!(
        e.contains("HTTP 413")
            && e.contains("limit of 16384 bytes")
            && e.contains("--max-upload-mb"),
        "{e}"
    );
    for t in [&read, "dl_not_a_token"] {
        let e = format!("{:#}", push_runs(&src, ids, &opts(server, t)).unwrap_err());
        assert!(
            e.contains("refused the token") && e.contains("DRAFTLENS_TOKEN"),
            "{e}"
        );
    }
    let e = format!(
        "{:#}",
        push_runs(&src, &[runs.running.unwrap()], &opts(server, &write)).unwrap_err()
    );
    assert!(e.contains("still running"), "{e}");
    let dst = Store::open(&server_db).unwrap();
    assert_eq!(dst.runs(&Default::default()).unwrap().1, 0);
}

/// Bundles carry a run's evaluation (`eval`, version 2) and import stores it, so a pushed shard
/// is a shard on the server; a bundle without it (every bundle written before, version 1)
/// still imports, as a run of no evaluation; an impossible shard is refused.
#[test]
fn bundles_carry_the_evaluation_and_bundles_without_it_still_import() {
    use draftlens_results::shard::Shard;
    use draftlens_results::store::RunEval;
    use draftlens_web::bundle::{import_bytes, Bundle};
    let tmp = tempfile::tempdir().unwrap();
    let src = Store::open(&tmp.path().join("local.sqlite")).unwrap();
    let id = fill_demo_db(&src, &DemoSpec::small()).unwrap().checkpoints[0];
    let uid = src.run(id).unwrap().unwrap().run.uid;
    let bytes = run_bundle_bytes(&src, id).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        v["version"], 1,
        "a bundle without eval is written as before"
    );
    assert!(v["runs"][0].get("eval").is_none());

    let dst = Store::open(&tmp.path().join("dst.sqlite")).unwrap();
    let sum = import_bytes(&dst, "old.json", "old.json", &bytes, 1 << 30).unwrap();
    assert_eq!(sum.imported, std::slice::from_ref(&uid));
    let did = dst.run_id_by_uid(&uid).unwrap().unwrap();
    assert_eq!(dst.run_eval(did).unwrap(), None);

    let mut b: Bundle = serde_json::from_slice(&bytes).unwrap();
    let n = b.runs[0].prompts.len() as u32;
    let eval = RunEval {
        identity: "ab".repeat(32),
        identity_json: serde_json::json!({"drafter_sha256": "x"}),
        shard: Some(Shard::new(1, 2).unwrap()),
        set_prompts: 2 * n,
        run_prompts: n,
        merged_from: None,
    };
    b.version = 2;
    b.runs[0].run.uid = "with-eval".into();
    b.runs[0].eval = Some(eval.clone());
    let with = serde_json::to_vec(&b).unwrap();
    import_bytes(&dst, "new.json", "new.json", &with, 1 << 30).unwrap();
    let wid = dst.run_id_by_uid("with-eval").unwrap().unwrap();
    assert_eq!(dst.run_eval(wid).unwrap(), Some(eval.clone()));
    assert_eq!(dst.shard_runs().unwrap().len(), 1);

    b.runs[0].run.uid = "bad-shard".into();
    b.runs[0].eval = Some(RunEval {
        shard: Some(Shard { index: 2, count: 2 }),
        ..eval
    });
    let bad = serde_json::to_vec(&b).unwrap();
    let e = format!(
        "{:#}",
        import_bytes(&dst, "bad.json", "bad.json", &bad, 1 << 30).unwrap_err()
    );
    assert!(
        e.contains("bad.json") && e.contains("eval.shard 2/2 is not a shard"),
        "{e}"
    );
    assert_eq!(dst.run_id_by_uid("bad-shard").unwrap(), None);
}
