//! The versioned JSON bundle: what a report embeds and what `import` accepts.
//!
//! Format `draftlens-bundle` version 2 (1 when no run carries `eval` or `plugins`):
//! ```text
//! { "format": "draftlens-bundle", "version": 2, "created_at": "...", "generator": "draftlens-web 0.1.0",
//!   "runs": [ { "run": RunInfo, "prompts": [..], "metrics": [MetricRow], "failures": [..],
//!               "stats": RunStats | null, "records": Records | null, "vocab": {name, pieces} | null,
//!               "eval": RunEval (optional), "plugins": [PluginProvenance] (optional) } ] }
//! ```
//! `eval` is the run's evaluation identity and shard (`run_eval`, docs/scale-out.md §2) and
//! `plugins` which plugins produced its plugin rows: with them an imported or pushed shard run
//! is a shard that `merge` and a team server can merge. Version 1 bundles (written before they
//! travelled) import as runs of no evaluation. A bundle without either field is still written
//! as version 1, so that older draftlens releases keep reading it.
//! Binary columns (token ids, record columns) are base64 of little-endian arrays. Uploaded
//! bundles are hostile until checked: size limit first, then strict parsing (unknown fields are
//! errors), then validation of every count and length, then one transaction.

use crate::analysis::{load_stats, RunStats, STATS_KIND, STATS_VERSION};
use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use draftlens_records::{RecordBatch, COLUMNS};
use draftlens_results::store::{
    column_to_le, le_to_column, le_to_u32s, u32s_to_le, Derived, ImportOutcome, MetricRow,
    PluginFailure, PluginProvenance, RunEval, RunExport, RunInfo, RunPrompt, Store,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

pub const FORMAT: &str = "draftlens-bundle";
pub const VERSION: u32 = 2;
/// Default largest file `import` reads.
pub const DEFAULT_MAX_IMPORT_BYTES: usize = 256 << 20;
/// Element id of the bundle inside a report.
pub const SCRIPT_ID: &str = "draftlens-bundle";

const MAX_RUNS: usize = 10_000;
const MAX_PROMPTS: usize = 1_000_000;
const MAX_TEXT: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    pub format: String,
    pub version: u32,
    pub created_at: String,
    pub generator: String,
    pub runs: Vec<BundleRun>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleRun {
    pub run: RunInfo,
    pub prompts: Vec<BundlePrompt>,
    pub metrics: Vec<MetricRow>,
    pub failures: Vec<PluginFailure>,
    pub stats: Option<RunStats>,
    pub records: Option<BundleRecords>,
    pub vocab: Option<BundleVocab>,
    /// The run's evaluation (`run_eval`); absent in version 1 bundles and for runs of none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<RunEval>,
    /// Provenance of the plugin metric rows (`plugin_run`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<PluginProvenance>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundlePrompt {
    pub index: u32,
    pub id: String,
    pub sha256: String,
    pub category: Option<String>,
    pub prompt_len: u32,
    /// base64 of u32 LE token ids (prompt + continuation).
    pub token_ids: String,
    pub text: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleVocab {
    pub name: String,
    pub pieces: Vec<String>,
}

/// RecordBatch columns, base64 of little-endian arrays: the object
/// `{"block_size": B, "top_k": K, <column>: "<base64>" | null, …}` with one key per
/// record column, named and ordered as `draftlens_records::COLUMNS` (null or absent: an optional
/// column the run did not keep). Read as strictly as the other bundle objects: an unknown,
/// repeated or missing key is an error.
#[derive(Debug)]
pub struct BundleRecords {
    pub block_size: u32,
    pub top_k: u32,
    /// One entry per column of `COLUMNS`, in order; `None`: an absent optional column.
    pub columns: Vec<Option<String>>,
}

/// The keys of a records object: B, K, then the columns.
fn records_keys() -> &'static [&'static str] {
    static KEYS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        ["block_size", "top_k"]
            .into_iter()
            .chain(COLUMNS.iter().map(|c| c.name))
            .collect()
    })
}

