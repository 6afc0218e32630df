//! `parity`: the same target (and drafter) on a reference backend and on a second backend under
//! each Gated DeltaNet profile — per-layer hidden-state errors (GDN and attention layers marked),
//! greedy agreement, and the change of every drafter metric, per-position acceptance included
//! (`draftlens_engine::parity_report`, docs/hybrid-models.md).
//!
//! `parity --features FILE`: another pipeline's hidden states against draftlens's own for the
//! same tokens, and a drafter's τ on each (`draftlens_engine::parity_features`,
//! docs/parity-features.md).

use crate::args::BackendArg;
use crate::common::Global;
use anyhow::{bail, Result};
use clap::Args;
use draftlens_engine::backend::{dispatch, Backend, BackendJob, GdnProfile, DEFAULT_CUDA_DEVICE};
use draftlens_engine::drafter::run::DrafterSpec;
use draftlens_engine::parity_features::{
    features_report, format_report as format_features, FeaturesOptions, FeaturesReport,
};
use draftlens_engine::parity_report::{format_report, parity_report, ParityOptions, ParityReport};
use draftlens_engine::prompts::PromptSet;
use draftlens_engine::session::Session;
use draftlens_results::store::Store;
use std::path::PathBuf;

#[derive(Args)]
pub struct ParityArgs {
    /// [default: the model `draftlens setup` installs in the data folder]
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Also compare a drafter's metrics when fed each configuration's hidden states.
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// Reference backend first (it runs the reference GDN profile).
    #[arg(long, value_delimiter = ',', default_value = "cpu,cuda")]
    pub backends: Vec<BackendArg>,
    /// GDN profiles the second backend runs a hybrid target under, each compared with the
    /// reference (dense targets: ignored).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "reference,engine"
    )]
    pub gdn_profiles: Vec<GdnProfile>,
    #[arg(long, default_value = "builtin:humaneval")]
    pub prompts: String,
    #[arg(long, default_value_t = 4)]
    pub limit: usize,
    /// Continuation length for the drafter comparison.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Compare hidden states another pipeline computed (safetensors: `PROMPT.layerL`, optionally
    /// `PROMPT.input_ids`; what `extract --out` writes) with draftlens's own for the same tokens,
    /// per layer, and the drafter's τ on each (docs/parity-features.md). Runs on --backend.
    #[arg(long, value_name = "FILE",
          conflicts_with_all = ["backends", "gdn_profiles", "limit", "max_new_tokens"])]
    pub features: Option<PathBuf>,
    /// With --features: the backend draftlens's own hidden states come from.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto, requires = "features")]
    pub backend: BackendArg,
    /// With --features: positions listed per layer as the worst.
    #[arg(long, value_name = "N", default_value_t = 5, requires = "features")]
    pub worst: usize,
}

struct Outer<'a> {
    g: &'a Global,
    a: &'a ParityArgs,
}
struct Inner<'a, A: Backend> {
    g: &'a Global,
    a: &'a ParityArgs,
    first: A,
}

impl<'a> BackendJob for Outer<'a> {
    type Output = ParityReport;
    fn run<A: Backend>(self, first: A) -> Result<ParityReport> {
        dispatch(
            self.a.backends[1].into(),
            DEFAULT_CUDA_DEVICE,
            Inner {
                g: self.g,
                a: self.a,
                first,
            },
        )
    }
}

impl<'a, A: Backend> BackendJob for Inner<'a, A> {
    type Output = ParityReport;
    fn run<B: Backend>(self, second: B) -> Result<ParityReport> {
        let (g, a) = (self.g, self.a);
        let mut set = PromptSet::load(&a.prompts)?;
        set.truncate(a.limit);
        let mut sa = Session::load(self.first, a.target(), g.cache()?, Default::default())?;
        let mut sb = Session::load(second, a.target(), g.cache()?, Default::default())?;
        let opts = ParityOptions {
            profiles: a.gdn_profiles.clone(),
            drafter: a.drafter.as_ref().map(|dir| DrafterSpec::Checkpoint {
                dir: dir.clone(),
                step: None,
                series: "parity".into(),
            }),
            max_new_tokens: a.max_new_tokens,
        };
        // The drafter runs are scaffolding for the comparison: a throw-away store.
        let path =
            std::env::temp_dir().join(format!("draftlens-parity-{}.sqlite", std::process::id()));
        let store = Store::open(&path)?;
        let report = parity_report(&mut sa, &mut sb, &set, &opts, &store);
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        report
    }
}

impl ParityArgs {
    /// The target, resolved by [`run`] (`--target` or the installed default).
    fn target(&self) -> &std::path::Path {
        self.target
            .as_deref()
            .expect("resolved at the start of `run`")
    }
}

/// `parity --features`: draftlens's side on one backend.
struct FeaturesJob<'a> {
    g: &'a Global,
    a: &'a ParityArgs,
    features: &'a std::path::Path,
}

impl BackendJob for FeaturesJob<'_> {
    type Output = FeaturesReport;
    fn run<B: Backend>(self, be: B) -> Result<FeaturesReport> {
        let (g, a) = (self.g, self.a);
        // The whole set: the file names the prompts it has features for.
        let set = PromptSet::load(&a.prompts)?;
        let s = Session::load(be, a.target(), g.cache()?, Default::default())?;
        let opts = FeaturesOptions {
            features: self.features.to_path_buf(),
            drafter: a.drafter.as_ref().map(|dir| DrafterSpec::Checkpoint {
                dir: dir.clone(),
                step: None,
                series: "parity".into(),
            }),
            worst: a.worst,
        };
        features_report(&s, &set, &opts)
    }
}

pub fn run(g: &Global, a: ParityArgs) -> Result<()> {
    let a = ParityArgs {
        target: Some(g.target(&a.target)?),
        ..a
    };
    if let Some(features) = &a.features {
        let out = dispatch(
            a.backend.select(g),
            DEFAULT_CUDA_DEVICE,
            FeaturesJob { g, a: &a, features },
        )?;
        return g.emit(&out, || format_features(&out));
    }
    if a.backends.len() != 2 {
        bail!("--backends takes exactly two backends, e.g. cpu,cuda (cpu,cpu compares the GDN profiles on the CPU)");
    }
    if a.gdn_profiles.is_empty() {
        bail!("--gdn-profiles needs at least one profile (reference, engine)");
    }
    let out = dispatch(
        a.backends[0].into(),
        DEFAULT_CUDA_DEVICE,
        Outer { g, a: &a },
    )?;
    g.emit(&out, || format_report(&out))?;
    if !out.pass {
        bail!("hidden states differ beyond the stated tolerances (docs/cuda.md)");
    }
    Ok(())
}
