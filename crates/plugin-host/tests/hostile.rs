//! Misbehaving plugins: each gets its own clear, classified error; the host stays healthy and the
//! other plugins' results are kept.

mod common;

use std::time::{Duration, Instant};

use draftlens_plugin_host::sdk::testdata::{random, Shape};
use draftlens_plugin_host::{
    score_batch_with, FailureKind, Grouping, Limits, Param, ParamValue, PluginRequest, Runtime,
    RuntimeConfig,
};
use draftlens_records::RecordBatch;

fn mode(m: &str) -> Vec<Param> {
    vec![Param {
        name: "mode".into(),
        value: ParamValue::Text(m.into()),
    }]
}

fn small_batch() -> RecordBatch {
    random(5, &Shape::new(8, 4, 3, 5, 30), 0.6, 0.2)
}

fn rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

#[test]
fn each_misbehaviour_has_its_own_error_and_the_host_recovers() {
    let rt = common::runtime(Duration::from_millis(800), 64);
    let plugin = rt
        .load(&common::guest("hostile"))
        .unwrap_or_else(|e| panic!("{e}"));
    let batch = small_batch();
    let cases: &[(&str, FailureKind, &str)] = &[
        (
            "loop",
            FailureKind::Timeout,
            "exceeded its time limit of 800ms in accumulate and was interrupted",
        ),
        (
            "alloc",
            FailureKind::MemoryLimit,
            "exceeded its memory limit in accumulate: tried to grow its linear memory to",
        ),
        (
            "panic",
            FailureKind::Panic,
            "index out of bounds: the len is 3 but the index is 7",
        ),
        (
            "huge-result",
            FailureKind::BadOutput,
            "a series of 2097152 entries for blocks (limit 1048576)",
        ),
        (
            "undeclared-metric",
            FailureKind::BadOutput,
            "the metric \"surprise\", which describe() does not declare",
        ),
        (
            "infinite-value",
            FailureKind::BadOutput,
            "an infinite value for blocks",
        ),
        (
            "series-mismatch",
            FailureKind::BadOutput,
            "with 2 values but 1 counts",
        ),
        (
            "plugin-error",
            FailureKind::PluginError,
            "rejected the batch in accumulate: the hostile plugin rejects every batch",
        ),
    ];
    for (m, kind, needle) in cases {
        let started = Instant::now();
        let o = rt.score(&plugin, &mode(m), &batch, &Grouping::default());
        let f = o.failure.unwrap_or_else(|| panic!("mode {m} did not fail"));
        eprintln!("{m:>18}: {f}  ({:.0?})", started.elapsed());
        assert_eq!(f.kind, *kind, "mode {m}: {f}");
        assert!(f.message.contains(needle), "mode {m}: {f}");
        assert!(
            f.to_string().contains("guest_hostile.wasm"),
            "the message names the file: {f}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "mode {m} took {:?}",
            started.elapsed()
        );
        if *m == "alloc" {
            assert!(f.message.contains("limit 64 MiB"), "{f}");
        }
    }

    // Parameters are checked by the SDK against describe(): an unknown one is refused.
    let bad = vec![Param {
        name: "nope".into(),
        value: ParamValue::Int(1),
    }];
    let f = rt
        .score(&plugin, &bad, &batch, &Grouping::default())
        .failure
        .expect("bad parameter");
    assert_eq!(f.kind, FailureKind::InvalidParams, "{f}");
    assert!(
        f.message
            .contains("unknown parameter nope (known: mode, series, len)"),
        "{f}"
    );

    // Runaway recursion: Rust's stack lives in linear memory, so it ends as an out-of-bounds
    // access (or, for wasm-stack-heavy frames, as a stack overflow) — classified either way.
    let o = rt.score(&plugin, &mode("recurse"), &batch, &Grouping::default());
    let f = o.failure.expect("recursion fails");
    eprintln!("{:>18}: {f}", "recurse");
    assert!(
        matches!(f.kind, FailureKind::Trap | FailureKind::StackOverflow),
        "{f}"
    );
    assert!(f.message.contains("recursion"), "{f}");

    // A log flood is bounded: 1000 lines kept, cut to 4 KiB each, the rest counted.
    let o = rt.score(&plugin, &mode("log-flood"), &batch, &Grouping::default());
    assert!(o.is_ok(), "{:?}", o.failure);
    assert_eq!(o.logs.len(), 1000);
    assert_eq!(o.logs_dropped, 99_000);
    assert!(o
        .logs
        .iter()
        .all(|l| l.message.len() <= 4096 + 40 && l.message.ends_with("more bytes cut]")));

    // The host is healthy: the same plugin, well-behaved, works in a fresh job.
    let o = rt.score(
        &plugin,
        &mode("ok"),
        &batch,
        &Grouping {
            per_prompt: true,
            ..Default::default()
        },
    );
    assert!(o.is_ok(), "{:?}", o.failure);
    let scores = o.scores.unwrap();
    assert_eq!(scores.overall[0].value, Some(batch.num_blocks() as f64));
    assert_eq!(scores.per_prompt.len(), 3);
    // The memory bomb's 64 MiB cap held: the host process did not grow by gigabytes.
    assert!(rss_mib() < 1024, "host RSS {} MiB", rss_mib());
}