impl Serialize for BundleRecords {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("BundleRecords", 2 + COLUMNS.len())?;
        m.serialize_field("block_size", &self.block_size)?;
        m.serialize_field("top_k", &self.top_k)?;
        for (c, v) in COLUMNS.iter().zip(&self.columns) {
            m.serialize_field(c.name, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for BundleRecords {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Records;
        impl<'de> serde::de::Visitor<'de> for Records {
            type Value = BundleRecords;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("struct BundleRecords")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<BundleRecords, A::Error> {
                use serde::de::Error;
                let (mut block_size, mut top_k) = (None, None);
                // Outer Option: whether the key was seen.
                let mut columns: Vec<Option<Option<String>>> = vec![None; COLUMNS.len()];
                while let Some(key) = map.next_key::<String>()? {
                    let dup = |name: &'static str| Err(A::Error::duplicate_field(name));
                    match key.as_str() {
                        "block_size" if block_size.is_some() => return dup("block_size"),
                        "block_size" => block_size = Some(map.next_value()?),
                        "top_k" if top_k.is_some() => return dup("top_k"),
                        "top_k" => top_k = Some(map.next_value()?),
                        name => {
                            let Some(i) = COLUMNS.iter().position(|c| c.name == name) else {
                                return Err(A::Error::unknown_field(name, records_keys()));
                            };
                            let c = &COLUMNS[i];
                            if columns[i].is_some() {
                                return dup(c.name);
                            }
                            columns[i] = Some(if c.is_optional() {
                                map.next_value()?
                            } else {
                                Some(map.next_value::<String>()?)
                            });
                        }
                    }
                }
                let block_size = block_size.ok_or_else(|| A::Error::missing_field("block_size"))?;
                let top_k = top_k.ok_or_else(|| A::Error::missing_field("top_k"))?;
                let columns = COLUMNS
                    .iter()
                    .zip(columns)
                    .map(|(c, v)| match v {
                        Some(v) => Ok(v),
                        None if c.is_optional() => Ok(None),
                        None => Err(A::Error::missing_field(c.name)),
                    })
                    .collect::<std::result::Result<_, _>>()?;
                Ok(BundleRecords {
                    block_size,
                    top_k,
                    columns,
                })
            }
        }
        d.deserialize_struct("BundleRecords", records_keys(), Records)
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str, what: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| anyhow!("{what}: not valid base64 ({e})"))
}

impl BundleRecords {
    pub fn from_batch(b: &RecordBatch) -> Self {
        BundleRecords {
            block_size: b.block_size,
            top_k: b.top_k,
            columns: COLUMNS
                .iter()
                .map(|c| b.column(c).map(|col| b64(&column_to_le(col))))
                .collect(),
        }
    }
    pub fn to_batch(&self, what: &str) -> Result<RecordBatch> {
        let mut b = RecordBatch::new(self.block_size, self.top_k);
        for (c, text) in COLUMNS.iter().zip(&self.columns) {
            let w = format!("{what}.records.{}", c.name);
            let data = match text {
                Some(s) => Some(le_to_column(c.element, &unb64(s, &w)?, &w)?),
                None => None,
            };
            b.set_column(c, data).map_err(|e| anyhow!("{w}: {e}"))?;
        }
        b.check().map_err(|e| anyhow!("{what}.records: {e}"))?;
        Ok(b)
    }
}

/// Builds a bundle of runs (records only when `with_records`; statistics always, so charts
/// work after import).
pub fn export_bundle(store: &Store, ids: &[i64], with_records: bool) -> Result<Bundle> {
    let mut runs = Vec::new();
    for &id in ids {
        let ex = store
            .export_run(id, with_records)?
            .with_context(|| format!("{}: run {id} does not exist", store.path().display()))?;
        let stats = load_stats(store, &ex.run)?;
        runs.push(BundleRun {
            prompts: ex
                .prompts
                .iter()
                .map(|p| BundlePrompt {
                    index: p.index,
                    id: p.id.clone(),
                    sha256: p.sha256.clone(),
                    category: p.category.clone(),
                    prompt_len: p.prompt_len,
                    token_ids: b64(&u32s_to_le(&p.token_ids)),
                    text: p.text.clone(),
                })
                .collect(),
            metrics: ex.metrics,
            failures: ex.failures,
            stats,
            records: ex.records.as_ref().map(BundleRecords::from_batch),
            vocab: ex.vocab.map(|(name, pieces)| BundleVocab { name, pieces }),
            eval: ex.eval,
            plugins: ex.plugins,
            run: ex.run,
        });
    }
    let v2 = runs
        .iter()
        .any(|r| r.eval.is_some() || !r.plugins.is_empty());
    Ok(Bundle {
        format: FORMAT.into(),
        version: if v2 { VERSION } else { 1 },
        created_at: draftlens_results::store::now_rfc3339(),
        generator: format!("draftlens-web {}", env!("CARGO_PKG_VERSION")),
        runs,
    })
}

/// What an import did.
#[derive(Clone, Debug, Serialize)]
pub struct ImportSummary {
    pub source: String,
    pub bundle_sha256: String,
    pub imported: Vec<String>,
    pub skipped: Vec<String>,
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: imported {} run{}, {} already present (unchanged)",
            self.source,
            self.imported.len(),
            if self.imported.len() == 1 { "" } else { "s" },
            self.skipped.len()
        )
    }
}

