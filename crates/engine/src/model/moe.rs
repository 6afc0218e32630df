//! Mixture-of-experts feed-forward blocks: Qwen3-MoE (`qwen3_moe`: Qwen3-30B-A3B,
//! Qwen3-Coder-30B-A3B), the Qwen3.5 / Qwen3.6 MoE hybrids (`qwen3_5_moe`, `qwen3_5_moe_text`)
//! and Qwen3-Next's sparse layers (docs/moe-models.md).
//!
//! - [`MoeSpec`]: the expert keys of `config.json` and which layers are sparse.
//! - [`route`] / [`route_topk_softmax`] and [`RoutingPlan`]: the routing rules (Qwen: softmax
//!   over the router logits in f32, top-k, renormalised when `norm_topk_prob`; gpt-oss: top-k
//!   of the logits, softmax over the k; side by side below), and the per-row plan that gathers
//!   each expert's rows and sums every row's terms in a fixed order. Both are computed on the
//!   host from the router logits, one row at a time: a row's routing and output never depend on
//!   its batch-mates.
//! - [`SparseMoe`]: router, routed experts and the gated shared expert over the
//!   [`Backend`] seam; [`FeedForward`]: a decoder layer's MLP, dense, sparse or gpt-oss's
//!   ([`super::gpt_oss::GptOssMoe`]).
//! - [`check_checkpoint`]: the expert tensors a config implies, refused with one message naming
//!   the file and the tensor or key before anything is uploaded.

use super::config::{Arch, ModelSpec};
use super::gpt_oss::GptOssMoe;
use super::transformer::{load_stacked_matrix, Mlp};
use crate::backend::moe::{ExpertActivation, MoeExperts, MoeRouting, RoutingRule};
use crate::backend::Backend;
use crate::formats::{TensorInfo, WeightSource};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// The mixture-of-experts shape of a model (Hugging Face key names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Routed experts per sparse layer (`num_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub num_experts_per_tok: usize,
    /// Each routed expert's SwiGLU width (`moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// Divide the top-k probabilities by their sum (`norm_topk_prob`; always on for
    /// `qwen3_5_moe`, whose router has no such flag).
    pub norm_topk_prob: bool,
    /// Width of the shared expert every token also runs, scaled by `sigmoid(shared_expert_gate ·
    /// x)` (`shared_expert_intermediate_size`; Qwen3.5-MoE and Qwen3-Next), `None` without one
    /// (Qwen3-MoE).
    pub shared_expert_intermediate_size: Option<usize>,
    /// Whether layer i's MLP is sparse (transformers' rule: not in `mlp_only_layers` and
    /// `(i + 1) % decoder_sparse_step == 0`; every layer on `qwen3_5_moe`).
    pub sparse_layers: Vec<bool>,
}

/// The `config.json` keys of a mixture of experts.
#[derive(Deserialize)]
struct HfMoeConfig {
    /// transformers 5 writes Qwen3-MoE's as `num_local_experts` (its attribute map); the
    /// published checkpoints say `num_experts`.
    #[serde(alias = "num_local_experts")]
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
}

/// Defaults of one family's transformers config class, and which keys its code reads.
struct Family {
    experts: usize,
    top_k: usize,
    inter: usize,
    /// The shared expert's default width; `None`: the family has no shared expert.
    shared: Option<usize>,
    /// `norm_topk_prob`'s default; `None`: the router always renormalises (no key).
    norm_topk_prob: Option<bool>,
    /// Reads `decoder_sparse_step` / `mlp_only_layers` (otherwise every layer is sparse).
    schedule: bool,
}

fn family(arch: Arch) -> Option<Family> {
    match arch {
        // configuration_qwen3_moe.py
        Arch::Qwen3Moe => Some(Family {
            experts: 128,
            top_k: 8,
            inter: 768,
            shared: None,
            norm_topk_prob: Some(false),
            schedule: true,
        }),
        // configuration_qwen3_5_moe.py (Qwen3_5MoeTextConfig) and Qwen3_5MoeTopKRouter
        Arch::Qwen3_5Moe => Some(Family {
            experts: 256,
            top_k: 8,
            inter: 512,
            shared: Some(512),
            norm_topk_prob: None,
            schedule: false,
        }),
        // configuration_qwen3_next.py
        Arch::Qwen3Next => Some(Family {
            experts: 512,
            top_k: 10,
            inter: 512,
            shared: Some(512),
            norm_topk_prob: Some(true),
            schedule: true,
        }),
        _ => None,
    }
}

