//! Hostile plugins against a stored run, through what `run --plugin` and `rescore` use
//! (`score_stored_run`): output amplification, unbounded names and messages, terminal escapes,
//! spoofed built-in names, NaN/count rules, huge files. Each case shows the other plugins'
//! results stored and the database intact (small, every row readable, integrity check ok).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use draftlens_plugin_host::sdk::testdata::{random, Shape};
use draftlens_plugin_host::{
    builtins, score_stored_run, FailureKind, Limits, Param, ParamValue, PluginRequest, Runtime,
    RuntimeConfig, StoredScoring,
};
use draftlens_results::store::{MetricScope, NewRun, RunPrompt, RunStatus, Store};

const PROMPTS: u32 = 24;
const CATEGORIES: usize = 3;

/// A complete run of 24 prompts in 3 categories, synthetic records (B = 8, K = 4).
fn run_of_24_prompts(db: &Path) -> i64 {
    let store = Store::open(db).unwrap();
    let id = store
        .create_run(&NewRun {
            name: "hostile".into(),
            block_size: 8,
            top_k: 4,
            ..NewRun::default()
        })
        .unwrap();
    for p in 0..PROMPTS {
        let mut r = random(100 + p as u64, &Shape::new(8, 4, 1, 10, 30), 0.75, 0.15);
        r.prompt_index.iter_mut().for_each(|x| *x = p);
        let prompt = RunPrompt {
            index: p,
            id: format!("p{p}"),
            sha256: format!("{p:064}"),
            category: Some(format!("c{}", p as usize % CATEGORIES)),
            prompt_len: 10,
            token_ids: (0..40).collect(),
            text: String::new(),
        };
        store.add_prompt_records(id, &prompt, &r).unwrap();
    }
    store
        .finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))
        .unwrap();
    id
}

fn hostile(mode: &str, extra: &[(&str, i64)]) -> PluginRequest {
    let mut r = PluginRequest::new(common::guest("hostile"));
    r.params.push(Param {
        name: "mode".into(),
        value: ParamValue::Text(mode.into()),
    });
    for (k, v) in extra {
        r.params.push(Param {
            name: k.to_string(),
            value: ParamValue::Int(*v),
        });
    }
    r
}

fn builtin(name: &str) -> PluginRequest {
    PluginRequest::builtin(builtins::find(name).unwrap())
}

/// A scratch database holding one 24-prompt run, and a runtime with the default limits: what
/// every case starts from.
struct Fixture {
    _tmp: tempfile::TempDir,
    db: PathBuf,
    run: i64,
    store: Store,
    rt: Runtime,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("runs.sqlite");
        let run = run_of_24_prompts(&db);
        let store = Store::open(&db).unwrap();
        Fixture {
            _tmp: tmp,
            db,
            run,
            store,
            rt: runtime(),
        }
    }

    /// Score the run with `plugins` (what `rescore` does).
    fn score(&self, plugins: &[PluginRequest]) -> StoredScoring {
        score_stored_run(&self.rt, &self.store, self.run, plugins).unwrap()
    }

    /// Rows of `source` in every scope (see [`scopes_of`]).
    fn scopes(&self, source: &str) -> (usize, usize, usize) {
        scopes_of(&self.store, self.run, source)
    }

    /// The database is intact and under 8 MiB (see [`assert_intact`]).
    fn assert_intact(&self) {
        assert_intact(&self.db, self.run, 8);
    }
}

/// The default limits (the documented caps), 20 s per job, no cache.
fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig {
        limits: Limits {
            time_limit: Some(Duration::from_secs(20)),
            ..Limits::default()
        },
        cache_dir: None,
        cache_key_file: None,
    })
    .unwrap()
}

/// Rows of `source` in every scope: 1 run + 24 prompts + 3 categories per metric.
fn scopes_of(store: &Store, run: i64, source: &str) -> (usize, usize, usize) {
    let rows: Vec<_> = store
        .metrics(run)
        .unwrap()
        .into_iter()
        .filter(|m| m.source == source)
        .collect();
    let n = |f: fn(&MetricScope) -> bool| rows.iter().filter(|m| f(&m.scope)).count();
    (
        n(|s| *s == MetricScope::Run),
        n(|s| matches!(s, MetricScope::Prompt(_))),
        n(|s| matches!(s, MetricScope::Category(_))),
    )
}

/// The database is intact and small: SQLite's integrity check passes, every row reads back,
/// and the file (with its WAL) stays under `max_mib`.
fn assert_intact(db: &Path, run: i64, max_mib: u64) {
    let c = rusqlite::Connection::open(db).unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let store = Store::open(db).unwrap();
    store.metrics(run).unwrap();
    store.plugin_failures(run).unwrap();
    let size: u64 = ["", "-wal"]
        .iter()
        .map(|s| {
            std::fs::metadata(format!("{}{s}", db.display()))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .sum();
    assert!(
        size < max_mib << 20,
        "the database grew to {size} bytes (limit {max_mib} MiB)"
    );
}

fn outcome<'a>(s: &'a StoredScoring, i: usize) -> &'a draftlens_plugin_host::StoredOutcome {
    &s.plugins[i]
}

