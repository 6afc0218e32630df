//! `parity`: the same target (and drafter) on two backends — per-layer hidden-state errors,
//! greedy agreement, and the change of every drafter metric when the drafter is fed each
//! backend's hidden states.

use crate::cmd_model::BackendArg;
use crate::common::Global;
use anyhow::{bail, Result};
use clap::Args;
use draftlens::backend::Backend;
use draftlens::drafter::run::{run_eval, DrafterSpec, RunOptions};
use draftlens::model::TargetFiles;
use draftlens::parity::{compare_metrics, format_checks, target_parity, TargetParity};
use draftlens::prompts::PromptSet;
use draftlens::session::{dispatch, BackendJob, Session};
use draftlens::store::{MetricScope, RunMode, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct ParityArgs {
    /// [default: the model `draftlens setup` installs in the data folder]
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Also compare a drafter's metrics when fed each backend's hidden states.
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// Reference backend first.
    #[arg(long, value_delimiter = ',', default_value = "cpu,cuda")]
    pub backends: Vec<BackendArg>,
    #[arg(long, default_value = "builtin:humaneval")]
    pub prompts: String,
    #[arg(long, default_value_t = 4)]
    pub limit: usize,
    /// Continuation length for the drafter comparison.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
}

impl ParityArgs {
    /// The target, resolved by [`run`] (`--target` or the installed default).
    fn target(&self) -> &std::path::Path {
        self.target
            .as_deref()
            .expect("resolved at the start of `run`")
    }
}

#[derive(Serialize)]
pub struct ParityOut {
    pub target: TargetParity,
    /// (metric, reference value, other value, other − reference)
    pub drafter_metrics: Vec<(String, f64, f64, f64)>,
    pub pass: bool,
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
    type Output = ParityOut;
    fn run<A: Backend>(self, first: A) -> Result<ParityOut> {
        dispatch(
            self.a.backends[1].into(),
            Inner {
                g: self.g,
                a: self.a,
                first,
            },
        )
    }
}

fn drafter_metrics<B: Backend>(
    g: &Global,
    a: &ParityArgs,
    be: B,
    set: &PromptSet,
    dir: &PathBuf,
) -> Result<BTreeMap<String, f64>> {
    let tmp = std::env::temp_dir().join(format!(
        "draftlens-parity-{}-{}",
        std::process::id(),
        be.name()
    ));
    let s = Session::load(be, a.target(), g.cache()?)?;
    let store = Store::open(&tmp.with_extension("sqlite"))?;
    let opts = RunOptions {
        name: None,
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: a.max_new_tokens,
        fail_after: None,
    };
    let spec = DrafterSpec::Checkpoint {
        dir: dir.clone(),
        step: None,
        series: "parity".into(),
    };
    let out = run_eval(&s, &spec, set, &opts, &store)?;
    let m = store.metrics(out.run_id)?;
    let _ = std::fs::remove_file(tmp.with_extension("sqlite"));
    Ok(m.into_iter()
        .filter(|r| r.scope == MetricScope::Run)
        .map(|r| (r.name, r.value))
        .collect())
}

impl<'a, A: Backend> BackendJob for Inner<'a, A> {
    type Output = ParityOut;
    fn run<B: Backend>(self, second: B) -> Result<ParityOut> {
        let (g, a) = (self.g, self.a);
        let files = TargetFiles::open(a.target())?;
        let mut set = PromptSet::load(&a.prompts)?;
        set.truncate(a.limit);
        let tok = files.tokenizer()?;
        let prompts: Vec<Vec<u32>> = set
            .prompts
            .iter()
            .map(|p| match (&p.messages, &p.text) {
                (Some(m), _) => tok.encode_chat(m, true),
                (None, Some(t)) => tok.encode(t, true),
                _ => bail!("prompt {} is empty", p.id),
            })
            .collect::<Result<_>>()?;
        let target = target_parity(
            &self.first,
            &second,
            &files.spec,
            files.weights.as_ref(),
            &prompts,
        )?;
        let drafter_metrics = match &a.drafter {
            Some(d) => {
                let ma = drafter_metrics(g, a, self.first, &set, d)?;
                let mb = drafter_metrics(g, a, second, &set, d)?;
                compare_metrics(&ma, &mb)
            }
            None => vec![],
        };
        let pass = target.layers.iter().all(|c| c.pass);
        Ok(ParityOut {
            target,
            drafter_metrics,
            pass,
        })
    }
}

pub fn run(g: &Global, a: ParityArgs) -> Result<()> {
    let a = ParityArgs {
        target: Some(g.target(&a.target)?),
        ..a
    };
    if a.backends.len() != 2 {
        bail!("--backends takes exactly two backends, e.g. cpu,cuda");
    }
    let out = dispatch(a.backends[0].into(), Outer { g, a: &a })?;
    g.emit(&out, || {
        let t = &out.target;
        let mut o = format_checks(&format!("{} vs {} on {} prompts ({} tokens)", t.backends.1, t.backends.0, t.prompts, t.tokens), &t.layers);
        o += &format!(
            "greedy agreement: {}/{} positions ({} / {} where the reference top-1 leads by > 0.1 nats)\n",
            t.greedy_agree, t.greedy_total, t.greedy_agree_decisive, t.greedy_decisive
        );
        for (name, x, y, d) in &out.drafter_metrics {
            o += &format!("  drafter {name:<22} {x:>9.4} → {y:>9.4}  (Δ {d:+.4})\n");
        }
        o
    })?;
    if !out.pass {
        bail!("hidden states differ beyond the stated tolerances (docs/cuda.md)");
    }
    Ok(())
}