impl MoeSpec {
    /// The experts of a (text) config, `None` when no layer is sparse (dense architectures,
    /// `num_experts` 0). Missing keys take the defaults of the family's transformers config.
    pub fn from_hf_config(
        raw: &Value,
        arch: Arch,
        num_layers: usize,
        path: &Path,
    ) -> Result<Option<MoeSpec>> {
        let o = path.display();
        let Some(f) = family(arch) else {
            return Ok(None);
        };
        let c: HfMoeConfig = serde_json::from_value(raw.clone())
            .with_context(|| format!("{o}: not a valid mixture-of-experts config.json"))?;
        let experts = c.num_experts.unwrap_or(f.experts);
        if experts == 0 {
            return Ok(None);
        }
        let sparse_layers: Vec<bool> = if f.schedule {
            let step = c.decoder_sparse_step.unwrap_or(1);
            if step == 0 {
                bail!("{o}: decoder_sparse_step is 0 (layer i is sparse when (i + 1) % decoder_sparse_step == 0)");
            }
            let dense = c.mlp_only_layers.unwrap_or_default();
            (0..num_layers)
                .map(|i| !dense.contains(&i) && (i + 1) % step == 0)
                .collect()
        } else {
            vec![true; num_layers]
        };
        if !sparse_layers.contains(&true) {
            return Ok(None);
        }
        let spec = MoeSpec {
            num_experts: experts,
            num_experts_per_tok: c.num_experts_per_tok.unwrap_or(f.top_k),
            moe_intermediate_size: c.moe_intermediate_size.unwrap_or(f.inter),
            norm_topk_prob: f
                .norm_topk_prob
                .map_or(true, |d| c.norm_topk_prob.unwrap_or(d)),
            shared_expert_intermediate_size: f
                .shared
                .map(|d| c.shared_expert_intermediate_size.unwrap_or(d)),
            sparse_layers,
        };
        spec.validate(path)?;
        Ok(Some(spec))
    }

    /// Consistency of the keys, each error naming its key.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let o = origin.display();
        let (e, k) = (self.num_experts, self.num_experts_per_tok);
        if k == 0 || k > e {
            bail!("{o}: num_experts_per_tok {k} must be between 1 and num_experts ({e})");
        }
        if self.moe_intermediate_size == 0 {
            bail!("{o}: moe_intermediate_size is 0");
        }
        if self.shared_expert_intermediate_size == Some(0) {
            bail!("{o}: shared_expert_intermediate_size is 0 (this architecture always has a shared expert)");
        }
        Ok(())
    }

    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }

    /// Every HF tensor of sparse layer `i`'s MLP and its shape (hidden size `d`): the router
    /// `mlp.gate.weight` `[E, D]`, each expert's `mlp.experts.{e}.{gate,up,down}_proj.weight`
    /// and the shared expert with its gate `mlp.shared_expert_gate.weight` `[1, D]`.
    pub fn layer_tensors(&self, d: usize, i: usize) -> Vec<(String, Vec<usize>)> {
        let p = format!("model.layers.{i}.mlp");
        let mut v = vec![(format!("{p}.gate.weight"), vec![self.num_experts, d])];
        let mut swiglu = |prefix: String, inter: usize| {
            v.push((format!("{prefix}.gate_proj.weight"), vec![inter, d]));
            v.push((format!("{prefix}.up_proj.weight"), vec![inter, d]));
            v.push((format!("{prefix}.down_proj.weight"), vec![d, inter]));
        };
        for e in 0..self.num_experts {
            swiglu(format!("{p}.experts.{e}"), self.moe_intermediate_size);
        }
        if let Some(s) = self.shared_expert_intermediate_size {
            swiglu(format!("{p}.shared_expert"), s);
            v.push((format!("{p}.shared_expert_gate.weight"), vec![1, d]));
        }
        v
    }

    /// Parameters layer `i`'s sparse MLP reads per token: the router (and shared gate), the
    /// top-k experts and the shared expert.
    pub fn active_params(&self, d: usize) -> usize {
        let shared = self
            .shared_expert_intermediate_size
            .map_or(0, |s| 3 * d * s + d);
        self.num_experts * d
            + self.num_experts_per_tok * 3 * d * self.moe_intermediate_size
            + shared
    }

    /// Parameters of one sparse MLP: the router, every expert and the shared expert.
    pub fn total_params(&self, d: usize) -> usize {
        self.active_params(d)
            + (self.num_experts - self.num_experts_per_tok) * 3 * d * self.moe_intermediate_size
    }
}