#[test]
fn files_that_are_not_plugins_are_refused_at_load() {
    let rt = common::runtime(Duration::from_secs(10), 64);
    let dir = tempfile::tempdir().unwrap();

    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "this is not wasm\n").unwrap();
    let f = rt.load(&text).unwrap_err();
    assert_eq!(f.kind, FailureKind::NotWasm, "{f}");
    assert!(
        f.to_string()
            .starts_with(&format!("{}: not a WebAssembly file", text.display())),
        "{f}"
    );

    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let f = rt.load(&core).unwrap_err();
    assert_eq!(f.kind, FailureKind::NotComponent, "{f}");
    assert!(f.message.contains("wasm-component-ld"), "{f}");

    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\0\x01\0\xff\xff\xff").unwrap();
    let f = rt.load(&broken).unwrap_err();
    assert_eq!(f.kind, FailureKind::NotComponent, "{f}");
    assert!(
        f.message.contains("not a valid WebAssembly component"),
        "{f}"
    );

    let f = rt.load(&dir.path().join("missing.wasm")).unwrap_err();
    assert_eq!(f.kind, FailureKind::Io, "{f}");

    let f = rt.load(&common::guest("contract-v020")).unwrap_err();
    assert_eq!(f.kind, FailureKind::IncompatibleContract, "{f}");
    assert!(
        f.message
            .contains("built against contract draftlens:metric@0.2.0"),
        "{f}"
    );
    assert!(f.message.contains("draftlens:metric@0.1.0"), "{f}");

    // WASI is served deny-all (tests/wasi.rs); any other import is refused at load.
    let f = rt.load(&common::guest("imports-other")).unwrap_err();
    assert_eq!(f.kind, FailureKind::CapabilityDenied, "{f}");
    assert!(f.message.starts_with("imports test:spy/spy;"), "{f}");
    assert!(f.message.contains("may import nothing else"), "{f}");
}

