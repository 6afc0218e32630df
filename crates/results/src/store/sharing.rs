//! What the web server shares: pinned baselines, short share links and API tokens (only their
//! sha256 is stored).

use super::*;

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

pub fn hash_token(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Short lowercase base32 id (Crockford alphabet, no ambiguous letters).
pub(super) fn short_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let bytes = hex::decode(random_hex(len)).unwrap_or_default();
    bytes
        .iter()
        .take(len)
        .map(|b| ALPHABET[(*b & 31) as usize] as char)
        .collect()
}

impl Store {
    /// Pins `run` as the baseline of `scope` (replacing any previous pin). Only a complete run
    /// can be a baseline: a running one may still fail or be a killed process's leftover, a
    /// failed one holds part of its prompts.
    pub fn pin_baseline(&self, scope: &str, run: i64) -> Result<()> {
        let what = self.what();
        self.write(|c| {
            let status: Option<String> = c
                .query_row("SELECT status FROM run WHERE id = ?1", [run], |r| r.get(0))
                .optional()?;
            match status.as_deref() {
                None => bail!("{what}: run {run} does not exist"),
                Some("complete") => {}
                Some(s) => bail!("{what}: run {run} is {s}; only a complete run can be a baseline"),
            }
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

    /// All pinned baselines: (scope, run id). A pin whose run is no longer complete (a run
    /// pinned while running, then marked interrupted) is not a baseline.
    pub fn baselines(&self) -> Result<Vec<(String, i64)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT baseline.scope, baseline.run_id FROM baseline JOIN run ON run.id = baseline.run_id \
                 WHERE run.status = 'complete' ORDER BY baseline.scope",
            )?;
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
                let scope: String = r.get("scope")?;
                out.push(TokenInfo {
                    id: r.get("id")?,
                    name: r.get("name")?,
                    scope: scope.parse()?,
                    created_at: r.get("created_at")?,
                    revoked_at: r.get("revoked_at")?,
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
}
