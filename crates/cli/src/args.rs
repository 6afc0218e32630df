//! The argument groups several commands flatten: the target and its prompts ([`TargetArgs`], with
//! the backend choice [`BackendArg`]) and which anchors are drafted ([`AnchorArgs`]). A group
//! whose rules live with one command stays there: the plugin options (`cmd_plugins::PluginArgs`)
//! and the Slurm job resources (`cmd_slurm::JobArgs`).
//!
//! Engine enums parse themselves (`clap::ValueEnum` under the engine's `cli` feature: `Labels`,
//! `GdnProfile`); the CLI keeps its own enum only where a value has no engine counterpart:
//! `--backend auto` (decided here, by probing CUDA).

use crate::common::Global;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use draftlens_engine::backend::{BackendKind, GdnProfile};
use draftlens_engine::drafter::eval::AnchorPolicy;
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::slices::{PromptFormat, Slice};
use draftlens_results::shard::Shard;
use std::path::PathBuf;

/// `--backend`: the engine's backends plus `auto`, which the CLI resolves (`BackendKind` has no
/// such value: the engine runs on a backend, it does not choose one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// CUDA when a usable GPU is present, else the CPU.
    Auto,
    /// The f32 reference.
    Cpu,
    /// bf16 with fp32 accumulation, kernels compiled at run time by NVRTC (docs/cuda.md).
    Cuda,
}

impl BackendArg {
    /// The value as the command line writes it (`auto`, `cpu`, `cuda`).
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The backend this choice runs on, and why (`auto` asks the CUDA probe).
    pub fn resolve(self) -> (BackendKind, String) {
        match self {
            BackendArg::Cpu => (BackendKind::Cpu, "--backend cpu".into()),
            BackendArg::Cuda => (BackendKind::Cuda, "--backend cuda".into()),
            BackendArg::Auto => match draftlens_engine::backend::cuda_availability(
                draftlens_engine::backend::DEFAULT_CUDA_DEVICE,
            ) {
                Ok(()) => (
                    BackendKind::Cuda,
                    "auto: a usable CUDA GPU was found".into(),
                ),
                Err(why) => (BackendKind::Cpu, format!("auto: CUDA unavailable: {why}")),
            },
        }
    }

    /// [`BackendArg::resolve`], announced: the first line of the command's output says which
    /// backend runs and why (on stderr with `--json`, so stdout stays one JSON document).
    pub fn select(self, g: &Global) -> BackendKind {
        let (kind, why) = self.resolve();
        let line = format!("backend {} ({why})", kind.as_str());
        if g.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        kind
    }
}

impl From<BackendArg> for BackendKind {
    fn from(b: BackendArg) -> Self {
        b.resolve().0
    }
}

/// Options shared by every command that runs the target over a prompt set. The session they
/// describe is built by `TargetArgs::session` (cmd_model.rs).
#[derive(Args, Clone, Debug)]
pub struct TargetArgs {
    /// Target model: a .gguf file, a Hugging Face folder (config.json + safetensors), or
    /// random:DIR (DIR's config.json and tokenizer, weights generated at load; docs/loading.md §7)
    /// [default: the model `draftlens setup` installs in the data folder].
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Prompt set: builtin:humaneval|mtbench|gsm8k|mmath or a JSONL file.
    #[arg(long, default_value = "builtin:humaneval")]
    pub prompts: String,
    /// Use only the first N prompts.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Tokens the target generates per prompt (greedy).
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Numeric backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Prompts whose greedy continuations are decoded together (one weight read per step for
    /// all of them). Continuations are bit-identical to decoding each prompt alone; a backend
    /// caps the batch at the rows it can promise that for (CUDA: 64, CPU: no cap).
    #[arg(long, default_value_t = draftlens_engine::session::DEFAULT_GEN_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub gen_batch: usize,
    /// Gated DeltaNet numeric profile of a hybrid target (Qwen3.5/3.6/Next); part of the cache
    /// key and recorded with every run. Dense targets ignore it.
    #[arg(long, value_enum, default_value_t = GdnProfile::Reference)]
    pub gdn_profile: GdnProfile,
    /// Workload slice (docs/slices.md), recorded with the run: `chat` sends every prompt through
    /// the target's chat template, `raw` sends plain text [default: each prompt as its set gives it].
    #[arg(long, value_name = "chat|raw", value_parser = parse_prompt_format)]
    pub prompt_format: Option<PromptFormat>,
    /// Workload slice: the chat template's thinking switch (`enable_thinking`), on or off
    /// [default: the template's own]; refused for a template without the switch.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub thinking: Option<bool>,
    /// Workload slice: only the prompts of this category (the set's `category` field).
    #[arg(long)]
    pub category: Option<String>,
    /// Workload slice: only the prompts in this language (the set's `language` field, e.g. en, zh).
    #[arg(long)]
    pub language: Option<String>,
}

fn parse_prompt_format(s: &str) -> std::result::Result<PromptFormat, String> {
    s.parse()
}

fn parse_on_off(s: &str) -> std::result::Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, found {s:?}")),
    }
}

