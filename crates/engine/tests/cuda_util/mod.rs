//! Helpers of the CUDA tests (`cuda_attention.rs`, `cuda_decode.rs`, `cuda_moe.rs`): the backend or
//! a SKIP line, a tensor's bits, a packed prefill under a kernel switch, and the batch invariance
//! of greedy decoding.
#![allow(dead_code)]

use draftlens_engine::backend::cuda::{CudaBackend, CudaTensor};
use draftlens_engine::backend::Backend;
use draftlens_engine::generate::{greedy, greedy_batch, Continuation, StopReason};
use draftlens_engine::model::TargetModel;

/// The CUDA backend of device 0, or `None` after printing "SKIP: CUDA unavailable: <reason>"
/// (CI and every machine without a GPU).
pub fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("SKIP: {e}");
            None
        }
    }
}

/// The last hidden state of `model`'s packed prefill of `ids` (sequences from `starts`) with a
/// kernel switch set by `switch(true)` for the forward and reset by `switch(false)` after: the A/B
/// of two attention kernels through a whole model.
pub fn packed_last_hidden_with(
    be: &CudaBackend,
    model: &TargetModel<CudaBackend>,
    ids: &[u32],
    starts: &[usize],
    switch: impl Fn(bool),
) -> Vec<f32> {
    switch(true);
    let out = model.forward_packed(
        be,
        ids,
        starts,
        &draftlens_engine::model::Capture::default(),
    );
    switch(false);
    be.to_host(&out.unwrap().last_hidden).unwrap()
}

/// `t`'s bf16 values as bits, for bit-for-bit comparisons.
pub fn bits(be: &CudaBackend, t: &CudaTensor) -> Vec<u16> {
    be.to_host_bf16(t)
        .unwrap()
        .into_iter()
        .map(|v| v.to_bits())
        .collect()
}

/// 65 prompts of 1..=40 tokens (so batches of 64 and 32 end with a batch of 1), some holding
/// the last vocabulary id.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut r = draftlens_engine::util::DetRng::new(0x9e37_79b9);
    (0..65)
        .map(|p| {
            let len = 1 + (p * 7) % 40;
            (0..len)
                .map(|i| {
                    let id = r.below(vocab as u64) as u32;
                    if (p + i) % 11 == 0 {
                        vocab - 1
                    } else {
                        id
                    }
                })
                .collect()
        })
        .collect()
}

/// Greedy continuations of [`prompts`] decoded in batches of 1, 3, 8, 32 and 64 are bit-identical
/// to each prompt decoded alone (`max_new` tokens), with an EOS chosen so that some prompts stop on
/// it and others run to the limit: prompts leave the batch mid-way and batches end with one prompt.
pub fn assert_batches_match_alone(
    be: &CudaBackend,
    model: &TargetModel<CudaBackend>,
    max_new: usize,
) {
    let spec = &model.spec;
    let prompts = prompts(spec.vocab_size as u32);
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    // An EOS that occurs: the id found in the most continuations, but not in all of them.
    let free: Vec<Continuation> = refs
        .iter()
        .map(|p| greedy(be, model, p, max_new, &[]).unwrap())
        .collect();
    let mut seen = vec![0usize; spec.vocab_size];
    for c in &free {
        let mut ids = c.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        for i in ids {
            seen[i as usize] += 1;
        }
    }
    let eos = (0..spec.vocab_size)
        .filter(|&i| seen[i] < free.len())
        .max_by_key(|&i| (seen[i], std::cmp::Reverse(i)))
        .unwrap() as u32;
    let alone: Vec<Continuation> = refs
        .iter()
        .map(|p| greedy(be, model, p, max_new, &[eos]).unwrap())
        .collect();
    let stops = |s: StopReason| alone.iter().filter(|c| c.stop == s).count();
    println!(
        "eos {eos}: {} prompts stop on it, {} run to {max_new} tokens",
        stops(StopReason::Eos),
        stops(StopReason::Length)
    );
    assert!(
        stops(StopReason::Eos) > 0 && stops(StopReason::Length) > 0,
        "the test needs prompts that stop on EOS and prompts that do not"
    );
    for batch in [1, 3, 8, 32, 64] {
        let mut got = Vec::new();
        for group in refs.chunks(batch) {
            got.extend(greedy_batch(be, model, group, max_new, &[eos]).unwrap());
        }
        for (p, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert_eq!(
                g, a,
                "batch {batch}: prompt {p} differs from decoding it alone"
            );
        }
        println!("batch {batch}: {} continuations bit-identical", got.len());
    }
}

/// Qwen3's architecture at a size that decodes fast but exercises every path of the decode
/// GEMM: N not a multiple of 16 (o_proj/down 200, vocab 1003), K with a tail chunk (200, 1064)
/// and split-K (down: K 1064 → 4 slices).
pub fn small_qwen3_spec() -> draftlens_engine::model::ModelSpec {
    draftlens_engine::model::ModelSpec {
        vocab_size: 1003,
        hidden_size: 200,
        intermediate_size: 1064,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        max_position_embeddings: 512,
        ..draftlens_engine::model::random::qwen3_8b_spec()
    }
}
