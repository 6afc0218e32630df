//! `draftlens lint DRAFTER.gguf --against HF_DIR`: a converted drafter compared with the
//! checkpoint it came from, tensor by tensor and key by key, naming the converter's known
//! mistakes (docs/gguf-drafters.md §3):
//!
//! | code | what |
//! |---|---|
//! | `tensor-count` | the file holds another number of tensors than the checkpoint's conversion would ("expected 81, got 58") |
//! | `missing-tensor` / `extra-tensor` | a checkpoint tensor with no stored counterpart / a stored tensor with none in the checkpoint |
//! | `shape`, `values` | a tensor of another shape, or values further from the checkpoint's than the storage type's rounding |
//! | `layer-ids-off-by-one`, `layer-ids` | target layers stored unshifted (or shifted twice), or otherwise not the checkpoint's |
//! | `mask-id` | `tokenizer.ggml.mask_token_id` missing or not the checkpoint's |
//! | `config` | a hyper-parameter (block size, widths, heads, eps, θ) not the checkpoint's |
//! | `gguf` | the file is refused by the loader (the loader's own message) |
//!
//! Only headers and tensors are read; nothing runs.

use super::{dflash, eagle3, GgufArch, Transform};
use crate::drafter::config::{DrafterConfig, DrafterFamily};
use crate::drafter::eagle3::Eagle3Config;
use crate::drafter::lint::{Finding, Severity};
use crate::formats::dequant::GgmlType;
use crate::formats::gguf::GgufFile;
use crate::formats::safetensors::SafetensorsWeights;
use crate::formats::{HostTensor, WeightSource};
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;

fn finding(severity: Severity, code: &'static str, message: String) -> Finding {
    Finding {
        severity,
        code,
        message,
    }
}

/// Every finding of GGUF drafter `gguf` against checkpoint folder `hf_dir`, for a target of
/// `target_layers` decoder layers (EAGLE-3's default taps depend on it), most severe first.
pub fn against(gguf: &Path, hf_dir: &Path, target_layers: usize) -> Result<Vec<Finding>> {
    use Severity::*;
    let file = GgufFile::open(gguf)?;
    let g = gguf.display();
    let arch = match file.architecture() {
        Some("dflash") => GgufArch::DFlash,
        Some("eagle3") => GgufArch::Eagle3,
        other => bail!("{g}: general.architecture is {other:?}: --against compares a dflash or eagle3 GGUF drafter with its checkpoint"),
    };
    let family = DrafterFamily::detect(hf_dir)?;
    let family_ok = matches!(
        (arch, family),
        (
            GgufArch::DFlash,
            DrafterFamily::DFlash | DrafterFamily::DFlash2
        ) | (GgufArch::Eagle3, DrafterFamily::Eagle3)
    );
    if !family_ok {
        bail!(
            "{g}: a {} GGUF, but {} holds a {family:?} checkpoint: it cannot be its conversion",
            arch.name(),
            hf_dir.display()
        );
    }
    let hf = SafetensorsWeights::open(hf_dir)?;
    let mut out = Vec::new();

    // The loader's verdict on the file alone.
    if let Err(e) = super::GgufDrafter::open(gguf) {
        out.push(finding(Error, "gguf", format!("{e:#}")));
    }
    match arch {
        GgufArch::DFlash => {
            dflash_keys(&file, hf_dir, &mut out)?;
            if family == DrafterFamily::DFlash2 {
                dflash2_keys(&file, hf_dir, &mut out)?;
            }
        }
        GgufArch::Eagle3 => eagle3_keys(&file, hf_dir, target_layers, &mut out)?,
    }
    compare_tensors(&file, arch, &hf, family, &mut out)?;
    out.sort_by(|a, b| b.severity.cmp(&a.severity));
    Ok(out)
}

/// The stored target-layer list against the checkpoint's ids (in draftlens's output
/// convention): llama.cpp captures layer inputs, so a correct file holds each id + 1.
fn layer_ids(key: &str, stored: &[u64], ids: &[usize], source: &str, out: &mut Vec<Finding>) {
    use Severity::*;
    let shifted = |k: u64| ids.iter().map(|&i| i as u64 + k).collect::<Vec<_>>();
    if stored == shifted(1) {
        out.push(finding(Info, "layer-ids", format!("{key} {stored:?} = the checkpoint's {source} {ids:?} + 1, as llama.cpp reads them (it captures layer inputs)")));
    } else if stored == shifted(0) {
        out.push(finding(Error, "layer-ids-off-by-one", format!("{key} {stored:?} holds the checkpoint's {source} unshifted: llama.cpp captures layer inputs, so the converter must store each id + 1 ({:?}); as written every tap is read one layer early", shifted(1))));
    } else if stored == shifted(2) {
        out.push(finding(Error, "layer-ids-off-by-one", format!("{key} {stored:?} holds the checkpoint's {source} {ids:?} + 2: shifted twice, every tap is read one layer late (expected {:?})", shifted(1))));
    } else {
        out.push(finding(
            Error,
            "layer-ids",
            format!(
                "{key} {stored:?} is not the checkpoint's {source} {ids:?} + 1 = {:?}",
                shifted(1)
            ),
        ));
    }
}