#[test]
fn a_failing_plugin_does_not_stop_the_others() {
    let rt = common::runtime(Duration::from_millis(500), 64);
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).unwrap();
    let good = common::builtin("accept-length");
    let requests = vec![
        PluginRequest::new(&good),
        PluginRequest {
            path: common::guest("hostile"),
            params: mode("loop"),
            builtin: None,
        },
        PluginRequest::new(&junk),
        PluginRequest::new(common::guest("imports-other")),
        PluginRequest::new(common::guest("contract-v020")),
        PluginRequest {
            path: common::guest("hostile"),
            params: mode("alloc"),
            builtin: None,
        },
        PluginRequest {
            path: common::guest("hostile"),
            params: mode("panic"),
            builtin: None,
        },
        PluginRequest::new(common::builtin("top1-accuracy")),
        PluginRequest::new(&good),
    ];
    let batch = small_batch();
    let groups = Grouping {
        per_prompt: true,
        categories: [(0, "a".to_string()), (2, "b".to_string())].into(),
    };
    let out = score_batch_with(&rt, &requests, &batch, &groups).unwrap();
    let kinds: Vec<Option<FailureKind>> = out
        .iter()
        .map(|o| o.failure.as_ref().map(|f| f.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            None,
            Some(FailureKind::Timeout),
            Some(FailureKind::NotWasm),
            Some(FailureKind::CapabilityDenied),
            Some(FailureKind::IncompatibleContract),
            Some(FailureKind::MemoryLimit),
            Some(FailureKind::Panic),
            None,
            None
        ]
    );
    // The good plugin's values are the same before and after the hostile ones.
    assert_eq!(out[0].scores, out[8].scores);
    let s = out[0].scores.as_ref().unwrap();
    assert_eq!(s.per_prompt.len(), 3);
    assert_eq!(s.per_category.keys().collect::<Vec<_>>(), ["a", "b"]);
    // Outcomes serialise for the run store (which plugins failed and why).
    let json = serde_json::to_string(&out).unwrap();
    assert!(
        json.contains("\"kind\":\"timeout\"") && json.contains("\"kind\":\"capability-denied\""),
        "{json}"
    );
}

#[test]
fn fuel_gives_a_deterministic_budget() {
    let with_fuel = |fuel: u64| {
        Runtime::new(RuntimeConfig {
            limits: Limits {
                time_limit: Some(Duration::from_secs(30)),
                fuel: Some(fuel),
                ..Limits::default()
            },
            cache_dir: None,
            cache_key_file: None,
        })
        .unwrap()
    };
    let batch = small_batch();
    let rt = with_fuel(20_000_000);
    let plugin = rt.load(&common::guest("hostile")).unwrap();
    let o = rt.score(&plugin, &mode("loop"), &batch, &Grouping::default());
    let f = o.failure.expect("the loop runs out of fuel");
    assert_eq!(f.kind, FailureKind::FuelExhausted, "{f}");
    assert!(f.message.contains("fuel budget of 20000000 units"), "{f}");

    // A well-behaved plugin uses exactly the same fuel on the same records every time, so a
    // budget of exactly that passes (and half of it fails; wasmtime checks fuel at function
    // entries and loop heads, so the last few units may go unchecked).
    let good = rt.load(&common::builtin("accept-length")).unwrap();
    let groups = Grouping {
        per_prompt: true,
        ..Default::default()
    };
    let used: Vec<u64> = (0..2)
        .map(|_| {
            let o = rt.score(&good, &[], &batch, &groups);
            assert!(o.is_ok(), "{:?}", o.failure);
            o.fuel_used.expect("fuel is metered")
        })
        .collect();
    assert_eq!(used[0], used[1]);
    assert!(used[0] > 0);
    let exact = with_fuel(used[0]);
    let p = exact.load(&common::builtin("accept-length")).unwrap();
    assert!(exact.score(&p, &[], &batch, &groups).is_ok());
    let short = with_fuel(used[0] / 2);
    let p = short.load(&common::builtin("accept-length")).unwrap();
    let f = short
        .score(&p, &[], &batch, &groups)
        .failure
        .expect("one unit short");
    assert_eq!(f.kind, FailureKind::FuelExhausted, "{f}");
}

#[test]
fn a_patch_version_of_the_contract_loads() {
    // Built against draftlens:metric@0.1.1 (one more function): semver-compatible with 0.1.0.
    let rt = common::runtime(Duration::from_secs(10), 64);
    let plugin = rt
        .load(&common::guest("contract-v011"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.contract.to_string(), "0.1.1");
    let batch = small_batch();
    let o = rt.score(&plugin, &[], &batch, &Grouping::default());
    assert!(o.is_ok(), "{:?}", o.failure);
    assert_eq!(
        o.scores.unwrap().overall[0].value,
        Some(batch.num_blocks() as f64)
    );
}