/// Every HF tensor of layer `i`'s MLP, dense or sparse, and its shape (gpt-oss: its fused,
/// unquantised layout, [`super::gpt_oss::mlp_tensors`]).
pub fn ffn_tensors(spec: &ModelSpec, i: usize) -> Vec<(String, Vec<usize>)> {
    let d = spec.hidden_size;
    if spec.gpt_oss.is_some() {
        return super::gpt_oss::mlp_tensors(spec, i, false);
    }
    match &spec.moe {
        Some(m) if m.is_sparse(i) => m.layer_tensors(d, i),
        _ => {
            let (p, inter) = (format!("model.layers.{i}.mlp"), spec.intermediate_size);
            vec![
                (format!("{p}.gate_proj.weight"), vec![inter, d]),
                (format!("{p}.up_proj.weight"), vec![inter, d]),
                (format!("{p}.down_proj.weight"), vec![d, inter]),
            ]
        }
    }
}

/// Whether HF tensor `name` belongs to a decoder layer's MLP (`model.layers.{i}.mlp.*`).
pub fn is_ffn_tensor(name: &str) -> bool {
    name.starts_with("model.layers.") && name.contains(".mlp.")
}

/// Refuse a checkpoint whose expert tensors disagree with the config in ways the per-tensor
/// shape check would report less clearly, before any weight is read: a router bias (none of these
/// architectures has one), experts stored fused as 3-D `experts.gate_up_proj` /
/// `experts.down_proj` (not read yet), an expert index at or over `num_experts`, and a router in a
/// layer the config makes dense. Errors name the file (`path`) and the tensor and key.
pub fn check_checkpoint(spec: &ModelSpec, infos: &[TensorInfo], path: &Path) -> Result<()> {
    let o = path.display();
    let arch = spec.arch.as_str();
    for t in infos {
        let Some((layer, rest)) = t
            .name
            .strip_prefix("model.layers.")
            .and_then(|s| s.split_once(".mlp."))
        else {
            continue;
        };
        let Ok(layer) = layer.parse::<usize>() else {
            continue;
        };
        let name = &t.name;
        let file = &t.file_name;
        if rest == "gate.bias" || rest == "router.bias" || rest.ends_with("e_score_correction_bias")
        {
            bail!("{o}: tensor {name} ({file}) is a router bias, but {arch}'s router has none (its reference code routes on a bias-free linear layer)");
        }
        let Some(moe) = &spec.moe else {
            if rest == "gate.weight" || rest.starts_with("experts.") {
                bail!("{o}: tensor {name} ({file}) is an expert or router tensor, but config.json describes a dense {arch} model (num_experts 0 or every layer in mlp_only_layers)");
            }
            continue;
        };
        if rest == "experts.gate_up_proj" || rest == "experts.down_proj" {
            bail!("{o}: tensor {name} ({file}) holds the experts fused (3-D experts.gate_up_proj / experts.down_proj): not supported yet; draftlens reads the per-expert layout mlp.experts.{{e}}.{{gate,up,down}}_proj.weight that save_pretrained writes and the published checkpoints use");
        }
        let sparse_tensor = rest == "gate.weight" || rest.starts_with("experts.");
        if sparse_tensor && !moe.is_sparse(layer) {
            bail!("{o}: tensor {name} ({file}) belongs to a sparse MLP, but config.json makes layer {layer}'s MLP dense (mlp_only_layers / decoder_sparse_step)");
        }
        if let Some(e) = rest
            .strip_prefix("experts.")
            .and_then(|s| s.split('.').next())
            .and_then(|s| s.parse::<usize>().ok())
        {
            if e >= moe.num_experts {
                bail!(
                    "{o}: tensor {name} ({file}) is expert {e}, but config.json says num_experts = {}",
                    moe.num_experts
                );
            }
        }
    }
    Ok(())
}

