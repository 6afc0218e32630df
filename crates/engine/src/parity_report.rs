//! `draftlens parity`: a target (and optionally a drafter) on a reference configuration and on a
//! second backend under each Gated DeltaNet profile, with per-layer divergence and the effect on
//! the drafter's metrics (docs/hybrid-models.md, "Parity across backends and profiles").
//!
//! The reference is session `a` with the Reference profile (normally the CPU: the f32
//! reference). Session `b` runs once per requested profile (for a dense target, once: dense
//! models have no profile); the model is uploaded once per session and switched between
//! profiles ([`Session::set_gdn_profile`]). Each comparison reports every hidden-state index with
//! the kind of layer that produced it (GDN or attention), greedy agreement, and, with a drafter,
//! every run-level drafter metric and the per-position acceptance next to the reference's.
//!
//! Only comparisons under the same profile as the reference are held to the tolerances
//! ([`crate::parity::layer_tolerance`]): the other profile is *meant* to differ, and the report
//! shows by how much and what that does to the drafter.
//!
//! Generic over both backends, so CI runs it CPU against CPU (crates/engine/tests/hybrid_parity.rs).

use crate::backend::{Backend, GdnProfile};
use crate::drafter::run::{run_eval, DrafterSpec, RunOptions};
use crate::model::config::LayerType;
use crate::model::{Capture, TargetModel};
use crate::parity::{
    compare_layers, compare_metrics, layer_tolerance, moe_layer_tolerance, TargetParity,
};
use crate::session::Session;
use anyhow::{ensure, Result};
use draftlens_results::store::{MetricScope, RunMode, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Hidden states and greedy choices of one loaded target over a prompt list: what
/// [`compare_passes`] compares. `states[i]` is hidden-state index i (HF convention) over the
/// tokens of every prompt, one sequence per prompt (full prefill).
pub struct Pass {
    /// What ran: a backend name, with the GDN profile for a hybrid (`cuda/engine`).
    pub label: String,
    pub prompts: usize,
    pub tokens: usize,
    pub states: Vec<Vec<f32>>,
    /// A mixture-of-experts target: its layers are held to [`crate::parity::moe_layer_tolerance`].
    pub moe: bool,
    /// Per position: the top-1 next token and its lead over the top-2 (log-probs, nats).
    pub top1: Vec<u32>,
    pub lead: Vec<f32>,
}

/// Runs `m` on `be` over `prompts` (empty ones skipped), capturing every hidden-state index.
pub fn run_pass<B: Backend>(
    label: &str,
    be: &B,
    m: &TargetModel<B>,
    prompts: &[Vec<u32>],
) -> Result<Pass> {
    let l = m.spec.num_layers;
    let capture = Capture::hf_indices((0..=l).collect(), l)?;
    let mut p = Pass {
        label: label.into(),
        prompts: prompts.len(),
        tokens: 0,
        states: vec![Vec::new(); l + 1],
        moe: m.spec.moe.is_some(),
        top1: Vec::new(),
        lead: Vec::new(),
    };
    for ids in prompts.iter().filter(|ids| !ids.is_empty()) {
        p.tokens += ids.len();
        let out = m.forward(be, ids, &mut m.new_cache(), &capture)?;
        for (i, st) in p.states.iter_mut().enumerate() {
            let Some(t) = out.captured.get(i) else {
                anyhow::bail!("hidden state {i} was not captured")
            };
            st.extend(be.to_host(t)?);
        }
        let k = m.logits_topk(be, &out.last_hidden, 2)?;
        for r in 0..ids.len() {
            p.top1.push(k.row_ids(r)[0]);
            p.lead.push(k.row_logprobs(r)[0] - k.row_logprobs(r)[1]);
        }
    }
    Ok(p)
}

/// Every hidden-state index of `b` against the reference `a` (same prompts), and greedy
/// agreement (overall, and where `a`'s top-1 leads by more than 0.1 nats).
pub fn compare_passes(a: &Pass, b: &Pass) -> Result<TargetParity> {
    ensure!(
        a.tokens == b.tokens && a.top1.len() == b.top1.len(),
        "passes over different prompts ({} vs {} tokens)",
        a.tokens,
        b.tokens
    );
    let tolerance = if a.moe {
        moe_layer_tolerance
    } else {
        layer_tolerance
    };
    let names: Vec<String> = (0..a.states.len())
        .map(|i| format!("hidden_states[{i}]"))
        .collect();
    let (mut agree, mut agree_dec, mut decisive) = (0, 0, 0);
    for r in 0..a.top1.len() {
        let same = a.top1[r] == b.top1[r];
        agree += same as usize;
        if a.lead[r] > 0.1 {
            decisive += 1;
            agree_dec += same as usize;
        }
    }
    Ok(TargetParity {
        backends: (a.label.clone(), b.label.clone()),
        prompts: a.prompts,
        tokens: a.tokens,
        layers: compare_layers(&names, &a.states, &b.states, tolerance)?,
        greedy_agree: agree,
        greedy_total: a.top1.len(),
        greedy_agree_decisive: agree_dec,
        greedy_decisive: decisive,
    })
}

/// The run-level metric holding the per-position acceptance series (`survival` conditional on
/// the earlier positions: P(d_k = t_k | all earlier accepted), docs/metrics.md).
pub const POSITION_METRIC: &str = "cond_accept";

/// What `draftlens parity` runs.
pub struct ParityOptions {
    /// Profiles session `b` runs a hybrid target under (ignored for a dense target).
    pub profiles: Vec<GdnProfile>,
    /// A drafter checkpoint to evaluate on every configuration.
    pub drafter: Option<DrafterSpec>,
    /// Continuation length of the drafter evaluation.
    pub max_new_tokens: usize,
}

/// A drafter's run-level metrics on one configuration.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DrafterMetrics {
    /// Every run-scope scalar (τ variants, acceptance, accuracy ...).
    pub scalars: BTreeMap<String, f64>,
    /// Per-position acceptance ([`POSITION_METRIC`]), position k = 1 first.
    pub per_position: Vec<Option<f64>>,
}