impl TargetArgs {
    /// The workload slice the options ask for.
    pub fn slice(&self) -> Slice {
        Slice {
            prompt_format: self.prompt_format,
            thinking: self.thinking,
            category: self.category.clone(),
            language: self.language.clone(),
        }
    }

    /// The prompt set, sliced (before `--limit`: the first N prompts of the slice).
    pub fn prompt_set(&self) -> Result<PromptSet> {
        let mut set = PromptSet::load(&self.prompts)?;
        draftlens_engine::slices::apply(&self.slice(), &mut set)?;
        if let Some(n) = self.limit {
            set.truncate(n);
        }
        if set.prompts.is_empty() {
            bail!("{}: the prompt set is empty", set.source.display());
        }
        Ok(set)
    }

    /// [`TargetArgs::prompt_set`], only the prompts of `shard` when given (possibly none).
    pub fn shard_prompt_set(&self, shard: Option<Shard>) -> Result<PromptSet> {
        let mut set = self.prompt_set()?;
        if let Some(sh) = shard {
            set.prompts = draftlens_engine::shard::prompts_of_shard(&sh, &set.prompts)
                .into_iter()
                .map(|i| set.prompts[i].clone())
                .collect();
        }
        Ok(set)
    }
}

/// Where timings measured on the backend are stored (shared by `live` and `bench-costs`,
/// docs/verdict.md).
#[derive(Args, Clone, Debug)]
pub struct TimingStoreArgs {
    /// Store the timings with RUN, the replayed run (`draftlens run`) of this drafter on this
    /// target, prompts, budget and backend in --db, for `compare`, `report` and the UI's
    /// verdict. (`live`: implies --baseline.)
    #[arg(long, value_name = "RUN")]
    pub store: Option<String>,
    /// Run database of --store.
    #[arg(long, env = "DRAFTLENS_DB", default_value = "runs.sqlite")]
    pub db: PathBuf,
}

/// Which completion anchors are drafted and how (shared by `run` and `watch`).
#[derive(Args, Clone, Debug)]
pub struct AnchorArgs {
    /// Drafter candidates kept per position.
    #[arg(long, default_value_t = 8)]
    pub top_k: usize,
    /// Evaluate every N-th completion anchor (default: every anchor).
    #[arg(long, conflicts_with = "sample")]
    pub stride: Option<usize>,
    /// Evaluate N randomly sampled completion anchors per prompt (with --seed).
    #[arg(long)]
    pub sample: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Anchors per drafter forward.
    #[arg(long, default_value_t = draftlens_engine::drafter::eval::DEFAULT_ANCHOR_BATCH)]
    pub anchor_batch: usize,
}

impl AnchorArgs {
    /// `--stride` / `--sample` as the evaluation's anchor policy.
    pub fn policy(&self) -> AnchorPolicy {
        match (self.stride, self.sample) {
            (Some(n), _) => AnchorPolicy::Stride(n),
            (_, Some(n)) => AnchorPolicy::Random { n, seed: self.seed },
            _ => AnchorPolicy::Every,
        }
    }
}
