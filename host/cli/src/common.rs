//! Options shared by every subcommand and small output helpers.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct Global {
    /// More log output (-v info, -vv debug, -vvv trace). Logs go to stderr.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Print machine-readable JSON on stdout instead of text (progress bars are hidden).
    #[arg(long, global = true)]
    pub json: bool,
    /// Folder with installed fixtures (built-in prompt sets live in <data-dir>/prompts).
    #[arg(long, global = true, env = "DRAFTLENS_DATA", default_value = "data")]
    pub data_dir: PathBuf,
    /// Hidden-state cache folder [default: $DRAFTLENS_CACHE or ~/.cache/draftlens].
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
}

impl Global {
    pub fn init_logging(&self) {
        let level = match self.verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        };
        let filter = tracing_subscriber::EnvFilter::try_from_env("DRAFTLENS_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .init();
        draftlens::progress::set_quiet(self.json);
    }

    pub fn cache(&self) -> Result<draftlens::cache::HiddenCache> {
        let root = match &self.cache_dir {
            Some(p) => p.clone(),
            None => draftlens::cache::HiddenCache::default_root()?,
        };
        draftlens::cache::HiddenCache::open(&root)
    }

    /// Print `value` as JSON when `--json`, else the text `human` renders.
    pub fn emit<T: serde::Serialize>(
        &self,
        value: &T,
        human: impl FnOnce() -> String,
    ) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            print!("{}", human());
        }
        Ok(())
    }
}