/// The failure message of plugin `i` (which must have failed).
fn failure_message(s: &StoredScoring, i: usize) -> &str {
    &outcome(s, i).failure.as_ref().expect("a failure").message
}

fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// The amplification of the issue at the documented caps: 7 series of 1 Mi entries per group
/// (each call within ≤ 4096 values, ≤ 1 Mi entries per series, the 256 MiB memory cap), on a
/// 24-prompt run. The shared budget stops it at its first group; the built-ins before and after
/// it are stored in every scope, and the database stays small.
#[test]
fn output_amplification_is_stopped_and_the_others_are_stored() {
    let fx = Fixture::new();
    let s = fx.score(&[
        builtin("accept-length"),
        hostile("amplify", &[]),
        builtin("top1-accuracy"),
    ]);
    let f = outcome(&s, 1).failure.as_ref().expect("amplify fails");
    assert_eq!(f.kind, FailureKind::TooMuchOutput, "{f}");
    assert!(
        f.message.contains("more than its output budget") && f.message.contains("the whole batch"),
        "{f}"
    );
    assert_eq!(fx.scopes("hostile"), (0, 0, 0));
    for p in ["accept-length", "top1-accuracy"] {
        let (r, pr, c) = fx.scopes(p);
        assert!(
            r > 0 && pr == r * PROMPTS as usize && c == r * CATEGORIES,
            "{p}: {r} {pr} {c}"
        );
    }
    let failures = fx.store.plugin_failures(fx.run).unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(
        (failures[0].plugin.as_str(), failures[0].kind.as_str()),
        ("hostile", "too-much-output")
    );
    fx.assert_intact();
    // One group's values (7 × 1 Mi entries, ~112 MiB) are all the host ever held of it.
    assert!(peak_rss_mib() < 3 << 10, "peak RSS {} MiB", peak_rss_mib());
}

/// The budget is shared across groups: 300 k entries per group pass every per-call limit and
/// the whole batch fits, but the groups together do not. The plugin's rows from an earlier
/// scoring that worked are kept and marked stale; nothing of the amplifying scoring is stored.
#[test]
fn the_budget_is_shared_by_the_groups_and_earlier_rows_go_stale() {
    let fx = Fixture::new();
    let s = fx.score(&[hostile("ok", &[])]);
    assert!(outcome(&s, 0).is_ok());
    let before = fx.store.metrics(fx.run).unwrap();
    assert_eq!(fx.scopes("hostile"), (1, 24, 3));

    let s = fx.score(&[
        hostile("amplify", &[("series", 1), ("len", 300_000)]),
        builtin("ddtree"),
    ]);
    let o = outcome(&s, 0);
    let f = o.failure.as_ref().expect("fails");
    assert_eq!(f.kind, FailureKind::TooMuchOutput);
    assert!(
        f.message.contains("prompt ") || f.message.contains("category "),
        "{f}"
    );
    assert_eq!(o.stale_rows, 28);
    // The earlier rows are untouched, and marked stale; ddtree is stored.
    let hostile_rows = |rows: &[draftlens_results::store::MetricRow]| {
        rows.iter()
            .filter(|m| m.source == "hostile")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        hostile_rows(&fx.store.metrics(fx.run).unwrap()),
        hostile_rows(&before)
    );
    let prov = fx.store.plugin_runs(fx.run).unwrap();
    let h = prov.iter().find(|p| p.source == "hostile").unwrap();
    assert!(h.stale_since.is_some());
    let d = prov.iter().find(|p| p.source == "ddtree").unwrap();
    assert!(
        d.builtin
            && d.stale_since.is_none()
            && d.sha256 == builtins::find("ddtree").unwrap().sha256()
    );
    assert!(fx.scopes("ddtree").0 > 0);
    fx.assert_intact();
}

