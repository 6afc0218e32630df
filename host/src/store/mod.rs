//! The run store: every evaluation run, its prompts, evaluated records, metrics and plugin
//! failures, in one SQLite file (WAL mode, foreign keys, busy timeout, versioned migrations).
//!
//! Raw data is kept so that every metric convention can be derived later: the records are the
//! columnar [`RecordBatch`] columns as little-endian BLOBs (one row per prompt per chunk), and
//! metric rows carry their denominator (`count`).
//!
//! Integrity rules:
//! - a run is created `running` and only [`Store::finish_run`] marks it `complete` or `failed`;
//!   a process that dies in between leaves it `running`, never `complete`;
//! - records, prompts, metrics and imports are each written in one transaction, so a reader sees
//!   either none or all of one call's rows;
//! - records of a finished run are immutable (metrics may be re-scored at any time).
//!
//! Concurrency: one writer connection behind a mutex plus a small pool of read-only connections
//! (WAL lets readers proceed while the writer writes). `Store` is `Send + Sync`.

mod codec;
mod schema;
#[cfg(test)]
mod tests;

pub use codec::{f32s_to_le, le_to_f32s, le_to_u32s, u32s_to_le};

use crate::records::RecordBatch;
use anyhow::{anyhow, bail, Context, Result};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, Transaction};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most blocks stored in one `record_chunk` row (bounds BLOB sizes to a few MB).
pub const CHUNK_BLOCKS: usize = 4096;
/// Read-only connections kept open for reuse.
const READER_POOL: usize = 16;

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

/// How the drafter was evaluated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RunMode {
    /// Isolated per-anchor evaluation: what deployment sees.
    #[default]
    #[serde(rename = "deployment")]
    Deployment,
    /// Reproduction of how training computes its metrics (shared forward, training mask).
    #[serde(rename = "train-style")]
    TrainStyle,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Deployment => "deployment",
            RunMode::TrainStyle => "train-style",
        }
    }
}
impl fmt::Display for RunMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
impl FromStr for RunMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "deployment" => Ok(RunMode::Deployment),
            "train-style" => Ok(RunMode::TrainStyle),
            _ => bail!("unknown run mode {s:?} (expected deployment or train-style)"),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    #[default]
    Running,
    Complete,
    Failed,
}
impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Complete => "complete",
            RunStatus::Failed => "failed",
        }
    }
}
impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
impl FromStr for RunStatus {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "running" => Ok(RunStatus::Running),
            "complete" => Ok(RunStatus::Complete),
            "failed" => Ok(RunStatus::Failed),
            _ => bail!("unknown run status {s:?} (expected running, complete or failed)"),
        }
    }
}

/// Settings that only exist for train-style runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainStyle {
    /// Where labels come from: "target" (the target's argmax) or "data" (reference tokens).
    pub labels: String,
    /// Training mask rule: "strict" (context < anchor) or "inclusive" (context ≤ anchor, the leak).
    pub mask_rule: String,
}

/// Everything known about a run when it starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NewRun {
    pub name: String,
    pub mode: RunMode,
    /// Full run configuration (flattened into dotted keys by the UI's config diff).
    pub config: serde_json::Value,
    pub target_path: String,
    pub target_sha256: String,
    pub target_arch: String,
    pub drafter_path: String,
    pub drafter_sha256: String,
    /// Name of the checkpoint series (e.g. the training run's folder); joins runs for τ-vs-step.
    pub drafter_series: String,
    pub drafter_step: Option<i64>,
    pub prompt_set_name: String,
    pub prompt_set_sha256: String,
    pub backend: String,
    pub dtype: String,
    pub block_size: u32,
    pub top_k: u32,
    pub train_style: Option<TrainStyle>,
    /// Tokenizer whose vocabulary ([`Store::put_vocab`]) renders this run's token ids.
    pub tokenizer_sha256: Option<String>,
}

/// One prompt of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunPrompt {
    /// Index in the run's prompt set (what `RecordBatch::prompt_index` refers to).
    pub index: u32,
    /// The prompt's id in its prompt set.
    pub id: String,
    /// Content hash (sha256 hex of the canonical prompt); pairs prompts across runs.
    pub sha256: String,
    pub category: Option<String>,
    /// Tokens of the prompt; positions ≥ this are the target's continuation.
    pub prompt_len: u32,
    /// Prompt + continuation token ids.
    pub token_ids: Vec<u32>,
    /// Decoded prompt + continuation.
    pub text: String,
}

/// A prompt without its tokens and text (for lists).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptMeta {
    pub index: u32,
    pub id: String,
    pub sha256: String,
    pub category: Option<String>,
    pub prompt_len: u32,
    pub num_tokens: u32,
}

/// What a metric value summarises.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetricScope {
    Run,
    Prompt(u32),
    Category(String),
}
impl fmt::Display for MetricScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricScope::Run => f.write_str("run"),
            MetricScope::Prompt(i) => write!(f, "prompt:{i}"),
            MetricScope::Category(c) => write!(f, "category:{c}"),
        }
    }
}
impl FromStr for MetricScope {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        if s == "run" {
            Ok(MetricScope::Run)
        } else if let Some(i) = s.strip_prefix("prompt:") {
            Ok(MetricScope::Prompt(i.parse().map_err(|_| {
                anyhow!("bad metric scope {s:?}: prompt index is not a number")
            })?))
        } else if let Some(c) = s.strip_prefix("category:") {
            Ok(MetricScope::Category(c.to_string()))
        } else {
            bail!("bad metric scope {s:?} (expected run, prompt:<index> or category:<name>)")
        }
    }
}
impl Serialize for MetricScope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for MetricScope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One metric value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricRow {
    /// Plugin (or "native") that computed it.
    pub source: String,
    pub name: String,
    pub scope: MetricScope,
    /// NaN means "missing" (stored as NULL).
    pub value: f64,
    /// Denominator: how many items (blocks, rounds, prompts) the value was computed over.
    pub count: u64,
    /// Optional series (e.g. per-position values), any JSON.
    pub series: Option<serde_json::Value>,
    pub unit: String,
    pub description: String,
    pub higher_is_better: bool,
}

impl MetricRow {
    /// A run-scope scalar with no series, unit or description.
    pub fn scalar(
        source: &str,
        name: &str,
        scope: MetricScope,
        value: f64,
        count: u64,
        higher_is_better: bool,
    ) -> Self {
        MetricRow {
            source: source.into(),
            name: name.into(),
            scope,
            value,
            count,
            series: None,
            unit: String::new(),
            description: String::new(),
            higher_is_better,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginFailure {
    pub plugin: String,
    pub kind: String,
    pub message: String,
    pub created_at: String,
}

/// A stored run (all columns of the `run` table).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub id: i64,
    pub uid: String,
    pub name: String,
    pub mode: RunMode,
    pub status: RunStatus,
    pub error: Option<String>,
    pub created_at: String,
    pub finished_at: Option<String>,
    pub timings: serde_json::Value,
    pub config: serde_json::Value,
    pub target_path: String,
    pub target_sha256: String,
    pub target_arch: String,
    pub drafter_path: String,
    pub drafter_sha256: String,
    pub drafter_series: String,
    pub drafter_step: Option<i64>,
    pub prompt_set_name: String,
    pub prompt_set_sha256: String,
    pub backend: String,
    pub dtype: String,
    pub block_size: u32,
    pub top_k: u32,
    pub train_style: Option<TrainStyle>,
    pub tokenizer_sha256: Option<String>,
    pub origin: String,
    pub num_prompts: u64,
    pub num_blocks: u64,
}

/// A row of the run list: the run plus the values of the requested metric columns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    pub run: RunInfo,
    /// One entry per `RunFilter::metric_columns`, `None` when the run lacks it.
    pub metrics: Vec<Option<f64>>,
}

/// A run with its failures (the run page header).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunDetail {
    pub run: RunInfo,
    pub failures: Vec<PluginFailure>,
}

