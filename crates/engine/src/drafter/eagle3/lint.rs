//! `draftlens lint` for an EAGLE-3 checkpoint: what was found (layout, taps and where they came
//! from, draft vocabulary, embedding, chain length) and every incompatibility with the target,
//! from the config, the tensor headers and the vocabulary maps (no weight matrix is read).

use super::config::{Eagle3Config, TapSource};
use super::model::{tensor_plan, TAPS};
use super::vocab::VocabMap;
use crate::drafter::lint::{Finding, Severity};
use crate::formats::WeightSource;
use crate::model::TargetFiles;
use anyhow::Result;
use std::path::Path;

fn f(severity: Severity, code: &'static str, message: String) -> Finding {
    Finding {
        severity,
        code,
        message,
    }
}

/// Every finding for EAGLE-3 drafter `dir` against `target`, most severe first. A config that
/// asks for something draftlens does not implement is an error return naming the key.
pub fn lint(target: &TargetFiles, dir: &Path) -> Result<Vec<Finding>> {
    use Severity::*;
    let spec = &target.spec;
    let (l, vocab) = (spec.num_layers, spec.vocab_size);
    let cfg = Eagle3Config::read(dir, l)?;
    let file = crate::drafter::gguf::weights_file(dir);
    let mut out = Vec::new();

    match cfg.tap_problem(l) {
        Some(problem) => out.push(f(Error, "tap-range", format!("config.json: {problem}"))),
        None => out.push(f(
            Info,
            "taps",
            match cfg.tap_source {
                TapSource::EagleConfig => format!("taps {:?} (decoder-layer outputs) from eagle_config.eagle_aux_hidden_state_layer_ids", cfg.tap_layer_ids),
                TapSource::VllmTopLevel => format!("taps {:?} (decoder-layer outputs) from the top-level eagle_aux_hidden_state_layer_ids, read in vLLM's convention (id j = input of layer j, so output of layer j − 1); SGLang would read the same numbers one layer later (docs/eagle3.md §1.2)", cfg.tap_layer_ids),
                TapSource::Default => format!("no tap ids in the config: the engines' default for a target of {l} layers, outputs of layers {:?} = [1, L/2 − 1, L − 4] (vLLM and SGLang capture the inputs of [2, L/2, L − 3])", cfg.tap_layer_ids),
            },
        )),
    }
    if cfg.tap_layer_ids.windows(2).any(|w| w[0] >= w[1]) {
        out.push(f(Warning, "tap-order", format!("taps {:?} are not in increasing layer order: vLLM and SGLang capture and concatenate them layer by layer, draftlens in the config's order, so fc would read its columns in another order than in serving", cfg.tap_layer_ids)));
    }
    if let Some(v) = cfg.vocab_size.filter(|&v| v != vocab) {
        out.push(f(Error, "vocab-size", format!("config.json: vocab_size {v} differs from the target's {vocab}: the draft vocabulary maps (d2t, t2d) and the embedding index the target's vocabulary")));
    }
    if let Some(t) = cfg.target_hidden_size.filter(|&t| t != spec.hidden_size) {
        out.push(f(Error, "target-hidden", format!("config.json: target_hidden_size {t} differs from the target's hidden size {}: fc fuses {TAPS} taps of the target's width", spec.hidden_size)));
    }
    let draft_vocab = cfg.draft_vocab(vocab);
    match crate::drafter::gguf::open_weights(dir) {
        Err(e) => out.push(f(Error, "weights", format!("{e:#}"))),
        Ok(w) => {
            let infos = w.tensors();
            let own_embedding = w.contains("embed_tokens.weight");
            if !own_embedding && cfg.hidden_size != spec.hidden_size {
                out.push(f(Error, "hidden-size", format!("{}: no embed_tokens.weight, so the target's embedding would be used, but hidden_size {} differs from the target's {}", file.display(), cfg.hidden_size, spec.hidden_size)));
            }
            let plan = tensor_plan(&cfg, spec.hidden_size, vocab, own_embedding);
            let problem = plan.iter().find_map(|(name, shape)| {
                match infos.iter().find(|t| &t.name == name) {
                    None => Some(format!("{}: tensor {name} is missing", file.display())),
                    Some(t) if &t.shape != shape => Some(format!(
                        "{}: tensor {name} has shape {:?}, expected {shape:?}",
                        file.display(),
                        t.shape
                    )),
                    Some(_) => None,
                }
            });
            if let Some(p) = problem {
                out.push(f(Error, "weights", p));
            }
            if infos.iter().any(|t| t.dtype == "F16") {
                out.push(f(
                    Warning,
                    "fp16",
                    "weights are stored in fp16; published EAGLE-3 drafters are bf16".into(),
                ));
            }
            match VocabMap::load(&w, &file, draft_vocab, vocab) {
                Err(e) => out.push(f(Error, "vocab-map", format!("{e:#}"))),
                Ok(map) => match map.t2d_problem(&w, vocab) {
                    Err(e) => out.push(f(Error, "vocab-map", format!("{e:#}"))),
                    Ok(Some(p)) => out.push(f(Warning, "t2d", format!("{}: {p}", file.display()))),
                    Ok(None) => {}
                },
            }
            out.push(f(
                Info,
                "eagle3",
                format!(
                    "EAGLE-3 drafter ({}): one midlayer, hidden {}, {} heads / {} KV heads of {}, MLP {}; draft vocabulary {draft_vocab} of the target's {vocab} ({}); {} embedding; a chain of {} steps per round ({}), records of block size {}",
                    if cfg.architecture.is_empty() { "no architectures" } else { cfg.architecture.as_str() },
                    cfg.hidden_size,
                    cfg.num_heads,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    cfg.intermediate_size,
                    if w.contains("d2t") { "d2t offsets" } else { "no d2t: identity" },
                    if own_embedding { "its own" } else { "the target's" },
                    cfg.steps,
                    if cfg.steps_from_config { "num_speculative_tokens".to_string() } else { format!("the default {}; set num_speculative_tokens in config.json for another depth", super::config::DEFAULT_STEPS) },
                    cfg.block_size()
                ),
            ));
        }
    }
    if (cfg.rope_theta - spec.rope_theta).abs() > f32::EPSILON * spec.rope_theta {
        out.push(f(Info, "rope", format!("drafter RoPE θ = {} (its own), target θ = {}: draftlens uses the drafter's, as deployment does", cfg.rope_theta, spec.rope_theta)));
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    Ok(out)
}
