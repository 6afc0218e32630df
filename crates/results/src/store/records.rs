//! What a run evaluated: its prompts (`run_prompt`) and their records (`record_chunk`, the
//! columnar `RecordBatch` as little-endian BLOBs, at most `CHUNK_BLOCKS` blocks per row).

use super::*;
use draftlens_records::columns_per_prompt;

/// The key of a `record_chunk` row: the run, the row's sequence number, the prompt all its
/// blocks belong to and how many blocks it holds. One BLOB per record column follows (every
/// column of `draftlens_records::COLUMNS` but the prompt index, under the same name; NULL for an
/// optional column the run did not keep).
const CHUNK_KEY: [&str; 4] = ["run_id", "seq", "prompt_index", "n_blocks"];

/// Most blocks stored in one `record_chunk` row (bounds BLOB sizes to a few MB).
pub const CHUNK_BLOCKS: usize = 4096;

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

/// A [`RunPrompt`] from a row of `run_prompt` with every column but `run_id`.
pub(super) fn prompt_from_row(r: &Row, what: &str) -> Result<RunPrompt> {
    let index: u32 = r.get("idx")?;
    Ok(RunPrompt {
        index,
        id: r.get("prompt_id")?,
        sha256: r.get("sha256")?,
        category: r.get("category")?,
        prompt_len: r.get("prompt_len")?,
        token_ids: le_to_u32s(
            r.get_ref("token_ids")?.as_blob()?,
            &format!("{what}: prompt {index} token_ids"),
        )?,
        text: r.get("text")?,
    })
}