/// (source, name) of a metric.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MetricKey {
    pub source: String,
    pub name: String,
}
impl MetricKey {
    pub fn new(source: &str, name: &str) -> Self {
        MetricKey {
            source: source.into(),
            name: name.into(),
        }
    }
}
impl fmt::Display for MetricKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source, self.name)
    }
}
impl FromStr for MetricKey {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let (a, b) = s
            .split_once('/')
            .ok_or_else(|| anyhow!("bad metric key {s:?} (expected source/name)"))?;
        Ok(MetricKey::new(a, b))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RunSort {
    #[default]
    Created,
    Name,
    Step,
    Status,
    /// Index into `RunFilter::metric_columns`.
    Metric(usize),
}

/// Run list query: filters (all optional, combined with AND), sort and paging.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunFilter {
    /// Substring of name, uid, target, drafter or prompt set.
    pub text: Option<String>,
    /// Target architecture or path (exact).
    pub target: Option<String>,
    /// Drafter series or path (exact).
    pub drafter: Option<String>,
    pub step: Option<i64>,
    pub prompt_set: Option<String>,
    pub backend: Option<String>,
    pub mode: Option<RunMode>,
    pub status: Option<RunStatus>,
    /// Only these run ids.
    pub ids: Option<Vec<i64>>,
    pub sort: RunSort,
    pub descending: bool,
    pub offset: usize,
    /// 0 means "no limit".
    pub limit: usize,
    pub metric_columns: Vec<MetricKey>,
}

