//! Schema migrations, tracked in `PRAGMA user_version` (hand-rolled: rusqlite_migration pins an
//! older rusqlite, see docs/ui.md §5.3).
//!
//! Rules: a migration that has shipped is never edited; new schema goes in a new entry at the end.
//! Each migration runs in one `BEGIN IMMEDIATE` transaction together with the `user_version`
//! bump, so two processes opening a fresh file at once cannot both apply it.

use anyhow::{bail, Context, Result};
use rusqlite::{Connection, TransactionBehavior};

/// Migration `i` (0-based) takes the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    // ---- v1: runs, prompts, records, metrics, failures, vocab, derived caches, sharing, tokens
    r#"
CREATE TABLE run (
  id INTEGER PRIMARY KEY,
  uid TEXT NOT NULL UNIQUE,                 -- global id: URLs, bundles, idempotent import
  name TEXT NOT NULL,
  mode TEXT NOT NULL CHECK (mode IN ('deployment','train-style')),
  status TEXT NOT NULL DEFAULT 'running' CHECK (status IN ('running','complete','failed')),
  error TEXT,
  created_at TEXT NOT NULL,
  finished_at TEXT,
  timings_json TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(timings_json)),
  config_json TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(config_json)),
  target_path TEXT NOT NULL DEFAULT '',
  target_sha256 TEXT NOT NULL DEFAULT '',
  target_arch TEXT NOT NULL DEFAULT '',
  drafter_path TEXT NOT NULL DEFAULT '',
  drafter_sha256 TEXT NOT NULL DEFAULT '',
  drafter_series TEXT NOT NULL DEFAULT '',  -- checkpoint series: runs of one training run
  drafter_step INTEGER,                     -- checkpoint step within the series
  prompt_set_name TEXT NOT NULL DEFAULT '',
  prompt_set_sha256 TEXT NOT NULL DEFAULT '',
  backend TEXT NOT NULL DEFAULT '',
  dtype TEXT NOT NULL DEFAULT '',
  block_size INTEGER NOT NULL,
  top_k INTEGER NOT NULL,
  labels TEXT,                              -- train-style: 'target' | 'data'
  mask_rule TEXT,                           -- train-style: 'strict' | 'inclusive'
  tokenizer_sha256 TEXT,
  origin TEXT NOT NULL DEFAULT 'local',     -- 'local' or 'import:<file name>'
  num_prompts INTEGER NOT NULL DEFAULT 0,
  num_blocks INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX run_by_created ON run(created_at);
CREATE INDEX run_by_series ON run(drafter_series, drafter_step);
CREATE INDEX run_by_scope ON run(target_sha256, prompt_set_sha256, backend);

CREATE TABLE run_prompt (
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,
  prompt_id TEXT NOT NULL,
  sha256 TEXT NOT NULL,                     -- content hash: pairs prompts across runs and servers
  category TEXT,
  prompt_len INTEGER NOT NULL,              -- tokens of the prompt; the rest is the continuation
  token_ids BLOB NOT NULL,                  -- u32 LE, prompt + continuation
  text TEXT NOT NULL,                       -- decoded prompt + continuation
  PRIMARY KEY (run_id, idx)
) STRICT;
CREATE INDEX run_prompt_by_sha ON run_prompt(sha256);

-- One row per prompt per chunk of at most CHUNK_BLOCKS blocks; columns are the RecordBatch
-- columns as little-endian BLOBs (u32, u8 or f32).
CREATE TABLE record_chunk (
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  prompt_index INTEGER NOT NULL,
  n_blocks INTEGER NOT NULL,
  anchor BLOB NOT NULL,
  region BLOB NOT NULL,
  target BLOB NOT NULL,
  valid BLOB NOT NULL,
  loss_mask BLOB NOT NULL,
  draft_ids BLOB NOT NULL,
  draft_logprobs BLOB NOT NULL,
  target_ids BLOB,
  target_logprobs BLOB,
  PRIMARY KEY (run_id, seq)
) STRICT;
CREATE INDEX record_chunk_by_prompt ON record_chunk(run_id, prompt_index);

