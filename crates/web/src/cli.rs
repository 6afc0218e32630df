//! Command-line options of the web-facing commands (`serve`, `compare`, `report`, `import`,
//! `push`, `tokens`, `demo`) as clap derive structs, plus one `run_*` function per command, so the
//! `draftlens` binary only wires them into its subcommand enum.

use crate::bundle::{import_file, DEFAULT_MAX_IMPORT_BYTES};
use crate::server::{serve_with, ServeOptions};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use draftlens_results::store::{Store, TokenScope};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `draftlens serve`: browse and compare runs in the browser.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Run database.
    #[arg(long, env = "DRAFTLENS_DB", default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Address to listen on. Non-loopback addresses need --team.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Team server: every request needs a read or write token (see `draftlens tokens`).
    #[arg(long)]
    pub team: bool,
    /// Largest accepted upload, in MiB.
    #[arg(long, default_value_t = 256)]
    pub max_upload_mb: usize,
}

/// `draftlens compare RUN_A RUN_B ...`: the comparison in the terminal.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Runs: ids, uids or uid prefixes. The first is the baseline unless --baseline says otherwise.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<String>,
    #[arg(long, env = "DRAFTLENS_DB", default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Baseline run (one of RUNS).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Keep only the runs whose workload slice shows FACET=VALUE (facets: format, thinking,
    /// category, language; docs/slices.md). Repeatable: every filter must match.
    #[arg(long = "where", value_name = "FACET=VALUE", value_parser = draftlens_results::slice::FacetFilter::parse)]
    pub filters: Vec<draftlens_results::slice::FacetFilter>,
    /// List the runs under each value of a workload-slice facet, with each group's mean τ.
    #[arg(long, value_name = "FACET", value_parser = crate::compare::slices::parse_facet)]
    pub group_by: Option<&'static str>,
    /// Print JSON instead of a table (set from the global `--json`).
    #[arg(skip)]
    pub json: bool,
}

/// `draftlens report RUN [RUN...] -o report.html`: one self-contained HTML file.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<String>,
    #[arg(short, long)]
    pub output: PathBuf,
    #[arg(long, env = "DRAFTLENS_DB", default_value = "runs.sqlite")]
    pub db: PathBuf,
    #[arg(long)]
    pub baseline: Option<String>,
    /// Embed the records (lets an importer open the token drill-down; much bigger file).
    #[arg(long)]
    pub records: bool,
    /// Page title.
    #[arg(long)]
    pub title: Option<String>,
    /// Write the JSON bundle instead of HTML.
    #[arg(long = "bundle")]
    pub json: bool,
}

/// `draftlens import FILE`: import a report (.html) or bundle (.json); idempotent.
#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    pub file: PathBuf,
    #[arg(long, env = "DRAFTLENS_DB", default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Largest accepted file, in MiB.
    #[arg(long, default_value_t = DEFAULT_MAX_IMPORT_BYTES >> 20)]
    pub max_mb: usize,
}

/// `draftlens push RUN... --server URL`: upload runs with their records to a team server.
#[derive(Args, Debug, Clone)]
pub struct PushArgs {
    /// Runs: ids, uids or uid prefixes.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<String>,
    /// The team server's base URL, e.g. http://evalbox:8080.
    #[arg(long, env = "DRAFTLENS_SERVER")]
    pub server: String,
    /// File holding the token (first line). Default: the DRAFTLENS_TOKEN environment variable.
    /// Tokens are never taken on the command line, where other users can read them.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    #[arg(long, env = "DRAFTLENS_DB", default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Bytes per upload request, in KiB.
    #[arg(long, default_value_t = crate::push::PushOptions::DEFAULT_CHUNK >> 10, hide = true)]
    pub chunk_kib: usize,
    /// Print JSON (set from the global `--json`).
    #[arg(skip)]
    pub json: bool,
}

/// The push token: `--token-file` (its first line), else `$DRAFTLENS_TOKEN`, else none (a
/// server without `--team` needs none).
pub fn push_token(token_file: Option<&std::path::Path>) -> Result<Option<String>> {
    if let Some(f) = token_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("{}: cannot read the token file", f.display()))?;
        let t = text.lines().next().unwrap_or("").trim().to_string();
        if t.is_empty() {
            anyhow::bail!("{}: the token file is empty", f.display());
        }
        return Ok(Some(t));
    }
    Ok(std::env::var("DRAFTLENS_TOKEN")
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty()))
}

/// `draftlens tokens ...`: API tokens of a team server.
#[derive(Args, Debug, Clone)]
pub struct TokensArgs {
    /// Run database (before or after the subcommand: `tokens create NAME --db X` works too).
    #[arg(
        long,
        env = "DRAFTLENS_DB",
        default_value = "runs.sqlite",
        global = true
    )]
    pub db: PathBuf,
    #[command(subcommand)]
    pub command: TokensCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum TokensCommand {
    /// Create a token; its secret is printed once.
    Create {
        name: String,
        /// read: view pages; write: also import, delete, pin baselines, share.
        #[arg(long, default_value = "read")]
        scope: String,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke tokens by name or id.
    Revoke { name_or_id: String },
}

/// `draftlens demo --db demo.sqlite`: fill a database with synthetic runs (for trying the UI;
/// only in builds with the `demo` feature).
#[cfg(feature = "demo")]
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    #[arg(long, env = "DRAFTLENS_DB", default_value = "demo.sqlite")]
    pub db: PathBuf,
    /// small | showcase | bench
    #[arg(long, default_value = "showcase")]
    pub size: String,
}

pub fn run_serve(a: &ServeArgs) -> Result<()> {
    run_serve_with(a, None)
}

