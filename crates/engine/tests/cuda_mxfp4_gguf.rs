//! A gpt-oss GGUF's MXFP4 experts kept packed on the GPU (docs/cuda.md, "MXFP4 experts kept
//! packed"): the committed gpt-oss MXFP4 fixture written as llama.cpp's converter writes it
//! (gpt_oss_gguf_util), its ggml MXFP4 expert stacks repacked at load
//! (`formats::mxfp4::from_ggml`) and handed to `Backend::matrix_mxfp4`:
//! - every expert weight of the packed model is packed on the device, none of the bf16 mode's
//!   (`DRAFTLENS_MXFP4=bf16`'s path, `set_mxfp4_packed(false)`);
//! - packed against bf16 mode: prefill states bit-identical, greedy continuations token for token
//!   (as cuda_mxfp4.rs's `mxfp4_golden_checkpoint_packed_equals_bf16_mode` for the folder);
//! - packed against the MXFP4 folder packed: the same bytes on the device, so the same bits.
//!
//! The CPU side (the repacked bytes equal the folder's, their values ggml's reading) is
//! golden_gpt_oss_gguf.rs's. Without a GPU every test prints "SKIP: CUDA unavailable: <reason>"
//! and passes (CI).
#![cfg(feature = "cuda")]

mod cuda_util;
mod golden_util;
mod gpt_oss_gguf_util;

use cuda_util::{bits, gpu};
use draftlens_engine::backend::cuda::CudaBackend;
use draftlens_engine::generate::greedy;
use draftlens_engine::model::moe::FeedForward;
use draftlens_engine::model::{Capture, TargetFiles, TargetModel};
use golden_util::*;
use gpt_oss_gguf_util::{fixture, write, Experts};

/// `model`'s expert weights (gate | up and down of every expert of every layer): how many are
/// packed on the device, of how many.
fn packed_experts(model: &TargetModel<CudaBackend>) -> (usize, usize) {
    let (mut packed, mut all) = (0, 0);
    for layer in &model.layers {
        let FeedForward::GptOss(moe) = &layer.mlp else {
            panic!("a gpt-oss layer without gpt-oss experts");
        };
        for e in &moe.experts {
            for w in [&e.gate_up, &e.down] {
                packed += usize::from(w.is_mxfp4());
                all += 1;
            }
        }
    }
    (packed, all)
}

/// Prefill states bit-identical and greedy continuations equal, `a` against `b`.
fn assert_same_model(
    be: &CudaBackend,
    (a, b): (&TargetModel<CudaBackend>, &TargetModel<CudaBackend>),
    what: &str,
    prompts: &[Vec<u32>],
    max_new: usize,
) {
    for (i, p) in prompts.iter().enumerate() {
        let last = |m: &TargetModel<CudaBackend>| {
            let out = m
                .forward(be, p, &mut m.new_cache(), &Capture::none())
                .unwrap();
            bits(be, &out.last_hidden)
        };
        assert!(
            last(a) == last(b),
            "{what}, prompt {i}: prefill states differ"
        );
        let (x, y) = (
            greedy(be, a, p, max_new, &[]).unwrap(),
            greedy(be, b, p, max_new, &[]).unwrap(),
        );
        assert_eq!(
            x.ids, y.ids,
            "{what}, prompt {i}: greedy continuations differ"
        );
        println!(
            "{what}, prompt {i} ({} tokens): prefill bit-identical, {max_new} greedy tokens equal, e.g. {:?}",
            p.len(),
            &x.ids[..8]
        );
    }
}

#[test]
fn gguf_mxfp4_experts_packed_equal_bf16_mode_and_the_folder() {
    let Some(be) = gpu() else { return };
    let (_dir, path) = write(Experts::Mxfp4, |_, _| {});
    let gguf = TargetFiles::open(&path).unwrap();
    let folder = TargetFiles::open(&fixture("gpt_oss_mxfp4")).unwrap();
    be.set_mxfp4_packed(false);
    let plain = TargetModel::load(&be, &gguf.spec, gguf.weights.as_ref()).unwrap();
    be.set_mxfp4_packed(true);
    let packed = TargetModel::load(&be, &gguf.spec, gguf.weights.as_ref()).unwrap();
    let from_folder = TargetModel::load(&be, &folder.spec, folder.weights.as_ref()).unwrap();
    // 4 layers × 8 experts × (gate | up, down).
    assert_eq!(packed_experts(&packed), (64, 64), "packed mode");
    assert_eq!(packed_experts(&plain), (0, 64), "bf16 mode");
    let g = Golden::open(fixture("gpt_oss").join("golden.safetensors"));
    let prompts: Vec<Vec<u32>> = (0..2).map(|p| g.ids(&format!("p{p}.input_ids"))).collect();
    assert_same_model(
        &be,
        (&packed, &plain),
        "GGUF packed vs bf16 mode",
        &prompts,
        32,
    );
    assert_same_model(
        &be,
        (&packed, &from_folder),
        "GGUF packed vs the MXFP4 folder packed",
        &prompts,
        32,
    );
}
