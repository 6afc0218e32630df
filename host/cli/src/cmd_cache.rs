//! `cache ls | verify | rm`: the content-addressed hidden-state cache.

use crate::common::Global;
use anyhow::{bail, Result};
use clap::Subcommand;
use draftlens::cache::RemoveFilter;
use serde::Serialize;

#[derive(Subcommand)]
pub enum CacheCmd {
    /// List cache entries (kind, backend, layers, tokens, size).
    Ls,
    /// Re-read every entry and check its checksum; exit code 1 if any is corrupt.
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
}

#[derive(Serialize)]
struct VerifyRow {
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
            let rows: Vec<VerifyRow> = cache
                .verify()?
                .into_iter()
                .map(|(path, r)| VerifyRow {
                    path,
                    ok: r.is_ok(),
                    problem: r.err(),
                })
                .collect();
            let bad = rows.iter().filter(|r| !r.ok).count();
            g.emit(&rows, || {
                let mut o: String = rows
                    .iter()
                    .filter(|r| !r.ok)
                    .map(|r| {
                        format!(
                            "CORRUPT {}: {}\n",
                            r.path.display(),
                            r.problem.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                o += &format!("{} entries checked, {} corrupt\n", rows.len(), bad);
                o
            })?;
            if bad > 0 {
                bail!(
                    "{bad} corrupt cache entries (remove them with `draftlens cache rm --corrupt`)"
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
    }
}
