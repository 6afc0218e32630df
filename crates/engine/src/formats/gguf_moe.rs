//! Mixture-of-experts GGUF targets as llama.cpp's converter writes them (`qwen3moe`,
//! `qwen35moe`, `qwen3next` with experts; docs/moe-models.md, "GGUF files"), read back into the
//! [`MoeSpec`] and the per-expert Hugging Face tensors the model code reads.
//!
//! The converter stacks each layer's experts into one 3-D tensor per projection and renames the
//! rest (gguf-py's tensor map; `Qwen2MoeModel.modify_tensors`):
//!
//! | GGUF (`blk.N.` …), `ne` innermost first | Hugging Face (`model.layers.N.mlp.` …), PyTorch shape |
//! |---|---|
//! | `ffn_gate_inp.weight` `[D, E]` | `gate.weight` `[E, D]` (the router) |
//! | `ffn_gate_exps.weight` / `ffn_up_exps.weight` `[D, I, E]` | `experts.{e}.gate_proj.weight` / `up_proj.weight` `[I, D]`: rows `e·I ..` |
//! | `ffn_down_exps.weight` `[I, D, E]` | `experts.{e}.down_proj.weight` `[D, I]` |
//! | `ffn_gate_up_exps.weight` `[D, 2I, E]` (`--fuse-gate-up-exps`) | expert e's gate rows then its up rows |
//! | `ffn_{gate,up,down}_shexp.weight` | `shared_expert.{gate,up,down}_proj.weight` |
//! | `ffn_gate_inp_shexp.weight` `[D]` or `[D, 1]` | `shared_expert_gate.weight` `[1, D]` |
//!
//! Keys: `{arch}.expert_count` (E), `expert_used_count` (top-k), `expert_feed_forward_length`
//! (I), `expert_shared_feed_forward_length` (S), `expert_weights_norm` (renormalise the top-k;
//! absent: on, because llama.cpp's graphs for these three architectures always renormalise).
//! The converter does not write which layers are sparse: a layer is sparse when it has a router
//! (`ffn_gate_inp`), dense when it has the dense `ffn_gate`/`ffn_up`/`ffn_down` instead
//! (transformers' `mlp_only_layers` / `decoder_sparse_step`, which llama.cpp itself does not load).
//!
//! [`MoeGgufWeights`] sits between the architecture's GGUF name map ([`super::gguf::GgufWeights`]
//! or [`super::gguf_hybrid::HybridGgufWeights`]) and the model: it lists and serves the expert
//! tensors under their HF names (each expert a row range of the stacked tensor, dequantised on its
//! own) and passes every other name through. [`check`] refuses a file whose expert tensors
//! disagree with its keys with one message naming the file, the GGUF tensor and the key.

use super::dequant;
use super::gguf::{GgufFile, GgufTensor, GgufValue};
use super::gguf_experts::{blk, Keys, StackedGgufWeights};
use super::WeightSource;
use crate::model::config::Arch;
use crate::model::moe::MoeSpec;
use anyhow::{bail, Context, Result};
use std::sync::Arc;

/// Whether `arch` has a shared expert in every sparse layer (Qwen3.5-MoE, Qwen3-Next).
fn has_shared_expert(arch: Arch) -> bool {
    matches!(arch, Arch::Qwen3_5Moe | Arch::Qwen3Next)
}

