//! `draftlens`: evaluate speculative-decoding drafters the way deployment sees them.

mod cmd_bench;
mod cmd_cache;
mod cmd_model;
mod common;

use clap::{Parser, Subcommand};
use common::Global;

#[derive(Parser)]
#[command(name = "draftlens", version, about = "Honest evaluation of speculative-decoding drafters (DFlash)", propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show what a model file holds: architecture, shapes, tensor dtypes, tokenizer, chat template.
    Inspect(cmd_model::InspectArgs),
    /// Greedy-generate the target's continuation for every prompt of a set.
    Generate(cmd_model::GenerateArgs),
    /// Capture the target's hidden states over prompt + greedy continuation (cached).
    Extract(cmd_model::ExtractArgs),
    /// List, verify or remove hidden-state cache entries.
    #[command(subcommand)]
    Cache(cmd_cache::CacheCmd),
    /// Measure CPU prefill throughput against this machine's own f32 GEMM rate.
    Bench(cmd_bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    cli.global.init_logging();
    // A panic is a bug, but it must still end with one clear line and a non-zero exit code.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error (a bug in draftlens, please report it): {info}");
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match cli.cmd {
        Cmd::Inspect(a) => cmd_model::inspect(&cli.global, a),
        Cmd::Generate(a) => cmd_model::generate(&cli.global, a),
        Cmd::Extract(a) => cmd_model::extract(&cli.global, a),
        Cmd::Cache(c) => cmd_cache::run(&cli.global, c),
        Cmd::Bench(a) => cmd_bench::run(&cli.global, a),
    }));
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        Err(_) => std::process::exit(101),
    }
}
