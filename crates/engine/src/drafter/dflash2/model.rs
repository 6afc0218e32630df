//! The DFlash2 drafter over the backend seam (docs/dflash2.md §2): the DFlash backbone
//! ([`DFlashDrafter`]: its context K/V, attention and MLP are reused as they are) with a grouped
//! dynamic causal convolution around each layer's attention and MLP, the block's embeddings
//! scaled, and the candidate selector instead of a per-position argmax.
//!
//! ```text
//! x = input_embedding_scale · embed([y_a, MASK×(B−1)])
//! per layer: h, k = attention_conv.prepare(input_layernorm(x))
//!            x += attention_conv.finish(attend(h), k)        (attend: DFlash's, mask per layer)
//!            h, k = mlp_conv.prepare(post_attention_layernorm(x))
//!            x += mlp_conv.finish(mlp(h), k)
//! norm(rows 1..B−1) ─► target LM head ─► selector (path from y_a) ─► records
//! ```

use super::config::DFlash2Config;
use super::conv::GroupedDynamicConv;
use super::selector::CandidateSelector;
use crate::backend::{AttnMask, Backend, TopK};
use crate::drafter::gguf::{open_weights, weights_file};
use crate::drafter::model::{
    tensor_plan as backbone_plan, DFlashDrafter, DraftContext, DraftOptions,
};
use crate::formats::WeightSource;
use crate::model::transformer::load_matrix;
use crate::model::EmbedHead;
use anyhow::{bail, Result};
use std::path::Path;

/// The selector's codebooks as the published checkpoints name them (no `.weight`: the authors'
/// `from_pretrained` maps them); a checkpoint written by `save_pretrained` has `.weight`.
pub const CODEBOOKS: [&str; 2] = [
    "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook",
];
pub const HIDDEN_PROJECTION: &str = "candidate_selector.hidden_projection.weight";

/// The name a codebook is stored under in `src`: without `.weight` when present, else with it.
pub fn codebook_name(names: &[String], base: &str) -> String {
    let with = format!("{base}.weight");
    if names.iter().any(|n| n == base) || !names.iter().any(|n| *n == with) {
        base.to_string()
    } else {
        with
    }
}

/// Every tensor DFlash2 adds to the DFlash backbone, with its HF shape: per layer the two
/// convolutions, then the selector (codebooks under the names `names` uses, see
/// [`codebook_name`]). `lint` checks it against the file's header before a run starts.
pub fn tensor_plan(cfg: &DFlash2Config, names: &[String]) -> Vec<(String, Vec<usize>)> {
    let d = cfg.backbone.hidden_size;
    let (k, g) = (cfg.conv_kernel_size, cfg.conv_groups());
    let mut plan = Vec::new();
    for i in 0..cfg.backbone.num_layers {
        for conv in ["attention_conv", "mlp_conv"] {
            plan.push((format!("layers.{i}.{conv}.base_kernel"), vec![2, k, d]));
            plan.push((
                format!("layers.{i}.{conv}.kernel_projection.weight"),
                vec![2 * k * g, d],
            ));
        }
    }
    plan.push((HIDDEN_PROJECTION.to_string(), vec![cfg.selector_rank, d]));
    for base in CODEBOOKS {
        plan.push((
            codebook_name(names, base),
            vec![cfg.vocab_size, cfg.selector_rank],
        ));
    }
    plan
}

/// The convolutions of one layer.
pub struct LayerConvs<B: Backend> {
    pub attention: GroupedDynamicConv<B>,
    pub mlp: GroupedDynamicConv<B>,
}

pub struct DFlash2Drafter<B: Backend> {
    pub cfg: DFlash2Config,
    /// fc, hidden_norm, the layers' attention and MLP, the final norm; its `cfg` is
    /// `self.cfg.backbone`. Contexts are the backbone's ([`DFlashDrafter::context`]).
    pub backbone: DFlashDrafter<B>,
    pub convs: Vec<LayerConvs<B>>,
    pub selector: CandidateSelector<B>,
}