/// The experts of a GGUF target with `num_layers` decoder layers (MTP blocks after them are not
/// read), `None` for a dense file (no `expert_count`, or 0, on an architecture that allows it).
/// Errors name the file and the key or tensor.
pub fn moe_spec(
    file: &GgufFile,
    arch_name: &str,
    arch: Arch,
    num_layers: usize,
) -> Result<Option<MoeSpec>> {
    let p = file.path().display();
    let k = Keys {
        file,
        arch: arch_name,
    };
    let experts = k.opt("expert_count")?.unwrap_or(0);
    match arch {
        Arch::Qwen3Moe | Arch::Qwen3_5Moe if experts == 0 => bail!(
            "{p}: metadata key {} is missing or 0 (a {arch_name} model is a mixture of experts)",
            k.key("expert_count")
        ),
        Arch::Qwen3Moe | Arch::Qwen3_5Moe | Arch::Qwen3Next => {}
        _ if experts > 0 => bail!(
            "{p}: {} = {experts}, but a {arch_name} model is dense (a mixture of experts is qwen3moe, qwen35moe or qwen3next)",
            k.key("expert_count")
        ),
        _ => return Ok(None),
    }
    if experts == 0 {
        return Ok(None); // a dense qwen3next
    }
    let top_k = k.req("expert_used_count", "the experts each token is routed to")?;
    if top_k == 0 || top_k > experts {
        bail!(
            "{p}: {} = {top_k} must be between 1 and {} = {experts}",
            k.key("expert_used_count"),
            k.key("expert_count")
        );
    }
    let inter = k.req("expert_feed_forward_length", "each expert's width")?;
    if inter == 0 {
        bail!("{p}: {} is 0", k.key("expert_feed_forward_length"));
    }
    let shared = if has_shared_expert(arch) {
        let s = k.req(
            "expert_shared_feed_forward_length",
            "the shared expert's width",
        )?;
        if s == 0 {
            bail!("{p}: {} is 0", k.key("expert_shared_feed_forward_length"));
        }
        Some(s)
    } else {
        None
    };
    let norm_key = k.key("expert_weights_norm");
    let norm_topk_prob = match file.metadata().get(&norm_key) {
        None => true,
        Some(GgufValue::Bool(b)) => *b,
        Some(v) => bail!("{p}: metadata {norm_key} should be a bool, found {v:?}"),
    };
    if arch == Arch::Qwen3_5Moe && !norm_topk_prob {
        bail!("{p}: {norm_key} is false, but the Qwen3.5-MoE router always renormalises its top-k");
    }
    let has = |l: usize, part: &str| file.tensor_info(&blk(l, part)).is_some();
    let sparse_layers = (0..num_layers)
        .map(|l| {
            if has(l, "ffn_gate_inp.weight") {
                return Ok(true);
            }
            let experts_here = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"]
                .iter()
                .find(|t| has(l, &format!("{t}.weight")));
            match experts_here {
                Some(t) => bail!("{p}: tensor {} (the router) is missing: layer {l} has expert tensors (blk.{l}.{t}.weight)", blk(l, "ffn_gate_inp.weight")),
                // Every layer of these models is sparse; llama.cpp's converter cannot write a dense one.
                None if arch == Arch::Qwen3_5Moe || !has(l, "ffn_up.weight") => bail!(
                    "{p}: tensor {} (the router) is missing: layer {l} has neither experts nor a dense MLP (blk.{l}.ffn_up.weight)",
                    blk(l, "ffn_gate_inp.weight")
                ),
                None => Ok(false),
            }
        })
        .collect::<Result<Vec<bool>>>()?;
    let spec = MoeSpec {
        num_experts: experts,
        num_experts_per_tok: top_k,
        moe_intermediate_size: inter,
        norm_topk_prob,
        shared_expert_intermediate_size: shared,
        sparse_layers,
    };
    check(file, arch_name, &spec)?;
    Ok(Some(spec))
}

