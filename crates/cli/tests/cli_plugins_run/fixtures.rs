//! What the cases share: the plugins under test (built-ins from plugins/dist, the hostile guest
//! built here), the binary with a private plugin cache, a synthetic stored run, and lookups of
//! stored metric rows.

use crate::cli_util::*;
use draftlens_plugin_host::sdk::testdata::{random, Shape};
use draftlens_results::store::{MetricRow, MetricScope, NewRun, RunPrompt, RunStatus, Store};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// A built-in plugin from plugins/dist. Fails (never skips) when it has not been built.
pub fn dist(name: &str) -> PathBuf {
    let p = root().join("plugins/dist").join(format!("{name}.wasm"));
    assert!(
        p.is_file(),
        "{} is missing: run plugins/build.sh from the repository root first (scripts/test.sh does it \
         before cargo test)",
        p.display()
    );
    p
}

/// The hostile test guest (plugins/tests-guests/hostile).
pub fn hostile() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| guest("hostile"))
}

/// A test guest (plugins/tests-guests/NAME), built for wasm32-unknown-unknown with rustup's
/// wasm-component-ld into the same folder crates/plugin-host's tests use, so cargo builds it once
/// for both.
pub fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../wasm-guests");
        std::fs::create_dir_all(&target).unwrap();
        let target = target.canonicalize().unwrap();
        let out = |c: &mut Command| String::from_utf8(c.output().unwrap().stdout).unwrap();
        let sysroot = out(Command::new("rustc").args(["--print", "sysroot"]));
        let vv = out(Command::new("rustc").arg("-vV"));
        let host = vv.lines().find_map(|l| l.strip_prefix("host: ")).unwrap();
        let ld = Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(host)
            .join("bin/wasm-component-ld");
        assert!(
            ld.exists(),
            "{} is missing: the toolchain must ship wasm-component-ld (rustup target add wasm32-unknown-unknown)",
            ld.display()
        );
        let o = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root())
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-unknown-unknown",
                "-p",
                "guest-hostile",
                "-p",
                "guest-describe-loop",
            ])
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", &ld)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .expect("running cargo for the test guests");
        assert!(
            o.status.success(),
            "building the test guests failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        target.join("wasm32-unknown-unknown/release")
    });
    dir.join(format!("guest_{}.wasm", name.replace('-', "_")))
}

/// `draftlens --cache-dir <tmp>/cache <args…>` from the repository root, with a private
/// precompiled-plugin cache and no plugin settings inherited from the environment.
pub fn dl_plugins(tmp: &Path, args: &[&str]) -> Output {
    cmd(&tmp.join("cache"))
        .env_remove("DRAFTLENS_PLUGIN_PATH")
        .env("DRAFTLENS_PLUGIN_CACHE", tmp.join("plugin-cache"))
        .args(args)
        .output()
        .expect("spawn draftlens")
}

pub fn metric<'a>(
    rows: &'a [MetricRow],
    source: &str,
    name: &str,
    scope: &MetricScope,
) -> &'a MetricRow {
    rows.iter()
        .find(|m| m.source == source && m.name == name && &m.scope == scope)
        .unwrap_or_else(|| {
            let have: Vec<String> = rows
                .iter()
                .map(|m| format!("{}/{}/{}", m.source, m.name, m.scope))
                .collect();
            panic!("no metric {source}/{name}/{scope}; stored: {have:?}")
        })
}

/// `plugin` equals `native` in value (to rounding of the summation order) and in count.
pub fn same(rows: &[MetricRow], plugin: (&str, &str), native: &str, scope: &MetricScope) -> f64 {
    let p = metric(rows, plugin.0, plugin.1, scope);
    let n = metric(rows, "native", native, scope);
    assert!(
        (p.value - n.value).abs() <= 1e-12 * n.value.abs().max(1.0),
        "{}/{} {scope}: plugin {} vs native {native} {}",
        plugin.0,
        plugin.1,
        p.value,
        n.value
    );
    assert_eq!(
        p.count, n.count,
        "{}/{} {scope}: counts",
        plugin.0, plugin.1
    );
    p.value
}

pub fn rows_of(db: &Path, run: i64) -> Vec<MetricRow> {
    Store::open(db).unwrap().metrics(run).unwrap()
}

/// A complete run of 3 prompts (categories a, b, a) with synthetic records, B = 8, K = 4.
pub fn synthetic_run(db: &Path) -> (i64, draftlens_records::RecordBatch) {
    let store = Store::open(db).unwrap();
    let id = store
        .create_run(&NewRun {
            name: "synthetic".into(),
            block_size: 8,
            top_k: 4,
            ..NewRun::default()
        })
        .unwrap();
    let mut all = draftlens_records::RecordBatch::new(8, 4);
    for (p, cat) in [(0u32, "a"), (1, "b"), (2, "a")] {
        let mut r = random(11 + p as u64, &Shape::new(8, 4, 1, 10, 40), 0.75, 0.15);
        r.prompt_index.iter_mut().for_each(|x| *x = p);
        let prompt = RunPrompt {
            index: p,
            id: format!("p{p}"),
            sha256: format!("{p:064}"),
            category: Some(cat.into()),
            prompt_len: 10,
            token_ids: (0..50).collect(),
            text: String::new(),
        };
        store.add_prompt_records(id, &prompt, &r).unwrap();
        all.extend(&r);
    }
    store
        .finish_run(id, RunStatus::Complete, None, &serde_json::json!({}))
        .unwrap();
    (id, all)
}

/// Row count per source of a run, straight from SQLite.
pub fn count_rows(db: &Path, run: i64, source: &str) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(
        "SELECT count(*) FROM metric WHERE run_id = ?1 AND source = ?2",
        rusqlite::params![run, source],
        |r| r.get(0),
    )
    .unwrap()
}