/// Imports a report (.html) or bundle (.json) file, refusing files over `max_bytes`.
pub fn import_file(store: &Store, path: &Path, max_bytes: usize) -> Result<ImportSummary> {
    let what = path.display().to_string();
    let meta = std::fs::metadata(path).with_context(|| format!("{what}: cannot read"))?;
    if meta.len() as usize > max_bytes {
        bail!(
            "{what}: file is {} bytes, over the import limit of {} bytes",
            meta.len(),
            max_bytes
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("{what}: cannot read"))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or(what.clone());
    import_bytes(store, &name, &what, &bytes, max_bytes)
}

/// Imports bytes of a report or bundle. `name` is recorded as the origin, `what` names the
/// input in errors.
pub fn import_bytes(
    store: &Store,
    name: &str,
    what: &str,
    bytes: &[u8],
    max_bytes: usize,
) -> Result<ImportSummary> {
    if bytes.len() > max_bytes {
        bail!(
            "{what}: {} bytes, over the import limit of {} bytes",
            bytes.len(),
            max_bytes
        );
    }
    let text = std::str::from_utf8(bytes).map_err(|e| anyhow!("{what}: not UTF-8 text ({e})"))?;
    let json = extract_json(text, what)?;
    let bundle: Bundle = serde_json::from_str(json)
        .map_err(|e| anyhow!("{what}: not a valid draftlens bundle: {e}"))?;
    let exports = validate(&bundle, what)?;
    let sha = hex::encode(Sha256::digest(bytes));
    let ImportOutcome { imported, skipped } = store
        .import_runs(name, &sha, &exports)
        .with_context(|| format!("{what}: import failed, nothing was imported"))?;
    Ok(ImportSummary {
        source: name.into(),
        bundle_sha256: sha,
        imported,
        skipped,
    })
}

/// The bundle JSON: the whole text for .json, the embedded script element for a report.
fn extract_json<'a>(text: &'a str, what: &str) -> Result<&'a str> {
    let t = text.trim_start_matches('\u{feff}').trim_start();
    if t.starts_with('{') {
        return Ok(t);
    }
    if !t.starts_with('<') {
        bail!("{what}: neither a JSON bundle nor an HTML report");
    }
    let marker = format!("id=\"{SCRIPT_ID}\"");
    let at = text.rfind(&marker).ok_or_else(|| anyhow!("{what}: an HTML file without an embedded draftlens bundle (no element id \"{SCRIPT_ID}\")"))?;
    let open_end = text[at..]
        .find('>')
        .ok_or_else(|| anyhow!("{what}: truncated bundle element"))?
        + at
        + 1;
    let close = text[open_end..]
        .find("</script>")
        .ok_or_else(|| anyhow!("{what}: bundle element is not closed"))?
        + open_end;
    Ok(&text[open_end..close])
}

