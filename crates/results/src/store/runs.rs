//! Runs: their identity, configuration and status (create, finish, delete), the run list with
//! server-side filters, sorting and paging, and the rows of the `run` table, read by column name.

use super::*;

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

/// The family a run without one reads as: DFlash, the one family draftlens evaluated before
/// families were stored (schema v6).
pub const DEFAULT_DRAFTER_FAMILY: &str = "dflash";

/// Longest drafter family name a run may store.
pub const MAX_DRAFTER_FAMILY_LEN: usize = 64;

/// The drafter family of a run whose evaluation identity's `drafter_kind` is `kind`: DFlash's
/// kind is "checkpoint" (the name it had before there were other families), every other kind
/// ("eagle3", "dflash2", "mtp", "builtin:oracle", …) is its own family; an empty kind is
/// [`DEFAULT_DRAFTER_FAMILY`]. Schema v6 applies the same rule in SQL to the runs stored before.
pub fn drafter_family_of_kind(kind: &str) -> &str {
    match kind {
        "" | "checkpoint" => DEFAULT_DRAFTER_FAMILY,
        other => other,
    }
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
    /// The drafter family ([`drafter_family_of_kind`]); empty is stored as
    /// [`DEFAULT_DRAFTER_FAMILY`].
    #[serde(default)]
    pub drafter_family: String,
}

fn default_drafter_family() -> String {
    DEFAULT_DRAFTER_FAMILY.into()
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
    /// "dflash", "eagle3", … ([`drafter_family_of_kind`]); bundles written before families were
    /// stored read as [`DEFAULT_DRAFTER_FAMILY`].
    #[serde(default = "default_drafter_family")]
    pub drafter_family: String,
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

/// The columns of `run` that [`run_from_row`] reads (by name, so their order does not matter).
pub(super) const RUN_COLS: &str = "run.id, run.uid, run.name, run.mode, run.status, run.error, run.created_at, run.finished_at, \
    run.timings_json, run.config_json, run.target_path, run.target_sha256, run.target_arch, run.drafter_path, \
    run.drafter_sha256, run.drafter_series, run.drafter_step, run.prompt_set_name, run.prompt_set_sha256, run.backend, \
    run.dtype, run.block_size, run.top_k, run.labels, run.mask_rule, run.tokenizer_sha256, run.origin, run.num_prompts, \
    run.num_blocks, run.drafter_family";

impl RunInfo {
    /// What creating this run again needs (imports and merges start from a stored run).
    pub fn as_new_run(&self) -> NewRun {
        NewRun {
            name: self.name.clone(),
            mode: self.mode,
            config: self.config.clone(),
            target_path: self.target_path.clone(),
            target_sha256: self.target_sha256.clone(),
            target_arch: self.target_arch.clone(),
            drafter_path: self.drafter_path.clone(),
            drafter_sha256: self.drafter_sha256.clone(),
            drafter_series: self.drafter_series.clone(),
            drafter_step: self.drafter_step,
            prompt_set_name: self.prompt_set_name.clone(),
            prompt_set_sha256: self.prompt_set_sha256.clone(),
            backend: self.backend.clone(),
            dtype: self.dtype.clone(),
            block_size: self.block_size,
            top_k: self.top_k,
            train_style: self.train_style.clone(),
            tokenizer_sha256: self.tokenizer_sha256.clone(),
            drafter_family: self.drafter_family.clone(),
        }
    }
}

/// A [`RunInfo`] from a row that holds [`RUN_COLS`].
pub(super) fn run_from_row(r: &Row, what: &str) -> Result<RunInfo> {
    let id: i64 = r.get("id")?;
    let ctx = || format!("{what}: run {id}");
    let mode: String = r.get("mode")?;
    let status: String = r.get("status")?;
    let timings: String = r.get("timings_json")?;
    let config: String = r.get("config_json")?;
    let labels: Option<String> = r.get("labels")?;
    let mask_rule: Option<String> = r.get("mask_rule")?;
    Ok(RunInfo {
        id,
        uid: r.get("uid")?,
        name: r.get("name")?,
        mode: mode.parse().with_context(ctx)?,
        status: status.parse().with_context(ctx)?,
        error: r.get("error")?,
        created_at: r.get("created_at")?,
        finished_at: r.get("finished_at")?,
        timings: serde_json::from_str(&timings).with_context(ctx)?,
        config: serde_json::from_str(&config).with_context(ctx)?,
        target_path: r.get("target_path")?,
        target_sha256: r.get("target_sha256")?,
        target_arch: r.get("target_arch")?,
        drafter_path: r.get("drafter_path")?,
        drafter_sha256: r.get("drafter_sha256")?,
        drafter_series: r.get("drafter_series")?,
        drafter_step: r.get("drafter_step")?,
        prompt_set_name: r.get("prompt_set_name")?,
        prompt_set_sha256: r.get("prompt_set_sha256")?,
        backend: r.get("backend")?,
        dtype: r.get("dtype")?,
        block_size: r.get("block_size")?,
        top_k: r.get("top_k")?,
        train_style: match (labels, mask_rule) {
            (None, None) => None,
            (l, m) => Some(TrainStyle {
                labels: l.unwrap_or_default(),
                mask_rule: m.unwrap_or_default(),
            }),
        },
        tokenizer_sha256: r.get("tokenizer_sha256")?,
        origin: r.get("origin")?,
        num_prompts: r.get::<_, i64>("num_prompts")? as u64,
        num_blocks: r.get::<_, i64>("num_blocks")? as u64,
        drafter_family: r.get("drafter_family")?,
    })
}

pub(super) fn require_exists(c: &Connection, run: i64, what: &str) -> Result<()> {
    let n: i64 = c.query_row("SELECT count(*) FROM run WHERE id = ?1", [run], |r| {
        r.get(0)
    })?;
    if n == 0 {
        bail!("{what}: run {run} does not exist");
    }
    Ok(())
}

pub(super) fn require_running(c: &Connection, run: i64, what: &str) -> Result<()> {
    let status: Option<String> = c
        .query_row("SELECT status FROM run WHERE id = ?1", [run], |r| r.get(0))
        .optional()?;
    match status.as_deref() {
        None => bail!("{what}: run {run} does not exist"),
        Some("running") => Ok(()),
        Some(s) => bail!("{what}: run {run} is {s}; its prompts and records can no longer change"),
    }
}

/// Largest block size a run may have (and a drafter config may declare): published DFlash
/// drafters use 8–16. Past this a `block_size` is a broken or hostile config: the evaluation
/// allocates per block, so 10⁹ ends in an allocation failure and 10⁵ in the OOM killer.
pub const MAX_BLOCK_SIZE: u32 = 1024;

pub(super) fn check_run_fields(run: &NewRun, what: &str) -> Result<()> {
    if run.block_size < 2 {
        bail!(
            "{what}: run {:?}: block size {} is below 2",
            run.name,
            run.block_size
        );
    }
    if run.block_size > MAX_BLOCK_SIZE {
        bail!(
            "{what}: run {:?}: block size {} is over the limit of {MAX_BLOCK_SIZE}",
            run.name,
            run.block_size
        );
    }
    if run.top_k < 1 {
        bail!("{what}: run {:?}: top_k must be at least 1", run.name);
    }
    let family = &run.drafter_family;
    if family.len() > MAX_DRAFTER_FAMILY_LEN
        || family.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        bail!(
            "{what}: run {:?}: drafter family {family:?} must be at most {MAX_DRAFTER_FAMILY_LEN} bytes without spaces or control characters",
            run.name
        );
    }
    match (run.mode, &run.train_style) {
        (RunMode::Deployment, Some(_)) => bail!(
            "{what}: run {:?}: train-style settings given for a deployment run",
            run.name
        ),
        _ => Ok(()),
    }
}

