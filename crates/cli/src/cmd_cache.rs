//! `cache ls | verify | rm | gc`: the content-addressed hidden-state cache.

use crate::common::Global;
use anyhow::{bail, Result};
use clap::Subcommand;
use draftlens_engine::hidden_cache::RemoveFilter;
use draftlens_engine::identity::{IdentityStatus, IdentityStore};
use serde::Serialize;

#[derive(Subcommand)]
pub enum CacheCmd {
    /// List cache entries (kind, backend, layers, tokens, size).
    Ls,
    /// Re-read every entry and check its checksum, and re-hash every weight file whose hash the
    /// identity store remembers (a stale hash is repaired); exit code 1 if any is corrupt or
    /// stale.
    Verify,
    /// Remove entries: all, by kind, by key prefix, or only corrupt ones. Stale temp files of
    /// killed writers are always removed.
    Rm {
        /// Remove every entry.
        #[arg(long, conflicts_with_all = ["kind", "key", "corrupt"])]
        all: bool,
        /// Remove entries of this kind (taps, greedy).
        #[arg(long)]
        kind: Option<String>,
        /// Remove entries whose key digest starts with this hex prefix.
        #[arg(long)]
        key: Option<String>,
        /// Remove entries that fail verification.
        #[arg(long)]
        corrupt: bool,
    },
    /// Keep the cache within a size budget: evict least-recently-used entries (a hit refreshes
    /// an entry at most once an hour) until the entries take at most SIZE, and remove stale
    /// temp files of killed writers. Safe while other jobs use the cache.
    Gc {
        /// The budget: bytes, or with a unit (500M, 20G, 1.5TiB: powers of 1024; 200GB: 1000).
        #[arg(long, value_parser = parse_size_arg)]
        max_size: u64,
    },
}

fn parse_size_arg(s: &str) -> std::result::Result<u64, String> {
    draftlens_engine::hidden_cache::parse_size(s).map_err(|e| e.to_string())
}

#[derive(Serialize)]
struct VerifyRow {
    /// "entry" (a cache entry) or "identity" (a remembered weight-file hash).
    kind: &'static str,
    path: std::path::PathBuf,
    ok: bool,
    problem: Option<String>,
}

pub fn run(g: &Global, c: CacheCmd) -> Result<()> {
    let cache = g.cache()?;
    match c {
        CacheCmd::Ls => {
            let rows = cache.list()?;
            g.emit(&rows, || {
                let total: u64 = rows.iter().map(|r| r.size_bytes).sum();
                let mut o: String = rows
                    .iter()
                    .map(|r| {
                        format!(
                            "{}  {:>10}  {}\n",
                            &r.digest[..16.min(r.digest.len())],
                            r.size_bytes,
                            r.summary()
                        )
                    })
                    .collect();
                o += &format!(
                    "{} entries, {:.1} MiB in {}\n",
                    rows.len(),
                    total as f64 / 1048576.0,
                    cache.root().display()
                );
                o
            })
        }
        CacheCmd::Verify => {
            let mut rows: Vec<VerifyRow> = cache
                .verify()?
                .into_iter()
                .map(|(path, r)| VerifyRow {
                    kind: "entry",
                    path,
                    ok: r.is_ok(),
                    problem: r.err(),
                })
                .collect();
            let entries = rows.len();
            for c in IdentityStore::new(cache.root()).verify()? {
                let problem = match c.status {
                    IdentityStatus::Ok => None,
                    // A vanished file's record is simply dropped: nothing is wrong.
                    IdentityStatus::Missing => continue,
                    IdentityStatus::Repaired { old, new } => Some(format!(
                        "stale identity: the file hashes to {new}, the store remembered {old} (same size, mtime and inode: changed in place); repaired. Cache entries made from it under the old hash are not found any more"
                    )),
                    IdentityStatus::Unreadable { problem } => Some(problem),
                };
                rows.push(VerifyRow {
                    kind: "identity",
                    path: c.path,
                    ok: problem.is_none(),
                    problem,
                });
            }
            let bad = rows.iter().filter(|r| !r.ok).count();
            g.emit(&rows, || {
                let mut o: String = rows
                    .iter()
                    .filter(|r| !r.ok)
                    .map(|r| {
                        format!(
                            "{} {}: {}\n",
                            if r.kind == "entry" {
                                "CORRUPT"
                            } else {
                                "STALE"
                            },
                            r.path.display(),
                            r.problem.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                o += &format!(
                    "{entries} entries and {} weight-file identities checked, {bad} corrupt\n",
                    rows.len() - entries
                );
                o
            })?;
            if bad > 0 {
                bail!(
                    "{bad} corrupt cache entries or stale identities (remove corrupt entries with `draftlens cache rm --corrupt`; stale identities are already repaired)"
                );
            }
            Ok(())
        }
        CacheCmd::Rm {
            all,
            kind,
            key,
            corrupt,
        } => {
            let filter = match (all, kind, key, corrupt) {
                (true, ..) => RemoveFilter::All,
                (_, Some(k), None, false) => RemoveFilter::Kind(k),
                (_, None, Some(k), false) => RemoveFilter::KeyPrefix(k.to_lowercase()),
                (_, None, None, true) => RemoveFilter::Corrupt,
                (_, None, None, false) => RemoveFilter::StaleTemps,
                _ => bail!("give one of --all, --kind, --key, --corrupt"),
            };
            let r = cache.remove(filter)?;
            g.emit(&r, || {
                format!(
                    "removed {} entries ({:.1} MiB) and {} stale temp files\n",
                    r.entries,
                    r.bytes as f64 / 1048576.0,
                    r.temp_files
                )
            })
        }
        CacheCmd::Gc { max_size } => {
            let r = cache.gc(max_size)?;
            let mib = |b: u64| b as f64 / 1048576.0;
            g.emit(&r, || {
                format!(
                    "evicted {} of {} entries ({:.1} MiB, least recently used first); {} entries, {:.1} MiB left (budget {:.1} MiB); removed {} stale temp files\n",
                    r.evicted,
                    r.entries_before,
                    mib(r.evicted_bytes),
                    r.entries_after,
                    mib(r.bytes_after),
                    mib(r.max_bytes),
                    r.temp_files
                )
            })
        }
    }
}