/// One configuration compared with the reference.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// `backend` or `backend/profile` for a hybrid.
    pub label: String,
    /// The GDN profile (`None` for a dense target).
    pub gdn_profile: Option<&'static str>,
    /// Same profile as the reference: held to the tolerances.
    pub gated: bool,
    pub target: TargetParity,
    pub drafter: Option<DrafterMetrics>,
    /// (metric, reference value, this value, this − reference)
    pub drafter_delta: Vec<(String, f64, f64, f64)>,
}

/// The whole report (`draftlens parity --json`).
#[derive(Debug, Serialize)]
pub struct ParityReport {
    pub reference: String,
    /// Per hidden-state index: `embedding`, then the kind of the decoder layer whose output it
    /// is (`gdn` or `attention`; the last index also has the final norm applied).
    pub layer_kinds: Vec<&'static str>,
    pub reference_drafter: Option<DrafterMetrics>,
    pub comparisons: Vec<Comparison>,
    /// Every gated comparison within its tolerances.
    pub pass: bool,
}

fn profile_name(p: GdnProfile) -> &'static str {
    match p {
        GdnProfile::Reference => "reference",
        GdnProfile::Engine => "engine",
    }
}

fn label<B: Backend>(s: &Session<B>) -> String {
    match s.gdn_profile_name() {
        Some(p) => format!("{}/{p}", s.be.name()),
        None => s.be.name().to_string(),
    }
}

/// Per hidden-state index of `s`'s target: what produced it.
pub fn layer_kinds(spec: &crate::model::ModelSpec) -> Vec<&'static str> {
    let mut v = vec!["embedding"];
    v.extend((0..spec.num_layers).map(|i| match &spec.hybrid {
        Some(h) if h.layer_types[i] == LayerType::LinearAttention => "gdn",
        _ => "attention",
    }));
    v
}

fn drafter_metrics<B: Backend>(
    s: &Session<B>,
    set: &crate::prompts::PromptSet,
    opts: &ParityOptions,
    store: &Store,
) -> Result<Option<DrafterMetrics>> {
    let Some(spec) = &opts.drafter else {
        return Ok(None);
    };
    let run = RunOptions {
        name: Some(format!("parity {}", label(s))),
        mode: RunMode::Deployment,
        eval: Default::default(),
        max_new_tokens: opts.max_new_tokens,
        fail_after: None,
    };
    let out = run_eval(s, spec, set, &run, store)?;
    let mut m = DrafterMetrics::default();
    for r in store.metrics(out.run_id)? {
        if r.scope != MetricScope::Run {
            continue;
        }
        if r.name == POSITION_METRIC {
            m.per_position = r
                .series
                .as_ref()
                .and_then(|v| v.as_array())
                .map(|a| a.iter().map(|x| x.as_f64()).collect())
                .unwrap_or_default();
        }
        m.scalars.insert(r.name, r.value);
    }
    Ok(Some(m))
}