/// Distinct values for the run list's filter menus.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Facets {
    pub targets: Vec<String>,
    pub drafters: Vec<String>,
    pub prompt_sets: Vec<String>,
    pub backends: Vec<String>,
    pub steps: Vec<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    Read,
    Write,
}
impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Write => "write",
        }
    }
}
impl FromStr for TokenScope {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "read" => Ok(TokenScope::Read),
            "write" => Ok(TokenScope::Write),
            _ => bail!("unknown token scope {s:?} (expected read or write)"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub scope: TokenScope,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

/// A cached value derived from a run (see the `derived` table).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Derived {
    pub kind: String,
    pub version: i64,
    pub data: Vec<u8>,
}

/// Everything stored for one run, as moved between databases (export and import).
#[derive(Clone, Debug, PartialEq)]
pub struct RunExport {
    pub run: RunInfo,
    pub prompts: Vec<RunPrompt>,
    pub metrics: Vec<MetricRow>,
    pub failures: Vec<PluginFailure>,
    pub records: Option<RecordBatch>,
    pub derived: Vec<Derived>,
    /// Vocabulary of `run.tokenizer_sha256`: (name, pieces).
    pub vocab: Option<(String, Vec<String>)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ImportOutcome {
    /// uids of runs added.
    pub imported: Vec<String>,
    /// uids already present (left unchanged).
    pub skipped: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Store
// ---------------------------------------------------------------------------------------------

pub struct Store {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
}

fn configure(conn: &Connection, what: &str) -> Result<()> {
    // journal_mode=WAL persists in the file; the others are per connection.
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .with_context(|| format!("{what}: cannot set busy timeout"))?;
    conn.execute_batch(
        "PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL; PRAGMA temp_store=MEMORY; PRAGMA cache_size=-65536;",
    )
    .with_context(|| format!("{what}: cannot configure connection"))?;
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the store at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Store> {
        let what = path.display().to_string();
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("{}: cannot create directory", dir.display()))?;
            }
        }
        let mut conn =
            Connection::open(path).with_context(|| format!("{what}: cannot open database"))?;
        configure(&conn, &what)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .with_context(|| format!("{what}: not a SQLite database or not writable"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            bail!("{what}: cannot switch to WAL mode (journal_mode is {mode}); is it on a network file system?");
        }
        schema::migrate(&mut conn, &what)?;
        Ok(Store {
            path: path.to_path_buf(),
            writer: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Schema version of the open database (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?))
    }

    fn what(&self) -> String {
        self.path.display().to_string()
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = self
            .readers
            .lock()
            .map_err(|_| anyhow!("{}: reader pool poisoned", self.what()))?
            .pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX
                        | OpenFlags::SQLITE_OPEN_URI,
                )
                .with_context(|| format!("{}: cannot open database for reading", self.what()))?;
                configure(&c, &self.what())?;
                c
            }
        };
        let out = f(&conn);
        if let Ok(mut pool) = self.readers.lock() {
            if pool.len() < READER_POOL {
                pool.push(conn);
            }
        }
        out
    }

    fn write<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut conn = self
            .writer
            .lock()
            .map_err(|_| anyhow!("{}: writer connection poisoned", self.what()))?;
        f(&mut conn)
    }

    // ---- writing a run --------------------------------------------------------------------

    /// Creates a run with status `running`; returns its id.
    pub fn create_run(&self, run: &NewRun) -> Result<i64> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            let id = insert_run(&tx, run, &new_uid(), "local", &what)?;
            tx.commit()?;
            Ok(id)
        })
    }

    pub fn add_prompt(&self, run: i64, p: &RunPrompt) -> Result<()> {
        self.add_prompts(run, std::slice::from_ref(p))
    }

    /// Adds prompts in one transaction.
    pub fn add_prompts(&self, run: i64, prompts: &[RunPrompt]) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_running(&tx, run, &what)?;
            for p in prompts {
                insert_prompt(&tx, run, p, &what)?;
            }
            tx.execute(
                "UPDATE run SET num_prompts = (SELECT count(*) FROM run_prompt WHERE run_id = ?1) WHERE id = ?1",
                [run],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Adds one prompt and its records in one transaction: a kill between the two can never leave
    /// a prompt without its records.
    pub fn add_prompt_records(&self, run: i64, p: &RunPrompt, batch: &RecordBatch) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_running(&tx, run, &what)?;
            insert_prompt(&tx, run, p, &what)?;
            tx.execute(
                "UPDATE run SET num_prompts = (SELECT count(*) FROM run_prompt WHERE run_id = ?1) WHERE id = ?1",
                [run],
            )?;
            insert_records(&tx, run, batch, &what)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Appends a batch of records in one transaction (all or nothing).
    pub fn add_records(&self, run: i64, batch: &RecordBatch) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_running(&tx, run, &what)?;
            insert_records(&tx, run, batch, &what)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Inserts or replaces metric rows (keyed by source, name, scope) in one transaction.
    /// Allowed on finished runs: a new plugin can re-score old records.
    pub fn add_metrics(&self, run: i64, metrics: &[MetricRow]) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_exists(&tx, run, &what)?;
            insert_metrics(&tx, run, metrics, &what)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Replaces every metric row of `source` for `run` with `metrics` and clears the failures
    /// recorded for a plugin of that name, in one transaction: re-scoring a run with a plugin
    /// never duplicates rows nor leaves old and new values mixed (a changed parameter can change
    /// which metric names a plugin produces), and a reader sees the old rows or the new ones.
    /// Every row must have `source`. Returns how many old rows were replaced.
    pub fn replace_metrics(&self, run: i64, source: &str, metrics: &[MetricRow]) -> Result<usize> {
        let what = self.what();
        if let Some(m) = metrics.iter().find(|m| m.source != source) {
            bail!(
                "{what}: run {run}: replacing the metrics of {source:?} with a row of source {:?} ({})",
                m.source,
                m.name
            );
        }
        self.write(|c| {
            let tx = c.transaction()?;
            require_exists(&tx, run, &what)?;
            let replaced = tx.execute(
                "DELETE FROM metric WHERE run_id = ?1 AND source = ?2",
                params![run, source],
            )?;
            tx.execute(
                "DELETE FROM plugin_failure WHERE run_id = ?1 AND plugin = ?2",
                params![run, source],
            )?;
            insert_metrics(&tx, run, metrics, &what)?;
            tx.commit()?;
            Ok(replaced)
        })
    }

    pub fn add_plugin_failure(
        &self,
        run: i64,
        plugin: &str,
        kind: &str,
        message: &str,
    ) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            require_exists(c, run, &what)?;
            c.execute(
                "INSERT INTO plugin_failure (run_id, plugin, kind, message, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![run, plugin, kind, message, now_rfc3339()],
            )?;
            Ok(())
        })
    }

    /// Marks a running run complete or failed. Finishing twice is an error (a run's outcome is
    /// written once); `status` must not be `Running`.
    pub fn finish_run(
        &self,
        run: i64,
        status: RunStatus,
        error: Option<&str>,
        timings: &serde_json::Value,
    ) -> Result<()> {
        if status == RunStatus::Running {
            bail!(
                "{}: finish_run of run {run} with status running",
                self.what()
            );
        }
        if status == RunStatus::Complete && error.is_some() {
            bail!(
                "{}: run {run} cannot be complete with an error",
                self.what()
            );
        }
        let what = self.what();
        self.write(|c| {
            let tx = c.transaction()?;
            require_running(&tx, run, &what)?;
            tx.execute(
                "UPDATE run SET status = ?2, error = ?3, finished_at = ?4, timings_json = ?5 WHERE id = ?1",
                params![run, status.as_str(), error, now_rfc3339(), timings.to_string()],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Deletes a run and everything stored for it.
    pub fn delete_run(&self, id: i64) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let n = c.execute("DELETE FROM run WHERE id = ?1", [id])?;
            if n == 0 {
                bail!("{what}: run {id} does not exist");
            }
            Ok(())
        })
    }

    // ---- reading ---------------------------------------------------------------------------

    /// The run list: one page of runs matching `filter`, and the total number matching.
    pub fn runs(&self, filter: &RunFilter) -> Result<(Vec<RunSummary>, usize)> {
        let mut conds: Vec<String> = Vec::new();
        let mut args: Vec<Value> = Vec::new();
        let arg = |v: Value, args: &mut Vec<Value>| {
            args.push(v);
            format!("?{}", args.len())
        };
        if let Some(t) = filter.text.as_deref().filter(|t| !t.trim().is_empty()) {
            let pat = format!("%{}%", like_escape(t.trim()));
            let p = arg(Value::Text(pat), &mut args);
            conds.push(format!(
                "(run.name LIKE {p} ESCAPE '\\' OR run.uid LIKE {p} ESCAPE '\\' OR run.target_path LIKE {p} ESCAPE '\\' \
                 OR run.target_arch LIKE {p} ESCAPE '\\' OR run.drafter_path LIKE {p} ESCAPE '\\' \
                 OR run.drafter_series LIKE {p} ESCAPE '\\' OR run.prompt_set_name LIKE {p} ESCAPE '\\')"
            ));
        }
        if let Some(t) = &filter.target {
            let p = arg(Value::Text(t.clone()), &mut args);
            conds.push(format!("(run.target_arch = {p} OR run.target_path = {p})"));
        }
        if let Some(t) = &filter.drafter {
            let p = arg(Value::Text(t.clone()), &mut args);
            conds.push(format!(
                "(run.drafter_series = {p} OR run.drafter_path = {p})"
            ));
        }
        if let Some(s) = filter.step {
            let p = arg(Value::Integer(s), &mut args);
            conds.push(format!("run.drafter_step = {p}"));
        }
        if let Some(t) = &filter.prompt_set {
            let p = arg(Value::Text(t.clone()), &mut args);
            conds.push(format!("run.prompt_set_name = {p}"));
        }
        if let Some(t) = &filter.backend {
            let p = arg(Value::Text(t.clone()), &mut args);
            conds.push(format!("run.backend = {p}"));
        }
        if let Some(m) = filter.mode {
            let p = arg(Value::Text(m.as_str().into()), &mut args);
            conds.push(format!("run.mode = {p}"));
        }
        if let Some(s) = filter.status {
            let p = arg(Value::Text(s.as_str().into()), &mut args);
            conds.push(format!("run.status = {p}"));
        }
        if let Some(ids) = &filter.ids {
            if ids.is_empty() {
                conds.push("0".into());
            } else {
                let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
                conds.push(format!("run.id IN ({})", list.join(",")));
            }
        }
        let where_sql = if conds.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conds.join(" AND "))
        };
        let mut cols = String::new();
        for (i, k) in filter.metric_columns.iter().enumerate() {
            let ps = arg(Value::Text(k.source.clone()), &mut args);
            let pn = arg(Value::Text(k.name.clone()), &mut args);
            cols.push_str(&format!(
                ", (SELECT value FROM metric WHERE run_id = run.id AND source = {ps} AND name = {pn} AND scope = 'run') AS m{i}"
            ));
        }
        let dir = if filter.descending { "DESC" } else { "ASC" };
        let order = match &filter.sort {
            RunSort::Created => format!("run.created_at {dir}, run.id {dir}"),
            RunSort::Name => format!("run.name COLLATE NOCASE {dir}, run.id {dir}"),
            RunSort::Step => {
                format!("(run.drafter_step IS NULL), run.drafter_step {dir}, run.id {dir}")
            }
            RunSort::Status => format!("run.status {dir}, run.id {dir}"),
            RunSort::Metric(i) if *i < filter.metric_columns.len() => {
                format!("(m{i} IS NULL), m{i} {dir}, run.id {dir}")
            }
            RunSort::Metric(i) => bail!(
                "sort by metric column {i}, but only {} metric columns were requested",
                filter.metric_columns.len()
            ),
        };
        let limit = if filter.limit == 0 {
            -1
        } else {
            filter.limit as i64
        };
        let sql = format!(
            "SELECT {RUN_COLS}{cols} FROM run {where_sql} ORDER BY {order} LIMIT {limit} OFFSET {}",
            filter.offset
        );
        let count_sql = format!("SELECT count(*) FROM run {where_sql}");
        let ncols = filter.metric_columns.len();
        let what = self.what();
        self.read(|c| {
            // One read transaction so the page and the total agree.
            c.execute_batch("BEGIN")?;
            let res = (|| -> Result<(Vec<RunSummary>, usize)> {
                let mut stmt = c
                    .prepare_cached(&sql)
                    .with_context(|| format!("{what}: run list query"))?;
                let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    let run = run_from_row(r, &what)?;
                    let mut metrics = Vec::with_capacity(ncols);
                    for i in 0..ncols {
                        metrics.push(r.get::<_, Option<f64>>(RUN_NCOLS + i)?);
                    }
                    out.push(RunSummary { run, metrics });
                }
                // The count query only uses the filter parameters, which come first.
                let nfilter = args.len() - 2 * ncols;
                let total: i64 = c
                    .prepare_cached(&count_sql)?
                    .query_row(rusqlite::params_from_iter(args[..nfilter].iter()), |r| {
                        r.get(0)
                    })?;
                Ok((out, total as usize))
            })();
            c.execute_batch("COMMIT")?;
            res
        })
    }

    pub fn run(&self, id: i64) -> Result<Option<RunDetail>> {
        let what = self.what();
        self.read(|c| {
            let run = c
                .prepare_cached(&format!("SELECT {RUN_COLS} FROM run WHERE id = ?1"))?
                .query_row([id], |r| Ok(run_from_row(r, &what)))
                .optional()?
                .transpose()?;
            let Some(run) = run else { return Ok(None) };
            let failures = failures_of(c, id)?;
            Ok(Some(RunDetail { run, failures }))
        })
    }

    /// Id of the run with this uid.
    pub fn run_id_by_uid(&self, uid: &str) -> Result<Option<i64>> {
        self.read(|c| {
            Ok(
                c.query_row("SELECT id FROM run WHERE uid = ?1", [uid], |r| r.get(0))
                    .optional()?,
            )
        })
    }

    /// Runs of one checkpoint series, ordered by step (runs without a step last).
    pub fn series_runs(&self, series: &str) -> Result<Vec<RunInfo>> {
        let what = self.what();
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {RUN_COLS} FROM run WHERE drafter_series = ?1 ORDER BY (drafter_step IS NULL), drafter_step, id"
            ))?;
            let mut rows = stmt.query([series])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(run_from_row(r, &what)?);
            }
            Ok(out)
        })
    }

    /// Distinct values for filter menus.
    pub fn facets(&self) -> Result<Facets> {
        self.read(|c| {
            let strings = |sql: &str| -> Result<Vec<String>> {
                let mut stmt = c.prepare_cached(sql)?;
                let v = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(v)
            };
            Ok(Facets {
                targets: strings("SELECT DISTINCT target_arch FROM run WHERE target_arch <> '' ORDER BY 1")?,
                drafters: strings("SELECT DISTINCT drafter_series FROM run WHERE drafter_series <> '' ORDER BY 1")?,
                prompt_sets: strings("SELECT DISTINCT prompt_set_name FROM run WHERE prompt_set_name <> '' ORDER BY 1")?,
                backends: strings("SELECT DISTINCT backend FROM run WHERE backend <> '' ORDER BY 1")?,
                steps: {
                    let mut stmt =
                        c.prepare_cached("SELECT DISTINCT drafter_step FROM run WHERE drafter_step IS NOT NULL ORDER BY 1")?;
                    let v = stmt.query_map([], |r| r.get::<_, i64>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
                    v
                },
            })
        })
    }

    /// Run-scope metric keys with the number of runs that have each, most common first.
    pub fn metric_keys(&self) -> Result<Vec<(MetricKey, usize, bool)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT source, name, count(*), max(higher_is_better) FROM metric WHERE scope = 'run' \
                 GROUP BY source, name ORDER BY count(*) DESC, source, name",
            )?;
            let v = stmt
                .query_map([], |r| {
                    Ok((MetricKey { source: r.get(0)?, name: r.get(1)? }, r.get::<_, i64>(2)? as usize, r.get::<_, i64>(3)? != 0))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    /// All records of a run, in insertion order.
    pub fn records(&self, run: i64) -> Result<RecordBatch> {
        self.read_records(run, None)
    }

    /// Prompt indices that have records, ascending (to process a large run prompt by prompt).
    pub fn record_prompts(&self, run: i64) -> Result<Vec<u32>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached("SELECT DISTINCT prompt_index FROM record_chunk WHERE run_id = ?1 ORDER BY prompt_index")?;
            let v = stmt.query_map([run], |r| r.get::<_, u32>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    /// The records of one prompt of a run.
    pub fn prompt_records(&self, run: i64, prompt_index: u32) -> Result<RecordBatch> {
        self.read_records(run, Some(prompt_index))
    }

    fn read_records(&self, run: i64, prompt: Option<u32>) -> Result<RecordBatch> {
        let what = self.what();
        self.read(|c| {
            let (b, k): (u32, u32) = c
                .query_row("SELECT block_size, top_k FROM run WHERE id = ?1", [run], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?
                .ok_or_else(|| anyhow!("{what}: run {run} does not exist"))?;
            let mut out = RecordBatch::new(b, k);
            let (mut tids, mut tlps): (Option<Vec<u32>>, Option<Vec<f32>>) = (Some(Vec::new()), Some(Vec::new()));
            let sql = "SELECT seq, prompt_index, n_blocks, anchor, region, target, valid, loss_mask, draft_ids, draft_logprobs, \
                       target_ids, target_logprobs FROM record_chunk WHERE run_id = ?1 AND (?2 IS NULL OR prompt_index = ?2) ORDER BY seq";
            let mut stmt = c.prepare_cached(sql)?;
            let mut rows = stmt.query(params![run, prompt])?;
            let mut any = false;
            while let Some(r) = rows.next()? {
                any = true;
                let seq: i64 = r.get(0)?;
                let ctx = |col: &str| format!("{what}: run {run} record chunk {seq} column {col}");
                let pi: u32 = r.get(1)?;
                let n: usize = r.get::<_, i64>(2)? as usize;
                out.prompt_index.extend(std::iter::repeat_n(pi, n));
                out.anchor.extend(le_to_u32s(r.get_ref(3)?.as_blob()?, &ctx("anchor"))?);
                out.region.extend_from_slice(r.get_ref(4)?.as_blob()?);
                out.target.extend(le_to_u32s(r.get_ref(5)?.as_blob()?, &ctx("target"))?);
                out.valid.extend_from_slice(r.get_ref(6)?.as_blob()?);
                out.loss_mask.extend_from_slice(r.get_ref(7)?.as_blob()?);
                out.draft_ids.extend(le_to_u32s(r.get_ref(8)?.as_blob()?, &ctx("draft_ids"))?);
                out.draft_logprobs.extend(le_to_f32s(r.get_ref(9)?.as_blob()?, &ctx("draft_logprobs"))?);
                match (r.get_ref(10)?.as_blob_or_null()?, tids.as_mut()) {
                    (Some(bl), Some(v)) => v.extend(le_to_u32s(bl, &ctx("target_ids"))?),
                    _ => tids = None,
                }
                match (r.get_ref(11)?.as_blob_or_null()?, tlps.as_mut()) {
                    (Some(bl), Some(v)) => v.extend(le_to_f32s(bl, &ctx("target_logprobs"))?),
                    _ => tlps = None,
                }
            }
            if any {
                out.target_ids = tids;
                out.target_logprobs = tlps;
            }
            out.check().map_err(|e| anyhow!("{what}: run {run}: stored records are inconsistent: {e}"))?;
            Ok(out)
        })
    }

    pub fn prompts(&self, run: i64) -> Result<Vec<RunPrompt>> {
        let what = self.what();
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT idx, prompt_id, sha256, category, prompt_len, token_ids, text FROM run_prompt WHERE run_id = ?1 ORDER BY idx",
            )?;
            let mut rows = stmt.query([run])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(prompt_from_row(r, &what)?);
            }
            Ok(out)
        })
    }

    pub fn prompt(&self, run: i64, index: u32) -> Result<Option<RunPrompt>> {
        let what = self.what();
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT idx, prompt_id, sha256, category, prompt_len, token_ids, text FROM run_prompt WHERE run_id = ?1 AND idx = ?2",
            )?;
            let mut rows = stmt.query(params![run, index])?;
            match rows.next()? {
                Some(r) => Ok(Some(prompt_from_row(r, &what)?)),
                None => Ok(None),
            }
        })
    }

    /// Prompts of a run without their tokens and text.
    pub fn prompt_metas(&self, run: i64) -> Result<Vec<PromptMeta>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT idx, prompt_id, sha256, category, prompt_len, length(token_ids) / 4 FROM run_prompt WHERE run_id = ?1 ORDER BY idx",
            )?;
            let v = stmt
                .query_map([run], |r| {
                    Ok(PromptMeta {
                        index: r.get(0)?,
                        id: r.get(1)?,
                        sha256: r.get(2)?,
                        category: r.get(3)?,
                        prompt_len: r.get(4)?,
                        num_tokens: r.get(5)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    /// All metric rows of a run (every scope), sorted by source, name, scope.
    pub fn metrics(&self, run: i64) -> Result<Vec<MetricRow>> {
        self.metrics_where(run, None)
    }

    /// Metric rows of one scope.
    pub fn metrics_in_scope(&self, run: i64, scope: &MetricScope) -> Result<Vec<MetricRow>> {
        self.metrics_where(run, Some(scope.to_string()))
    }

    fn metrics_where(&self, run: i64, scope: Option<String>) -> Result<Vec<MetricRow>> {
        let what = self.what();
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT source, name, scope, value, count, series_json, unit, description, higher_is_better FROM metric \
                 WHERE run_id = ?1 AND (?2 IS NULL OR scope = ?2) ORDER BY source, name, scope",
            )?;
            let mut rows = stmt.query(params![run, scope])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let scope: String = r.get(2)?;
                let series: Option<String> = r.get(5)?;
                out.push(MetricRow {
                    source: r.get(0)?,
                    name: r.get(1)?,
                    scope: scope.parse().with_context(|| format!("{what}: run {run}"))?,
                    value: r.get::<_, Option<f64>>(3)?.unwrap_or(f64::NAN),
                    count: r.get::<_, i64>(4)? as u64,
                    series: series
                        .map(|s| serde_json::from_str(&s))
                        .transpose()
                        .with_context(|| format!("{what}: run {run}: bad metric series JSON"))?,
                    unit: r.get(6)?,
                    description: r.get(7)?,
                    higher_is_better: r.get::<_, i64>(8)? != 0,
                });
            }
            Ok(out)
        })
    }

    /// Changes whenever a run's metric rows change (count and sums of values and counts): lets
    /// callers cache what they derive from metrics.
    pub fn metrics_fingerprint(&self, run: i64) -> Result<String> {
        self.read(|c| {
            let (n, v, k): (i64, f64, f64) = c.query_row(
                "SELECT count(*), total(value), total(count) FROM metric WHERE run_id = ?1",
                [run],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            Ok(format!("{n}:{v:e}:{k:e}"))
        })
    }

    pub fn plugin_failures(&self, run: i64) -> Result<Vec<PluginFailure>> {
        self.read(|c| failures_of(c, run))
    }

    // ---- vocabulary ------------------------------------------------------------------------

    /// Stores the display text of every token id of a tokenizer (idempotent per sha256).
    pub fn put_vocab(&self, tokenizer_sha256: &str, name: &str, pieces: &[String]) -> Result<()> {
        self.write(|c| {
            c.execute(
                "INSERT INTO vocab (tokenizer_sha256, name, size, pieces_json) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT(tokenizer_sha256) DO NOTHING",
                params![tokenizer_sha256, name, pieces.len() as i64, serde_json::to_string(pieces)?],
            )?;
            Ok(())
        })
    }

    /// (name, pieces) of a tokenizer's vocabulary.
    pub fn vocab(&self, tokenizer_sha256: &str) -> Result<Option<(String, Vec<String>)>> {
        let what = self.what();
        self.read(|c| {
            let row: Option<(String, String)> = c
                .query_row(
                    "SELECT name, pieces_json FROM vocab WHERE tokenizer_sha256 = ?1",
                    [tokenizer_sha256],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            row.map(|(n, j)| {
                let v: Vec<String> = serde_json::from_str(&j).with_context(|| {
                    format!("{what}: vocab {tokenizer_sha256} is not a JSON string array")
                })?;
                Ok((n, v))
            })
            .transpose()
        })
    }

    // ---- derived caches --------------------------------------------------------------------

    pub fn derived(&self, run: i64, kind: &str) -> Result<Option<Derived>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT kind, version, data FROM derived WHERE run_id = ?1 AND kind = ?2",
                params![run, kind],
                |r| {
                    Ok(Derived {
                        kind: r.get(0)?,
                        version: r.get(1)?,
                        data: r.get(2)?,
                    })
                },
            )
            .optional()?)
        })
    }

    pub fn put_derived(&self, run: i64, d: &Derived) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            require_exists(c, run, &what)?;
            c.execute(
                "INSERT OR REPLACE INTO derived (run_id, kind, version, data) VALUES (?1, ?2, ?3, ?4)",
                params![run, d.kind, d.version, d.data],
            )?;
            Ok(())
        })
    }

    // ---- baselines, shares, tokens ---------------------------------------------------------

    /// Pins `run` as the baseline of `scope` (replacing any previous pin).
    pub fn pin_baseline(&self, scope: &str, run: i64) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            require_exists(c, run, &what)?;
            c.execute(
                "INSERT OR REPLACE INTO baseline (scope, run_id, pinned_at) VALUES (?1, ?2, ?3)",
                params![scope, run, now_rfc3339()],
            )?;
            Ok(())
        })
    }

    pub fn unpin_baseline(&self, scope: &str) -> Result<()> {
        self.write(|c| {
            c.execute("DELETE FROM baseline WHERE scope = ?1", [scope])?;
            Ok(())
        })
    }

    /// All pinned baselines: (scope, run id).
    pub fn baselines(&self) -> Result<Vec<(String, i64)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached("SELECT scope, run_id FROM baseline ORDER BY scope")?;
            let v = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }

    /// Saves a view state (path + query) under a new short id.
    pub fn create_share(&self, state: &str) -> Result<String> {
        self.write(|c| {
            // Same state, same id: sharing a view twice gives one link.
            if let Some(id) = c.query_row("SELECT id FROM share WHERE state = ?1", [state], |r| r.get(0)).optional()? {
                return Ok(id);
            }
            for _ in 0..8 {
                let id = short_id(10);
                let n = c.execute(
                    "INSERT INTO share (id, state, created_at) VALUES (?1, ?2, ?3) ON CONFLICT(id) DO NOTHING",
                    params![id, state, now_rfc3339()],
                )?;
                if n == 1 {
                    return Ok(id);
                }
            }
            bail!("could not allocate a share id")
        })
    }

    pub fn share(&self, id: &str) -> Result<Option<String>> {
        self.read(|c| {
            Ok(
                c.query_row("SELECT state FROM share WHERE id = ?1", [id], |r| r.get(0))
                    .optional()?,
            )
        })
    }

    /// Creates an API token; returns the secret (shown once; only its sha256 is stored).
    pub fn create_token(&self, name: &str, scope: TokenScope) -> Result<String> {
        let secret = format!("dl_{}", random_hex(32));
        self.write(|c| {
            c.execute(
                "INSERT INTO api_token (name, token_sha256, scope, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![name, hash_token(&secret), scope.as_str(), now_rfc3339()],
            )?;
            Ok(())
        })?;
        Ok(secret)
    }

    /// Scope of a presented token, `None` if unknown or revoked.
    pub fn check_token(&self, secret: &str) -> Result<Option<TokenScope>> {
        self.read(|c| {
            let s: Option<String> = c
                .query_row(
                    "SELECT scope FROM api_token WHERE token_sha256 = ?1 AND revoked_at IS NULL",
                    [hash_token(secret)],
                    |r| r.get(0),
                )
                .optional()?;
            s.map(|s| s.parse()).transpose()
        })
    }

    pub fn tokens(&self) -> Result<Vec<TokenInfo>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, name, scope, created_at, revoked_at FROM api_token ORDER BY id",
            )?;
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let scope: String = r.get(2)?;
                out.push(TokenInfo {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    scope: scope.parse()?,
                    created_at: r.get(3)?,
                    revoked_at: r.get(4)?,
                });
            }
            Ok(out)
        })
    }

    /// Revokes every active token with this name (or numeric id); returns how many.
    pub fn revoke_token(&self, name_or_id: &str) -> Result<usize> {
        let id: i64 = name_or_id.parse().unwrap_or(-1);
        self.write(|c| {
            Ok(c.execute(
                "UPDATE api_token SET revoked_at = ?3 WHERE (name = ?1 OR id = ?2) AND revoked_at IS NULL",
                params![name_or_id, id, now_rfc3339()],
            )?)
        })
    }

    // ---- export / import -------------------------------------------------------------------

    /// Everything stored for a run; records only when `with_records`.
    pub fn export_run(&self, id: i64, with_records: bool) -> Result<Option<RunExport>> {
        let Some(detail) = self.run(id)? else {
            return Ok(None);
        };
        let records = if with_records && detail.run.num_blocks > 0 {
            Some(self.records(id)?)
        } else {
            None
        };
        let derived = self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT kind, version, data FROM derived WHERE run_id = ?1 ORDER BY kind",
            )?;
            let v = stmt
                .query_map([id], |r| {
                    Ok(Derived {
                        kind: r.get(0)?,
                        version: r.get(1)?,
                        data: r.get(2)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })?;
        let vocab = match (&detail.run.tokenizer_sha256, with_records) {
            (Some(sha), true) => self.vocab(sha)?,
            _ => None,
        };
        Ok(Some(RunExport {
            prompts: self.prompts(id)?,
            metrics: self.metrics(id)?,
            failures: detail.failures,
            run: detail.run,
            records,
            derived,
            vocab,
        }))
    }

    /// Imports runs in one transaction: a run whose uid is already present is skipped (so
    /// importing the same bundle twice changes nothing); any error rolls everything back.
    /// `source` names the bundle (recorded as the runs' origin); `bundle_sha256` is logged.
    pub fn import_runs(
        &self,
        source: &str,
        bundle_sha256: &str,
        runs: &[RunExport],
    ) -> Result<ImportOutcome> {
        let what = format!("{source}");
        self.write(|c| {
            let tx = c.transaction()?;
            let mut outcome = ImportOutcome::default();
            for r in runs {
                let exists: Option<i64> =
                    tx.query_row("SELECT id FROM run WHERE uid = ?1", [&r.run.uid], |x| x.get(0)).optional()?;
                if exists.is_some() {
                    outcome.skipped.push(r.run.uid.clone());
                    continue;
                }
                import_one(&tx, r, source, &what).with_context(|| format!("{what}: run {}", r.run.uid))?;
                outcome.imported.push(r.run.uid.clone());
            }
            tx.execute(
                "INSERT OR REPLACE INTO import_log (bundle_sha256, source, imported_at, runs_imported, runs_skipped) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![bundle_sha256, source, now_rfc3339(), outcome.imported.len() as i64, outcome.skipped.len() as i64],
            )?;
            tx.commit()?;
            Ok(outcome)
        })
    }

    /// Consistent copy of the database (safe while others write).
    pub fn snapshot(&self, to: &Path) -> Result<()> {
        let dest = to
            .to_str()
            .ok_or_else(|| anyhow!("{}: path is not UTF-8", to.display()))?;
        self.read(|c| {
            c.execute("VACUUM INTO ?1", [dest])
                .with_context(|| format!("{}: snapshot failed", to.display()))?;
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Row helpers
// ---------------------------------------------------------------------------------------------

const RUN_COLS: &str = "run.id, run.uid, run.name, run.mode, run.status, run.error, run.created_at, run.finished_at, \
    run.timings_json, run.config_json, run.target_path, run.target_sha256, run.target_arch, run.drafter_path, \
    run.drafter_sha256, run.drafter_series, run.drafter_step, run.prompt_set_name, run.prompt_set_sha256, run.backend, \
    run.dtype, run.block_size, run.top_k, run.labels, run.mask_rule, run.tokenizer_sha256, run.origin, run.num_prompts, \
    run.num_blocks";
const RUN_NCOLS: usize = 29;

fn run_from_row(r: &Row, what: &str) -> Result<RunInfo> {
    let id: i64 = r.get(0)?;
    let ctx = || format!("{what}: run {id}");
    let mode: String = r.get(3)?;
    let status: String = r.get(4)?;
    let timings: String = r.get(8)?;
    let config: String = r.get(9)?;
    let labels: Option<String> = r.get(23)?;
    let mask_rule: Option<String> = r.get(24)?;
    Ok(RunInfo {
        id,
        uid: r.get(1)?,
        name: r.get(2)?,
        mode: mode.parse().with_context(ctx)?,
        status: status.parse().with_context(ctx)?,
        error: r.get(5)?,
        created_at: r.get(6)?,
        finished_at: r.get(7)?,
        timings: serde_json::from_str(&timings).with_context(ctx)?,
        config: serde_json::from_str(&config).with_context(ctx)?,
        target_path: r.get(10)?,
        target_sha256: r.get(11)?,
        target_arch: r.get(12)?,
        drafter_path: r.get(13)?,
        drafter_sha256: r.get(14)?,
        drafter_series: r.get(15)?,
        drafter_step: r.get(16)?,
        prompt_set_name: r.get(17)?,
        prompt_set_sha256: r.get(18)?,
        backend: r.get(19)?,
        dtype: r.get(20)?,
        block_size: r.get(21)?,
        top_k: r.get(22)?,
        train_style: match (labels, mask_rule) {
            (None, None) => None,
            (l, m) => Some(TrainStyle {
                labels: l.unwrap_or_default(),
                mask_rule: m.unwrap_or_default(),
            }),
        },
        tokenizer_sha256: r.get(25)?,
        origin: r.get(26)?,
        num_prompts: r.get::<_, i64>(27)? as u64,
        num_blocks: r.get::<_, i64>(28)? as u64,
    })
}

fn prompt_from_row(r: &Row, what: &str) -> Result<RunPrompt> {
    let index: u32 = r.get(0)?;
    Ok(RunPrompt {
        index,
        id: r.get(1)?,
        sha256: r.get(2)?,
        category: r.get(3)?,
        prompt_len: r.get(4)?,
        token_ids: le_to_u32s(
            r.get_ref(5)?.as_blob()?,
            &format!("{what}: prompt {index} token_ids"),
        )?,
        text: r.get(6)?,
    })
}

fn failures_of(c: &Connection, run: i64) -> Result<Vec<PluginFailure>> {
    let mut stmt =
        c.prepare_cached("SELECT plugin, kind, message, created_at FROM plugin_failure WHERE run_id = ?1 ORDER BY id")?;
    let v = stmt
        .query_map([run], |r| {
            Ok(PluginFailure {
                plugin: r.get(0)?,
                kind: r.get(1)?,
                message: r.get(2)?,
                created_at: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(v)
}

fn require_exists(c: &Connection, run: i64, what: &str) -> Result<()> {
    let n: i64 = c.query_row("SELECT count(*) FROM run WHERE id = ?1", [run], |r| {
        r.get(0)
    })?;
    if n == 0 {
        bail!("{what}: run {run} does not exist");
    }
    Ok(())
}

fn require_running(c: &Connection, run: i64, what: &str) -> Result<()> {
    let status: Option<String> = c
        .query_row("SELECT status FROM run WHERE id = ?1", [run], |r| r.get(0))
        .optional()?;
    match status.as_deref() {
        None => bail!("{what}: run {run} does not exist"),
        Some("running") => Ok(()),
        Some(s) => bail!("{what}: run {run} is {s}; its prompts and records can no longer change"),
    }
}

fn check_run_fields(run: &NewRun, what: &str) -> Result<()> {
    if run.block_size < 2 {
        bail!(
            "{what}: run {:?}: block size {} is below 2",
            run.name,
            run.block_size
        );
    }
    if run.top_k < 1 {
        bail!("{what}: run {:?}: top_k must be at least 1", run.name);
    }
    match (run.mode, &run.train_style) {
        (RunMode::Deployment, Some(_)) => bail!(
            "{what}: run {:?}: train-style settings given for a deployment run",
            run.name
        ),
        _ => Ok(()),
    }
}

fn insert_run(tx: &Transaction, run: &NewRun, uid: &str, origin: &str, what: &str) -> Result<i64> {
    check_run_fields(run, what)?;
    let config = if run.config.is_null() {
        "{}".to_string()
    } else {
        run.config.to_string()
    };
    tx.execute(
        "INSERT INTO run (uid, name, mode, status, created_at, config_json, target_path, target_sha256, target_arch, \
         drafter_path, drafter_sha256, drafter_series, drafter_step, prompt_set_name, prompt_set_sha256, backend, dtype, \
         block_size, top_k, labels, mask_rule, tokenizer_sha256, origin) \
         VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
        params![
            uid,
            run.name,
            run.mode.as_str(),
            now_rfc3339(),
            config,
            run.target_path,
            run.target_sha256,
            run.target_arch,
            run.drafter_path,
            run.drafter_sha256,
            run.drafter_series,
            run.drafter_step,
            run.prompt_set_name,
            run.prompt_set_sha256,
            run.backend,
            run.dtype,
            run.block_size,
            run.top_k,
            run.train_style.as_ref().map(|t| t.labels.clone()),
            run.train_style.as_ref().map(|t| t.mask_rule.clone()),
            run.tokenizer_sha256,
            origin,
        ],
    )
    .with_context(|| format!("{what}: cannot create run {:?}", run.name))?;
    Ok(tx.last_insert_rowid())
}

fn insert_prompt(tx: &Transaction, run: i64, p: &RunPrompt, what: &str) -> Result<()> {
    if p.prompt_len as usize > p.token_ids.len() {
        bail!(
            "{what}: run {run} prompt {}: prompt_len {} exceeds its {} tokens",
            p.index,
            p.prompt_len,
            p.token_ids.len()
        );
    }
    tx.prepare_cached(
        "INSERT INTO run_prompt (run_id, idx, prompt_id, sha256, category, prompt_len, token_ids, text) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![run, p.index, p.id, p.sha256, p.category, p.prompt_len, u32s_to_le(&p.token_ids), p.text])
    .with_context(|| format!("{what}: run {run}: cannot store prompt {} (duplicate index?)", p.index))?;
    Ok(())
}

fn insert_records(tx: &Transaction, run: i64, batch: &RecordBatch, what: &str) -> Result<()> {
    batch
        .check()
        .map_err(|e| anyhow!("{what}: run {run}: {e}"))?;
    let (b, k): (u32, u32) = tx.query_row(
        "SELECT block_size, top_k FROM run WHERE id = ?1",
        [run],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if (batch.block_size, batch.top_k) != (b, k) {
        bail!(
            "{what}: run {run} has block size {b} and top-k {k}, but the records have {} and {}",
            batch.block_size,
            batch.top_k
        );
    }
    if batch.region.iter().any(|&r| r > 1) {
        bail!("{what}: run {run}: record region values must be 0 (completion) or 1 (prompt)");
    }
    let nb = batch.num_blocks();
    if nb == 0 {
        return Ok(());
    }
    let p = batch.positions_per_block();
    let kk = batch.top_k as usize;
    let mut seq: i64 = tx.query_row(
        "SELECT coalesce(max(seq), -1) + 1 FROM record_chunk WHERE run_id = ?1",
        [run],
        |r| r.get(0),
    )?;
    let mut stmt = tx.prepare_cached(
        "INSERT INTO record_chunk (run_id, seq, prompt_index, n_blocks, anchor, region, target, valid, loss_mask, \
         draft_ids, draft_logprobs, target_ids, target_logprobs) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    // Split into runs of blocks of one prompt, at most CHUNK_BLOCKS each.
    let mut start = 0;
    while start < nb {
        let pi = batch.prompt_index[start];
        let mut end = start + 1;
        while end < nb && batch.prompt_index[end] == pi && end - start < CHUNK_BLOCKS {
            end += 1;
        }
        let (ps, pe) = (start * p, end * p);
        let (cs, ce) = (ps * kk, pe * kk);
        stmt.execute(params![
            run,
            seq,
            pi,
            (end - start) as i64,
            u32s_to_le(&batch.anchor[start..end]),
            &batch.region[start..end],
            u32s_to_le(&batch.target[ps..pe]),
            &batch.valid[ps..pe],
            &batch.loss_mask[ps..pe],
            u32s_to_le(&batch.draft_ids[cs..ce]),
            f32s_to_le(&batch.draft_logprobs[cs..ce]),
            batch.target_ids.as_ref().map(|v| u32s_to_le(&v[cs..ce])),
            batch
                .target_logprobs
                .as_ref()
                .map(|v| f32s_to_le(&v[cs..ce])),
        ])?;
        seq += 1;
        start = end;
    }
    tx.execute(
        "UPDATE run SET num_blocks = num_blocks + ?2 WHERE id = ?1",
        params![run, nb as i64],
    )?;
    Ok(())
}

fn insert_metrics(tx: &Transaction, run: i64, metrics: &[MetricRow], what: &str) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT OR REPLACE INTO metric (run_id, source, name, scope, value, count, series_json, unit, description, higher_is_better) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for m in metrics {
        if m.source.is_empty() || m.name.is_empty() {
            bail!("{what}: run {run}: metric with an empty source or name");
        }
        if m.source.contains('/') {
            bail!(
                "{what}: run {run}: metric source {:?} must not contain '/'",
                m.source
            );
        }
        let value = if m.value.is_nan() {
            None
        } else {
            Some(m.value)
        };
        stmt.execute(params![
            run,
            m.source,
            m.name,
            m.scope.to_string(),
            value,
            m.count as i64,
            m.series.as_ref().map(|s| s.to_string()),
            m.unit,
            m.description,
            m.higher_is_better as i64,
        ])
        .with_context(|| {
            format!(
                "{what}: run {run}: cannot store metric {}/{}",
                m.source, m.name
            )
        })?;
    }
    Ok(())
}

fn import_one(tx: &Transaction, r: &RunExport, source: &str, what: &str) -> Result<()> {
    let info = &r.run;
    let new = NewRun {
        name: info.name.clone(),
        mode: info.mode,
        config: info.config.clone(),
        target_path: info.target_path.clone(),
        target_sha256: info.target_sha256.clone(),
        target_arch: info.target_arch.clone(),
        drafter_path: info.drafter_path.clone(),
        drafter_sha256: info.drafter_sha256.clone(),
        drafter_series: info.drafter_series.clone(),
        drafter_step: info.drafter_step,
        prompt_set_name: info.prompt_set_name.clone(),
        prompt_set_sha256: info.prompt_set_sha256.clone(),
        backend: info.backend.clone(),
        dtype: info.dtype.clone(),
        block_size: info.block_size,
        top_k: info.top_k,
        train_style: info.train_style.clone(),
        tokenizer_sha256: info.tokenizer_sha256.clone(),
    };
    if info.uid.is_empty() || info.uid.len() > 64 {
        bail!("{what}: run uid must be 1..64 characters");
    }
    let origin = format!("import:{source}");
    let id = insert_run(tx, &new, &info.uid, &origin, what)?;
    for p in &r.prompts {
        insert_prompt(tx, id, p, what)?;
    }
    if let Some(rec) = &r.records {
        insert_records(tx, id, rec, what)?;
    }
    insert_metrics(tx, id, &r.metrics, what)?;
    for f in &r.failures {
        tx.execute(
            "INSERT INTO plugin_failure (run_id, plugin, kind, message, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, f.plugin, f.kind, f.message, f.created_at],
        )?;
    }
    for d in &r.derived {
        tx.execute(
            "INSERT OR REPLACE INTO derived (run_id, kind, version, data) VALUES (?1, ?2, ?3, ?4)",
            params![id, d.kind, d.version, d.data],
        )?;
    }
    if let (Some(sha), Some((name, pieces))) = (&info.tokenizer_sha256, &r.vocab) {
        tx.execute(
            "INSERT INTO vocab (tokenizer_sha256, name, size, pieces_json) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            params![sha, name, pieces.len() as i64, serde_json::to_string(pieces)?],
        )?;
    }
    // Keep the original outcome and times; a run exported while running stays running.
    tx.execute(
        "UPDATE run SET status = ?2, error = ?3, created_at = ?4, finished_at = ?5, timings_json = ?6, \
         num_prompts = (SELECT count(*) FROM run_prompt WHERE run_id = ?1) WHERE id = ?1",
        params![
            id,
            info.status.as_str(),
            info.error,
            info.created_at,
            info.finished_at,
            if info.timings.is_null() { "{}".to_string() } else { info.timings.to_string() }
        ],
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------------------

fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

pub fn hash_token(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Hex of `nbytes` random bytes from the OS (/dev/urandom: token secrets and share ids must not
/// be guessable). Where that device is missing, falls back to sha256 of OS-seeded hasher keys,
/// the clock, the pid and a counter.
pub fn random_hex(nbytes: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; nbytes];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
    {
        return hex::encode(buf);
    }
    fallback_random_hex(nbytes)
}

fn fallback_random_hex(nbytes: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < nbytes * 2 {
        let mut h = Sha256::new();
        let rs = std::collections::hash_map::RandomState::new();
        let mut sh = rs.build_hasher();
        sh.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.update(sh.finish().to_le_bytes());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        h.update(nanos.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        out.push_str(&hex::encode(h.finalize()));
    }
    out.truncate(nbytes * 2);
    out
}

/// Time-ordered unique id: 12 hex digits of milliseconds since the epoch + 20 random hex digits.
pub fn new_uid() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{:012x}{}", ms as u64 & 0xffff_ffff_ffff, random_hex(10))
}

/// Short lowercase base32 id (Crockford alphabet, no ambiguous letters).
fn short_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let bytes = hex::decode(random_hex(len)).unwrap_or_default();
    bytes
        .iter()
        .take(len)
        .map(|b| ALPHABET[(*b & 31) as usize] as char)
        .collect()
}

/// Current UTC time as RFC 3339 with seconds ("2026-11-29T10:11:12Z").
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    rfc3339_from_unix(secs)
}

pub fn rfc3339_from_unix(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
