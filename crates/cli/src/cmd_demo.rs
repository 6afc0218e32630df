//! `draftlens demo`: the main job on the default model, from any folder, after `draftlens setup`.
//!
//! It is exactly three `draftlens run`s on the installed default model, all 164 HumanEval prompts,
//! 128 tokens, one database (docs/reference-drafters.md):
//!
//! 1. `--drafter <data>/drafters/smollm2-v4-reference/step-962`: what deployment sees;
//! 2. `--drafter <data>/drafters/smollm2-v4-leaky/step-962`: the drafter trained with the leaky
//!    mask, evaluated as deployment runs it;
//! 3. the same leaky drafter `--mode train-style --mask inclusive`: the number its training
//!    reports, inflated by the leak.
//!
//! Each is parsed by the same clap definitions as `run`, so every default is the `run` command's
//! own; the target's continuations and hidden states are computed once and reused from the cache.

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
    if assets::SHIPPED_DRAFTER_FILES.is_empty() {
        bail!("this draftlens was built without its drafters (cargo feature `embedded-drafters`, on by default): build it with the default features to run the demo");
    }
    if !crate::setup::model_installed(&data)? || !crate::setup::drafters_missing(&data).is_empty() {
        bail!(
            "{}: the default model or the demo's drafters are not installed; run `draftlens setup` first",
            data.display()
        );
    }
    let reference = data.join(assets::REFERENCE_DRAFTER).display().to_string();
    let leaky = data.join(assets::LEAKY_DRAFTER).display().to_string();
    let train_style = ["--mode", "train-style", "--mask", "inclusive"];
    for (drafter, extra) in [
        (&reference, &[][..]),
        (&leaky, &[][..]),
        (&leaky, &train_style[..]),
    ] {
        let mut argv: Vec<String> = vec![
            "--target".into(),
            target.display().to_string(),
            "--drafter".into(),
            drafter.clone(),
            "--prompts".into(),
            "builtin:humaneval".into(),
            "--max-new-tokens".into(),
            "128".into(),
            "--backend".into(),
            a.backend.name(),
            "--db".into(),
            a.db.display().to_string(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        if let Some(n) = a.limit {
            argv.extend(["--limit".into(), n.to_string()]);
        }
        let parsed = RunOnly::try_parse_from(&argv)?;
        crate::cmd_eval::run(g, parsed.run)?;
    }
    if !g.json {
        let db = a.db.display();
        println!("\nRuns are stored in {db}. Look at them with:\n  draftlens runs ls --db {db}\n  draftlens serve --db {db}     # then open http://127.0.0.1:8080");
    }
    Ok(())
}