fn stored_layers(file: &GgufFile, key: &str, out: &mut Vec<Finding>) -> Option<Vec<u64>> {
    match file.get_i64_array(key) {
        Some(v) if v.iter().all(|&x| x >= 0) => Some(v.into_iter().map(|x| x as u64).collect()),
        _ => {
            out.push(finding(
                Severity::Error,
                "layer-ids",
                format!(
                    "{}: metadata key {key} is missing or not a list of layer ids",
                    file.path().display()
                ),
            ));
            None
        }
    }
}

fn dflash_keys(file: &GgufFile, hf_dir: &Path, out: &mut Vec<Finding>) -> Result<()> {
    use Severity::*;
    let hf = DrafterConfig::read(hf_dir)?;
    if let Some(stored) = stored_layers(file, "dflash.target_layers", out) {
        layer_ids(
            "dflash.target_layers",
            &stored,
            &hf.target_layer_ids,
            "dflash_config.target_layer_ids",
            out,
        );
    }
    match file.get_u64("tokenizer.ggml.mask_token_id") {
        None => out.push(finding(Error, "mask-id", format!("tokenizer.ggml.mask_token_id is missing; the checkpoint's mask_token_id is {}: llama.cpp would fill the block with another token", hf.mask_token_id))),
        Some(m) if m != hf.mask_token_id as u64 => out.push(finding(Error, "mask-id", format!("tokenizer.ggml.mask_token_id is {m}, the checkpoint's mask_token_id is {}: the block's MASK rows would embed another token", hf.mask_token_id))),
        Some(_) => {}
    }
    // The remaining hyper-parameters, as the loader would read the file (skipped when it refuses
    // the file: that is already the `gguf` finding).
    let Ok(conv) = DrafterConfig::read(file.path()) else {
        return Ok(());
    };
    let pairs: [(&str, String, String); 12] = [
        (
            "dflash.block_size / block_size",
            conv.block_size.to_string(),
            hf.block_size.to_string(),
        ),
        (
            "dflash.block_count / num_hidden_layers",
            conv.num_layers.to_string(),
            hf.num_layers.to_string(),
        ),
        (
            "dflash.embedding_length / hidden_size",
            conv.hidden_size.to_string(),
            hf.hidden_size.to_string(),
        ),
        (
            "dflash.feed_forward_length / intermediate_size",
            conv.intermediate_size.to_string(),
            hf.intermediate_size.to_string(),
        ),
        (
            "dflash.attention.head_count / num_attention_heads",
            conv.num_heads.to_string(),
            hf.num_heads.to_string(),
        ),
        (
            "dflash.attention.head_count_kv / num_key_value_heads",
            conv.num_kv_heads.to_string(),
            hf.num_kv_heads.to_string(),
        ),
        (
            "dflash.attention.key_length / head_dim",
            conv.head_dim.to_string(),
            hf.head_dim.to_string(),
        ),
        (
            "dflash.attention.layer_norm_rms_epsilon / rms_norm_eps",
            format!("{:e}", conv.rms_norm_eps),
            format!("{:e}", hf.rms_norm_eps),
        ),
        (
            "dflash.rope.freq_base / rope_theta",
            conv.rope_theta.to_string(),
            hf.rope_theta.to_string(),
        ),
        (
            "layer kinds (attention.causal, sliding_window_pattern / layer_types)",
            format!("{:?}", conv.layer_kinds),
            format!("{:?}", hf.layer_kinds),
        ),
        (
            "dflash.attention.sliding_window / sliding_window",
            format!("{:?}", conv.sliding_window),
            format!("{:?}", hf.sliding_window),
        ),
        (
            "dflash.attention.causal / is_causal",
            format!("{:?}", conv.causal_override),
            format!("{:?}", hf.causal_override),
        ),
    ];
    config_pairs(&pairs, out);
    Ok(())
}