-- value NULL = NaN / missing (SQLite turns NaN into NULL anyway).
CREATE TABLE metric (
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  source TEXT NOT NULL,
  name TEXT NOT NULL,
  scope TEXT NOT NULL,                      -- 'run' | 'prompt:<index>' | 'category:<name>'
  value REAL,
  count INTEGER NOT NULL DEFAULT 0,         -- denominator the value was computed over
  series_json TEXT CHECK (series_json IS NULL OR json_valid(series_json)),
  unit TEXT NOT NULL DEFAULT '',
  description TEXT NOT NULL DEFAULT '',
  higher_is_better INTEGER NOT NULL DEFAULT 1 CHECK (higher_is_better IN (0,1)),
  PRIMARY KEY (run_id, source, name, scope)
) STRICT, WITHOUT ROWID;
CREATE INDEX metric_by_key ON metric(source, name, scope, run_id, value);

CREATE TABLE plugin_failure (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  plugin TEXT NOT NULL,
  kind TEXT NOT NULL,
  message TEXT NOT NULL,
  created_at TEXT NOT NULL
) STRICT;
CREATE INDEX plugin_failure_by_run ON plugin_failure(run_id);

-- Token id -> display text for one tokenizer (JSON array of strings), shared by runs.
CREATE TABLE vocab (
  tokenizer_sha256 TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  size INTEGER NOT NULL,
  pieces_json TEXT NOT NULL
) STRICT;

-- Values derived from a run's raw data (caches; safe to delete, recomputed from records).
CREATE TABLE derived (
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  kind TEXT NOT NULL,
  version INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (run_id, kind)
) STRICT;

CREATE TABLE baseline (
  scope TEXT PRIMARY KEY,                   -- '*' or 'target=<sha>;prompts=<sha>'
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  pinned_at TEXT NOT NULL
) STRICT;

CREATE TABLE share (
  id TEXT PRIMARY KEY,                      -- short base32 id
  state TEXT NOT NULL,                      -- path + query of the shared view
  created_at TEXT NOT NULL
) STRICT;

CREATE TABLE api_token (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  token_sha256 TEXT NOT NULL UNIQUE,        -- only the hash is kept
  scope TEXT NOT NULL CHECK (scope IN ('read','write')),
  created_at TEXT NOT NULL,
  revoked_at TEXT
) STRICT;

CREATE TABLE import_log (
  bundle_sha256 TEXT PRIMARY KEY,
  source TEXT NOT NULL,
  imported_at TEXT NOT NULL,
  runs_imported INTEGER NOT NULL,
  runs_skipped INTEGER NOT NULL
) STRICT;
"#,
    // ---- v2: which plugin file produced each plugin source's rows (sha256), and whether those
    // rows are stale (a later scoring by that source failed, so they come from an earlier file
    // or earlier parameters). One row per run and source: every metric row of that source joins it.
    r#"
CREATE TABLE plugin_run (
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  source TEXT NOT NULL,                     -- = metric.source of its rows
  sha256 TEXT NOT NULL,                     -- of the .wasm that produced them ('' = unknown, older rows)
  version TEXT NOT NULL DEFAULT '',         -- the plugin's own version string
  file TEXT NOT NULL DEFAULT '',            -- where it was loaded from ('builtin:NAME' for embedded ones)
  builtin INTEGER NOT NULL DEFAULT 0 CHECK (builtin IN (0,1)),
  params_json TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(params_json)),
  scored_at TEXT NOT NULL,
  stale_since TEXT,                         -- set when a later scoring by this source failed
  PRIMARY KEY (run_id, source)
) STRICT;
"#,
    // ---- v3: which evaluation a run belongs to and which shard of it it is (docs/scale-out.md):
    // the sha256 of its evaluation identity (equal for every shard of one evaluation), the shard
    // I/N (NULL for an unsharded or a merged run), how many prompts the whole set and this run
    // hold, and for a merged run the uids of the shard runs it was merged from.
    r#"
