//! `draftlens demo`: the main job on the default model, from any folder, after `draftlens setup`.
//!
//! It is exactly `draftlens run --drafter <data>/drafters/smollm2-reference --prompts
//! builtin:humaneval --max-new-tokens 128 --db runs.sqlite` (the three reference checkpoints on
//! the installed default model), parsed by the same clap definitions so that every default is the
//! `run` command's own.

use crate::cmd_eval::RunArgs;
use crate::common::Global;
use crate::setup::assets;
use anyhow::{bail, Result};
use clap::{Args, Parser};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Evaluate only the first N HumanEval prompts (default: all 164).
    #[arg(long)]
    pub limit: Option<usize>,
    /// SQLite database the runs are stored in.
    #[arg(long, default_value = "runs.sqlite")]
    pub db: PathBuf,
    /// Numeric backend (auto: CUDA when a usable GPU is present, else the CPU).
    #[arg(long, value_enum, default_value_t = crate::args::BackendArg::Auto)]
    pub backend: crate::args::BackendArg,
}

/// `run`'s arguments parsed from an argument list.
#[derive(Parser)]
#[command(no_binary_name = true)]
struct RunOnly {
    #[command(flatten)]
    run: RunArgs,
}

pub fn run(g: &Global, a: DemoArgs) -> Result<()> {
    let data = g.data_dir()?;
    let target = assets::default_model_path(&data);
    let drafters = data.join(assets::REFERENCE_DRAFTERS);
    if !crate::setup::model_installed(&data)? || !crate::setup::drafters_missing(&data).is_empty() {
        bail!(
            "{}: the default model or the reference drafters are not installed; run `draftlens setup` first",
            data.display()
        );
    }
    let mut argv: Vec<String> = vec![
        "--target".into(),
        target.display().to_string(),
        "--drafter".into(),
        drafters.display().to_string(),
        "--prompts".into(),
        "builtin:humaneval".into(),
        "--max-new-tokens".into(),
        "128".into(),
        "--backend".into(),
        a.backend.name(),
        "--db".into(),
        a.db.display().to_string(),
    ];
    if let Some(n) = a.limit {
        argv.extend(["--limit".into(), n.to_string()]);
    }
    let parsed = RunOnly::try_parse_from(&argv)?;
    crate::cmd_eval::run(g, parsed.run)?;
    if !g.json {
        let db = a.db.display();
        println!("\nRuns are stored in {db}. Look at them with:\n  draftlens runs ls --db {db}\n  draftlens serve --db {db}     # then open http://127.0.0.1:8080");
    }
    Ok(())
}
