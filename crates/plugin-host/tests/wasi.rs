//! The deny-all WASI (crates/plugin-host/src/wasi.rs): a plugin built for wasm32-wasip2, whose Rust
//! std imports WASI, loads and runs, and gets nothing from the machine: no files (not even one
//! the test just wrote), no environment, a fixed wall clock, a monotonic clock that does not
//! move, the same seeded random bytes in every job, and no network (a listener the test opens
//! sees no connection). Sleeping returns at once; spinning on the clock runs into the time
//! limit; `exit` is a classified failure; a plugin importing one WASI interface by hand gets an
//! empty environment; components that import nothing are unaffected.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use draftlens_plugin_host::sdk::testdata::{random, Shape};
use draftlens_plugin_host::{FailureKind, Grouping, Param, ParamValue, PluginOutcome, Runtime};
use draftlens_records::RecordBatch;
use rand::{RngExt, SeedableRng};

fn text(name: &str, v: &str) -> Param {
    Param {
        name: name.into(),
        value: ParamValue::Text(v.into()),
    }
}

fn batch() -> RecordBatch {
    random(5, &Shape::new(8, 4, 2, 5, 20), 0.6, 0.2)
}

/// The probe's run-scope values by name.
fn values(o: &PluginOutcome) -> BTreeMap<String, f64> {
    assert!(o.is_ok(), "{:?}\nlogs: {:?}", o.failure, o.logs);
    o.scores
        .as_ref()
        .unwrap()
        .overall
        .iter()
        .map(|m| (m.name.clone(), m.value.unwrap()))
        .collect()
}

fn log_line<'a>(o: &'a PluginOutcome, prefix: &str) -> &'a str {
    o.logs
        .iter()
        .map(|l| l.message.as_str())
        .find(|m| m.starts_with(prefix))
        .unwrap_or_else(|| panic!("no log line {prefix:?} in {:?}", o.logs))
}

#[test]
fn a_wasip2_plugin_loads_and_gets_nothing_from_the_machine() {
    let rt = common::runtime(Duration::from_secs(30), 64);
    let plugin = rt
        .load(&common::guest("wasi-probe"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        plugin.imports.iter().any(|i| i.starts_with("wasi:cli/")),
        "the probe imports WASI: {:?}",
        plugin.imports
    );

    // A file that exists, readable by this process; a listener that would see a connection.
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("secret.txt");
    std::fs::write(&secret, "do not read").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // The host process has an environment; the plugin must not see it.
    assert!(std::env::vars().count() > 0);

    let params = vec![
        text("path", secret.to_str().unwrap()),
        Param {
            name: "port".into(),
            value: ParamValue::Int(port as i64),
        },
    ];
    let o = rt.score(&plugin, &params, &batch(), &Grouping::default());
    let v = values(&o);

    // Files: no preopened folder, so nothing is found, read, written or listed.
    assert_eq!(v["file_read"], 0.0);
    assert!(
        log_line(&o, "read: error").contains("NotFound"),
        "{:?}",
        o.logs
    );
    assert_eq!(v["file_written"], 0.0);
    assert_eq!(v["dir_listed"], 0.0);
    assert!(!tmp.path().join("probe-was-here.txt").exists());
    assert!(!std::path::Path::new("probe-was-here.txt").exists());

    // Environment: no variables, no arguments.
    assert_eq!(v["env_vars"], 0.0);
    assert_eq!(log_line(&o, "env: "), "env: []");
    assert_eq!(v["args"], 0.0);

    // Clocks: the wall clock reads the Unix epoch; the monotonic clock did not move across
    // 5 M loop iterations and a 20 ms sleep.
    assert_eq!(
        v["wall_clock_ns"],
        draftlens_plugin_host::wasi::WALL_CLOCK.as_nanos() as f64
    );
    assert_eq!(v["monotonic_advance_ns"], 0.0);

    // Randomness: the seeded generator's first bytes (an independent draw from the same seed).
    let mut rng = rand::rngs::StdRng::seed_from_u64(draftlens_plugin_host::wasi::RANDOM_SEED);
    let want: Vec<u8> = (0..8).map(|_| rng.random::<u8>()).collect();
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
    assert_eq!(v["random_bytes_0_4"], word(&want[..4]));
    assert_eq!(v["random_bytes_4_8"], word(&want[4..]));
    assert_ne!(want, vec![0u8; 8]);
    assert_eq!(
        v["insecure_seed_lo"],
        (draftlens_plugin_host::wasi::RANDOM_SEED & 0xffff_ffff) as f64
    );

    // Network: connecting, binding and name lookup are all refused, and the listener saw no one.
    assert_eq!(v["tcp_connected"], 0.0);
    assert!(
        log_line(&o, "tcp connect: error").contains("PermissionDenied"),
        "{:?}",
        o.logs
    );
    assert_eq!(v["udp_bound"], 0.0);
    assert_eq!(v["name_resolved"], 0.0);
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the plugin reached a socket of the host"
    );

    // Deterministic: another job, and another runtime, see exactly the same.
    let again = rt.score(&plugin, &params, &batch(), &Grouping::default());
    assert_eq!(values(&again), v);
    let rt2 = common::runtime(Duration::from_secs(30), 64);
    let p2 = rt2.load(&common::guest("wasi-probe")).unwrap();
    assert_eq!(
        values(&rt2.score(&p2, &params, &batch(), &Grouping::default())),
        v
    );
}

