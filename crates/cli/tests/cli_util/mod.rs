//! Helpers shared by the CLI tests (`cli_*.rs`): running the built `draftlens` binary, checking
//! that a failure is one clean error, writing small prompt sets and reading the run store.
//!
//! Not every test file uses every helper.
#![allow(dead_code)]

use draftlens_results::store::{MetricRow, RunFilter, RunInfo, Store};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The two-prompt set (one code, one science prompt) several run tests share.
pub fn write_two_prompts(path: &Path) {
    write_prompts(
        path,
        &[
            (
                "add",
                Some("code"),
                "Write a Python function add(a, b) that returns the sum of a and b.",
            ),
            (
                "sky",
                Some("science"),
                "Why is the sky blue? Explain it to a child.",
            ),
        ],
    );
}

/// The repository root (crates/cli is this crate's manifest folder).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default target model; tests fail (not skip) without it: `scripts/setup-fixtures.sh`.
pub fn model() -> PathBuf {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup-fixtures.sh from the repository root first",
        p.display()
    );
    p
}

pub fn reference_drafter() -> PathBuf {
    root().join("drafters/smollm2-reference/step-2581")
}

/// A `draftlens` command run from the repository root with a private cache folder (never the
/// user's), the installed fixtures as data folder, and no inherited log settings.
pub fn cmd(cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_draftlens"));
    c.current_dir(root())
        .arg("--cache-dir")
        .arg(cache)
        .env("DRAFTLENS_DATA", root().join("data"))
        .env_remove("DRAFTLENS_CACHE")
        .env_remove("DRAFTLENS_LOG")
        .env_remove("RUST_BACKTRACE");
    c
}

/// Run `draftlens --cache-dir <cache> <args…>` to completion.
pub fn dl(cache: &Path, args: &[&str]) -> Output {
    cmd(cache).args(args).output().expect("spawn draftlens")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code 0, or a panic that shows what the command printed.
pub fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
}

/// Parse `--json` output.
pub fn json_out(o: &Output, what: &str) -> serde_json::Value {
    ok(o, what);
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{what}: stdout is not JSON ({e}):\n{}", stdout(o)))
}

/// The command failed the way the spec asks for bad input: a non-zero exit code that is not a
/// panic's (101), no panic text, and one `error:` line that contains every `needles` string.
/// Returns that line.
pub fn clean_error(o: &Output, what: &str, needles: &[&str]) -> String {
    let err = stderr(o);
    let code = o.status.code();
    assert!(
        code.is_some() && code != Some(0) && code != Some(101),
        "{what}: exit code {code:?}, expected a clean failure\nstderr:\n{err}"
    );
    assert!(
        !err.contains("internal error") && !err.contains("panicked"),
        "{what}: a panic instead of an error:\n{err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: expected one error line, stderr:\n{err}"
    );
    for n in needles {
        assert!(
            lines[0].contains(n),
            "{what}: the error does not mention {n:?}:\n{}",
            lines[0]
        );
    }
    lines[0].to_string()
}

/// Write a JSONL prompt set of chat prompts `(id, category, user message)`.
pub fn write_prompts(path: &Path, prompts: &[(&str, Option<&str>, &str)]) {
    let lines: Vec<String> = prompts
        .iter()
        .map(|(id, cat, msg)| serde_json::json!({ "id": id, "category": cat, "messages": [{ "role": "user", "content": msg }] }).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Every run in `db`, oldest first.
pub fn runs(db: &Path) -> Vec<RunInfo> {
    let store = Store::open(db).unwrap();
    let (rows, _) = store.runs(&RunFilter::default()).unwrap();
    let mut v: Vec<RunInfo> = rows.into_iter().map(|r| r.run).collect();
    v.sort_by_key(|r| r.id);
    v
}

/// Metrics of a run keyed by (source, name, scope), sorted, for exact comparison.
pub fn metric_map(db: &Path, run: i64) -> Vec<(String, MetricRow)> {
    let store = Store::open(db).unwrap();
    let mut v: Vec<(String, MetricRow)> = store
        .metrics(run)
        .unwrap()
        .into_iter()
        .map(|m| (format!("{}/{}/{}", m.source, m.name, m.scope), m))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// `draftlens cache verify` passes on `cache` and returns how many entries it checked.
pub fn cache_verifies(cache: &Path) -> usize {
    let o = dl(cache, &["--json", "cache", "verify"]);
    let v = json_out(&o, "cache verify");
    let rows = v.as_array().unwrap();
    assert!(
        rows.iter().all(|r| r["ok"] == true),
        "corrupt cache entries: {v}"
    );
    // Entries only: the weight-file identity rows depend on which models were opened.
    rows.iter().filter(|r| r["kind"] == "entry").count()
}

/// Everything stored for a run that must not depend on how it was produced (sharded, merged,
/// pushed): prompts, records, every metric row (source/name/scope key, value bits, count, series)
/// and the plugins' provenance (source, sha256, parameters).
pub type Stored = (
    Vec<draftlens_results::store::RunPrompt>,
    draftlens_records::RecordBatch,
    Vec<(String, u64, u64, Option<serde_json::Value>)>,
    Vec<(String, String, String)>,
);

/// [`Stored`] of run `run` in `db`.
pub fn stored(db: &Path, run: i64) -> Stored {
    let store = Store::open(db).unwrap();
    let metrics = metric_map(db, run)
        .into_iter()
        .map(|(k, m)| (k, m.value.to_bits(), m.count, m.series))
        .collect();
    let plugins = store
        .plugin_runs(run)
        .unwrap()
        .into_iter()
        .map(|p| (p.source, p.sha256, p.params_json))
        .collect();
    (
        store.prompts(run).unwrap(),
        store.records(run).unwrap(),
        metrics,
        plugins,
    )
}

/// Three chat prompts (two with a category) several run, shard and push tests share; their
/// content hashes put them in shards {sum, tea} / {rev} of 2 and {rev} / {sum, tea} / {} of 3.
pub const THREE_PROMPTS: [(&str, Option<&str>, &str); 3] = [
    (
        "rev",
        Some("code"),
        "Write a Python function that reverses a string.",
    ),
    (
        "sum",
        Some("math"),
        "What is the sum of the first ten positive integers? Show the steps.",
    ),
    ("tea", None, "Give three tips for brewing good tea."),
];

/// `got` equals `want` in every part of [`Stored`], to the last bit; `ctx` prefixes the messages.
pub fn assert_same_stored(got: &Stored, want: &Stored, ctx: &str) {
    assert_eq!(got.0, want.0, "{ctx}prompts differ");
    assert!(got.1 == want.1, "{ctx}records differ");
    assert_eq!(
        got.2.iter().map(|x| &x.0).collect::<Vec<_>>(),
        want.2.iter().map(|x| &x.0).collect::<Vec<_>>(),
        "{ctx}metric sets differ"
    );
    for (g, w) in got.2.iter().zip(&want.2) {
        assert_eq!(g, w, "{ctx}metric {} differs", g.0);
    }
    assert_eq!(got.3, want.3, "{ctx}plugin provenance differs");
}
