//! Token vocabularies (token id → display text, shared by the runs of one tokenizer) and the
//! derived caches of a run (values recomputable from its records, keyed by kind and version).

use super::*;

/// A cached value derived from a run (see the `derived` table).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Derived {
    pub kind: String,
    pub version: i64,
    pub data: Vec<u8>,
}

impl Store {
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

    /// Whether the vocabulary of this tokenizer is stored.
    pub fn has_vocab(&self, tokenizer_sha256: &str) -> Result<bool> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT 1 FROM vocab WHERE tokenizer_sha256 = ?1",
                [tokenizer_sha256],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
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

    pub fn derived(&self, run: i64, kind: &str) -> Result<Option<Derived>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT kind, version, data FROM derived WHERE run_id = ?1 AND kind = ?2",
                params![run, kind],
                |r| {
                    Ok(Derived {
                        kind: r.get("kind")?,
                        version: r.get("version")?,
                        data: r.get("data")?,
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
}