fn check_len(s: &str, max: usize, what: &str) -> Result<()> {
    if s.len() > max {
        bail!("{what}: {} bytes long, over the limit of {max}", s.len());
    }
    Ok(())
}

/// A run's evaluation as a hostile file could get it wrong: the identity a sha256, a possible
/// shard, no more prompts than its shard, merged-from uids like run uids.
fn check_eval(e: &RunEval, prompts: usize, w: &str) -> Result<()> {
    if e.identity.len() != 64 || !e.identity.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("{w}: eval.identity must be 64 hex digits (a sha256)");
    }
    check_len(
        &e.identity_json.to_string(),
        MAX_TEXT,
        &format!("{w}: eval.identity_json"),
    )?;
    if let Some(s) = e.shard {
        if s.count == 0 || s.index >= s.count {
            bail!("{w}: eval.shard {}/{} is not a shard", s.index, s.count);
        }
    }
    if e.run_prompts > e.set_prompts || prompts > e.run_prompts as usize {
        bail!(
            "{w}: eval says {} of {} prompts, the run holds {prompts}",
            e.run_prompts,
            e.set_prompts
        );
    }
    if let Some(m) = &e.merged_from {
        if m.len() > MAX_RUNS
            || m.iter().any(|u| {
                u.is_empty()
                    || u.len() > 64
                    || !u
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            })
        {
            bail!("{w}: eval.merged_from must list run uids");
        }
    }
    Ok(())
}