/// A DFlash2 checkpoint's own keys: present in the file (else it was converted as plain DFlash,
/// which llama.cpp then runs without its convolutions and selector) and equal.
fn dflash2_keys(file: &GgufFile, hf_dir: &Path, out: &mut Vec<Finding>) -> Result<()> {
    use crate::drafter::dflash2::DFlash2Config;
    if file.get_u64("dflash.conv_kernel_size").is_none() {
        out.push(finding(Severity::Error, "dflash2-dropped", format!("the checkpoint is a DFlash2 drafter, but {} has no DFlash2 keys (dflash.conv_kernel_size, dflash.selector_rank, …): it was converted as plain DFlash, and llama.cpp would run it without its convolutions and candidate selector, silently", file.path().display())));
        return Ok(());
    }
    let (Ok(conv), Ok(hf)) = (
        DFlash2Config::read(file.path()),
        DFlash2Config::read(hf_dir),
    ) else {
        return Ok(()); // the `gguf` finding (or the checkpoint's own lint) says why
    };
    let pairs: [(&str, String, String); 7] = [
        (
            "dflash.conv_kernel_size",
            conv.conv_kernel_size.to_string(),
            hf.conv_kernel_size.to_string(),
        ),
        (
            "dflash.conv_group_size",
            conv.conv_group_size.to_string(),
            hf.conv_group_size.to_string(),
        ),
        (
            "dflash.selector_rank",
            conv.selector_rank.to_string(),
            hf.selector_rank.to_string(),
        ),
        (
            "dflash.selector_top_k",
            conv.selector_top_k.to_string(),
            hf.selector_top_k.to_string(),
        ),
        (
            "dflash.logit_scale / output_multiplier",
            conv.output_multiplier.to_string(),
            hf.output_multiplier.to_string(),
        ),
        (
            "dflash.final_logit_softcapping",
            format!("{:?}", conv.final_logit_softcapping),
            format!("{:?}", hf.final_logit_softcapping),
        ),
        (
            "dflash.embedding_scale / input_embedding_scale",
            conv.input_embedding_scale.to_string(),
            hf.input_embedding_scale.to_string(),
        ),
    ];
    config_pairs(&pairs, out);
    Ok(())
}

fn config_pairs(pairs: &[(&str, String, String)], out: &mut Vec<Finding>) {
    for (what, stored, want) in pairs {
        if stored != want {
            out.push(finding(
                Severity::Error,
                "config",
                format!("{what}: the file says {stored}, the checkpoint {want}"),
            ));
        }
    }
}

fn eagle3_keys(
    file: &GgufFile,
    hf_dir: &Path,
    target_layers: usize,
    out: &mut Vec<Finding>,
) -> Result<()> {
    use Severity::*;
    let hf = Eagle3Config::read(hf_dir, target_layers)?;
    if let Some(stored) = stored_layers(file, "eagle3.target_layers", out) {
        let before = out.len();
        layer_ids(
            "eagle3.target_layers",
            &stored,
            &hf.tap_layer_ids,
            hf.tap_key(),
            out,
        );
        // llama.cpp's converter reads only a top-level eagle_aux_hidden_state_layer_ids; without
        // one (SpecForge nests them under eagle_config) it writes vLLM's default.
        let l = target_layers as u64;
        let default = [2, l / 2, l.saturating_sub(3)];
        if out.len() > before && out[before].severity == Error && stored == default {
            out[before].message += &format!(": it is the converter's default [2, L/2, L − 3] for L = {l}, written when the config has no top-level eagle_aux_hidden_state_layer_ids (SpecForge nests them under eagle_config, which the converter does not read)");
        }
    }
    let Ok(conv) = Eagle3Config::read(file.path(), target_layers) else {
        return Ok(());
    };
    let pairs: [(&str, String, String); 9] = [
        (
            "eagle3.embedding_length / hidden_size",
            conv.hidden_size.to_string(),
            hf.hidden_size.to_string(),
        ),
        (
            "eagle3.feed_forward_length / intermediate_size",
            conv.intermediate_size.to_string(),
            hf.intermediate_size.to_string(),
        ),
        (
            "eagle3.attention.head_count / num_attention_heads",
            conv.num_heads.to_string(),
            hf.num_heads.to_string(),
        ),
        (
            "eagle3.attention.head_count_kv / num_key_value_heads",
            conv.num_kv_heads.to_string(),
            hf.num_kv_heads.to_string(),
        ),
        (
            "eagle3.attention.key_length / head_dim",
            conv.head_dim.to_string(),
            hf.head_dim.to_string(),
        ),
        (
            "eagle3.attention.layer_norm_rms_epsilon / rms_norm_eps",
            format!("{:e}", conv.rms_norm_eps),
            format!("{:e}", hf.rms_norm_eps),
        ),
        (
            "eagle3.rope.freq_base / rope_theta",
            conv.rope_theta.to_string(),
            hf.rope_theta.to_string(),
        ),
        (
            "rows of output.weight / draft_vocab_size",
            format!("{:?}", conv.draft_vocab_size),
            format!("{:?}", hf.draft_vocab_size),
        ),
        (
            "eagle3.target_hidden_size / target_hidden_size",
            format!("{:?}", conv.target_hidden_size),
            format!("{:?}", hf.target_hidden_size.or(conv.target_hidden_size)),
        ),
    ];
    config_pairs(&pairs, out);
    if hf.steps_from_config {
        out.push(finding(Info, "steps", format!("the checkpoint's num_speculative_tokens {} is not stored in GGUF (llama.cpp takes the draft length from its command line); the file drafts the default {} steps", hf.steps, conv.steps)));
    }
    Ok(())
}