/// [`run_serve`] with the plugin host that re-scores runs merged from pushed shards.
pub fn run_serve_with(
    a: &ServeArgs,
    scorer: Option<std::sync::Arc<dyn draftlens_results::merge::PluginScorer>>,
) -> Result<()> {
    let opts = ServeOptions {
        db: a.db.clone(),
        addr: a.addr,
        team: a.team,
        max_upload_bytes: a.max_upload_mb << 20,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve_with(opts, scorer))
}

pub fn run_compare(a: &CompareArgs) -> Result<()> {
    let store = Store::open_existing(&a.db)?;
    if !a.filters.is_empty() || a.group_by.is_some() {
        return crate::compare_sliced(&store, a);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&crate::compare_json(
                &store,
                &a.runs,
                a.baseline.as_deref()
            )?)?
        );
    } else {
        print!(
            "{}",
            crate::compare_text(&store, &a.runs, a.baseline.as_deref())?
        );
    }
    Ok(())
}

pub fn run_report(a: &ReportArgs) -> Result<()> {
    let store = Store::open_existing(&a.db)?;
    let ids = a
        .runs
        .iter()
        .map(|r| crate::compare::resolve_run(&store, r))
        .collect::<Result<Vec<_>>>()?;
    let doc = if a.json {
        serde_json::to_string(&crate::bundle::export_bundle(&store, &ids, a.records)?)?
    } else {
        let baseline = a
            .baseline
            .as_deref()
            .map(|b| crate::compare::resolve_run(&store, b))
            .transpose()?;
        crate::report::render_report(
            &store,
            &ids,
            &crate::report::ReportOptions {
                baseline,
                with_records: a.records,
                title: a.title.clone(),
            },
        )?
    };
    std::fs::write(&a.output, doc.as_bytes())
        .with_context(|| format!("{}: cannot write", a.output.display()))?;
    eprintln!(
        "wrote {} ({} KiB, {} runs)",
        a.output.display(),
        doc.len() >> 10,
        ids.len()
    );
    Ok(())
}

pub fn run_import(a: &ImportArgs) -> Result<()> {
    let store = Store::open(&a.db)?;
    let s = import_file(&store, &a.file, a.max_mb << 20)?;
    println!("{s}");
    Ok(())
}

pub fn run_push(a: &PushArgs) -> Result<()> {
    let store = Store::open_existing(&a.db)?;
    let ids = a
        .runs
        .iter()
        .map(|r| crate::compare::resolve_run(&store, r))
        .collect::<Result<Vec<_>>>()?;
    let mut opts = crate::push::PushOptions::new(&a.server, push_token(a.token_file.as_deref())?);
    opts.chunk_bytes = a.chunk_kib.max(1) << 10;
    let pushed = crate::push::push_runs(&store, &ids, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&pushed)?);
    } else {
        for p in &pushed {
            println!(
                "{} {} · {}{}",
                p.outcome,
                p.uid,
                p.name,
                if p.retries > 0 {
                    format!(
                        " ({} retries, resumed at byte {:?} of {})",
                        p.retries, p.resumed_at, p.bundle_bytes
                    )
                } else {
                    String::new()
                }
            );
            for m in &p.server {
                println!("  server: {m}");
            }
        }
    }
    Ok(())
}

pub fn run_tokens(a: &TokensArgs) -> Result<()> {
    let store = Store::open(&a.db)?;
    print!("{}", crate::tokens_cmd(&store, &a.command)?);
    Ok(())
}

#[cfg(feature = "demo")]
pub fn run_demo(a: &DemoArgs) -> Result<()> {
    let spec = match a.size.as_str() {
        "small" => crate::demo::DemoSpec::small(),
        "showcase" => crate::demo::DemoSpec::showcase(),
        "bench" => crate::demo::DemoSpec::bench(),
        other => anyhow::bail!("unknown demo size {other:?} (small, showcase or bench)"),
    };
    let store = Store::open(&a.db)?;
    let r = crate::demo::fill_demo_db(&store, &spec)?;
    eprintln!(
        "{}: {} checkpoint runs, {} train-style runs, {} list runs",
        a.db.display(),
        r.checkpoints.len(),
        r.train_style.len(),
        r.extra.len()
    );
    Ok(())
}

/// Token subcommands; returns what to print.
pub fn tokens(store: &Store, cmd: &TokensCommand) -> Result<String> {
    match cmd {
        TokensCommand::Create { name, scope } => {
            let scope: TokenScope = scope.parse()?;
            let secret = store.create_token(name, scope)?;
            Ok(format!(
                "{secret}\n(token {name:?}, scope {}; shown once, only its hash is stored)\n",
                scope.as_str()
            ))
        }
        TokensCommand::List => {
            let mut s = String::new();
            for t in store.tokens()? {
                s.push_str(&format!(
                    "{:>4}  {:<20} {:<5} created {}{}\n",
                    t.id,
                    t.name,
                    t.scope.as_str(),
                    t.created_at,
                    t.revoked_at
                        .map(|r| format!(", revoked {r}"))
                        .unwrap_or_default()
                ));
            }
            if s.is_empty() {
                s.push_str("no tokens\n");
            }
            Ok(s)
        }
        TokensCommand::Revoke { name_or_id } => {
            let n = store.revoke_token(name_or_id)?;
            if n == 0 {
                anyhow::bail!(
                    "{}: no active token named {name_or_id:?}",
                    store.path().display()
                );
            }
            Ok(format!(
                "revoked {n} token{}\n",
                if n == 1 { "" } else { "s" }
            ))
        }
    }
}