/// Unbounded text: a 60 MiB family member name, a 64 MiB error message and a 64 MiB plugin
/// name, all starting with escape sequences, and log lines that would clear the screen and
/// forge a host line. None of it reaches the outcome or the database longer than the caps or
/// with a control character; the built-in between them is stored.
#[test]
fn names_messages_and_logs_are_capped_and_cleaned() {
    let fx = Fixture::new();
    let s = fx.score(&[
        hostile("long-member", &[]),
        PluginRequest::new(common::guest("bigname")),
        builtin("acceptance"),
    ]);
    // A second call: two plugins of one name in one call are refused.
    let mut s = s;
    let s2 = fx.score(&[hostile("huge-error", &[])]);
    s.plugins.extend(s2.plugins);
    let clean = |t: &str| !t.chars().any(|c| c.is_control() || c == '\u{202e}');
    let kinds: Vec<_> = s
        .plugins
        .iter()
        .map(|p| p.failure.as_ref().map(|f| f.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            Some(FailureKind::BadOutput),
            Some(FailureKind::BadOutput),
            None,
            Some(FailureKind::PluginError)
        ]
    );
    for p in &s.plugins {
        if let Some(f) = &p.failure {
            assert!(
                f.message.len() <= 10_000 && clean(&f.message),
                "{}",
                &f.message[..200.min(f.message.len())]
            );
        }
        assert!(p.plugin.len() <= 80 && clean(&p.plugin), "{:?}", p.plugin);
    }
    assert!(failure_message(&s, 0).contains("at most 64 bytes"));
    assert!(failure_message(&s, 1).contains("plugin name"));
    assert!(failure_message(&s, 3).contains("more bytes cut"));
    for f in fx.store.plugin_failures(fx.run).unwrap() {
        assert!(
            f.message.len() <= 12_000 && clean(&f.message) && clean(&f.plugin),
            "{f:?}"
        );
    }
    assert!(fx.scopes("acceptance").0 > 0);

    // Logs: escapes and a 1 MiB line, cleaned and capped; the scoring itself succeeds.
    let s = fx.score(&[hostile("escape-log", &[])]);
    let o = outcome(&s, 0);
    assert!(o.is_ok());
    assert!(!o.outcome.logs.is_empty());
    for l in &o.outcome.logs {
        assert!(
            l.message.len() <= 4096 + 64 && clean(&l.message),
            "{:?}",
            &l.message[..80]
        );
    }
    assert!(o.outcome.logs[0]
        .message
        .contains("warning: plugin accept-length failed [timeout]"));
    fx.assert_intact();
}

/// A plugin calling itself `accept-length`, run alone, cannot replace the built-in's rows: it
/// fails with `reserved-name` under a name of its own, and the built-in's rows are neither
/// changed nor marked stale. A copy of the built-in (same bytes) keeps its name.
#[test]
fn built_in_names_are_reserved() {
    let fx = Fixture::new();
    fx.score(&[builtin("accept-length")]);
    let before = fx.store.metrics(fx.run).unwrap();

    let s = fx.score(&[PluginRequest::new(common::guest("liar"))]);
    let o = outcome(&s, 0);
    let f = o.failure.as_ref().unwrap();
    assert_eq!(f.kind, FailureKind::ReservedName);
    assert!(
        f.message
            .contains("reserved for the built-in plugin accept-length"),
        "{f}"
    );
    assert!(
        o.plugin.starts_with("accept-length~") && o.plugin.len() == "accept-length~".len() + 12,
        "{}",
        o.plugin
    );
    assert_eq!(o.stale_rows, 0);
    assert_eq!(fx.store.metrics(fx.run).unwrap(), before);
    let prov = fx.store.plugin_runs(fx.run).unwrap();
    assert_eq!(prov.len(), 1);
    assert!(
        prov[0].builtin && prov[0].stale_since.is_none() && prov[0].file == "builtin:accept-length"
    );

    // The built-in's bytes from a file (e.g. plugins/dist) are the built-in.
    let s = fx.score(&[PluginRequest::new(common::builtin("accept-length"))]);
    assert!(outcome(&s, 0).is_ok());
    assert_eq!(fx.store.metrics(fx.run).unwrap(), before);
    assert!(fx.store.plugin_runs(fx.run).unwrap()[0].builtin);
    fx.assert_intact();
}

/// NaN with a non-zero count, and a count of u64::MAX (which SQLite would store as −1), are
/// refused; nothing of them is stored.
#[test]
fn nan_and_count_rules() {
    let fx = Fixture::new();
    for (mode, want) in [
        (
            "nan-count",
            "undefined (NaN) value for blocks with a count of",
        ),
        ("count-max", "a count of 18446744073709551615"),
    ] {
        let s = fx.score(&[hostile(mode, &[]), builtin("topk")]);
        let f = outcome(&s, 0).failure.as_ref().unwrap();
        assert_eq!(f.kind, FailureKind::BadOutput, "{mode}");
        assert!(f.message.contains(want), "{mode}: {f}");
        assert!(outcome(&s, 1).is_ok());
    }
    assert_eq!(fx.scopes("hostile"), (0, 0, 0));
    assert!(fx
        .store
        .metrics(fx.run)
        .unwrap()
        .iter()
        .all(|m| m.count < i64::MAX as u64));
    assert!(fx.scopes("topk").0 > 0);
    fx.assert_intact();
}

/// A 3 GiB file is refused from its first bytes and its size, without being read.
#[test]
fn huge_files_are_refused_before_they_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let rss = peak_rss_mib();
    // Sparse: takes no disk.
    let junk = tmp.path().join("junk.wasm");
    std::fs::File::create(&junk)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let e = rt.load(&junk).unwrap_err();
    assert_eq!(e.kind, FailureKind::NotWasm);
    let comp = tmp.path().join("big.wasm");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&comp).unwrap();
        f.write_all(b"\0asm\x0d\0\x01\0").unwrap();
        f.set_len(3 << 30).unwrap();
    }
    let e = rt.load(&comp).unwrap_err();
    assert_eq!(e.kind, FailureKind::Io);
    assert!(e.message.contains("over the 268435456-byte limit"), "{e}");
    assert!(
        peak_rss_mib() < rss + 512,
        "read into memory: {} MiB",
        peak_rss_mib()
    );
}
