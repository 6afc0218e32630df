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
    /// Where the wall time went: per-phase seconds and GPU busy fraction, printed on stderr at
    /// the end (`--timeline`), or written as JSON to a file (`--timeline=FILE`).
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "-", value_name = "FILE")]
    pub timeline: Option<PathBuf>,
}

impl Global {
    /// Print or write the timeline if `--timeline` asked for it (called once the command is done,
    /// whether it succeeded or not: a failed run's timeline says where it was).
    pub fn finish_timeline(&self) {
        let Some(dest) = &self.timeline else { return };
        let report = draftlens::timeline::report();
        if dest.as_os_str() == "-" {
            eprint!("{}", report.render());
        } else {
            let written = serde_json::to_vec_pretty(&report)
                .map_err(anyhow::Error::from)
                .and_then(|b| std::fs::write(dest, b).map_err(anyhow::Error::from));
            if let Err(e) = written {
                eprintln!(
                    "warning: {}: cannot write the timeline: {e}",
                    dest.display()
                );
            }
        }
    }

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