/// The checkpoint tensors a correct conversion holds, under the names the file's tensors map to
/// (a DFlash2 codebook saved with `.weight` without it), each with its name in the checkpoint:
/// all but those the converter drops by design (EAGLE-3's `t2d`, used only in training).
fn converted_names(hf: &SafetensorsWeights, family: DrafterFamily) -> BTreeMap<String, String> {
    hf.tensors()
        .into_iter()
        .map(|t| t.name)
        .filter(|n| !(family == DrafterFamily::Eagle3 && n == "t2d"))
        .map(|n| {
            let codebook = n.starts_with("candidate_selector.") && n.ends_with("_codebook.weight");
            let canonical = if codebook {
                n.trim_end_matches(".weight").to_string()
            } else {
                n.clone()
            };
            (canonical, n)
        })
        .collect()
}

fn compare_tensors(
    file: &GgufFile,
    arch: GgufArch,
    hf: &SafetensorsWeights,
    family: DrafterFamily,
    out: &mut Vec<Finding>,
) -> Result<()> {
    use Severity::*;
    let g = file.path().display();
    let want = converted_names(hf, family);
    let got = file.tensors().len();
    if got != want.len() {
        out.push(finding(Error, "tensor-count", format!("{g} holds {got} tensors, but a conversion of the checkpoint holds {} (expected {}, got {got})", want.len(), want.len())));
    }
    // Stored name → checkpoint name (None: no place in the layout).
    let map_name = |n: &str| match arch {
        GgufArch::DFlash => dflash::hf_name(n),
        GgufArch::Eagle3 => eagle3::hf_name(n),
    };
    let mut stored: BTreeMap<String, String> = BTreeMap::new();
    let mut extra = Vec::new();
    for t in file.tensors() {
        match map_name(&t.name) {
            Some(h) if want.contains_key(&h) => {
                stored.insert(h, t.name.clone());
            }
            _ => extra.push(t.name.clone()),
        }
    }
    let missing: Vec<&String> = want.keys().filter(|n| !stored.contains_key(*n)).collect();
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().take(8).map(|s| s.to_string()).collect();
        out.push(finding(
            Error,
            "missing-tensor",
            format!(
                "{} checkpoint tensor(s) have no counterpart in {g}: {}{}",
                missing.len(),
                list.join(", "),
                if missing.len() > 8 { ", …" } else { "" }
            ),
        ));
    }
    if !extra.is_empty() {
        out.push(finding(
            Warning,
            "extra-tensor",
            format!(
                "{g} holds {} tensor(s) with no counterpart in the checkpoint: {}",
                extra.len(),
                extra.join(", ")
            ),
        ));
    }
    let heads = |k: &str| file.get_u64(k).unwrap_or(0) as usize;
    let (mut compared, mut worst): (usize, Option<(f64, String)>) = (0, None);
    for (canonical, gguf_name) in &stored {
        let hf_name = &want[canonical];
        let t = file.tensor_info(gguf_name).expect("listed");
        let want_shape = hf
            .tensors()
            .into_iter()
            .find(|i| &i.name == hf_name)
            .map(|i| i.shape)
            .unwrap_or_default();
        if t.shape() != want_shape {
            out.push(finding(Error, "shape", format!("tensor {gguf_name} ({hf_name}) has shape {:?}, the checkpoint's is {want_shape:?}", t.shape())));
            continue;
        }
        let transform = match (arch, hf_name.as_str()) {
            (GgufArch::Eagle3, "midlayer.self_attn.q_proj.weight") => {
                Transform::Unpermute(heads("eagle3.attention.head_count"))
            }
            (GgufArch::Eagle3, "midlayer.self_attn.k_proj.weight") => {
                Transform::Unpermute(heads("eagle3.attention.head_count_kv").max(1))
            }
            (_, "d2t") => Transform::AbsoluteToOffsets,
            _ => Transform::AsIs,
        };
        if transform == Transform::AbsoluteToOffsets {
            let (_, offsets) = hf.integers(hf_name)?;
            let (_, got) = super::read_integers(file, gguf_name, transform)?;
            if let Some(i) = (0..offsets.len()).find(|&i| offsets[i] != got[i]) {
                out.push(finding(Error, "values", format!("tensor {gguf_name} ({hf_name}): entry {i} maps draft id {i} to target id {}, the checkpoint to {}", i as i64 + got[i], i as i64 + offsets[i])));
            }
            compared += 1;
            continue;
        }
        let mut v = file.dequantize(gguf_name)?;
        if let Transform::Unpermute(nh) = transform {
            if nh == 0 || !t.shape()[0].is_multiple_of(2 * nh) {
                out.push(finding(Error, "shape", format!("tensor {gguf_name} has {} rows, not a whole number of {nh} heads: cannot undo the q/k permutation", t.shape()[0])));
                continue;
            }
            v = super::unpermute_rows(&v, nh);
        }
        let reference = hf.tensor(hf_name)?;
        let (ratio, at, diff, tol) = worst_ratio(t.ty, &reference, &v);
        compared += 1;
        if ratio > 1.0 {
            out.push(finding(Error, "values", format!("tensor {gguf_name} ({hf_name}) differs from the checkpoint by {diff:.3e} at element {at}, over the {} rounding tolerance {tol:.3e}: not a conversion of this tensor", t.ty)));
        } else if worst.as_ref().is_none_or(|(r, _)| ratio > *r) {
            worst = Some((
                ratio,
                format!("{gguf_name} at {:.2} of its {} tolerance", ratio, t.ty),
            ));
        }
    }
    match worst {
        Some((r, w)) if r > 0.0 => out.push(finding(Info, "values", format!("{compared} tensors compared; those within their storage type's rounding peak at {w}"))),
        Some(_) => out.push(finding(Info, "values", format!("{compared} tensors compared; those within their storage type's rounding equal the checkpoint's exactly"))),
        None => {}
    }
    Ok(())
}