// The two routing rules, side by side (transformers 5.17):
//
// | rule | source | steps |
// |---|---|---|
// | [`route`] | `Qwen3MoeTopKRouter`, `Qwen3NextTopKRouter`, `Qwen3_5MoeTopKRouter` | `softmax(logits)` over all experts, top-k of the probabilities, divided by their sum when `norm_topk_prob` (always on Qwen3.5-MoE) |
// | [`route_topk_softmax`] | `GptOssTopKRouter` (`models/gpt_oss/modeling_gpt_oss.py`) | logits with the router's bias, top-k of the logits, `softmax` over those k values |
//
// The second equals the first with renormalisation in exact arithmetic (the top-k of the logits
// are the top-k of the probabilities, and exp(l_i) / Σ_topk exp(l_j) is the renormalised
// probability); in f32 they round differently, so each model uses its own.

/// One token's routing, the rule of transformers' `Qwen3MoeTopKRouter` / `Qwen3NextTopKRouter`
/// / `Qwen3_5MoeTopKRouter`: `probs = softmax(logits)` in f32 (max subtracted), the `top_k`
/// largest probabilities (ties to the lower expert id; torch leaves tie order unspecified),
/// divided by their sum (added largest first, the order `torch.topk` returns them in) when
/// `renormalise`. Returns (expert, weight) in ascending expert order: the order in which
/// transformers' expert loop adds each expert's weighted output.
pub fn route(logits: &[f32], top_k: usize, renormalise: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let probs: Vec<f32> = exps.iter().map(|&e| e / sum).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    let mut chosen: Vec<(usize, f32)> = order.iter().map(|&e| (e, probs[e])).collect();
    if renormalise {
        let total: f32 = chosen.iter().map(|c| c.1).sum();
        for c in &mut chosen {
            c.1 /= total;
        }
    }
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// One token's routing, the rule of transformers' `GptOssTopKRouter`: the `top_k` largest
/// logits (the router's bias already added; ties to the lower expert id), then `softmax` over
/// those k values in f32 (their max subtracted, the exponentials summed in the order
/// `torch.topk` returns them: largest first). Returns (expert, weight) in ascending expert
/// order, as [`route`].
pub fn route_topk_softmax(logits: &[f32], top_k: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    let max = order.first().map_or(0.0, |&e| logits[e]);
    let exps: Vec<f32> = order.iter().map(|&e| (logits[e] - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let mut chosen: Vec<(usize, f32)> = order
        .iter()
        .zip(&exps)
        .map(|(&e, &x)| (e, x / sum))
        .collect();
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// `sigmoid(x)` in f32 as torch computes it: `1 / (1 + exp(−x))`.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// How one sparse MLP call runs: which rows each expert takes, and each row's terms for
/// [`Backend::add_weighted_rows`].
#[derive(Debug, PartialEq)]
pub struct RoutingPlan {
    /// Rows routed to expert e, ascending (empty: the expert does not run).
    pub rows_by_expert: Vec<Vec<u32>>,
    /// Per row, `terms` indices into the stacked outputs: the routed experts' output blocks in
    /// expert order (each block's rows in `rows_by_expert` order), then the shared expert's
    /// output (one row per input row). Row r's terms are entries `r·terms .. (r+1)·terms`, its
    /// experts ascending, then the shared expert.
    pub index: Vec<u32>,
    /// The weight of each term: the routing weight, or `sigmoid(shared_expert_gate · x)`.
    pub weights: Vec<f32>,
    /// Terms per row: `top_k`, plus one with a shared expert.
    pub terms: usize,
}

impl RoutingPlan {
    /// The plan for `logits`, row-major with `width` columns per row: the routing logits of
    /// `num_experts` experts, then (with `shared`) the shared expert's gate logit.
    pub fn new(logits: &[f32], width: usize, moe: &MoeSpec, shared: bool) -> RoutingPlan {
        let e = moe.num_experts;
        let routes: Vec<Vec<(usize, f32)>> = logits
            .chunks(width)
            .map(|l| route(&l[..e], moe.num_experts_per_tok, moe.norm_topk_prob))
            .collect();
        let shared_gates: Option<Vec<f32>> =
            shared.then(|| logits.chunks(width).map(|l| sigmoid(l[e])).collect());
        Self::from_routes(&routes, e, moe.num_experts_per_tok, shared_gates.as_deref())
    }

    /// The plan of rows already routed: `routes[r]` holds row r's `top_k` (expert, weight) in
    /// ascending expert order, `shared_gates[r]` the weight of its shared expert's output.
    pub fn from_routes(
        routes: &[Vec<(usize, f32)>],
        e: usize,
        top_k: usize,
        shared_gates: Option<&[f32]>,
    ) -> RoutingPlan {
        let shared = shared_gates.is_some();
        let mut rows_by_expert = vec![Vec::new(); e];
        for (r, route) in routes.iter().enumerate() {
            for &(ex, _) in route {
                rows_by_expert[ex].push(r as u32);
            }
        }
        // Where each expert's block starts in the stacked outputs; the shared expert's after all.
        let mut start = Vec::with_capacity(e);
        let mut next = 0u32;
        for rows in &rows_by_expert {
            start.push(next);
            next += rows.len() as u32;
        }
        let terms = top_k + usize::from(shared);
        let (mut index, mut weights) = (
            Vec::with_capacity(routes.len() * terms),
            Vec::with_capacity(routes.len() * terms),
        );
        // Rows were pushed in ascending order, so row r is the next unused row of each block.
        let mut cursor = vec![0u32; e];
        for (r, route) in routes.iter().enumerate() {
            for &(ex, w) in route {
                index.push(start[ex] + cursor[ex]);
                cursor[ex] += 1;
                weights.push(w);
            }
            if let Some(gates) = shared_gates {
                index.push(next + r as u32);
                weights.push(gates[r]);
            }
        }
        RoutingPlan {
            rows_by_expert,
            index,
            weights,
            terms,
        }
    }
}

/// A sparse MLP block (`Qwen3MoeSparseMoeBlock`, `Qwen3_5MoeSparseMoeBlock`,
/// `Qwen3NextSparseMoeBlock`).
pub struct SparseMoe<B: Backend> {
    /// The router `gate.weight` `[E, D]`, with the shared expert's gate `shared_expert_gate.weight`
    /// `[1, D]` stacked under it: one GEMM gives every routing logit and the gate's logit.
    pub router: B::Matrix,
    pub experts: Vec<Mlp<B>>,
    pub shared_expert: Option<Mlp<B>>,
    pub spec: MoeSpec,
}

impl<B: Backend> SparseMoe<B> {
    /// Load layer `layer`'s block (`prefix` = `model.layers.{layer}.mlp`).
    pub fn load(
        be: &B,
        src: &dyn WeightSource,
        prefix: &str,
        hidden: usize,
        moe: &MoeSpec,
    ) -> Result<Self> {
        let mut router = vec![(format!("{prefix}.gate.weight"), moe.num_experts)];
        if moe.shared_expert_intermediate_size.is_some() {
            router.push((format!("{prefix}.shared_expert_gate.weight"), 1));
        }
        let experts = (0..moe.num_experts)
            .map(|e| {
                Mlp::load(
                    be,
                    src,
                    &format!("{prefix}.experts.{e}"),
                    hidden,
                    moe.moe_intermediate_size,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let shared_expert = moe
            .shared_expert_intermediate_size
            .map(|s| Mlp::load(be, src, &format!("{prefix}.shared_expert"), hidden, s))
            .transpose()?;
        Ok(SparseMoe {
            router: load_stacked_matrix(be, src, &router, hidden)?,
            experts,
            shared_expert,
            spec: moe.clone(),
        })
    }

    /// `h += moe(x)`. Where the backend routes on the device ([`Backend::moe_routed_acc`]: the
    /// CUDA backend's decode steps) it does all of it. Otherwise each row of `x` is routed on the
    /// host (the router logits, `[T, E (+1)]`, are the only download), every expert that has rows
    /// runs on its gathered rows, and each row's weighted expert outputs (ascending expert, then
    /// the gated shared expert) are added to `h` with one [`Backend::add_weighted_rows`].
    pub fn forward_acc(&self, be: &B, x: &B::Tensor, h: &mut B::Tensor) -> Result<()> {
        let rows = be.dims(x).0;
        if rows == 0 {
            return Ok(());
        }
        let logits = be.matmul(x, &self.router)?;
        let shared_out = self
            .shared_expert
            .as_ref()
            .map(|s| s.forward(be, x))
            .transpose()?;
        let weights: Vec<(&B::Matrix, &B::Matrix)> = self
            .experts
            .iter()
            .map(|m| (&m.gate_up_proj, &m.down_proj))
            .collect();
        let experts = MoeExperts {
            weights: &weights,
            biases: None,
            activation: ExpertActivation::SwiGlu,
        };
        let routing = MoeRouting {
            num_experts: self.spec.num_experts,
            top_k: self.spec.num_experts_per_tok,
            rule: RoutingRule::SoftmaxTopK {
                renormalise: self.spec.norm_topk_prob,
            },
        };
        if be.moe_routed_acc(x, &logits, &experts, shared_out.as_ref(), &routing, h)? {
            return Ok(());
        }
        let shared = shared_out.is_some();
        let width = self.spec.num_experts + usize::from(shared);
        let plan = RoutingPlan::new(&be.to_host(&logits)?, width, &self.spec, shared);
        let mut outputs = Vec::new();
        for (expert, rows_e) in self.experts.iter().zip(&plan.rows_by_expert) {
            if !rows_e.is_empty() {
                outputs.push(expert.forward(be, &be.gather_rows(x, rows_e)?)?);
            }
        }
        outputs.extend(shared_out);
        let stacked = if outputs.len() == 1 {
            outputs.pop().expect("one output")
        } else {
            be.concat_rows(&outputs.iter().collect::<Vec<_>>())?
        };
        be.add_weighted_rows(h, &stacked, &plan.index, &plan.weights)
    }
}

/// A decoder layer's MLP: dense SwiGLU, a sparse mixture of experts, or gpt-oss's.
pub enum FeedForward<B: Backend> {
    Dense(Mlp<B>),
    Sparse(SparseMoe<B>),
    GptOss(GptOssMoe<B>),
}

impl<B: Backend> FeedForward<B> {
    /// Layer `layer`'s MLP (`model.layers.{layer}.mlp`), sparse where [`MoeSpec`] says so.
    pub fn load(be: &B, src: &dyn WeightSource, layer: usize, spec: &ModelSpec) -> Result<Self> {
        let p = format!("model.layers.{layer}.mlp");
        let d = spec.hidden_size;
        if let Some(g) = &spec.gpt_oss {
            return Ok(FeedForward::GptOss(GptOssMoe::load(
                be, src, layer, spec, g,
            )?));
        }
        Ok(match &spec.moe {
            Some(m) if m.is_sparse(layer) => {
                FeedForward::Sparse(SparseMoe::load(be, src, &p, d, m)?)
            }
            _ => FeedForward::Dense(Mlp::load(be, src, &p, d, spec.intermediate_size)?),
        })
    }

    /// The dense MLP, `None` for a sparse layer.
    pub fn dense(&self) -> Option<&Mlp<B>> {
        match self {
            FeedForward::Dense(m) => Some(m),
            FeedForward::Sparse(_) | FeedForward::GptOss(_) => None,
        }
    }

    /// `h += mlp(x)`.
    pub fn forward_acc(&self, be: &B, x: &B::Tensor, h: &mut B::Tensor) -> Result<()> {
        match self {
            FeedForward::Dense(m) => m.forward_acc(be, x, h),
            FeedForward::Sparse(m) => m.forward_acc(be, x, h),
            FeedForward::GptOss(m) => m.forward_acc(be, x, h),
        }
    }
}

#[cfg(test)]
#[path = "moe_tests.rs"]
mod tests;