/// Run `mode` of the probe on its own thread, failing (instead of hanging the suite) when it
/// does not come back within `patience`.
fn run_mode(rt_limit: Duration, mode: &str, patience: Duration) -> (PluginOutcome, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let mode = mode.to_string();
    std::thread::spawn(move || {
        let rt: Runtime = common::runtime(rt_limit, 64);
        let plugin = rt.load(&common::guest("wasi-probe")).unwrap();
        let t = Instant::now();
        let o = rt.score(
            &plugin,
            &[text("mode", &mode)],
            &batch(),
            &Grouping::default(),
        );
        let _ = tx.send((o, t.elapsed()));
    });
    rx.recv_timeout(patience)
        .expect("the plugin held the host past the time limit (blocked in a host call?)")
}

#[test]
fn sleeping_returns_at_once_and_spinning_on_the_clock_hits_the_time_limit() {
    // An hour's sleep: the frozen clock's pollables are ready at once, so the host thread is
    // never held in a blocking host call (where no epoch deadline could interrupt it).
    let (o, took) = run_mode(Duration::from_secs(20), "sleep", Duration::from_secs(60));
    assert!(o.is_ok(), "{:?}", o.failure);
    assert_eq!(log_line(&o, "slept"), "slept");
    assert!(took < Duration::from_secs(10), "{took:?}");

    // Waiting for the clock to pass one second never ends: the time limit stops it.
    let (o, took) = run_mode(Duration::from_millis(500), "spin", Duration::from_secs(60));
    let f = o.failure.expect("spinning on a frozen clock times out");
    assert_eq!(f.kind, FailureKind::Timeout, "{f}");
    assert!(took >= Duration::from_millis(500), "{took:?}");
}

#[test]
fn exit_is_a_classified_failure() {
    let (o, _) = run_mode(Duration::from_secs(20), "exit", Duration::from_secs(60));
    let f = o.failure.expect("exit fails the plugin");
    assert_eq!(f.kind, FailureKind::Trap, "{f}");
    // WASI 0.2's exit carries only success or failure: exit(3) arrives as status 1.
    assert!(f.message.contains("called exit(1) in accumulate"), "{f}");
}

#[test]
fn a_hand_imported_wasi_interface_is_served_empty_and_plain_components_are_unaffected() {
    let rt = common::runtime(Duration::from_secs(20), 64);
    // wasm32-unknown-unknown, importing wasi:cli/environment through its own WIT.
    let p = rt
        .load(&common::guest("imports-wasi"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        p.imports
            .iter()
            .any(|i| i.starts_with("wasi:cli/environment@0.2.")),
        "{:?}",
        p.imports
    );
    let f = rt.evaluate(&p, &[], &batch()).unwrap_err();
    assert_eq!(f.kind, FailureKind::PluginError, "{f}");
    assert!(f.message.contains("read 0 environment variables"), "{f}");

    // A built-in imports nothing but the contract and still runs.
    let b = rt.load(&common::builtin("accept-length")).unwrap();
    assert!(
        b.imports.iter().all(|i| i.starts_with("draftlens:metric/")),
        "{:?}",
        b.imports
    );
    assert!(rt.score(&b, &[], &batch(), &Grouping::default()).is_ok());
}