impl<B: Backend> DFlash2Drafter<B> {
    /// Load a checkpoint folder for a target of hidden size `target_hidden` and `target_vocab`
    /// LM-head rows. Every tensor is checked against the plan first: a checkpoint without its
    /// selector (or a part of it) is one error naming the file and the tensor, before any
    /// weight is read.
    pub fn load(be: &B, dir: &Path, target_hidden: usize, target_vocab: usize) -> Result<Self> {
        let cfg = DFlash2Config::load(dir)?;
        // A checkpoint folder or a llama.cpp GGUF file (`crate::drafter::gguf`).
        let src = open_weights(dir)?;
        let file = weights_file(dir);
        if let Some(problem) = plan_problem(&cfg, &src, target_hidden, &file.display().to_string())
        {
            bail!("{problem}");
        }
        if cfg.vocab_size < target_vocab {
            bail!("{}: vocab_size {} is under the target's {target_vocab} LM-head rows: a candidate would have no codebook row", dir.join("config.json").display(), cfg.vocab_size);
        }
        let names: Vec<String> = src.tensors().into_iter().map(|t| t.name).collect();
        let (d, k, g) = (
            cfg.backbone.hidden_size,
            cfg.conv_kernel_size,
            cfg.conv_groups(),
        );
        let conv = |i: usize, which: &str| -> Result<GroupedDynamicConv<B>> {
            let p = format!("layers.{i}.{which}");
            Ok(GroupedDynamicConv {
                base: src.tensor(&format!("{p}.base_kernel"))?.data,
                projection: load_matrix(
                    be,
                    &src,
                    &format!("{p}.kernel_projection.weight"),
                    2 * k * g,
                    d,
                )?,
                kernel: k,
                group: cfg.conv_group_size,
            })
        };
        let convs = (0..cfg.backbone.num_layers)
            .map(|i| {
                Ok(LayerConvs {
                    attention: conv(i, "attention_conv")?,
                    mlp: conv(i, "mlp_conv")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let selector = CandidateSelector {
            hidden_projection: load_matrix(be, &src, HIDDEN_PROJECTION, cfg.selector_rank, d)?,
            predecessor: src.tensor(&codebook_name(&names, CODEBOOKS[0]))?.data,
            successor: src.tensor(&codebook_name(&names, CODEBOOKS[1]))?.data,
            rank: cfg.selector_rank,
            top_k: cfg.selector_top_k,
        };
        let backbone = DFlashDrafter::load_backbone(be, dir, cfg.backbone.clone(), target_hidden)?;
        Ok(DFlash2Drafter {
            cfg,
            backbone,
            convs,
            selector,
        })
    }

    pub fn block_size(&self) -> usize {
        self.cfg.backbone.block_size
    }

    /// Draft one block per anchor, as [`DFlashDrafter::draft`] (same anchors, context rule and
    /// rows), each block's positions chosen by the selector along its path: row p's top-1 is
    /// d_p, its candidates ranked by score with log q. `opts.top_k` must not exceed
    /// `selector_top_k` (`super::check_options`).
    pub fn draft(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        ctx: &DraftContext<B>,
        anchors: &[usize],
        anchor_tokens: &[u32],
        opts: DraftOptions,
    ) -> Result<TopK> {
        let hidden =
            self.draft_hidden(be, target, ctx, anchors, anchor_tokens, opts.ctx_inclusive)?;
        let _head = crate::timeline::phase("drafter LM head + selector");
        self.selector
            .select(be, &self.cfg, target, &hidden, anchor_tokens, opts.top_k)
    }

    /// The final-norm hidden states of the drafted rows, block by block.
    pub fn draft_hidden(
        &self,
        be: &B,
        target: &dyn EmbedHead<B>,
        ctx: &DraftContext<B>,
        anchors: &[usize],
        anchor_tokens: &[u32],
        ctx_inclusive: bool,
    ) -> Result<B::Tensor> {
        let bb = &self.backbone;
        let b = self.block_size();
        let (ids, positions) = bb.block_inputs(anchors, anchor_tokens)?;
        let _layers = crate::timeline::phase("drafter layers");
        let mut x = be.embed(target.embed_tokens(), &ids)?;
        let scale = self.cfg.input_embedding_scale;
        if scale != 1.0 {
            let (rows, cols) = be.dims(&x);
            let scaled: Vec<f32> = be.to_host(&x)?.iter().map(|v| v * scale).collect();
            x = be.from_host(&scaled, rows, cols)?;
        }
        for (i, (l, convs)) in bb.layers.iter().zip(&self.convs).enumerate() {
            let m = self.cfg.layer_masks[i];
            let mask = AttnMask::Blocks {
                ctx_len: ctx.len,
                block: b,
                anchors: anchors.to_vec(),
                ctx_inclusive,
                causal_in_block: m.causal_in_block,
                window: m.window,
            };
            let h = l.input_layernorm.forward(be, &x)?;
            let (h, kernel) = convs.attention.prepare(be, &h, b)?;
            let a = bb.attend(be, i, &h, &positions, ctx, &mask)?;
            be.add_inplace(&mut x, &convs.attention.finish(be, &a, &kernel, b)?)?;
            let h = l.post_attention_layernorm.forward(be, &x)?;
            let (h, kernel) = convs.mlp.prepare(be, &h, b)?;
            let m = l.mlp.forward(be, &h)?;
            be.add_inplace(&mut x, &convs.mlp.finish(be, &m, &kernel, b)?)?;
        }
        bb.drafted_rows(be, &x, anchors.len())
    }
}

/// The first tensor of the whole plan (backbone and DFlash2's own) that `src` lacks or holds in
/// another shape, as one message naming `file` and the tensor; a missing selector tensor says
/// what serving engines do without it.
pub fn plan_problem(
    cfg: &DFlash2Config,
    src: &dyn WeightSource,
    target_hidden: usize,
    file: &str,
) -> Option<String> {
    let infos = src.tensors();
    let names: Vec<String> = infos.iter().map(|t| t.name.clone()).collect();
    let plan = backbone_plan(&cfg.backbone, target_hidden)
        .into_iter()
        .chain(tensor_plan(cfg, &names));
    for (name, shape) in plan {
        match infos.iter().find(|t| t.name == name) {
            None if name.starts_with("candidate_selector.") => {
                return Some(format!("{file}: tensor {name} is missing: the DFlash2 candidate selector is incomplete (serving engines without it fall back to plain DFlash proposals silently; docs/dflash2.md §5)"));
            }
            None => return Some(format!("{file}: tensor {name} is missing")),
            Some(t) if t.shape != shape => {
                return Some(format!(
                    "{file}: tensor {name} has shape {:?}, expected {shape:?}",
                    t.shape
                ));
            }
            Some(_) => {}
        }
    }
    None
}
