//! Live decoding of one drafter family against its two references (shared by the family tests
//! tests/{eagle3,dflash2,mtp}/main.rs): plain greedy decoding (lossless: the same ids) and the
//! replay of `run`'s per-anchor evaluation over the same sequence (the same rounds, accepted
//! lengths and tokens per round, so the same τ: docs/metrics.md's one definition).
#![allow(dead_code)]

use draftlens_engine::backend::Backend;
use draftlens_engine::drafter::eval::{
    evaluate_sequence, AnchorPolicy, DraftTarget, Drafter, EvalOptions, Labels, Sequence,
};
use draftlens_engine::drafter::live::{live_decode, LiveDrafter, LiveResult};
use draftlens_engine::generate::greedy;
use draftlens_engine::model::{Capture, TargetModel};
use draftlens_results::metrics::replay;
use std::collections::HashMap;

/// What [`check_live`] measured of one prompt.
pub struct LiveChecked {
    pub live: LiveResult,
    /// τ of the replayed chain (tokens / rounds).
    pub replayed_tau: f64,
}

/// Decodes `prompt` live with `drafter` and asserts: the ids are plain greedy decoding's, and the
/// rounds are the replay's — the replay drafting the sequence (prompt + those ids) as `run` does
/// (one teacher-forced target pass with the drafter's taps, the family's context over it, every
/// third anchor batched and the rest of the chain drafted one by one).
pub fn check_live<B: Backend>(
    be: &B,
    target: &TargetModel<B>,
    drafter: &Drafter<B>,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
    label: &str,
) -> LiveChecked {
    let plain = greedy(be, target, prompt, max_new, eos).unwrap();
    let live = live_decode(be, target, drafter, prompt, max_new, eos).unwrap();
    assert_eq!(
        live.ids, plain.ids,
        "{label}: live output differs from plain greedy decoding"
    );

    let mut ids = prompt.to_vec();
    ids.extend(&plain.ids);
    let layers = LiveDrafter::from(drafter).tap_layer_ids(&target.spec);
    let capture = Capture::for_layer_ids(&layers, target.spec.num_layers).unwrap();
    let out = target
        .forward(be, &ids, &mut target.new_cache(), &capture)
        .unwrap();
    let opts = EvalOptions {
        top_k: 4,
        anchors: AnchorPolicy::Stride(3),
        ..EvalOptions::default()
    };
    let topk = target
        .logits_topk(be, &out.last_hidden, opts.top_k)
        .unwrap();
    let mut seq = Sequence::new(0, &ids, prompt.len(), &topk, Labels::Target);
    let taps: Vec<&B::Tensor> = capture
        .indices
        .iter()
        .map(|&i| out.captured.get(i).unwrap())
        .collect();
    match drafter {
        Drafter::DFlash(d) => seq.ctx = Some(d.context_from_tensors(be, &taps).unwrap()),
        Drafter::DFlash2(d) => seq.ctx = Some(d.backbone.context_from_tensors(be, &taps).unwrap()),
        Drafter::Eagle3(d) => {
            seq.eagle3 = d
                .context_from_tensors(be, Some(target), &taps, &ids)
                .unwrap()
        }
        Drafter::Mtp(d) => seq.mtp = d.context_from_tensor(be, target, taps[0], &ids).unwrap(),
        Drafter::Oracle { .. } | Drafter::AntiOracle { .. } => {}
    }
    let rec = evaluate_sequence(be, DraftTarget::Head(target), drafter, &seq, &opts).unwrap();
    let by: HashMap<u32, usize> = (0..rec.num_blocks()).map(|b| (rec.anchor[b], b)).collect();
    let (rounds, tokens) = replay(&rec, &by, prompt.len(), ids.len()).unwrap();
    let mut chain = Vec::new();
    let mut a = prompt.len();
    while a + 1 < ids.len() {
        let acc = rec.accepted_len(by[&(a as u32)]);
        chain.push(acc as u32);
        a += acc + 1;
    }
    assert_eq!(
        live.accepted, chain,
        "{label}: accepted lengths per round, live vs replay"
    );
    // Every round's proposals are the replay's top-1 drafts at the same anchor: the family's
    // state grown round by round is the one the replay builds over the whole sequence.
    let per = drafter.block_size() - 1;
    let k = rec.top_k as usize;
    let mut a = prompt.len();
    for (r, &acc) in chain.iter().enumerate() {
        let b = by[&(a as u32)];
        let replayed: Vec<u32> = (0..per).map(|i| rec.draft_ids[(b * per + i) * k]).collect();
        assert_eq!(
            live.drafts[r * per..(r + 1) * per],
            replayed,
            "{label}: proposals of round {r} (anchor {a})"
        );
        a += acc as usize + 1;
    }
    assert_eq!(live.drafts.len(), chain.len() * per, "{label}: proposals");
    assert_eq!(live.round_tokens.len() as u64, rounds, "{label}: rounds");
    assert_eq!(
        live.round_tokens.iter().map(|&t| t as u64).sum::<u64>(),
        tokens,
        "{label}: tokens"
    );
    let replayed_tau = tokens as f64 / rounds as f64;
    assert_eq!(live.tau(), replayed_tau, "{label}: τ");
    LiveChecked { live, replayed_tau }
}