pub(super) fn insert_run(
    tx: &Transaction,
    run: &NewRun,
    uid: &str,
    origin: &str,
    what: &str,
) -> Result<i64> {
    check_run_fields(run, what)?;
    let config = if run.config.is_null() {
        "{}".to_string()
    } else {
        run.config.to_string()
    };
    tx.execute(
        "INSERT INTO run (uid, name, mode, status, created_at, config_json, target_path, target_sha256, target_arch, \
         drafter_path, drafter_sha256, drafter_series, drafter_step, prompt_set_name, prompt_set_sha256, backend, dtype, \
         block_size, top_k, labels, mask_rule, tokenizer_sha256, origin, drafter_family) \
         VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)",
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
            drafter_family_of_kind(&run.drafter_family),
        ],
    )
    .with_context(|| format!("{what}: cannot create run {:?}", run.name))?;
    Ok(tx.last_insert_rowid())
}

/// The error of a run whose process died before finishing it (see `liveness`).
pub const INTERRUPTED: &str = "interrupted: the process running it stopped without finishing it (killed or crashed); \
     marked failed when the database was next opened. Run the same command again to resume from the caches";

/// Marks every local run still `running` as failed with [`INTERRUPTED`]; only called when no
/// other process has the database open (`liveness`), so that none of them can still be running.
/// Returns the (id, name) of each run marked.
pub(super) fn mark_interrupted(c: &mut Connection) -> Result<Vec<(i64, String)>> {
    let tx = c.transaction()?;
    let marked = {
        let mut stmt = tx.prepare(
            "UPDATE run SET status = 'failed', error = ?1, finished_at = ?2 \
             WHERE status = 'running' AND origin = 'local' RETURNING id, name",
        )?;
        let rows = stmt.query_map(params![INTERRUPTED, now_rfc3339()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        rows.collect::<rusqlite::Result<Vec<(i64, String)>>>()?
    };
    tx.commit()?;
    Ok(marked)
}

pub(super) fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

impl Store {
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
                        metrics.push(r.get::<_, Option<f64>>(format!("m{i}").as_str())?);
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
}