/// Every expert tensor of every sparse layer against the keys (E, I, S, D), before any weight is
/// read: stored 3-D with E experts, the router `[D, E]`, the shared expert present exactly when
/// the architecture has one. Errors name the file, the GGUF tensor and the key.
fn check(file: &GgufFile, arch: &str, moe: &MoeSpec) -> Result<()> {
    let p = file.path().display();
    let d_key = format!("{arch}.embedding_length");
    let d = file
        .get_u64(&d_key)
        .with_context(|| format!("{p}: metadata key {d_key} is missing"))? as u64;
    let (e, i) = (moe.num_experts as u64, moe.moe_intermediate_size as u64);
    let (e_key, i_key, s_key) = (
        format!("{arch}.expert_count"),
        format!("{arch}.expert_feed_forward_length"),
        format!("{arch}.expert_shared_feed_forward_length"),
    );
    // A router bias (gpt-oss's ffn_gate_inp.bias, DeepSeek's exp_probs_b): none of these
    // architectures' routers has one (llama.cpp's graphs route on ffn_gate_inp.weight alone), so
    // such a file is some other model's and would be misread.
    for t in file.tensors() {
        let part = t.name.strip_prefix("blk.").and_then(|r| r.split_once('.'));
        if let Some((_, "ffn_gate_inp.bias" | "exp_probs_b.bias" | "exp_probs_b")) = part {
            bail!(
                "{p}: tensor {} is a router bias, but {arch}'s router has none (llama.cpp's {arch} graph routes on ffn_gate_inp.weight alone)",
                t.name
            );
        }
    }
    let shape_err = |t: &GgufTensor, want: &[u64], keys: &str| -> anyhow::Error {
        anyhow::anyhow!(
            "{p}: tensor {} has ne {:?} (innermost first), {keys} imply {want:?}",
            t.name,
            t.ne
        )
    };
    for (l, _) in moe.sparse_layers.iter().enumerate().filter(|(_, s)| **s) {
        let get = |part: &str| file.tensor_info(&blk(l, part));
        let router = get("ffn_gate_inp.weight").expect("sparse layers have a router");
        if router.ne != [d, e] {
            return Err(shape_err(
                router,
                &[d, e],
                &format!("{d_key} = {d} and {e_key} = {e}"),
            ));
        }
        let keys = format!("{d_key} = {d}, {i_key} = {i} and {e_key} = {e}");
        let stacked: Vec<(&str, [u64; 3])> = if get("ffn_gate_up_exps.weight").is_some() {
            vec![("ffn_gate_up_exps.weight", [d, 2 * i, e])]
        } else {
            vec![
                ("ffn_gate_exps.weight", [d, i, e]),
                ("ffn_up_exps.weight", [d, i, e]),
            ]
        };
        for (part, want) in stacked
            .into_iter()
            .chain([("ffn_down_exps.weight", [i, d, e])])
        {
            let t = get(part).with_context(|| {
                format!("{p}: tensor {} is missing (layer {l} has a router, blk.{l}.ffn_gate_inp.weight)", blk(l, part))
            })?;
            if t.ne.len() == 3 && t.ne[2] != e {
                bail!(
                    "{p}: tensor {} holds {} experts (ne {:?}), {e_key} = {e}",
                    t.name,
                    t.ne[2],
                    t.ne
                );
            }
            if t.ne != want {
                return Err(shape_err(t, &want, &keys));
            }
            if !t.ty.is_supported() {
                bail!(
                    "{p}: unsupported tensor type {} in tensor {} (supported: {})",
                    t.ty,
                    t.name,
                    dequant::SUPPORTED
                );
            }
        }
        let shexp = [
            "ffn_gate_inp_shexp.weight",
            "ffn_gate_shexp.weight",
            "ffn_up_shexp.weight",
            "ffn_down_shexp.weight",
        ];
        match moe.shared_expert_intermediate_size {
            None => {
                if let Some(t) = shexp.iter().find_map(|s| get(s)) {
                    bail!(
                        "{p}: tensor {} is a shared expert, but {arch} has none",
                        t.name
                    );
                }
            }
            Some(s) => {
                let s = s as u64;
                let keys = format!("{d_key} = {d} and {s_key} = {s}");
                for (part, want) in shexp
                    .iter()
                    .zip([vec![d], vec![d, s], vec![d, s], vec![s, d]])
                {
                    let t = get(part).with_context(|| {
                        format!("{p}: tensor {} is missing ({arch} has a shared expert in every sparse layer)", blk(l, part))
                    })?;
                    // The gate is written [D] (squeezed) or [D, 1].
                    let ok =
                        t.ne == want || (*part == "ffn_gate_inp_shexp.weight" && t.ne == [d, 1]);
                    if !ok {
                        return Err(shape_err(t, &want, &keys));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The expert tensors of a MoE GGUF under HF names, over the architecture's own name map (see
/// the module doc).
pub type MoeGgufWeights = StackedGgufWeights<Moe>;

/// [`StackedGgufWeights`]'s marker for the MoE architectures' expert names.
pub struct Moe;

impl MoeGgufWeights {
    /// `inner` serves every other tensor; `moe` comes from [`moe_spec`] (so the shapes are checked).
    pub fn new(inner: Box<dyn WeightSource>, file: Arc<GgufFile>, moe: &MoeSpec) -> Result<Self> {
        let mut w = Self::over(inner, file);
        let i = moe.moe_intermediate_size;
        for (l, _) in moe.sparse_layers.iter().enumerate().filter(|(_, s)| **s) {
            let hf = |rest: &str| format!("model.layers.{l}.mlp.{rest}");
            let whole =
                |w: &mut Self, gguf: &str, hf_name: String, shape: Vec<usize>| -> Result<()> {
                    let index = w.consume(&blk(l, gguf))?;
                    let rows = shape.iter().product::<usize>()
                        / w.file().tensors()[index].row_len() as usize;
                    w.serve(hf_name, index, 0, rows, shape);
                    Ok(())
                };
            let router = w.consume(&blk(l, "ffn_gate_inp.weight"))?;
            let d = w.file().tensors()[router].ne[0] as usize;
            whole(
                &mut w,
                "ffn_gate_inp.weight",
                hf("gate.weight"),
                vec![moe.num_experts, d],
            )?;
            if let Some(s) = moe.shared_expert_intermediate_size {
                whole(
                    &mut w,
                    "ffn_gate_inp_shexp.weight",
                    hf("shared_expert_gate.weight"),
                    vec![1, d],
                )?;
                whole(
                    &mut w,
                    "ffn_gate_shexp.weight",
                    hf("shared_expert.gate_proj.weight"),
                    vec![s, d],
                )?;
                whole(
                    &mut w,
                    "ffn_up_shexp.weight",
                    hf("shared_expert.up_proj.weight"),
                    vec![s, d],
                )?;
                whole(
                    &mut w,
                    "ffn_down_shexp.weight",
                    hf("shared_expert.down_proj.weight"),
                    vec![d, s],
                )?;
            }
            // (GGUF tensor, HF projection, row offset within an expert's block, rows per block).
            let fused = w
                .file()
                .tensor_info(&blk(l, "ffn_gate_up_exps.weight"))
                .is_some();
            let slices: Vec<(&str, &str, usize, usize, usize)> = if fused {
                vec![
                    ("ffn_gate_up_exps.weight", "gate_proj", 0, i, 2 * i),
                    ("ffn_gate_up_exps.weight", "up_proj", i, i, 2 * i),
                    ("ffn_down_exps.weight", "down_proj", 0, d, d),
                ]
            } else {
                vec![
                    ("ffn_gate_exps.weight", "gate_proj", 0, i, i),
                    ("ffn_up_exps.weight", "up_proj", 0, i, i),
                    ("ffn_down_exps.weight", "down_proj", 0, d, d),
                ]
            };
            for (gguf, proj, offset, rows, block) in slices {
                let index = w.consume(&blk(l, gguf))?;
                let row_len = w.file().tensors()[index].row_len() as usize;
                for e in 0..moe.num_experts {
                    w.serve(
                        hf(&format!("experts.{e}.{proj}.weight")),
                        index,
                        e * block + offset,
                        rows,
                        vec![rows, row_len],
                    );
                }
            }
        }
        Ok(w)
    }
}