/// The worst ratio |stored − checkpoint| / tolerance over a tensor, with its element, difference
/// and tolerance. The tolerance is the storage type's rounding: none for F32 (the checkpoint's
/// bf16 / f16 / f32 values are exact in f32), half a bf16 / f16 ulp relative for those (plus the
/// f16 subnormal step), and for block-quantised types about one quantisation step of the value's
/// 32-element block (max |x| of the block over the type's levels; K-quants also round their
/// sub-block scales, hence twice the plain step).
fn worst_ratio(
    ty: GgmlType,
    reference: &HostTensor,
    stored: &HostTensor,
) -> (f64, usize, f64, f64) {
    let levels = match ty {
        GgmlType::Q8_0 => Some(127.0),
        GgmlType::Q6_K => Some(31.0 / 2.0),
        GgmlType::Q5_0 => Some(15.0),
        GgmlType::Q5_1 => Some(31.0 / 2.0),
        GgmlType::Q4_K => Some(7.0 / 2.0),
        GgmlType::Q4_0 => Some(7.0),
        GgmlType::Q4_1 => Some(15.0 / 2.0),
        _ => None,
    };
    let row = reference.shape.last().copied().unwrap_or(1).max(1);
    let mut worst = (0f64, 0usize, 0f64, 0f64);
    for (i, (&x, &y)) in reference.data.iter().zip(&stored.data).enumerate() {
        let tol = match (ty, levels) {
            (GgmlType::F32, _) => 0.0,
            (GgmlType::BF16, _) => x.abs() as f64 * 2f64.powi(-8),
            (GgmlType::F16, _) => x.abs() as f64 * 2f64.powi(-11) + 2f64.powi(-24),
            (_, Some(levels)) => {
                // The value's 32-element block within its row.
                let start = i - (i % row) + ((i % row) / 32) * 32;
                let end = (start + 32).min(i - (i % row) + row);
                let amax = reference.data[start..end]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()));
                amax as f64 / levels
            }
            // Types without a stated bound: within 10 % of the block-free magnitude.
            _ => x.abs() as f64 * 0.1,
        };
        let diff = (x as f64 - y as f64).abs();
        let ratio = if diff == 0.0 {
            0.0
        } else if tol == 0.0 {
            f64::INFINITY
        } else {
            diff / tol
        };
        if ratio > worst.0 || (i == 0 && worst.0 == 0.0) {
            worst = (ratio, i, diff, tol);
        }
    }
    worst
}