/// Checks every field a hostile file could get wrong; returns what the store imports.
pub fn validate(b: &Bundle, what: &str) -> Result<Vec<RunExport>> {
    if b.format != FORMAT {
        bail!("{what}: format is {:?}, expected {FORMAT:?}", b.format);
    }
    if b.version == 0 || b.version > VERSION {
        bail!("{what}: bundle version {} is not supported (this draftlens reads version {VERSION}); upgrade draftlens", b.version);
    }
    if b.runs.is_empty() {
        bail!("{what}: the bundle contains no runs");
    }
    if b.runs.len() > MAX_RUNS {
        bail!(
            "{what}: {} runs, over the limit of {MAX_RUNS}",
            b.runs.len()
        );
    }
    let mut uids = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, br) in b.runs.iter().enumerate() {
        let r = &br.run;
        let w = format!("{what}: runs[{i}]");
        if r.uid.is_empty()
            || r.uid.len() > 64
            || !r
                .uid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!(
                "{w}: uid {:?} must be 1-64 characters of [A-Za-z0-9_-]",
                r.uid.chars().take(80).collect::<String>()
            );
        }
        if !uids.insert(r.uid.clone()) {
            bail!("{w}: uid {} appears twice in the bundle", r.uid);
        }
        let w = format!("{what}: run {}", r.uid);
        check_len(&r.name, 1000, &format!("{w}: name"))?;
        for (f, s) in [
            ("target_path", &r.target_path),
            ("drafter_path", &r.drafter_path),
            ("prompt_set_name", &r.prompt_set_name),
            ("backend", &r.backend),
            ("dtype", &r.dtype),
            ("drafter_series", &r.drafter_series),
        ] {
            check_len(s, 4096, &format!("{w}: {f}"))?;
        }
        if !(2..=1024).contains(&r.block_size) {
            bail!("{w}: block_size {} is outside 2..=1024", r.block_size);
        }
        if !(1..=1024).contains(&r.top_k) {
            bail!("{w}: top_k {} is outside 1..=1024", r.top_k);
        }
        check_len(&r.config.to_string(), MAX_TEXT, &format!("{w}: config"))?;
        if br.prompts.len() > MAX_PROMPTS {
            bail!(
                "{w}: {} prompts, over the limit of {MAX_PROMPTS}",
                br.prompts.len()
            );
        }
        let mut prompts = Vec::with_capacity(br.prompts.len());
        let mut seen = std::collections::HashSet::new();
        for (j, p) in br.prompts.iter().enumerate() {
            let pw = format!("{w}: prompts[{j}]");
            if !seen.insert(p.index) {
                bail!("{pw}: prompt index {} appears twice", p.index);
            }
            if p.sha256.is_empty() || p.sha256.len() > 128 {
                bail!("{pw}: sha256 must be 1-128 characters");
            }
            check_len(&p.id, 4096, &format!("{pw}: id"))?;
            check_len(&p.text, 16 * MAX_TEXT, &format!("{pw}: text"))?;
            let ids = le_to_u32s(
                &unb64(&p.token_ids, &format!("{pw}.token_ids"))?,
                &format!("{pw}.token_ids"),
            )?;
            if p.prompt_len as usize > ids.len() {
                bail!(
                    "{pw}: prompt_len {} exceeds its {} tokens",
                    p.prompt_len,
                    ids.len()
                );
            }
            prompts.push(RunPrompt {
                index: p.index,
                id: p.id.clone(),
                sha256: p.sha256.clone(),
                category: p.category.clone(),
                prompt_len: p.prompt_len,
                token_ids: ids,
                text: p.text.clone(),
            });
        }
        for (j, m) in br.metrics.iter().enumerate() {
            if m.source.is_empty()
                || m.name.is_empty()
                || m.source.contains('/')
                || m.source.len() > 200
                || m.name.len() > 200
            {
                bail!("{w}: metrics[{j}]: source and name must be 1-200 characters (no '/' in the source)");
            }
            check_len(
                &m.description,
                4096,
                &format!("{w}: metrics[{j}].description"),
            )?;
        }
        let g = r.block_size as usize - 1;
        let mut derived = Vec::new();
        if let Some(st) = &br.stats {
            if st.positions != g || st.top_k != r.top_k {
                bail!("{w}: stats have {} positions and top-k {}, but the run has block size {} and top-k {}", st.positions, st.top_k, r.block_size, r.top_k);
            }
            for (j, p) in st.prompts.iter().enumerate() {
                let sw = format!("{w}: stats.prompts[{j}]");
                for (name, v) in [
                    ("valid", &p.valid),
                    ("correct", &p.correct),
                    ("topk_correct", &p.topk_correct),
                    ("reached", &p.reached),
                    ("accepted", &p.accepted),
                ] {
                    if v.len() != g {
                        bail!("{sw}.{name}: {} entries, expected {g}", v.len());
                    }
                }
                if p.hist.len() != g + 1 {
                    bail!("{sw}.hist: {} entries, expected {}", p.hist.len(), g + 1);
                }
                if p.rounds.iter().any(|&a| a as usize > g) {
                    bail!("{sw}.rounds: an accepted length exceeds {g}");
                }
                // Σ A+1, less at most the last round's bonus token (docs/metrics.md §2).
                let full: u64 = p.rounds.iter().map(|&a| a as u64 + 1).sum();
                if p.replay_tokens.is_some_and(|t| t > full || t + 1 < full) {
                    bail!(
                        "{sw}.replay_tokens: {} does not match its rounds (Σ A+1 = {full})",
                        p.replay_tokens.unwrap_or_default()
                    );
                }
                if p.hist.iter().map(|&x| x as u64).sum::<u64>() != p.blocks as u64 {
                    bail!("{sw}: histogram total differs from blocks");
                }
            }
            derived.push(Derived {
                kind: STATS_KIND.into(),
                // Statistics of bundles written before `replay_tokens` existed follow the old
                // end-of-sequence rule: version 1, so runs with records recompute them.
                version: if st.prompts.iter().all(|p| p.replay_tokens.is_some()) {
                    STATS_VERSION
                } else {
                    1
                },
                data: serde_json::to_vec(st)?,
            });
        }
        let records = br.records.as_ref().map(|rec| {
            let batch = rec.to_batch(&w)?;
            if (batch.block_size, batch.top_k) != (r.block_size, r.top_k) {
                bail!(
                    "{w}: records have block size {} and top-k {}, the run {} and {}",
                    batch.block_size,
                    batch.top_k,
                    r.block_size,
                    r.top_k
                );
            }
            if batch.region.iter().any(|&x| x > 1) {
                bail!("{w}: records.region values must be 0 or 1");
            }
            Ok(batch)
        });
        let records = records.transpose()?;
        if let (Some(v), None) = (&br.vocab, &r.tokenizer_sha256) {
            bail!(
                "{w}: a vocabulary ({}) without a tokenizer_sha256 on the run",
                v.name
            );
        }
        if let Some(v) = &br.vocab {
            if v.pieces.len() > 4_000_000 {
                bail!(
                    "{w}: vocabulary of {} pieces is over the limit",
                    v.pieces.len()
                );
            }
        }
        if let Some(e) = &br.eval {
            check_eval(e, br.prompts.len(), &w)?;
        }
        for (j, p) in br.plugins.iter().enumerate() {
            let pw = format!("{w}: plugins[{j}]");
            if p.source.is_empty() || p.source.contains('/') || p.source.len() > 200 {
                bail!("{pw}: source must be 1-200 characters without '/'");
            }
            check_len(&p.sha256, 128, &format!("{pw}.sha256"))?;
            check_len(&p.version, 200, &format!("{pw}.version"))?;
            check_len(&p.file, 4096, &format!("{pw}.file"))?;
            check_len(&p.scored_at, 64, &format!("{pw}.scored_at"))?;
            check_len(&p.params_json, MAX_TEXT, &format!("{pw}.params_json"))?;
            if serde_json::from_str::<serde_json::Value>(&p.params_json).is_err() {
                bail!("{pw}.params_json: not JSON");
            }
        }
        out.push(RunExport {
            eval: br.eval.clone(),
            plugins: br.plugins.clone(),
            run: r.clone(),
            prompts,
            metrics: br.metrics.clone(),
            failures: br.failures.clone(),
            records,
            derived,
            vocab: br
                .vocab
                .as_ref()
                .map(|v| (v.name.clone(), v.pieces.clone())),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two blocks (B = 3, K = 2), every value distinct; the target's top-K when `target_topk`.
    fn fixed_batch(target_topk: bool) -> RecordBatch {
        RecordBatch {
            block_size: 3,
            top_k: 2,
            prompt_index: vec![7, 8],
            anchor: vec![4, 0x0102_0304],
            region: vec![0, 1],
            target: vec![10, 11, 12, 0],
            valid: vec![1, 1, 1, 0],
            loss_mask: vec![1, 0, 1, 0],
            draft_ids: (20..28).collect(),
            draft_logprobs: (0..8).map(|x| -(x as f32) / 3.0).collect(),
            target_ids: target_topk.then(|| (40..48).collect()),
            target_logprobs: target_topk.then(|| (0..8).map(|x| -0.5 - x as f32).collect()),
        }
    }

    /// The records of a bundle are pinned (keys, their order, base64 of little-endian bytes,
    /// null for an absent target top-K): bundles written by any version import the same.
    #[test]
    fn records_json_is_pinned() {
        let json = |b: &RecordBatch| serde_json::to_string(&BundleRecords::from_batch(b)).unwrap();
        let with = json(&fixed_batch(true));
        assert_eq!(
            with,
            r#"{"block_size":3,"top_k":2,"prompt_index":"BwAAAAgAAAA=","anchor":"BAAAAAQDAgE=","region":"AAE=","target":"CgAAAAsAAAAMAAAAAAAAAA==","valid":"AQEBAA==","loss_mask":"AQABAA==","draft_ids":"FAAAABUAAAAWAAAAFwAAABgAAAAZAAAAGgAAABsAAAA=","draft_logprobs":"AAAAgKuqqr6rqiq/AACAv6uqqr9VVdW/AAAAwFVVFcA=","target_ids":"KAAAACkAAAAqAAAAKwAAACwAAAAtAAAALgAAAC8AAAA=","target_logprobs":"AAAAvwAAwL8AACDAAABgwAAAkMAAALDAAADQwAAA8MA="}"#
        );
        assert_eq!(
            json(&fixed_batch(false)),
            r#"{"block_size":3,"top_k":2,"prompt_index":"BwAAAAgAAAA=","anchor":"BAAAAAQDAgE=","region":"AAE=","target":"CgAAAAsAAAAMAAAAAAAAAA==","valid":"AQEBAA==","loss_mask":"AQABAA==","draft_ids":"FAAAABUAAAAWAAAAFwAAABgAAAAZAAAAGgAAABsAAAA=","draft_logprobs":"AAAAgKuqqr6rqiq/AACAv6uqqr9VVdW/AAAAwFVVFcA=","target_ids":null,"target_logprobs":null}"#
        );
        for target_topk in [true, false] {
            let b = fixed_batch(target_topk);
            let back: BundleRecords = serde_json::from_str(&json(&b)).unwrap();
            assert_eq!(back.to_batch("b.json").unwrap(), b);
        }
        // Optional columns may be left out; anything else is an error naming the key.
        let cut = with.replace(r#","target_ids":"#, r#","x":"#);
        let err = serde_json::from_str::<BundleRecords>(&cut).unwrap_err();
        assert_eq!(err.to_string(), "unknown field `x`, expected one of `block_size`, `top_k`, `prompt_index`, `anchor`, `region`, `target`, `valid`, `loss_mask`, `draft_ids`, `draft_logprobs`, `target_ids`, `target_logprobs` at line 1 column 300");
        let v: serde_json::Value = serde_json::from_str(&with).unwrap();
        let mut m = v.as_object().unwrap().clone();
        m.remove("target_ids");
        m.remove("target_logprobs");
        let back: BundleRecords = serde_json::from_value(m.clone().into()).unwrap();
        assert_eq!(back.to_batch("b.json").unwrap(), fixed_batch(false));
        m.remove("valid");
        let err = serde_json::from_value::<BundleRecords>(m.into()).unwrap_err();
        assert_eq!(err.to_string(), "missing field `valid`");
        let dup = with.replace(r#","valid":"#, r#","valid":"AQEBAA==","valid":"#);
        let err = serde_json::from_str::<BundleRecords>(&dup).unwrap_err();
        assert_eq!(
            err.to_string(),
            "duplicate field `valid` at line 1 column 158"
        );
        let err =
            serde_json::from_str::<BundleRecords>(&with.replace(r#""top_k":2"#, r#""top_k":"2""#))
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid type: string "2", expected u32 at line 1 column 27"#
        );
        // A column of the wrong length or bad base64: the error names the column.
        let short = with.replace(r#""region":"AAE=""#, r#""region":"AA==""#);
        let err = serde_json::from_str::<BundleRecords>(&short)
            .unwrap()
            .to_batch("b.json");
        assert_eq!(
            err.unwrap_err().to_string(),
            "b.json.records: record column region has 1 entries, expected 2"
        );
        let bad = with.replace(r#""anchor":""#, r#""anchor":"!"#);
        let err = serde_json::from_str::<BundleRecords>(&bad)
            .unwrap()
            .to_batch("b.json");
        assert_eq!(
            err.unwrap_err().to_string(),
            "b.json.records.anchor: not valid base64 (Invalid symbol 33, offset 0.)"
        );
    }
}