CREATE TABLE run_eval (
  run_id INTEGER PRIMARY KEY REFERENCES run(id) ON DELETE CASCADE,
  identity TEXT NOT NULL,                   -- sha256 hex of identity_json
  identity_json TEXT NOT NULL CHECK (json_valid(identity_json)),
  shard_index INTEGER,
  shard_count INTEGER,
  set_prompts INTEGER NOT NULL,             -- prompts of the evaluated set (after --limit)
  run_prompts INTEGER NOT NULL,             -- prompts this run is to evaluate (its shard's)
  merged_from_json TEXT CHECK (merged_from_json IS NULL OR json_valid(merged_from_json)),
  CHECK ((shard_index IS NULL) = (shard_count IS NULL)),
  CHECK (shard_count IS NULL OR (shard_count >= 1 AND shard_index >= 0 AND shard_index < shard_count))
) STRICT;
CREATE INDEX run_eval_by_identity ON run_eval(identity);
"#,
    // ---- v4 (watch): checkpoints `draftlens watch` has dealt with, so that a restarted watcher
    // evaluates each (job, checkpoint folder, weights sha256) once. `job` identifies the
    // evaluation (target, prompts, options, series).
    r#"
CREATE TABLE watch_checkpoint (
  job TEXT NOT NULL,
  path TEXT NOT NULL,                       -- the checkpoint folder
  sha256 TEXT NOT NULL,                     -- of its model.safetensors ('' when it has none)
  step INTEGER,
  status TEXT NOT NULL CHECK (status IN ('evaluated','broken','failed')),
  run_uid TEXT,                             -- the stored run, when one was made
  pushed INTEGER NOT NULL DEFAULT 0 CHECK (pushed IN (0,1)),
  message TEXT,
  at TEXT NOT NULL,
  PRIMARY KEY (job, path, sha256)
) STRICT;
"#,
    // ---- v5 (watch --slurm): a checkpoint can be `submitted` as a Slurm job, whose id is kept
    // so that a restarted watcher follows the job instead of submitting it again. SQLite cannot
    // change a CHECK constraint in place: the table is rebuilt with its rows.
    r#"
CREATE TABLE watch_checkpoint_v5 (
  job TEXT NOT NULL,
  path TEXT NOT NULL,                       -- the checkpoint folder
  sha256 TEXT NOT NULL,                     -- of its model.safetensors ('' when it has none)
  step INTEGER,
  status TEXT NOT NULL CHECK (status IN ('evaluated','broken','failed','submitted')),
  run_uid TEXT,                             -- the stored run, when one was made
  pushed INTEGER NOT NULL DEFAULT 0 CHECK (pushed IN (0,1)),
  message TEXT,
  at TEXT NOT NULL,
  slurm_job TEXT,                           -- `watch --slurm`: the job that evaluates it
  PRIMARY KEY (job, path, sha256)
) STRICT;
INSERT INTO watch_checkpoint_v5 (job, path, sha256, step, status, run_uid, pushed, message, at)
  SELECT job, path, sha256, step, status, run_uid, pushed, message, at FROM watch_checkpoint;
DROP TABLE watch_checkpoint;
ALTER TABLE watch_checkpoint_v5 RENAME TO watch_checkpoint;
"#,
    // ---- v6 (issue 35): the drafter family of every run ("dflash", "eagle3", "dflash2", "mtp",
    // "builtin:oracle", ...: a string, so a new family needs no schema change). Runs stored
    // before it take their evaluation identity's drafter_kind ("checkpoint", DFlash's kind,
    // reads as "dflash"); runs without an identity (imports, traces, older runs) read as
    // "dflash", the one family draftlens evaluated before. The rule is `drafter_family_of_kind`
    // (runs.rs), written here in SQL once for the rows that exist.
    r#"
ALTER TABLE run ADD COLUMN drafter_family TEXT NOT NULL DEFAULT 'dflash';
UPDATE run SET drafter_family = (
    SELECT CASE json_extract(e.identity_json, '$.drafter_kind')
             WHEN 'checkpoint' THEN 'dflash'
             ELSE json_extract(e.identity_json, '$.drafter_kind') END
    FROM run_eval e WHERE e.run_id = run.id)
WHERE EXISTS (SELECT 1 FROM run_eval e WHERE e.run_id = run.id
              AND typeof(json_extract(e.identity_json, '$.drafter_kind')) = 'text'
              AND json_extract(e.identity_json, '$.drafter_kind') <> '');
CREATE INDEX run_by_family ON run(drafter_family);
"#,
    // ---- v7 (issue 36): `draftlens trace diff` results (docs/traces.md §6): a trace run's verify
    // rounds against a reference drafter replayed on the engine's own tokens. One `trace_diff` row
    // per diff (diffing the run again against the same drafter weights replaces it), one row per
    // prompt with its counts and first departures, one row per listed round (the first rounds of
    // each prompt where the reference commits another number of tokens than the engine did).
    r#"
CREATE TABLE trace_diff (
  id INTEGER PRIMARY KEY AUTOINCREMENT,     -- never reused: a replaced diff gets a new id (links, caches)
  run_id INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
  drafter_path TEXT NOT NULL,
  drafter_sha256 TEXT NOT NULL,             -- of the reference drafter's weights file
  target_path TEXT NOT NULL,
  backend TEXT NOT NULL,
  created_at TEXT NOT NULL,
  UNIQUE (run_id, drafter_sha256)
) STRICT;

CREATE TABLE trace_diff_prompt (
  diff_id INTEGER NOT NULL REFERENCES trace_diff(id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,                     -- run_prompt.idx of the diffed run
  rounds INTEGER NOT NULL,                  -- the engine's verify rounds
  engine_tokens INTEGER NOT NULL,
  reference_tokens INTEGER NOT NULL,        -- what the reference commits at the engine's anchors
  rounds_fewer INTEGER NOT NULL,            -- rounds where the reference commits more
  rounds_more INTEGER NOT NULL,             -- rounds where the reference commits fewer
  chain_tokens INTEGER NOT NULL,            -- the reference's own replayed chain
  chain_rounds INTEGER NOT NULL,
  departures INTEGER NOT NULL,              -- positions off the target's greedy token
  first_departures_json TEXT NOT NULL CHECK (json_valid(first_departures_json)),
  PRIMARY KEY (diff_id, idx)
) STRICT;

CREATE TABLE trace_diff_round (
  diff_id INTEGER NOT NULL REFERENCES trace_diff(id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,                     -- the prompt
  round INTEGER NOT NULL,                   -- 0-based round of the engine's decode
  anchor INTEGER NOT NULL,                  -- where it verified (a position of prompt + output)
  engine INTEGER NOT NULL,                  -- tokens the engine committed
  reference INTEGER NOT NULL,               -- tokens the reference commits there
  reference_ids BLOB NOT NULL,              -- u32 LE: those tokens (the target's greedy ones)
  PRIMARY KEY (diff_id, idx, round)
) STRICT;
"#,
];

pub fn latest_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Brings the schema of `conn` up to the latest version. `what` names the file for errors.
pub fn migrate(conn: &mut Connection, what: &str) -> Result<()> {
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .with_context(|| format!("{what}: cannot read schema version"))?;
    if current > latest_version() {
        bail!(
            "{what}: schema version {current} is newer than this draftlens understands ({}); upgrade draftlens",
            latest_version()
        );
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .with_context(|| format!("{what}: cannot start migration to v{}", i + 1))?;
        // Another process may have migrated between our read and our write lock.
        let now: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if now > i as i64 {
            continue;
        }
        tx.execute_batch(sql)
            .with_context(|| format!("{what}: migration to schema v{} failed", i + 1))?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()
            .with_context(|| format!("{what}: cannot commit migration to v{}", i + 1))?;
    }
    Ok(())
}