/// Runs the comparison described in the module doc. `store` receives the drafter runs.
pub fn parity_report<A: Backend, B: Backend>(
    a: &mut Session<A>,
    b: &mut Session<B>,
    set: &crate::prompts::PromptSet,
    opts: &ParityOptions,
    store: &Store,
) -> Result<ParityReport> {
    let prompts = set
        .prompts
        .iter()
        .map(|p| a.prompt_ids(p))
        .collect::<Result<Vec<_>>>()?;
    a.set_gdn_profile(GdnProfile::Reference);
    let reference = label(a);
    let ref_pass: Pass = run_pass(&reference, &a.be, a.model()?, &prompts)?;
    let reference_drafter = drafter_metrics(a, set, opts, store)?;
    let hybrid = b.files.spec.hybrid.is_some();
    let profiles = if hybrid {
        opts.profiles.clone()
    } else {
        vec![GdnProfile::Reference]
    };
    let mut comparisons = Vec::new();
    for p in profiles {
        b.set_gdn_profile(p);
        let l = label(b);
        let pass = run_pass(&l, &b.be, b.model()?, &prompts)?;
        let target = compare_passes(&ref_pass, &pass)?;
        let drafter = drafter_metrics(b, set, opts, store)?;
        let drafter_delta = match (&reference_drafter, &drafter) {
            (Some(x), Some(y)) => compare_metrics(&x.scalars, &y.scalars),
            _ => vec![],
        };
        comparisons.push(Comparison {
            label: l,
            gdn_profile: hybrid.then(|| profile_name(p)),
            gated: p == GdnProfile::Reference,
            target,
            drafter,
            drafter_delta,
        });
    }
    let pass = comparisons
        .iter()
        .filter(|c| c.gated)
        .all(|c| c.target.layers.iter().all(|l| l.pass));
    Ok(ParityReport {
        reference,
        layer_kinds: layer_kinds(&a.files.spec),
        reference_drafter,
        comparisons,
        pass,
    })
}

/// The plain-text report.
pub fn format_report(r: &ParityReport) -> String {
    let mut o = String::new();
    for c in &r.comparisons {
        let t = &c.target;
        let _ = writeln!(
            o,
            "{} vs {} on {} prompts ({} tokens){}",
            c.label,
            r.reference,
            t.prompts,
            t.tokens,
            if c.gated {
                ""
            } else {
                " — another profile: reported, not held to the tolerances"
            }
        );
        let _ = writeln!(
            o,
            "{:<20} {:<10} {:>10} {:>10} {:>12} {:>10}  result",
            "hidden state", "layer", "rel_l2", "max_abs", "cosine", "tol_rel"
        );
        for (l, kind) in t.layers.iter().zip(&r.layer_kinds) {
            let result = match (l.pass, c.gated) {
                (true, _) => "ok",
                (false, true) => "FAIL",
                (false, false) => "beyond",
            };
            let _ = writeln!(
                o,
                "{:<20} {:<10} {:>10.3e} {:>10.3e} {:>12.8} {:>10.1e}  {result}",
                l.name, kind, l.diff.rel_l2, l.diff.max_abs, l.diff.cosine, l.tol.max_rel_l2
            );
        }
        let _ = writeln!(
            o,
            "greedy agreement: {}/{} positions ({} / {} where the reference top-1 leads by > 0.1 nats)",
            t.greedy_agree, t.greedy_total, t.greedy_agree_decisive, t.greedy_decisive
        );
        for (name, x, y, d) in &c.drafter_delta {
            let _ = writeln!(o, "  drafter {name:<22} {x:>9.4} → {y:>9.4}  (Δ {d:+.4})");
        }
        if let (Some(x), Some(y)) = (&r.reference_drafter, &c.drafter) {
            let _ = write!(o, "  drafter acceptance by position (reference → this):");
            for (k, (a, b)) in x.per_position.iter().zip(&y.per_position).enumerate() {
                let f = |v: &Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
                let _ = write!(o, "  k={} {}→{}", k + 1, f(a), f(b));
            }
            o.push('\n');
        }
        o.push('\n');
    }
    o
}