pub(super) fn insert_prompt(tx: &Transaction, run: i64, p: &RunPrompt, what: &str) -> Result<()> {
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

pub(super) fn insert_records(
    tx: &Transaction,
    run: i64,
    batch: &RecordBatch,
    what: &str,
) -> Result<()> {
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
    let mut seq: i64 = tx.query_row(
        "SELECT coalesce(max(seq), -1) + 1 FROM record_chunk WHERE run_id = ?1",
        [run],
        |r| r.get(0),
    )?;
    let names: Vec<&str> = CHUNK_KEY
        .into_iter()
        .chain(columns_per_prompt().iter().map(|c| c.name))
        .collect();
    let slots: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    let mut stmt = tx.prepare_cached(&format!(
        "INSERT INTO record_chunk ({}) VALUES ({})",
        names.join(", "),
        slots.join(", ")
    ))?;
    let view = batch.view();
    // Split into runs of blocks of one prompt, at most CHUNK_BLOCKS each.
    let mut start = 0;
    while start < nb {
        let pi = batch.prompt_index[start];
        let mut end = start + 1;
        while end < nb && batch.prompt_index[end] == pi && end - start < CHUNK_BLOCKS {
            end += 1;
        }
        let chunk = view.slice(start..end);
        let mut values = vec![
            Value::Integer(run),
            Value::Integer(seq),
            Value::Integer(pi.into()),
            Value::Integer((end - start) as i64),
        ];
        values.extend(columns_per_prompt().iter().map(|c| {
            chunk
                .column(c)
                .map_or(Value::Null, |col| Value::Blob(column_to_le(col)))
        }));
        stmt.execute(rusqlite::params_from_iter(values))?;
        seq += 1;
        start = end;
    }
    tx.execute(
        "UPDATE run SET num_blocks = num_blocks + ?2 WHERE id = ?1",
        params![run, nb as i64],
    )?;
    Ok(())
}

impl Store {
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
                .query_row(
                    "SELECT block_size, top_k FROM run WHERE id = ?1",
                    [run],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?
                .ok_or_else(|| anyhow!("{what}: run {run} does not exist"))?;
            let columns: Vec<&str> = columns_per_prompt().iter().map(|c| c.name).collect();
            let sql = format!(
                "SELECT seq, prompt_index, n_blocks, {} FROM record_chunk \
                 WHERE run_id = ?1 AND (?2 IS NULL OR prompt_index = ?2) ORDER BY seq",
                columns.join(", ")
            );
            let mut stmt = c.prepare_cached(&sql)?;
            let mut rows = stmt.query(params![run, prompt])?;
            let mut out: Option<RecordBatch> = None;
            while let Some(r) = rows.next()? {
                let seq: i64 = r.get("seq")?;
                let ctx = |col: &str| format!("{what}: run {run} record chunk {seq} column {col}");
                let mut chunk = RecordBatch::new(b, k);
                let pi: u32 = r.get("prompt_index")?;
                let n: usize = r.get::<_, i64>("n_blocks")? as usize;
                chunk.prompt_index = vec![pi; n];
                for col in columns_per_prompt() {
                    let data = match r.get_ref(col.name)?.as_blob_or_null()? {
                        Some(blob) => Some(le_to_column(col.element, blob, &ctx(col.name))?),
                        None => None,
                    };
                    chunk
                        .set_column(col, data)
                        .map_err(|e| anyhow!("{what}: run {run} record chunk {seq}: {e}"))?;
                }
                // An optional column (NULL in some chunk) stays only when every chunk has it.
                match out.as_mut() {
                    Some(o) => o.extend(&chunk),
                    None => out = Some(chunk),
                }
            }
            let out = out.unwrap_or_else(|| RecordBatch::new(b, k));
            out.check()
                .map_err(|e| anyhow!("{what}: run {run}: stored records are inconsistent: {e}"))?;
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
                "SELECT idx, prompt_id, sha256, category, prompt_len, length(token_ids) / 4 AS num_tokens \
                 FROM run_prompt WHERE run_id = ?1 ORDER BY idx",
            )?;
            let v = stmt
                .query_map([run], |r| {
                    Ok(PromptMeta {
                        index: r.get("idx")?,
                        id: r.get("prompt_id")?,
                        sha256: r.get("sha256")?,
                        category: r.get("category")?,
                        prompt_len: r.get("prompt_len")?,
                        num_tokens: r.get("num_tokens")?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three blocks (B = 3, K = 2) of prompts 7, 7 and 8 (two `record_chunk` rows), every value
    /// distinct; the target's top-K when `target_topk`.
    fn fixed_batch(target_topk: bool) -> RecordBatch {
        RecordBatch {
            block_size: 3,
            top_k: 2,
            prompt_index: vec![7, 7, 8],
            anchor: vec![4, 5, 0x0102_0304],
            region: vec![0, 1, 0],
            target: vec![10, 11, 12, 0, 13, 14],
            valid: vec![1, 1, 1, 0, 1, 1],
            loss_mask: vec![1, 0, 1, 0, 0, 1],
            draft_ids: (20..32).collect(),
            draft_logprobs: (0..12).map(|x| -(x as f32) / 3.0).collect(),
            target_ids: target_topk.then(|| (40..52).collect()),
            target_logprobs: target_topk.then(|| (0..12).map(|x| -0.5 - x as f32).collect()),
        }
    }

    /// sha256 over every `record_chunk` row of `run` in `seq` order: each column's name, SQLite
    /// type and value bytes.
    fn chunk_rows_digest(s: &Store, run: i64) -> String {
        s.read(|c| {
            let mut stmt =
                c.prepare("SELECT * FROM record_chunk WHERE run_id = ?1 ORDER BY seq")?;
            let names: Vec<String> = stmt.column_names().map(|n| n.to_string()).collect();
            let mut rows = stmt.query([run])?;
            let mut h = Sha256::new();
            while let Some(r) = rows.next()? {
                for (i, name) in names.iter().enumerate() {
                    use rusqlite::types::ValueRef;
                    let (kind, bytes): (&str, Vec<u8>) = match r.get_ref(i)? {
                        ValueRef::Null => ("null", vec![]),
                        ValueRef::Integer(x) => ("int", x.to_le_bytes().to_vec()),
                        ValueRef::Real(x) => ("real", x.to_le_bytes().to_vec()),
                        ValueRef::Text(t) => ("text", t.to_vec()),
                        ValueRef::Blob(b) => ("blob", b.to_vec()),
                    };
                    h.update(format!("{name}={kind}:{}:", bytes.len()));
                    h.update(&bytes);
                }
            }
            Ok(hex::encode(h.finalize()))
        })
        .unwrap()
    }

    /// The stored form of records (column names, BLOB bytes, NULLs, chunking by prompt) is
    /// pinned: a database written by any version reads the same.
    #[test]
    fn record_chunk_rows_are_pinned() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("runs.sqlite")).unwrap();
        let mut digests = Vec::new();
        for target_topk in [true, false] {
            let run = s
                .create_run(&NewRun {
                    name: "pin".into(),
                    block_size: 3,
                    top_k: 2,
                    ..Default::default()
                })
                .unwrap();
            let batch = fixed_batch(target_topk);
            s.add_records(run, &batch).unwrap();
            assert_eq!(s.records(run).unwrap(), batch);
            assert_eq!(s.prompt_records(run, 8).unwrap().anchor, vec![0x0102_0304]);
            digests.push(chunk_rows_digest(&s, run));
        }
        // run_id differs (1, 2) and is part of the digest.
        assert_eq!(
            digests,
            [
                "b348708c66b3355af7e9cb1712ca43c2478abed5892361ed83f99edbaec881d2".to_string(),
                "c68861ad61498c1480b6b5d99087ffcd03dbb5faa0393554e1f1061d40faff8a".to_string()
            ]
        );
    }
}
